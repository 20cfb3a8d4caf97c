/* Weights from another program's file: a safetensors file (torchvision's
 * ResNet converted by worker/models/torch2safetensors.py, an official TSM
 * checkpoint, our own model.safetensors) read into a model's parameter and
 * buffer tables (ps_model_param_t / ps_model_buffer_t, ps_model.h) through
 * a name map.  Every model calls this one loader with its own map, so the
 * classifier (ps_model_t), the detector (its backbone under
 * "backbone.body.") and any later model (a 3-D network inflating 2-D
 * kernels through `adapt`) share the checks and the log.
 *
 * A file name becomes a model name by the rules of the file's format, in
 * order, each at most once (ps_weights_rule_t).  Then every tensor of the
 * file is one of:
 *   loaded       same shape as the model tensor (any float dtype; num_
 *                batches_tracked one int64);
 *   adapted      another shape that the target's adapt() converted
 *                (listed in the log);
 *   re-init      another shape on a tensor the target lets keep its
 *                initialisation (the classifier of another class count;
 *                listed);
 *   skipped      dropped by a DROP rule (a classifier that a backbone has
 *                no use for), or unknown with PS_WEIGHTS_PARTIAL (listed);
 *   an error     unknown (no model tensor of that name), or a shape that
 *                cannot be used: PS_EMISMATCH naming the tensor and both
 *                shapes.
 * A model tensor the file lacks is PS_ENOTFOUND naming it, or with
 * PS_WEIGHTS_PARTIAL keeps its initialisation (listed); num_batches_
 * tracked may always be missing (state dicts before PyTorch 0.4.1: 0).
 *
 * Everything is validated before a single value moves: on any error the
 * model is unchanged.  Every problem is logged (the first 20 by name), and
 * the code of the first (in model order, then file order) is returned. */
#ifndef PS_WEIGHTS_H
#define PS_WEIGHTS_H
#include <stdint.h>

#include "ps_model.h"
#include "ps_safetensors.h"

typedef enum {
    PS_WEIGHTS_PREFIX, /* a name that starts with `from` starts with `to` instead */
    PS_WEIGHTS_INFIX,  /* every `from` inside the name becomes `to` */
    PS_WEIGHTS_DROP,   /* a name (after the rules before) starting with `from` is skipped */
} ps_weights_rule_kind_t;

typedef struct ps_weights_rule {
    ps_weights_rule_kind_t kind;
    const char *from, *to; /* to: unused by DROP */
} ps_weights_rule_t;

/* A naming convention.  The first format of a list whose `detect` prefix
 * starts one of the file's names is the file's (detect NULL: any file).
 * covers (NULL: every tensor) is the prefix of the model names such a file
 * can hold: model tensors outside it (a detector's FPN and heads, when the
 * file is an ImageNet ResNet) keep their initialisation without counting
 * as missing (one summary line). */
typedef struct ps_weights_format {
    const char *name;   /* for the log: "torchvision", "tsm", ... */
    const char *detect;
    const ps_weights_rule_t *rules;
    int nrules;
    const char *covers;
} ps_weights_format_t;

/* The model's side. */
typedef struct ps_weights_target {
    const char *what;                 /* log prefix: "model", "retinanet" */
    ps_model_param_t *params;
    int nparams;
    ps_model_buffer_t *buffers;
    int nbuffers;
    /* Optional: 1 if params[i] may keep its initialisation when the file's
     * tensor has another shape (the classifier). */
    int (*may_reinit)(void *ctx, int i);
    /* Optional: dst (params[i].numel floats) from a file tensor of another
     * shape (src converted to float, ndim / shape the file's), e.g. a 2-D
     * kernel inflated to 3-D; 1 when done, 0 when it cannot (then
     * may_reinit decides, else an error).  Runs in the checking pass: dst
     * is scratch, copied into the model only when the whole file passes. */
    int (*adapt)(void *ctx, int i, const float *src, int ndim, const int64_t *shape, float *dst);
    void *ctx;
    /* Optional (nparams): set to 1 for every parameter the load left at its
     * initialisation (missing with PARTIAL, or re-init), else 0. */
    unsigned char *kept_init;
} ps_weights_target_t;

enum {
    /* missing model tensors keep their init, unknown file tensors are
     * skipped: both listed; shapes that cannot be used stay errors */
    PS_WEIGHTS_PARTIAL = 1u << 0,
};

typedef struct ps_weights_report {
    const char *format; /* the format's name (static) */
    int loaded, adapted, reinit, skipped, missing;
} ps_weights_report_t;

/* Load path into the target with the first matching format of formats[0..n).
 * Returns 0, PS_EIO / PS_ECORRUPT (the file), PS_ENOTFOUND, PS_EMISMATCH or
 * PS_ENOMEM, each logged naming the file and tensor.  rep may be NULL. */
int ps_weights_load(const ps_weights_target_t *t, const char *path,
                    const ps_weights_format_t *const *formats, int nformats, unsigned flags,
                    ps_weights_report_t *rep);

/* The format of an open file: the first of formats[0..n) that detects it,
 * or NULL. */
const ps_weights_format_t *ps_weights_detect(const ps_st_file_t *f,
                                             const ps_weights_format_t *const *formats, int n);

/* The index in f of the tensor that becomes model tensor `name` under fm's
 * rules, or -1 (fm NULL: -1). */
long ps_weights_find(const ps_st_file_t *f, const ps_weights_format_t *fm, const char *name);

/* The shape of the file tensor that becomes model tensor `name` under the
 * file's format: 0 with *ndim and shape[0..*ndim) (room for 8), PS_ENOTFOUND
 * when the file has none, or the file's PS_EIO / PS_ECORRUPT (logged). */
int ps_weights_tensor_shape(const char *path, const ps_weights_format_t *const *formats,
                            int nformats, const char *name, int *ndim, int64_t *shape);

/* The name a file tensor gets under a format's rules into out[outlen];
 * 0, 1 when a DROP rule skips it, PS_ERANGE when it does not fit. */
int ps_weights_map_name(const ps_weights_format_t *f, const char *name, char *out,
                        size_t outlen);

/* Formats every ResNet-based model reads (weights_formats.c). */
extern const ps_weights_format_t ps_weights_torchvision; /* our own names = torchvision's */
/* The official TSM repository's checkpoint (temporal-shift-module's
 * main.py saves {"state_dict": DataParallel(TSN).state_dict()}):
 * "module.base_model.<torchvision name>", TemporalShift's ".net." level
 * ("layer1.0.conv1.net.weight" with place blockres, "layer1.0.net.conv1.
 * weight" with place block), and "module.new_fc.*" for the classifier
 * (a plain "base_model.fc.*" when TSM ran with dropout 0).  Detected by a
 * name starting "module.base_model." (ps_weights_tsm) or "base_model."
 * (saved without DataParallel, ps_weights_tsm_bare). */
extern const ps_weights_format_t ps_weights_tsm, ps_weights_tsm_bare;
/* The list a classifier reads with: TSM's two, then torchvision's. */
#define PS_WEIGHTS_RESNET_NFORMATS 3
extern const ps_weights_format_t *const ps_weights_resnet_formats[PS_WEIGHTS_RESNET_NFORMATS];

/* A detector's backbone (its names under "backbone.body.") from an
 * ImageNet classifier: an official TSM checkpoint (module.base_model.*,
 * the classifier and the ".net." levels dropped) or a torchvision ResNet
 * (fc.* dropped); both cover "backbone.body." only, so the FPN and heads
 * keep their initialisation.  RetinaNet and Faster R-CNN read them. */
#define PS_WEIGHTS_DET_BACKBONE_NFORMATS 2
extern const ps_weights_format_t *const
    ps_weights_det_backbone_formats[PS_WEIGHTS_DET_BACKBONE_NFORMATS];

/* Where a TSM checkpoint placed the shift, from the ".net." levels of its
 * names: PS_MODEL_SHIFT_BLOCKRES or PS_MODEL_SHIFT_BLOCK, or -1 when it has
 * none (a TSN, or a file in our names); PS_EMISMATCH when it has both. */
int ps_weights_tsm_place(const ps_st_file_t *f);

#endif
