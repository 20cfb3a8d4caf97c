/* RetinaNet-FPN build, forward and backward over the backend table, the
 * detection layers (upsample-add, focal loss, smooth-L1, head permute)
 * included: the same code runs on every backend.  The anchors are computed
 * once on the host at build time (det_boxes.h).  Tables, init and
 * safetensors are in retinanet_params.c. */
#include "retinanet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/det_boxes.h"

#include <stdlib.h>
#include <string.h>

static size_t umax(size_t a, size_t b) { return a > b ? a : b; }

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

/* Every pointer of the FPN / head arena; run while sizing and for real. */
static void layout(ps_retina_t *m, ps_arena_t *a)
{
    size_t N = m->max_n, F = m->cfg.fpn_channels, K = m->cfg.num_classes, A = m->A;
    size_t nA = PS_RETINA_ANCHORS;
    for (int i = m->nbody; i < m->nparams; i++) TAKE(m->params[i].w, m->params[i].numel);
    for (int i = m->nbody; i < m->nparams; i++) TAKE(m->params[i].g, m->params[i].numel);
    size_t smax = 0;
    for (int i = 0; i < 3; i++) {
        size_t hw = (size_t)m->Hs[i] * m->Ws[i];
        TAKE(m->inner_out[i], N * F * hw);
        TAKE(m->dI[i], N * F * hw);
        TAKE(m->dC[i], N * m->Cs[i] * hw);
    }
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        size_t hw = (size_t)m->lh[l] * m->lw[l];
        TAKE(m->P[l], N * F * hw);
        TAKE(m->dP[l], N * F * hw);
        for (int j = 0; j < 4; j++) {
            TAKE(m->cls_a[l][j], N * F * hw);
            TAKE(m->box_a[l][j], N * F * hw);
        }
        TAKE(m->cls_o[l], N * nA * K * hw);
        TAKE(m->box_o[l], N * nA * 4 * hw);
        smax = umax(smax, N * hw * umax(F, nA * umax(K, 4)));
    }
    /* the upsample-add backward's dtop: (N,F) at C4 / C5 size (<= level 0) */
    TAKE(m->p6r, N * F * m->lh[3] * m->lw[3]);
    if (!m->cfg.p6_from_p5) TAKE(m->dp6x, N * m->Cs[2] * m->Hs[2] * m->Ws[2]);
    TAKE(m->s1, smax);
    TAKE(m->s2, smax);
    TAKE(m->s3, smax);
    TAKE(m->cls_flat, N * A * K);
    TAKE(m->dcls_flat, N * A * K);
    TAKE(m->box_flat, N * A * 4);
    TAKE(m->dbox_flat, N * A * 4);
    TAKE(m->labels, N * A); /* int32: the size of a float */
    TAKE(m->targets, N * A * 4);
    TAKE(m->anchors, A * 4);
}

static void resolve(ps_retina_t *m, rconv_t *c) { ps_rconv_resolve(c, m->params); }

static size_t conv_ws(const rconv_t *c, int N, int H, int W)
{
    return ps_rconv_workspace(c, N, H, W);
}

static int build(ps_retina_t *m)
{
    const ps_retina_config_t *c = &m->cfg;
    ps_model_config_t bc;
    ps_model_config_default(&bc);
    bc.depth = c->depth;
    bc.width = c->width;
    bc.bn_eps = c->bn_eps;
    bc.partial_bn = 0;
    bc.bn_mode = c->bn_mode; /* FROZEN: FrozenBatchNorm2d, a fixed scale and bias */
    bc.recompute = c->recompute;
    int r = ps_resnet_create_features(&m->body, &bc, m->be, m->ctx, m->max_n, m->H, m->W);
    if (r) return r;
    for (int i = 0; i < 3; i++) ps_resnet_stage_out(m->body, i + 1, &m->Cs[i], &m->Hs[i], &m->Ws[i]);
    for (int i = 0; i < 3; i++) {
        m->lh[i] = m->Hs[i];
        m->lw[i] = m->Ws[i];
    }
    m->lh[3] = ps_conv_out(m->Hs[2], 3, 2, 1, 1);
    m->lw[3] = ps_conv_out(m->Ws[2], 3, 2, 1, 1);
    m->lh[4] = ps_conv_out(m->lh[3], 3, 2, 1, 1);
    m->lw[4] = ps_conv_out(m->lw[3], 3, 2, 1, 1);
    m->A = 0;
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        m->lstride[l] = 8 << l;
        m->loff[l] = m->A;
        m->A += m->lh[l] * m->lw[l] * PS_RETINA_ANCHORS;
    }
    if ((r = ps_retina_define(m))) return r;
    ps_arena_begin_sizing(&m->arena);
    layout(m, &m->arena);
    if ((r = ps_arena_commit(&m->arena))) return r;
    layout(m, &m->arena);
    if (m->arena.used > m->arena.size) return PS_ENOMEM;

    rconv_t *all[18] = {&m->inner[0], &m->inner[1], &m->inner[2], &m->layer[0], &m->layer[1],
                        &m->layer[2], &m->p6,       &m->p7,       &m->cls[0],   &m->cls[1],
                        &m->cls[2],   &m->cls[3],   &m->cls_logits, &m->box[0], &m->box[1],
                        &m->box[2],   &m->box[3],   &m->bbox_reg};
    for (int i = 0; i < 18; i++) resolve(m, all[i]);
    int N = m->max_n;
    size_t ws = 0;
    for (int i = 0; i < 3; i++) {
        ws = umax(ws, conv_ws(&m->inner[i], N, m->Hs[i], m->Ws[i]));
        ws = umax(ws, conv_ws(&m->layer[i], N, m->Hs[i], m->Ws[i]));
    }
    ws = umax(ws, conv_ws(&m->p6, N, m->Hs[2], m->Ws[2]));
    ws = umax(ws, conv_ws(&m->p7, N, m->lh[3], m->lw[3]));
    /* the head convs are largest on level 0 */
    for (int i = 8; i < 18; i++) ws = umax(ws, conv_ws(all[i], N, m->lh[0], m->lw[0]));

    /* anchors: SimpleDet's sizes at the nominal strides */
    float sizes[3], cell[PS_RETINA_ANCHORS * 4];
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        ps_det_retina_sizes(sizes, m->lstride[l]);
        ps_det_cell_anchors(cell, sizes, 3, ps_det_retina_ratios, 3);
        ps_det_grid_anchors(m->anchors + (size_t)m->loff[l] * 4, cell, PS_RETINA_ANCHORS,
                            m->lh[l], m->lw[l], m->lstride[l]);
    }
    return ps_ctx_reserve(m->ctx, ws);
}

size_t ps_retina_arena_bytes(const ps_retina_t *m)
{
    return ps_model_arena_bytes(m->body) + m->arena.size;
}

int ps_retina_create(ps_retina_t **out, const ps_retina_config_t *cfg, const ps_backend_t *be,
                     ps_ctx_t *ctx, int max_n, int H, int W)
{
    *out = NULL;
    if (!cfg || !be || !ctx) return PS_EINVAL;
    if ((cfg->depth != 18 && cfg->depth != 34 && cfg->depth != 50) || cfg->num_classes < 1 ||
        cfg->num_classes > 100000 || cfg->width < 1 || cfg->width > 4096 ||
        cfg->fpn_channels < 1 || cfg->fpn_channels > 4096 || cfg->freeze_at < 0 ||
        cfg->freeze_at > 5 || !(cfg->bn_eps > 0.f) ||
        (cfg->bn_mode != PS_MODEL_BN_FROZEN && cfg->bn_mode != PS_MODEL_BN_TRAIN) ||
        (cfg->recompute != 0 && cfg->recompute != 1) || !(cfg->prior > 0.f && cfg->prior < 1.f) ||
        !(cfg->smoothl1_beta > 0.f) || !(cfg->focal_alpha >= 0.f) ||
        !(cfg->focal_gamma >= 0.f)) {
        ps_error("retinanet: bad config (depth %d, classes %d, width %d, fpn %d, freeze_at %d, "
                 "eps %g, bn_mode %d, recompute %d, prior %g, beta %g)", cfg->depth,
                 cfg->num_classes, cfg->width, cfg->fpn_channels, cfg->freeze_at, cfg->bn_eps,
                 cfg->bn_mode, cfg->recompute, cfg->prior, cfg->smoothl1_beta);
        return PS_EINVAL;
    }
    if (max_n < 1 || max_n > 4096 || H < 32 || W < 32 || H > 4096 || W > 4096) {
        ps_error("retinanet: bad batch geometry (max_n %d, H %d, W %d; H, W >= 32)", max_n, H, W);
        return PS_EINVAL;
    }
    ps_retina_t *m = calloc(1, sizeof *m);
    if (!m) return PS_ENOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->ctx = ctx;
    m->max_n = max_n;
    m->H = H;
    m->W = W;
    int r = build(m);
    if (r) {
        ps_error("retinanet: cannot build ResNet-%d-FPN for %d images of %dx%d: %s", cfg->depth,
                 max_n, H, W, ps_strerror(r));
        ps_retina_destroy(&m);
        return r;
    }
    ps_retina_init(m, 0, 0);
    *out = m;
    return 0;
}

void ps_retina_destroy(ps_retina_t **mp)
{
    if (!mp || !*mp) return;
    ps_retina_t *m = *mp;
    ps_retina_free_tables(m);
    ps_model_destroy(&m->body);
    ps_arena_free(&m->arena);
    free(m);
    *mp = NULL;
}

const ps_retina_config_t *ps_retina_config(const ps_retina_t *m) { return &m->cfg; }
int ps_retina_num_anchors(const ps_retina_t *m) { return m->A; }
const float *ps_retina_anchors(const ps_retina_t *m) { return m->anchors; }
const float *ps_retina_cls_out(const ps_retina_t *m) { return m->cls_flat; }
const float *ps_retina_box_out(const ps_retina_t *m) { return m->box_flat; }

void ps_retina_level(const ps_retina_t *m, int l, int *H, int *W, int *stride, int *offset)
{
    if (H) *H = m->lh[l];
    if (W) *W = m->lw[l];
    if (stride) *stride = m->lstride[l];
    if (offset) *offset = m->loff[l];
}

/* ---- forward ------------------------------------------------------------------ */

static void conv_fwd(ps_retina_t *m, const rconv_t *c, float *out, const float *in, int N, int H,
                     int W)
{
    ps_rconv_forward(m->be, m->ctx, c, out, in, N, H, W);
}

static void conv_bwd(ps_retina_t *m, const rconv_t *c, float *din, const float *dout,
                     const float *in, int N, int H, int W)
{
    ps_rconv_backward(m->be, m->ctx, c, din, dout, in, N, H, W);
}

/* One subnet (4 x conv3x3+ReLU, then the output conv) on level l, and its
 * rows into the flat (N, A, D) output. */
static void head_fwd(ps_retina_t *m, const rconv_t *convs, const rconv_t *out_conv,
                     float *const *act, float *o, float *flat, int D, int l, int N)
{
    int h = m->lh[l], w = m->lw[l], F = m->cfg.fpn_channels, nA = PS_RETINA_ANCHORS;
    const float *x = m->P[l];
    for (int j = 0; j < 4; j++) {
        conv_fwd(m, &convs[j], act[j], x, N, h, w);
        m->be->relu_forward(m->ctx, act[j], act[j], (size_t)N * F * h * w);
        x = act[j];
    }
    conv_fwd(m, out_conv, o, x, N, h, w);
    for (int i = 0; i < N; i++)
        m->be->head_permute_forward(m->ctx, flat + ((size_t)i * m->A + m->loff[l]) * D,
                                    o + (size_t)i * nA * D * h * w, nA, D, h, w);
}

int ps_retina_forward(ps_retina_t *m, const float *images, int n, const int32_t *labels,
                      const float *box_targets, int training, float *cls_loss,
                      float *box_loss)
{
    const ps_backend_t *be = m->be;
    int F = m->cfg.fpn_channels, K = m->cfg.num_classes;
    if (!images || n < 1 || n > m->max_n || (!labels != !box_targets) ||
        (labels && (!cls_loss || !box_loss))) {
        ps_error("retinanet forward: bad arguments (n %d, max %d; labels and box targets go "
                 "together, with both loss outputs)", n, m->max_n);
        return PS_EINVAL;
    }
    ps_resnet_forward_features(m->body, images, n, training); /* fires its own hooks */
    const float *C[3];
    for (int i = 0; i < 3; i++) C[i] = ps_resnet_stage_out(m->body, i + 1, NULL, NULL, NULL);

    ps_mhooks_need(&m->hooks, m->g_fpn);
    /* FPN top-down (torchvision FeaturePyramidNetwork) */
    conv_fwd(m, &m->inner[2], m->inner_out[2], C[2], n, m->Hs[2], m->Ws[2]);
    conv_fwd(m, &m->layer[2], m->P[2], m->inner_out[2], n, m->Hs[2], m->Ws[2]);
    for (int i = 1; i >= 0; i--) {
        conv_fwd(m, &m->inner[i], m->inner_out[i], C[i], n, m->Hs[i], m->Ws[i]);
        be->upsample_add_forward(m->ctx, m->inner_out[i], m->inner_out[i], m->inner_out[i + 1],
                                 n, F, m->Hs[i + 1], m->Ws[i + 1], m->Hs[i], m->Ws[i]);
        conv_fwd(m, &m->layer[i], m->P[i], m->inner_out[i], n, m->Hs[i], m->Ws[i]);
    }
    /* LastLevelP6P7 */
    conv_fwd(m, &m->p6, m->P[3], m->cfg.p6_from_p5 ? m->P[2] : C[2], n, m->Hs[2], m->Ws[2]);
    be->relu_forward(m->ctx, m->p6r, m->P[3], (size_t)n * F * m->lh[3] * m->lw[3]);
    conv_fwd(m, &m->p7, m->P[4], m->p6r, n, m->lh[3], m->lw[3]);

    ps_mhooks_need(&m->hooks, m->g_cls);
    ps_mhooks_need(&m->hooks, m->g_box);
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        head_fwd(m, m->cls, &m->cls_logits, m->cls_a[l], m->cls_o[l], m->cls_flat, K, l, n);
        head_fwd(m, m->box, &m->bbox_reg, m->box_a[l], m->box_o[l], m->box_flat, 4, l, n);
    }

    m->last_n = n;
    m->last_training = training;
    m->last_targets = 0;
    if (!labels) return 0;
    size_t rows = (size_t)n * m->A;
    /* the host writes into the arena: an asynchronous device must be done
     * with the last step's labels (count_pos waits right after anyway) */
    int r = be->sync(m->ctx);
    if (r) {
        ps_error("retinanet forward: device sync failed: %s", ps_strerror(r));
        return r;
    }
    memcpy(m->labels, labels, rows * sizeof *labels);
    memcpy(m->targets, box_targets, rows * 4 * sizeof *box_targets);
    int npos = be->count_pos(m->ctx, m->labels, (int)rows);
    m->last_norm = npos > 1 ? (float)npos : 1.f;
    if (be->focal_forward(m->ctx, cls_loss, m->cls_flat, m->labels, m->cfg.focal_alpha,
                          m->cfg.focal_gamma, m->last_norm, (int)rows, K)) {
        ps_error("retinanet forward: a label is outside -1..%d", K);
        return PS_EINVAL;
    }
    be->smoothl1_forward(m->ctx, box_loss, m->box_flat, m->targets, m->labels,
                         m->cfg.smoothl1_beta, m->last_norm, (int)rows);
    m->last_targets = 1;
    return 0;
}

/* ---- backward ----------------------------------------------------------------- */

/* Backward of one subnet on level l: from the flat rows' gradient to
 * d(P_l), written (first) or added (else) into m->dP[l]. */
static void head_bwd(ps_retina_t *m, const rconv_t *convs, const rconv_t *out_conv,
                     float *const *act, const float *dflat, int D, int l, int N, int first)
{
    int h = m->lh[l], w = m->lw[l], F = m->cfg.fpn_channels, nA = PS_RETINA_ANCHORS;
    size_t nf = (size_t)N * F * h * w;
    float *x = m->s1, *y = m->s2;
    for (int i = 0; i < N; i++)
        m->be->head_permute_backward(m->ctx, x + (size_t)i * nA * D * h * w,
                                     dflat + ((size_t)i * m->A + m->loff[l]) * D, nA, D, h, w);
    conv_bwd(m, out_conv, y, x, act[3], N, h, w);
    for (int j = 3; j >= 0; j--) {
        m->be->relu_backward(m->ctx, y, y, act[j], nf);
        float *din = j > 0 ? x : (first ? m->dP[l] : m->s3);
        conv_bwd(m, &convs[j], din, y, j > 0 ? act[j - 1] : m->P[l], N, h, w);
        float *t = x;
        x = y;
        y = t;
    }
    if (!first) m->be->accumulate(m->ctx, m->dP[l], m->s3, nf);
}

int ps_retina_backward(ps_retina_t *m)
{
    const ps_backend_t *be = m->be;
    if (!m->last_training || !m->last_targets) {
        ps_error("retinanet backward: needs a training forward with targets first");
        return PS_ESTATE;
    }
    int n = m->last_n, F = m->cfg.fpn_channels, K = m->cfg.num_classes;
    int rows = n * m->A;
    be->focal_backward(m->ctx, m->dcls_flat, m->cls_flat, m->labels, 1.f, m->cfg.focal_alpha,
                       m->cfg.focal_gamma, m->last_norm, rows, K);
    be->smoothl1_backward(m->ctx, m->dbox_flat, m->box_flat, m->targets, m->labels, 1.f,
                          m->cfg.smoothl1_beta, m->last_norm, rows);
    /* shared heads: their parameter gradients accumulate over the levels */
    for (int l = PS_RETINA_LEVELS - 1; l >= 0; l--) {
        head_bwd(m, m->cls, &m->cls_logits, m->cls_a[l], m->dcls_flat, K, l, n, 1);
        head_bwd(m, m->box, &m->bbox_reg, m->box_a[l], m->dbox_flat, 4, l, n, 0);
    }
    ps_mhooks_ready(&m->hooks, m->g_cls);
    ps_mhooks_ready(&m->hooks, m->g_box);

    const float *C[3];
    for (int i = 0; i < 3; i++) C[i] = ps_resnet_stage_out(m->body, i + 1, NULL, NULL, NULL);
    size_t n3 = (size_t)n * F * m->lh[3] * m->lw[3];
    /* P7 = p7(relu(P6)) */
    conv_bwd(m, &m->p7, m->s1, m->dP[4], m->p6r, n, m->lh[3], m->lw[3]);
    be->relu_backward(m->ctx, m->s1, m->s1, m->p6r, n3);
    be->accumulate(m->ctx, m->dP[3], m->s1, n3);
    /* P6 = p6(P5 or C5) */
    if (m->cfg.p6_from_p5) {
        conv_bwd(m, &m->p6, m->s1, m->dP[3], m->P[2], n, m->Hs[2], m->Ws[2]);
        be->accumulate(m->ctx, m->dP[2], m->s1, (size_t)n * F * m->Hs[2] * m->Ws[2]);
    } else {
        conv_bwd(m, &m->p6, m->dp6x, m->dP[3], C[2], n, m->Hs[2], m->Ws[2]);
    }
    /* output convs, then the top-down merges in reverse */
    for (int i = 0; i < 3; i++)
        conv_bwd(m, &m->layer[i], m->dI[i], m->dP[i], m->inner_out[i], n, m->Hs[i], m->Ws[i]);
    for (int i = 0; i < 2; i++) {
        be->upsample_add_backward(m->ctx, NULL, m->s1, m->dI[i], n, F, m->Hs[i + 1],
                                  m->Ws[i + 1], m->Hs[i], m->Ws[i]);
        be->accumulate(m->ctx, m->dI[i + 1], m->s1, (size_t)n * F * m->Hs[i + 1] * m->Ws[i + 1]);
    }
    for (int i = 0; i < 3; i++)
        conv_bwd(m, &m->inner[i], m->dC[i], m->dI[i], C[i], n, m->Hs[i], m->Ws[i]);
    if (!m->cfg.p6_from_p5)
        be->accumulate(m->ctx, m->dC[2], m->dp6x, (size_t)n * m->Cs[2] * m->Hs[2] * m->Ws[2]);

    ps_mhooks_ready(&m->hooks, m->g_fpn);
    const float *dstage[4] = {NULL, m->dC[0], m->dC[1], m->dC[2]};
    ps_resnet_backward_features(m->body, dstage, n, m->cfg.freeze_at);
    return 0;
}

void ps_retina_flops(const ps_retina_t *m, int n, double *fwd, double *bwd)
{
    double f = 0, b = 0, x;
    ps_model_flops(m->body, n, &f, &b); /* its 1-class "fc" is never run: noise */
    if (m->cfg.freeze_at > 0) {
        /* frozen stem / stages: forward only */
        const ps_model_t *bd = m->body;
        b -= 2.0 * n * bd->conv1.d.K * 3.0 * 49 * bd->conv1.P * bd->conv1.Q;
        for (int bi = 0; bi < bd->nblocks; bi++) {
            int s = 0;
            while (s < 3 && bi > bd->stage_end[s]) s++;
            if (s + 1 >= m->cfg.freeze_at) break;
            const block_t *bl = &bd->blocks[bi];
            for (int j = 0; j < bl->nconv; j++)
                b -= 4.0 * n * bl->conv[j].d.K * bl->conv[j].d.C * bl->conv[j].d.R *
                     bl->conv[j].d.S * bl->conv[j].P * bl->conv[j].Q;
            if (bl->has_ds)
                b -= 4.0 * n * bl->ds.d.K * bl->ds.d.C * bl->ds.P * bl->ds.Q;
        }
    }
    for (int i = 0; i < 3; i++) {
        x = ps_rconv_flops(&m->inner[i], n, m->Hs[i], m->Ws[i]) +
            ps_rconv_flops(&m->layer[i], n, m->Hs[i], m->Ws[i]);
        f += x;
        b += 2 * x;
    }
    x = ps_rconv_flops(&m->p6, n, m->Hs[2], m->Ws[2]) + ps_rconv_flops(&m->p7, n, m->lh[3], m->lw[3]);
    f += x;
    b += 2 * x;
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        x = ps_rconv_flops(&m->cls_logits, n, m->lh[l], m->lw[l]) +
            ps_rconv_flops(&m->bbox_reg, n, m->lh[l], m->lw[l]);
        for (int j = 0; j < 4; j++)
            x += ps_rconv_flops(&m->cls[j], n, m->lh[l], m->lw[l]) +
                 ps_rconv_flops(&m->box[j], n, m->lh[l], m->lw[l]);
        f += x;
        b += 2 * x;
    }
    if (fwd) *fwd = f;
    if (bwd) *bwd = b;
}
