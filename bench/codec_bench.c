/* Codec throughput on a 16 MiB gradient-like fp32 tensor (N(0,1) * 1e-3):
 * encode / decode / decode-add for every dtype x codec (top-k at 1% and 0.1%,
 * sign with its fp32 scale; their decode is the dense zero-fill + scatter a
 * server slot does, decode-add the sparse accumulate), the fp16/bf16
 * conversions with and without SIMD, the byte shuffle and CRC32C (hardware
 * and table).  Every figure is MB/s of fp32 input and its ratio to memcpy of
 * the same 16 MiB measured in the same run, so runs on different machines
 * compare.  Usage: codec_bench [seconds per measurement, default 0.5] */
#include "ps_codec.h"
#include "ps_crc32c.h"
#include "ps_half.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NUMEL ((size_t)4 << 20) /* 16 MiB of fp32 */

static double min_seconds = 0.5;
static volatile uint32_t sink;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef void (*op_fn)(void *ctx);

/* best MB/s (of bytes per call) over repeated calls for min_seconds */
static double measure(op_fn fn, void *ctx, size_t bytes)
{
    double best = 0, start = now(), t;
    fn(ctx); /* warm caches and page faults */
    do {
        double t0 = now();
        fn(ctx);
        t = now();
        double mbs = bytes / (t - t0) / 1e6;
        if (mbs > best) best = mbs;
    } while (t - start < min_seconds);
    return best;
}

typedef struct {
    float *x, *y;
    uint8_t *enc;
    uint16_t *h;
    void *scratch;
    size_t len, cap;
    ps_dtype_t dt;
    ps_codec_t c;
    ps_codec_params_t prm;
} ctx_t;

static void op_memcpy(void *p) { ctx_t *c = p; memcpy(c->y, c->x, NUMEL * 4); }
static void op_encode(void *p)
{
    ctx_t *c = p;
    if (ps_codec_encode_ex(c->enc, c->cap, &c->len, c->x, NUMEL, c->dt, c->c, &c->prm, c->scratch)) abort();
}
static void op_decode(void *p)
{
    ctx_t *c = p;
    if (ps_codec_decode(c->y, NUMEL, c->enc, c->len, c->dt, c->c, 0, c->scratch)) abort();
}
static void op_decode_add(void *p)
{
    ctx_t *c = p;
    if (ps_codec_decode(c->y, NUMEL, c->enc, c->len, c->dt, c->c, 1, c->scratch)) abort();
}
static void op_to_fp16(void *p) { ctx_t *c = p; ps_fp32_to_fp16(c->h, c->x, NUMEL); }
static void op_from_fp16(void *p) { ctx_t *c = p; ps_fp16_to_fp32(c->y, c->h, NUMEL); }
static void op_to_bf16(void *p) { ctx_t *c = p; ps_fp32_to_bf16(c->h, c->x, NUMEL); }
static void op_from_bf16(void *p) { ctx_t *c = p; ps_bf16_to_fp32(c->y, c->h, NUMEL); }
static void op_shuffle(void *p) { ctx_t *c = p; ps_codec_shuffle(c->enc, c->x, NUMEL, 4); }
static void op_crc(void *p) { ctx_t *c = p; sink ^= ps_crc32c(0, c->x, NUMEL * 4); }
static void op_crc_sw(void *p) { ctx_t *c = p; sink ^= ps_crc32c_sw(0, c->x, NUMEL * 4); }

int main(int argc, char **argv)
{
    if (argc > 1) min_seconds = atof(argv[1]);
    if (!(min_seconds > 0)) min_seconds = 0.5;
    ctx_t c = {0};
    c.x = malloc(NUMEL * 4);
    c.y = malloc(NUMEL * 4);
    c.h = malloc(NUMEL * 2);
    c.cap = ps_codec_bound(PS_DT_FP32, PS_CODEC_TOPK, NUMEL); /* the largest bound of all codecs */
    c.enc = malloc(c.cap);
    c.scratch = malloc(ps_codec_scratch_size(PS_DT_FP32, PS_CODEC_LZ4, NUMEL));
    if (!c.x || !c.y || !c.h || !c.enc || !c.scratch) {
        fprintf(stderr, "codec_bench: out of memory\n");
        return 1;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < NUMEL; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        double u = ((s >> 11) + 1.0) / 9007199254740993.0;
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        double v = (s >> 11) / 9007199254740992.0;
        c.x[i] = (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v) * 1e-3);
    }
    memset(c.y, 0, NUMEL * 4);

    printf("codec_bench: 16 MiB fp32 gradient-like tensor (N(0,1)*1e-3), best of %.2f s per row\n", min_seconds);
    printf("paths: half/shuffle %s, crc32c %s\n", ps_half_simd() ? "F16C+AVX2" : "scalar",
           ps_crc32c_hw() ? "SSE4.2 (3-way)" : "table");
    double mc = measure(op_memcpy, &c, NUMEL * 4);
    printf("%-28s %9.0f MB/s  (1.00x memcpy)\n", "memcpy", mc);
    printf("%-12s %-10s %10s %10s %10s %8s\n", "dtype", "codec", "enc MB/s", "dec MB/s", "add MB/s", "ratio");
    static const struct {
        ps_codec_t c;
        float ratio;
    } codecs[] = {{PS_CODEC_RAW, 0}, {PS_CODEC_LZ4, 0}, {PS_CODEC_TOPK, 0.01f}, {PS_CODEC_TOPK, 0.001f}, {PS_CODEC_SIGN, 0}};
    for (int dt = 0; dt < 3; dt++)
        for (size_t k = 0; k < sizeof codecs / sizeof codecs[0]; k++) {
            char name[32];
            c.dt = (ps_dtype_t)dt;
            c.c = codecs[k].c;
            c.prm.topk_ratio = codecs[k].ratio;
            if (c.c == PS_CODEC_TOPK) snprintf(name, sizeof name, "topk %g%%", 100 * (double)c.prm.topk_ratio);
            else snprintf(name, sizeof name, "%s", ps_codec_name(c.c));
            double e = measure(op_encode, &c, NUMEL * 4);
            double d = measure(op_decode, &c, NUMEL * 4);
            double a = measure(op_decode_add, &c, NUMEL * 4);
            printf("%-12s %-10s %10.0f %10.0f %10.0f %8.4f   (enc %.2fx dec %.2fx memcpy)\n", ps_dtype_name(c.dt),
                   name, e, d, a, (double)c.len / (NUMEL * 4), e / mc, d / mc);
        }
    struct {
        const char *name;
        op_fn fn;
    } rows[] = {{"fp32->fp16", op_to_fp16}, {"fp16->fp32", op_from_fp16}, {"fp32->bf16", op_to_bf16},
                {"bf16->fp32", op_from_bf16}, {"shuffle fp32", op_shuffle}};
    int have = ps_half_simd();
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        ps_half_use_simd(1);
        double v = have ? measure(rows[r].fn, &c, NUMEL * 4) : 0;
        ps_half_use_simd(0);
        double sc = measure(rows[r].fn, &c, NUMEL * 4);
        ps_half_use_simd(1);
        printf("%-28s simd %8.0f MB/s  scalar %8.0f MB/s  (simd %.2fx scalar, %.2fx memcpy)\n", rows[r].name, v, sc,
               sc > 0 ? v / sc : 0, v / mc);
    }
    double ch = measure(op_crc, &c, NUMEL * 4), cs = measure(op_crc_sw, &c, NUMEL * 4);
    printf("%-28s hw   %8.0f MB/s  table  %8.0f MB/s  (hw %.2fx table, %.2fx memcpy)\n", "crc32c", ch, cs, ch / cs,
           ch / mc);
    free(c.x); free(c.y); free(c.h); free(c.enc); free(c.scratch);
    return 0;
}
