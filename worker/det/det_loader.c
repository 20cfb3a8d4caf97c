/* Detection loader: batches through the shared prefetch ring
 * (worker/data/ps_prefetch.c), with the anchor assignment (RetinaNet) and
 * the instances and their masks (models that match their own proposals)
 * done here on the CPU, next to the JPEG decode, so the training step only
 * runs the network.  A sample is a pure function of (seed, epoch, index),
 * so any thread count gives the same batches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_prefetch.h"
#include "worker/data/ps_video.h"
#include "worker/det/det_data.h"

/* How many other images a bad sample may try before the batch fails. */
#define MAX_SUBSTITUTES 64

struct ps_det_loader {
    const ps_det_dataset_t *ds;
    ps_det_data_opts_t o;
    const float *anchors;
    int A, shuffle, drop_last;
    int inst;                   /* instances held per image (0: none) */
    /* current epoch: written only by seek, with no fill running */
    uint64_t epoch, next_epoch;
    int64_t *order;
    size_t n_order, n_batches;
    ps_prefetch_t *pf;
};

/* Sample idx into slot j of batch b: 0, or PS_E* with err set */
static int load_one(ps_det_loader_t *ld, ps_det_batch_t *b, size_t j, size_t idx, int *np,
                    char *err, size_t errlen)
{
    size_t S2 = (size_t)ld->o.size * ld->o.size;
    int32_t *lab = b->labels ? b->labels + j * (size_t)ld->A : NULL;
    float *bt = b->box_targets ? b->box_targets + j * (size_t)ld->A * 4 : NULL;
    int rc = ps_det_load_sample(ld->ds, &ld->o, ld->anchors, ld->A, ld->epoch, idx,
                                b->img + j * S2 * 3, lab, bt, &b->geom[j], np, err, errlen);
    if (rc < 0 || !ld->inst) return rc;
    size_t k = (size_t)ld->inst;
    rc = ps_det_sample_instances(ld->ds, &ld->o, idx, &b->geom[j], b->gt_boxes + j * k * 4,
                                 b->gt_classes + j * k, b->gt_masks ? b->gt_masks + j * k * S2 : NULL,
                                 ld->inst, err, errlen);
    if (rc < 0) return rc;
    b->gt_count[j] = rc;
    /* the slots past the count are zero, so a batch is a function of its samples */
    size_t used = (size_t)rc, rest = k - used;
    memset(b->gt_boxes + (j * k + used) * 4, 0, sizeof(float) * 4 * rest);
    memset(b->gt_classes + j * k + used, 0, sizeof(int32_t) * rest);
    if (b->gt_masks) memset(b->gt_masks + (j * k + used) * S2, 0, S2 * rest);
    return 0;
}

static int fill(void *payload, size_t bi, void *user, size_t *skipped, char *err, size_t errlen)
{
    ps_det_loader_t *ld = user;
    ps_det_batch_t *b = payload;
    size_t B = (size_t)ld->o.batch, first = bi * B;
    size_t n = ld->n_order - first < B ? ld->n_order - first : B;
    size_t N = ps_det_dataset_size(ld->ds);
    b->npos = 0;
    for (size_t j = 0; j < n; j++) {
        size_t idx = (size_t)ld->order[first + j];
        int np = 0;
        int rc = load_one(ld, b, j, idx, &np, err, errlen);
        /* skip mode: the next image in dataset order stands in, with its own
         * (seed, epoch, index) stream, whoever meets the bad one */
        for (int a = 0; rc < 0 && ld->o.skip_bad && a < MAX_SUBSTITUTES && (size_t)a + 1 < N; a++) {
            ps_warn("skipped: %s", err);
            (*skipped)++;
            idx = (idx + 1) % N;
            rc = load_one(ld, b, j, idx, &np, err, errlen);
        }
        if (rc < 0) return rc;
        b->idx[j] = (int64_t)idx;
        b->npos += np;
    }
    return (int)n;
}

static int payload_alloc(void **out, void *user)
{
    ps_det_batch_t *b = calloc(1, sizeof *b);
    *out = b;
    return b ? ps_det_batch_alloc(user, b) : PS_ENOMEM;
}

static void payload_free(void *payload, void *user)
{
    (void)user;
    ps_det_batch_free(payload);
    free(payload);
}

int ps_det_batch_alloc(const ps_det_loader_t *ld, ps_det_batch_t *b)
{
    size_t B = (size_t)ld->o.batch, A = (size_t)ld->A, K = (size_t)ld->inst;
    size_t S2 = (size_t)ld->o.size * ld->o.size;
    int anchors = ld->o.train && A > 0;
    memset(b, 0, sizeof *b);
    b->img = malloc(sizeof(float) * B * 3 * S2);
    b->idx = malloc(sizeof(int64_t) * B);
    b->geom = malloc(sizeof(ps_det_geom_t) * B);
    if (anchors) {
        b->labels = malloc(sizeof(int32_t) * B * A);
        b->box_targets = malloc(sizeof(float) * B * A * 4);
    }
    if (K) {
        b->max_inst = (int)K;
        b->gt_boxes = malloc(sizeof(float) * B * K * 4);
        b->gt_classes = malloc(sizeof(int32_t) * B * K);
        b->gt_count = calloc(B, sizeof(int32_t));
        if (ld->o.masks) b->gt_masks = malloc(B * K * S2);
    }
    if (!b->img || !b->idx || !b->geom || (anchors && (!b->labels || !b->box_targets)) ||
        (K && (!b->gt_boxes || !b->gt_classes || !b->gt_count || (ld->o.masks && !b->gt_masks)))) {
        ps_det_batch_free(b);
        return PS_ENOMEM;
    }
    return 0;
}

void ps_det_batch_free(ps_det_batch_t *b)
{
    free(b->img), free(b->labels), free(b->box_targets), free(b->idx), free(b->geom);
    free(b->gt_boxes), free(b->gt_classes), free(b->gt_count), free(b->gt_masks);
    memset(b, 0, sizeof *b);
}

/* The instances a batch holds per image (>= 1): max_instances, or the
 * dataset's most; fails naming the first sample with more, or (masks) the
 * first training instance without a segmentation */
static int instances_check(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o, char *err,
                           size_t errlen)
{
    int most = ps_det_dataset_max_instances(ds), k = o->max_instances ? o->max_instances : most;
    for (size_t i = 0; i < ps_det_dataset_size(ds); i++) {
        int n = ps_det_dataset_instances(ds, i);
        if (n > k)
            return ps_errf(err, errlen, "image %lld: %d instances, more than max_instances %d",
                           (long long)ps_det_dataset_image_id(ds, i), n, k), PS_ERANGE;
    }
    const ps_coco_ann_t *an = o->masks ? ps_det_dataset_unmasked(ds) : NULL;
    if (an)
        return ps_errf(err, errlen, "annotation %lld (image %lld) has no segmentation: masks "
                       "need one for every training instance", (long long)an->id,
                       (long long)an->image_id), PS_EINVAL;
    return k > 0 ? k : 1;
}

int ps_det_loader_new(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o,
                      const float *anchors, int A, ps_det_loader_t **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    int rc = ps_det_data_opts_check(o, err, errlen);
    if (rc < 0) return rc;
    if (o->train && (o->instances || o->masks) && (rc = instances_check(ds, o, err, errlen)) < 0)
        return rc;
    ps_det_loader_t *ld = calloc(1, sizeof *ld);
    if (!ld) return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    ld->ds = ds;
    ld->o = *o;
    ld->anchors = anchors;
    ld->A = A;
    ld->inst = rc; /* 0 without instances */
    ld->shuffle = o->shuffle < 0 ? o->train : o->shuffle;
    ld->drop_last = o->drop_last < 0 ? o->train : o->drop_last;
    ld->order = malloc(sizeof(int64_t) * (ps_det_dataset_size(ds) / (size_t)o->world + 2));
    if (!ld->order) {
        ps_errf(err, errlen, "out of memory");
        ps_det_loader_destroy(&ld);
        return PS_ENOMEM;
    }
    ps_prefetch_cfg_t c = { o->prefetch, o->threads, fill, payload_alloc, payload_free, ld };
    rc = ps_prefetch_new(&c, &ld->pf, err, errlen);
    if (rc < 0) {
        ps_det_loader_destroy(&ld);
        return rc;
    }
    ps_det_loader_seek(ld, 0, 0);
    *out = ld;
    return 0;
}

/* Called by the ring with no fill running. */
static size_t reposition(void *arg)
{
    ps_det_loader_t *ld = arg;
    ld->epoch = ld->next_epoch;
    ld->n_order = ps_video_sampler_indices(ps_det_dataset_size(ld->ds), ld->o.seed, ld->epoch,
                                           ld->o.rank, ld->o.world, ld->shuffle, ld->drop_last,
                                           ld->order);
    size_t B = (size_t)ld->o.batch;
    ld->n_batches = ld->drop_last ? ld->n_order / B : (ld->n_order + B - 1) / B;
    return ld->n_batches;
}

int ps_det_loader_seek(ps_det_loader_t *ld, uint64_t epoch, size_t batch)
{
    ld->next_epoch = epoch;
    ps_prefetch_seek(ld->pf, reposition, ld, batch);
    return 0;
}

static void copy_batch(const ps_det_loader_t *ld, ps_det_batch_t *dst, const ps_det_batch_t *src,
                       int n)
{
    size_t S2 = (size_t)ld->o.size * ld->o.size * 3, A = (size_t)ld->A, K = (size_t)ld->inst;
    memcpy(dst->img, src->img, sizeof(float) * S2 * (size_t)n);
    if (K) {
        memcpy(dst->gt_boxes, src->gt_boxes, sizeof(float) * 4 * K * (size_t)n);
        memcpy(dst->gt_classes, src->gt_classes, sizeof(int32_t) * K * (size_t)n);
        memcpy(dst->gt_count, src->gt_count, sizeof(int32_t) * (size_t)n);
        if (dst->gt_masks) memcpy(dst->gt_masks, src->gt_masks, S2 / 3 * K * (size_t)n);
    }
    if (dst->labels && src->labels) memcpy(dst->labels, src->labels, sizeof(int32_t) * A * (size_t)n);
    if (dst->box_targets && src->box_targets)
        memcpy(dst->box_targets, src->box_targets, sizeof(float) * 4 * A * (size_t)n);
    memcpy(dst->idx, src->idx, sizeof(int64_t) * (size_t)n);
    memcpy(dst->geom, src->geom, sizeof(ps_det_geom_t) * (size_t)n);
    dst->npos = src->npos;
}

int ps_det_loader_next(ps_det_loader_t *ld, ps_det_batch_t *b, double *wait_s)
{
    /* with no threads the caller's batch is filled in place */
    ps_det_batch_t *p;
    int n = ps_prefetch_get(ld->pf, b, (void **)&p, wait_s);
    if (n > 0) {
        if (p != b) copy_batch(ld, b, p, n);
        ps_prefetch_release(ld->pf);
    }
    return n;
}

size_t ps_det_loader_batches(const ps_det_loader_t *ld) { return ld->n_batches; }
uint64_t ps_det_loader_epoch(const ps_det_loader_t *ld) { return ld->epoch; }
size_t ps_det_loader_position(const ps_det_loader_t *ld) { return ps_prefetch_position(ld->pf); }
size_t ps_det_loader_samples(const ps_det_loader_t *ld) { return ld->n_order; }
size_t ps_det_loader_skipped(const ps_det_loader_t *ld) { return ps_prefetch_skipped(ld->pf); }
const char *ps_det_loader_error(const ps_det_loader_t *ld) { return ps_prefetch_error(ld->pf); }

void ps_det_loader_destroy(ps_det_loader_t **ldp)
{
    ps_det_loader_t *ld = *ldp;
    if (!ld) return;
    ps_prefetch_destroy(&ld->pf);
    free(ld->order);
    free(ld);
    *ldp = NULL;
}
