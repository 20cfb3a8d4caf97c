/* Helpers of the layer tests against golden tensors (tests/test_layers.c,
 * tests/test_layers3d.c): the golden records a case needs (a missing one
 * ends the run with "Bail out!"), and the buffers the checks use: poisoned
 * with NaN (an element a layer forgot shows up), a constant (parameter
 * gradients that must accumulate onto it), a reference plus that constant;
 * and the batch-norm check both tests run (2-D, and over (N, T, H, W)).
 * Header-only like tests/lib/tap.h. */
#ifndef PS_LAYER_CHECK_H
#define PS_LAYER_CHECK_H

#include "tests/lib/golden_io.h"
#include "worker/engine/ps_engine.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "<prefix><field>": f32 of want elements (0: any), or i32 */
static inline const float *F_(const char *prefix, const char *field, size_t want)
{
    char nm[96];
    snprintf(nm, sizeof nm, "%s%s", prefix, field);
    golden_rec_t *r = golden_find(nm);
    if (!r || r->dtype != 0 || (want && r->numel != want)) {
        printf("Bail out! golden record %s missing or of the wrong size\n", nm);
        exit(1);
    }
    return r->data;
}
static inline const int32_t *I_(const char *prefix, const char *field)
{
    char nm[96];
    snprintf(nm, sizeof nm, "%s%s", prefix, field);
    golden_rec_t *r = golden_find(nm);
    if (!r || r->dtype != 1) {
        printf("Bail out! golden record %s missing\n", nm);
        exit(1);
    }
    return r->data;
}

static inline float *nanbuf(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static inline float *constbuf(size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
/* ref + v, for checking accumulation onto a buffer that started at v */
static inline float *plus(const float *ref, size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = ref[i] + v;
    return p;
}

/* Batch norm against PyTorch's F.batch_norm records "<train>..." (x,
 * gamma, beta, rm0, rv0 -> out, rm1, rv1, dout -> dx, dgamma, dbeta; mean
 * and rstd when present) and "<eval>..." (x, gamma, beta, rm, rv -> out,
 * dout -> dx, dgamma, dbeta), over (N, C, HW): training forward with the
 * running update, both backwards (parameter gradients accumulated onto
 * 0.25), frozen affine (dgamma / dbeta NULL).  tag names the checks. */
static inline void check_bn_golden(const ps_backend_t *be, ps_ctx_t *ctx, const char *tp,
                                   const char *ep, int N, int C, int HW, const char *tag)
{
    const double atol = 1e-4, rtol = 1e-4;
    const float prior = 0.25f, eps = 1e-5f, mom = 0.1f;
    const size_t n = (size_t)N * C * HW;
    char m[160];
#define BN_CLOSE(got, want, cnt, a, r, what)                                                 \
    (snprintf(m, sizeof m, "%s %s", tag, what), allclose(got, want, (long)(cnt), a, r, m))
    float *y = nanbuf(n), *mean = nanbuf(C), *rstd = nanbuf(C);
    float *rm = malloc(C * sizeof(float)), *rv = malloc(C * sizeof(float));
    memcpy(rm, F_(tp, "rm0", C), C * sizeof(float));
    memcpy(rv, F_(tp, "rv0", C), C * sizeof(float));
    const float *x = F_(tp, "x", n), *g = F_(tp, "gamma", C), *bt = F_(tp, "beta", C);
    be->bn_forward_train(ctx, y, mean, rstd, rm, rv, x, g, bt, eps, mom, N, C, HW);
    BN_CLOSE(y, F_(tp, "out", n), n, atol, rtol, "train forward");
    char nm[96];
    snprintf(nm, sizeof nm, "%smean", tp);
    if (golden_find(nm)) {
        BN_CLOSE(mean, F_(tp, "mean", C), C, 1e-5, 1e-5, "train saved mean");
        BN_CLOSE(rstd, F_(tp, "rstd", C), C, 1e-5, 1e-4, "train saved rstd");
    }
    BN_CLOSE(rm, F_(tp, "rm1", C), C, 1e-5, 1e-5, "train running mean update");
    BN_CLOSE(rv, F_(tp, "rv1", C), C, 1e-5, 1e-4, "train running var update (unbiased)");
    float *dx = nanbuf(n), *dg = constbuf(C, prior), *db = constbuf(C, prior);
    be->bn_backward_train(ctx, dx, dg, db, F_(tp, "dout", n), x, g, mean, rstd, N, C, HW);
    BN_CLOSE(dx, F_(tp, "dx", n), n, atol, rtol, "train dinp");
    float *rg = plus(F_(tp, "dgamma", C), C, prior), *rb = plus(F_(tp, "dbeta", C), C, prior);
    BN_CLOSE(dg, rg, C, atol, rtol, "train dgamma (accumulated)");
    BN_CLOSE(db, rb, C, atol, rtol, "train dbeta (accumulated)");
    free(y), free(mean), free(rstd), free(rm), free(rv), free(dx), free(dg), free(db);
    free(rg), free(rb);

    x = F_(ep, "x", n), g = F_(ep, "gamma", C), bt = F_(ep, "beta", C);
    const float *erm = F_(ep, "rm", C), *erv = F_(ep, "rv", C), *edy = F_(ep, "dout", n);
    y = nanbuf(n);
    be->bn_forward_eval(ctx, y, x, g, bt, erm, erv, eps, N, C, HW);
    BN_CLOSE(y, F_(ep, "out", n), n, atol, rtol, "eval forward");
    dx = nanbuf(n), dg = constbuf(C, prior), db = constbuf(C, prior);
    be->bn_backward_eval(ctx, dx, dg, db, edy, x, g, erm, erv, eps, N, C, HW);
    BN_CLOSE(dx, F_(ep, "dx", n), n, atol, rtol, "eval dinp");
    rg = plus(F_(ep, "dgamma", C), C, prior), rb = plus(F_(ep, "dbeta", C), C, prior);
    BN_CLOSE(dg, rg, C, atol, rtol, "eval dgamma (accumulated)");
    BN_CLOSE(db, rb, C, atol, rtol, "eval dbeta (accumulated)");
    /* frozen (TSM partial BN): no affine gradients, same input gradient */
    float *dx2 = nanbuf(n);
    be->bn_backward_eval(ctx, dx2, NULL, NULL, edy, x, g, erm, erv, eps, N, C, HW);
    BN_CLOSE(dx2, F_(ep, "dx", n), n, atol, rtol, "frozen dinp (dgamma/dbeta NULL)");
#undef BN_CLOSE
    free(y), free(dx), free(dx2), free(dg), free(db), free(rg), free(rb);
}

#endif
