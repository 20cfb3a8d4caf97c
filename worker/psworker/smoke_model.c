/* The smoke MLP: forward and backward in plain C (see smoke_model.h). */
#include "smoke_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

void ps_smoke_dims_default(ps_smoke_dims_t *d)
{
    d->in = 32;
    d->hidden = 64;
    d->classes = 4;
}

size_t ps_smoke_numel(const ps_smoke_dims_t *d)
{
    size_t D = (size_t)d->in, H = (size_t)d->hidden, K = (size_t)d->classes;
    return D * H + H + H * K + K;
}

void ps_smoke_specs(const ps_smoke_dims_t *d, ps_tensor_spec_t spec[PS_SMOKE_NTENSORS])
{
    size_t D = (size_t)d->in, H = (size_t)d->hidden, K = (size_t)d->classes;
    spec[0] = (ps_tensor_spec_t){"fc1.weight", H * D, 0};
    spec[1] = (ps_tensor_spec_t){"fc1.bias", H, 1};
    spec[2] = (ps_tensor_spec_t){"fc2.weight", K * H, 0};
    spec[3] = (ps_tensor_spec_t){"fc2.bias", K, 1};
}

int ps_smoke_shape(const ps_smoke_dims_t *d, int i, int64_t shape[2])
{
    switch (i) {
    case 0: shape[0] = d->hidden; shape[1] = d->in; return 2;
    case 1: shape[0] = d->hidden; return 1;
    case 2: shape[0] = d->classes; shape[1] = d->hidden; return 2;
    case 3: shape[0] = d->classes; return 1;
    default: return 0;
    }
}

static uint64_t mix64(uint64_t z)
{
    z += UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

void ps_smoke_init(const ps_smoke_dims_t *d, uint64_t seed, float *w)
{
    size_t D = (size_t)d->in, H = (size_t)d->hidden;
    size_t n1 = H * D + H, n = ps_smoke_numel(d);
    uint64_t s = mix64(seed ^ UINT64_C(0x1417));
    for (size_t i = 0; i < n; i++) {
        /* fan_in is D for fc1's weight and bias, H for fc2's (nn.Linear). */
        double bound = 1.0 / sqrt((double)(i < n1 ? D : H));
        double u = (double)(mix64(s + i) >> 11) * (1.0 / 9007199254740992.0);
        w[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

int ps_smoke_work_init(ps_smoke_work_t *ws, int n, const ps_smoke_dims_t *d)
{
    memset(ws, 0, sizeof *ws);
    if (n <= 0 || d->in <= 0 || d->hidden <= 0 || d->classes <= 1)
        return PS_EINVAL;
    ws->h = malloc(sizeof(double) * (size_t)n * (size_t)d->hidden);
    ws->p = malloc(sizeof(double) * (size_t)n * (size_t)d->classes);
    ws->dh = malloc(sizeof(double) * (size_t)d->hidden);
    if (!ws->h || !ws->p || !ws->dh) {
        ps_smoke_work_free(ws);
        return PS_ENOMEM;
    }
    ws->cap = n;
    return 0;
}

void ps_smoke_work_free(ps_smoke_work_t *ws)
{
    free(ws->h);
    free(ws->p);
    free(ws->dh);
    memset(ws, 0, sizeof *ws);
}

double ps_smoke_loss_grad_d(const ps_smoke_dims_t *d, const double *w, const float *x,
                            const int *y, int n, double *grad, ps_smoke_work_t *ws,
                            int *correct)
{
    const int D = d->in, H = d->hidden, K = d->classes;
    const double *W1 = w, *b1 = W1 + (size_t)H * D, *W2 = b1 + H, *b2 = W2 + (size_t)K * H;
    double loss = 0;
    int good = 0;

    if (n <= 0 || n > ws->cap)
        return NAN;
    for (int s = 0; s < n; s++)
        if (y[s] < 0 || y[s] >= K)
            return NAN;

    /* forward: h = relu(W1 x + b1), z = W2 h + b2, p = softmax(z) */
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * D;
        double *h = ws->h + (size_t)s * H, *p = ws->p + (size_t)s * K;
        for (int j = 0; j < H; j++) {
            const double *row = W1 + (size_t)j * D;
            double a = b1[j];
            for (int i = 0; i < D; i++) a += row[i] * xs[i];
            h[j] = a > 0 ? a : 0;
        }
        double zmax = -INFINITY;
        int arg = 0;
        for (int k = 0; k < K; k++) {
            const double *row = W2 + (size_t)k * H;
            double z = b2[k];
            for (int j = 0; j < H; j++) z += row[j] * h[j];
            p[k] = z;
            if (z > zmax) zmax = z, arg = k;
        }
        good += arg == y[s];
        double sum = 0;
        for (int k = 0; k < K; k++) sum += (p[k] = exp(p[k] - zmax));
        /* log-sum-exp form: -log softmax(z)_y = log(sum) - (z_y - zmax) */
        loss += log(sum) - log(p[y[s]]);
        for (int k = 0; k < K; k++) p[k] /= sum;
    }
    if (correct) *correct = good;
    loss /= n;
    if (!grad)
        return loss;

    /* backward of the mean loss: dz = (p - onehot(y)) / n */
    double *gW1 = grad, *gb1 = gW1 + (size_t)H * D, *gW2 = gb1 + H, *gb2 = gW2 + (size_t)K * H;
    memset(grad, 0, sizeof(double) * ps_smoke_numel(d));
    double *dh = ws->dh;
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * D;
        const double *h = ws->h + (size_t)s * H;
        double *dz = ws->p + (size_t)s * K;
        dz[y[s]] -= 1.0;
        for (int k = 0; k < K; k++) dz[k] /= n;
        for (int j = 0; j < H; j++) dh[j] = 0;
        for (int k = 0; k < K; k++) {
            double *grow = gW2 + (size_t)k * H;
            const double *row = W2 + (size_t)k * H;
            gb2[k] += dz[k];
            for (int j = 0; j < H; j++) {
                grow[j] += dz[k] * h[j];
                dh[j] += dz[k] * row[j];
            }
        }
        for (int j = 0; j < H; j++) {
            if (h[j] <= 0) continue; /* ReLU: no gradient where it was cut */
            double *grow = gW1 + (size_t)j * D;
            gb1[j] += dh[j];
            for (int i = 0; i < D; i++) grow[i] += dh[j] * xs[i];
        }
    }
    return loss;
}

double ps_smoke_loss_grad(const ps_smoke_dims_t *d, const float *w, const float *x,
                          const int *y, int n, float *grad, double *wd, double *gd,
                          ps_smoke_work_t *ws, int *correct)
{
    size_t np = ps_smoke_numel(d);
    for (size_t i = 0; i < np; i++) wd[i] = w[i];
    double loss = ps_smoke_loss_grad_d(d, wd, x, y, n, grad ? gd : NULL, ws, correct);
    if (grad)
        for (size_t i = 0; i < np; i++) grad[i] = (float)gd[i];
    return loss;
}
