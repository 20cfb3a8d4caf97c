/* ps_model_config_t.zero_init_residual (--zero-init-residual) on the CPU
 * backend, for the 2-D ResNets (basic blocks and bottlenecks) and the 3-D
 * video models (video BasicBlock, R(2+1)D, I3D bottleneck):
 *
 *   - which BN weights start at 0, against torchvision's rule written here
 *     from the names alone: a 2-D BasicBlock's bn2, a Bottleneck's bn3, a
 *     video BasicBlock's conv2.1 (conv2 is Sequential(conv, BN)); never a
 *     downsample's, the stem's or a branch's inner BN, one per block; every
 *     other BN weight 1; without the flag none is 0;
 *   - the identity it promises, in closed form: with every residual branch
 *     scaled by 0, no loss depends on a conv inside a branch, so after a
 *     forward and backward every conv weight inside a branch has an
 *     exactly zero gradient, while the stem's conv, each downsample conv,
 *     fc and the zeroed BN weights themselves (what lets the branches
 *     learn) do not;
 *   - frozen or partial BN refused at create (the zeroed weight could
 *     never move). */
#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 4

typedef struct variant {
    const char *label, *arch; /* arch "" = the 2-D ResNet of depth */
    int depth, T, blocks;
    const char *last_bn;      /* the suffix of a block's last BN weight */
} variant_t;

static const variant_t variants[] = {
    {"TSM-ResNet-18", "", 18, 4, 8, ".bn2.weight"},
    {"TSN-ResNet-50", "", 50, 2, 16, ".bn3.weight"},
    {"r3d-18", "r3d-18", 0, 4, 8, ".conv2.1.weight"},
    {"r2plus1d-18", "r2plus1d-18", 0, 4, 8, ".conv2.1.weight"},
    {"i3d-r50-311", "i3d-r50-311", 0, 4, 16, ".bn3.weight"},
    {"i3d-r50-333", "i3d-r50-333", 0, 4, 16, ".bn3.weight"},
};

static ps_model_config_t config(const variant_t *v, int zero, int bn_mode)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    snprintf(c.arch, sizeof c.arch, "%s", v->arch);
    if (!*v->arch) {
        c.depth = v->depth;
        c.shift = v->depth == 18;
    }
    c.width = 8;
    c.num_classes = K;
    c.n_segment = v->T;
    c.dropout = 0.f;
    c.partial_bn = 0;
    c.bn_mode = bn_mode;
    c.zero_init_residual = zero;
    return c;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* a weight of a BN (1-D, not fc.bias, not a conv bias: these models have none) */
static int is_bn_weight(const ps_model_param_t *p)
{
    return p->ndim == 1 && ends_with(p->name, ".weight");
}

/* the residual branch's last BN weight by torchvision's names: in a block
 * (layerS.I.), never the downsample's */
static int expect_zero(const variant_t *v, const char *name)
{
    return !strncmp(name, "layer", 5) && !strstr(name, "downsample") && ends_with(name, v->last_bn);
}

/* in a residual branch: a conv weight of a block that is not its downsample */
static int in_branch(const ps_model_param_t *p)
{
    return p->ndim >= 4 && !strncmp(p->name, "layer", 5) && !strstr(p->name, "downsample");
}

static double sumsq(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

static void check_variant(ps_ctx_t *ctx, const variant_t *v)
{
    const int clips = 2, H = 32;
    for (int zero = 0; zero < 2; zero++) {
        ps_model_config_t c = config(v, zero, PS_MODEL_BN_TRAIN);
        ps_model_t *m = NULL;
        if (!ok(ps_model_create(&m, &c, &ps_backend_cpu, ctx, clips, H, H) == 0,
                "%s: create (zero_init_residual %d)", v->label, zero))
            continue;
        ps_model_init(m, 7, 0);
        int np, zeros = 0, wrong = 0;
        const ps_model_param_t *P = ps_model_params(m, &np);
        for (int i = 0; i < np; i++) {
            if (!is_bn_weight(&P[i])) continue;
            int want0 = zero && expect_zero(v, P[i].name);
            int bad = 0;
            for (size_t e = 0; e < P[i].numel; e++) bad |= P[i].w[e] != (want0 ? 0.f : 1.f);
            zeros += want0;
            if (bad && wrong++ < 4) diag("%s: %s is not %d", v->label, P[i].name, want0 ? 0 : 1);
        }
        ok(wrong == 0, "%s, zero_init_residual %d: every BN weight as torchvision's rule says",
           v->label, zero);
        if (zero) is_int(zeros, v->blocks, "%s: one zeroed BN weight per block", v->label);
        if (!zero) {
            ps_model_destroy(&m);
            continue;
        }
        /* a training step: the branches' convs get no gradient at all */
        const size_t nx = (size_t)clips * v->T * 3 * H * H;
        float *x = malloc(nx * sizeof *x);
        ps_model_hash_fill(x, nx, "input", 3, 1.0);
        int32_t labels[2] = {1, 3};
        float loss = -1;
        ps_model_zero_grad(m);
        int fb = x && ps_model_forward(m, x, clips, labels, 1, &loss) == 0 && ps_model_backward(m) == 0;
        if (ok(fb, "%s: forward and backward", v->label)) {
            int nonzero_branch = 0, zero_outside = 0, nbranch = 0, gamma_moves = 0;
            for (int i = 0; i < np; i++) {
                double s = sumsq(P[i].g, P[i].numel);
                if (in_branch(&P[i])) {
                    nbranch++;
                    if (s != 0 && nonzero_branch++ < 4)
                        diag("%s: %s has gradient %g", v->label, P[i].name, s);
                } else if (P[i].ndim >= 2 && s == 0) {
                    if (zero_outside++ < 4) diag("%s: %s has no gradient", v->label, P[i].name);
                } else if (is_bn_weight(&P[i]) && expect_zero(v, P[i].name)) {
                    gamma_moves += s > 0;
                }
            }
            ok(nbranch > 0 && nonzero_branch == 0,
               "%s: the %d conv weights inside residual branches have zero gradient", v->label,
               nbranch);
            ok(zero_outside == 0, "%s: the stem, downsample convs and fc have gradients",
               v->label);
            is_int(gamma_moves, v->blocks, "%s: every zeroed BN weight has a gradient", v->label);
        }
        free(x);
        ps_model_destroy(&m);
    }
    static const int frozen[2] = {PS_MODEL_BN_PARTIAL, PS_MODEL_BN_FROZEN};
    for (int k = 0; k < 2; k++) {
        ps_model_config_t c = config(v, 1, frozen[k]);
        ps_model_t *m = NULL;
        int rc = ps_model_create(&m, &c, &ps_backend_cpu, ctx, clips, H, H);
        ok(rc == PS_EINVAL && !m, "%s: zero_init_residual with %s BN refused", v->label,
           k ? "frozen" : "partial");
        ps_model_destroy(&m);
    }
}

int main(void)
{
    ps_log_set_level_str("error");
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 1);
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        check_variant(&ctx, &variants[i]);
    ps_ctx_free(&ctx);
    return tap_done();
}
