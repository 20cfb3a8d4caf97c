/* ResNet layout: the architecture (torchvision v1.5), the parameter and
 * buffer tables with torchvision names, the TSM optimizer groups, the arena
 * layout and the deterministic initialisation. */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t ps_model_fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

void ps_model_hash_fill(float *dst, size_t n, const char *name, uint64_t seed, double scale)
{
    uint64_t key = seed ^ ps_model_fnv1a64(name);
    for (size_t i = 0; i < n; i++)
        dst[i] = (float)((2.0 * (double)ps_rng_uniform(key, i) - 1.0) * scale);
}

void ps_model_config_default(ps_model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->depth = 50;
    c->num_classes = 400;
    c->n_segment = 8;
    c->shift = 1;
    c->shift_div = 8;
    c->dropout = 0.5f;
    c->partial_bn = 1;
    c->fc_lr5 = 0;
    c->width = 64;
    c->bn_eps = 1e-5f;
    c->bn_momentum = 0.1f;
}

int ps_model_parse_name(const char *name, int *depth, int *shift)
{
    if (!strncmp(name, "tsm-r", 5)) *shift = 1;
    else if (!strncmp(name, "tsn-r", 5)) *shift = 0;
    else return PS_EINVAL;
    char *end;
    long d = strtol(name + 5, &end, 10);
    if (*end || (d != 18 && d != 34 && d != 50)) return PS_EINVAL;
    *depth = (int)d;
    return 0;
}

/* ---- tables ---------------------------------------------------------------- */

static int add_param(ps_model_t *m, const char *name, int ndim, const int *shape, int group,
                     int trainable)
{
    return ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, name, ndim, shape, group,
                             trainable);
}

static int add_buffer(ps_model_t *m, const char *name, int ndim, size_t numel)
{
    if (m->nbuffers == m->cap_buffers) {
        int cap = m->cap_buffers ? 2 * m->cap_buffers : 64;
        ps_model_buffer_t *b = realloc(m->buffers, cap * sizeof *b);
        if (!b) return PS_ENOMEM;
        m->buffers = b;
        m->cap_buffers = cap;
    }
    ps_model_buffer_t *b = &m->buffers[m->nbuffers];
    memset(b, 0, sizeof *b);
    if (!(b->name = strdup(name))) return PS_ENOMEM;
    b->ndim = ndim;
    b->numel = numel;
    return m->nbuffers++;
}

void ps_resnet_free_tables(ps_model_t *m)
{
    ps_mtab_free(&m->params, &m->nparams, &m->buffers, &m->nbuffers);
    m->cap_params = m->cap_buffers = 0;
}

static int def_conv(ps_model_t *m, conv_t *c, const char *name, int C, int K, int R, int stride,
                    int pad, int H, int W)
{
    memset(c, 0, sizeof *c);
    c->d = (ps_conv2d_desc_t){.C = C, .K = K, .R = R, .S = R, .stride_h = stride,
                              .stride_w = stride, .pad_h = pad, .pad_w = pad, .dil_h = 1,
                              .dil_w = 1, .groups = 1};
    c->H = H;
    c->W = W;
    c->P = ps_conv_out(H, R, stride, pad, 1);
    c->Q = ps_conv_out(W, R, stride, pad, 1);
    int shape[4] = {K, C, R, R};
    char full[96];
    snprintf(full, sizeof full, "%s.weight", name);
    c->pw = add_param(m, full, 4, shape, PS_MODEL_GROUP_WEIGHT, 1);
    return c->pw < 0 ? c->pw : 0;
}

int ps_resnet_def_bn(ps_model_t *m, bn_t *b, const char *name, int C, int first)
{
    memset(b, 0, sizeof *b);
    b->C = C;
    b->first = first;
    /* TSM partialBN: every BN but the first is frozen (eval statistics and
     * no gradient for its affine parameters); FROZEN: all of them */
    int trainable = m->bn_mode == PS_MODEL_BN_TRAIN ||
                    (m->bn_mode == PS_MODEL_BN_PARTIAL && first);
    char full[96];
    static const char *sfx[5] = {"weight", "bias", "running_mean", "running_var",
                                 "num_batches_tracked"};
    int *idx[5] = {&b->pg, &b->pb, &b->brm, &b->brv, &b->bnt};
    for (int i = 0; i < 5; i++) {
        snprintf(full, sizeof full, "%s.%s", name, sfx[i]);
        int r = i < 2 ? add_param(m, full, 1, &C, PS_MODEL_GROUP_BN, trainable)
                      : add_buffer(m, full, i == 4 ? 0 : 1, i == 4 ? 1 : (size_t)C);
        if (r < 0) return r;
        *idx[i] = r;
    }
    return 0;
}

static int stage_blocks(int depth, int s)
{
    static const int b18[4] = {2, 2, 2, 2}, b34[4] = {3, 4, 6, 3};
    return depth == 18 ? b18[s] : b34[s]; /* 34 and 50 share [3,4,6,3] */
}

/* Define the whole architecture: tables and shapes, no memory yet. */
static int define(ps_model_t *m)
{
    const ps_model_config_t *c = &m->cfg;
    int w = c->width, r;
    int bottleneck = c->depth == 50, exp = bottleneck ? 4 : 1;

    if ((r = def_conv(m, &m->conv1, "conv1", 3, w, 7, 2, 3, m->H, m->W))) return r;
    if ((r = ps_resnet_def_bn(m, &m->bn1, "bn1", w, 1))) return r;
    m->pool = (ps_pool_desc_t){.R = 3, .S = 3, .stride_h = 2, .stride_w = 2, .pad_h = 1,
                               .pad_w = 1};
    m->pool_P = ps_conv_out(m->conv1.P, 3, 2, 1, 1);
    m->pool_Q = ps_conv_out(m->conv1.Q, 3, 2, 1, 1);

    m->nblocks = 0;
    for (int s = 0; s < 4; s++) m->nblocks += stage_blocks(c->depth, s);
    m->blocks = calloc(m->nblocks, sizeof *m->blocks);
    if (!m->blocks) return PS_ENOMEM;

    /* TSM's make_temporal_shift: 'block' wraps every block; 'blockres'
     * shifts conv1's input of every block, or of every second one when
     * layer3 has >= 23 blocks (ResNet-101 and deeper) */
    int block_place = c->shift_place == PS_MODEL_SHIFT_BLOCK;
    int n_round = !block_place && stage_blocks(c->depth, 2) >= 23 ? 2 : 1;
    int inplanes = w, H = m->pool_P, W = m->pool_Q, bi = 0;
    char name[96];
    for (int s = 0; s < 4; s++) {
        int planes = w << s, stride = s == 0 ? 1 : 2;
        for (int i = 0; i < stage_blocks(c->depth, s); i++, bi++) {
            block_t *b = &m->blocks[bi];
            int st = i == 0 ? stride : 1;
            b->nconv = bottleneck ? 3 : 2;
            b->shift = !c->shift || i % n_round ? SHIFT_NONE : block_place ? SHIFT_BLOCK : SHIFT_RES;
            b->cin = inplanes;
            b->cout = planes * exp;
            b->H = H;
            b->W = W;
            for (int j = 0; j < b->nconv; j++) {
                int cin = j == 0 ? inplanes : planes, cout = j == b->nconv - 1 ? planes * exp : planes;
                /* v1.5: the stride sits on the 3x3 conv (conv2 of the bottleneck) */
                int k = bottleneck && j != 1 ? 1 : 3;
                int cs = bottleneck ? (j == 1 ? st : 1) : (j == 0 ? st : 1);
                int hin = j == 0 ? H : b->conv[j - 1].P, win = j == 0 ? W : b->conv[j - 1].Q;
                snprintf(name, sizeof name, "layer%d.%d.conv%d", s + 1, i, j + 1);
                if ((r = def_conv(m, &b->conv[j], name, cin, cout, k, cs, k / 2, hin, win))) return r;
                snprintf(name, sizeof name, "layer%d.%d.bn%d", s + 1, i, j + 1);
                if ((r = ps_resnet_def_bn(m, &b->bn[j], name, cout, 0))) return r;
            }
            if (st != 1 || inplanes != planes * exp) {
                b->has_ds = 1;
                snprintf(name, sizeof name, "layer%d.%d.downsample.0", s + 1, i);
                if ((r = def_conv(m, &b->ds, name, inplanes, planes * exp, 1, st, 0, H, W))) return r;
                snprintf(name, sizeof name, "layer%d.%d.downsample.1", s + 1, i);
                if ((r = ps_resnet_def_bn(m, &b->dsbn, name, planes * exp, 0))) return r;
            }
            m->params[b->bn[b->nconv - 1].pg].residual_last = 1;
            b->P = b->conv[b->nconv - 1].P;
            b->Q = b->conv[b->nconv - 1].Q;
            inplanes = planes * exp;
            H = b->P;
            W = b->Q;
        }
        m->stage_end[s] = bi - 1;
    }
    m->feat_C = inplanes;
    m->feat_HW = H * W;
    m->fc_pw = m->fc_pb = -1;
    if (m->features_only) return 0;
    int K = c->num_classes, fcw[2] = {K, inplanes};
    m->fc_new = c->fc_lr5;
    m->fc_pw = add_param(m, "fc.weight", 2, fcw,
                         m->fc_new ? PS_MODEL_GROUP_NEWFC_WEIGHT : PS_MODEL_GROUP_WEIGHT, 1);
    if (m->fc_pw < 0) return m->fc_pw;
    m->fc_pb = add_param(m, "fc.bias", 1, &K,
                         m->fc_new ? PS_MODEL_GROUP_NEWFC_BIAS : PS_MODEL_GROUP_BIAS, 1);
    return m->fc_pb < 0 ? m->fc_pb : 0;
}

/* ---- arena ----------------------------------------------------------------- */

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))
/* activations and their gradients: the backend's element size */
#define TAKE_ACT(ptr, n) ((ptr) = ps_arena_take_act(a, (n)))

void ps_resnet_take_bn(ps_arena_t *a, bn_t *b)
{
    TAKE(b->save_mean, b->C);
    TAKE(b->save_rstd, b->C);
}

static size_t umax(size_t a, size_t b) { return a > b ? a : b; }

static size_t conv_out_numel(const conv_t *c)
{
    return (size_t)c->d.K * c->P * c->Q;
}

/* A block's activations from a (the arena, or with recompute its stage's
 * view of the shared region): the shifted input, the conv outputs, the BN +
 * ReLU outputs unless recomputed (ascr), the downsample output and, unless
 * kept apart (the stage's output), the block output. */
static void take_block(ps_arena_t *a, const ps_model_t *m, block_t *b, int take_y)
{
    size_t N = m->max_n;
    if (b->shift) TAKE_ACT(b->xs, N * b->cin * b->H * b->W);
    for (int j = 0; j < b->nconv; j++) {
        TAKE_ACT(b->co[j], N * conv_out_numel(&b->conv[j]));
        if (j < b->nconv - 1) {
            if (m->cfg.recompute) b->a[j] = m->ascr;
            else TAKE_ACT(b->a[j], N * conv_out_numel(&b->conv[j]));
        }
    }
    if (b->has_ds) TAKE_ACT(b->dso, N * b->cout * b->P * b->Q);
    if (take_y) TAKE_ACT(b->y, N * b->cout * b->P * b->Q);
}

/* --recompute: the stages' block activations, each stage laid out from the
 * start of one region (only the stage being computed or recomputed is
 * live); the stages' outputs are taken from a itself. */
static void take_stages_shared(ps_arena_t *a, ps_model_t *m)
{
    size_t region = 0;
    ps_arena_t v;
    for (int s = 0, bi = 0; s < 4; s++) { /* sizes: a view with no memory */
        ps_arena_view(&v, a, NULL, 0);
        for (; bi <= m->stage_end[s]; bi++) take_block(&v, m, &m->blocks[bi], bi != m->stage_end[s]);
        region = umax(region, v.used);
    }
    float *base = ps_arena_take(a, (region + sizeof(float) - 1) / sizeof(float));
    for (int s = 0, bi = 0; s < 4; s++) {
        ps_arena_view(&v, a, base, region);
        for (; bi <= m->stage_end[s]; bi++) take_block(&v, m, &m->blocks[bi], bi != m->stage_end[s]);
        block_t *last = &m->blocks[m->stage_end[s]];
        TAKE_ACT(last->y, m->max_n * last->cout * last->P * last->Q);
    }
}

/* Hand out every pointer; run once while sizing and once for real, in the
 * same order (ps_arena_t's contract). */
static void layout(ps_model_t *m, ps_arena_t *a)
{
    size_t N = m->max_n, K = m->cfg.num_classes;
    const int rc = m->cfg.recompute;
    ps_mtab_take(a, m->params, m->nparams, m->buffers, m->nbuffers);

    TAKE(m->input, N * 3 * m->H * m->W);
    size_t c0 = conv_out_numel(&m->conv1);
    size_t p0 = (size_t)m->conv1.d.K * m->pool_P * m->pool_Q;
    size_t mx = umax(c0, p0), amx = c0; /* largest activation, BN + ReLU output */
    for (int bi = 0; bi < m->nblocks; bi++) {
        const block_t *b = &m->blocks[bi];
        mx = umax(mx, (size_t)b->cin * b->H * b->W);
        for (int j = 0; j < b->nconv; j++) {
            mx = umax(mx, conv_out_numel(&b->conv[j]));
            if (j < b->nconv - 1) amx = umax(amx, conv_out_numel(&b->conv[j]));
        }
    }
    TAKE_ACT(m->c0, N * c0);
    if (rc) TAKE_ACT(m->ascr, N * amx);
    if (rc) m->a0 = m->ascr;
    else TAKE_ACT(m->a0, N * c0);
    TAKE_ACT(m->p0, N * p0);
    TAKE(m->argmax, N * p0); /* int32 has the size of a float */
    ps_resnet_take_bn(a, &m->bn1);
    for (int bi = 0; bi < m->nblocks; bi++) {
        block_t *b = &m->blocks[bi];
        for (int j = 0; j < b->nconv; j++) ps_resnet_take_bn(a, &b->bn[j]);
        if (b->has_ds) ps_resnet_take_bn(a, &b->dsbn);
        if (!rc) take_block(a, m, b, 1);
    }
    if (rc) take_stages_shared(a, m);
    m->max_act = mx;
    for (int i = 0; i < 4; i++) TAKE_ACT(m->gbuf[i], N * mx);
    TAKE_ACT(m->tmp, N * mx);
    TAKE(m->lframe, N * K);
    TAKE(m->dlframe, N * K);
    ps_resnet_take_head(a, m, N);
}

void ps_resnet_take_head(ps_arena_t *a, ps_model_t *m, size_t rows)
{
    const size_t F = m->feat_C, K = m->cfg.num_classes, B = m->max_clips;
    TAKE_ACT(m->feat, rows * F);
    TAKE_ACT(m->featd, rows * F);
    TAKE_ACT(m->dfeat, rows * F);
    TAKE_ACT(m->dfeatd, rows * F);
    TAKE(m->mask, (rows * F + 3) / 4);
    TAKE(m->logits, B * K);
    TAKE(m->probs, B * K);
    TAKE(m->dlogits, B * K);
    TAKE(m->labels, B);
}

static void resolve_conv(ps_model_t *m, conv_t *c)
{
    c->w = m->params[c->pw].w;
    c->g = m->params[c->pw].g;
}

void ps_resnet_resolve_bn(ps_model_t *m, bn_t *b)
{
    b->gamma = m->params[b->pg].w;
    b->dgamma = m->params[b->pg].g;
    b->beta = m->params[b->pb].w;
    b->dbeta = m->params[b->pb].g;
    b->rm = m->buffers[b->brm].f32;
    b->rv = m->buffers[b->brv].f32;
    m->buffers[b->bnt].i64 = &b->nbt;
}

static size_t conv_ws(const conv_t *c, int N)
{
    return ps_conv2d_workspace(&c->d, N, c->H, c->W);
}

int ps_resnet_build(ps_model_t *m)
{
    int r = define(m);
    if (r) return r;
    ps_arena_begin_sizing(&m->arena);
    layout(m, &m->arena);
    if (m->count_only) return 0; /* m->arena.used: the size it would take */
    if ((r = ps_arena_commit(&m->arena))) return r;
    layout(m, &m->arena);
    if (m->arena.used > m->arena.size) return PS_ENOMEM;

    resolve_conv(m, &m->conv1);
    ps_resnet_resolve_bn(m, &m->bn1);
    size_t ws = conv_ws(&m->conv1, (int)m->max_n);
    for (int bi = 0; bi < m->nblocks; bi++) {
        block_t *b = &m->blocks[bi];
        for (int j = 0; j < b->nconv; j++) {
            resolve_conv(m, &b->conv[j]);
            ps_resnet_resolve_bn(m, &b->bn[j]);
            ws = umax(ws, conv_ws(&b->conv[j], (int)m->max_n));
        }
        if (b->has_ds) {
            resolve_conv(m, &b->ds);
            ps_resnet_resolve_bn(m, &b->dsbn);
            ws = umax(ws, conv_ws(&b->ds, (int)m->max_n));
        }
    }
    return ps_ctx_reserve(m->ctx, ws);
}

/* ---- groups, specs, init ---------------------------------------------------- */

int ps_model_groups(const ps_model_t *m, ps_param_group_t *groups, int max)
{
    (void)m;
    if (max < PS_MODEL_NGROUPS) return PS_EINVAL;
    /* TSM's get_optim_policies(): weights decay; biases lr x2 no decay; BN
     * no decay; the new fc lr x5 (weight) and x10 (bias) */
    static const ps_param_group_t g[PS_MODEL_NGROUPS] = {
        {1.f, 1.f}, {2.f, 0.f}, {1.f, 0.f}, {5.f, 1.f}, {10.f, 0.f}};
    memcpy(groups, g, sizeof g);
    return PS_MODEL_NGROUPS;
}

int ps_model_tensor_specs(const ps_model_t *m, ps_tensor_spec_t **specs)
{
    return ps_mtab_tensor_specs(m->params, m->nparams, specs);
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++) p[i] = v;
}

/* u in [lo, lo+1) per element, from the hash */
static void fill_offset(float *p, size_t n, const char *name, uint64_t seed, double lo, double scale)
{
    uint64_t key = seed ^ ps_model_fnv1a64(name);
    for (size_t i = 0; i < n; i++) p[i] = (float)(lo + scale * (double)ps_rng_uniform(key, i));
}

void ps_resnet_init_fc(ps_model_t *m, uint64_t seed)
{
    if (m->fc_pw < 0) return;
    ps_model_param_t *w = &m->params[m->fc_pw], *b = &m->params[m->fc_pb];
    double bound = 1.0 / sqrt((double)m->feat_C); /* nn.Linear's default init */
    ps_model_hash_fill(w->w, w->numel, w->name, seed, bound);
    ps_model_hash_fill(b->w, b->numel, b->name, seed, bound);
}

void ps_model_init(ps_model_t *m, uint64_t seed, int random_bn)
{
    for (int i = 0; i < m->nparams; i++) {
        ps_model_param_t *p = &m->params[i];
        size_t len = strlen(p->name);
        if (i == m->fc_pw || i == m->fc_pb) continue;
        if (p->ndim >= 4) {
            /* kaiming_normal_(mode='fan_out', nonlinearity='relu'): std
             * sqrt(2/fan_out); a uniform with that std has bound sqrt(3)*std.
             * fan_out = K times the kernel's extent (R*S, or T*R*S in 3-D). */
            double fan_out = (double)p->shape[0];
            for (int d = 2; d < p->ndim; d++) fan_out *= p->shape[d];
            ps_model_hash_fill(p->w, p->numel, p->name, seed, sqrt(6.0 / fan_out));
        } else if (len > 7 && !strcmp(p->name + len - 7, ".weight")) {
            if (random_bn) fill_offset(p->w, p->numel, p->name, seed, 0.5, 1.0);
            else fill_const(p->w, p->numel,
                            p->residual_last && m->cfg.zero_init_residual ? 0.f : 1.f);
        } else {
            if (random_bn) ps_model_hash_fill(p->w, p->numel, p->name, seed, 0.25);
            else fill_const(p->w, p->numel, 0.f);
        }
    }
    ps_resnet_init_fc(m, seed);
    for (int i = 0; i < m->nbuffers; i++) {
        ps_model_buffer_t *b = &m->buffers[i];
        size_t len = strlen(b->name);
        if (b->i64) {
            *b->i64 = 0;
        } else if (len > 12 && !strcmp(b->name + len - 12, "running_mean")) {
            if (random_bn) ps_model_hash_fill(b->f32, b->numel, b->name, seed, 0.25);
            else fill_const(b->f32, b->numel, 0.f);
        } else {
            if (random_bn) fill_offset(b->f32, b->numel, b->name, seed, 0.5, 1.0);
            else fill_const(b->f32, b->numel, 1.f);
        }
    }
    ps_model_zero_grad(m);
}
