/* Generated smoke dataset (see smoke_data.h). */
#include "smoke_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

/* splitmix64: a counter-based generator, so a sample needs no shared state. */
static uint64_t mix64(uint64_t z)
{
    z += UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

typedef struct { uint64_t s; } rng_t;

static uint64_t rng_next(rng_t *r)
{
    r->s += UINT64_C(0x9E3779B97F4A7C15);
    return mix64(r->s);
}

/* Uniform in (0, 1]: never 0, so log() in Box-Muller is finite. */
static double rng_unit(rng_t *r)
{
    return ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double rng_gauss(rng_t *r)
{
    double a = rng_unit(r), b = rng_unit(r);
    return sqrt(-2.0 * log(a)) * cos(2.0 * M_PI * b);
}

int ps_smoke_data_init(ps_smoke_data_t *ds, uint64_t seed, int in, int classes)
{
    memset(ds, 0, sizeof *ds);
    if (in < 2 || classes < 2 || classes > 1024) {
        ps_error("smoke data: need in >= 2 and 2 <= classes <= 1024 (got in=%d classes=%d)",
                 in, classes);
        return PS_EINVAL;
    }
    ds->seed = seed;
    ds->in = in;
    ds->classes = classes;
    ds->radius = 2.0f;
    ds->sigma = 0.5f;
    ds->u = calloc((size_t)in, sizeof(float));
    ds->v = calloc((size_t)in, sizeof(float));
    if (!ds->u || !ds->v) {
        ps_smoke_data_free(ds);
        return PS_ENOMEM;
    }
    /* Gram-Schmidt on two Gaussian vectors, in double for a clean basis. */
    rng_t r = {mix64(seed ^ UINT64_C(0x5EED0DA7A))};
    double *a = calloc((size_t)in * 2, sizeof(double)), *b;
    if (!a) {
        ps_smoke_data_free(ds);
        return PS_ENOMEM;
    }
    b = a + in;
    double na = 0, dot = 0, nb = 0;
    for (int i = 0; i < in; i++) a[i] = rng_gauss(&r), na += a[i] * a[i];
    for (int i = 0; i < in; i++) b[i] = rng_gauss(&r);
    na = sqrt(na);
    for (int i = 0; i < in; i++) a[i] /= na, dot += a[i] * b[i];
    for (int i = 0; i < in; i++) b[i] -= dot * a[i], nb += b[i] * b[i];
    nb = sqrt(nb);
    for (int i = 0; i < in; i++) ds->u[i] = (float)a[i], ds->v[i] = (float)(b[i] / nb);
    free(a);
    return 0;
}

void ps_smoke_data_free(ps_smoke_data_t *ds)
{
    free(ds->u);
    free(ds->v);
    ds->u = ds->v = NULL;
}

int ps_smoke_data_sample(const ps_smoke_data_t *ds, uint64_t index, float *x)
{
    rng_t r = {mix64(ds->seed ^ mix64(index ^ UINT64_C(0xD1CE)))};
    int label = (int)(rng_next(&r) % (uint64_t)ds->classes);
    int half = (int)(rng_next(&r) & 1);
    /* K classes x 2 opposite centres = 2K centres evenly spaced on the circle. */
    double theta = M_PI * label / ds->classes + (half ? M_PI : 0.0);
    double cu = ds->radius * cos(theta), cv = ds->radius * sin(theta);
    for (int i = 0; i < ds->in; i++)
        x[i] = (float)(cu * ds->u[i] + cv * ds->v[i] + ds->sigma * rng_gauss(&r));
    return label;
}

void ps_smoke_data_batch(const ps_smoke_data_t *ds, uint64_t first, int n, float *x, int *y)
{
    for (int i = 0; i < n; i++)
        y[i] = ps_smoke_data_sample(ds, first + (uint64_t)i, x + (size_t)i * ds->in);
}
