/* Internal to the codec files: the sparse / 1-bit codecs that ps_codec.c
 * dispatches to after it has checked dtype, codec, numel and mode.  Payload
 * layouts are documented in ps_codec.h. */
#ifndef PS_CODEC_INT_H
#define PS_CODEC_INT_H
#include "ps_codec.h"

#define PS_TOPK_HDR 24
#define PS_SIGN_HDR 20

/* params: blocks (ps_codec.h), already checked to add up to numel */
int ps_codec_topk_encode_(void *dst, size_t cap, size_t *out_len, const float *src, size_t numel,
                          ps_dtype_t dt, float ratio, const ps_codec_params_t *params);
int ps_codec_topk_decode_(float *dst, size_t numel, const void *src, size_t len, ps_dtype_t dt,
                          int mode);
int ps_codec_sign_encode_(void *dst, size_t cap, size_t *out_len, const float *src, size_t numel,
                          ps_dtype_t dt, const ps_codec_params_t *params);
int ps_codec_sign_decode_(float *dst, size_t numel, const void *src, size_t len, ps_dtype_t dt,
                          int mode);
#endif
