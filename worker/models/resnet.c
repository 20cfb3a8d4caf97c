/* TSM / TSN ResNet forward and backward over the backend table.  The
 * architecture, names and memory layout are in resnet_params.c. */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* act_bytes: the arena's activation element size (0 = the backend's) */
static int create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                  ps_ctx_t *ctx, int max_clips, int H, int W, int features_only, int count_only,
                  size_t act_bytes)
{
    *out = NULL;
    if (!cfg || !be || !ctx) return PS_EINVAL;
    if (cfg->depth != 18 && cfg->depth != 34 && cfg->depth != 50) {
        ps_error("model: depth %d not supported (18, 34 or 50)", cfg->depth);
        return PS_EINVAL;
    }
    if (cfg->num_classes < 1 || cfg->n_segment < 1 || cfg->width < 1 || cfg->width > 4096 ||
        (cfg->shift && (cfg->shift_div < 2 || cfg->width / cfg->shift_div < 1)) ||
        !(cfg->dropout >= 0.f && cfg->dropout < 1.f) || !(cfg->bn_eps > 0.f) ||
        !(cfg->bn_momentum >= 0.f && cfg->bn_momentum <= 1.f) || cfg->bn_mode < 0 ||
        cfg->bn_mode > PS_MODEL_BN_FROZEN || cfg->shift_place < PS_MODEL_SHIFT_BLOCKRES ||
        cfg->shift_place > PS_MODEL_SHIFT_BLOCK || (cfg->recompute != 0 && cfg->recompute != 1)) {
        ps_error("model: bad config (classes %d, n_segment %d, width %d, shift_div %d, "
                 "shift_place %d, dropout %g, eps %g, momentum %g, bn_mode %d, recompute %d)",
                 cfg->num_classes, cfg->n_segment, cfg->width, cfg->shift_div,
                 cfg->shift_place, cfg->dropout, cfg->bn_eps, cfg->bn_momentum, cfg->bn_mode,
                 cfg->recompute);
        return PS_EINVAL;
    }
    if (cfg->zero_init_residual && ps_model_cfg_bn_mode(cfg) != PS_MODEL_BN_TRAIN) {
        ps_error("model: zero_init_residual needs trainable BN (bn_mode train): a frozen or "
                 "partial BN would keep each block's last BN weight at 0");
        return PS_EINVAL;
    }
    if (max_clips < 1 || H < 32 || W < 32 || H > 4096 || W > 4096 ||
        (size_t)max_clips * cfg->n_segment > (1u << 20)) {
        ps_error("model: bad batch geometry (max_clips %d, H %d, W %d; H, W >= 32)", max_clips,
                 H, W);
        return PS_EINVAL;
    }
    ps_model_t *m = calloc(1, sizeof *m);
    if (!m) return PS_ENOMEM;
    m->family = &ps_resnet_family;
    snprintf(m->arch_name, sizeof m->arch_name, "%s-resnet%d", cfg->shift ? "tsm" : "tsn",
             cfg->depth);
    m->cfg = *cfg;
    m->be = be;
    m->ctx = ctx;
    m->max_clips = max_clips;
    m->H = H;
    m->W = W;
    m->max_n = (size_t)max_clips * cfg->n_segment;
    m->features_only = features_only;
    m->count_only = count_only;
    m->arena.act_bytes = act_bytes ? act_bytes : count_only ? sizeof(float) : be->act_elsize(ctx);
    m->bn_mode = ps_model_cfg_bn_mode(cfg);
    int r = ps_resnet_build(m);
    if (r) {
        ps_error("model: cannot build ResNet-%d for %d clips of %dx%d: %s", cfg->depth,
                 max_clips, H, W, ps_strerror(r));
        ps_model_destroy(&m);
        return r;
    }
    if (!count_only) ps_model_init(m, 0, 0);
    ps_debug("model: ResNet-%d (%s), %d params, arena %zu MiB (activations in %zu-byte "
             "elements%s)", cfg->depth, cfg->shift ? "TSM" : "TSN", m->nparams,
             m->arena.size >> 20, m->arena.act_bytes, cfg->recompute ? ", recomputed" : "");
    *out = m;
    return 0;
}

int ps_resnet_create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                     ps_ctx_t *ctx, int max_clips, int H, int W, int count_only)
{
    return create(out, cfg, be, ctx, max_clips, H, W, 0, count_only, 0);
}

/* A detector's backbone: images, no shift, no head. */
static ps_model_config_t features_config(const ps_model_config_t *cfg)
{
    ps_model_config_t c = *cfg;
    c.n_segment = 1;
    c.shift = 0;
    c.dropout = 0.f;
    c.num_classes = 1;
    return c;
}

int ps_resnet_create_sized(ps_model_t **out, const ps_model_config_t *cfg, int max_clips,
                           int H, int W, size_t act_bytes, int features_only)
{
    static ps_ctx_t none; /* nothing runs */
    if (!cfg || !act_bytes) return PS_EINVAL;
    ps_model_config_t c = features_only ? features_config(cfg) : *cfg;
    return create(out, &c, &ps_backend_cpu, &none, max_clips, H, W, features_only, 1, act_bytes);
}

int ps_resnet_create_features(ps_model_t **out, const ps_model_config_t *cfg,
                              const ps_backend_t *be, ps_ctx_t *ctx, int max_n, int H, int W)
{
    if (!cfg) return PS_EINVAL;
    ps_model_config_t c = features_config(cfg);
    return create(out, &c, be, ctx, max_n, H, W, 1, 0, 0);
}

/* A block's parameters are contiguous in the table (resnet_params.c defines
 * conv1, bn1, conv2, bn2, [conv3, bn3], [downsample.0, downsample.1] in that
 * order), so one range covers them. */
static void block_range(const block_t *b, int *first, int *n)
{
    int last = b->has_ds ? b->dsbn.pb : b->bn[b->nconv - 1].pb;
    *first = b->conv[0].pw;
    *n = last - *first + 1;
}

static void need_block(ps_model_t *m, const block_t *b)
{
    if (!m->weights_needed) return;
    int first, n;
    block_range(b, &first, &n);
    m->weights_needed(m->hook_ctx, first, n);
}

static void ready_block(ps_model_t *m, const block_t *b)
{
    if (!m->grad_ready) return;
    int first, n;
    block_range(b, &first, &n);
    m->grad_ready(m->hook_ctx, first, n);
}

/* conv1 + bn1: indices conv1.pw .. bn1.pb */
static void stem_hook(ps_model_t *m, ps_model_hook_fn fn)
{
    if (fn) fn(m->hook_ctx, m->conv1.pw, m->bn1.pb - m->conv1.pw + 1);
}

/* ---- layers ------------------------------------------------------------------ */

static void conv_fwd(ps_model_t *m, const conv_t *c, float *out, const float *in, int N)
{
    m->be->conv2d_forward(m->ctx, out, in, c->w, NULL, &c->d, N, c->H, c->W);
}

static void conv_bwd(ps_model_t *m, const conv_t *c, float *din, const float *dout,
                     const float *in, int N)
{
    m->be->conv2d_backward(m->ctx, din, c->g, NULL, dout, in, c->w, &c->d, N, c->H, c->W);
}

void ps_resnet_bn_fwd(ps_model_t *m, bn_t *b, float *out, const float *in, int N, int HW,
                      int training)
{
    /* partial BN: only the first BN keeps batch statistics in training;
     * frozen: none */
    b->batch_stats = training && (m->bn_mode == PS_MODEL_BN_TRAIN ||
                                  (m->bn_mode == PS_MODEL_BN_PARTIAL && b->first));
    if (b->batch_stats) {
        m->be->bn_forward_train(m->ctx, out, b->save_mean, b->save_rstd, b->rm, b->rv, in,
                                b->gamma, b->beta, m->cfg.bn_eps, m->cfg.bn_momentum, N, b->C,
                                HW);
        b->nbt++;
    } else {
        m->be->bn_forward_eval(m->ctx, out, in, b->gamma, b->beta, b->rm, b->rv,
                               m->cfg.bn_eps, N, b->C, HW);
    }
}

void ps_resnet_bn_bwd(ps_model_t *m, bn_t *b, float *din, const float *dout, const float *in,
                      int N, int HW)
{
    if (b->batch_stats) {
        m->be->bn_backward_train(m->ctx, din, b->dgamma, b->dbeta, dout, in, b->gamma,
                                 b->save_mean, b->save_rstd, N, b->C, HW);
    } else {
        int frozen = m->bn_mode == PS_MODEL_BN_FROZEN ||
                     (m->bn_mode == PS_MODEL_BN_PARTIAL && !b->first);
        m->be->bn_backward_eval(m->ctx, din, frozen ? NULL : b->dgamma,
                                frozen ? NULL : b->dbeta, dout, in, b->gamma, b->rm, b->rv,
                                m->cfg.bn_eps, N, b->C, HW);
    }
}

/* bn then relu, out = relu(bn(in)), shared with the 3-D models: one pass
 * through the backend's fused entry when the BN uses its running statistics
 * (partial BN's frozen layers, eval) and the backend has one, else the two
 * layers.  The fused entries are for running statistics only, so a BN with
 * batch statistics (train, partial BN's first, and every BN that --bn sync
 * combines over the workers) always goes through bn_forward_train /
 * bn_backward_train, where the group's hook is (ctx->bn_group). */
void ps_resnet_bn_relu_fwd(ps_model_t *m, bn_t *b, float *out, const float *in, int N, int HW,
                           int training)
{
    const ps_backend_t *be = m->be;
    const int batch = training && (m->bn_mode == PS_MODEL_BN_TRAIN ||
                                   (m->bn_mode == PS_MODEL_BN_PARTIAL && b->first));
    if (!batch && be->bn_relu_forward_eval) {
        b->batch_stats = 0;
        be->bn_relu_forward_eval(m->ctx, out, in, b->gamma, b->beta, b->rm, b->rv,
                                 m->cfg.bn_eps, N, b->C, HW);
        return;
    }
    ps_resnet_bn_fwd(m, b, out, in, N, HW, training);
    be->relu_forward(m->ctx, out, out, (size_t)N * b->C * HW);
}

/* The backward of ps_resnet_bn_relu_fwd: dout (clobbered) is the gradient
 * w.r.t. the relu output `out`, din w.r.t. the BN input `in`. */
void ps_resnet_bn_relu_bwd(ps_model_t *m, bn_t *b, float *din, float *dout, const float *out,
                           const float *in, int N, int HW)
{
    const ps_backend_t *be = m->be;
    if (!b->batch_stats && be->bn_relu_backward_eval) {
        int frozen = m->bn_mode == PS_MODEL_BN_FROZEN ||
                     (m->bn_mode == PS_MODEL_BN_PARTIAL && !b->first);
        be->bn_relu_backward_eval(m->ctx, din, frozen ? NULL : b->dgamma,
                                  frozen ? NULL : b->dbeta, dout, out, in, b->gamma, b->rm,
                                  b->rv, m->cfg.bn_eps, N, b->C, HW);
        return;
    }
    be->relu_backward(m->ctx, dout, dout, out, (size_t)N * b->C * HW);
    ps_resnet_bn_bwd(m, b, din, dout, in, N, HW);
}

/* How a forward runs its BNs: a training or evaluation forward (the
 * model's BN mode decides each BN's statistics), or the recomputation of
 * one (--recompute): each BN as that forward ran it, batch statistics from
 * what it saved, nothing updated. */
enum { FWD_EVAL = 0, FWD_TRAIN = 1, FWD_RECOMPUTE = 2 };

static void bn_fwd(ps_model_t *m, bn_t *b, float *out, const float *in, int N, int HW, int how)
{
    if (how != FWD_RECOMPUTE) ps_resnet_bn_fwd(m, b, out, in, N, HW, how == FWD_TRAIN);
    else if (b->batch_stats)
        m->be->bn_forward_saved(m->ctx, out, in, b->gamma, b->beta, b->save_mean, b->save_rstd,
                                N, b->C, HW);
    else
        m->be->bn_forward_eval(m->ctx, out, in, b->gamma, b->beta, b->rm, b->rv, m->cfg.bn_eps,
                               N, b->C, HW);
}

/* relu(bn(conv output)) into out: the forward's, or again in the backward.
 * A recomputed BN with running statistics goes the way the forward took it
 * (the fused entry where the backend has one: an evaluation forward of it),
 * so the recomputed output is the forward's bit for bit either way. */
static void bn_relu_fwd(ps_model_t *m, bn_t *b, float *out, const float *co, int N, int HW,
                        int how)
{
    if (how != FWD_RECOMPUTE || !b->batch_stats) {
        ps_resnet_bn_relu_fwd(m, b, out, co, N, HW, how == FWD_TRAIN);
        return;
    }
    bn_fwd(m, b, out, co, N, HW, how);
    m->be->relu_forward(m->ctx, out, out, (size_t)N * b->C * HW);
}

static void block_fwd(ps_model_t *m, block_t *b, const float *x, int N, int how)
{
    const ps_backend_t *be = m->be;
    int T = m->cfg.n_segment;
    b->x = x;
    const float *in = x, *id = x; /* conv1's input, the identity's */
    if (b->shift) {
        be->tshift_forward(m->ctx, b->xs, x, N / T, T, b->cin, b->H * b->W, m->cfg.shift_div);
        in = b->xs;
        if (b->shift == SHIFT_BLOCK) id = b->xs;
    }
    for (int j = 0; j < b->nconv; j++) {
        const conv_t *c = &b->conv[j];
        int PQ = c->P * c->Q;
        conv_fwd(m, c, b->co[j], in, N);
        if (j < b->nconv - 1) {
            bn_relu_fwd(m, &b->bn[j], b->a[j], b->co[j], N, PQ, how);
            in = b->a[j];
        } else {
            bn_fwd(m, &b->bn[j], b->y, b->co[j], N, PQ, how);
        }
    }
    size_t n = (size_t)N * b->cout * b->P * b->Q;
    if (b->has_ds) {
        conv_fwd(m, &b->ds, b->dso, id, N);
        bn_fwd(m, &b->dsbn, m->tmp, b->dso, N, b->P * b->Q, how);
        be->add(m->ctx, b->y, b->y, m->tmp, n);
    } else {
        be->add(m->ctx, b->y, b->y, id, n);
    }
    be->relu_forward(m->ctx, b->y, b->y, n);
}

/* --recompute: the BN + ReLU output a[j] of block b, which the forward
 * wrote into the shared slot and later layers overwrote, again from the
 * conv output (bit for bit the forward's) */
static const float *block_act(ps_model_t *m, block_t *b, int j, int N)
{
    if (m->cfg.recompute) {
        const conv_t *c = &b->conv[j];
        bn_relu_fwd(m, &b->bn[j], b->a[j], b->co[j], N, c->P * c->Q, FWD_RECOMPUTE);
    }
    return b->a[j];
}

/* dy in g[0] (clobbered) -> dx in g[3]; g[1], g[2] scratch. */
static void block_bwd(ps_model_t *m, block_t *b, float **g, int N)
{
    const ps_backend_t *be = m->be;
    int T = m->cfg.n_segment;
    float *A = g[0], *Bf = g[1], *C = g[2], *D = g[3];
    size_t n = (size_t)N * b->cout * b->P * b->Q;
    be->relu_backward(m->ctx, A, A, b->y, n);
    int last = b->nconv - 1;
    ps_resnet_bn_bwd(m, &b->bn[last], Bf, A, b->co[last], N, b->P * b->Q);
    for (int j = last; j >= 0; j--) {
        const conv_t *c = &b->conv[j];
        const float *in = j > 0 ? block_act(m, b, j - 1, N) : (b->shift ? b->xs : b->x);
        float *din = (j > 0 || b->shift) ? C : D;
        conv_bwd(m, c, din, Bf, in, N);
        if (j > 0) {
            const conv_t *p = &b->conv[j - 1];
            ps_resnet_bn_relu_bwd(m, &b->bn[j - 1], Bf, C, in, b->co[j - 1], N, p->P * p->Q);
        }
    }
    /* 'blockres': conv1's gradient shifted back now, the identity's adds
     * to dx.  'block': the identity's adds to d(shifted input) in C first,
     * and the sum is shifted back at the end. */
    const int blk = b->shift == SHIFT_BLOCK;
    const size_t nin = (size_t)N * b->cin * b->H * b->W;
    if (b->shift == SHIFT_RES)
        be->tshift_backward(m->ctx, D, C, N / T, T, b->cin, b->H * b->W, m->cfg.shift_div);
    float *acc = blk ? C : D;
    if (b->has_ds) {
        float *dd = blk ? D : C; /* free at this point in either case */
        ps_resnet_bn_bwd(m, &b->dsbn, Bf, A, b->dso, N, b->P * b->Q);
        conv_bwd(m, &b->ds, dd, Bf, blk ? b->xs : b->x, N);
        be->accumulate(m->ctx, acc, dd, nin);
    } else {
        be->accumulate(m->ctx, acc, A, n);
    }
    if (blk) be->tshift_backward(m->ctx, D, C, N / T, T, b->cin, b->H * b->W, m->cfg.shift_div);
}

void ps_resnet_forward_features(ps_model_t *m, const float *input, int N, int training)
{
    const ps_backend_t *be = m->be;
    /* host copy: the caller's buffer may be reused at once (CUDA: managed) */
    const size_t nin = (size_t)N * 3 * m->H * m->W;
    if (m->be->copy_in)
        m->be->copy_in(m->ctx, m->input, input, nin); /* CUDA: one DMA, pages stay on the GPU */
    else
        memcpy(m->input, input, nin * sizeof(float));

    /* stem */
    const conv_t *c1 = &m->conv1;
    stem_hook(m, m->weights_needed);
    conv_fwd(m, c1, m->c0, m->input, N);
    bn_relu_fwd(m, &m->bn1, m->a0, m->c0, N, c1->P * c1->Q, training ? FWD_TRAIN : FWD_EVAL);
    be->maxpool_forward(m->ctx, m->p0, m->argmax, m->a0, &m->pool, N, c1->d.K, c1->P, c1->Q);

    const float *x = m->p0;
    for (int bi = 0; bi < m->nblocks; bi++) {
        need_block(m, &m->blocks[bi]);
        block_fwd(m, &m->blocks[bi], x, N, training ? FWD_TRAIN : FWD_EVAL);
        x = m->blocks[bi].y;
    }
    m->last_nclips = N;
    m->last_training = training;
}

const float *ps_resnet_stage_out(const ps_model_t *m, int s, int *C, int *P, int *Q)
{
    const block_t *b = &m->blocks[m->stage_end[s]];
    if (C) *C = b->cout;
    if (P) *P = b->P;
    if (Q) *Q = b->Q;
    return b->y;
}

static int resnet_forward(ps_model_t *m, const float *input, int nclips,
                          const int32_t *labels, int training, float *loss)
{
    if (m->features_only) {
        ps_error("model forward: a detector backbone has no classification head");
        return PS_ESTATE;
    }
    const ps_backend_t *be = m->be;
    const ps_model_config_t *c = &m->cfg;
    if (!input || nclips < 1 || nclips > m->max_clips || (labels && !loss)) {
        ps_error("model forward: bad arguments (nclips %d, max %d)", nclips, m->max_clips);
        return PS_EINVAL;
    }
    int T = c->n_segment, N = nclips * T, K = c->num_classes;
    if (labels) {
        for (int i = 0; i < nclips; i++)
            if (labels[i] < 0 || labels[i] >= K) {
                ps_error("model forward: label %d of clip %d outside [0,%d)", labels[i], i, K);
                return PS_EINVAL;
            }
        memcpy(m->labels, labels, nclips * sizeof *labels);
    }
    ps_resnet_forward_features(m, input, N, training);
    const float *x = m->blocks[m->nblocks - 1].y;

    /* head: avgpool -> dropout -> fc per frame -> mean over segments */
    size_t F = m->feat_C;
    be->avgpool_forward(m->ctx, m->feat, x, N, (int)F, m->feat_HW);
    const float *f = m->feat;
    m->last_dropout = training && c->dropout > 0.f;
    if (m->last_dropout) {
        /* a fresh mask per forward, reproducible from (seed, step) */
        uint64_t seed = m->seed ^ (0x9E3779B97F4A7C15ull * (m->step + 1));
        be->dropout_forward(m->ctx, m->featd, m->mask, m->feat, N * F, c->dropout, seed);
        f = m->featd;
    }
    m->step++;
    const ps_model_param_t *fw = &m->params[m->fc_pw], *fb = &m->params[m->fc_pb];
    if (m->weights_needed) m->weights_needed(m->hook_ctx, m->fc_pw, m->fc_pb - m->fc_pw + 1);
    be->linear_forward(m->ctx, m->lframe, f, fw->w, fb->w, N, (int)F, K);
    be->consensus_forward(m->ctx, m->logits, m->lframe, nclips, T, K);
    if (labels) *loss = be->xent_forward(m->ctx, m->probs, m->logits, m->labels, nclips, K);

    m->last_nclips = nclips;
    m->last_training = training;
    m->last_has_labels = labels != NULL;
    return 0;
}

/* The forward of stage s's blocks again, from the stage's input (kept),
 * with the statistics the training forward used: every activation of the
 * stage as that forward wrote it, bit for bit. */
static void recompute_stage(ps_model_t *m, int s, int N)
{
    int bi = s ? m->stage_end[s - 1] + 1 : 0;
    const float *x = s ? m->blocks[bi - 1].y : m->p0;
    for (; bi <= m->stage_end[s]; bi++) {
        block_fwd(m, &m->blocks[bi], x, N, FWD_RECOMPUTE);
        x = m->blocks[bi].y;
    }
}

/* Blocks from the top down, then the stem; dy of the top block in
 * m->gbuf[0].  dstage (may be NULL): extra gradients entering at the
 * outputs of stages 0..2.  freeze_at: 0 all; 1 no stem; k: no stem and no
 * stage < k-1 (frozen layers get no backward at all). */
static void backward_trunk(ps_model_t *m, const float *const *dstage, int N, int freeze_at)
{
    const ps_backend_t *be = m->be;
    float *g[4] = {m->gbuf[0], m->gbuf[1], m->gbuf[2], m->gbuf[3]};
    int s = 3;
    for (int bi = m->nblocks - 1; bi >= 0; bi--) {
        while (s > 0 && bi <= m->stage_end[s - 1]) {
            s--;
            if (dstage && dstage[s]) { /* the block's output also feeds the FPN */
                const block_t *b = &m->blocks[bi];
                be->accumulate(m->ctx, g[0], dstage[s], (size_t)N * b->cout * b->P * b->Q);
            }
        }
        if (s + 1 < freeze_at) { /* stage s frozen: its gradients stay as they are */
            for (; bi >= 0; bi--) ready_block(m, &m->blocks[bi]);
            stem_hook(m, m->grad_ready);
            return;
        }
        /* --recompute: entering stage s (below the last, whose activations
         * the forward left in place), compute it again from its input */
        if (m->cfg.recompute && s < 3 && bi == m->stage_end[s]) recompute_stage(m, s, N);
        block_bwd(m, &m->blocks[bi], g, N);
        ready_block(m, &m->blocks[bi]);
        float *t = g[0]; /* dx becomes the next block's dy */
        g[0] = g[3];
        g[3] = t;
    }
    if (freeze_at > 0) { /* stem frozen */
        stem_hook(m, m->grad_ready);
        return;
    }

    /* stem: the input image needs no gradient */
    const conv_t *c1 = &m->conv1;
    be->maxpool_backward(m->ctx, g[1], g[0], m->argmax, &m->pool, N, c1->d.K, c1->P, c1->Q);
    if (m->cfg.recompute) /* a0 shares its slot with every BN + ReLU output */
        bn_relu_fwd(m, &m->bn1, m->a0, m->c0, N, c1->P * c1->Q, FWD_RECOMPUTE);
    ps_resnet_bn_relu_bwd(m, &m->bn1, g[2], g[1], m->a0, m->c0, N, c1->P * c1->Q);
    conv_bwd(m, c1, NULL, g[2], m->input, N);
    stem_hook(m, m->grad_ready);
}

static int resnet_backward(ps_model_t *m)
{
    const ps_backend_t *be = m->be;
    if (!m->last_training || !m->last_has_labels) {
        ps_error("model backward: needs a training forward with labels first");
        return PS_ESTATE;
    }
    int B = m->last_nclips, T = m->cfg.n_segment, N = B * T, K = m->cfg.num_classes;
    int F = m->feat_C;
    be->xent_backward(m->ctx, m->dlogits, m->probs, m->labels, 1.f, B, K);
    be->consensus_backward(m->ctx, m->dlframe, m->dlogits, B, T, K);
    ps_model_param_t *fw = &m->params[m->fc_pw], *fb = &m->params[m->fc_pb];
    const float *f = m->last_dropout ? m->featd : m->feat;
    float *df = m->last_dropout ? m->dfeatd : m->dfeat;
    be->linear_backward(m->ctx, df, fw->g, fb->g, m->dlframe, f, fw->w, N, F, K);
    if (m->grad_ready) m->grad_ready(m->hook_ctx, m->fc_pw, m->fc_pb - m->fc_pw + 1);
    if (m->last_dropout)
        be->dropout_backward(m->ctx, m->dfeat, m->dfeatd, m->mask, (size_t)N * F,
                             m->cfg.dropout);

    be->avgpool_backward(m->ctx, m->gbuf[0], m->dfeat, N, F, m->feat_HW);
    backward_trunk(m, NULL, N, 0);
    return 0;
}

void ps_resnet_backward_features(ps_model_t *m, const float *const dstage[4], int N,
                                 int freeze_at)
{
    int C, P, Q;
    ps_resnet_stage_out(m, 3, &C, &P, &Q);
    /* host copy (managed memory on CUDA): block_bwd clobbers its dy */
    memcpy(m->gbuf[0], dstage[3], (size_t)N * C * P * Q * sizeof(float));
    backward_trunk(m, dstage, N, freeze_at);
}

static double conv_flops(const conv_t *c, int N)
{
    return 2.0 * N * c->d.K * (double)(c->d.C / c->d.groups) * c->d.R * c->d.S * c->P * c->Q;
}

static void resnet_flops(const ps_model_t *m, int nclips, double *fwd, double *bwd)
{
    int N = nclips * m->cfg.n_segment;
    double f = 0, b = 0, x;
    x = conv_flops(&m->conv1, N);
    f += x;
    b += x; /* weight gradient only: no input gradient for the image */
    for (int bi = 0; bi < m->nblocks; bi++) {
        const block_t *bl = &m->blocks[bi];
        for (int j = 0; j < bl->nconv; j++) {
            x = conv_flops(&bl->conv[j], N);
            f += x;
            b += 2 * x; /* input gradient + weight gradient */
        }
        if (bl->has_ds) {
            x = conv_flops(&bl->ds, N);
            f += x;
            b += 2 * x;
        }
    }
    x = 2.0 * N * m->feat_C * m->cfg.num_classes;
    f += x;
    b += 2 * x;
    if (fwd) *fwd = f;
    if (bwd) *bwd = b;
}

static void resnet_free_impl(ps_model_t *m)
{
    free(m->blocks);
    m->blocks = NULL;
}

const ps_model_family_t ps_resnet_family = {
    .name = "resnet",
    .forward = resnet_forward,
    .backward = resnet_backward,
    .flops = resnet_flops,
    .free_impl = resnet_free_impl,
};
