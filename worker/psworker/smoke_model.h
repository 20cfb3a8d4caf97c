/* The smoke model: a 2-layer MLP small enough to train in seconds on one
 * core, so the whole parameter-server loop runs end to end without the
 * neural-network engine.
 *
 *   h = relu(fc1.weight x + fc1.bias)       fc1.weight (H, D), fc1.bias (H)
 *   z = fc2.weight h + fc2.bias             fc2.weight (K, H), fc2.bias (K)
 *   loss = mean over the batch of softmax cross-entropy(z, y)
 *
 * Legend: N = samples in a batch, D = input features, H = hidden units,
 * K = classes.  The parameters are one flat fp32 vector in model order
 * (fc1.weight, fc1.bias, fc2.weight, fc2.bias), the same order as the
 * partition table, so a partition is a slice of it.
 *
 * The arithmetic runs in double: a worker's mean gradient over its B samples
 * and one process's mean over the concatenated W*B samples then differ only
 * by the final rounding to fp32, which keeps the distributed-vs-standalone
 * comparison at the 1e-6 level instead of at the mercy of summation order. */
#ifndef PS_SMOKE_MODEL_H
#define PS_SMOKE_MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "ps_partition.h"

#define PS_SMOKE_NTENSORS 4

typedef struct ps_smoke_dims {
    int in;       /* D */
    int hidden;   /* H */
    int classes;  /* K */
} ps_smoke_dims_t;

/* Default dimensions: D=32, H=64, K=4 (2,372 parameters). */
void ps_smoke_dims_default(ps_smoke_dims_t *d);
/* Total parameter count D*H + H + H*K + K. */
size_t ps_smoke_numel(const ps_smoke_dims_t *d);
/* Tensor specs in model order (names are static strings), for the partition
 * table; groups: weights 0, biases 1 (so per-group multipliers can apply). */
void ps_smoke_specs(const ps_smoke_dims_t *d, ps_tensor_spec_t spec[PS_SMOKE_NTENSORS]);
/* Shape of tensor i (ndim 2 or 1) for writing safetensors. */
int ps_smoke_shape(const ps_smoke_dims_t *d, int i, int64_t shape[2]);

/* PyTorch nn.Linear's default init (uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
 * for weights and biases), from a seed: every process gets the same vector. */
void ps_smoke_init(const ps_smoke_dims_t *d, uint64_t seed, float *w);

/* Scratch for ps_smoke_loss_grad_d: holds N*(H+K) + H doubles. */
typedef struct ps_smoke_work {
    double *h;      /* (N, H) hidden activations after ReLU */
    double *p;      /* (N, K) softmax probabilities, then dloss/dz */
    double *dh;     /* (H) dloss/dh of one sample */
    int cap;        /* N it was sized for */
} ps_smoke_work_t;
int ps_smoke_work_init(ps_smoke_work_t *ws, int n, const ps_smoke_dims_t *d);
void ps_smoke_work_free(ps_smoke_work_t *ws);

/* Mean loss over n samples x (n, D) with labels y (n) in [0, K); if grad is
 * not NULL it receives the gradient of that mean loss (ps_smoke_numel
 * doubles, overwritten).  *correct (may be NULL) gets the number of samples
 * whose argmax equals the label.  Returns the loss, or NAN if a label is out
 * of range or n > ws->cap. */
double ps_smoke_loss_grad_d(const ps_smoke_dims_t *d, const double *w, const float *x,
                            const int *y, int n, double *grad, ps_smoke_work_t *ws,
                            int *correct);

/* fp32 wrapper: weights and gradient as fp32 (the gradient is the double
 * result rounded once).  wd / gd are caller scratch of ps_smoke_numel
 * doubles each (gd may be NULL if grad is NULL). */
double ps_smoke_loss_grad(const ps_smoke_dims_t *d, const float *w, const float *x,
                          const int *y, int n, float *grad, double *wd, double *gd,
                          ps_smoke_work_t *ws, int *correct);
#endif
