/* The 3-D video models' architectures (the rows of ps_v3d_archs()), their
 * parameter and buffer tables under PyTorch's names, and the arena layout.
 *
 * torchvision 0.14's video ResNets (torchvision/models/video/resnet.py):
 *   stem: Conv3d(3, 64, (3,7,7), stride (1,2,2), pad (1,3,3)) + BN + ReLU
 *         (R(2+1)D: (1,7,7) to 45 channels, BN, ReLU, (3,1,1) to 64, BN, ReLU);
 *   layer1..4: two BasicBlocks each, planes 64 << s, stride 2 from layer2 on
 *         (on T as well for Conv3DSimple / Conv2Plus1D, H and W only for
 *         Conv3DNoTemporal, also in the downsample's stride);
 *         Conv2Plus1D's middle width (inplanes*planes*27) / (inplanes*9 +
 *         3*planes), from the block's inplanes and planes, for both its convs;
 *   global average pool over T x H x W, fc.
 *
 * I3D-ResNet-50 (the Non-local networks' I3D, video-nonlocal-net
 * resnet_video.py, arch 2; torchvision ResNet-50 names so ImageNet weights
 * inflate into it):
 *   conv1 (5,7,7) stride (1,2,2) pad (2,3,3) + BN + ReLU; max pool (1,3,3)
 *   stride (1,2,2) pad (0,1,1);
 *   layer1 (3 bottlenecks), max pool (2,1,1) stride (2,1,1), layer2 (4),
 *   layer3 (6), layer4 (3); the spatial stride on the 3x3 conv (torchvision's
 *   v1.5), temporal stride 1 everywhere;
 *   inflated blocks (a temporal kernel of 3): every block of layer1, every
 *   second one of layer2 and layer3 starting with the first, the middle one
 *   of layer4; 3x1x1 on the first 1x1 conv (i3d-r50-311) or 3x3x3 on the
 *   3x3 conv (i3d-r50-333); every other kernel is 1 in T;
 *   global average pool over T x H x W, dropout, fc. */
#include "video3d_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building blocks ---------------------------------------------------------- */

int ps_v3d_unit(ps_model_t *m, v3conv_t *u, const char *wname, const char *bname, int C, int K,
                int kt, int k, int st, int s, int pt, int p, int T, int H, int W, int relu,
                int first)
{
    memset(u, 0, sizeof *u);
    if (T + 2 * pt < kt || H + 2 * p < k || W + 2 * p < k) {
        ps_error("model %s: %s's input %dx%dx%d is smaller than its kernel %dx%dx%d (a larger "
                 "clip or frame size is needed)", m->arch_name, wname, T, H, W, kt, k, k);
        return PS_EINVAL;
    }
    u->d = (ps_conv3d_desc_t){.C = C, .K = K, .KT = kt, .R = k, .S = k, .stride_t = st,
                              .stride_h = s, .stride_w = s, .pad_t = pt, .pad_h = p,
                              .pad_w = p, .dil_t = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    u->T = T, u->H = H, u->W = W;
    u->O = ps_conv_out(T, kt, st, pt, 1);
    u->P = ps_conv_out(H, k, s, p, 1);
    u->Q = ps_conv_out(W, k, s, p, 1);
    u->relu = relu;
    const int shape[5] = {K, C, kt, k, k};
    u->pw = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, wname, 5, shape,
                              PS_MODEL_GROUP_WEIGHT, 1);
    if (u->pw < 0) return u->pw;
    return ps_resnet_def_bn(m, &u->bn, bname, K, first);
}

v3block_t *ps_v3d_new_block(v3d_t *v)
{
    if (v->nblocks == v->cap_blocks) {
        int cap = v->cap_blocks ? 2 * v->cap_blocks : 16;
        v3block_t *b = realloc(v->blocks, (size_t)cap * sizeof *b);
        if (!b) return NULL;
        v->blocks = b;
        v->cap_blocks = cap;
    }
    v3block_t *b = &v->blocks[v->nblocks++];
    memset(b, 0, sizeof *b);
    return b;
}

void ps_v3d_pool(v3pool_t *pl, int C, int T, int H, int W, int kt, int k, int st, int s, int pt,
                 int p)
{
    memset(pl, 0, sizeof *pl);
    pl->on = 1;
    pl->d = (ps_pool3d_desc_t){.KT = kt, .R = k, .S = k, .stride_t = st, .stride_h = s,
                               .stride_w = s, .pad_t = pt, .pad_h = p, .pad_w = p,
                               .count_include_pad = 1};
    pl->C = C, pl->T = T, pl->H = H, pl->W = W;
    pl->O = ps_conv_out(T, kt, st, pt, 1);
    pl->P = ps_conv_out(H, k, s, p, 1);
    pl->Q = ps_conv_out(W, k, s, p, 1);
}

static int pool_fits(const ps_model_t *m, const v3pool_t *pl, const char *what)
{
    if (pl->T + 2 * pl->d.pad_t >= pl->d.KT && pl->H + 2 * pl->d.pad_h >= pl->d.R) return 0;
    ps_error("model %s: %s's input %dx%dx%d is smaller than its window (a larger clip or frame "
             "size is needed)", m->arch_name, what, pl->T, pl->H, pl->W);
    return PS_EINVAL;
}

int ps_v3d_head(ps_model_t *m, int C, int O, int P, int Q)
{
    const v3d_t *v = v3d_of(m);
    for (int i = 0; i < v->nblocks; i++) {
        const v3block_t *b = &v->blocks[i];
        m->params[b->u[b->nunit - 1].bn.pg].residual_last = 1;
    }
    m->feat_C = C;
    m->feat_HW = O * P * Q;
    int K = m->cfg.num_classes, fcw[2] = {K, C};
    m->fc_new = m->cfg.fc_lr5;
    m->fc_pw = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, "fc.weight", 2, fcw,
                                 m->fc_new ? PS_MODEL_GROUP_NEWFC_WEIGHT : PS_MODEL_GROUP_WEIGHT,
                                 1);
    if (m->fc_pw < 0) return m->fc_pw;
    m->fc_pb = ps_mtab_add_param(&m->params, &m->nparams, &m->cap_params, "fc.bias", 1, &K,
                                 m->fc_new ? PS_MODEL_GROUP_NEWFC_BIAS : PS_MODEL_GROUP_BIAS, 1);
    return m->fc_pb < 0 ? m->fc_pb : 0;
}

/* ---- torchvision's video ResNets --------------------------------------------- */

#define NAME(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

/* One (2+1)D or 3-D conv of a BasicBlock as its units (returns the count):
 * conv index j (1 or 2) of block i of stage s, cin -> planes, stride st. */
static int video_conv(ps_model_t *m, v3block_t *b, int kind, int s, int i, int j, int cin,
                      int planes, int mid, int st, int *T, int *H, int *W, int *r)
{
    char wn[96], bn[96];
    v3conv_t *u = &b->u[b->nunit];
    const int relu = j == 1; /* conv1's BN is followed by ReLU, conv2's by the sum */
    if (kind == PS_V3D_CONV_2PLUS1) {
        NAME(wn, "layer%d.%d.conv%d.0.0.weight", s + 1, i, j);
        NAME(bn, "layer%d.%d.conv%d.0.1", s + 1, i, j);
        if ((*r = ps_v3d_unit(m, u, wn, bn, cin, mid, 1, 3, 1, st, 0, 1, *T, *H, *W, 1, 0)))
            return 0;
        NAME(wn, "layer%d.%d.conv%d.0.3.weight", s + 1, i, j);
        NAME(bn, "layer%d.%d.conv%d.1", s + 1, i, j);
        if ((*r = ps_v3d_unit(m, u + 1, wn, bn, mid, planes, 3, 1, st, 1, 1, 0, u->O, u->P, u->Q,
                              relu, 0)))
            return 0;
        u++;
    } else {
        NAME(wn, "layer%d.%d.conv%d.0.weight", s + 1, i, j);
        NAME(bn, "layer%d.%d.conv%d.1", s + 1, i, j);
        const int temporal = kind == PS_V3D_CONV_3D;
        if ((*r = ps_v3d_unit(m, u, wn, bn, cin, planes, temporal ? 3 : 1, 3, temporal ? st : 1,
                              st, temporal ? 1 : 0, 1, *T, *H, *W, relu, 0)))
            return 0;
    }
    *T = u->O, *H = u->P, *W = u->Q;
    return kind == PS_V3D_CONV_2PLUS1 ? 2 : 1;
}

static int define_video_resnet(ps_model_t *m, const ps_v3d_arch_t *a)
{
    v3d_t *v = v3d_of(m);
    const int w = m->cfg.width;
    int T = m->cfg.n_segment, H = m->H, W = m->W, r;
    if (!a->stem_2plus1) {
        v->nstem = 1;
        if ((r = ps_v3d_unit(m, &v->stem[0], "stem.0.weight", "stem.1", 3, w, 3, 7, 1, 2, 1, 3, T,
                             H, W, 1, 1)))
            return r;
    } else {
        const int mid = 45 * w / 64 > 0 ? 45 * w / 64 : 1; /* torchvision: 45 for 64 */
        v->nstem = 2;
        if ((r = ps_v3d_unit(m, &v->stem[0], "stem.0.weight", "stem.1", 3, mid, 1, 7, 1, 2, 0, 3,
                             T, H, W, 1, 1)))
            return r;
        const v3conv_t *u = &v->stem[0];
        if ((r = ps_v3d_unit(m, &v->stem[1], "stem.3.weight", "stem.4", mid, w, 3, 1, 1, 1, 1, 0,
                             u->O, u->P, u->Q, 1, 0)))
            return r;
    }
    const v3conv_t *last = &v->stem[v->nstem - 1];
    T = last->O, H = last->P, W = last->Q;
    int inplanes = w;
    char wn[96], bn[96];
    for (int s = 0; s < 4; s++) {
        const int planes = w << s, stride = s == 0 ? 1 : 2, kind = a->stage_conv[s];
        for (int i = 0; i < 2; i++) {
            v3block_t *b = ps_v3d_new_block(v);
            if (!b) return PS_ENOMEM;
            const int st = i == 0 ? stride : 1, T0 = T, H0 = H, W0 = W;
            const int mid = inplanes * planes * 27 / (inplanes * 9 + 3 * planes);
            b->cin = inplanes, b->cout = planes;
            for (int j = 1; j <= 2; j++) {
                int n = video_conv(m, b, kind, s, i, j, j == 1 ? inplanes : planes, planes, mid,
                                   j == 1 ? st : 1, &T, &H, &W, &r);
                if (!n) return r;
                b->nunit += n;
            }
            if (st != 1 || inplanes != planes) {
                b->has_ds = 1;
                const int dst = kind == PS_V3D_CONV_2D ? 1 : st;
                NAME(wn, "layer%d.%d.downsample.0.weight", s + 1, i);
                NAME(bn, "layer%d.%d.downsample.1", s + 1, i);
                if ((r = ps_v3d_unit(m, &b->ds, wn, bn, inplanes, planes, 1, 1, dst, st, 0, 0, T0,
                                     H0, W0, 0, 0)))
                    return r;
            }
            inplanes = planes;
        }
        v->stage_end[s] = v->nblocks - 1;
    }
    return ps_v3d_head(m, inplanes, T, H, W);
}

/* ---- I3D-ResNet-50 ------------------------------------------------------------- */

static int define_i3d(ps_model_t *m, const ps_v3d_arch_t *a)
{
    /* which blocks have a temporal kernel (Non-local's use_temp_convs) */
    static const int nblk[4] = {3, 4, 6, 3};
    static const int inflate[4][6] = {
        {1, 1, 1}, {1, 0, 1, 0}, {1, 0, 1, 0, 1, 0}, {0, 1, 0}};
    v3d_t *v = v3d_of(m);
    const int w = m->cfg.width;
    int r;
    v->nstem = 1;
    if ((r = ps_v3d_unit(m, &v->stem[0], "conv1.weight", "bn1", 3, w, 5, 7, 1, 2, 2, 3,
                         m->cfg.n_segment, m->H, m->W, 1, 1)))
        return r;
    const v3conv_t *st0 = &v->stem[0];
    ps_v3d_pool(&v->pool1, w, st0->O, st0->P, st0->Q, 1, 3, 1, 2, 0, 1);
    if ((r = pool_fits(m, &v->pool1, "pool1"))) return r;
    int T = v->pool1.O, H = v->pool1.P, W = v->pool1.Q, inplanes = w;
    char wn[96], bn[96];
    for (int s = 0; s < 4; s++) {
        const int planes = w << s, stride = s == 0 ? 1 : 2;
        for (int i = 0; i < nblk[s]; i++) {
            v3block_t *b = ps_v3d_new_block(v);
            if (!b) return PS_ENOMEM;
            const int st = i == 0 ? stride : 1, infl = inflate[s][i];
            const int t1 = infl && a->i3d_kernel == 311, t2 = infl && a->i3d_kernel == 333;
            b->cin = inplanes, b->cout = planes * 4, b->nunit = 3;
            NAME(wn, "layer%d.%d.conv1.weight", s + 1, i);
            NAME(bn, "layer%d.%d.bn1", s + 1, i);
            if ((r = ps_v3d_unit(m, &b->u[0], wn, bn, inplanes, planes, t1 ? 3 : 1, 1, 1, 1,
                                 t1 ? 1 : 0, 0, T, H, W, 1, 0)))
                return r;
            NAME(wn, "layer%d.%d.conv2.weight", s + 1, i);
            NAME(bn, "layer%d.%d.bn2", s + 1, i);
            if ((r = ps_v3d_unit(m, &b->u[1], wn, bn, planes, planes, t2 ? 3 : 1, 3, 1, st,
                                 t2 ? 1 : 0, 1, b->u[0].O, b->u[0].P, b->u[0].Q, 1, 0)))
                return r;
            NAME(wn, "layer%d.%d.conv3.weight", s + 1, i);
            NAME(bn, "layer%d.%d.bn3", s + 1, i);
            if ((r = ps_v3d_unit(m, &b->u[2], wn, bn, planes, planes * 4, 1, 1, 1, 1, 0, 0,
                                 b->u[1].O, b->u[1].P, b->u[1].Q, 0, 0)))
                return r;
            if (st != 1 || inplanes != planes * 4) {
                b->has_ds = 1;
                NAME(wn, "layer%d.%d.downsample.0.weight", s + 1, i);
                NAME(bn, "layer%d.%d.downsample.1", s + 1, i);
                if ((r = ps_v3d_unit(m, &b->ds, wn, bn, inplanes, planes * 4, 1, 1, 1, st, 0, 0,
                                     T, H, W, 0, 0)))
                    return r;
            }
            T = b->u[2].O, H = b->u[2].P, W = b->u[2].Q, inplanes = planes * 4;
        }
        v->stage_end[s] = v->nblocks - 1;
        if (s == 0) {
            ps_v3d_pool(&v->pool2, inplanes, T, H, W, 2, 1, 2, 1, 0, 0);
            if ((r = pool_fits(m, &v->pool2, "pool2"))) return r;
            T = v->pool2.O, H = v->pool2.P, W = v->pool2.Q;
        }
    }
    return ps_v3d_head(m, inplanes, T, H, W);
}

/* ---- the rows -------------------------------------------------------------------- */

static const ps_v3d_arch_t archs[] = {
    {.name = "r3d-18", .what = "ResNet3D-18 (3x3x3 everywhere)",
     .torch = "torchvision.models.video.r3d_18", .clip_frames = 16, .clip_stride = 2,
     .define = define_video_resnet,
     .stage_conv = {PS_V3D_CONV_3D, PS_V3D_CONV_3D, PS_V3D_CONV_3D, PS_V3D_CONV_3D}},
    {.name = "mc3-18", .what = "MC3-18 (3x3x3 in layer1, 1x3x3 above)",
     .torch = "torchvision.models.video.mc3_18", .clip_frames = 16, .clip_stride = 2,
     .define = define_video_resnet,
     .stage_conv = {PS_V3D_CONV_3D, PS_V3D_CONV_2D, PS_V3D_CONV_2D, PS_V3D_CONV_2D}},
    {.name = "r2plus1d-18", .what = "R(2+1)D-18 (1x3x3 then 3x1x1 everywhere)",
     .torch = "torchvision.models.video.r2plus1d_18", .clip_frames = 16, .clip_stride = 2,
     .define = define_video_resnet, .stem_2plus1 = 1,
     .stage_conv = {PS_V3D_CONV_2PLUS1, PS_V3D_CONV_2PLUS1, PS_V3D_CONV_2PLUS1,
                    PS_V3D_CONV_2PLUS1}},
    {.name = "i3d-r50-333", .what = "I3D-ResNet-50, 3x3x3 temporal kernels",
     .torch = "torchvision.models.resnet50 tree, Conv3d / BatchNorm3d (inflated)",
     .clip_frames = 32, .clip_stride = 2, .define = define_i3d, .i3d_kernel = 333},
    {.name = "i3d-r50-311", .what = "I3D-ResNet-50, 3x1x1 temporal kernels",
     .torch = "torchvision.models.resnet50 tree, Conv3d / BatchNorm3d (inflated)",
     .clip_frames = 32, .clip_stride = 2, .define = define_i3d, .i3d_kernel = 311},
};

const ps_v3d_arch_t *ps_v3d_archs(int *n)
{
    if (n) *n = (int)(sizeof archs / sizeof archs[0]);
    return archs;
}

const ps_v3d_arch_t *ps_v3d_arch_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].name, name)) return &archs[i];
    return NULL;
}

/* ---- arena ----------------------------------------------------------------------- */

#define TAKE(ptr, n) ((ptr) = (void *)ps_arena_take(a, (n)))

static size_t umax(size_t x, size_t y) { return x > y ? x : y; }
static size_t unit_out(const v3conv_t *u) { return (size_t)u->d.K * u->O * u->P * u->Q; }
static size_t unit_in(const v3conv_t *u) { return (size_t)u->d.C * u->T * u->H * u->W; }

static void take_unit(ps_arena_t *a, v3conv_t *u, size_t B, int own_out, size_t *mx)
{
    TAKE(u->co, B * unit_out(u));
    if (own_out) TAKE(u->a, B * unit_out(u));
    ps_resnet_take_bn(a, &u->bn);
    *mx = umax(umax(*mx, unit_out(u)), unit_in(u));
}

static void take_pool(ps_arena_t *a, v3pool_t *pl, size_t B, size_t *mx)
{
    if (!pl->on) return;
    size_t n = (size_t)pl->C * pl->O * pl->P * pl->Q;
    TAKE(pl->y, B * n);
    TAKE(pl->argmax, B * n); /* int32 has the size of a float */
    *mx = umax(*mx, n);
}

/* Hand out every pointer; once while sizing and once for real (ps_arena_t). */
static void layout(ps_model_t *m, ps_arena_t *a)
{
    v3d_t *v = v3d_of(m);
    const size_t B = (size_t)m->max_clips;
    ps_mtab_take(a, m->params, m->nparams, m->buffers, m->nbuffers);
    TAKE(v->input, B * 3 * (size_t)m->cfg.n_segment * m->H * m->W);
    size_t mx = 0;
    for (int i = 0; i < v->nstem; i++) take_unit(a, &v->stem[i], B, 1, &mx);
    take_pool(a, &v->pool1, B, &mx);
    for (int bi = 0; bi < v->nblocks; bi++) {
        v3block_t *b = &v->blocks[bi];
        for (int j = 0; j < b->nunit; j++) take_unit(a, &b->u[j], B, j < b->nunit - 1, &mx);
        if (b->has_ds) {
            take_unit(a, &b->ds, B, 0, &mx);
            TAKE(b->dso, B * unit_out(&b->ds));
        }
        TAKE(b->y, B * unit_out(&b->u[b->nunit - 1]));
        if (bi == v->stage_end[0]) take_pool(a, &v->pool2, B, &mx);
    }
    v->max_act = mx;
    for (int i = 0; i < 4; i++) TAKE(v->gbuf[i], B * mx);
    ps_resnet_take_head(a, m, B); /* one feature row per clip */
}

static size_t resolve_unit(ps_model_t *m, v3conv_t *u)
{
    u->w = m->params[u->pw].w;
    u->g = m->params[u->pw].g;
    ps_resnet_resolve_bn(m, &u->bn);
    return ps_conv3d_workspace(&u->d, m->max_clips, u->T, u->H, u->W);
}

int ps_v3d_build(ps_model_t *m)
{
    v3d_t *v = v3d_of(m);
    int r = v->arch->define(m, v->arch);
    if (r || m->count_only) return r;
    ps_arena_begin_sizing(&m->arena);
    layout(m, &m->arena);
    if ((r = ps_arena_commit(&m->arena))) return r;
    layout(m, &m->arena);
    if (m->arena.used > m->arena.size) return PS_ENOMEM;
    size_t ws = 0;
    for (int i = 0; i < v->nstem; i++) ws = umax(ws, resolve_unit(m, &v->stem[i]));
    for (int bi = 0; bi < v->nblocks; bi++) {
        v3block_t *b = &v->blocks[bi];
        for (int j = 0; j < b->nunit; j++) ws = umax(ws, resolve_unit(m, &b->u[j]));
        if (b->has_ds) ws = umax(ws, resolve_unit(m, &b->ds));
    }
    return ps_ctx_reserve(m->ctx, ws);
}
