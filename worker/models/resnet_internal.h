/* Inside of ps_model_t, shared by resnet.c (forward/backward),
 * resnet_params.c (layout, names, groups, init) and model_io.c. */
#ifndef PS_RESNET_INTERNAL_H
#define PS_RESNET_INTERNAL_H
#include "ps_model.h"
#include "ps_safetensors.h"

typedef struct conv {
    ps_conv2d_desc_t d;
    int pw;            /* index of the weight in m->params */
    int H, W, P, Q;    /* input / output spatial size */
    float *w, *g;      /* resolved from the table */
} conv_t;

typedef struct bn {
    int C;
    int pg, pb;        /* gamma / beta indices in m->params */
    int brm, brv, bnt; /* running mean / var / count indices in m->buffers */
    float *gamma, *beta, *dgamma, *dbeta, *rm, *rv;
    int64_t nbt;
    float *save_mean, *save_rstd; /* (C) for the training backward */
    int batch_stats;   /* set by forward: 1 = used batch statistics */
    int first;         /* the first BN of the net (partial BN keeps it training) */
} bn_t;

/* A residual block: 2 convs (BasicBlock) or 3 (Bottleneck), optional
 * downsample (1x1 conv + BN) on the identity. */
/* block_t.shift: where the block shifts its input in time */
enum { SHIFT_NONE = 0, SHIFT_RES = 1, SHIFT_BLOCK = 2 };

typedef struct block {
    int nconv;
    int shift;          /* SHIFT_RES: the input of conv1 only ('blockres');
                           SHIFT_BLOCK: conv1 and the identity / downsample
                           ('block') */
    int cin, cout, H, W, P, Q;
    conv_t conv[3];
    bn_t bn[3];
    int has_ds;
    conv_t ds;
    bn_t dsbn;
    /* activations, per batch of max N images */
    float *xs;          /* shifted input (N, cin, H, W) when shift */
    float *co[3];       /* conv outputs = BN inputs */
    float *a[2];        /* relu(bn(co[j])) for j < nconv-1 */
    float *dso;         /* downsample conv output */
    float *y;           /* block output (N, cout, P, Q) */
    const float *x;     /* block input (previous y), set by forward */
} block_t;

/* What differs between the model families behind ps_model.h: the 2-D
 * ResNets (resnet.c) and the 3-D video models (video3d.c).  Everything
 * else -- the parameter and buffer tables, the arena, the head's buffers,
 * init, save, load, groups, hooks -- is the same code for both, on the
 * fields of struct ps_model below. */
typedef struct ps_model_family {
    const char *name;
    int (*forward)(ps_model_t *m, const float *input, int nclips, const int32_t *labels,
                   int training, float *loss);
    int (*backward)(ps_model_t *m);
    void (*flops)(const ps_model_t *m, int nclips, double *fwd, double *bwd);
    void (*free_impl)(ps_model_t *m); /* what the family allocated besides the tables */
} ps_model_family_t;
extern const ps_model_family_t ps_resnet_family;

struct ps_model {
    const ps_model_family_t *family;
    void *impl;            /* the family's own state (3-D models: video3d.c) */
    char arch_name[48];    /* "ps.arch" of saved files */
    int inflated;          /* tensors the last load inflated */
    int count_only;        /* tables and shapes only, no arena (ps_model_count) */
    ps_model_config_t cfg;
    const ps_backend_t *be;
    ps_ctx_t *ctx;
    int max_clips, H, W;
    size_t max_n;          /* max_clips * T */

    ps_model_param_t *params;
    int nparams, cap_params;
    ps_model_buffer_t *buffers;
    int nbuffers, cap_buffers;
    int fc_new;            /* fc in the new-fc groups */
    int bn_mode;           /* effective PS_MODEL_BN_* */
    int features_only;     /* backbone of a detector: no avgpool / fc / loss */
    int stage_end[4];      /* index of the last block of layer1..layer4 */
    int fc_replaced;

    ps_arena_t arena;

    /* stem */
    conv_t conv1;
    bn_t bn1;
    ps_pool_desc_t pool;
    int pool_P, pool_Q;
    float *input;          /* (N, 3, H, W) copy of the caller's input */
    float *c0, *a0, *p0;   /* conv1 out, relu(bn1), maxpool out */
    int32_t *argmax;       /* maxpool argmax (as floats' storage) */

    block_t *blocks;
    int nblocks;
    int feat_C, feat_HW;   /* layer4 output channels, spatial size */

    /* head */
    int fc_pw, fc_pb;
    float *feat, *featd;   /* avgpool out, after dropout (N, feat_C) */
    uint8_t *mask;         /* dropout mask (N*feat_C) */
    float *lframe;         /* per-frame logits (N, K) */
    float *logits, *probs; /* (B, K) */
    int32_t *labels;       /* (B) copy */
    float *dlogits, *dlframe, *dfeatd, *dfeat; /* head gradients */
    float *gbuf[4];        /* backward scratch, each max activation size */
    float *tmp;            /* forward scratch for the downsample BN output */
    /* cfg.recompute: one stage's block activations at a time (a region the
     * four stages' blocks share; each stage's output has a slot of its
     * own), and one slot for every BN + ReLU output (the stem's a0 and the
     * blocks' a[j]), recomputed from the conv output where the backward
     * needs it */
    float *ascr;
    size_t max_act;        /* floats of the largest activation */

    uint64_t seed, step;
    /* ps_model_set_hooks (NULL: none) */
    ps_model_hook_fn grad_ready, weights_needed;
    void *hook_ctx;
    int last_nclips, last_training, last_has_labels, last_dropout;
};

/* Backbone use (RetinaNet, retinanet.c): the same network without the
 * head (no fc.* tensors), N images (n_segment forced to 1, no shift), and
 * the outputs of the four stages.  bn_mode from cfg as usual (the detector
 * uses FROZEN). */
int ps_resnet_create_features(ps_model_t **out, const ps_model_config_t *cfg,
                              const ps_backend_t *be, ps_ctx_t *ctx, int max_n, int H, int W);
/* Stem + every block over N images; input (N,3,H,W) copied in. */
void ps_resnet_forward_features(ps_model_t *m, const float *input, int N, int training);
/* Output of stage s (0..3 = layer1..layer4): (N, *C, *P, *Q). */
const float *ps_resnet_stage_out(const ps_model_t *m, int s, int *C, int *P, int *Q);
/* Backward of the last ps_resnet_forward_features: dstage[s] is the
 * gradient reaching stage s's output from outside (NULL = none; dstage[3]
 * must be given).  freeze_at (ps_retina_config_t): 0 runs down through the
 * stem; 1 stops above the stem; k stops above stage k-2 (layer(k-1)): the
 * frozen part gets no backward.  Parameter gradients accumulate. */
void ps_resnet_backward_features(ps_model_t *m, const float *const dstage[4], int N,
                                 int freeze_at);

/* onnx_resnet.c: stem and blocks of m into graph g from the value x (N
 * images), tensor names prefixed with prefix ("backbone.body." in a
 * detector); the values of the four stages' outputs into stage_out (may be
 * NULL).  Returns the last block's output (NULL after a graph error). */
struct ps_onnx;
const char *ps_resnet_onnx_trunk(struct ps_onnx *g, const ps_model_t *m, const char *prefix,
                                 const char *x, const char *stage_out[4]);
/* resnet.c: the 2-D ResNet (cfg->arch ""); model.c picks it */
int ps_resnet_create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                     ps_ctx_t *ctx, int max_clips, int H, int W, int count_only);
/* count_only with the arena sized (not allocated) for act_bytes-byte
 * activations: m->arena.used is its size */
int ps_resnet_create_sized(ps_model_t **out, const ps_model_config_t *cfg, int max_clips,
                           int H, int W, size_t act_bytes, int features_only);
/* video3d.c: a 3-D video model (cfg->arch names it) */
int ps_v3d_create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                  ps_ctx_t *ctx, int max_clips, int H, int W, int count_only);

/* resnet.c: one BN forward / backward in the model's BN mode (batch or
 * running statistics, frozen affine), shared with the 3-D models */
void ps_resnet_bn_fwd(ps_model_t *m, bn_t *b, float *out, const float *in, int N, int HW,
                      int training);
void ps_resnet_bn_bwd(ps_model_t *m, bn_t *b, float *din, const float *dout, const float *in,
                      int N, int HW);
/* BN then ReLU (out = relu(bn(in))) and its backward (dout, the gradient
 * w.r.t. out, is clobbered; din w.r.t. in): the backend's fused entries
 * when the BN uses running statistics and the backend has them */
void ps_resnet_bn_relu_fwd(ps_model_t *m, bn_t *b, float *out, const float *in, int N, int HW,
                           int training);
void ps_resnet_bn_relu_bwd(ps_model_t *m, bn_t *b, float *din, float *dout, const float *out,
                           const float *in, int N, int HW);

/* resnet_params.c */
int ps_resnet_build(ps_model_t *m); /* architecture + tables + arena */
/* A BN's five tensors under name (name.weight ... name.num_batches_tracked),
 * trainable per the model's BN mode; its saved statistics from the arena;
 * its pointers resolved after the arena is committed. */
int ps_resnet_def_bn(ps_model_t *m, bn_t *b, const char *name, int C, int first);
void ps_resnet_take_bn(ps_arena_t *a, bn_t *b);
/* The head's buffers from the arena: pooled features, dropout mask and
 * their gradients for `rows` rows (frames of a 2-D model, clips of a 3-D
 * one), logits, probabilities and labels for max_clips clips. */
void ps_resnet_take_head(ps_arena_t *a, ps_model_t *m, size_t rows);
void ps_resnet_resolve_bn(ps_model_t *m, bn_t *b);
void ps_resnet_free_tables(ps_model_t *m);
void ps_resnet_init_fc(ps_model_t *m, uint64_t seed);

/* model_tables.c: the parameter / buffer tables of every model (ResNet,
 * RetinaNet).  add_param returns the new index or PS_ENOMEM; "what" names
 * the model in log lines ("model", "retinanet"). */
int ps_mtab_add_param(ps_model_param_t **params, int *n, int *cap, const char *name, int ndim,
                      const int *shape, int group, int trainable);
void ps_mtab_free(ps_model_param_t **params, int *np, ps_model_buffer_t **buffers, int *nb);
int ps_mtab_find(const ps_model_param_t *params, int n, const char *name);
void ps_mtab_zero_grad(ps_model_param_t *params, int n);
int ps_mtab_tensor_specs(const ps_model_param_t *params, int n, ps_tensor_spec_t **specs);
/* The tables' memory from arena a (pass 1 sizes, pass 2 hands out):
 * every weight, then every gradient, each in model order (the trainable
 * part of a model is then nearly one flat vector for the optimizer), then
 * the float buffers. */
void ps_mtab_take(ps_arena_t *a, ps_model_param_t *params, int np, ps_model_buffer_t *buffers,
                  int nb);
/* The detectors' copy of a backbone's tables (RetinaNet, R-CNN): every
 * parameter and buffer of body under prefix + its name (pointing into the
 * body's arena), trainable unless frozen by freeze_at (ps_mtab_frozen);
 * *buffers allocated here.  0 or PS_ENOMEM. */
int ps_mtab_add_backbone(ps_model_param_t **params, int *np, int *cap,
                         ps_model_buffer_t **buffers, int *nb, const ps_model_t *body,
                         const char *prefix, int freeze_at);
/* A detector's per-layer hooks (ps_model_set_hooks' contract over the
 * detector's table).  The backbone's rows come first (ps_mtab_add_backbone
 * on an empty table), so its hook indices are the detector's as they are:
 * ps_mhooks_set hands the same hooks to the backbone, which fires them for
 * its stem and blocks; the detector fires its own groups (a group: the
 * rows [first, first + n) of one neck or head, recorded at define time)
 * with need (before the group's forward reads it) and ready (once its
 * backward is queued). */
typedef struct ps_mhooks {
    ps_model_hook_fn grad_ready, weights_needed;
    void *ctx;
} ps_mhooks_t;
typedef struct ps_mgroup {
    int first, n;
} ps_mgroup_t;
void ps_mhooks_set(ps_mhooks_t *h, ps_model_t *body, ps_model_hook_fn grad_ready,
                   ps_model_hook_fn weights_needed, void *ctx);
void ps_mhooks_need(const ps_mhooks_t *h, ps_mgroup_t g);
void ps_mhooks_ready(const ps_mhooks_t *h, ps_mgroup_t g);
/* *h for a model's tables and its set_hooks (ps_model_hookable_t). */
void ps_mtab_hookable(ps_model_hookable_t *h, ps_model_param_t *params, int np,
                      ps_model_buffer_t *buffers, int nb, void *model,
                      void (*set_hooks)(void *model, ps_model_hook_fn grad_ready,
                                        ps_model_hook_fn weights_needed, void *ctx));
/* The rows added since first (np now): the group a define call wrote. */
static inline ps_mgroup_t ps_mgroup_since(int first, int np)
{
    return (ps_mgroup_t){first, np - first};
}

/* torchvision's trainable_layers for a backbone tensor name: freeze_at 1
 * freezes the stem (conv1, bn1), k >= 2 also layer1..layer(k-1). */
int ps_mtab_frozen(const char *name, int freeze_at);
/* Every parameter (F32) and buffer (F32, num_batches_tracked as 0-dim I64)
 * with metadata format=pt, ps.arch=arch. */
int ps_mtab_save(const ps_model_param_t *params, int np, const ps_model_buffer_t *buffers,
                 int nb, const char *arch, const char *what, const char *path);
/* Pass 2 of a load, after validation: the buffers' values (an absent
 * int64 counter reads as 0). */
int ps_mtab_read_buffers(const ps_st_file_t *f, ps_model_buffer_t *buffers, int nb,
                         const char *what, const char *path);

/* model_conv.c: a convolution with bias in a detector's neck or heads
 * (RetinaNet's FPN and subnets, the R-CNN FPN and RPN), its weight and
 * bias rows of a parameter table.  define: square kernel R, padding R/2,
 * names "<name>.weight" / "<name>.bias" in the weight / bias groups;
 * returns 0 or PS_ENOMEM.  resolve: the pointers, once the arena is laid
 * out.  forward / backward: the backend's conv2d with the layer's tensors
 * (backward accumulates gw, gb; din may be NULL).  init: weight uniform in
 * +-bound from the counter hash, bias (2u-1) * 0.1 when random else 0,
 * plus bias0; gradients untouched. */
typedef struct rconv {
    ps_conv2d_desc_t d;
    int pw, pb;               /* weight / bias indices in the table */
    float *w, *b, *gw, *gb;   /* resolved from the table */
} rconv_t;
int ps_rconv_define(rconv_t *c, ps_model_param_t **params, int *np, int *cap, const char *name,
                    int C, int K, int R, int stride);
void ps_rconv_resolve(rconv_t *c, const ps_model_param_t *params);
void ps_rconv_forward(const ps_backend_t *be, ps_ctx_t *ctx, const rconv_t *c, float *out,
                      const float *in, int N, int H, int W);
void ps_rconv_backward(const ps_backend_t *be, ps_ctx_t *ctx, const rconv_t *c, float *din,
                       const float *dout, const float *in, int N, int H, int W);
double ps_rconv_flops(const rconv_t *c, int N, int H, int W);
size_t ps_rconv_workspace(const rconv_t *c, int N, int H, int W);
void ps_rconv_init(const rconv_t *c, ps_model_param_t *params, uint64_t seed, double bound,
                   int random, float bias0);
/* fan-in of the conv's weight (C * R * S): the scale of its init bounds */
double ps_rconv_fan_in(const rconv_t *c);

#endif
