/* psworker's detector: RetinaNet-FPN (worker/models/ps_retinanet.h) fed by
 * the detection data pipeline (worker/det/det_data.h), trained by the same
 * cluster / standalone loops as every other model.  As for the video models
 * (psworker_video.c) the trainable tensors live in one flat vector in model
 * order (p->w, p->grad), copied into / out of the model's tables around
 * each step.
 *
 * Data: rank r of W reads DistributedSampler's share, B images per step;
 * step s is batch s % bpe of epoch s / bpe.  The anchor assignment runs in
 * the loader threads.  Each rank normalises its losses by the positives of
 * its own B images (Detectron / SimpleDet per-GPU normalisation); the
 * servers average the W gradients.
 *
 * Validation (rank 0): the whole --val-json through the inference
 * post-processing (ps_det_postprocess: score > 0.05, top 1000 per level,
 * class-wise NMS 0.5, 100 per image), boxes mapped back to the original
 * image, then the COCO evaluator (coco_eval.h): AP, AP50, AP75.
 *
 * --device cuda[:N] (CUDA builds): the CUDA backend (its detection layers
 * included) with the model's arenas in managed memory, as for the video
 * models (psworker_video.c); every layer is queued on the backend's
 * stream, so the backend's sync comes before the host reads gradients or
 * outputs (the two losses come back by value, already waited for).  The
 * loaders read a host copy of the anchors, never the arena. */
#include "worker/psworker/psworker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/det/coco_eval.h"
#include "worker/det/det_boxes.h"
#include "worker/det/det_data.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/ps_retinanet.h"

struct ps_worker_det {
    ps_ctx_t ctx;
    ps_retina_t *m;
    ps_det_dataset_t *train, *val;
    ps_det_loader_t *tl, *vl;
    ps_det_data_opts_t topt, vopt;
    ps_det_batch_t tb, vb;
    ps_tensor_spec_t *specs;
    int nspecs, *param_of, A, K;
    double map, ap50, ap75, eval_s;
    size_t val_images, val_dets;  /* last validation: images, detections kept */
    float score_thresh;
    float *anchors;               /* (A, 4) host copy for the loader threads */
    const ps_backend_t *be;       /* the --device's table (ps_engine_open_device) */
};

int ps_worker_is_det(const ps_worker_opts_t *o) { return !strncmp(o->model, "retinanet-r", 11); }

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

static void data_opts(const ps_worker_opts_t *o, ps_det_data_opts_t *d, int train, int batch)
{
    ps_det_data_opts_default(d);
    d->size = o->size;
    d->train = train;
    d->flip = train && o->flip;
    d->seed = o->data_seed;
    d->batch = batch;
    d->threads = o->loader_threads;
    d->prefetch = o->prefetch;
    d->skip_bad = o->skip_bad;
}

int ps_worker_det_setup(ps_worker_t *p, uint32_t nservers)
{
    const ps_worker_opts_t *o = p->o;
    char *end;
    long depth = strtol(o->model + 11, &end, 10);
    if (*end || (depth != 18 && depth != 34 && depth != 50)) {
        ps_error("--model: unknown detector \"%s\" (retinanet-r18|34|50)", o->model);
        return PS_EINVAL;
    }
    if (strcmp(o->precision, "fp32")) {
        /* its losses have no loss scaling: fp16 gradients would underflow */
        ps_error("--precision %s: the detector trains in fp32 only for now", o->precision);
        return PS_EINVAL;
    }
    if (!o->eval && !*o->train_json) {
        ps_error("--model %s needs --train-json (COCO annotations) and --root (their images)",
                 o->model);
        return PS_EINVAL;
    }
    if (o->eval && !*o->val_json) {
        ps_error("--eval of a detector needs --val-json and --val-root");
        return PS_EINVAL;
    }
    if (o->fpn_channels < 8 || o->fpn_channels > 1024 || o->freeze_at < 0 || o->freeze_at > 5 ||
        !(o->score_thresh >= 0 && o->score_thresh < 1) || !(o->clip_grad >= 0)) {
        ps_error("--fpn-channels must be in 8..1024, --freeze-at in 0..5, --score-thresh in "
                 "[0, 1), --clip-grad >= 0");
        return PS_EINVAL;
    }
    struct ps_worker_det *d = calloc(1, sizeof *d);
    if (!d) return PS_ENOMEM;
    d->be = &ps_backend_cpu; /* until --device is open */
    p->det = d;
    d->map = d->ap50 = d->ap75 = NAN;
    d->score_thresh = o->score_thresh;
    int rc;
    if (!o->eval && (rc = load_set(o->train_json, o->root, 1, o->skip_bad, &d->train))) return rc;
    if (*o->val_json && (rc = load_set(o->val_json, *o->val_root ? o->val_root : o->root, 0,
                                       o->skip_bad, &d->val)))
        return rc;
    d->K = o->num_classes;
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
    int vbatch = o->val_batch > 0 ? o->val_batch : p->batch;
    data_opts(o, &d->topt, 1, p->batch);
    data_opts(o, &d->vopt, 0, vbatch);
    char err[512];
    if (ps_det_data_opts_check(&d->topt, err, sizeof err)) {
        ps_error("data options: %s", err);
        return PS_EINVAL;
    }
    ps_retina_config_t cfg;
    ps_retina_config_default(&cfg);
    cfg.depth = (int)depth;
    cfg.num_classes = d->K;
    cfg.width = o->width;
    cfg.fpn_channels = o->fpn_channels;
    cfg.freeze_at = o->freeze_at;
    if ((rc = ps_engine_init(&d->ctx, o->threads)) < 0) {
        ps_error("engine init failed: %s", ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_worker_open_device(o, &d->ctx, &d->be))) return rc;
    int maxn = p->batch > vbatch ? p->batch : vbatch;
    if ((rc = ps_retina_create(&d->m, &cfg, d->be, &d->ctx, maxn, o->size, o->size)))
        return rc;
    ps_retina_init(d->m, o->seed, 0);
    if (*o->weights) {
        if ((rc = ps_retina_load(d->m, o->weights))) return rc;
        ps_info("weights loaded from %s", o->weights);
    }
    d->A = ps_retina_num_anchors(d->m);
    d->anchors = malloc(sizeof(float) * 4 * (size_t)d->A);
    if (!d->anchors) return PS_ENOMEM;
    memcpy(d->anchors, ps_retina_anchors(d->m), sizeof(float) * 4 * (size_t)d->A);
    d->nspecs = ps_retina_tensor_specs(d->m, &d->specs);
    if (d->nspecs < 0) return d->nspecs;
    rc = ps_partition_table_build(&p->table, d->specs, (uint32_t)d->nspecs,
                                  (size_t)o->partition_bytes, nservers);
    if (rc) {
        ps_error("cannot build the partition table: %s", ps_strerror(rc));
        return rc;
    }
    d->param_of = malloc(sizeof(int) * (size_t)d->nspecs);
    p->numel = 0;
    for (int i = 0; i < d->nspecs; i++) p->numel += d->specs[i].numel;
    p->w = calloc(p->numel, sizeof(float));
    p->grad = calloc(p->numel, sizeof(float));
    p->mom = o->standalone ? calloc(p->numel, sizeof(float)) : NULL;
    if (!d->param_of || !p->w || !p->grad || (o->standalone && !p->mom)) {
        ps_error("out of memory for the %s model", o->model);
        return PS_ENOMEM;
    }
    int np;
    const ps_model_param_t *par = ps_retina_params(d->m, &np);
    size_t off = 0;
    for (int i = 0; i < d->nspecs; i++) {
        d->param_of[i] = ps_retina_find_param(d->m, d->specs[i].name);
        if (d->param_of[i] < 0 || par[d->param_of[i]].numel != d->specs[i].numel) {
            ps_error("model table mismatch at %s", d->specs[i].name);
            return PS_EMISMATCH;
        }
        memcpy(p->w + off, par[d->param_of[i]].w, sizeof(float) * d->specs[i].numel);
        off += d->specs[i].numel;
    }
    ps_info("model %s: %zu trainable parameters in %d tensors, %u partitions on %u server(s), "
            "%d classes, %dx%d, width %d, FPN %d, freeze_at %d, %d anchors/image", o->model,
            p->numel, d->nspecs, p->table.nparts, nservers, d->K, o->size, o->size, o->width,
            o->fpn_channels, o->freeze_at, d->A);
    return 0;
}

int ps_worker_det_groups(ps_worker_t *p)
{
    int n = ps_retina_groups(p->det->m, p->optim.groups, PS_OPTIM_MAX_GROUPS);
    if (n < 0) return n;
    p->optim.ngroups = n;
    return 0;
}

void ps_worker_det_teardown(ps_worker_t *p)
{
    struct ps_worker_det *d = p->det;
    if (!d) return;
    ps_det_loader_destroy(&d->tl);
    ps_det_loader_destroy(&d->vl);
    ps_det_batch_free(&d->tb);
    ps_det_batch_free(&d->vb);
    ps_det_dataset_free(&d->train);
    ps_det_dataset_free(&d->val);
    d->be->sync(&d->ctx);
    ps_retina_destroy(&d->m);
    d->be->release(&d->ctx);
    ps_ctx_free(&d->ctx);
    free(d->anchors);
    free(d->specs);
    free(d->param_of);
    free(d);
    p->det = NULL;
}

static void scatter(ps_worker_t *p)
{
    struct ps_worker_det *d = p->det;
    int np;
    const ps_model_param_t *par = ps_retina_params(d->m, &np);
    size_t off = 0;
    for (int i = 0; i < d->nspecs; i++) {
        memcpy(par[d->param_of[i]].w, p->w + off, sizeof(float) * d->specs[i].numel);
        off += d->specs[i].numel;
    }
}

double ps_worker_det_compute(ps_worker_t *p, uint64_t step)
{
    struct ps_worker_det *d = p->det;
    p->t_data = 0;
    if (!d->tl) {
        /* created on first use: the rank is known only after HELLO */
        char err[1024];
        d->topt.rank = p->rank;
        d->topt.world = p->nworkers;
        if (ps_det_loader_new(d->train, &d->topt, d->anchors, d->A, &d->tl, err,
                              sizeof err) || ps_det_batch_alloc(d->tl, &d->tb)) {
            ps_error("training loader: %s", err);
            p->compute_rc = PS_EINVAL;
            return NAN;
        }
        if (ps_det_loader_batches(d->tl) == 0) {
            ps_error("%s: %zu images with boxes are fewer than one global batch of %d x %d",
                     p->o->train_json, ps_det_dataset_size(d->train), p->nworkers, p->batch);
            p->compute_rc = PS_EINVAL;
            return NAN;
        }
        ps_info("epoch = %zu steps (%zu images per rank)", ps_det_loader_batches(d->tl),
                ps_det_loader_samples(d->tl));
    }
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
    float lc = NAN, lb = NAN;
    ps_retina_zero_grad(d->m);
    int rc = ps_retina_forward(d->m, d->tb.img, n, d->tb.labels, d->tb.box_targets, 1, &lc, &lb);
    if (!rc) rc = ps_retina_backward(d->m);
    if (!rc) rc = d->be->sync(&d->ctx); /* before the host reads the gradients */
    if (rc) {
        ps_error("forward/backward failed at step %llu: %s", (unsigned long long)step,
                 ps_strerror(rc));
        p->compute_rc = rc;
        return NAN;
    }
    int np;
    const ps_model_param_t *par = ps_retina_params(d->m, &np);
    size_t off = 0;
    for (int i = 0; i < d->nspecs; i++) {
        memcpy(p->grad + off, par[d->param_of[i]].g, sizeof(float) * d->specs[i].numel);
        off += d->specs[i].numel;
    }
    if (p->o->clip_grad > 0) {
        /* Worker-local clip_grad_norm_: without BN in the backbone (frozen
         * at identity when training from scratch) an early large step can
         * diverge; the servers then average clipped gradients. */
        double sq = 0;
        for (size_t i = 0; i < p->numel; i++) sq += (double)p->grad[i] * p->grad[i];
        float f = ps_optim_clip_factor(sq, p->o->clip_grad);
        if (f < 1)
            for (size_t i = 0; i < p->numel; i++) p->grad[i] *= f;
    }
    return (double)lc + (double)lb;
}

/* Detections of image i of the last forward, in original-image pixels. */
static int image_dets(struct ps_worker_det *d, int i, const ps_det_geom_t *g, int64_t image_id,
                      const ps_det_dataset_t *ds, ps_coco_det_t *out, float *boxes,
                      float *scores, int32_t *labels)
{
    const float *lg[PS_RETINA_LEVELS], *dl[PS_RETINA_LEVELS], *an[PS_RETINA_LEVELS];
    int An[PS_RETINA_LEVELS];
    const float *L = ps_retina_cls_out(d->m), *B = ps_retina_box_out(d->m);
    const float *anchors = d->anchors;
    for (int l = 0; l < PS_RETINA_LEVELS; l++) {
        int H, W, off;
        ps_retina_level(d->m, l, &H, &W, NULL, &off);
        lg[l] = L + ((size_t)i * d->A + off) * d->K;
        dl[l] = B + ((size_t)i * d->A + off) * 4;
        an[l] = anchors + (size_t)off * 4;
        An[l] = H * W * PS_RETINA_ANCHORS;
    }
    ps_det_post_params_t pp;
    ps_det_post_defaults(&pp);
    pp.score_thresh = d->score_thresh;
    int n = ps_det_postprocess(boxes, scores, labels, lg, dl, an, An, PS_RETINA_LEVELS, d->K,
                               g->h, g->w, &pp);
    if (n < 0) return n;
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
    struct ps_worker_det *d = p->det;
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
    ps_coco_det_t *dets = malloc(sizeof *dets * (N * 100 + 1));
    float *boxes = malloc(sizeof(float) * 400), *scores = malloc(sizeof(float) * 100);
    int32_t *labels = malloc(sizeof(int32_t) * 100);
    int n = 0, rc = 0;
    d->val_images = 0;
    d->val_dets = 0;
    while (dets && boxes && scores && labels && (n = ps_det_loader_next(d->vl, &d->vb, NULL)) > 0) {
        if ((rc = ps_retina_forward(d->m, d->vb.img, n, NULL, NULL, 0, NULL, NULL)) ||
            (rc = d->be->sync(&d->ctx))) /* the host reads the outputs next */
            break;
        for (int i = 0; i < n && !rc; i++) {
            int k = image_dets(d, i, &d->vb.geom[i], ps_det_dataset_image_id(d->val, (size_t)d->vb.idx[i]),
                               d->val, dets + ndet, boxes, scores, labels);
            if (k < 0) rc = k;
            else ndet += (size_t)k;
        }
        d->val_images += (size_t)n;
    }
    d->val_dets = ndet;
    if (!dets || !boxes || !scores || !labels) rc = PS_ENOMEM;
    if (n < 0) {
        ps_error("validation data: %s", ps_det_loader_error(d->vl));
        rc = n;
    }
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
    free(dets), free(boxes), free(scores), free(labels);
    d->eval_s = ps_worker_now() - t0;
    if (rc) ps_error("validation failed: %s", ps_strerror(rc));
    return rc;
}

int ps_worker_det_maybe_validate(ps_worker_t *p, uint64_t step)
{
    int every = p->o->val_every;
    if (every <= 0 || step % (uint64_t)every != 0 || step >= p->o->steps || !p->det->val)
        return 0;
    /* rank 0 alone validates; the others wait at the caller's barrier */
    if (p->rank != 0) return 1;
    if (det_eval(p)) return 1;
    printf("val: iter=%llu images=%zu map=%.4f ap50=%.4f ap75=%.4f eval_s=%.1f\n",
           (unsigned long long)step, p->det->val_images, p->det->map, p->det->ap50,
           p->det->ap75, p->det->eval_s);
    fflush(stdout);
    return 1;
}

int ps_worker_det_save(ps_worker_t *p, const char *path)
{
    scatter(p);
    return ps_retina_save(p->det->m, path);
}

static double epochs_of(const ps_worker_t *p, uint64_t steps)
{
    size_t bpe = p->det->tl ? ps_det_loader_batches(p->det->tl) : 0;
    return bpe ? (double)steps / (double)bpe : 0;
}

void ps_worker_det_print_final(ps_worker_t *p, uint64_t steps_done)
{
    const ps_worker_stats_t *s = &p->st;
    struct ps_worker_det *d = p->det;
    uint64_t n = s->nloss < 10 ? s->nloss : 10;
    double loss = 0, ms = 1e3 / (s->counted ? (double)s->counted : 1.0);
    for (uint64_t i = 0; i < n; i++) loss += s->recent_loss[i];
    loss = n ? loss / n : NAN;
    d->eval_s = 0;
    if (p->rank == 0 && d->val) det_eval(p); /* rank 0 only: the others would repeat it */
    double ips = s->sum_step > 0 ? (double)p->batch * s->counted / s->sum_step : 0;
    printf("final: rank=%d workers=%d model=%s steps=%llu epochs=%.2f batch=%d loss=%.6f "
           "map=%.4f ap50=%.4f ap75=%.4f val_images=%zu detections=%zu images_per_s=%.2f "
           "cluster_images_per_s=%.2f step_ms=%.1f data_wait_ms=%.1f compute_ms=%.1f "
           "comm_wait_ms=%.1f skipped=%zu eval_s=%.1f wall_s=%.1f",
           p->rank, p->nworkers, p->o->model, (unsigned long long)steps_done,
           epochs_of(p, steps_done), p->batch, loss, d->map, d->ap50, d->ap75, d->val_images,
           d->val_dets, ips,
           ips * p->nworkers, s->sum_step * ms, s->sum_data * ms, s->sum_compute * ms,
           s->sum_comm * ms, d->tl ? ps_det_loader_skipped(d->tl) : (size_t)0, d->eval_s,
           ps_worker_now() - s->t_start);
    if (p->o->out && *p->o->out)
        printf(" out=%s%s", p->o->out, p->rank == 0 ? " model=model.safetensors" : "");
    printf("\n");
    fflush(stdout);
}

int ps_worker_det_run_eval(ps_worker_t *p)
{
    if (!*p->o->weights) ps_warn("--eval without --weights: evaluating the initialisation");
    int np;
    /* p->w holds the loaded weights already (setup copied them) */
    (void)ps_retina_params(p->det->m, &np);
    int rc = det_eval(p);
    if (rc) return rc;
    struct ps_worker_det *d = p->det;
    printf("final: model=%s weights=%s images=%zu detections=%zu map=%.4f ap50=%.4f ap75=%.4f "
           "images_per_s=%.2f wall_s=%.1f\n", p->o->model, p->o->weights, d->val_images,
           d->val_dets, d->map, d->ap50, d->ap75,
           d->eval_s > 0 ? (double)d->val_images / d->eval_s : 0, d->eval_s);
    fflush(stdout);
    return 0;
}
