/* The model's per-layer hooks (ps_model_set_hooks) on the
 * CPU backend, for TSM-ResNet-18 (basic blocks, downsample in layers 2-4)
 * and ResNet-50 (bottlenecks), both with training-mode BN so every BN
 * reads and updates its running statistics.
 *
 * Reference: the same model, same init and input, forward + backward with
 * no hooks.  Then with hooks:
 *   weights_needed  every parameter AND every BN running statistic is NaN
 *                   before the forward and is restored only by the hook of
 *                   its group.  A layer reading a tensor before its hook
 *                   would turn the logits (weights) or the updated running
 *                   statistics (statistics) into NaN, so logits, loss and
 *                   statistics must equal the reference bit for bit; the
 *                   groups must come in model order, each parameter once.
 *   grad_ready      each group's gradients are copied at hook time; they
 *                   must equal the gradients after the whole backward and
 *                   the reference's, bit for bit; groups in reverse model
 *                   order, each parameter exactly once.
 * Controls (the checks can fail): a hook that "forgets" to release fc makes
 * the logits differ; the stem's gradient copied at fc's grad_ready (too
 * early) differs from the final one. */
#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"

#include "ps_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 77

typedef struct hook_state {
    ps_model_t *m;
    const ps_model_param_t *par;
    int np;
    float **w_true;       /* per param: the real weights */
    float **st_true;      /* per buffer: real running stats (f32 ones), else NULL */
    int *bn_of;           /* param -> running_mean buffer index (BN weight) or -1 */
    float **g_seen;       /* per param: gradient copied at its grad_ready */
    int *seen_w, *seen_g; /* calls per parameter */
    int next_w;           /* weights_needed: expected next first */
    int next_g;           /* grad_ready: expected end (first+n) of the next range */
    int order_bad;
    int skip_fc;          /* control: do not release fc */
    float *early_stem;    /* control: conv1's gradient copied at the first grad_ready */
    int ncalls_g;
} hook_state_t;

static void release(hook_state_t *h, int i)
{
    memcpy((float *)h->par[i].w, h->w_true[i], h->par[i].numel * sizeof(float));
    int b = h->bn_of[i];
    if (b < 0) return;
    const ps_model_buffer_t *bu = ps_model_buffers(h->m, NULL);
    memcpy(bu[b].f32, h->st_true[b], bu[b].numel * sizeof(float));         /* running_mean */
    memcpy(bu[b + 1].f32, h->st_true[b + 1], bu[b + 1].numel * sizeof(float)); /* running_var */
}

static void on_weights(void *ctx, int first, int n)
{
    hook_state_t *h = ctx;
    if (first != h->next_w || n < 1 || first + n > h->np) h->order_bad = 1;
    h->next_w = first + n;
    for (int i = first; i < first + n && i < h->np; i++) {
        h->seen_w[i]++;
        if (h->skip_fc && !strncmp(h->par[i].name, "fc.", 3)) continue;
        release(h, i);
    }
}

static void on_grad(void *ctx, int first, int n)
{
    hook_state_t *h = ctx;
    if (first + n != h->next_g || n < 1 || first < 0) h->order_bad = 1;
    h->next_g = first;
    if (h->ncalls_g++ == 0)
        memcpy(h->early_stem, h->par[0].g, h->par[0].numel * sizeof(float));
    for (int i = first; i < first + n && i < h->np; i++) {
        h->seen_g[i]++;
        memcpy(h->g_seen[i], h->par[i].g, h->par[i].numel * sizeof(float));
    }
}

/* Bitwise equality of every parameter's gradient with ref[i]. */
static int grads_equal(const ps_model_param_t *par, int np, float *const *ref)
{
    for (int i = 0; i < np; i++)
        if (memcmp(par[i].g, ref[i], par[i].numel * sizeof(float))) return 0;
    return 1;
}

static void run_variant(ps_ctx_t *ctx, int depth, int clips, int T)
{
    const int H = 32, K = 5;
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = depth;
    cfg.num_classes = K;
    cfg.n_segment = T;
    cfg.shift = 1;
    cfg.dropout = 0.f;
    cfg.partial_bn = 0;
    cfg.bn_mode = PS_MODEL_BN_TRAIN;
    cfg.width = 8;
    ps_model_t *m = NULL;
    if (!ok(ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, clips, H, H) == 0, "R%d created", depth))
        return;
    size_t nin = (size_t)clips * T * 3 * H * H;
    float *x = malloc(nin * sizeof(float));
    int32_t labels[8];
    for (int i = 0; i < clips; i++) labels[i] = (i * 3 + 1) % K;
    ps_model_hash_fill(x, nin, "input", SEED, 1.0);

    hook_state_t h = {.m = m};
    h.par = ps_model_params(m, &h.np);
    int nb;
    const ps_model_buffer_t *bu = ps_model_buffers(m, &nb);
    float **g_ref = calloc(h.np, sizeof *g_ref);
    h.w_true = calloc(h.np, sizeof *h.w_true);
    h.g_seen = calloc(h.np, sizeof *h.g_seen);
    h.st_true = calloc(nb, sizeof *h.st_true);
    float **st_ref = calloc(nb, sizeof *st_ref);
    h.bn_of = malloc(h.np * sizeof(int));
    h.seen_w = calloc(h.np, sizeof(int));
    h.seen_g = calloc(h.np, sizeof(int));
    h.early_stem = malloc(h.par[0].numel * sizeof(float));
    float *logit_ref = malloc((size_t)clips * K * sizeof(float));

    /* reference: no hooks */
    ps_model_init(m, SEED, 1);
    for (int i = 0; i < h.np; i++) {
        h.w_true[i] = malloc(h.par[i].numel * sizeof(float));
        memcpy(h.w_true[i], h.par[i].w, h.par[i].numel * sizeof(float));
        h.bn_of[i] = -1;
        size_t L = strlen(h.par[i].name);
        if (L > 7 && !strcmp(h.par[i].name + L - 7, ".weight"))
            for (int b = 0; b + 1 < nb; b++)
                if (!strncmp(bu[b].name, h.par[i].name, L - 6) &&
                    !strcmp(bu[b].name + L - 6, "running_mean"))
                    h.bn_of[i] = b;
    }
    int nbn = 0;
    for (int i = 0; i < h.np; i++) nbn += h.bn_of[i] >= 0;
    for (int b = 0; b < nb; b++) {
        if (!bu[b].f32) continue;
        h.st_true[b] = malloc(bu[b].numel * sizeof(float));
        st_ref[b] = malloc(bu[b].numel * sizeof(float));
        memcpy(h.st_true[b], bu[b].f32, bu[b].numel * sizeof(float));
    }
    float loss_ref = NAN, loss = NAN;
    ps_model_set_seed(m, SEED);
    ps_model_zero_grad(m);
    int rc = ps_model_forward(m, x, clips, labels, 1, &loss_ref);
    rc = rc ? rc : ps_model_backward(m);
    ok(rc == 0 && isfinite(loss_ref), "R%d: reference forward/backward (loss %.6f)", depth,
       (double)loss_ref);
    memcpy(logit_ref, ps_model_logits(m), (size_t)clips * K * sizeof(float));
    for (int i = 0; i < h.np; i++) {
        g_ref[i] = malloc(h.par[i].numel * sizeof(float));
        memcpy(g_ref[i], h.par[i].g, h.par[i].numel * sizeof(float));
        h.g_seen[i] = calloc(h.par[i].numel, sizeof(float));
    }
    for (int b = 0; b < nb; b++)
        if (bu[b].f32) memcpy(st_ref[b], bu[b].f32, bu[b].numel * sizeof(float));

    /* hooked run: weights and statistics NaN until their hook */
    for (int pass = 0; pass < 2; pass++) {
        int control = pass == 1;
        ps_model_init(m, SEED, 1);
        ps_model_set_seed(m, SEED);
        ps_model_zero_grad(m);
        for (int i = 0; i < h.np; i++)
            for (size_t k = 0; k < h.par[i].numel; k++) h.par[i].w[k] = NAN;
        for (int b = 0; b < nb; b++)
            if (bu[b].f32 && h.st_true[b])
                for (size_t k = 0; k < bu[b].numel; k++) bu[b].f32[k] = NAN;
        memset(h.seen_w, 0, h.np * sizeof(int));
        memset(h.seen_g, 0, h.np * sizeof(int));
        h.next_w = 0;
        h.next_g = h.np;
        h.order_bad = 0;
        h.ncalls_g = 0;
        h.skip_fc = control;
        ps_model_set_hooks(m, on_grad, on_weights, &h);
        rc = ps_model_forward(m, x, clips, labels, 1, &loss);
        const float *lg = ps_model_logits(m);
        if (control) {
            ok(rc == 0 && memcmp(lg, logit_ref, (size_t)clips * K * sizeof(float)) != 0,
               "R%d control: fc never released -> the logits differ (first %g vs %g)", depth,
               (double)lg[0], (double)logit_ref[0]);
            break;
        }
        ok(rc == 0 && !memcmp(lg, logit_ref, (size_t)clips * K * sizeof(float)) &&
               !memcmp(&loss, &loss_ref, sizeof loss),
           "R%d: weights released by weights_needed: logits and loss == reference bit for bit "
           "(loss %.6f)", depth, (double)loss);
        int st_ok = 1;
        for (int b = 0; b < nb; b++)
            if (bu[b].f32 && memcmp(bu[b].f32, st_ref[b], bu[b].numel * sizeof(float))) st_ok = 0;
        ok(st_ok, "R%d: %d BNs' running statistics released by the hook: updated statistics == "
           "reference bit for bit", depth, nbn);
        int once = 1;
        for (int i = 0; i < h.np; i++) once &= h.seen_w[i] == 1;
        ok(once && h.next_w == h.np && !h.order_bad,
           "R%d: weights_needed covers each of %d parameters exactly once, in model order", depth,
           h.np);
        rc = ps_model_backward(m);
        once = 1;
        for (int i = 0; i < h.np; i++) once &= h.seen_g[i] == 1;
        ok(rc == 0 && once && h.next_g == 0 && !h.order_bad,
           "R%d: grad_ready covers each parameter exactly once, in reverse model order (%d calls)",
           depth, h.ncalls_g);
        ok(grads_equal(h.par, h.np, h.g_seen),
           "R%d: every gradient at its grad_ready == the gradient after the whole backward, "
           "bit for bit", depth);
        ok(grads_equal(h.par, h.np, g_ref), "R%d: gradients == the no-hook reference, bit for bit",
           depth);
        ok(memcmp(h.early_stem, h.par[0].g, h.par[0].numel * sizeof(float)) != 0,
           "R%d control: conv1's gradient read at fc's grad_ready (too early) differs from the "
           "final one", depth);
    }

    /* NULL hooks: the plain path again, same numbers */
    ps_model_set_hooks(m, NULL, NULL, NULL);
    ps_model_init(m, SEED, 1);
    ps_model_set_seed(m, SEED);
    ps_model_zero_grad(m);
    rc = ps_model_forward(m, x, clips, labels, 1, &loss);
    rc = rc ? rc : ps_model_backward(m);
    ok(rc == 0 && !memcmp(&loss, &loss_ref, sizeof loss) && grads_equal(h.par, h.np, g_ref),
       "R%d: hooks removed: loss and gradients == reference", depth);

    for (int i = 0; i < h.np; i++) free(h.w_true[i]), free(g_ref[i]), free(h.g_seen[i]);
    for (int b = 0; b < nb; b++) free(h.st_true[b]), free(st_ref[b]);
    free(h.w_true), free(g_ref), free(h.g_seen), free(h.st_true), free(st_ref);
    free(h.bn_of), free(h.seen_w), free(h.seen_g), free(h.early_stem), free(logit_ref), free(x);
    ps_model_destroy(&m);
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = PS_LOG_WARN;
    ps_engine_init(&ctx, 1);
    run_variant(&ctx, 18, 2, 4);
    run_variant(&ctx, 50, 1, 2);
    ps_ctx_free(&ctx);
    return tap_done();
}
