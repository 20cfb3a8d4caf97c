/* Cross-worker BN on the CPU backend (ctx->bn_group: worker/engine/
 * bn_group.c, layers/batchnorm.c):
 *   - W ranks (threads) joined by a fake group against PyTorch's
 *     SyncBatchNorm math (tests/golden/gen_bn_group.py: even and uneven
 *     batches, and data with a large mean), bounds derived from fp32
 *     rounding in tests/lib/bn_group_check.h; the control, each rank
 *     alone, is rejected by the same bounds;
 *   - a second implementation: the ranks' outputs equal one BN over the
 *     concatenated batch (this backend without a group) within the same
 *     bounds;
 *   - failures: a transport that fails leaves every BN of the step on its
 *     own statistics without waiting again (no further gather), and the
 *     group's error says so; a transport that returns anything but a
 *     gather (a sum) is refused as corrupt, not trusted;
 *   - bn_forward_saved repeats a training forward's output bit for bit
 *     (the recomputation contract), with and without the group. */
#include "tests/lib/bn_group_check.h"

#include "ps_error.h"
#include "ps_log.h"

static float *cpu_up(ps_ctx_t *ctx, const float *h, size_t n)
{
    float *d = malloc((n ? n : 1) * sizeof *d);
    memcpy(d, h, n * sizeof *d);
    return d;
}
static void cpu_down(ps_ctx_t *ctx, float *h, const float *d, size_t n)
{
    memcpy(h, d, n * sizeof *d);
}
static void cpu_release(float *d) { free(d); }
static const bng_mem_t cpu_mem = {cpu_up, cpu_down, cpu_release};

static ps_ctx_t ctxs[BNG_MAXW];
static ps_ctx_t *ctxp[BNG_MAXW];

/* The ranks' outputs against one BN of the concatenated batch. */
static void second_implementation(const char *cs)
{
    bng_rank_t ranks[BNG_MAXW];
    bng_fake_t f;
    int W, C, HW, ns[BNG_MAXW];
    if (bng_run(cs, &ps_backend_cpu, ctxp, &cpu_mem, 0, 1, ranks, &f, &W, &C, &HW, ns)) return;
    const bng_tol_t t = bng_tol(cs, W, ns, C, HW);
    int Nt = 0;
    for (int r = 0; r < W; r++) Nt += ns[r];
    size_t n = (size_t)Nt * C * HW;
    float *x = malloc(n * 4), *dy = malloc(n * 4), *y = malloc(n * 4), *dx = malloc(n * 4);
    float *ry = malloc(n * 4), *rdx = malloc(n * 4);
    float sm[64], sr[64], rm[64], rv[64], dg[64] = {0}, db[64] = {0};
    memcpy(rm, bng_rec(cs, "rm0", -1), C * 4);
    memcpy(rv, bng_rec(cs, "rv0", -1), C * 4);
    for (int r = 0, off = 0; r < W; off += ns[r], r++) {
        size_t k = (size_t)ns[r] * C * HW, o = (size_t)off * C * HW;
        memcpy(x + o, bng_rec(cs, "x", r), k * 4);
        memcpy(dy + o, bng_rec(cs, "dout", r), k * 4);
        memcpy(ry + o, ranks[r].y, k * 4);
        memcpy(rdx + o, ranks[r].dx, k * 4);
    }
    ps_ctx_t *c0 = ctxp[0];
    ps_backend_cpu.bn_forward_train(c0, y, sm, sr, rm, rv, x, bng_rec(cs, "gamma", -1),
                                    bng_rec(cs, "beta", -1), ranks[0].eps, ranks[0].mom, Nt, C, HW);
    ps_backend_cpu.bn_backward_train(c0, dx, dg, db, dy, x, bng_rec(cs, "gamma", -1), sm, sr, Nt,
                                     C, HW);
    char what[128];
    snprintf(what, sizeof what, "%s: the ranks' outputs == one BN of the %d-sample batch", cs, Nt);
    bng_close(ry, y, n, 2 * t.y, 0, what);
    snprintf(what, sizeof what, "%s: the ranks' input gradients == that BN's", cs);
    bng_close(rdx, dx, n, 2 * t.dx, 0, what);
    snprintf(what, sizeof what, "%s: rank 0's running mean / var == that BN's", cs);
    bng_close(ranks[0].rm, rm, C, 2 * t.rm, 0, what);
    bng_close(ranks[0].rv, rv, C, 0, 2 * t.rv_rel, what);
    free(x), free(dy), free(y), free(dx), free(ry), free(rdx);
    bng_free(ranks, W);
}

/* A transport that fails, one that sums: the layers neither hang nor
 * trust it, and fall back to each rank's own batch. */
static void failures(void)
{
    const char *cs = "uneven";
    for (int mode = 1; mode <= 2; mode++) {
        bng_rank_t ranks[BNG_MAXW], alone[BNG_MAXW];
        bng_fake_t f, f2;
        int W, C, HW, ns[BNG_MAXW];
        bng_run(cs, &ps_backend_cpu, ctxp, &cpu_mem, mode, 1, ranks, &f, &W, &C, &HW, ns);
        bng_run(cs, &ps_backend_cpu, ctxp, &cpu_mem, 0, 0, alone, &f2, &W, &C, &HW, ns);
        const int want = mode == 1 ? PS_EIO : PS_ECORRUPT;
        int errs = 0, fell_back = 0;
        for (int r = 0; r < W; r++) {
            errs += ranks[r].g.err == want && ranks[r].g.gathers == 1;
            size_t n = (size_t)ns[r] * C * HW;
            fell_back += !memcmp(ranks[r].y, alone[r].y, n * 4) && !memcmp(ranks[r].dx, alone[r].dx, n * 4);
        }
        ok(errs == W, "%s transport: every rank's group holds %s after ONE exchange (the "
           "backward did not try again)", mode == 1 ? "a failing" : "a summing (not a gather)",
           ps_strerror(want));
        ok(fell_back == W, "... and every rank used its own batch: output and gradient equal "
           "BN without a group, bit for bit");
        bng_free(ranks, W);
        bng_free(alone, W);
    }
}

/* bn_forward_saved == the training forward's output, bit for bit. */
static void saved(void)
{
    const char *cs = "offset";
    bng_rank_t ranks[BNG_MAXW];
    bng_fake_t f;
    int W, C, HW, ns[BNG_MAXW];
    for (int grp = 0; grp < 2; grp++) {
        bng_run(cs, &ps_backend_cpu, ctxp, &cpu_mem, 0, grp, ranks, &f, &W, &C, &HW, ns);
        int same = 0;
        for (int r = 0; r < W; r++) {
            size_t n = (size_t)ns[r] * C * HW;
            float *y = malloc(n * 4);
            ps_backend_cpu.bn_forward_saved(ctxp[r], y, bng_rec(cs, "x", r), bng_rec(cs, "gamma", -1),
                                            bng_rec(cs, "beta", -1), ranks[r].sm, ranks[r].sr,
                                            ns[r], C, HW);
            same += !memcmp(y, ranks[r].y, n * 4);
            free(y);
        }
        ok(same == W, "bn_forward_saved: the training forward's output bit for bit on all %d "
           "ranks (%s)", W, grp ? "group statistics" : "each rank's own");
        bng_free(ranks, W);
    }
}

int main(void)
{
    ps_log_set_level_str("error");
    golden_load_or_bail("tests/golden/bn_group_golden.bin", 256);
    for (int r = 0; r < BNG_MAXW; r++) {
        ps_engine_init(&ctxs[r], 1);
        ctxp[r] = &ctxs[r];
    }
    static const char *const cases[] = {"even", "uneven", "offset"};
    for (int i = 0; i < 3; i++) {
        bng_check_case(cases[i], "cpu", &ps_backend_cpu, ctxp, &cpu_mem);
        bng_control(cases[i], "cpu", &ps_backend_cpu, ctxp, &cpu_mem);
        second_implementation(cases[i]);
    }
    failures();
    saved();
    golden_free();
    return tap_done();
}
