/* Activation recomputation (ps_model_config_t.recompute, --recompute) and
 * the arena sized by element size, on the CPU backend.
 *
 * Recompute: the same model, init (random BN) and input with and without
 * it, two training steps each (forward, backward, plain SGD between them,
 * so the second step starts from weights the first produced): loss,
 * logits, every parameter gradient and every BN running statistic must be
 * equal BIT FOR BIT -- the recomputed stages and BN + ReLU outputs are the
 * forward's own values (bn_forward_saved repeats bn_forward_train's
 * rounding), so nothing may differ at all.  Models: TSM-ResNet-18 (basic
 * blocks, residual shift, downsample in layers 2-4) with BN train, TSN
 * ResNet-50 (bottlenecks) with BN train and with TSM's partial BN (the
 * recomputed BNs then mix batch and running statistics), and a RetinaNet
 * backbone (features path, BN train, nothing frozen) whose stage outputs
 * feed the FPN.  The recomputing model's arena must be smaller.  Two
 * threads, as a worker runs: the CPU convolutions give the same bits run
 * to run with a team (static chunks; the kernel row measured for a shape
 * is kept for the process, so both models use the same rows), and the
 * BN + ReLU of partial BN's later layers goes through the CPU backend's
 * fused entry, forward, recomputation and backward.
 *
 * Arena by element size (ps_model_arena_size): the model the CPU backend
 * creates takes exactly what the sizing pass says for 4-byte activations;
 * every activation slot scales with the element size and nothing else
 * does, so size(4) - size(2) = (size(8) - size(4)) / 2 = half the fp32
 * activation bytes (up to the 64-byte rounding of each slot). */
#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"
#include "worker/models/ps_retinanet.h"

#include "ps_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 91

typedef struct run {
    float loss[2];
    float *logits[2];
    float **grad;     /* per parameter, after step 2 */
    float **stat;     /* per f32 buffer (NULL otherwise), after step 2 */
    size_t arena;
} run_t;

static void fill(float *x, size_t n, uint64_t seed)
{
    ps_model_hash_fill(x, n, "input", seed, 1.0);
}

static float *dup(const float *p, size_t n)
{
    float *d = malloc(n * sizeof *d);
    if (d) memcpy(d, p, n * sizeof *d);
    return d;
}

/* Two steps of the classification model; 0 or -1. */
static int run_model(const ps_model_config_t *cfg, int clips, int S, ps_ctx_t *ctx, run_t *r)
{
    ps_model_t *m = NULL;
    if (ps_model_create(&m, cfg, &ps_backend_cpu, ctx, clips, S, S)) return -1;
    ps_model_init(m, SEED, 1);
    ps_model_set_seed(m, SEED);
    r->arena = ps_model_arena_bytes(m);
    const int N = clips * cfg->n_segment, K = cfg->num_classes;
    float *x = malloc((size_t)N * 3 * S * S * sizeof *x);
    int32_t *lab = malloc(clips * sizeof *lab);
    if (!x || !lab) return -1;
    for (int i = 0; i < clips; i++) lab[i] = (i * 7 + 3) % K;
    int np, nb;
    const ps_model_param_t *par = ps_model_params(m, &np);
    const ps_model_buffer_t *bu = ps_model_buffers(m, &nb);
    for (int step = 0; step < 2; step++) {
        fill(x, (size_t)N * 3 * S * S, (uint64_t)step + 1);
        ps_model_zero_grad(m);
        if (ps_model_forward(m, x, clips, lab, 1, &r->loss[step]) || ps_model_backward(m))
            return -1;
        r->logits[step] = dup(ps_model_logits(m), (size_t)clips * K);
        if (step == 0) /* plain SGD, so the second step runs on other weights */
            for (int i = 0; i < np; i++)
                for (size_t k = 0; k < par[i].numel; k++) par[i].w[k] -= 0.01f * par[i].g[k];
    }
    r->grad = calloc(np, sizeof *r->grad);
    r->stat = calloc(nb, sizeof *r->stat);
    for (int i = 0; i < np; i++) r->grad[i] = dup(par[i].g, par[i].numel);
    for (int i = 0; i < nb; i++)
        if (bu[i].f32) r->stat[i] = dup(bu[i].f32, bu[i].numel);
    ps_model_destroy(&m);
    free(x);
    free(lab);
    return 0;
}

static int same(const float *a, const float *b, size_t n)
{
    return a && b && !memcmp(a, b, n * sizeof *a);
}

static void compare(const char *name, const ps_model_config_t *cfg, int clips, int S)
{
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 2);
    run_t r0 = {0}, r1 = {0};
    ps_model_config_t c0 = *cfg, c1 = *cfg;
    c0.recompute = 0;
    c1.recompute = 1;
    int ok0 = run_model(&c0, clips, S, &ctx, &r0) == 0, ok1 = run_model(&c1, clips, S, &ctx, &r1) == 0;
    if (!ok(ok0 && ok1, "%s: two training steps with and without recompute", name)) return;
    /* the tables, for the names and sizes */
    ps_model_t *m = NULL;
    ps_model_create(&m, cfg, &ps_backend_cpu, &ctx, clips, S, S);
    int np, nb;
    const ps_model_param_t *par = ps_model_params(m, &np);
    const ps_model_buffer_t *bu = ps_model_buffers(m, &nb);
    const size_t nl = (size_t)clips * cfg->num_classes;
    for (int s = 0; s < 2; s++) {
        ok(!memcmp(&r0.loss[s], &r1.loss[s], sizeof(float)), "%s step %d: loss bit for bit (%.9g, %.9g)",
           name, s + 1, r0.loss[s], r1.loss[s]);
        ok(same(r0.logits[s], r1.logits[s], nl), "%s step %d: logits bit for bit", name, s + 1);
    }
    int gbad = 0, sbad = 0, nstat = 0;
    for (int i = 0; i < np; i++)
        if (!same(r0.grad[i], r1.grad[i], par[i].numel)) {
            if (gbad++ < 5) diag("%s: gradient of %s differs", name, par[i].name);
        }
    for (int i = 0; i < nb; i++) {
        if (!bu[i].f32) continue;
        nstat++;
        if (!same(r0.stat[i], r1.stat[i], bu[i].numel) && sbad++ < 5)
            diag("%s: %s differs", name, bu[i].name);
    }
    ok(gbad == 0, "%s: all %d parameter gradients bit for bit after 2 steps (%d differ)", name, np, gbad);
    ok(sbad == 0, "%s: all %d running statistics bit for bit (%d differ)", name, nstat, sbad);
    ok(r1.arena < r0.arena, "%s: arena %.2f MiB with recompute < %.2f MiB without (%.0f%%)", name,
       r1.arena / 1048576.0, r0.arena / 1048576.0, 100.0 * r1.arena / r0.arena);
    ps_model_destroy(&m);
    for (int s = 0; s < 2; s++) free(r0.logits[s]), free(r1.logits[s]);
    for (int i = 0; i < np; i++) free(r0.grad[i]), free(r1.grad[i]);
    for (int i = 0; i < nb; i++) free(r0.stat[i]), free(r1.stat[i]);
    free(r0.grad), free(r1.grad), free(r0.stat), free(r1.stat);
    ps_ctx_free(&ctx);
}

/* RetinaNet-R18-FPN, width 8, FPN 16, 3 classes, BN train, nothing frozen */
static ps_retina_config_t retina_config(int recompute)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = 18;
    c.num_classes = 3;
    c.width = 8;
    c.fpn_channels = 16;
    c.freeze_at = 0;
    c.bn_mode = PS_MODEL_BN_TRAIN;
    c.recompute = recompute;
    return c;
}

/* The RetinaNet backbone (features path): losses and gradients of the
 * whole detector with and without recompute in its backbone. */
static int retina_run(int recompute, float *loss, float ***grad, int *np, size_t *arena)
{
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 2);
    ps_retina_config_t c = retina_config(recompute);
    const int N = 2, S = 64;
    ps_retina_t *m = NULL;
    if (ps_retina_create(&m, &c, &ps_backend_cpu, &ctx, N, S, S)) return -1;
    ps_retina_init(m, SEED, 1);
    *arena = ps_retina_arena_bytes(m);
    const int A = ps_retina_num_anchors(m);
    float *x = malloc((size_t)N * 3 * S * S * sizeof *x), *tgt = calloc((size_t)N * A * 4, sizeof *tgt);
    int32_t *lab = malloc((size_t)N * A * sizeof *lab);
    if (!x || !tgt || !lab) return -1;
    fill(x, (size_t)N * 3 * S * S, 5);
    for (int i = 0; i < N * A; i++) {
        lab[i] = i % 97 == 0 ? 1 + i % 3 : i % 13 == 0 ? -1 : 0;
        for (int k = 0; k < 4; k++) tgt[(size_t)i * 4 + k] = 0.1f * (float)((i + k) % 7 - 3);
    }
    ps_retina_zero_grad(m);
    float lc = 0, lb = 0;
    if (ps_retina_forward(m, x, N, lab, tgt, 1, &lc, &lb) || ps_retina_backward(m))
        return -1;
    *loss = lc + lb;
    const ps_model_param_t *par = ps_retina_params(m, np);
    *grad = calloc(*np, sizeof **grad);
    for (int i = 0; i < *np; i++) (*grad)[i] = dup(par[i].g, par[i].numel);
    ps_retina_destroy(&m);
    ps_ctx_free(&ctx);
    free(x), free(tgt), free(lab);
    return 0;
}

static void retina_compare(void)
{
    float l0 = 0, l1 = 0;
    float **g0 = NULL, **g1 = NULL;
    int n0 = 0, n1 = 0;
    size_t a0 = 0, a1 = 0;
    int r0 = retina_run(0, &l0, &g0, &n0, &a0), r1 = retina_run(1, &l1, &g1, &n1, &a1);
    if (!ok(!r0 && !r1 && n0 == n1, "RetinaNet-R18 (BN train): a step with and without recompute"))
        return;
    ok(!memcmp(&l0, &l1, sizeof l0), "RetinaNet: loss bit for bit (%.9g)", l0);
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 2);
    ps_retina_config_t c = retina_config(0); /* the tables, for names and sizes */
    int bad = 0, ntr = 0;
    ps_retina_t *m = NULL;
    ps_retina_create(&m, &c, &ps_backend_cpu, &ctx, 2, 64, 64);
    int np;
    const ps_model_param_t *par = ps_retina_params(m, &np);
    for (int i = 0; i < n0; i++) {
        ntr += par[i].trainable;
        if (!same(g0[i], g1[i], par[i].numel) && bad++ < 5) diag("gradient of %s differs", par[i].name);
        free(g0[i]), free(g1[i]);
    }
    ok(bad == 0 && ntr > 40, "RetinaNet: all %d parameter gradients bit for bit (%d trainable, "
       "backbone BN included; %d differ)", n0, ntr, bad);
    ok(a1 < a0, "RetinaNet: backbone arena %.2f MiB with recompute < %.2f MiB", a1 / 1048576.0,
       a0 / 1048576.0);
    ps_retina_destroy(&m);
    ps_ctx_free(&ctx);
    free(g0), free(g1);
}

static void arena_sizes(const char *name, const ps_model_config_t *cfg, int clips, int S)
{
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 2);
    ps_model_t *m = NULL;
    size_t s2 = 0, s4 = 0, s8 = 0;
    int rc = ps_model_create(&m, cfg, &ps_backend_cpu, &ctx, clips, S, S);
    rc |= ps_model_arena_size(cfg, clips, S, S, 2, &s2) | ps_model_arena_size(cfg, clips, S, S, 4, &s4) |
          ps_model_arena_size(cfg, clips, S, S, 8, &s8);
    if (!ok(!rc, "%s: model and arena sizes", name)) return;
    is_int(ps_model_arena_bytes(m), s4, "%s: the CPU model's arena is the sizing pass's for 4-byte "
           "activations (%zu bytes)", name, s4);
    const double act4 = (double)(s8 - s4), half = (double)(s4 - s2);
    int nslots = 64; /* activation slots of a ResNet-50 at most ~ 5 per block + 16 */
    ok(fabs(2 * half - act4) <= 64.0 * nslots, "%s: 2-byte activations save %.0f bytes = half the "
       "%.0f bytes of fp32 activations (%.1f%% of the arena)", name, half, act4, 100.0 * half / s4);
    ps_model_destroy(&m);
    ps_ctx_free(&ctx);
}

/* A small 2-D ResNet of cfg's defaults but depth, segments, shift, BN mode */
static ps_model_config_t small(int depth, int T, int shift, int bn_mode)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = depth;
    c.width = 8;
    c.n_segment = T;
    c.shift = shift;
    c.num_classes = 5;
    c.dropout = 0.f;
    c.bn_mode = bn_mode;
    c.partial_bn = bn_mode == PS_MODEL_BN_PARTIAL;
    return c;
}

int main(void)
{
    ps_log_set_level_str("warn");
    ps_model_config_t c = small(18, 4, 1, PS_MODEL_BN_TRAIN);
    compare("TSM-R18 BN train", &c, 2, 32);
    arena_sizes("TSM-R18", &c, 2, 32);
    c = small(50, 2, 0, PS_MODEL_BN_TRAIN);
    compare("ResNet-50 BN train", &c, 2, 32);
    c = small(50, 2, 0, PS_MODEL_BN_PARTIAL);
    compare("ResNet-50 partial BN", &c, 2, 32);
    arena_sizes("ResNet-50", &c, 2, 64);
    retina_compare();
    return tap_done();
}
