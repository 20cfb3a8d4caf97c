/* Inside of a 3-D video model (m->impl of a ps_model_t of the video3d
 * family), shared by video3d_arch.c (architectures, names, arena layout)
 * and video3d.c (forward, backward).
 *
 * Legend: B clips, T x H x W a layer's input (frames, height, width),
 * O x P x Q its output; every activation is (B, C, T, H, W), NCDHW. */
#ifndef PS_VIDEO3D_INTERNAL_H
#define PS_VIDEO3D_INTERNAL_H
#include "ps_video3d.h"
#include "resnet_internal.h"

/* One convolution with its BN (and a ReLU after it when relu). */
typedef struct v3conv {
    ps_conv3d_desc_t d;
    int pw;             /* index of the weight in m->params */
    int T, H, W;        /* input */
    int O, P, Q;        /* output */
    float *w, *g;
    bn_t bn;            /* resnet_internal.h's, over HW = O*P*Q */
    int relu;           /* ReLU after the BN (every unit but a block's last) */
    float *co;          /* conv output = BN input (B, K, O, P, Q) */
    float *a;           /* BN (+ReLU) output; a block's last unit writes the block's y */
} v3conv_t;

/* A residual block: a chain of 2 to 4 units (BasicBlock: 2; R(2+1)D's
 * BasicBlock: 4, each (2+1)D conv being two units; Bottleneck: 3), the
 * last one's BN added to the identity (or the downsample unit), then ReLU. */
typedef struct v3block {
    int nunit;
    v3conv_t u[4];
    int has_ds;
    v3conv_t ds;
    int cin, cout;
    const float *x;     /* input, set by forward */
    float *y;           /* output (B, cout, O, P, Q) */
    float *dso;         /* downsample BN output */
} v3block_t;

/* A max pool between stages (I3D's pool1 after the stem, pool2 after layer1). */
typedef struct v3pool {
    int on;
    ps_pool3d_desc_t d;
    int C, T, H, W, O, P, Q;
    float *y;
    int32_t *argmax;
} v3pool_t;

typedef struct v3d {
    const ps_v3d_arch_t *arch;
    int nstem;
    v3conv_t stem[2];   /* conv + BN + ReLU each */
    v3pool_t pool1;     /* after the stem */
    v3block_t *blocks;
    int nblocks, cap_blocks;
    int stage_end[4];   /* index of the last block of layer1..layer4 */
    v3pool_t pool2;     /* after layer1 */
    float *input;       /* (B, 3, T, H, W) */
    float *gbuf[4];     /* backward scratch, each the largest activation */
    size_t max_act;     /* floats of the largest activation */
} v3d_t;

static inline v3d_t *v3d_of(const ps_model_t *m) { return (v3d_t *)m->impl; }

/* video3d_arch.c: the architecture, tables and arena of m (m->cfg, m->impl
 * with its arch set); 0 or PS_E* (logged). */
int ps_v3d_build(ps_model_t *m);

/* video3d_arch.c, for the builders: a unit with its parameters (conv
 * weight "<name>.weight" unless wname is given, BN under bname), on input
 * (T, H, W); kernel (kt, k, k), stride (st, s, s), padding (pt, p, p). */
int ps_v3d_unit(ps_model_t *m, v3conv_t *u, const char *wname, const char *bname, int C, int K,
                int kt, int k, int st, int s, int pt, int p, int T, int H, int W, int relu,
                int first);
/* A new block at the end of v->blocks (NULL: PS_ENOMEM). */
v3block_t *ps_v3d_new_block(v3d_t *v);
/* A max pool on (C, T, H, W) with window (kt, k, k), stride (st, s, s),
 * padding (pt, p, p). */
void ps_v3d_pool(v3pool_t *pl, int C, int T, int H, int W, int kt, int k, int st, int s, int pt,
                 int p);
/* The head (fc over C features) after the last stage. */
int ps_v3d_head(ps_model_t *m, int C, int O, int P, int Q);

#endif
