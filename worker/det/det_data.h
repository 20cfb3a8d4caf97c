/* Detection data pipeline: COCO JSON + JPEG images -> fixed-size
 * network inputs and RetinaNet training targets.
 *
 * A sample (ps_det_load_sample) is a pure function of (dataset, options,
 * epoch, index), as the video pipeline's (worker/data/ps_video.h):
 *   - decode the JPEG (libjpeg-turbo, worker/data/ps_image.h); its size must
 *     be the one the JSON gives;
 *   - resize (PIL bilinear) with scale = min(min_size / shorter side,
 *     max_size / longer side) (torchvision GeneralizedRCNNTransform /
 *     Detectron: shorter side to min_size, longer side capped at max_size);
 *   - training with flip on: mirror horizontally when below(2) == 1 of the
 *     stream ps_vrng_sample(seed, epoch, index) (boxes mirrored with it:
 *     x1' = w' - x2, x2' = w' - x1 in the resized image);
 *   - ImageNet normalisation ((v/255 - mean) / std), then zero padding on
 *     the right and bottom to size x size (static shapes; zero is the mean
 *     colour after normalisation, as torchvision pads the normalised batch);
 *   - training: anchor assignment on the CPU (ps_det_assign, IoU >= 0.5
 *     positive, < 0.4 negative, between ignored) and the targets
 *     (ps_det_make_targets): labels (A) and encoded box deltas (A, 4), when
 *     the model has anchors (RetinaNet);
 *   - training: the instances (ps_det_sample_instances) for models that
 *     match their own proposals (Faster / Mask R-CNN): each non-crowd box
 *     with w, h > 0, in input pixels after resize and flip, its class and,
 *     with masks on, its mask at the input size (the segmentation at the
 *     image's size, resized and mirrored as torchvision resizes target
 *     masks: det_masks.h; zero in the padding), at most max_instances of
 *     them per image, a bound fixed when the loader is made (so a batch's
 *     memory is batch * max_instances * (size^2 + 20) bytes).
 *
 * Categories: the JSON's category ids, ascending, become classes 0..K-1.
 * Crowd boxes are left out of training targets (as torchvision's RetinaNet,
 * which has no crowd handling); evaluation keeps them (COCO ignores them).
 *
 * Bad input: malformed JSON, duplicate ids, unknown image / category ids,
 * boxes outside the image and malformed segmentations are errors naming
 * the file and the record (coco_json.h) -- or, with skip_bad, the record is
 * skipped and counted.  With masks on, a training instance without a
 * segmentation, or an image with more instances than max_instances, fails
 * the loader's creation, naming it.  An
 * unreadable or corrupt image, or one whose size disagrees with the JSON, is
 * an error of the batch -- or, with skip_bad, the next image in dataset
 * order stands in (counted, warned).  Training never sees images without
 * boxes: they are left out of the training index at load (counted).
 *
 * Ranks: rank r of W reads the indices PyTorch's DistributedSampler gives it
 * (ps_video_sampler_indices: same permutation rule, padding, drop_last).
 */
#ifndef PS_DET_DATA_H
#define PS_DET_DATA_H
#include <stddef.h>
#include <stdint.h>

#include "worker/det/coco_json.h"

typedef struct ps_det_dataset ps_det_dataset_t;

/* Loads the annotations at json; image i is image_root/file_name.  train:
 * the index holds only images with at least one non-crowd box.  skip_bad:
 * lenient JSON (bad records skipped, counted).  Returns 0 or PS_E* (err). */
int ps_det_dataset_load(ps_det_dataset_t **out, const char *json, const char *image_root,
                        int train, int skip_bad, char *err, size_t errlen);
void ps_det_dataset_free(ps_det_dataset_t **ds);
/* Samples in the index (training: images with boxes). */
size_t ps_det_dataset_size(const ps_det_dataset_t *ds);
int ps_det_dataset_num_classes(const ps_det_dataset_t *ds);
/* COCO category id of class k (0..K-1). */
int64_t ps_det_dataset_class_cat(const ps_det_dataset_t *ds, int k);
/* COCO image id of sample i (0..size-1). */
int64_t ps_det_dataset_image_id(const ps_det_dataset_t *ds, size_t i);
/* The ground truth as loaded (indexed; for ps_coco_evaluate). */
const ps_coco_t *ps_det_dataset_coco(const ps_det_dataset_t *ds);
/* Counts: images left out for having no boxes; records skipped by the
 * lenient JSON reader (images + annotations). */
size_t ps_det_dataset_skipped_empty(const ps_det_dataset_t *ds);
size_t ps_det_dataset_skipped_records(const ps_det_dataset_t *ds);
/* Training instances (non-crowd boxes with w, h > 0) of sample i, and the
 * most any sample in the index has. */
int ps_det_dataset_instances(const ps_det_dataset_t *ds, size_t i);
int ps_det_dataset_max_instances(const ps_det_dataset_t *ds);
/* The first training instance without a segmentation, or NULL. */
const ps_coco_ann_t *ps_det_dataset_unmasked(const ps_det_dataset_t *ds);

typedef struct ps_det_data_opts {
    int size;          /* network input H = W (padded), 32..4096 */
    int min_size;      /* shorter side target (0 = size) */
    int max_size;      /* longer side cap (0 = size; <= size) */
    int train;         /* 1: flip (if on) and training targets */
    int flip;          /* training horizontal flip */
    float fg_iou, bg_iou;  /* 0.5, 0.4 */
    uint64_t seed;
    int rank, world;   /* DistributedSampler */
    int batch;         /* samples per batch on this rank */
    int shuffle;       /* -1: = train */
    int drop_last;     /* -1: = train */
    int threads;       /* loader threads (0: decode in ps_det_loader_next) */
    int prefetch;      /* batches decoded ahead (>= 1) */
    int skip_bad;      /* a bad image is replaced by the next one (counted) */
    int instances;     /* training: the instances in the batch (ps_det_batch_t gt_*) */
    int masks;         /* training: and their masks (implies instances) */
    int max_instances; /* per image (0 = the dataset's most; a sample with more fails) */
} ps_det_data_opts_t;

void ps_det_data_opts_default(ps_det_data_opts_t *o);
int ps_det_data_opts_check(const ps_det_data_opts_t *o, char *err, size_t errlen);

/* Where a sample's image went: resized to w x h (before padding) with
 * scale = w / original width, flipped or not.  Detections in network pixels
 * map back by x / scale (after un-flipping). */
typedef struct ps_det_geom {
    float scale;
    int w, h;          /* resized image inside the padded input */
    int orig_w, orig_h;
    int flip;
} ps_det_geom_t;

/* One sample: img (3*size*size floats); with labels / box_targets (A and
 * A*4, training) the targets for the A anchors (A x 4, ps_retina_anchors).
 * npos (may be NULL): positive anchors.  Returns 0 or PS_E* (err names the
 * file). */
int ps_det_load_sample(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o,
                       const float *anchors, int A, uint64_t epoch, size_t index, float *img,
                       int32_t *labels, float *box_targets, ps_det_geom_t *geom, int *npos,
                       char *err, size_t errlen);

/* The training instances of sample `index` placed as geom says (from
 * ps_det_load_sample): boxes (max_inst, 4) x1 y1 x2 y2 and classes
 * (max_inst) 0..K-1 in file order and, when masks is not NULL, their masks
 * (max_inst, size, size) 0/1.  Returns the count or PS_E* (err names the
 * image or annotation): PS_ERANGE when the image has more than max_inst,
 * PS_EINVAL when a mask is asked for an instance without segmentation. */
int ps_det_sample_instances(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o, size_t index,
                            const ps_det_geom_t *geom, float *boxes, int32_t *classes,
                            uint8_t *masks, int max_inst, char *err, size_t errlen);

/* ---- loader: threads with a bounded prefetch queue (video_loader.c's
 * scheme: batch b goes to slot b % prefetch, claimed only while b <
 * consumed + prefetch; output identical for any thread count). */
typedef struct ps_det_loader ps_det_loader_t;

typedef struct ps_det_batch {
    float *img;          /* (batch, 3, size, size) */
    int32_t *labels;     /* (batch, A) training with anchors (A > 0), else NULL */
    float *box_targets;  /* (batch, A, 4) training with anchors, else NULL */
    int max_inst;        /* instances held per image (0 without instances) */
    float *gt_boxes;     /* (batch, max_inst, 4) x1 y1 x2 y2, input pixels */
    int32_t *gt_classes; /* (batch, max_inst) 0..K-1 */
    int32_t *gt_count;   /* (batch) instances of each image (the slots after them are 0) */
    uint8_t *gt_masks;   /* (batch, max_inst, size, size) 0/1 with masks, else NULL */
    int64_t *idx;        /* (batch) dataset index of each sample */
    ps_det_geom_t *geom; /* (batch) */
    int npos;            /* positive anchors in the batch */
} ps_det_batch_t;

/* anchors (A x 4) must outlive the loader (A = 0, anchors NULL: no anchor
 * targets).  With instances on, fails (err names the sample, or the
 * annotation) when an image holds more than max_instances or, with masks,
 * an instance has no segmentation. */
int ps_det_loader_new(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o,
                      const float *anchors, int A, ps_det_loader_t **out, char *err,
                      size_t errlen);
void ps_det_loader_destroy(ps_det_loader_t **ld);
/* Allocates / frees a batch's buffers for this loader's shapes. */
int ps_det_batch_alloc(const ps_det_loader_t *ld, ps_det_batch_t *b);
void ps_det_batch_free(ps_det_batch_t *b);
/* Restart at batch `batch` of `epoch`. */
int ps_det_loader_seek(ps_det_loader_t *ld, uint64_t epoch, size_t batch);
/* Next batch into b: returns the number of samples (0 at the end of the
 * epoch) or PS_E* (ps_det_loader_error says why).  wait_s (may be NULL):
 * seconds spent waiting. */
int ps_det_loader_next(ps_det_loader_t *ld, ps_det_batch_t *b, double *wait_s);
size_t ps_det_loader_batches(const ps_det_loader_t *ld);
uint64_t ps_det_loader_epoch(const ps_det_loader_t *ld);
size_t ps_det_loader_position(const ps_det_loader_t *ld);
size_t ps_det_loader_samples(const ps_det_loader_t *ld);
size_t ps_det_loader_skipped(const ps_det_loader_t *ld);
const char *ps_det_loader_error(const ps_det_loader_t *ld);

#endif
