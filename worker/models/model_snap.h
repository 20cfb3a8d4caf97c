/* One training step's results copied out of a video model, for comparing
 * two runs of the same step (backends, precisions): the CPU against the
 * CUDA backend or the half-rounding reference (worker/engine/
 * backend_half_round.h) in tests/test_half_round.c,
 * tests/test_cuda_half_model.c and bench/gpu_bench.c. */
#ifndef PS_MODEL_SNAP_H
#define PS_MODEL_SNAP_H
#include <stddef.h>

#include "ps_model.h"

/* What a step produced, copied out of a model (host-readable arena: CPU,
 * or CUDA managed memory after a sync): loss, logits, every trainable
 * parameter's gradient times grad_scale (1 / loss scale), the BN running
 * statistics. */
typedef struct ps_model_snap {
    double loss;
    float *logits;
    size_t nlogits;
    int np;             /* trainable parameters */
    char **name;        /* np names */
    float **g;          /* np gradients */
    size_t *numel;      /* np sizes */
    float *bufs;        /* f32 BN buffers, concatenated */
    size_t nbufs;
    int nb;             /* f32 buffers: name and offset into bufs (nb + 1) */
    char **bname;
    size_t *boff;
} ps_model_snap_t;
int ps_model_snap(ps_model_snap_t *s, const ps_model_t *m, int nlogits, float loss,
                  double grad_scale);
void ps_model_snap_free(ps_model_snap_t *s);
/* how many of s's parameter tensors hold a non-finite gradient */
int ps_model_snap_nonfinite(const ps_model_snap_t *s);
/* |a - b|_2 / |b|_2 (|a - b|_2 when b is 0); NaN anywhere -> inf */
double ps_model_snap_relerr(const float *a, const float *b, size_t n);
/* Compare a with ref: returns the worst per-tensor relative L2 gradient
 * error (inf on a shape mismatch), its tensor in *worst (may be NULL);
 * the logits' and BN buffers' errors in *elog / *ebuf (may be NULL). */
double ps_model_snap_cmp(const ps_model_snap_t *a, const ps_model_snap_t *ref,
                         const char **worst, double *elog, double *ebuf);
/* The f32 buffer of a whose relative L2 error against ref's is largest
 * (NULL on a shape mismatch), that error in *e. */
const char *ps_model_snap_worst_buf(const ps_model_snap_t *a, const ps_model_snap_t *ref,
                                    double *e);
/* 1 when every gradient, the logits, the loss and the buffers are
 * bitwise equal. */
int ps_model_snap_equal(const ps_model_snap_t *a, const ps_model_snap_t *b);
#endif
