/* The 3-D video models' forward and backward over the backend table, and
 * their row of the model families (resnet_internal.h).  Architectures,
 * names and memory are in video3d_arch.c.
 *
 * Legend: B clips of T frames of 3 x H x W; activations (B, C, T, H, W). */
#include "video3d_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void v3d_free_impl(ps_model_t *m)
{
    v3d_t *v = v3d_of(m);
    if (!v) return;
    free(v->blocks);
    free(v);
    m->impl = NULL;
}

extern const ps_model_family_t ps_v3d_family;

int ps_v3d_create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                  ps_ctx_t *ctx, int max_clips, int H, int W, int count_only)
{
    *out = NULL;
    if (!be || !ctx) return PS_EINVAL;
    const ps_v3d_arch_t *arch = ps_v3d_arch_find(cfg->arch);
    if (!arch) {
        ps_error("model: no 3-D model named \"%s\"", cfg->arch);
        return PS_EINVAL;
    }
    if (cfg->num_classes < 1 || cfg->n_segment < 1 || cfg->n_segment > 1024 || cfg->width < 1 ||
        cfg->width > 4096 || !(cfg->dropout >= 0.f && cfg->dropout < 1.f) ||
        !(cfg->bn_eps > 0.f) || !(cfg->bn_momentum >= 0.f && cfg->bn_momentum <= 1.f) ||
        cfg->bn_mode < 0 || cfg->bn_mode > PS_MODEL_BN_FROZEN) {
        ps_error("model %s: bad config (classes %d, frames %d, width %d, dropout %g, eps %g, "
                 "momentum %g, bn_mode %d)", arch->name, cfg->num_classes, cfg->n_segment,
                 cfg->width, cfg->dropout, cfg->bn_eps, cfg->bn_momentum, cfg->bn_mode);
        return PS_EINVAL;
    }
    if (cfg->recompute) {
        ps_error("model %s: activation recomputation is implemented for the 2-D ResNets "
                 "(TSM / TSN, detector backbones) only", arch->name);
        return PS_EUNSUPPORTED;
    }
    if (cfg->zero_init_residual && ps_model_cfg_bn_mode(cfg) != PS_MODEL_BN_TRAIN) {
        ps_error("model %s: zero_init_residual needs trainable BN (bn_mode train): a frozen "
                 "or partial BN would keep each block's last BN weight at 0", arch->name);
        return PS_EINVAL;
    }
    if (max_clips < 1 || max_clips > 65536 || H < 16 || W < 16 || H > 4096 || W > 4096) {
        ps_error("model %s: bad batch geometry (max_clips %d, H %d, W %d; H, W >= 16)",
                 arch->name, max_clips, H, W);
        return PS_EINVAL;
    }
    ps_model_t *m = calloc(1, sizeof *m);
    v3d_t *v = m ? calloc(1, sizeof *v) : NULL;
    if (!v) {
        free(m);
        return PS_ENOMEM;
    }
    m->family = &ps_v3d_family;
    m->impl = v;
    v->arch = arch;
    snprintf(m->arch_name, sizeof m->arch_name, "%s", arch->name);
    m->cfg = *cfg;
    m->be = be;
    m->ctx = ctx;
    m->max_clips = max_clips;
    m->max_n = (size_t)max_clips;
    m->H = H;
    m->W = W;
    m->fc_pw = m->fc_pb = -1;
    m->count_only = count_only;
    m->bn_mode = ps_model_cfg_bn_mode(cfg);
    int r = ps_v3d_build(m);
    if (r) {
        ps_error("model: cannot build %s for %d clips of %d x %dx%d: %s", arch->name, max_clips,
                 cfg->n_segment, H, W, ps_strerror(r));
        ps_model_destroy(&m);
        return r;
    }
    if (!count_only) ps_model_init(m, 0, 0);
    ps_debug("model: %s, %d params, arena %zu MiB", arch->name, m->nparams,
             m->arena.size >> 20);
    *out = m;
    return 0;
}

/* ---- hooks: the stem, each block, fc ---------------------------------------------- */

static void block_range(const v3block_t *b, int *first, int *n)
{
    int last = b->has_ds ? b->ds.bn.pb : b->u[b->nunit - 1].bn.pb;
    *first = b->u[0].pw;
    *n = last - *first + 1;
}

static void block_hook(ps_model_t *m, const v3block_t *b, ps_model_hook_fn fn)
{
    if (!fn) return;
    int first, n;
    block_range(b, &first, &n);
    fn(m->hook_ctx, first, n);
}

static void stem_hook(ps_model_t *m, ps_model_hook_fn fn)
{
    const v3d_t *v = v3d_of(m);
    if (fn) fn(m->hook_ctx, v->stem[0].pw, v->stem[v->nstem - 1].bn.pb - v->stem[0].pw + 1);
}

/* ---- layers ------------------------------------------------------------------------ */

static size_t out_numel(const v3conv_t *u, int B)
{
    return (size_t)B * u->d.K * u->O * u->P * u->Q;
}

/* conv -> BN (-> ReLU) of in into dst */
static void unit_fwd(ps_model_t *m, v3conv_t *u, float *dst, const float *in, int B, int training)
{
    m->be->conv3d_forward(m->ctx, u->co, in, u->w, NULL, &u->d, B, u->T, u->H, u->W);
    if (u->relu)
        ps_resnet_bn_relu_fwd(m, &u->bn, dst, u->co, B, u->O * u->P * u->Q, training);
    else
        ps_resnet_bn_fwd(m, &u->bn, dst, u->co, B, u->O * u->P * u->Q, training);
}

/* Gradient g w.r.t. the unit's output (clobbered: ReLU's backward in
 * place) -> din (NULL: none) through scratch tmp; in is the unit's input. */
static void unit_bwd(ps_model_t *m, v3conv_t *u, float *din, float *g, float *tmp,
                     const float *in, const float *out, int B)
{
    if (u->relu)
        ps_resnet_bn_relu_bwd(m, &u->bn, tmp, g, out, u->co, B, u->O * u->P * u->Q);
    else
        ps_resnet_bn_bwd(m, &u->bn, tmp, g, u->co, B, u->O * u->P * u->Q);
    m->be->conv3d_backward(m->ctx, din, u->g, NULL, tmp, in, u->w, &u->d, B, u->T, u->H, u->W);
}

static void block_fwd(ps_model_t *m, v3block_t *b, const float *x, int B, int training)
{
    const ps_backend_t *be = m->be;
    b->x = x;
    const float *in = x;
    for (int j = 0; j < b->nunit; j++) {
        v3conv_t *u = &b->u[j];
        float *dst = j < b->nunit - 1 ? u->a : b->y;
        unit_fwd(m, u, dst, in, B, training);
        in = dst;
    }
    const size_t n = out_numel(&b->u[b->nunit - 1], B);
    if (b->has_ds) {
        unit_fwd(m, &b->ds, b->dso, x, B, training);
        be->add(m->ctx, b->y, b->y, b->dso, n);
    } else {
        be->add(m->ctx, b->y, b->y, x, n);
    }
    be->relu_forward(m->ctx, b->y, b->y, n);
}

/* dy in g[0] (clobbered) -> dx in g[3]; g[1], g[2] scratch. */
static void block_bwd(ps_model_t *m, v3block_t *b, float **g, int B)
{
    const ps_backend_t *be = m->be;
    float *A = g[0], *Bf = g[1], *C = g[2], *D = g[3];
    const int last = b->nunit - 1;
    const size_t n = out_numel(&b->u[last], B);
    be->relu_backward(m->ctx, A, A, b->y, n);
    /* the chain, last unit first; unit j's output gradient is A for the
     * last one (it has no ReLU, so A survives for the identity path), C
     * for the others (written by unit j+1's backward) */
    for (int j = last; j >= 0; j--) {
        v3conv_t *u = &b->u[j];
        const float *in = j > 0 ? b->u[j - 1].a : b->x;
        unit_bwd(m, u, j > 0 ? C : D, j == last ? A : C, Bf, in, j < last ? u->a : b->y, B);
    }
    if (b->has_ds) {
        const size_t nin = (size_t)B * b->cin * b->u[0].T * b->u[0].H * b->u[0].W;
        unit_bwd(m, &b->ds, C, A, Bf, b->x, b->dso, B);
        be->accumulate(m->ctx, D, C, nin);
    } else {
        be->accumulate(m->ctx, D, A, n);
    }
}

/* (B*T, 3, H, W) frame-major (the video pipeline's batch) -> (B, 3, T, H, W). */
static void input_in(ps_model_t *m, const float *input, int B)
{
    v3d_t *v = v3d_of(m);
    const int T = m->cfg.n_segment;
    const size_t HW = (size_t)m->H * m->W;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < 3; c++) {
                const float *src = input + (((size_t)b * T + t) * 3 + c) * HW;
                float *dst = v->input + (((size_t)b * 3 + c) * T + t) * HW;
                if (m->be->copy_in) /* CUDA: a DMA on the stream per plane */
                    m->be->copy_in(m->ctx, dst, src, HW);
                else
                    memcpy(dst, src, HW * sizeof(float));
            }
}

static void pool_fwd(ps_model_t *m, v3pool_t *pl, const float *x, int B)
{
    m->be->maxpool3d_forward(m->ctx, pl->y, pl->argmax, x, &pl->d, B, pl->C, pl->T, pl->H,
                             pl->W);
}

static int v3d_forward(ps_model_t *m, const float *input, int nclips, const int32_t *labels,
                       int training, float *loss)
{
    v3d_t *v = v3d_of(m);
    const ps_backend_t *be = m->be;
    const int B = nclips, K = m->cfg.num_classes;
    if (!input || nclips < 1 || nclips > m->max_clips || (labels && !loss)) {
        ps_error("model forward: bad arguments (nclips %d, max %d)", nclips, m->max_clips);
        return PS_EINVAL;
    }
    if (labels) {
        for (int i = 0; i < B; i++)
            if (labels[i] < 0 || labels[i] >= K) {
                ps_error("model forward: label %d of clip %d outside [0,%d)", labels[i], i, K);
                return PS_EINVAL;
            }
        memcpy(m->labels, labels, (size_t)B * sizeof *labels);
    }
    input_in(m, input, B);
    stem_hook(m, m->weights_needed);
    const float *x = v->input;
    for (int i = 0; i < v->nstem; i++) {
        unit_fwd(m, &v->stem[i], v->stem[i].a, x, B, training);
        x = v->stem[i].a;
    }
    if (v->pool1.on) {
        pool_fwd(m, &v->pool1, x, B);
        x = v->pool1.y;
    }
    for (int bi = 0; bi < v->nblocks; bi++) {
        block_hook(m, &v->blocks[bi], m->weights_needed);
        block_fwd(m, &v->blocks[bi], x, B, training);
        x = v->blocks[bi].y;
        if (bi == v->stage_end[0] && v->pool2.on) {
            pool_fwd(m, &v->pool2, x, B);
            x = v->pool2.y;
        }
    }
    /* head: global average pool over T x H x W -> dropout -> fc */
    const int F = m->feat_C;
    be->avgpool_forward(m->ctx, m->feat, x, B, F, m->feat_HW);
    const float *f = m->feat;
    m->last_dropout = training && m->cfg.dropout > 0.f;
    if (m->last_dropout) {
        uint64_t seed = m->seed ^ (0x9E3779B97F4A7C15ull * (m->step + 1));
        be->dropout_forward(m->ctx, m->featd, m->mask, m->feat, (size_t)B * F, m->cfg.dropout,
                            seed);
        f = m->featd;
    }
    m->step++;
    const ps_model_param_t *fw = &m->params[m->fc_pw], *fb = &m->params[m->fc_pb];
    if (m->weights_needed) m->weights_needed(m->hook_ctx, m->fc_pw, m->fc_pb - m->fc_pw + 1);
    be->linear_forward(m->ctx, m->logits, f, fw->w, fb->w, B, F, K);
    if (labels) *loss = be->xent_forward(m->ctx, m->probs, m->logits, m->labels, B, K);
    m->last_nclips = B;
    m->last_training = training;
    m->last_has_labels = labels != NULL;
    return 0;
}

static void swap(float **g, int a, int b)
{
    float *t = g[a];
    g[a] = g[b];
    g[b] = t;
}

static int v3d_backward(ps_model_t *m)
{
    v3d_t *v = v3d_of(m);
    const ps_backend_t *be = m->be;
    if (!m->last_training || !m->last_has_labels) {
        ps_error("model backward: needs a training forward with labels first");
        return PS_ESTATE;
    }
    const int B = m->last_nclips, K = m->cfg.num_classes, F = m->feat_C;
    be->xent_backward(m->ctx, m->dlogits, m->probs, m->labels, 1.f, B, K);
    ps_model_param_t *fw = &m->params[m->fc_pw], *fb = &m->params[m->fc_pb];
    const float *f = m->last_dropout ? m->featd : m->feat;
    float *df = m->last_dropout ? m->dfeatd : m->dfeat;
    be->linear_backward(m->ctx, df, fw->g, fb->g, m->dlogits, f, fw->w, B, F, K);
    if (m->grad_ready) m->grad_ready(m->hook_ctx, m->fc_pw, m->fc_pb - m->fc_pw + 1);
    if (m->last_dropout)
        be->dropout_backward(m->ctx, m->dfeat, m->dfeatd, m->mask, (size_t)B * F,
                             m->cfg.dropout);
    float *g[4] = {v->gbuf[0], v->gbuf[1], v->gbuf[2], v->gbuf[3]};
    be->avgpool_backward(m->ctx, g[0], m->dfeat, B, F, m->feat_HW);
    for (int bi = v->nblocks - 1; bi >= 0; bi--) {
        if (bi == v->stage_end[0] && v->pool2.on) {
            v3pool_t *pl = &v->pool2;
            be->maxpool3d_backward(m->ctx, g[1], g[0], pl->argmax, &pl->d, B, pl->C, pl->T,
                                   pl->H, pl->W);
            swap(g, 0, 1);
        }
        block_bwd(m, &v->blocks[bi], g, B);
        block_hook(m, &v->blocks[bi], m->grad_ready);
        swap(g, 0, 3);
    }
    if (v->pool1.on) {
        v3pool_t *pl = &v->pool1;
        be->maxpool3d_backward(m->ctx, g[1], g[0], pl->argmax, &pl->d, B, pl->C, pl->T, pl->H,
                               pl->W);
        swap(g, 0, 1);
    }
    /* the stem: the clip itself needs no gradient */
    for (int i = v->nstem - 1; i >= 0; i--) {
        const float *in = i > 0 ? v->stem[i - 1].a : v->input;
        unit_bwd(m, &v->stem[i], i > 0 ? g[2] : NULL, g[0], g[1], in, v->stem[i].a, B);
        swap(g, 0, 2);
    }
    stem_hook(m, m->grad_ready);
    return 0;
}

/* 2 FLOPs per multiply-add of the convolutions and fc. */
static double unit_flops(const v3conv_t *u, int B)
{
    return 2.0 * B * u->d.K * (double)(u->d.C / u->d.groups) * u->d.KT * u->d.R * u->d.S *
           u->O * u->P * u->Q;
}

static void v3d_flops(const ps_model_t *m, int nclips, double *fwd, double *bwd)
{
    const v3d_t *v = v3d_of(m);
    double f = 0, b = 0, x;
    for (int i = 0; i < v->nstem; i++) {
        x = unit_flops(&v->stem[i], nclips);
        f += x;
        b += i == 0 ? x : 2 * x; /* no input gradient for the clip */
    }
    for (int bi = 0; bi < v->nblocks; bi++) {
        const v3block_t *bl = &v->blocks[bi];
        for (int j = 0; j < bl->nunit; j++) {
            x = unit_flops(&bl->u[j], nclips);
            f += x;
            b += 2 * x;
        }
        if (bl->has_ds) {
            x = unit_flops(&bl->ds, nclips);
            f += x;
            b += 2 * x;
        }
    }
    x = 2.0 * nclips * m->feat_C * m->cfg.num_classes;
    f += x;
    b += 2 * x;
    if (fwd) *fwd = f;
    if (bwd) *bwd = b;
}

const ps_model_family_t ps_v3d_family = {
    .name = "video3d",
    .forward = v3d_forward,
    .backward = v3d_backward,
    .flops = v3d_flops,
    .free_impl = v3d_free_impl,
};
