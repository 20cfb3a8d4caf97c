/* Tensor codecs for the wire (DESIGN.md section 5): a dtype (fp32/fp16/bf16)
 * and a compressor (raw, lz4 with byte-shuffle prefilter; top-k and sign are
 * reserved for the compression issue).  Every decode validates sizes against
 * what the header promised and never writes past numel. */
#ifndef PS_CODEC_H
#define PS_CODEC_H
#include <stddef.h>
#include <stdint.h>

typedef enum { PS_DT_FP32 = 0, PS_DT_FP16 = 1, PS_DT_BF16 = 2 } ps_dtype_t;
typedef enum { PS_CODEC_RAW = 0, PS_CODEC_LZ4 = 1, PS_CODEC_TOPK = 2, PS_CODEC_SIGN = 3 } ps_codec_t;

size_t ps_dtype_size(ps_dtype_t dt);                 /* 4 or 2; 0 if unknown */
const char *ps_dtype_name(ps_dtype_t dt);            /* "fp32", ... */
const char *ps_codec_name(ps_codec_t c);             /* "raw", "lz4", ... */
/* Parse "fp32|fp16|bf16" / "raw|none|lz4"; return 0 or PS_EINVAL. */
int ps_dtype_parse(const char *s, ps_dtype_t *dt);
int ps_codec_parse(const char *s, ps_codec_t *c);

/* Upper bound of encoded bytes for numel elements. */
size_t ps_codec_bound(ps_dtype_t dt, ps_codec_t c, size_t numel);
/* Scratch bytes encode/decode may need for numel elements (0 for raw). */
size_t ps_codec_scratch_size(ps_dtype_t dt, ps_codec_t c, size_t numel);

/* Encode src[0..numel) into dst (capacity dst_cap), *out_len = bytes written.
 * Returns 0, PS_EINVAL (unknown dtype/codec), PS_ERANGE (dst too small),
 * PS_EUNSUPPORTED (codec not implemented). */
int ps_codec_encode(void *dst, size_t dst_cap, size_t *out_len, const float *src, size_t numel,
                    ps_dtype_t dt, ps_codec_t c, void *scratch);

/* Decode len bytes of src into dst[0..numel).  add != 0: dst[i] += value
 * instead of dst[i] = value.  Returns 0 or PS_EMISMATCH / PS_ECORRUPT when
 * len is inconsistent with numel/dtype or the compressed data is bad; dst is
 * left untouched on every error. */
int ps_codec_decode(float *dst, size_t numel, const void *src, size_t len, ps_dtype_t dt,
                    ps_codec_t c, int add, void *scratch);

/* Notes on the calls above: scratch may be NULL, in which case encode/decode
 * allocate (and free) what ps_codec_scratch_size() says for that call.
 * TOPK / SIGN return PS_EUNSUPPORTED from encode and decode. */

/* Byte shuffle prefilter used by LZ4 (exposed for tests and benchmarks):
 * out[b*n + i] = in[i*es + b] for n elements of es bytes, and its inverse.
 * Vectorised when ps_half_simd() is on; out and in must not overlap. */
void ps_codec_shuffle(void *out, const void *in, size_t n, size_t es);
void ps_codec_unshuffle(void *out, const void *in, size_t n, size_t es);
#endif
