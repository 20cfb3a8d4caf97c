/* Cross-worker BN (ctx->bn_group, --bn sync) of one backend against
 * PyTorch's SyncBatchNorm math (tests/golden/gen_bn_group.py): W ranks, one
 * thread and one context each, joined by a fake group (a shared buffer and
 * a barrier: the gather any transport must be), run bn_forward_train and
 * bn_backward_train on their own slices; every rank's output, input
 * gradient, own dgamma / dbeta, the saved statistics and the running
 * statistics must match the golden within bounds derived from fp32
 * rounding (bn_tol below).  tests/test_bn_group.c runs it on the CPU,
 * tests/test_cuda_bn_group.c on a GPU.  Header-only, one table per test. */
#ifndef PS_BN_GROUP_CHECK_H
#define PS_BN_GROUP_CHECK_H

#include "tests/lib/golden_io.h"
#include "tests/lib/tap.h"
#include "worker/engine/ps_engine.h"

#include "ps_error.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BNG_MAXW 8
#define BNG_U (1.0 / 16777216.0) /* fp32 unit roundoff */

/* How the test moves data in and out of the backend's memory. */
typedef struct bng_mem {
    float *(*up)(ps_ctx_t *ctx, const float *h, size_t n);
    void (*down)(ps_ctx_t *ctx, float *h, const float *d, size_t n);
    void (*release)(float *d);
} bng_mem_t;

/* The fake transport: gather through a shared buffer; mode 1 fails on
 * every rank (a broken ring), mode 2 sums instead of gathering. */
typedef struct bng_fake {
    pthread_barrier_t bar;
    int W, mode, calls;
    float *slots;
    size_t cap;
} bng_fake_t;

typedef struct bng_rank {
    bng_fake_t *f;
    int r;
    ps_bn_group_t g;
    ps_ctx_t *ctx;
    const ps_backend_t *be;
    const bng_mem_t *mem;
    int use_group;
    /* the case */
    int N, C, HW;
    float eps, mom;
    const float *x, *dout, *gamma, *beta, *rm0, *rv0;
    /* results (host) */
    float *y, *dx, *dg, *db, *sm, *sr, *rm, *rv;
} bng_rank_t;

static int bng_gather(void *arg, const float *mine, float *all, size_t n)
{
    bng_rank_t *a = arg;
    bng_fake_t *f = a->f;
    if (f->mode == 1) return PS_EIO;
    if (n * (size_t)f->W > f->cap) return PS_ENOMEM;
    memcpy(f->slots + (size_t)a->r * n, mine, n * sizeof *mine);
    pthread_barrier_wait(&f->bar);
    if (a->r == 0) f->calls++;
    if (f->mode == 2) { /* a summing transport: every slot the sum */
        for (int r = 0; r < f->W; r++)
            for (size_t i = 0; i < n; i++) {
                float s = 0;
                for (int q = 0; q < f->W; q++) s += f->slots[(size_t)q * n + i];
                all[(size_t)r * n + i] = s;
            }
    } else {
        memcpy(all, f->slots, (size_t)f->W * n * sizeof *all);
    }
    pthread_barrier_wait(&f->bar);
    return 0;
}

static void *bng_rank_main(void *p)
{
    bng_rank_t *a = p;
    const bng_mem_t *m = a->mem;
    ps_ctx_t *ctx = a->ctx;
    const size_t n = (size_t)a->N * a->C * a->HW, C = (size_t)a->C;
    a->g = (ps_bn_group_t){.rank = a->r, .size = a->f->W, .gather = bng_gather, .arg = a};
    ctx->bn_group = a->use_group ? &a->g : NULL;
    float *zeros = calloc(n + C, sizeof *zeros);
    float *x = m->up(ctx, a->x, n), *dout = m->up(ctx, a->dout, n);
    float *gamma = m->up(ctx, a->gamma, C), *beta = m->up(ctx, a->beta, C);
    float *rm = m->up(ctx, a->rm0, C), *rv = m->up(ctx, a->rv0, C);
    float *y = m->up(ctx, zeros, n), *dx = m->up(ctx, zeros, n);
    float *sm = m->up(ctx, zeros, C), *sr = m->up(ctx, zeros, C);
    float *dg = m->up(ctx, zeros, C), *db = m->up(ctx, zeros, C);
    a->be->bn_forward_train(ctx, y, sm, sr, rm, rv, x, gamma, beta, a->eps, a->mom, a->N, a->C,
                            a->HW);
    a->be->bn_backward_train(ctx, dx, dg, db, dout, x, gamma, sm, sr, a->N, a->C, a->HW);
    m->down(ctx, a->y, y, n);
    m->down(ctx, a->dx, dx, n);
    m->down(ctx, a->sm, sm, C);
    m->down(ctx, a->sr, sr, C);
    m->down(ctx, a->rm, rm, C);
    m->down(ctx, a->rv, rv, C);
    m->down(ctx, a->dg, dg, C);
    m->down(ctx, a->db, db, C);
    float *all[] = {x, dout, gamma, beta, rm, rv, y, dx, sm, sr, dg, db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) m->release(all[i]);
    free(zeros);
    ps_bn_group_free_buf(&a->g);
    ctx->bn_group = NULL;
    return NULL;
}

static const float *bng_rec(const char *cs, const char *what, int r)
{
    char nm[64];
    if (r >= 0) snprintf(nm, sizeof nm, "%s.%s%d", cs, what, r);
    else snprintf(nm, sizeof nm, "%s.%s", cs, what);
    golden_rec_t *g = golden_find(nm);
    if (!g) {
        printf("Bail out! golden record %s missing\n", nm);
        exit(1);
    }
    return g->data;
}

static double bng_max(const float *p, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(p[i]) > m ? fabs(p[i]) : m;
    return m;
}

/* Rounding bounds of one case (absolute), from the golden values:
 *   em    the mean's error: the channel sum is fp32 within a plane of HW
 *         values (HW roundings of at most |x|max each), double across;
 *   y     em * gamma*rstd, plus 8 roundings of the largest term of
 *         x*scale + shift (scale = gamma*rstd, shift = beta - mean*scale);
 *   dx    dx = k*(dy - mean(dy) - xhat*mean(dy*xhat)), k = gamma*rstd: k
 *         times HW+8 roundings of its terms (the sums of dy, dy*xhat are
 *         fp32 within a plane too), plus the mean's error (and 8 roundings
 *         of x - mean) times rstd * mean(dy*xhat);
 *   dg/db HW roundings of the sum of |dy*xhat| / |dy| over the rank;
 *   stats (mean, rstd, running) a few roundings of their values, the
 *         variance HW roundings relative (its planes' fp32 sums). */
typedef struct bng_tol {
    double em, y, dx, mean, rstd_rel, rm, rv_rel;
} bng_tol_t;

static bng_tol_t bng_tol(const char *cs, int W, const int *ns, int C, int HW)
{
    const float *gamma = bng_rec(cs, "gamma", -1), *beta = bng_rec(cs, "beta", -1);
    const float *mean = bng_rec(cs, "mean", -1), *rstd = bng_rec(cs, "rstd", -1);
    double xmax = 0, ymax = 0, dymax = 0, smax = 0, shmax = 0, mmax = 0, mdyx = 0, rmax = 0;
    double Mt = 0;
    for (int r = 0; r < W; r++) {
        size_t n = (size_t)ns[r] * C * HW;
        xmax = fmax(xmax, bng_max(bng_rec(cs, "x", r), n));
        ymax = fmax(ymax, bng_max(bng_rec(cs, "y", r), n));
        dymax = fmax(dymax, bng_max(bng_rec(cs, "dout", r), n));
        Mt += (double)ns[r] * HW;
    }
    for (int c = 0; c < C; c++) {
        double sc = fabs((double)gamma[c] * rstd[c]);
        smax = fmax(smax, sc);
        rmax = fmax(rmax, rstd[c]);
        shmax = fmax(shmax, fabs(beta[c]) + fabs(mean[c]) * sc);
        mmax = fmax(mmax, fabs(mean[c]));
        double s = 0; /* mean(dy * xhat) over the union, in double */
        for (int r = 0; r < W; r++) {
            const float *x = bng_rec(cs, "x", r), *dy = bng_rec(cs, "dout", r);
            for (int nn = 0; nn < ns[r]; nn++)
                for (int i = 0; i < HW; i++) {
                    size_t at = ((size_t)nn * C + c) * HW + i;
                    s += dy[at] * (x[at] - mean[c]) * rstd[c];
                }
        }
        mdyx = fmax(mdyx, fabs(s / Mt));
    }
    bng_tol_t t;
    t.em = HW * BNG_U * xmax;
    t.y = t.em * smax + 8 * BNG_U * (xmax * smax + shmax + ymax);
    const double xhmax = (xmax + mmax) * rmax; /* largest |xhat| */
    t.dx = smax * ((HW + 8) * BNG_U * dymax * (2 + xhmax) +
                   (t.em + 8 * BNG_U * (xmax + mmax)) * rmax * mdyx);
    t.mean = t.em + 4 * BNG_U * mmax;
    t.rstd_rel = (HW + 8) * BNG_U + 2 * t.em * t.em;
    t.rm = 8 * BNG_U * (bng_max(bng_rec(cs, "rm0", -1), C) + mmax) + 0.1 * t.mean;
    t.rv_rel = (HW + 8) * BNG_U;
    return t;
}

/* |got - want| <= tol (+ rtol*|want|) over n values; reports the worst. */
static int bng_close(const float *got, const float *want, size_t n, double atol, double rtol,
                     const char *what)
{
    double worst = 0, wlim = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs((double)want[i]);
        if (!(d <= lim)) bad++;
        if (!(d <= worst) || isnan(d)) worst = d, wlim = lim;
    }
    ok(!bad, "%s: %zu values, worst |err| %.3g (bound there %.3g)", what, n, worst, wlim);
    return bad;
}

/* Run case cs on W ranks of backend be (contexts ctx[0..W)); fake mode as
 * above; use_group 0 runs each rank alone (the control).  Results in
 * ranks[] (host buffers the caller frees with bng_free). */
static int bng_run(const char *cs, const ps_backend_t *be, ps_ctx_t **ctx, const bng_mem_t *mem,
                   int mode, int use_group, bng_rank_t *ranks, bng_fake_t *f, int *Wout, int *Cout,
                   int *HWout, int *ns)
{
    char nm[64];
    snprintf(nm, sizeof nm, "%s.cfg", cs);
    golden_rec_t *cfg = golden_find(nm);
    if (!cfg) return -1;
    const int32_t *c = cfg->data;
    const int W = c[0], C = c[1], HW = c[2];
    if (W > BNG_MAXW) return -1;
    memset(f, 0, sizeof *f);
    f->W = W;
    f->mode = mode;
    f->cap = (size_t)W * (2 + 4 * (size_t)C) * 2;
    f->slots = calloc(f->cap, sizeof *f->slots);
    pthread_barrier_init(&f->bar, NULL, (unsigned)W);
    pthread_t th[BNG_MAXW];
    for (int r = 0; r < W; r++) {
        bng_rank_t *a = &ranks[r];
        memset(a, 0, sizeof *a);
        a->f = f, a->r = r, a->ctx = ctx[r], a->be = be, a->mem = mem, a->use_group = use_group;
        a->N = ns[r] = c[5 + r], a->C = C, a->HW = HW;
        a->eps = (float)(c[3] * 1e-6), a->mom = (float)(c[4] * 1e-6);
        a->x = bng_rec(cs, "x", r), a->dout = bng_rec(cs, "dout", r);
        a->gamma = bng_rec(cs, "gamma", -1), a->beta = bng_rec(cs, "beta", -1);
        a->rm0 = bng_rec(cs, "rm0", -1), a->rv0 = bng_rec(cs, "rv0", -1);
        size_t n = (size_t)a->N * C * HW;
        a->y = calloc(n, 4), a->dx = calloc(n, 4);
        a->dg = calloc(C, 4), a->db = calloc(C, 4), a->sm = calloc(C, 4), a->sr = calloc(C, 4);
        a->rm = calloc(C, 4), a->rv = calloc(C, 4);
        pthread_create(&th[r], NULL, bng_rank_main, a);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&f->bar);
    free(f->slots);
    *Wout = W, *Cout = C, *HWout = HW;
    return 0;
}

static void bng_free(bng_rank_t *ranks, int W)
{
    for (int r = 0; r < W; r++) {
        bng_rank_t *a = &ranks[r];
        free(a->y), free(a->dx), free(a->dg), free(a->db), free(a->sm), free(a->sr);
        free(a->rm), free(a->rv);
    }
}

/* Every rank of case cs against the golden; returns the failures. */
static int bng_check_case(const char *cs, const char *who, const ps_backend_t *be, ps_ctx_t **ctx,
                          const bng_mem_t *mem)
{
    bng_rank_t ranks[BNG_MAXW];
    bng_fake_t f;
    int W, C, HW, ns[BNG_MAXW], bad = 0;
    if (bng_run(cs, be, ctx, mem, 0, 1, ranks, &f, &W, &C, &HW, ns)) {
        ok(0, "%s %s: case not in the golden", who, cs);
        return 1;
    }
    const bng_tol_t t = bng_tol(cs, W, ns, C, HW);
    char what[160];
    for (int r = 0; r < W; r++) {
        const bng_rank_t *a = &ranks[r];
        size_t n = (size_t)a->N * C * HW;
        double dgs = 0, dbs = 0; /* bounds of the rank's own sums */
        const float *x = a->x, *dy = a->dout, *mean = bng_rec(cs, "mean", -1);
        const float *rstd = bng_rec(cs, "rstd", -1);
        for (size_t i = 0; i < n; i++) {
            int ch = (int)((i / HW) % C);
            dgs += fabs(dy[i] * (x[i] - mean[ch]) * rstd[ch]);
            dbs += fabs(dy[i]);
        }
        snprintf(what, sizeof what, "%s %s rank %d/%d (N=%d): output", who, cs, r, W, a->N);
        bad += bng_close(a->y, bng_rec(cs, "y", r), n, t.y, 0, what);
        snprintf(what, sizeof what, "%s %s rank %d: input gradient (the union's sums)", who, cs, r);
        bad += bng_close(a->dx, bng_rec(cs, "dx", r), n, t.dx, 0, what);
        snprintf(what, sizeof what, "%s %s rank %d: dgamma / dbeta (this rank's own)", who, cs, r);
        bad += bng_close(a->dg, bng_rec(cs, "dgamma", r), C, (HW + 8) * BNG_U * dgs, 0, what);
        bad += bng_close(a->db, bng_rec(cs, "dbeta", r), C, (HW + 8) * BNG_U * dbs, 0, what);
        snprintf(what, sizeof what, "%s %s rank %d: saved mean, rstd; running mean, var", who, cs, r);
        bad += bng_close(a->sm, mean, C, t.mean, 0, what);
        bad += bng_close(a->sr, rstd, C, 0, t.rstd_rel, what);
        bad += bng_close(a->rm, bng_rec(cs, "rm1", -1), C, t.rm, 0, what);
        bad += bng_close(a->rv, bng_rec(cs, "rv1", -1), C, 0, t.rv_rel, what);
        if (r > 0) { /* the group gives every rank the same statistics */
            int same = !memcmp(a->sm, ranks[0].sm, C * 4) && !memcmp(a->sr, ranks[0].sr, C * 4) &&
                       !memcmp(a->rm, ranks[0].rm, C * 4) && !memcmp(a->rv, ranks[0].rv, C * 4);
            bad += !ok(same, "%s %s rank %d: statistics bit for bit rank 0's", who, cs, r);
        }
    }
    bng_free(ranks, W);
    return bad;
}

/* The control: without the group each rank normalises alone, which the
 * golden (the union's statistics) must reject. */
static void bng_control(const char *cs, const char *who, const ps_backend_t *be, ps_ctx_t **ctx,
                        const bng_mem_t *mem)
{
    bng_rank_t ranks[BNG_MAXW];
    bng_fake_t f;
    int W, C, HW, ns[BNG_MAXW];
    if (bng_run(cs, be, ctx, mem, 0, 0, ranks, &f, &W, &C, &HW, ns)) return;
    const bng_tol_t t = bng_tol(cs, W, ns, C, HW);
    int beyond = 0;
    for (int r = 0; r < W; r++) {
        const float *want = bng_rec(cs, "y", r);
        size_t n = (size_t)ranks[r].N * C * HW;
        for (size_t i = 0; i < n; i++) beyond += !(fabs(ranks[r].y[i] - want[i]) <= t.y);
    }
    ok(beyond > 0, "%s %s control: each rank alone (no group) is outside the bound (%d values)",
       who, cs, beyond);
    bng_free(ranks, W);
}

#endif
