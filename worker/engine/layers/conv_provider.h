/* CPU convolution providers: the ways the CPU backend can compute a
 * convolution (im2col + OpenBLAS, oneDNN), one row each, behind the one
 * conv2d slot of the backend table; conv_select.c picks a row per layer
 * shape and direction.
 *
 * Why several: no single way is fastest everywhere.  On an AVX2 EPYC our
 * im2col + OpenBLAS wins most forward convolutions while oneDNN's direct
 * kernels (blocked layouts, reordered from and back to NCHW in the call)
 * win several backward ones; on AVX-512 / AMX Xeons oneDNN's kernels are
 * far ahead of a GEMM-based convolution.  Which is faster for a shape is
 * measured on the machine, once per shape and process (conv_select.c).
 *
 * Legend as in ps_engine.h; a shape holds 2-D (frames axis 1) and 3-D
 * convolutions alike, so one selection serves both. */
#ifndef PS_CONV_PROVIDER_H
#define PS_CONV_PROVIDER_H
#include "worker/engine/ps_engine.h"

#include <stddef.h>

/* The three computations of a convolution layer. */
typedef enum {
    PS_CONV_FWD = 0,         /* out = conv(inp, w) (+ b) */
    PS_CONV_BWD_DATA = 1,    /* dinp = conv^T(dout, w), overwritten */
    PS_CONV_BWD_WEIGHTS = 2, /* dw += corr(inp, dout) */
    PS_CONV_NDIR = 3
} ps_conv_dir_t;
extern const char *const ps_conv_dir_name[PS_CONV_NDIR]; /* "fwd", "bwd-data", "bwd-weights" */

/* One call's shape: 2-D convolutions have nsp = 2 and 1 in the frames
 * entries ([0]) of every axis array.  Two shapes are the same layer shape
 * iff memcmp says so (ps_conv_shape_2d zeroes the whole struct first). */
typedef struct ps_conv_shape {
    int nsp;                         /* spatial axes: 2 or 3 */
    int N, C, K, groups, bias;       /* bias: the forward adds one */
    int in[3], ker[3], out[3];       /* frames, height, width */
    int stride[3], pad[3], dil[3];
} ps_conv_shape_t;

void ps_conv_shape_2d(ps_conv_shape_t *s, const ps_conv2d_desc_t *d, int N, int H, int W,
                      int bias);
void ps_conv_shape_3d(ps_conv_shape_t *s, const ps_conv3d_desc_t *d, int N, int D, int H, int W,
                      int bias);
/* The descriptor of a shape with nsp == 2 / 3. */
void ps_conv_shape_desc2d(const ps_conv_shape_t *s, ps_conv2d_desc_t *d);
void ps_conv_shape_desc3d(const ps_conv_shape_t *s, ps_conv3d_desc_t *d);
/* "64->64 3x3/1 p1 @28x28 N16" into buf. */
const char *ps_conv_shape_str(const ps_conv_shape_t *s, char *buf, size_t len);

/* A way to compute convolutions.  Every entry returns 0 or a negative
 * PS_E* code (logged where it happens); on an error the caller falls back
 * to the im2col + GEMM row for that shape.  Output contracts as the
 * backend slots: forward and backward_data overwrite, backward_weights
 * accumulates (+=) into dw.  Bias gradients are the dispatcher's. */
typedef struct ps_conv_provider {
    const char *name; /* "gemm", "onednn": logs, PS_CONV_KERNELS */
    /* 1 when this row can compute direction dir of shape s at ctx's
     * precision (may build and cache what the call needs), else 0 */
    int (*supports)(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir);
    int (*forward)(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *out, const float *inp,
                   const float *w, const float *b);
    int (*backward_data)(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp,
                         const float *dout, const float *w);
    int (*backward_weights)(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dw,
                            const float *dout, const float *inp);
    /* optional: both backward directions in one call, for a row that shares
     * work between them (NULL: the dispatcher calls the two above) */
    int (*backward)(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp, float *dw,
                    const float *dout, const float *inp, const float *w);
    /* what actually runs for (s, dir), for logs and benchmarks: oneDNN's
     * implementation name ("jit:avx2", "brg:avx512_core_amx"), the GEMM
     * scheme ("im2col+sgemm(Zen)"); never NULL */
    const char *(*kernel)(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir,
                          char *buf, size_t len);
} ps_conv_provider_t;

/* The rows, in order of preference when two are equally fast. */
extern const ps_conv_provider_t ps_conv_gemm;   /* conv_gemm.c: im2col / vol2col + sgemm */
extern const ps_conv_provider_t ps_conv_onednn; /* conv_onednn.c */

/* What the gemm row runs (conv2d.c, conv3d.c): the slots' contracts
 * without the bias gradient (the dispatcher's); inp may be NULL when dw
 * is, w when dinp is.  The scheme names the way for logs ("im2col+sgemm",
 * "flipped-im2col+sgemm", "sgemm" for a plain 1x1, ...). */
void ps_conv2d_gemm_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                            const float *b, const ps_conv2d_desc_t *d, int N, int H, int W);
void ps_conv2d_gemm_backward(ps_ctx_t *ctx, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const ps_conv2d_desc_t *d, int N,
                             int H, int W);
const char *ps_conv2d_gemm_scheme(const ps_conv2d_desc_t *d, int N, int H, int W, int data_grad);
void ps_conv3d_gemm_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                            const float *b, const ps_conv3d_desc_t *d, int N, int D, int H,
                            int W);
void ps_conv3d_gemm_backward(ps_ctx_t *ctx, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const ps_conv3d_desc_t *d, int N,
                             int D, int H, int W);
const char *ps_conv3d_gemm_scheme(const ps_conv3d_desc_t *d, int data_grad);

/* ---- the CPU backend's per-context state (ctx->cpu_state) --------------- */

typedef struct ps_cpu_state {
    ps_precision_t precision; /* of conv2d and linear (set_precision) */
    void *onednn;             /* conv_onednn.c: stream, primitives, buffers */
    float *scratch;           /* linear's bf16-rounded operand copies */
    size_t scratch_n;
} ps_cpu_state_t;
/* ctx's state, created on first use (NULL only when out of memory, logged). */
ps_cpu_state_t *ps_cpu_state(ps_ctx_t *ctx);
/* ctx's scratch of at least n floats (grown, never shrunk), or NULL
 * (logged) when out of memory. */
float *ps_cpu_scratch(ps_ctx_t *ctx, size_t n);
/* Frees what ps_cpu_state made (ps_ctx_free calls it). */
void ps_cpu_state_free(ps_ctx_t *ctx);
void ps_conv_onednn_free(void *state);

/* ---- oneDNN facts (conv_onednn.c) --------------------------------------- */

/* 1 when the build has oneDNN and its CPU engine opened. */
int ps_conv_onednn_available(void);
/* 1 when oneDNN runs bf16 convolutions on this CPU with native bf16
 * instructions (AVX-512 BF16 or AMX), else 0 with the reason in why. */
int ps_conv_onednn_bf16(char *why, size_t len);
/* oneDNN's version and the instruction set its kernels use here
 * ("oneDNN 2.6.3, avx2"), or why it is absent. */
const char *ps_conv_onednn_describe(char *buf, size_t len);

/* ---- selection (conv_select.c) ------------------------------------------ */

/* How rows are chosen, process-wide: NULL or "auto" = by measurement (the
 * default); a row's name forces that row wherever it supports the call
 * (the GEMM row elsewhere).  The environment variable PS_CONV_KERNELS sets
 * it at the first convolution; this call overrides it (tests, benchmarks).
 * Forgets every choice made so far.  0, or PS_EINVAL for an unknown name
 * (logged with the known ones). */
int ps_conv_set_kernels(const char *mode);
const char *ps_conv_get_kernels(void);

/* Run direction dir of one call through the chosen row (measuring the rows
 * first when the shape is new).  Arguments as the providers'; unused ones
 * NULL.  0 or PS_E* (logged). */
int ps_conv_run(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir, float *y,
                const float *a, const float *b, const float *bias);
/* The backward of one call: dinp (if not NULL) and dw (if not NULL)
 * through their chosen rows, in one call where both are the same row and
 * it has a joint backward. */
int ps_conv_run_backward(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp, float *dw,
                         const float *dout, const float *inp, const float *w);

/* What was chosen for a shape and direction, and what the candidates took. */
typedef struct ps_conv_choice {
    ps_conv_shape_t shape;
    ps_conv_dir_t dir;
    const char *provider;  /* row name */
    char kernel[64];       /* the row's kernel() at choice time */
    int measured;          /* 0: forced or only one candidate */
    double ms[4];          /* best time per row (index as ps_conv_rows), 0 = not run */
    long calls;            /* calls since chosen */
} ps_conv_choice_t;
/* The rows the selection knows, NULL-terminated. */
extern const ps_conv_provider_t *const ps_conv_rows[];
/* Copies up to max choices (in the order they were made) into out;
 * returns how many there are in all. */
int ps_conv_choices(ps_conv_choice_t *out, int max);
/* The kernels that ran, per direction, counted in calls: "fwd gemm 120,
 * onednn:jit:avx2 40; bwd-data ...; bwd-weights ..." into buf (what
 * benchmarks and psworker's log print). */
const char *ps_conv_summary(char *buf, size_t len);

#endif
