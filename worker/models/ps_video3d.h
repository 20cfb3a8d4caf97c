/* The 3-D video models: torchvision's video ResNets (r3d-18, mc3-18,
 * r2plus1d-18, torchvision 0.14's module tree and names) and I3D-ResNet-50
 * in the two variants the TSM paper compares against (3x3x3 and 3x1x1
 * temporal kernels).  Each is a row of ps_v3d_archs(); a model is made with
 * ps_model_create() (ps_model.h) with cfg.arch = the row's name and then
 * used through ps_model.h like the 2-D ResNets.
 *
 * Input: ps_model_forward() takes the video pipeline's batch as it is,
 * (nclips * T, 3, H, W) frame-major (T = cfg.n_segment); the model lays
 * each clip out as (3, T, H, W) itself (NCDHW, the 3-D layers' layout).
 * Output: (nclips, K) logits from the global average pool over the last
 * stage's T x H x W and fc (no per-frame consensus).
 *
 * Names: r3d-18 / mc3-18 / r2plus1d-18 export under torchvision.models.video's
 * names (stem.0.weight, layer1.0.conv1.0.weight, ...; r2plus1d:
 * layer1.0.conv1.0.0.weight, ...); I3D under torchvision.models.resnet50's
 * names with 5-D kernels (conv1.weight (64, 3, 5, 7, 7), ...), so a
 * torchvision ResNet-50 file loads into it with its kernels inflated
 * (PS_MODEL_LOAD_INFLATE_CENTRE, ps_model.h). */
#ifndef PS_VIDEO3D_H
#define PS_VIDEO3D_H

struct ps_model;

/* Temporal kernel of one stage of a torchvision video ResNet. */
enum {
    PS_V3D_CONV_3D = 0,     /* Conv3DSimple: 3x3x3 */
    PS_V3D_CONV_2D = 1,     /* Conv3DNoTemporal: 1x3x3 (MC3's upper stages) */
    PS_V3D_CONV_2PLUS1 = 2  /* Conv2Plus1D: 1x3x3 then 3x1x1 with BN+ReLU between */
};

typedef struct ps_v3d_arch {
    const char *name;         /* --model value: "r3d-18", "i3d-r50-311", ... */
    const char *what;         /* one line for logs and --help */
    const char *torch;        /* the PyTorch module that holds the same tensors */
    int clip_frames;          /* the clip its reference trains on: T frames ... */
    int clip_stride;          /* ... every clip_stride-th frame (dense sampling) */
    /* how the builder makes it (video3d_arch.c) */
    int (*define)(struct ps_model *m, const struct ps_v3d_arch *a);
    int stage_conv[4];        /* video ResNets: PS_V3D_CONV_* per stage */
    int stem_2plus1;          /* video ResNets: R(2+1)D's two-conv stem */
    int i3d_kernel;           /* I3D: 333 (3x3x3 on the 3x3 conv) or 311 (3x1x1 on the
                                 first 1x1 conv) in the inflated blocks */
} ps_v3d_arch_t;

/* The rows, and one by name (NULL when no row has it). */
const ps_v3d_arch_t *ps_v3d_archs(int *n);
const ps_v3d_arch_t *ps_v3d_arch_find(const char *name);

#endif
