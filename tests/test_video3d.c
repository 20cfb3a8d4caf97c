/* Whole-model check of the 3-D video models against PyTorch, as
 * tests/test_resnet.c does for the 2-D ones: the same hash-generated
 * weights and clip on both sides (tests/golden/gen_video3d.py), then
 * logits, loss, every parameter gradient (norm + a sample of elements),
 * the BN running statistics after the training forward and the FLOPs of
 * a forward compared with the goldens (PyTorch float64; tolerances as in
 * tests/test_resnet.c, tests/lib/model_check.h).  Variants: r3d-18, mc3-18,
 * r2plus1d-18 at width 16, and I3D-ResNet-50 in both variants at width 8
 * (3x1x1 with dropout 0.5, the mask a counter hash PyTorch applies too),
 * 2 clips x 8 frames, training-mode BN.
 *
 * Also, without PyTorch:
 *   - ImageNet inflation in closed form: a 2-D ResNet-50 (width 8) saved
 *     with ps_model_save and loaded into I3D-ResNet-50 with centre
 *     inflation gives, on a clip of 8 equal frames in eval mode, the 2-D
 *     net's logits on that frame (the centre slice sees the frame itself;
 *     the zero slices, the max pool over equal frames and the average
 *     over T change nothing); with mean inflation every slice of every
 *     kernel is the 2-D kernel / T;
 *   - a few SGD steps on one batch lower the loss (R(2+1)D, width 8);
 *   - the per-layer hooks --overlap uses: weights_needed before each
 *     group's weights are read, in model order; grad_ready once its
 *     gradients are final, in reverse order; each parameter once;
 *   - a clip too short for the architecture is refused at create. */
#include "tests/lib/model_check.h"
#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"
#include "worker/models/ps_video3d.h"
#include "worker/engine/ps_blas.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED 1234
#define DROPOUT_SEED 42
#define LINE_MAX_ 1000000

static ps_model_t *make(ps_ctx_t *ctx, const char *arch, int width, int clips, int T, int H, int K,
                        float dropout)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    snprintf(cfg.arch, sizeof cfg.arch, "%s", arch);
    cfg.width = width;
    cfg.num_classes = K;
    cfg.n_segment = T;
    cfg.dropout = dropout;
    cfg.partial_bn = 0;
    ps_model_t *m = NULL;
    return ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, clips, H, H) ? NULL : m;
}

static void check_variant(ps_ctx_t *ctx, const char *name)
{
    char path[1024], arch[32];
    snprintf(path, sizeof path, "%s/tests/golden/video3d_%s.txt", srcdir(), name);
    FILE *f = fopen(path, "r");
    if (!ok(f != NULL, "%s: open %s", name, path)) return;
    char *line = malloc(LINE_MAX_);
    int width = 0, clips = 0, T = 0, H = 0, K = 0;
    float dropout = 0;
    unsigned long long seed_in = SEED; /* the input's hash seed (gen_video3d.py's input_seed) */
    while (fgets(line, LINE_MAX_, f) && line[0] == '#') {}
    if (sscanf(line, "config %31s %d %d %d %d %d %f %llu", arch, &width, &clips, &T, &H, &K,
               &dropout, &seed_in) < 7) {
        ok(0, "%s: config line", name);
        free(line), fclose(f);
        return;
    }
    ps_model_t *m = make(ctx, arch, width, clips, T, H, K, dropout);
    if (!ok(m != NULL, "%s: create %s width %d for %d x %d x %dx%d", name, arch, width, clips, T,
            H, H)) {
        free(line), fclose(f);
        return;
    }
    ps_model_init(m, SEED, 1);
    ps_model_set_seed(m, DROPOUT_SEED);
    const size_t nx = (size_t)clips * T * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    ps_model_hash_fill(x, nx, "input", seed_in, 1.0);
    int32_t labels[8];
    for (int b = 0; b < clips; b++) labels[b] = (b * 7 + 3) % K;
    float loss = -1;
    ps_model_zero_grad(m);
    is_int(ps_model_forward(m, x, clips, labels, 1, &loss), 0, "%s: forward", name);
    is_int(ps_model_backward(m), 0, "%s: backward", name);

    int ngrad = 0, nbuf = 0, bad_grad = 0, bad_buf = 0, nparams;
    double worst_norm = 0, worst_elem = 0;
    const ps_model_param_t *P = ps_model_params(m, &nparams);
    int *seen = calloc(nparams, sizeof *seen);
    do {
        char tname[128];
        int off = 0;
        if (line[0] == '#') continue;
        if (!strncmp(line, "flops ", 6)) {
            double fwd, bwd;
            ps_model_flops(m, clips, &fwd, &bwd);
            const double want = strtod(line + 6, NULL);
            ok(fwd == want, "%s: forward FLOPs %.0f = PyTorch's conv/fc count %.0f", name, fwd,
               want);
        } else if (!strncmp(line, "loss ", 5)) {
            is_close(loss, strtod(line + 5, NULL), 1e-4, 1e-3, "%s: loss", name);
        } else if (!strncmp(line, "logits ", 7)) {
            char *p = line + 7, *e;
            long n = strtol(p, &e, 10);
            is_int(n, clips * K, "%s: logits count", name);
            float *ref = malloc(sizeof(float) * (n > 0 ? n : 1));
            for (long i = 0; i < n; i++) ref[i] = strtof(e, &e);
            char what[64];
            snprintf(what, sizeof what, "%s: logits", name);
            allclose(ps_model_logits(m), ref, n, 1e-4, 1e-3, what);
            free(ref);
        } else if (sscanf(line, "grad %127s %*d %*f %*f %*f %*f%n", tname, &off) == 1 && off > 0) {
            int pi = ps_model_find_param(m, tname);
            if (!ok(pi >= 0, "%s: gradient of %s exists in the model", name, tname)) continue;
            seen[pi] = 1;
            ngrad++;
            double ref_norm;
            bad_grad += check_grad_line(name, tname, line, off, &P[pi], &ref_norm, &worst_norm,
                                        &worst_elem);
        } else {
            check_buffer_line(m, name, line, &nbuf, &bad_buf);
        }
    } while (fgets(line, LINE_MAX_, f));
    int unseen = 0;
    for (int i = 0; i < nparams; i++) unseen += !seen[i];
    is_int(ngrad, nparams, "%s: golden has a gradient for all %d parameters", name, nparams);
    is_int(unseen, 0, "%s: every model parameter compared (PyTorch's names)", name);
    ok(bad_grad == 0, "%s: %d gradients match PyTorch float64 (worst norm error %.2g, worst "
       "element error %.2g rms)", name, ngrad, worst_norm, worst_elem);
    ok(nbuf > 0 && bad_buf == 0, "%s: %d BN buffers match PyTorch after one step", name, nbuf);
    free(seen), free(line), free(x);
    fclose(f);
    ps_model_destroy(&m);
}

/* ---- ImageNet inflation ---------------------------------------------------------- */

static void check_inflation(ps_ctx_t *ctx)
{
    const int T = 8, H = 48, K = 7, width = 8;
    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = 50, cfg.shift = 0, cfg.n_segment = 1, cfg.width = width, cfg.num_classes = K;
    cfg.dropout = 0, cfg.partial_bn = 0;
    ps_model_t *m2 = NULL, *m3 = NULL;
    if (!ok(ps_model_create(&m2, &cfg, &ps_backend_cpu, ctx, 1, H, H) == 0,
            "2-D ResNet-50 (width %d) created", width))
        return;
    ps_model_init(m2, 77, 1); /* random BN statistics: every term of eval BN counts */
    char path[] = "/tmp/ps_test_video3d_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    is_int(ps_model_save(m2, path), 0, "2-D ResNet-50 saved (torchvision names)");
    const size_t nf = (size_t)3 * H * H;
    float *frame = malloc(nf * sizeof *frame), *clip = malloc(T * nf * sizeof *clip);
    ps_model_hash_fill(frame, nf, "frame", 5, 1.0);
    for (int t = 0; t < T; t++) memcpy(clip + t * nf, frame, nf * sizeof *frame);
    ps_model_forward(m2, frame, 1, NULL, 0, NULL);
    float ref[16];
    memcpy(ref, ps_model_logits(m2), K * sizeof *ref);

    static const char *const archs[2] = {"i3d-r50-311", "i3d-r50-333"};
    for (int a = 0; a < 2; a++) {
        m3 = make(ctx, archs[a], width, 1, T, H, K, 0.f);
        if (!ok(m3 != NULL, "%s (width %d) created", archs[a], width)) continue;
        is_int(ps_model_load(m3, path, PS_MODEL_LOAD_STRICT | PS_MODEL_LOAD_INFLATE_CENTRE), 0,
               "%s: the 2-D file loads with centre inflation", archs[a]);
        int np;
        const ps_model_param_t *P = ps_model_params(m3, &np);
        int n5 = 0;
        for (int i = 0; i < np; i++) n5 += P[i].ndim == 5;
        is_int(ps_model_inflated(m3), n5, "%s: all %d conv kernels inflated", archs[a], n5);
        ps_model_forward(m3, clip, 1, NULL, 0, NULL);
        char what[96];
        snprintf(what, sizeof what, "%s: static clip, centre inflation = the 2-D net's logits",
                 archs[a]);
        allclose(ps_model_logits(m3), ref, K, 1e-4, 1e-3, what);

        is_int(ps_model_load(m3, path, PS_MODEL_LOAD_STRICT), 0, "%s: mean inflation",
               archs[a]);
        const ps_model_param_t *P2 = ps_model_params(m2, NULL);
        int bad = 0, checked = 0;
        for (int i = 0; i < np; i++) {
            if (P[i].ndim != 5) continue;
            int j = ps_model_find_param(m2, P[i].name);
            if (j < 0) {
                bad++;
                continue;
            }
            const int kt = P[i].shape[2];
            const size_t KC = (size_t)P[i].shape[0] * P[i].shape[1];
            const size_t RS = (size_t)P[i].shape[3] * P[i].shape[4];
            for (size_t kc = 0; kc < KC; kc++)
                for (int t = 0; t < kt; t++)
                    for (size_t r = 0; r < RS; r++, checked++)
                        bad += P[i].w[(kc * kt + t) * RS + r] != P2[j].w[kc * RS + r] / (float)kt;
        }
        ok(bad == 0 && checked > 0, "%s: mean inflation: each of T slices = kernel / T (%d "
           "elements, %d differ)", archs[a], checked, bad);
        ps_model_destroy(&m3);
    }
    /* a 2-D file whose kernel sizes do not match is refused, nothing changed */
    m3 = make(ctx, "r3d-18", 8, 1, T, H, K, 0.f);
    if (m3) {
        ok(ps_model_load(m3, path, PS_MODEL_LOAD_STRICT) < 0,
           "a ResNet-50 file does not load into r3d-18 (names differ)");
        ps_model_destroy(&m3);
    }
    unlink(path);
    free(frame), free(clip);
    ps_model_destroy(&m2);
}

/* ---- training lowers the loss ------------------------------------------------------ */

static void check_loss_falls(ps_ctx_t *ctx)
{
    const int clips = 4, T = 4, H = 32;
    ps_model_t *m = make(ctx, "r2plus1d-18", 8, clips, T, H, 4, 0.f);
    if (!ok(m != NULL, "loss-falls model created")) return;
    ps_model_init(m, 99, 0);
    const size_t nx = (size_t)clips * T * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    ps_model_hash_fill(x, nx, "batch", 3, 1.0);
    int32_t labels[4] = {0, 1, 2, 3};
    int np;
    const ps_model_param_t *P = ps_model_params(m, &np);
    ps_optim_config_t oc;
    ps_optim_config_default(&oc);
    oc.lr = 0.01f, oc.momentum = 0.9f, oc.weight_decay = 1e-4f;
    oc.ngroups = ps_model_groups(m, oc.groups, PS_OPTIM_MAX_GROUPS);
    float **buf = alloc_like(P, np);
    float first = 0, last = 0, tail = 0; /* tail: mean of the last 3 */
    int fails = 0, steps = 10;
    for (int s = 0; s < steps; s++) {
        float loss = NAN;
        ps_model_zero_grad(m);
        fails += ps_model_forward(m, x, clips, labels, 1, &loss) != 0;
        fails += ps_model_backward(m) != 0;
        if (s == 0) first = loss;
        last = loss;
        if (s >= steps - 3) tail += loss / 3;
        sgd_step(P, np, buf, &oc, s == 0);
    }
    is_int(fails, 0, "training steps ran");
    ok(isfinite(last) && tail < 0.6f * first,
       "loss falls: %.4f -> %.4f (mean of the last 3) in %d SGD steps", first, tail, steps);
    free_like(buf, np);
    free(x);
    ps_model_destroy(&m);
}

/* ---- per-layer hooks (what --overlap relies on) ----------------------------------- */

typedef struct hooklog {
    int n, ranges[256][2];
    const ps_model_param_t *P;
    int bad_early; /* gradients that changed after their grad_ready */
    float **snap;
} hooklog_t;

static void on_range(void *ctx, int first, int n)
{
    hooklog_t *h = ctx;
    if (h->n < 256) h->ranges[h->n][0] = first, h->ranges[h->n][1] = n;
    h->n++;
    if (h->snap)
        for (int i = first; i < first + n; i++)
            memcpy(h->snap[i], h->P[i].g, h->P[i].numel * sizeof(float));
}

/* weights_needed covers every parameter once in model order before it is
 * read, grad_ready once in reverse order after its gradient is final. */
static void check_hooks(ps_ctx_t *ctx, const char *arch)
{
    const int clips = 2, T = 4, H = 32;
    ps_model_t *m = make(ctx, arch, 8, clips, T, H, 3, 0.f);
    if (!ok(m != NULL, "%s (hooks) created", arch)) return;
    int np;
    const ps_model_param_t *P = ps_model_params(m, &np);
    hooklog_t need = {0}, ready = {0};
    ready.P = P;
    ready.snap = alloc_like(P, np);
    ps_model_set_hooks(m, on_range, on_range, &need);
    const size_t nx = (size_t)clips * T * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    ps_model_hash_fill(x, nx, "input", 3, 1.0);
    int32_t labels[2] = {0, 2};
    float loss;
    ps_model_zero_grad(m);
    ps_model_forward(m, x, clips, labels, 1, &loss);
    ps_model_set_hooks(m, on_range, NULL, &ready);
    ps_model_backward(m);
    int next = 0, order_ok = need.n <= 256;
    for (int i = 0; i < need.n && order_ok; i++) {
        order_ok = need.ranges[i][0] == next && need.ranges[i][1] > 0;
        next += need.ranges[i][1];
    }
    ok(order_ok && next == np, "%s: weights_needed covers each of %d parameters once, in model "
       "order (%d calls)", arch, np, need.n);
    next = np, order_ok = ready.n <= 256;
    for (int i = 0; i < ready.n && order_ok; i++) {
        order_ok = ready.ranges[i][0] + ready.ranges[i][1] == next;
        next = ready.ranges[i][0];
    }
    ok(order_ok && next == 0, "%s: grad_ready covers each parameter once, in reverse order (%d "
       "calls)", arch, ready.n);
    int changed = 0;
    for (int i = 0; i < np; i++)
        changed += memcmp(ready.snap[i], P[i].g, P[i].numel * sizeof(float)) != 0;
    ok(changed == 0, "%s: every gradient at its grad_ready == the final one (%d differ)", arch,
       changed);
    free_like(ready.snap, np);
    free(x);
    ps_model_destroy(&m);
}

static void check_refusals(ps_ctx_t *ctx)
{
    ps_model_t *m = make(ctx, "i3d-r50-311", 8, 1, 1, 32, 3, 0.f);
    ok(m == NULL, "i3d-r50-311 with 1 frame is refused (pool2 needs 2)");
    ps_model_destroy(&m);
    m = make(ctx, "x3d-m", 8, 1, 8, 32, 3, 0.f);
    ok(m == NULL, "an unknown 3-D model name is refused");
    int n;
    const ps_v3d_arch_t *a = ps_v3d_archs(&n);
    ok(n == 5 && ps_v3d_arch_find("r2plus1d-18") == &a[2], "5 rows, found by name");
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 2);
    static const char *const variants[] = {"r3d18", "mc318", "r2p1d18", "i3d333", "i3d311"};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        check_variant(&ctx, variants[i]);
    check_inflation(&ctx);
    check_loss_falls(&ctx);
    check_hooks(&ctx, "r2plus1d-18");
    check_hooks(&ctx, "i3d-r50-333");
    check_refusals(&ctx);
    ps_ctx_free(&ctx);
    return tap_done();
}
