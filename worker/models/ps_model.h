/* The worker's video models: ResNet-18/34/50 in torchvision's v1.5 layout
 * (stride on the 3x3 conv of the bottleneck), as TSM (residual temporal
 * shift, 'blockres') or as the TSN baseline (no shift), with TSM's head:
 * dropout -> fc on every frame -> mean over the T segments.
 *
 * Every layer runs through a `const ps_backend_t *` (worker/engine/
 * ps_engine.h), so the CUDA backend slots in without a line changing here.
 * Parameters, gradients, BN statistics and activations live in ONE arena
 * allocation per model; the tables below point into it.
 *
 * Legend: B clips, T = n_segment frames per clip, N = B*T images (frame-
 * major within a clip: image b*T + t), 3 x H x W input, K classes.
 *
 * Names are exactly torchvision's (conv1.weight, bn1.running_mean,
 * layer2.0.downsample.0.weight, fc.bias, ...), so a checkpoint written by
 * ps_model_save() loads into torchvision.models.resnetXX(num_classes=K) with
 * load_state_dict(strict=True), and a torchvision state dict converted to
 * safetensors loads here.
 *
 * Host access: the model touches its arena from the host (input copy,
 * init, load/save, zero_grad, the tables' w/g, logits).  With an
 * asynchronous backend (CUDA, managed arena: ps_cuda_use_managed_arena())
 * the caller syncs the backend (ps_cuda_backend_sync) before any of these
 * and before ps_model_forward overwrites the input the previous backward
 * may still read.  The CPU backend is synchronous.
 *
 * Deterministic initialisation (tests and goldens): element i of tensor
 * `name` draws u = ps_rng_uniform(seed ^ fnv1a64(name), i) (ps_engine.h) and
 * becomes (2u-1)*a computed in double and rounded to float, with a chosen so
 * the variance matches torchvision's init (conv: Kaiming normal, fan_out,
 * relu; fc: U(-1/sqrt(fan_in), 1/sqrt(fan_in))).  tests/golden/gen_resnet.py
 * computes the same numbers bit for bit.
 */
#ifndef PS_MODEL_H
#define PS_MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "ps_optim.h"
#include "ps_partition.h"
#include "worker/engine/ps_engine.h"

typedef struct ps_model_config {
    char arch[32];     /* "" (default): the 2-D ResNet below (depth, shift);
                          else a 3-D video model by name (ps_video3d.h:
                          "i3d-r50-311", "r3d-18", ...), which reads only
                          num_classes, n_segment (its clip's frames T),
                          dropout, partial_bn / bn_mode, width and the BN
                          constants */
    int depth;         /* 18, 34 or 50 */
    int num_classes;   /* K */
    int n_segment;     /* T frames per clip (TSM: 8) */
    int shift;         /* 1: TSM residual shift ('blockres': the input of conv1 in
                          every block, identity unshifted; every second block when
                          layer3 has >= 23 blocks, as TSM's make_temporal_shift);
                          0: TSN baseline */
    int shift_div;     /* 1/shift_div of the channels go each way (8) */
    int shift_place;   /* PS_MODEL_SHIFT_BLOCKRES (0, the default above) or
                          PS_MODEL_SHIFT_BLOCK: TSM's place 'block', the shift on
                          the input of every block, identity included */
    float dropout;     /* before fc (0.5); 0 disables */
    int partial_bn;    /* TSM partialBN: only bn1 trains with batch stats.  Kept for
                          compatibility: when set, bn_mode TRAIN reads as PARTIAL */
    int bn_mode;       /* PS_MODEL_BN_*: TRAIN (0), PARTIAL or FROZEN; see below */
    int fc_lr5;        /* fc in the "new fc" groups (lr x5 / x10) from the start */
    int width;         /* channels of the stem / layer1; 64 = torchvision.  Other
                          widths exist only for small tests; they do not load
                          into torchvision */
    float bn_eps;      /* 1e-5 */
    float bn_momentum; /* 0.1 (PyTorch convention) */
    int recompute;     /* activation recomputation (2-D ResNets only): a
                          training forward keeps each stage's input (and
                          the stem's conv output), not the stage's inside;
                          the backward recomputes a stage from its input
                          before going through it, and every BN + ReLU
                          output from the conv output before it is used
                          (SimpleDet's inline BN).  The recomputed values
                          are the forward's bit for bit (BN from its saved
                          statistics, bn_forward_saved), so are the
                          gradients; the activations then take one stage's
                          worth of memory instead of four */
    int zero_init_residual; /* 1: the init sets the weight of the last BN of
                          every residual branch to 0 (torchvision's
                          zero_init_residual, Goyal et al. 2017), so each
                          block starts as the identity (the downsample
                          keeps its BN); deep ResNets (ResNet-50, I3D)
                          from scratch need it on small batches.  Needs
                          bn_mode TRAIN: a frozen BN weight would stay 0 */
} ps_model_config_t;

/* Where the temporal shift goes (TSM's make_temporal_shift `place`). */
enum { PS_MODEL_SHIFT_BLOCKRES = 0, PS_MODEL_SHIFT_BLOCK = 1 };

/* BatchNorm modes.  The effective mode is FROZEN if bn_mode says so, else
 * PARTIAL if bn_mode is PARTIAL or partial_bn is set, else TRAIN.
 *   TRAIN    every BN uses batch statistics in a training forward (and
 *            updates its running statistics); affine trainable.
 *   PARTIAL  TSM's partialBN: bn1 as TRAIN, every other BN uses its running
 *            statistics and has a frozen affine.
 *   FROZEN   every BN, bn1 included, uses its running statistics in training
 *            too and its affine is frozen (trainable 0, gradient stays 0):
 *            SimpleDet's / torchvision detection's FrozenBatchNorm2d (a fixed
 *            per-channel scale and bias).  Each sample's loss then depends on
 *            that sample alone, so with dropout 0 the mean gradient over W*B
 *            clips equals the mean of W gradients over B clips (data-parallel
 *            reproducibility); running statistics never change. */
enum { PS_MODEL_BN_TRAIN = 0, PS_MODEL_BN_PARTIAL = 1, PS_MODEL_BN_FROZEN = 2 };

/* "tsm-r18|34|50" / "tsn-r18|34|50" -> depth, shift (1 TSM, 0 TSN);
 * PS_EINVAL for another name. */
int ps_model_parse_name(const char *name, int *depth, int *shift);

/* Defaults: TSM-ResNet-50, 400 classes, T 8, shift_div 8, dropout 0.5,
 * partial BN on, width 64, eps 1e-5, momentum 0.1. */
void ps_model_config_default(ps_model_config_t *c);

/* Optimizer groups of the TSM recipe (index = ps_model_param_t.group and
 * ps_tensor_spec_t.group; multipliers from ps_model_groups()). */
enum {
    PS_MODEL_GROUP_WEIGHT = 0,      /* conv / fc weights: lr x1, decay */
    PS_MODEL_GROUP_BIAS = 1,        /* biases: lr x2, no decay */
    PS_MODEL_GROUP_BN = 2,          /* BN weight and bias: lr x1, no decay */
    PS_MODEL_GROUP_NEWFC_WEIGHT = 3, /* newly initialised fc weight: lr x5, decay */
    PS_MODEL_GROUP_NEWFC_BIAS = 4,  /* newly initialised fc bias: lr x10, no decay */
    PS_MODEL_NGROUPS = 5
};

#define PS_MODEL_MAX_NDIM 5 /* conv3d weights (K, C, T, R, S) */

/* One learnable tensor, in model (= torchvision state-dict) order. */
typedef struct ps_model_param {
    const char *name;   /* "layer1.0.conv1.weight" (owned by the model) */
    int ndim;
    int shape[PS_MODEL_MAX_NDIM];
    size_t numel;
    float *w;           /* weights (arena) */
    float *g;           /* gradient, same shape (arena); accumulated by backward */
    int group;          /* PS_MODEL_GROUP_* */
    int trainable;      /* 0: frozen (partial BN's frozen affine); g stays 0 */
    int residual_last;  /* the weight of the last BN of a residual branch (a
                           block's bn2 / bn3, a video block's last unit's BN,
                           never a downsample's): what zero_init_residual zeroes */
} ps_model_param_t;

/* One non-trainable buffer (BN running statistics), in model order:
 * per BN "<bn>.running_mean" (C floats), "<bn>.running_var" (C floats),
 * "<bn>.num_batches_tracked" (one int64).  ps_model_buffers() is the table
 * for averaging them across workers or exporting them: the f32 entries are
 * plain float arrays in the arena that the caller may overwrite between
 * steps (e.g. with the average over workers).  In TRAIN / PARTIAL mode a
 * training forward updates the BNs it runs with batch statistics; in FROZEN
 * mode nothing ever changes them. */
typedef struct ps_model_buffer {
    const char *name;   /* "bn1.running_mean", "bn1.num_batches_tracked" */
    int ndim;           /* 1, or 0 for num_batches_tracked (a scalar) */
    size_t numel;
    float *f32;         /* running_mean / running_var (arena), else NULL */
    int64_t *i64;       /* num_batches_tracked, else NULL */
} ps_model_buffer_t;

typedef struct ps_model ps_model_t;

/* Build the model for batches of at most max_clips clips of T frames of
 * 3 x H x W (H, W >= 32 so layer4 is at least 1x1).  Weights start from
 * ps_model_init(m, 0).  ctx's workspace is grown to what the convs need.
 * Returns 0, PS_EINVAL (bad config, logged) or PS_ENOMEM. */
int ps_model_create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                    ps_ctx_t *ctx, int max_clips, int H, int W);
void ps_model_destroy(ps_model_t **m);
const ps_model_config_t *ps_model_config(const ps_model_t *m);
/* The effective PS_MODEL_BN_* mode (see ps_model_config_t). */
int ps_model_bn_mode(const ps_model_t *m);
/* The same from a config: FROZEN, else PARTIAL (bn_mode or the older
 * partial_bn flag), else TRAIN. */
int ps_model_cfg_bn_mode(const ps_model_config_t *cfg);

/* torchvision-like init from the counter hash (see the top of this file):
 * conv Kaiming (fan_out), BN weight 1 / bias 0, running mean 0 / var 1, fc
 * uniform.  random_bn != 0 also draws BN weight in [0.5,1.5), bias and
 * running mean in [-0.25,0.25), running var in [0.5,1.5) so tests exercise
 * every BN term.  cfg.zero_init_residual (without random_bn) then zeroes the
 * residual_last BN weights.  Gradients are zeroed. */
void ps_model_init(ps_model_t *m, uint64_t seed, int random_bn);

/* FNV-1a 64 of a tensor name: the per-tensor key of the init hash. */
uint64_t ps_model_fnv1a64(const char *s);

/* The deterministic input for tests: element i of `name` is 2u-1 with u
 * drawn as in the init (so both sides of a golden compute it). */
void ps_model_hash_fill(float *dst, size_t n, const char *name, uint64_t seed, double scale);

/* Forward pass over nclips clips (input (nclips*T, 3, H, W), NCHW fp32).
 * training: BN batch statistics (all of them, or only bn1 with partial BN)
 * and dropout; otherwise running statistics and no dropout.  labels
 * (nclips) may be NULL (no loss: *loss is left alone); else the mean
 * softmax cross-entropy is written to *loss.  The input is copied, so the
 * caller's buffer may be reused at once.  Returns 0 or PS_EINVAL. */
int ps_model_forward(ps_model_t *m, const float *input, int nclips, const int32_t *labels,
                     int training, float *loss);
/* (nclips, K) logits of the last forward (segment consensus). */
const float *ps_model_logits(const ps_model_t *m);
/* Backward of the last forward, which must have been a training forward
 * with labels (else PS_ESTATE).  Gradients ACCUMULATE into param[i].g. */
int ps_model_backward(ps_model_t *m);
void ps_model_zero_grad(ps_model_t *m);

/* Per-layer hooks (to overlap communication with compute).
 * Both get the parameters [first, first+n) of the table (model order); a
 * layer group is the stem (conv1, bn1), one residual block, or fc.
 *   weights_needed  ps_model_forward (every forward, training or not) calls
 *                   it before the group's first layer is queued, i.e.
 *                   before its weights -- and the running statistics of
 *                   its BNs -- are read: the caller may still be writing
 *                   them until it returns.  Stem first, fc last.
 *   grad_ready      ps_model_backward calls it once per parameter, as soon
 *                   as the last layer that writes the group's gradients
 *                   has been queued: fc first, stem last (reverse model
 *                   order).  With the synchronous CPU backend the gradient
 *                   is final when the hook runs; with an asynchronous one
 *                   (CUDA) only the work is queued: the hook records a
 *                   backend event (ps_cuda_backend_event_record) and the
 *                   consumer waits for it before reading g.
 * The hooks run on the thread calling forward / backward, between layers;
 * they must not call back into the model.  NULL hooks (the default) change
 * nothing.  ctx is passed through. */
typedef void (*ps_model_hook_fn)(void *ctx, int first, int n);
void ps_model_set_hooks(ps_model_t *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                        void *ctx);

/* A model's tables and per-layer hooks as --overlap takes them
 * (worker/psworker/overlap.c), for any model with ps_model_set_hooks'
 * contract over its parameter table: a video model (ps_model_hookable) or
 * a detector (ps_rcnn_hookable, ps_retina_hookable).  The hooks' indices
 * are rows of params; buffers holds the running statistics a BN weight's
 * weights_needed also releases ("<bn>.running_mean|var" beside
 * "<bn>.weight").  The pointers live as long as the model. */
typedef struct ps_model_hookable {
    const ps_model_param_t *params;
    int nparams;
    const ps_model_buffer_t *buffers;
    int nbuffers;
    void *model;
    void (*set_hooks)(void *model, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                      void *ctx);
} ps_model_hookable_t;
void ps_model_hookable(ps_model_t *m, ps_model_hookable_t *h);

/* The tables (owned by the model, valid until destroy). */
const ps_model_param_t *ps_model_params(const ps_model_t *m, int *n);
const ps_model_buffer_t *ps_model_buffers(const ps_model_t *m, int *n);
/* Index of a parameter by name, or -1. */
int ps_model_find_param(const ps_model_t *m, const char *name);
/* Group multipliers of the TSM recipe into groups[0..PS_MODEL_NGROUPS);
 * returns PS_MODEL_NGROUPS (or PS_EINVAL if max is smaller). */
int ps_model_groups(const ps_model_t *m, ps_param_group_t *groups, int max);
/* The trainable tensors in model order as partition specs (names point into
 * the model).  *specs is malloc'd; returns the count or PS_ENOMEM. */
int ps_model_tensor_specs(const ps_model_t *m, ps_tensor_spec_t **specs);

/* Floating-point operations of one forward / backward over nclips clips,
 * counted from the layer shapes (2 per multiply-add; convs and fc only). */
void ps_model_flops(const ps_model_t *m, int nclips, double *fwd, double *bwd);

/* What a model of cfg costs, from its shapes alone (no memory for weights
 * or activations, so the paper's sizes can be counted anywhere). */
typedef struct ps_model_count {
    size_t params;        /* learnable elements */
    size_t trainable;     /* of which trainable in cfg's BN mode (what is pushed) */
    size_t bn_stats;      /* BN running mean / var elements (--bn-sync sends them too) */
    double fwd_flops;     /* one clip's forward, 2 per multiply-add of convs and fc */
    double bwd_flops;     /* its backward (input and weight gradients) */
} ps_model_count_t;
/* 0, or PS_EINVAL (bad config, logged) / PS_ENOMEM. */
int ps_model_count(const ps_model_config_t *cfg, int H, int W, ps_model_count_t *c);
/* The bytes of the arena ps_model_create would allocate for batches of
 * max_clips clips on a backend that stores activations in act_bytes-byte
 * elements (its act_elsize: 4, or 2 for the CUDA backend's half storage),
 * from the sizing pass alone (nothing allocated), so a GPU run's figure is
 * known on any machine.  The arena is the model's whole static memory:
 * parameters, gradients, statistics, activations.  0, PS_EINVAL, PS_ENOMEM. */
int ps_model_arena_size(const ps_model_config_t *cfg, int max_clips, int H, int W,
                        size_t act_bytes, size_t *bytes);
/* The same for a detector's backbone (ps_retinanet.h, ps_rcnn.h: the
 * ResNet body without head, max_n images of H x W, cfg's depth, width, BN
 * mode and recompute). */
int ps_model_features_arena_size(const ps_model_config_t *cfg, int max_n, int H, int W,
                                 size_t act_bytes, size_t *bytes);
/* Bytes of the model's arena (what ps_model_arena_size said for it). */
size_t ps_model_arena_bytes(const ps_model_t *m);
/* Dropout masks are a pure function of (seed, forward counter): forward
 * number k (0-based, counted from this call; every forward counts) draws
 * its mask with seed ^ (0x9E3779B97F4A7C15 * (k + 1)) through the backend's
 * dropout (keep where ps_rng_uniform(that, i) >= p). */
void ps_model_set_seed(ps_model_t *m, uint64_t seed);
/* Set the forward counter: psworker sets it to the training step before
 * each step's forward, so the masks are a function of the step (the same
 * in a run restarted or rolled back to that step, whatever validation
 * forwards came before). */
void ps_model_set_step(ps_model_t *m, uint64_t step);

/* ---- safetensors (model_io.c) ------------------------------------------- */

/* Write every parameter and buffer under its torchvision name (F32, and I64
 * for num_batches_tracked) plus metadata {"format": "pt", "ps.arch": ...},
 * atomically.  Returns 0 or the ps_st_* error (logged). */
int ps_model_save(const ps_model_t *m, const char *path);

enum {
    PS_MODEL_LOAD_STRICT = 0,
    /* fc.weight / fc.bias whose class count differs from the model's are
     * skipped: fc keeps a fresh init and moves to the new-fc groups (lr x5 /
     * x10), as TSM does when fine-tuning from a pretrained net */
    PS_MODEL_LOAD_REPLACE_FC = 1,
    /* tensors the model has and the file lacks keep their initialisation,
     * tensors the file has and the model lacks are skipped (both listed in
     * the log; ps_weights.h PS_WEIGHTS_PARTIAL) */
    PS_MODEL_LOAD_PARTIAL = 2,
    /* a 4-D (K, C, R, S) file tensor for a 5-D (K, C, T, R, S) model weight
     * is inflated along T (I3D's ImageNet initialisation): by default each
     * of the T slices is the 2-D kernel / T ("mean" inflation: a clip of T
     * equal frames then gives the 2-D net's response); with this flag the
     * centre slice is the 2-D kernel and the others are 0 ("centre") */
    PS_MODEL_LOAD_INFLATE_CENTRE = 4,
};
/* Load a safetensors file: torchvision names (what ps_model_save writes, a
 * converted torchvision state dict) or an official TSM checkpoint's
 * (module.base_model.*, .net., new_fc; ps_weights.h), whose shift placement
 * must be the model's.  Every model tensor must be present with the same
 * shape (num_batches_tracked may be missing: 0; a 3-D model's conv weights
 * may be 2-D ones, inflated on load, see PS_MODEL_LOAD_INFLATE_CENTRE), and
 * no unknown tensor may be present, unless the flags say otherwise; every
 * skipped, inflated or re-initialised tensor is logged; on any error nothing
 * is changed.  Returns 0, PS_EIO, PS_ECORRUPT, PS_ENOTFOUND, PS_EMISMATCH or
 * PS_EINVAL (a detector's backbone: load through ps_retina_load) with a
 * message naming the file and tensor. */
int ps_model_load(ps_model_t *m, const char *path, int flags);
/* What a weights file says about the model it fits (model_io.c), for
 * options not given: TSM's shift placement from the names of an official
 * TSM checkpoint (PS_MODEL_SHIFT_*, -1: not such a checkpoint, or no
 * shift), its shift_div from the tsm.shift_div metadata that
 * worker/models/torch2safetensors.py records (0: none), the class count
 * from the classifier's rows (0: none).  0, or the file's PS_EIO /
 * PS_ECORRUPT (logged). */
typedef struct ps_model_file_info {
    int shift_place, shift_div, num_classes;
} ps_model_file_info_t;
int ps_model_file_info(const char *path, ps_model_file_info_t *info);

/* ---- ONNX (onnx_resnet.c) ------------------------------------------------- */

/* The model in evaluation mode as an ONNX graph (onnx_graph.h: opset 17):
 * input "clips" (batch, T, 3, H, W) at the size the model was created
 * for, batch symbolic; output "logits" (batch, K), the mean over the T
 * frames of fc's output, as ps_model_logits after an evaluation forward.
 * The temporal shift is Slice / Pad / Concat on a (batch, T, C, H, W)
 * view; BN uses the running statistics; initializers carry the torchvision
 * names.  Written atomically.  Returns 0 or PS_E* (logged). */
int ps_model_export_onnx(const ps_model_t *m, const char *path);

/* 1 if the last load replaced fc (class count differed). */
int ps_model_fc_replaced(const ps_model_t *m);
/* Tensors the last load inflated from 2-D to 3-D (0 for a 2-D model). */
int ps_model_inflated(const ps_model_t *m);
/* The architecture's name as saved in the file's "ps.arch" metadata
 * ("tsm-resnet50", "i3d-r50-311", ...). */
const char *ps_model_arch(const ps_model_t *m);

#endif
