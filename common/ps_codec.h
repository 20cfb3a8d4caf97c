/* Tensor codecs for the wire (docs/protocol.md): a dtype (fp32/fp16/bf16)
 * and a compressor (raw, lz4 with byte-shuffle prefilter, top-k
 * sparsification, 1-bit sign with a per-partition scale).  Every decode
 * validates sizes against what the header promised and never writes past
 * numel.  TOPK and SIGN are lossy beyond the dtype: use them for gradients
 * (pushes) through ps_ef (error feedback), never for weights. */
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

/* Upper bound of encoded bytes for numel elements: the largest payload any
 * encoder can produce and a decoder accepts (for TOPK that is k = numel, so a
 * receiver can size buffers without knowing the sender's ratio). */
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
 * ps_codec_encode() with TOPK uses PS_CODEC_TOPK_DEFAULT_RATIO.
 *
 * TOPK payload (integers little-endian; indices and values as two arrays):
 *   u32 magic "PSK1" | u8 dtype | u8 0 | u16 0 | u64 numel | u64 k |
 *   u32 index[k] (strictly increasing, < numel) | value[k] (wire dtype)
 *   = 24 + k * (4 + dtype size) bytes exactly.
 * The k elements of largest |x| are sent; among equal magnitudes at the
 * threshold the lower indices win; NaN counts as larger than Inf.  Selection
 * is a 3-pass radix select on |x|'s bit pattern: O(numel) always, no scratch.
 * Decode SET zero-fills dst and scatters (the server decodes a sparse push
 * into a zeroed slot); ADD/SUB touch only the k indices.  numel <= 2^32 - 1.
 *
 * SIGN payload: u32 magic "PSG1" | u8 dtype | u8 0 | u16 0 | u64 numel |
 *   f32 scale | ceil(numel/8) bytes of sign bits (element i = bit i%8 of byte
 *   i/8, 1 = negative, unused high bits of the last byte 0)
 *   = 20 + ceil(numel/8) bytes exactly; the dtype is recorded and checked but
 *   the scale is always fp32.  scale = mean |x| over the partition (the
 *   scaled-sign / EF-signSGD choice: ||x||_1 / n keeps the step's L1 mass);
 *   element i decodes to -scale if x's sign bit was set (so -0 -> -scale),
 *   else +scale.
 * SIGN with blocks (params->nblocks > 1): u32 magic "PSG2" | u8 dtype | u8 0 |
 *   u16 0 | u64 numel | u32 nblocks | nblocks x (u32 len, f32 scale) | sign
 *   bits as above = 24 + 8 * nblocks + ceil(numel/8) bytes; lengths > 0
 *   adding up to numel, 1 <= nblocks <= ps_codec_sign_max_blocks(numel); block b's
 *   elements decode to +-scale[b].  Decoders take both layouts.  Encode returns PS_ENONFINITE if x holds NaN/Inf (the scale
 *   would be meaningless); decode rejects a NaN/Inf/negative scale. */

#define PS_CODEC_TOPK_DEFAULT_RATIO 0.01f
typedef struct {
    float topk_ratio; /* TOPK: fraction of elements sent, in (0, 1]; 0 = default.
                         k = ceil(ratio * numel), at least 1 when numel > 0 */
    /* TOPK / SIGN: the tensor is nblocks consecutive blocks of block_len[b]
     * elements (the model tensors of a partition), compressed each on its
     * own: top-k takes ceil(ratio * len) of every block, sign sends one
     * scale per block ("PSG2" payload).  Why: one partition mixes tensors
     * whose gradients differ by orders of magnitude (BN, fc, convs); one
     * threshold starves the small ones and one mean|x| drowns them in noise.
     * NULL / 0 = the whole tensor is one block (the single-scale "PSG1"). */
    const size_t *block_len;
    size_t nblocks;
} ps_codec_params_t;

/* The most blocks a SIGN payload of numel elements may carry:
 * min(PS_SIGN_MAX_BLOCKS, numel / 2), so that its bound stays below the
 * top-k one (psd sizes ZMQ_MAXMSGSIZE by the largest codec bound).  A
 * partition with more tensors gets neighbours merged by the caller (ps_ef
 * does). */
#define PS_SIGN_MAX_BLOCKS 65536
size_t ps_codec_sign_max_blocks(size_t numel);

/* What decode does with dst: overwrite, accumulate (server summation), or
 * subtract (error feedback: residual -= what was sent). */
typedef enum { PS_DECODE_SET = 0, PS_DECODE_ADD = 1, PS_DECODE_SUB = 2 } ps_decode_mode_t;

/* k of a TOPK encode with these params: the sum of ps_codec_topk_k over the
 * blocks (one block when params has none); 0 for a bad ratio or blocks that
 * do not add up to numel. */
size_t ps_codec_topk_k_ex(size_t numel, const ps_codec_params_t *params);
/* k = ceil(ratio * numel) (ignoring the float error of ratio, relative 1e-6),
 * at least 1 when numel > 0; ratio 0 = default; 0 if ratio is not in [0, 1]. */
size_t ps_codec_topk_k(size_t numel, float ratio);
/* Exact bound for an encode with these params (params may be NULL). */
size_t ps_codec_bound_ex(ps_dtype_t dt, ps_codec_t c, size_t numel, const ps_codec_params_t *params);
/* ps_codec_encode with parameters (NULL = defaults); PS_EINVAL for a ratio
 * outside [0, 1] or a TOPK tensor of 2^32 elements or more. */
int ps_codec_encode_ex(void *dst, size_t dst_cap, size_t *out_len, const float *src, size_t numel,
                       ps_dtype_t dt, ps_codec_t c, const ps_codec_params_t *params, void *scratch);
/* ps_codec_decode with an explicit mode; same validation and errors. */
int ps_codec_decode_ex(float *dst, size_t numel, const void *src, size_t len, ps_dtype_t dt,
                       ps_codec_t c, ps_decode_mode_t mode, void *scratch);

/* x[i] = 0 for every index i a TOPK payload carries (DGC's momentum-factor
 * masking, ps_ef.c).  Validates header, length and indices first; returns 0
 * or PS_EMISMATCH / PS_ECORRUPT with x untouched. */
int ps_codec_topk_zero_sent(float *x, size_t numel, const void *src, size_t len, ps_dtype_t dt);

/* Byte shuffle prefilter used by LZ4 (exposed for tests and benchmarks):
 * out[b*n + i] = in[i*es + b] for n elements of es bytes, and its inverse.
 * Vectorised when ps_half_simd() is on; out and in must not overlap. */
void ps_codec_shuffle(void *out, const void *in, size_t n, size_t es);
void ps_codec_unshuffle(void *out, const void *in, size_t n, size_t es);
#endif
