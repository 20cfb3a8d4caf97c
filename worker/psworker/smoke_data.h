/* Generated dataset for the smoke model: Gaussian class clusters that are
 * not linearly separable, with no files and no state.  Sample i's features
 * and label are a pure function of (seed, i), so any process can produce
 * any global batch position; that is what lets W workers together see
 * exactly the samples one process sees with a W times larger batch.
 *
 * Construction: in a random 2-D plane of the D-dimensional space, class k
 * owns two cluster centres on a circle at opposite angles (theta_k and
 * theta_k + pi).  A linear classifier scores x and -x with opposite signs,
 * so it cannot put both centres of a class on its side: a hidden layer is
 * needed.  Every other direction carries isotropic noise. */
#ifndef PS_SMOKE_DATA_H
#define PS_SMOKE_DATA_H
#include <stdint.h>

typedef struct ps_smoke_data {
    uint64_t seed;
    int in;           /* D: features per sample */
    int classes;      /* K */
    float radius;     /* distance of the centres from the origin */
    float sigma;      /* noise standard deviation */
    float *u, *v;     /* (D) orthonormal basis of the signal plane */
} ps_smoke_data_t;

/* Build the dataset description.  Returns 0, PS_EINVAL or PS_ENOMEM. */
int ps_smoke_data_init(ps_smoke_data_t *ds, uint64_t seed, int in, int classes);
void ps_smoke_data_free(ps_smoke_data_t *ds);

/* Sample `index`: x gets D features, the return value is the label. */
int ps_smoke_data_sample(const ps_smoke_data_t *ds, uint64_t index, float *x);
/* n consecutive samples first, first+1, ...: x (n, D), y (n). */
void ps_smoke_data_batch(const ps_smoke_data_t *ds, uint64_t first, int n, float *x, int *y);

/* First index of the held-out evaluation range (never used for training). */
#define PS_SMOKE_EVAL_BASE (UINT64_C(1) << 48)
#endif
