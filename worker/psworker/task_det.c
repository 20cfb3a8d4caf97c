/* The detection task: the detectors of task_det.h's rows -- RetinaNet-FPN
 * (worker/models/ps_retinanet.h), Faster, Mask and Cascade R-CNN-FPN
 * (worker/models/ps_rcnn.h) -- fed by the detection data pipeline (worker/det/det_data.h),
 * trained by the same loops as every other task.  As for the video models (task_video.c)
 * the trainable tensors live in one flat vector in model order (p->w,
 * p->grad), copied into / out of the model's tables around each step.
 *
 * Data: rank r of W reads DistributedSampler's share, B images per step;
 * step s is batch s % bpe of epoch s / bpe.  The anchor assignment (the
 * row's IoU thresholds) runs in the loader threads, and for the two-stage
 * row the batches carry each image's instances.  Each rank normalises its
 * losses over its own B images (Detectron / SimpleDet per-GPU
 * normalisation); the servers average the W gradients.  The two-stage
 * row's sampling seed of a step is a function of (--seed, step, rank).
 *
 * Validation (rank 0): the whole --val-json through the row's inference
 * post-processing (score > --score-thresh, class-wise NMS 0.5, 100 per
 * image), boxes mapped back to the original image, then the COCO evaluator
 * (coco_eval.h): AP, AP50, AP75; for Mask R-CNN the masks too (iouType segm).
 *
 * --device cuda[:N]: the engine's CUDA backend, detection layers included,
 * with the model's arenas in managed memory, as for the video models;
 * every layer is queued on the backend's stream, so be->sync comes before
 * the host reads gradients or outputs (the two losses come back by value,
 * already waited for).  The loaders read a host copy of the anchors, never
 * the arena. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/coco_eval.h"
#include "worker/det/det_boxes.h"
#include "worker/det/det_data.h"
#include "worker/models/ps_weights.h"
#include "worker/psworker/psworker.h"
#include "worker/psworker/task_det.h"

/* the rows, in claim order */
static const det_kind_t *const kinds[] = {&det_kind_retina, &det_kind_rcnn, &det_kind_maskrcnn,
                                          &det_kind_cascade, NULL};

typedef struct det {
    ps_ctx_t ctx;
    const ps_backend_t *be;
    const det_kind_t *kind;
    void *m;
    ps_det_dataset_t *train, *val;
    ps_det_loader_t *tl, *vl;
    ps_det_data_opts_t topt, vopt;
    ps_det_batch_t tb, vb;
    ps_tensor_spec_t *specs;
    int nspecs, *param_of, A, K;
    double map, ap50, ap75, eval_s;
    double segm_map, segm_ap50, segm_ap75; /* Mask R-CNN's masks (NaN otherwise) */
    size_t val_images, val_dets;  /* last validation: images, detections kept */
    float score_thresh;
    float *anchors;               /* (A, 4) host copy for the loader threads */
    FILE *val_csv;                /* rank 0: one row per validation */
} det_t;

static const det_opts_t *dopts(const ps_worker_t *p) { return ps_worker_task_opts(p->o); }

/* ---- options ---------------------------------------------------------------- */

/* The row whose prefix --model starts with, and the depth after it (-1
 * when not one of 18, 34, 50). */
static const det_kind_t *kind_of(const char *model, int *depth)
{
    for (int k = 0; kinds[k]; k++) {
        size_t n = strlen(kinds[k]->prefix);
        if (strncmp(model, kinds[k]->prefix, n)) continue;
        char *end;
        long v = strtol(model + n, &end, 10);
        if (depth) *depth = (*end || (v != 18 && v != 34 && v != 50)) ? -1 : (int)v;
        return kinds[k];
    }
    return NULL;
}

static int det_claims(const ps_worker_opts_t *o, const void *topts)
{
    (void)topts;
    return kind_of(o->model, NULL) != NULL;
}

#define ROW(name, type, dst, help, def) rows[n++] = (ps_opt_t){name, type, dst, help, def}

static size_t det_rows(void *topts, ps_opt_t *rows)
{
    det_opts_t *d = topts;
    size_t n = 0;
    ROW("train-json", PS_OPT_STRING, &d->train_json, "detector: COCO training annotations (images under --root)", "");
    ROW("val-json", PS_OPT_STRING, &d->val_json, "detector: COCO validation annotations", "");
    ROW("val-root", PS_OPT_STRING, &d->val_root, "detector: validation image folder (\"\" = --root)", "");
    ROW("fpn-channels", PS_OPT_INT, &d->fpn_channels, "detector: FPN and head channels (256 = torchvision)", "256");
    ROW("freeze-at", PS_OPT_INT, &d->freeze_at, "detector: frozen backbone stages (0 none, 2 = stem + layer1)", "2");
    ROW("score-thresh", PS_OPT_FLOAT, &d->score_thresh, "detector: validation keeps detections scoring above this (0.05)", "0.05");
    ROW("clip-grad", PS_OPT_FLOAT, &d->clip_grad, "detector: clip each worker's gradient to this L2 norm (0 = off)", "0");
    ROW("rpn-pre-nms-train", PS_OPT_INT, &d->rpn_pre_train, "two-stage: RPN boxes per level before NMS, training (0 = 2000 scaled to --size)", "0");
    ROW("rpn-post-nms-train", PS_OPT_INT, &d->rpn_post_train, "two-stage: RPN proposals per image after NMS, training (0 = 2000 scaled to --size)", "0");
    ROW("rpn-pre-nms-test", PS_OPT_INT, &d->rpn_pre_test, "two-stage: RPN boxes per level before NMS, inference (0 = 1000 scaled to --size)", "0");
    ROW("rpn-post-nms-test", PS_OPT_INT, &d->rpn_post_test, "two-stage: RPN proposals per image after NMS, inference (0 = 1000 scaled to --size)", "0");
    ROW("box-batch", PS_OPT_INT, &d->box_batch, "two-stage: RoIs sampled per training image (25% positive)", "512");
    ROW("box-head-dim", PS_OPT_INT, &d->box_head_dim, "two-stage: width of the box head's two FC layers (1024 = torchvision)", "1024");
    ROW("max-gt", PS_OPT_INT, &d->max_gt, "two-stage: boxes a training image may have at most (more: an error naming it)", "100");
    ROW("mask-head-dim", PS_OPT_INT, &d->mask_head_dim, "Mask R-CNN: width of the mask head's four convs and deconv (256 = torchvision)", "256");
    return n;
}

static int det_check(ps_worker_opts_t *o)
{
    const det_opts_t *d = ps_worker_task_opts(o);
    /* its losses have no loss scaling: fp16 gradients would underflow */
    if (ps_worker_fp32_only(o, "the detector trains in fp32 only for now") ||
        ps_worker_data_opts_check(o))
        return PS_EINVAL;
    if (d->fpn_channels < 8 || d->fpn_channels > 1024 || d->freeze_at < 0 || d->freeze_at > 5 ||
        !(d->score_thresh >= 0 && d->score_thresh < 1) || !(d->clip_grad >= 0))
        return ps_worker_opt_error("--fpn-channels must be in 8..1024, --freeze-at in 0..5, "
                "--score-thresh in [0, 1), --clip-grad >= 0");
    const char *bn = o->data.bn;
    if (*bn && strcmp(bn, "frozen") && strcmp(bn, "train") && strcmp(bn, "sync"))
        return ps_worker_opt_error("--bn: a detector's backbone BN is frozen|train|sync, got "
                                   "\"%s\"", bn);
    if (d->rpn_pre_train < 0 || d->rpn_post_train < 0 || d->rpn_pre_test < 0 ||
        d->rpn_post_test < 0 || d->rpn_pre_train > 100000 || d->rpn_post_train > 100000 ||
        d->rpn_pre_test > 100000 || d->rpn_post_test > 100000)
        return ps_worker_opt_error("--rpn-pre-nms-train, --rpn-post-nms-train, "
                "--rpn-pre-nms-test, --rpn-post-nms-test must be in 0..100000 (0 = scaled)");
    if (d->box_batch < 1 || d->box_batch > 100000 || d->box_head_dim < 1 ||
        d->box_head_dim > 65536 || d->max_gt < 1 || d->max_gt > 100000 ||
        d->mask_head_dim < 1 || d->mask_head_dim > 4096)
        return ps_worker_opt_error("--box-batch must be in 1..100000, --box-head-dim in "
                "1..65536, --max-gt in 1..100000, --mask-head-dim in 1..4096");
    int depth;
    const det_kind_t *k = kind_of(o->model, &depth);
    if (depth < 0)
        return ps_worker_opt_error("--model %s: the depth must be 18, 34 or 50", o->model);
    if (*o->export_onnx && !k->export_onnx)
        return ps_worker_opt_error("--export-onnx: not for --model %s (%s has no ONNX graph "
                "yet)", o->model, k->name);
    if (!o->eval && !*o->export_onnx && !*d->train_json)
        return ps_worker_opt_error("--model %s needs --train-json (COCO annotations) and --root "
                "(their images)", o->model);
    if ((o->eval || *o->data.predictions) && !*d->val_json)
        return ps_worker_opt_error("--eval and --predictions of a detector need --val-json and "
                "--val-root");
    return 0;
}

/* ---- set-up ------------------------------------------------------------------ */

static int load_set(const char *json, const char *root, int train, int skip_bad,
                    ps_det_dataset_t **ds)
{
    char err[2048];
    int rc = ps_det_dataset_load(ds, json, root, train, skip_bad, err, sizeof err);
    if (rc) {
        ps_error("%s", err);
        return rc;
    }
    ps_info("%s: %zu images, %d classes (%zu without boxes left out, %zu bad records skipped)",
            json, ps_det_dataset_size(*ds), ps_det_dataset_num_classes(*ds),
            ps_det_dataset_skipped_empty(*ds), ps_det_dataset_skipped_records(*ds));
    return 0;
}

static void data_opts(const ps_worker_opts_t *o, const det_kind_t *k, ps_det_data_opts_t *d,
                      int train, int batch)
{
    ps_det_data_opts_default(d);
    d->fg_iou = k->fg_iou;
    d->bg_iou = k->bg_iou;
    /* the two-stage row samples RoIs against each image's instances */
    int mi = train ? k->max_gt(ps_worker_task_opts(o)) : 0;
    d->instances = mi > 0;
    d->masks = mi > 0 && k->masks;
    d->max_instances = mi;
    d->size = o->data.size;
    d->train = train;
    d->flip = train && o->data.flip;
    d->seed = o->data_seed;
    d->batch = batch;
    d->threads = o->data.loader_threads;
    d->prefetch = o->data.prefetch;
    d->skip_bad = o->data.skip_bad;
}

/* No annotations (--export-onnx): the class count from --weights' class
 * output (the row's classes_tensor: per outputs a class, plus extra). */
static int classes_from_weights(const ps_worker_opts_t *o, const det_kind_t *k, int *K)
{
    static const ps_weights_format_t own = {.name = "detector"};
    const ps_weights_format_t *const f[1] = {&own};
    int64_t shape[8];
    int nd = 0;
    if (!*o->data.weights ||
        ps_weights_tensor_shape(o->data.weights, f, 1, k->classes_tensor, &nd, shape)) {
        ps_error("--export-onnx of a detector without annotations: give --num-classes (or "
                 "--weights of a detector)");
        return PS_EINVAL;
    }
    long long c = nd == 1 ? (long long)shape[0] - k->classes_extra : -1;
    if (c < k->classes_per || c % k->classes_per) {
        ps_error("%s: %s has %lld outputs, not %d x K + %d", o->data.weights, k->classes_tensor,
                 nd == 1 ? (long long)shape[0] : -1LL, k->classes_per, k->classes_extra);
        return PS_EMISMATCH;
    }
    *K = (int)(c / k->classes_per);
    ps_info("%d classes from %s's %s", *K, o->data.weights, k->classes_tensor);
    return 0;
}

/* The annotations, the classes (the same category ids in train and val)
 * and the loaders' options. */
static int det_data(ps_worker_t *p, det_t *d)
{
    const ps_worker_opts_t *o = p->o;
    const det_opts_t *dop = dopts(p);
    int rc;
    if (!o->eval && !*o->export_onnx &&
        (rc = load_set(dop->train_json, o->data.root, 1, o->data.skip_bad, &d->train)))
        return rc;
    if (*dop->val_json && (rc = load_set(dop->val_json, *dop->val_root ? dop->val_root : o->data.root,
                                         0, o->data.skip_bad, &d->val)))
        return rc;
    d->K = o->data.num_classes;
    if (!d->K && !d->train && !d->val) return classes_from_weights(o, d->kind, &d->K);
    if (!d->K) d->K = ps_det_dataset_num_classes(d->train ? d->train : d->val);
    if ((d->train && ps_det_dataset_num_classes(d->train) != d->K) ||
        (d->val && ps_det_dataset_num_classes(d->val) != d->K)) {
        ps_error("--num-classes %d disagrees with the annotations' categories (train %d, val %d)",
                 d->K, d->train ? ps_det_dataset_num_classes(d->train) : 0,
                 d->val ? ps_det_dataset_num_classes(d->val) : 0);
        return PS_EINVAL;
    }
    if (d->train && d->val)
        for (int k = 0; k < d->K; k++)
            if (ps_det_dataset_class_cat(d->train, k) != ps_det_dataset_class_cat(d->val, k)) {
                ps_error("train and val annotations have different category ids");
                return PS_EINVAL;
            }
    int vbatch = o->data.val_batch > 0 ? o->data.val_batch : p->batch;
    data_opts(o, d->kind, &d->topt, 1, p->batch);
    data_opts(o, d->kind, &d->vopt, 0, vbatch);
    char err[512];
    if (ps_det_data_opts_check(&d->topt, err, sizeof err)) {
        ps_error("data options: %s", err);
        return PS_EINVAL;
    }
    return 0;
}

/* The model on its device, initialised or loaded, and a host copy of its anchors. */
static int det_model(ps_worker_t *p, det_t *d, int depth)
{
    const ps_worker_opts_t *o = p->o;
    int rc;
    if ((rc = ps_worker_open_device(p, &d->ctx, &d->be))) return rc;
    int vbatch = d->vopt.batch, maxn = p->batch > vbatch ? p->batch : vbatch;
    if (*o->export_onnx) maxn = 1; /* the graph has a symbolic batch */
    det_build_t b = {depth, d->K, o->data.width, o->data.size, maxn, dopts(p),
                     *o->data.bn && strcmp(o->data.bn, "frozen") ? PS_MODEL_BN_TRAIN
                                                                 : PS_MODEL_BN_FROZEN,
                     o->data.recompute};
    if ((rc = d->kind->create(&d->m, &b, d->be, &d->ctx))) return rc;
    d->kind->init(d->m, o->seed);
    if (*o->data.weights) {
        if ((rc = d->kind->load(d->m, o->data.weights, o->data.weights_partial))) return rc;
        ps_info("weights loaded from %s", o->data.weights);
    }
    if (!strcmp(o->data.bn, "sync")) { /* the backbone's BN channels, what --bn sync exchanges */
        int nb;
        const ps_model_buffer_t *bu = d->kind->buffers(d->m, &nb);
        for (int i = 0; i < nb; i++)
            if (bu[i].f32 && strstr(bu[i].name, "running_mean")) p->bn_cross += (int)bu[i].numel;
    }
    d->A = d->kind->num_anchors(d->m);
    d->anchors = malloc(sizeof(float) * 4 * (size_t)d->A);
    if (!d->anchors) return PS_ENOMEM;
    memcpy(d->anchors, d->kind->anchors(d->m), sizeof(float) * 4 * (size_t)d->A);
    return 0;
}

/* The flat vector's tensors, the partition table, the optimizer groups and
 * p->w = the model's initial tensors. */
static int det_table(ps_worker_t *p, det_t *d, uint32_t nservers)
{
    int rc;
    d->nspecs = d->kind->tensor_specs(d->m, &d->specs);
    if (d->nspecs < 0) return d->nspecs;
    rc = ps_partition_table_build(&p->table, d->specs, (uint32_t)d->nspecs,
                                  (size_t)p->o->partition_bytes, nservers);
    if (rc) {
        ps_error("cannot build the partition table: %s", ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_worker_build_optim(p))) return rc;
    int n = d->kind->groups(d->m, p->optim.groups, PS_OPTIM_MAX_GROUPS);
    if (n < 0) return n;
    p->optim.ngroups = n;
    d->param_of = malloc(sizeof(int) * (size_t)d->nspecs);
    p->numel = 0;
    for (int i = 0; i < d->nspecs; i++) p->numel += d->specs[i].numel;
    p->nparam_numel = p->numel;
    p->w = calloc(p->numel, sizeof(float));
    p->grad = calloc(p->numel, sizeof(float));
    if (!d->param_of || !p->w || !p->grad) {
        ps_error("out of memory for the %s model", p->o->model);
        return PS_ENOMEM;
    }
    int np;
    const ps_model_param_t *par = d->kind->params(d->m, &np);
    size_t off = 0;
    for (int i = 0; i < d->nspecs; i++) {
        d->param_of[i] = d->kind->find_param(d->m, d->specs[i].name);
        if (d->param_of[i] < 0 || par[d->param_of[i]].numel != d->specs[i].numel) {
            ps_error("model table mismatch at %s", d->specs[i].name);
            return PS_EMISMATCH;
        }
        memcpy(p->w + off, par[d->param_of[i]].w, sizeof(float) * d->specs[i].numel);
        off += d->specs[i].numel;
    }
    return 0;
}

static int det_setup(ps_worker_t *p, uint32_t nservers)
{
    const ps_worker_opts_t *o = p->o;
    int depth = -1;
    const det_kind_t *kind = kind_of(o->model, &depth);
    if (!kind || depth < 0) {
        ps_error("--model: unknown detector \"%s\" (%s)", o->model, ps_task_det.models);
        return PS_EINVAL;
    }
    det_t *d = calloc(1, sizeof *d);
    if (!d) return PS_ENOMEM;
    p->ts = d;
    d->kind = kind;
    d->map = d->ap50 = d->ap75 = NAN;
    d->segm_map = d->segm_ap50 = d->segm_ap75 = NAN;
    d->score_thresh = dopts(p)->score_thresh;
    int rc;
    if ((rc = det_data(p, d)) || (rc = det_model(p, d, depth)) ||
        (rc = det_table(p, d, nservers)))
        return rc;
    ps_info("model %s (%s): %zu trainable parameters in %d tensors, %u partitions on %u "
            "server(s), %d classes, %dx%d, width %d, FPN %d, freeze_at %d, backbone BN %s%s, "
            "%d anchors/image", o->model, kind->name, p->numel, d->nspecs, p->table.nparts,
            nservers, d->K, o->data.size, o->data.size, o->data.width, dopts(p)->fpn_channels,
            dopts(p)->freeze_at, *o->data.bn ? o->data.bn : "frozen",
            o->data.recompute ? " (stages recomputed)" : "", d->A);
    return 0;
}

/* ---- a run ------------------------------------------------------------------- */

/* The training loader, sharded by the rank now known. */
static int det_start(ps_worker_t *p)
{
    det_t *d = p->ts;
    char err[1024];
    d->topt.rank = p->rank;
    d->topt.world = p->nworkers;
    if (ps_det_loader_new(d->train, &d->topt, d->anchors, d->A, &d->tl, err, sizeof err) ||
        ps_det_batch_alloc(d->tl, &d->tb)) {
        ps_error("training loader: %s", err);
        return PS_EINVAL;
    }
    if (ps_det_loader_batches(d->tl) == 0) {
        ps_error("%s: %zu images with boxes are fewer than one global batch of %d x %d",
                 dopts(p)->train_json, ps_det_dataset_size(d->train), p->nworkers, p->batch);
        return PS_EINVAL;
    }
    ps_info("epoch = %zu steps (%zu images per rank)", ps_det_loader_batches(d->tl),
            ps_det_loader_samples(d->tl));
    const char *cols = d->kind->detect_masks
                           ? "iteration,epoch,map,ap50,ap75,images,segm_map,segm_ap50,segm_ap75"
                           : "iteration,epoch,map,ap50,ap75,images";
    return d->val ? ps_worker_val_csv_open(p, cols, &d->val_csv) : 0;
}

static void scatter(ps_worker_t *p)
{
    det_t *d = p->ts;
    int np;
    const ps_model_param_t *par = d->kind->params(d->m, &np);
    size_t off = 0;
    for (int i = 0; i < d->nspecs; i++) {
        memcpy(par[d->param_of[i]].w, p->w + off, sizeof(float) * d->specs[i].numel);
        off += d->specs[i].numel;
    }
}

/* The model's gradients -> p->grad, clipped to --clip-grad: a worker-local
 * clip_grad_norm_ (without BN in the backbone, frozen at identity when
 * training from scratch, an early large step can diverge; the servers then
 * average clipped gradients). */
static void gather(ps_worker_t *p)
{
    det_t *d = p->ts;
    int np;
    const ps_model_param_t *par = d->kind->params(d->m, &np);
    size_t off = 0;
    for (int i = 0; i < d->nspecs; i++) {
        memcpy(p->grad + off, par[d->param_of[i]].g, sizeof(float) * d->specs[i].numel);
        off += d->specs[i].numel;
    }
    float clip = dopts(p)->clip_grad;
    if (clip > 0) {
        double sq = 0;
        for (size_t i = 0; i < p->numel; i++) sq += (double)p->grad[i] * p->grad[i];
        float f = ps_optim_clip_factor(sq, clip);
        if (f < 1)
            for (size_t i = 0; i < p->numel; i++) p->grad[i] *= f;
    }
}

static double det_compute(ps_worker_t *p, uint64_t step)
{
    det_t *d = p->ts;
    size_t bpe = ps_det_loader_batches(d->tl);
    uint64_t epoch = step / bpe;
    size_t b = (size_t)(step % bpe);
    if (ps_det_loader_epoch(d->tl) != epoch || ps_det_loader_position(d->tl) != b)
        ps_det_loader_seek(d->tl, epoch, b);
    int n = ps_det_loader_next(d->tl, &d->tb, &p->t_data);
    if (n != p->batch) {
        ps_error("training data: %s", n < 0 ? ps_det_loader_error(d->tl) : "short batch");
        p->compute_rc = n < 0 ? n : PS_ESTATE;
        return NAN;
    }
    scatter(p);
    float loss = NAN;
    d->kind->zero_grad(d->m);
    /* the two-stage row's sampling: a pure function of (--seed, step, rank) */
    uint64_t seed = p->o->seed ^ (0x9E3779B97F4A7C15ull * (step + 1)) ^
                    (0xBF58476D1CE4E5B9ull * (uint64_t)(p->rank + 1));
    int rc = d->kind->train(d->m, &d->tb, n, seed, &loss);
    if (!rc) rc = d->be->sync(&d->ctx); /* before the host reads the gradients */
    if (rc) {
        ps_error("forward/backward failed at step %llu: %s", (unsigned long long)step,
                 ps_strerror(rc));
        p->compute_rc = rc;
        return NAN;
    }
    gather(p);
    return (double)loss;
}

static int image_dets(det_t *d, int i, const ps_det_geom_t *g, int64_t image_id,
                      const ps_det_dataset_t *ds, ps_coco_det_t *out, ps_rle_t *masks,
                      float *boxes, float *scores, int32_t *labels)
{
    int n = d->kind->detect(d->m, i, g, d->score_thresh, boxes, scores, labels);
    if (n < 0) return n;
    int rc = masks ? d->kind->detect_masks(d->m, i, g, n, boxes, masks) : 0;
    if (rc) return rc;
    float sx = (float)g->w / g->orig_w, sy = (float)g->h / g->orig_h;
    for (int k = 0; k < n; k++) {
        float x1 = boxes[4 * k], x2 = boxes[4 * k + 2];
        if (g->flip) {
            float t = (float)g->w - x2;
            x2 = (float)g->w - x1;
            x1 = t;
        }
        out[k].image_id = image_id;
        out[k].category_id = ps_det_dataset_class_cat(ds, labels[k]);
        out[k].bbox[0] = x1 / sx;
        out[k].bbox[1] = boxes[4 * k + 1] / sy;
        out[k].bbox[2] = (x2 - x1) / sx;
        out[k].bbox[3] = (boxes[4 * k + 3] - boxes[4 * k + 1]) / sy;
        out[k].score = scores[k];
    }
    return n;
}

/* COCO evaluation of p->w on --val-json: 0 and d->map / ap50 / ap75, or PS_E*. */
static int det_eval(ps_worker_t *p)
{
    det_t *d = p->ts;
    char err[1024];
    if (!d->val) return PS_EINVAL;
    double t0 = ps_worker_now();
    if (!d->vl) {
        if (ps_det_loader_new(d->val, &d->vopt, d->anchors, d->A, &d->vl, err,
                              sizeof err) || ps_det_batch_alloc(d->vl, &d->vb)) {
            ps_error("validation loader: %s", err);
            return PS_EINVAL;
        }
    }
    scatter(p);
    ps_det_loader_seek(d->vl, 0, 0);
    size_t N = ps_det_dataset_size(d->val), ndet = 0;
    ps_coco_det_t *dets = malloc(sizeof *dets * (N * DET_MAX_DETECTIONS + 1));
    /* Mask R-CNN: each detection's mask at its image's size */
    ps_rle_t *masks = d->kind->detect_masks
                          ? calloc(N * DET_MAX_DETECTIONS + 1, sizeof *masks)
                          : NULL;
    float *boxes = malloc(sizeof(float) * 4 * DET_MAX_DETECTIONS);
    float *scores = malloc(sizeof(float) * DET_MAX_DETECTIONS);
    int32_t *labels = malloc(sizeof(int32_t) * DET_MAX_DETECTIONS);
    int n = 0, rc = 0;
    d->val_images = 0;
    d->val_dets = 0;
    int nomem = !dets || !boxes || !scores || !labels || (d->kind->detect_masks && !masks);
    while (!nomem && (n = ps_det_loader_next(d->vl, &d->vb, NULL)) > 0) {
        if ((rc = d->kind->infer(d->m, &d->vb, n)) ||
            (rc = d->be->sync(&d->ctx))) /* the host reads the outputs next */
            break;
        for (int i = 0; i < n && !rc; i++) {
            int k = image_dets(d, i, &d->vb.geom[i], ps_det_dataset_image_id(d->val, (size_t)d->vb.idx[i]),
                               d->val, dets + ndet, masks ? masks + ndet : NULL, boxes, scores,
                               labels);
            if (k < 0) rc = k;
            else ndet += (size_t)k;
        }
        d->val_images += (size_t)n;
    }
    d->val_dets = ndet;
    if (nomem) rc = PS_ENOMEM;
    if (n < 0) {
        ps_error("validation data: %s", ps_det_loader_error(d->vl));
        rc = n;
    }
    /* --predictions: the results file pycocotools' loadRes reads */
    if (!rc && *p->o->data.predictions)
        if ((rc = ps_coco_save_results(dets, masks, (int)ndet, p->o->data.predictions, err,
                                       sizeof err)))
            ps_error("--predictions: %s", err);
    ps_coco_eval_result_t res;
    if (!rc && !(rc = ps_coco_evaluate(&res, ps_det_dataset_coco(d->val), dets, (int)ndet))) {
        d->map = res.stats[PS_COCO_AP];
        d->ap50 = res.stats[PS_COCO_AP50];
        d->ap75 = res.stats[PS_COCO_AP75];
        if (ps_log_level >= PS_LOG_DEBUG) {
            char buf[2048];
            ps_coco_eval_format(&res, buf, sizeof buf);
            ps_debug("COCO evaluation:\n%s", buf);
        }
        ps_coco_eval_free(&res);
    }
    if (!rc && masks &&
        !(rc = ps_coco_evaluate_segm(&res, ps_det_dataset_coco(d->val), dets, masks, (int)ndet))) {
        d->segm_map = res.stats[PS_COCO_AP];
        d->segm_ap50 = res.stats[PS_COCO_AP50];
        d->segm_ap75 = res.stats[PS_COCO_AP75];
        ps_coco_eval_free(&res);
    }
    for (size_t k = 0; masks && k < ndet; k++) ps_rle_free(&masks[k]);
    free(dets), free(masks), free(boxes), free(scores), free(labels);
    d->eval_s = ps_worker_now() - t0;
    if (rc) ps_error("validation failed: %s", ps_strerror(rc));
    return rc;
}


static double epochs_of(const ps_worker_t *p, uint64_t steps);

/* " segm_map=... segm_ap50=... segm_ap75=..." of a model with masks, else "" */
static const char *segm_keys(const det_t *d, char *buf, size_t len)
{
    buf[0] = 0;
    if (d->kind->detect_masks)
        snprintf(buf, len, " segm_map=%.4f segm_ap50=%.4f segm_ap75=%.4f", d->segm_map,
                 d->segm_ap50, d->segm_ap75);
    return buf;
}

static void val_csv_row(ps_worker_t *p, uint64_t step)
{
    det_t *d = p->ts;
    if (!d->val_csv) return;
    fprintf(d->val_csv, "%llu,%.3f,%.4f,%.4f,%.4f,%zu", (unsigned long long)step,
            epochs_of(p, step), d->map, d->ap50, d->ap75, d->val_images);
    if (d->kind->detect_masks)
        fprintf(d->val_csv, ",%.4f,%.4f,%.4f", d->segm_map, d->segm_ap50, d->segm_ap75);
    fprintf(d->val_csv, "\n");
}

static int det_validate(ps_worker_t *p, uint64_t step)
{
    det_t *d = p->ts;
    if (!ps_worker_val_due(p, step) || !d->val) return 0;
    /* rank 0 alone validates; the others wait at the cluster loop's barrier */
    if (p->rank != 0) return 1;
    if (det_eval(p)) return 1;
    char sk[128];
    printf("val: iter=%llu images=%zu map=%.4f ap50=%.4f ap75=%.4f%s eval_s=%.1f\n",
           (unsigned long long)step, d->val_images, d->map, d->ap50, d->ap75,
           segm_keys(d, sk, sizeof sk), d->eval_s);
    fflush(stdout);
    val_csv_row(p, step);
    return 1;
}

static int det_save(ps_worker_t *p, const char *path)
{
    det_t *d = p->ts;
    scatter(p);
    return d->kind->save(d->m, path);
}

static double epochs_of(const ps_worker_t *p, uint64_t steps)
{
    const det_t *d = p->ts;
    size_t bpe = d->tl ? ps_det_loader_batches(d->tl) : 0;
    return bpe ? (double)steps / (double)bpe : 0;
}

static void det_print_final(ps_worker_t *p, uint64_t steps_done)
{
    const ps_worker_stats_t *s = &p->st;
    det_t *d = p->ts;
    double ms = 1e3 / (s->counted ? (double)s->counted : 1.0);
    d->eval_s = 0;
    if (p->rank == 0 && d->val && !det_eval(p)) /* rank 0 only: the others would repeat it */
        val_csv_row(p, steps_done);
    double ips = ps_worker_per_s(p);
    char sk[128];
    printf("final: rank=%d workers=%d model=%s steps=%llu epochs=%.2f batch=%d loss=%.6f "
           "map=%.4f ap50=%.4f ap75=%.4f%s val_images=%zu detections=%zu images_per_s=%.2f "
           "cluster_images_per_s=%.2f step_ms=%.1f data_wait_ms=%.1f compute_ms=%.1f "
           "comm_wait_ms=%.1f skipped=%zu eval_s=%.1f wall_s=%.1f",
           p->rank, p->nworkers, p->o->model, (unsigned long long)steps_done,
           epochs_of(p, steps_done), p->batch, ps_worker_recent_loss(p), d->map, d->ap50,
           d->ap75, segm_keys(d, sk, sizeof sk), d->val_images, d->val_dets, ips, ips * p->nworkers, s->sum_step * ms,
           s->sum_data * ms, s->sum_compute * ms, s->sum_comm * ms,
           d->tl ? ps_det_loader_skipped(d->tl) : (size_t)0, d->eval_s,
           ps_worker_now() - s->t_start);
    printf(" bn=%s", *p->o->data.bn ? p->o->data.bn : "frozen");
    if (p->bn_cross) printf(" bn_exchanges=%llu", (unsigned long long)p->bn_group.gathers);
    ps_worker_print_out(p);
    printf("\n");
    fflush(stdout);
}

/* --eval: COCO evaluation of --weights on --val-json (p->w holds the
 * loaded weights: setup copied them). */
static int det_run_eval(ps_worker_t *p)
{
    int rc = det_eval(p);
    if (rc) return rc;
    det_t *d = p->ts;
    char sk[128];
    printf("final: model=%s weights=%s images=%zu detections=%zu map=%.4f ap50=%.4f ap75=%.4f%s "
           "images_per_s=%.2f wall_s=%.1f\n", p->o->model, p->o->data.weights, d->val_images,
           d->val_dets, d->map, d->ap50, d->ap75, segm_keys(d, sk, sizeof sk),
           d->eval_s > 0 ? (double)d->val_images / d->eval_s : 0, d->eval_s);
    fflush(stdout);
    return 0;
}

/* --export-onnx: the detector as setup left it (p->w: --weights or the init). */
static int det_export(ps_worker_t *p, const char *path)
{
    det_t *d = p->ts;
    scatter(p);
    if (d->be) d->be->sync(&d->ctx);
    return d->kind->export_onnx(d->m, path); /* checked non-NULL with the options */
}

static void det_teardown(ps_worker_t *p)
{
    det_t *d = p->ts;
    if (!d) return;
    ps_det_loader_destroy(&d->tl);
    ps_det_loader_destroy(&d->vl);
    ps_det_batch_free(&d->tb);
    ps_det_batch_free(&d->vb);
    ps_det_dataset_free(&d->train);
    ps_det_dataset_free(&d->val);
    if (d->val_csv) fclose(d->val_csv);
    if (d->be) d->be->sync(&d->ctx);
    if (d->kind) d->kind->destroy(&d->m);
    if (d->be) d->be->release(&d->ctx);
    ps_ctx_free(&d->ctx);
    free(d->anchors), free(d->specs), free(d->param_of);
    free(d);
    p->ts = NULL;
    p->be = NULL;
    p->ctx = NULL;
}

/* --overlap: the detector's tables and hooks, unless --clip-grad rescales
 * the whole gradient after backward (a partition pushed during backward
 * would leave unclipped). */
static int det_hooks(ps_worker_t *p, ps_model_hookable_t *h, const char **why)
{
    det_t *d = p->ts;
    if (dopts(p)->clip_grad > 0) {
        *why = "--clip-grad scales the whole gradient once backward is over";
        return 0;
    }
    d->kind->hookable(d->m, h);
    return 1;
}

const ps_task_t ps_task_det = {
    .name = "detection",
    .models = "retinanet-r18|34|50, fasterrcnn-r18|34|50, maskrcnn-r18|34|50, cascade-r18|34|50",
    .unit = "images",
    .opts_size = sizeof(det_opts_t),
    .claims = det_claims,
    .opt_rows = det_rows,
    .check = det_check,
    .setup = det_setup,
    .start = det_start,
    .compute = det_compute,
    .validate = det_validate,
    .save = det_save,
    .print_final = det_print_final,
    .eval = det_run_eval,
    .export_onnx = det_export,
    .hooks = det_hooks,
    .teardown = det_teardown,
};
