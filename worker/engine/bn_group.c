/* Cross-worker batch norm: what travels and how the ranks' parts combine
 * (the contract is in ps_engine.h, "the group").  Both backends call these
 * on the host: the CPU layers directly, the CUDA ones after copying their
 * per-channel partials back, so the arithmetic that decides the group's
 * statistics is this one file for every device.
 *
 * Why a gather and not a summing allreduce: the forward's variance is a
 * difference of large numbers when it is made of sums and sums of squares
 * (E[x^2] - E[x]^2), and fp32 partial sums on the wire would lose it.  Each
 * rank sends its count, mean and M2 instead, as doubles split into two
 * floats, and every rank combines them in rank order with Chan et al.'s
 * pairwise update in double: the same bits everywhere, about as exact as
 * one process's two-pass statistics.  Cost: W * (2 + 4C) floats per layer
 * and direction, small next to the gradient (ResNet-50's widest BN, C =
 * 2048, W = 8: 256 KiB). */
#include "ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A double as two floats: hi carries it to float precision, lo the rest
 * (|lo| <= ulp(hi)/2), so hi + lo is the double to about 2^-48. */
static void put(float *p, double d)
{
    const float hi = (float)d;
    p[0] = hi;
    p[1] = isfinite(hi) ? (float)(d - (double)hi) : 0.0f;
}

static double get(const float *p)
{
    return (double)p[0] + (double)p[1];
}

int ps_bn_group_failed(const ps_bn_group_t *g)
{
    return g ? g->err : 0;
}

void ps_bn_group_free_buf(ps_bn_group_t *g)
{
    if (!g) return;
    free(g->buf);
    g->buf = NULL;
    g->cap = 0;
}

/* Room for this rank's n floats and all ranks' W*n: *mine, *all. */
static int room(ps_bn_group_t *g, size_t n, float **mine, float **all)
{
    const size_t need = n * ((size_t)g->size + 1);
    if (need > g->cap) {
        float *b = realloc(g->buf, need * sizeof *b);
        if (!b) {
            ps_error("cross-worker BN: no memory for %zu floats", need);
            return PS_ENOMEM;
        }
        g->buf = b;
        g->cap = need;
    }
    *mine = g->buf;
    *all = g->buf + n;
    return 0;
}

/* The gather, its failure made sticky; a transport that hands back
 * something else than this rank's own values in its slot is broken
 * (PS_ECORRUPT), not trusted. */
static int exchange(ps_bn_group_t *g, const char *what, const float *mine, float *all, size_t n)
{
    if (g->err) return g->err;
    int rc = g->gather(g->arg, mine, all, n);
    g->gathers++;
    if (!rc && memcmp(all + (size_t)g->rank * n, mine, n * sizeof *mine)) {
        ps_error("cross-worker BN: the gather returned other values in rank %d's own slot: "
                 "the transport is not a gather", g->rank);
        rc = PS_ECORRUPT;
    }
    if (rc) {
        ps_error("cross-worker BN: %s exchange #%llu (%zu floats, rank %d of %d) failed: %s; "
                 "this step's BN falls back to local statistics and the step fails",
                 what, (unsigned long long)g->gathers, n, g->rank, g->size, ps_strerror(rc));
        g->err = rc;
    }
    return rc;
}

/* This rank's (M, a[C], b[C]) out, every rank's in: *all (W rows of
 * 2 + 4C floats); 0 or the group's error. */
static int share(ps_bn_group_t *g, const char *what, int C, double M, const double *a,
                 const double *b, const float **all)
{
    const size_t n = 2 + 4 * (size_t)C;
    float *mine, *every;
    int rc = g->err ? g->err : room(g, n, &mine, &every);
    if (rc) return g->err = rc;
    put(mine, M);
    for (int c = 0; c < C; c++) {
        put(mine + 2 + 2 * c, a[c]);
        put(mine + 2 + 2 * (size_t)C + 2 * c, b[c]);
    }
    *all = every;
    return exchange(g, what, mine, every, n);
}

int ps_bn_group_moments(ps_bn_group_t *g, int C, double *M, double *mean, double *m2)
{
    const size_t n = 2 + 4 * (size_t)C;
    const float *all;
    int rc = share(g, "statistics", C, *M, mean, m2, &all);
    if (rc) return rc;
    double tot = get(all);
    for (int c = 0; c < C; c++) {
        mean[c] = get(all + 2 + 2 * c);
        m2[c] = get(all + 2 + 2 * (size_t)C + 2 * c);
    }
    for (int r = 1; r < g->size; r++) {
        const float *p = all + (size_t)r * n;
        const double mr = get(p), nt = tot + mr;
        for (int c = 0; c < C; c++) {
            const double d = get(p + 2 + 2 * c) - mean[c];
            mean[c] += d * (mr / nt);
            m2[c] += get(p + 2 + 2 * (size_t)C + 2 * c) + d * d * (tot * mr / nt);
        }
        tot = nt;
    }
    *M = tot;
    return 0;
}

int ps_bn_group_sums(ps_bn_group_t *g, int C, double *M, double *a, double *b)
{
    const size_t n = 2 + 4 * (size_t)C;
    const float *all;
    int rc = share(g, "gradient sums", C, *M, a, b, &all);
    if (rc) return rc;
    double tot = 0;
    for (int c = 0; c < C; c++) a[c] = b[c] = 0;
    for (int r = 0; r < g->size; r++) {
        const float *p = all + (size_t)r * n;
        tot += get(p);
        for (int c = 0; c < C; c++) {
            a[c] += get(p + 2 + 2 * c);
            b[c] += get(p + 2 + 2 * (size_t)C + 2 * c);
        }
    }
    *M = tot;
    return 0;
}
