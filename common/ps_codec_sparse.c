/* Lossy gradient codecs: top-k sparsification and 1-bit sign with a scale
 * (payload layouts in ps_codec.h).  Both are meant to run under error
 * feedback (ps_ef.c), which is what makes their bias harmless.
 *
 * Top-k selection is a radix select on the 31-bit magnitude key |x| (the
 * float's bits without the sign: for non-negative floats the bit order is
 * the value order, and NaN keys sort above Inf).  Three histogram passes over
 * the key's bits 30..21, 20..10 and 9..0 find the exact k-th largest key T and
 * how many of the elements equal to T to keep; a fourth pass emits the kept
 * elements in index order, so the indices come out sorted for free.  That is
 * O(numel) whatever the data (a quickselect can go quadratic on adversarial
 * or heavily tied gradients, e.g. all zeros), deterministic, and needs only
 * a 2048-entry histogram instead of a copy of the magnitudes.
 *
 * Decoders validate the whole payload (header, length, every index, the
 * scale, the unused bits) before they write dst, so a rejected payload
 * leaves dst untouched. */
#include "ps_codec_int.h"

#include "ps_error.h"
#include "ps_half.h"
#include "ps_le.h"
#include "ps_log.h"

#include <math.h>
#include <string.h>

#define TOPK_MAGIC 0x314b5350u /* "PSK1" */
#define SIGN_MAGIC 0x31475350u /* "PSG1" */
#define SIGN2_MAGIC 0x32475350u /* "PSG2": one scale per block */

static uint32_t key_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
}

static void put_header(uint8_t *p, uint32_t magic, ps_dtype_t dt, size_t numel)
{
    ps_le_put32(p, magic);
    p[4] = (uint8_t)dt;
    p[5] = p[6] = p[7] = 0;
    ps_le_put64(p + 8, numel);
}

/* magic, reserved bytes, dtype and numel against what the caller expects */
static int check_header(const uint8_t *p, size_t len, size_t hdr, uint32_t magic, const char *what,
                        ps_dtype_t dt, size_t numel)
{
    if (len < hdr) {
        ps_error("%s payload of %zu bytes is shorter than its %zu-byte header", what, len, hdr);
        return PS_EMISMATCH;
    }
    if (ps_le_get32(p) != magic || p[5] || p[6] || p[7]) {
        ps_error("%s payload: bad magic 0x%08x or reserved bytes", what, ps_le_get32(p));
        return PS_ECORRUPT;
    }
    if (p[4] != (uint8_t)dt || ps_le_get64(p + 8) != (uint64_t)numel) {
        ps_error("%s payload holds %llu x %s, expected %zu x %s", what,
                 (unsigned long long)ps_le_get64(p + 8), ps_dtype_name((ps_dtype_t)p[4]), numel,
                 ps_dtype_name(dt));
        return PS_EMISMATCH;
    }
    return 0;
}

static void put_value(uint8_t *p, float v, ps_dtype_t dt)
{
    if (dt == PS_DT_FP32) {
        memcpy(p, &v, 4);
        return;
    }
    uint16_t h = dt == PS_DT_FP16 ? ps_fp32_to_fp16_1(v) : ps_fp32_to_bf16_1(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}
static float get_value(const uint8_t *p, ps_dtype_t dt)
{
    if (dt == PS_DT_FP32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return dt == PS_DT_FP16 ? ps_fp16_to_fp32_1(h) : ps_bf16_to_fp32_1(h);
}

/* ---- top-k ---------------------------------------------------------------- */

/* The k-th largest key T of src and how many elements equal to T belong to
 * the top k (the rest of the top k is every element with key > T). */
static uint32_t radix_select(const float *src, size_t n, size_t k, size_t *take_eq)
{
    static const int shift[3] = {21, 10, 0}, bits[3] = {10, 11, 10};
    uint32_t prefix = 0, pmask = 0;
    size_t need = k;
    for (int pass = 0; pass < 3; pass++) {
        size_t hist[2048] = {0};
        uint32_t m = (1u << bits[pass]) - 1;
        if (pass == 0) {
            /* Neighbouring gradients mostly share the top bits (sign-less
             * exponent + 2 mantissa bits), so one histogram would serialise
             * on the same counter: count into 4 and merge. */
            uint32_t h4[4][1024];
            memset(h4, 0, sizeof h4);
            size_t i = 0;
            for (; i + 4 <= n; i += 4)
                for (int l = 0; l < 4; l++) h4[l][key_of(src[i + l]) >> 21]++;
            for (; i < n; i++) h4[0][key_of(src[i]) >> 21]++;
            for (int b = 0; b < 1024; b++) hist[b] = (size_t)h4[0][b] + h4[1][b] + h4[2][b] + h4[3][b];
        } else {
            for (size_t i = 0; i < n; i++) {
                uint32_t key = key_of(src[i]);
                if ((key & pmask) == prefix) hist[(key >> shift[pass]) & m]++;
            }
        }
        uint32_t b = m;
        while (hist[b] < need) need -= hist[b--]; /* need <= candidates, so b stays >= 0 */
        prefix |= b << shift[pass];
        pmask |= m << shift[pass];
    }
    *take_eq = need;
    return prefix;
}

/* The top k of src[0..n) (indices off + i), in index order, from position j on. */
static size_t topk_block(uint8_t *idx, uint8_t *val, size_t es, ps_dtype_t dt, const float *src,
                         size_t n, size_t off, size_t k, size_t j)
{
    if (k == n) {
        for (size_t i = 0; i < n; i++, j++) {
            ps_le_put32(idx + 4 * j, (uint32_t)(off + i));
            put_value(val + es * j, src[i], dt);
        }
        return j;
    }
    if (!k) return j;
    size_t take_eq, end = j + k;
    uint32_t t = radix_select(src, n, k, &take_eq);
    for (size_t i = 0; i < n && j < end; i++) {
        uint32_t key = key_of(src[i]);
        if (key > t || (key == t && take_eq && take_eq--)) {
            ps_le_put32(idx + 4 * j, (uint32_t)(off + i));
            put_value(val + es * j, src[i], dt);
            j++;
        }
    }
    return j;
}

int ps_codec_topk_encode_(void *dstv, size_t cap, size_t *out_len, const float *src, size_t numel,
                          ps_dtype_t dt, float ratio, const ps_codec_params_t *params)
{
    size_t k = ps_codec_topk_k_ex(numel, params);
    size_t es = ps_dtype_size(dt), len = PS_TOPK_HDR + k * (4 + es);
    uint8_t *dst = dstv;
    if (cap < len) {
        ps_error("topk encode: %zu bytes needed (k=%zu), buffer holds %zu", len, k, cap);
        return PS_ERANGE;
    }
    put_header(dst, TOPK_MAGIC, dt, numel);
    ps_le_put64(dst + 16, k);
    uint8_t *idx = dst + PS_TOPK_HDR, *val = idx + 4 * k;
    size_t j = 0;
    if (params && params->nblocks > 1) {
        /* each block (tensor) its own top ceil(ratio * len): blocks are in
         * order, so the indices stay increasing */
        size_t off = 0;
        for (size_t b = 0; b < params->nblocks; b++) {
            size_t n = params->block_len[b];
            j = topk_block(idx, val, es, dt, src + off, n, off, ps_codec_topk_k(n, ratio), j);
            off += n;
        }
    } else {
        j = topk_block(idx, val, es, dt, src, numel, 0, k, 0);
    }
    if (j != k) { /* cannot happen: the select counted exactly k */
        ps_error("topk encode: selected %zu of %zu elements (internal error)", j, k);
        return PS_ECORRUPT;
    }
    *out_len = len;
    return 0;
}

int ps_codec_topk_decode_(float *dst, size_t numel, const void *srcv, size_t len, ps_dtype_t dt,
                          int mode)
{
    const uint8_t *src = srcv;
    size_t es = ps_dtype_size(dt);
    int rc = check_header(src, len, PS_TOPK_HDR, TOPK_MAGIC, "topk", dt, numel);
    if (rc) return rc;
    uint64_t k = ps_le_get64(src + 16);
    if (k > numel) {
        ps_error("topk payload: k = %llu exceeds numel %zu", (unsigned long long)k, numel);
        return PS_ECORRUPT;
    }
    if (len != PS_TOPK_HDR + k * (4 + es)) {
        ps_error("topk payload of %zu bytes, expected %llu for k = %llu %s pairs", len,
                 (unsigned long long)(PS_TOPK_HDR + k * (4 + es)), (unsigned long long)k,
                 ps_dtype_name(dt));
        return PS_EMISMATCH;
    }
    const uint8_t *idx = src + PS_TOPK_HDR, *val = idx + 4 * k;
    for (uint64_t j = 0; j < k; j++) {
        uint32_t i = ps_le_get32(idx + 4 * j);
        if (i >= numel || (j && i <= ps_le_get32(idx + 4 * (j - 1)))) {
            ps_error("topk payload: index %u at position %llu is out of range or not increasing "
                     "(numel %zu)", i, (unsigned long long)j, numel);
            return PS_ECORRUPT;
        }
    }
    if (mode == PS_DECODE_SET) memset(dst, 0, numel * sizeof *dst);
    for (uint64_t j = 0; j < k; j++) {
        uint32_t i = ps_le_get32(idx + 4 * j);
        float v = get_value(val + es * j, dt);
        if (mode == PS_DECODE_SUB) dst[i] -= v;
        else if (mode == PS_DECODE_ADD) dst[i] += v;
        else dst[i] = v;
    }
    return 0;
}

int ps_codec_topk_zero_sent(float *x, size_t numel, const void *srcv, size_t len, ps_dtype_t dt)
{
    const uint8_t *src = srcv;
    size_t es = ps_dtype_size(dt);
    int rc = check_header(src, len, PS_TOPK_HDR, TOPK_MAGIC, "topk", dt, numel);
    if (rc) return rc;
    uint64_t k = ps_le_get64(src + 16);
    if (k > numel || len != PS_TOPK_HDR + k * (4 + es)) {
        ps_error("topk payload: k = %llu does not fit %zu bytes / %zu elements",
                 (unsigned long long)k, len, numel);
        return PS_ECORRUPT;
    }
    const uint8_t *idx = src + PS_TOPK_HDR;
    for (uint64_t j = 0; j < k; j++) {
        uint32_t i = ps_le_get32(idx + 4 * j);
        if (i >= numel) {
            ps_error("topk payload: index %u out of range (numel %zu)", i, numel);
            return PS_ECORRUPT;
        }
    }
    for (uint64_t j = 0; j < k; j++) x[ps_le_get32(idx + 4 * j)] = 0.f;
    return 0;
}

/* ---- sign ----------------------------------------------------------------- */

/* mean |x| of src[0..n): fp32 partial sums over blocks of 256 (8 lanes, so
 * it vectorises) into a double: error ~1e-7 relative, far below what the
 * 1-bit code loses */
static float mean_abs(const float *src, size_t n)
{
    double l1 = 0;
    for (size_t i = 0; i < n; i += 256) {
        size_t m = n - i < 256 ? n - i : 256, j = 0;
        float lane[8] = {0};
        for (; j + 8 <= m; j += 8)
            for (int l = 0; l < 8; l++) lane[l] += fabsf(src[i + j + l]);
        for (; j < m; j++) lane[0] += fabsf(src[i + j]);
        for (int l = 0; l < 8; l++) l1 += lane[l];
    }
    return n ? (float)(l1 / (double)n) : 0.f;
}

int ps_codec_sign_encode_(void *dstv, size_t cap, size_t *out_len, const float *src, size_t numel,
                          ps_dtype_t dt, const ps_codec_params_t *params)
{
    size_t nb = params && params->nblocks > 1 ? params->nblocks : 1;
    size_t hdr = nb > 1 ? PS_SIGN_HDR + 4 + 8 * nb : PS_SIGN_HDR;
    size_t len = hdr + (numel + 7) / 8;
    uint8_t *dst = dstv;
    if ((nb > 1 && nb > ps_codec_sign_max_blocks(numel)) || (nb > 1 && numel > UINT32_MAX)) {
        ps_error("sign encode: %zu blocks for %zu elements (at most %zu, numel < 2^32)", nb, numel,
                 ps_codec_sign_max_blocks(numel));
        return PS_EINVAL;
    }
    if (cap < len) {
        ps_error("sign encode: %zu bytes needed, buffer holds %zu", len, cap);
        return PS_ERANGE;
    }
    if (nb > 1) {
        size_t sum = 0;
        for (size_t b = 0; b < nb; b++) {
            if (!params->block_len[b]) sum = numel + 1;
            sum += params->block_len[b];
        }
        if (sum != numel) {
            ps_error("sign encode: %zu blocks do not add up to %zu elements (or one is empty)", nb,
                     numel);
            return PS_EINVAL;
        }
    }
    uint8_t *blk = dst + PS_SIGN_HDR + 4;
    size_t off = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t n = nb > 1 ? params->block_len[b] : numel;
        float scale = mean_abs(src + off, n);
        if (!isfinite(scale)) {
            ps_error("sign encode: the tensor holds NaN or Inf (mean |x| = %g)", (double)scale);
            return PS_ENONFINITE;
        }
        uint32_t sb;
        memcpy(&sb, &scale, 4);
        if (nb > 1) {
            ps_le_put32(blk + 8 * b, (uint32_t)n);
            ps_le_put32(blk + 8 * b + 4, sb);
        } else {
            ps_le_put32(dst + 16, sb);
        }
        off += n;
    }
    put_header(dst, nb > 1 ? SIGN2_MAGIC : SIGN_MAGIC, dt, numel);
    if (nb > 1) ps_le_put32(dst + PS_SIGN_HDR, (uint32_t)nb);
    uint8_t *bits = dst + hdr;
    memset(bits, 0, (numel + 7) / 8);
    for (size_t i = 0; i < numel; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        bits[i >> 3] |= (uint8_t)((u >> 31) << (i & 7));
    }
    *out_len = len;
    return 0;
}

static int check_scale(uint32_t sb)
{
    float scale;
    memcpy(&scale, &sb, 4);
    if (!isfinite(scale) || signbit(scale)) {
        ps_error("sign payload: scale %g is not a finite non-negative number", (double)scale);
        return PS_ECORRUPT;
    }
    return 0;
}

int ps_codec_sign_decode_(float *dst, size_t numel, const void *srcv, size_t len, ps_dtype_t dt,
                          int mode)
{
    const uint8_t *src = srcv;
    int two = len >= 4 && ps_le_get32(src) == SIGN2_MAGIC;
    int rc = check_header(src, len, two ? PS_SIGN_HDR + 4 : PS_SIGN_HDR,
                          two ? SIGN2_MAGIC : SIGN_MAGIC, "sign", dt, numel);
    if (rc) return rc;
    size_t nbytes = (numel + 7) / 8, nb = 1, hdr = PS_SIGN_HDR;
    if (two) {
        nb = ps_le_get32(src + PS_SIGN_HDR);
        if (nb < 1 || nb > ps_codec_sign_max_blocks(numel)) {
            ps_error("sign payload: %zu blocks for %zu elements (1..%zu)", nb, numel,
                     ps_codec_sign_max_blocks(numel));
            return PS_ECORRUPT;
        }
        hdr = PS_SIGN_HDR + 4 + 8 * nb;
    }
    if (len != hdr + nbytes) {
        ps_error("sign payload of %zu bytes, expected %zu for %zu elements", len, hdr + nbytes,
                 numel);
        return PS_EMISMATCH;
    }
    const uint8_t *blk = src + PS_SIGN_HDR + 4;
    if (two) {
        size_t sum = 0;
        for (size_t b = 0; b < nb; b++) {
            size_t n = ps_le_get32(blk + 8 * b);
            if (!n || n > numel - sum) {
                ps_error("sign payload: block %zu of %zu elements does not fit %zu", b, n, numel);
                return PS_ECORRUPT;
            }
            sum += n;
            if ((rc = check_scale(ps_le_get32(blk + 8 * b + 4)))) return rc;
        }
        if (sum != numel) {
            ps_error("sign payload: blocks cover %zu of %zu elements", sum, numel);
            return PS_ECORRUPT;
        }
    } else if ((rc = check_scale(ps_le_get32(src + 16)))) {
        return rc;
    }
    const uint8_t *bits = src + hdr;
    if ((numel & 7) && (bits[nbytes - 1] >> (numel & 7))) {
        ps_error("sign payload: unused bits set in the last byte (0x%02x, %zu elements)",
                 bits[nbytes - 1], numel);
        return PS_ECORRUPT;
    }
    /* the sign bit goes straight into scale's bit pattern: branch-free */
    float neg = mode == PS_DECODE_SUB ? -1.f : 1.f;
    size_t off = 0;
    for (size_t b = 0; b < nb; b++) {
        uint32_t sb = two ? ps_le_get32(blk + 8 * b + 4) : ps_le_get32(src + 16);
        size_t end = two ? off + ps_le_get32(blk + 8 * b) : numel;
        for (size_t i = off; i < end; i++) {
            uint32_t u = sb | (uint32_t)((bits[i >> 3] >> (i & 7)) & 1) << 31;
            float v;
            memcpy(&v, &u, 4);
            if (mode == PS_DECODE_SET) dst[i] = v;
            else dst[i] += neg * v;
        }
        off = end;
    }
    return 0;
}
