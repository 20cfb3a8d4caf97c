/* The video task: TSM / TSN ResNets and the 3-D video models (worker/models,
 * picked by --model from the rows of video_models.c) fed by the video data
 * pipeline (worker/data: TSN segments or dense clips).  The trainable tensors are kept as one flat
 * vector in model order (p->w, p->grad) -- the layout the partition table,
 * the client and ps_optim work on -- and copied into / out of the model's
 * own tables around each forward/backward.  The copies cost a few
 * milliseconds against seconds of compute and keep the loops identical for
 * every task.
 *
 * Data: rank r of W reads the samples PyTorch's DistributedSampler would
 * give it (ps_video.h), B per step; step s is batch s % bpe of epoch
 * s / bpe (bpe = batches per epoch), so a run restarted at step s reads on
 * exactly where it stopped, and one process with batch W*B sees the same
 * samples per step as W processes with batch B.
 *
 * BN running statistics (--bn-sync, default on): the running mean / var of
 * every BN that updates them in training (all in TRAIN mode, bn1 in
 * PARTIAL, none in FROZEN) are extra tensors at the end of the flat vector,
 * in an AVERAGE optimizer group (ps_optim.h).  Each step a worker starts
 * from the pulled statistics, its training forward updates them with its
 * own batch, and it pushes w_pulled - local; the servers' mean turns that
 * into the mean of the workers' local statistics, which every worker pulls
 * back.  So every worker evaluates with the same statistics, equal to the
 * mean of what each would have computed, and rank 0 exports them.
 *
 * The model runs on the engine's backend for --device (the CPU reference,
 * or CUDA with the model's arena in managed memory, docs/cuda.md); an
 * asynchronous backend is synced before the host touches the arena. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/labels.h"
#include "worker/data/ps_video.h"
#include "worker/models/ps_model.h"
#include "worker/psworker/psworker.h"
#include "worker/psworker/video_models.h"

typedef struct video_opts {
    char *train_list, *val_list;   /* TSM list files (or pack dirs with --packed) */
    char *tmpl;             /* frame file name template */
    int packed;             /* lists are psdata pack directories */
    int frames;             /* T segments per clip */
    int scale_size;         /* test: shorter side before the centre crop (0 = size*256/224) */
    int val_clips;          /* clips per validation video */
    int test_clips;         /* --eval: clips per video (0 = val_clips) */
    int test_crops;         /* --eval: 1 centre crop, 3 TSM's three crops */
    char *shift_place;      /* blockres|block ("" = the --weights checkpoint's, else blockres) */
    int shift_div;          /* 1/N each way (0 = the --weights file's tsm.shift_div, else 8) */
    float dropout;
    int partial_bn;
    char *bn;               /* BN mode train|partial|frozen ("" = --partial-bn) */
    int bn_sync;            /* average BN running statistics over the workers */
    char *video_list, *val_video_list; /* video files decoded on the fly, in place of the lists */
    int short_side;         /* video files: shorter side of the decoded frames */
    float fps;              /* video files: frames per second (0 = every frame) */
    char *class_names;      /* --predictions: class i's name is line i + 1 of this file */
    const char *train_src, *val_src; /* derived: the training / validation list of either kind */
    char *sampling;         /* tsn|dense ("" = the model's) */
    int stride;             /* dense: frame stride (0 = the model's) */
    char *inflate;          /* 2-D --weights into a 3-D model: mean|centre */
    int bn_mode;            /* derived: PS_MODEL_BN_* value, -1 = from --partial-bn */
    const ps_video_model_row_t *row; /* derived: --model's row */
    int sampling_kind;      /* derived: PS_VIDEO_SAMPLING_* */
} video_opts_t;

typedef struct video {
    ps_ctx_t ctx;
    const ps_backend_t *be;
    ps_model_t *m;
    ps_video_list_t *train, *val;
    ps_video_loader_t *tl, *vl;
    ps_video_opts_t topt, vopt;
    ps_tensor_spec_t *specs;
    int nspecs;
    int *param_of;          /* spec i -> model param index (i < nparams) or
                               model buffer index (BN statistics, i >= nparams) */
    int nparams;            /* specs[0..nparams) are trainable parameters, the
                               rest BN running statistics (AVERAGE group) */
    float *clips;           /* (max_clips*T, 3, H, W) one batch */
    int32_t *labels;
    int64_t *idx;
    int max_clips, K;
    double top1, top5, val_loss;  /* last validation */
    size_t val_nonfinite;   /* videos of the last validation whose logits were
                               NaN/Inf: counted wrong, val_loss NaN */
    FILE *val_csv;          /* rank 0: one row per validation */
    ps_class_names_t *names; /* --class-names */
} video_t;

static const video_opts_t *vopts(const ps_worker_t *p) { return ps_worker_task_opts(p->o); }

/* ---- options ---------------------------------------------------------------- */

static int video_claims(const ps_worker_opts_t *o, const void *topts)
{
    (void)topts;
    return ps_video_model_find(o->model) != NULL;
}

#define ROW(name, type, dst, help, def) rows[n++] = (ps_opt_t){name, type, dst, help, def}

static size_t video_rows(void *topts, ps_opt_t *rows)
{
    video_opts_t *v = topts;
    size_t n = 0;
    ROW("train-list", PS_OPT_STRING, &v->train_list, "video: TSM list 'frame_dir num_frames label'", "");
    ROW("val-list", PS_OPT_STRING, &v->val_list, "video: validation list", "");
    ROW("tmpl", PS_OPT_STRING, &v->tmpl, "video: frame file template (img_%05d.jpg)", "img_%05d.jpg");
    ROW("packed", PS_OPT_BOOL, &v->packed, "video: the lists are psdata pack directories", "false");
    ROW("frames", PS_OPT_INT, &v->frames, "video: segments T per clip", "8");
    ROW("scale-size", PS_OPT_INT, &v->scale_size, "video: test resize of the shorter side (0 = size*256/224)", "0");
    ROW("val-clips", PS_OPT_INT, &v->val_clips, "video: clips per validation video", "1");
    ROW("test-clips", PS_OPT_INT, &v->test_clips, "--eval: clips per video, evenly spaced (0 = --val-clips)", "0");
    ROW("test-crops", PS_OPT_INT, &v->test_crops, "--eval: 1 = centre crop of the shorter side scaled to --scale-size; "
        "3 = TSM's three crops along the longer side, the shorter side scaled to --size (full resolution) "
        "unless --scale-size", "1");
    ROW("shift-place", PS_OPT_STRING, &v->shift_place, "video: TSM's shift placement blockres|block (\"\" = the "
        "--weights TSM checkpoint's, else blockres)", "");
    ROW("shift-div", PS_OPT_INT, &v->shift_div, "video: 1/N of the channels shift each way (0 = the --weights "
        "file's tsm.shift_div, else 8)", "0");
    ROW("dropout", PS_OPT_FLOAT, &v->dropout, "video: dropout before fc", "0.5");
    ROW("partial-bn", PS_OPT_BOOL, &v->partial_bn, "video: TSM partial BN (only bn1 updates statistics)", "false");
    ROW("bn", PS_OPT_STRING, &v->bn, "video: BN mode train|partial|frozen (frozen: running stats, fixed affine)", "");
    ROW("bn-sync", PS_OPT_INT, &v->bn_sync, "video: average BN running statistics over the workers (1) or not (0)", "1");
    ROW("video-list", PS_OPT_STRING, &v->video_list, "video: video files 'path label' (relative to --root) decoded on the fly, in place of --train-list", "");
    ROW("val-video-list", PS_OPT_STRING, &v->val_video_list, "video: validation video files, in place of --val-list", "");
    ROW("short-side", PS_OPT_INT, &v->short_side, "video files: shorter side of the decoded frames (psdata extract's --short-side)", "256");
    ROW("fps", PS_OPT_FLOAT, &v->fps, "video files: frames per second (psdata extract's --fps; 0 = every frame)", "0");
    ROW("class-names", PS_OPT_STRING, &v->class_names, "--predictions: class-name file (class i = line i+1), names added to each row", "");
    ROW("sampling", PS_OPT_STRING, &v->sampling, "video: frames of a clip: tsn (T segments) | dense (T frames --stride apart); \"\" = the model's (tsn for TSM/TSN, dense for 3-D)", "");
    ROW("stride", PS_OPT_INT, &v->stride, "video: dense sampling's frame stride (0 = the model's: 2)", "0");
    ROW("inflate", PS_OPT_STRING, &v->inflate, "video: 2-D --weights into a 3-D model: mean (kernel / T on every slice) | centre (kernel on the middle slice)", "mean");
    return n;
}

static int video_check(ps_worker_opts_t *o)
{
    video_opts_t *v = ps_worker_task_opts(o);
    /* fp16 compute is the CUDA backend's (docs/cuda.md), bf16 also the
     * CPU's where it has native bf16: refuse rather than train in fp32
     * while the user believes it is half. */
    char why[192];
    if (strcmp(o->prec.precision, "fp32") && !strcmp(o->device, "cpu") &&
        !ps_engine_cpu_precision_ok(!strcmp(o->prec.precision, "bf16") ? PS_PRECISION_BF16
                                                                       : PS_PRECISION_FP16,
                                    why, sizeof why))
        return ps_worker_opt_error("--precision %s on --device cpu: %s", o->prec.precision,
                                   why);
    if (ps_worker_data_opts_check(o)) return PS_EINVAL;
    if (v->frames < 1 || v->frames > 256 || v->val_clips < 1 || v->val_clips > 32 ||
        v->test_clips < 0 || v->test_clips > 32 || v->scale_size < 0 ||
        !(v->dropout >= 0 && v->dropout < 1) || (v->shift_div && (v->shift_div < 2 || v->shift_div > 64)))
        return ps_worker_opt_error("video options out of range: --frames 1..256, --val-clips "
                "1..32, --test-clips 0..32, --scale-size >= 0, --dropout [0,1), --shift-div 0 or 2..64");
    if (v->test_crops != 1 && v->test_crops != 3)
        return ps_worker_opt_error("--test-crops: 1 or 3, got %d", v->test_crops);
    if ((v->test_crops != 1 || v->test_clips) && !o->eval)
        return ps_worker_opt_error("--test-clips / --test-crops go with --eval (TSM's test protocol; "
                "validation during training uses --val-clips, centre crop)");
    if (*v->shift_place && strcmp(v->shift_place, "blockres") && strcmp(v->shift_place, "block"))
        return ps_worker_opt_error("--shift-place: expected blockres|block, got \"%s\"", v->shift_place);
    if ((*v->shift_place || v->shift_div) && strncmp(o->model, "tsm-", 4))
        return ps_worker_opt_error("--shift-place / --shift-div need a tsm-* model (--model %s has no shift)",
                o->model);
    static const char *const modes[] = {"train", "partial", "frozen"};
    static const int mode_of[] = {PS_MODEL_BN_TRAIN, PS_MODEL_BN_PARTIAL, PS_MODEL_BN_FROZEN};
    v->bn_mode = -1;
    for (int i = 0; i < 3 && *v->bn; i++)
        if (!strcmp(v->bn, modes[i])) v->bn_mode = mode_of[i];
    if (*v->bn && v->bn_mode < 0)
        return ps_worker_opt_error("--bn: expected train|partial|frozen, got \"%s\"", v->bn);
    if (v->bn_mode == PS_MODEL_BN_TRAIN && v->partial_bn)
        return ps_worker_opt_error("--bn train contradicts --partial-bn");
    if (v->bn_sync != 0 && v->bn_sync != 1)
        return ps_worker_opt_error("--bn-sync must be 0 or 1");
    v->row = ps_video_model_find(o->model);
    if (v->row && ps_video_model_sampling(v->row, v->sampling, &v->stride, &v->sampling_kind))
        return PS_EINVAL;
    if (strcmp(v->inflate, "mean") && strcmp(v->inflate, "centre"))
        return ps_worker_opt_error("--inflate: expected mean|centre, got \"%s\"", v->inflate);
    if (*o->data.predictions && !o->eval)
        return ps_worker_opt_error("--predictions goes with --eval (per-video rows of that "
                "evaluation)");
    if ((*v->video_list && *v->train_list) || (*v->val_video_list && *v->val_list))
        return ps_worker_opt_error("--video-list / --val-video-list replace --train-list / --val-list: "
                "give one of each pair");
    if (v->packed && (*v->video_list || *v->val_video_list))
        return ps_worker_opt_error("--packed reads pack directories, --video-list video files: not both");
    if (*v->class_names && !*o->data.predictions)
        return ps_worker_opt_error("--class-names goes with --predictions (it names the classes there)");
    if (v->short_side < 0 || v->short_side > 8192 || !(v->fps >= 0 && v->fps <= 1000))
        return ps_worker_opt_error("--short-side 0..8192, --fps 0..1000");
    v->train_src = *v->video_list ? v->video_list : v->train_list;
    v->val_src = *v->val_video_list ? v->val_video_list : v->val_list;
    if (!o->eval && !*o->export_onnx && !*v->train_src)
        return ps_worker_opt_error("--model %s needs --train-list or --video-list (and --root where the "
                "frame folders or videos are)", o->model);
    if (o->eval && !*v->val_src)
        return ps_worker_opt_error("--eval needs --val-list or --val-video-list");
    return 0;
}

/* ---- set-up ------------------------------------------------------------------ */

static int load_list(const ps_worker_opts_t *o, const char *path, ps_video_list_t **l)
{
    const video_opts_t *v = ps_worker_task_opts(o);
    ps_video_list_opts_t lo;
    char err[2048];
    ps_video_list_opts_default(&lo);
    lo.root = o->data.root;
    lo.tmpl = v->tmpl;
    lo.skip_bad = o->data.skip_bad;
    lo.short_side = v->short_side;
    lo.fps = v->fps;
    int files = path == v->video_list || path == v->val_video_list;
    int rc = files ? ps_video_list_load_videos(path, &lo, l, err, sizeof err)
             : v->packed ? ps_video_list_load_packed(path, &lo, l, err, sizeof err)
                         : ps_video_list_load(path, &lo, l, err, sizeof err);
    if (rc) ps_error("%s", err);
    else ps_info("%s: %zu videos, largest label %d%s", path, ps_video_list_size(*l),
                 ps_video_list_num_classes(*l) - 1, v->packed ? " (packed)" : files ? " (video files)" : "");
    return rc;
}

static void base_opts(const ps_worker_opts_t *o, ps_video_opts_t *lv)
{
    const video_opts_t *v = ps_worker_task_opts(o);
    ps_video_opts_default(lv);
    lv->n_segment = v->frames;
    lv->sampling = v->sampling_kind;
    lv->stride = v->stride;
    lv->crop_h = lv->crop_w = o->data.size;
    lv->scale_size = v->scale_size;
    lv->flip = o->data.flip;
    lv->seed = o->data_seed;
    lv->threads = o->data.loader_threads;
    lv->prefetch = o->data.prefetch;
    lv->skip_bad = o->data.skip_bad;
}

/* --num-classes N: every label of both lists must be below N (a class
 * without videos is allowed: a small validation list may miss some).  A
 * label at or above N would index past the model's outputs.  PS_EINVAL
 * (a usage error, exit 2) naming the first such video. */
static int classes_given(const video_t *v, int n)
{
    const ps_video_list_t *lists[2] = {v->train, v->val};
    char where[4200];
    for (int k = 0; k < 2; k++) {
        long i = lists[k] ? ps_video_list_find_label(lists[k], n, where, sizeof where) : -1;
        if (i < 0) continue;
        ps_error("%s: label %d is outside --num-classes %d (labels 0..%d)", where,
                 ps_video_list_label(lists[k], (size_t)i), n, n - 1);
        return PS_EINVAL;
    }
    ps_info("%d classes (--num-classes)", n);
    return 0;
}

/* The smallest label in 0..k-1 that no video of either list has, k if
 * none is missing, PS_ENOMEM. */
static int first_missing_label(const video_t *v, int k)
{
    const ps_video_list_t *lists[2] = {v->train, v->val};
    unsigned char *seen = calloc((size_t)k, 1);
    if (!seen) {
        ps_error("out of memory for the label set (%d labels)", k);
        return PS_ENOMEM;
    }
    for (int j = 0; j < 2; j++)
        for (size_t i = 0; lists[j] && i < ps_video_list_size(lists[j]); i++)
            seen[ps_video_list_label(lists[j], i)] = 1;
    int m = 0;
    while (m < k && seen[m]) m++;
    free(seen);
    return m;
}

/* No --num-classes (0): the count is the largest label + 1 over both lists,
 * and their labels must be exactly 0..K-1.  A gap ({0,1,2,7}) is far more
 * often a wrong list or a typo than classes left out on purpose, and it
 * would silently add untrained outputs; a user who means it gives --num-classes. */
static int classes_from_data(const video_t *v, const video_opts_t *vo, int *classes)
{
    int k = 0;
    if (v->train) k = ps_video_list_num_classes(v->train);
    if (v->val && ps_video_list_num_classes(v->val) > k) k = ps_video_list_num_classes(v->val);
    if (k < 2) {
        ps_error("the lists hold %d class(es); give --num-classes", k);
        return PS_EINVAL;
    }
    int m = first_missing_label(v, k);
    if (m < 0) return m;
    if (m < k) {
        /* the first video past the gap, the train list's if it has one */
        char where[4200];
        const ps_video_list_t *l = v->train;
        long i = l ? ps_video_list_find_label(l, m, where, sizeof where) : -1;
        if (i < 0) i = ps_video_list_find_label(l = v->val, m, where, sizeof where);
        ps_error("the labels are not 0..%d: no video has label %d, yet %s has label %d.  With "
                 "the class count from the data (no --num-classes) the labels must be 0..K-1 "
                 "without gaps: fix the list, or give --num-classes %d if classes without videos "
                 "are meant", k - 1, m, where, ps_video_list_label(l, (size_t)i), k);
        return PS_EINVAL;
    }
    ps_info("%d classes from the data: labels 0..%d in %s%s%s", k, k - 1,
            v->train ? vo->train_src : "", v->train && v->val ? " and " : "",
            v->val ? vo->val_src : "");
    *classes = k;
    return 0;
}

/* No list (--export-onnx): the classifier of --weights says. */
static int classes_from_weights(const ps_worker_opts_t *o, int *classes)
{
    ps_model_file_info_t fi;
    if (!*o->data.weights || ps_model_file_info(o->data.weights, &fi) || fi.num_classes < 2) {
        ps_error("no lists and no classifier in --weights (\"%s\") to take the class count "
                 "from: give --num-classes", o->data.weights);
        return PS_EINVAL;
    }
    *classes = fi.num_classes;
    ps_info("%d classes from %s's fc.weight", *classes, o->data.weights);
    return 0;
}

/* The number of classes of the model (both lists loaded). */
static int video_classes(const ps_worker_opts_t *o, const video_t *v, int *classes)
{
    int n = o->data.num_classes;
    if (n <= 0 && !v->train && !v->val) return classes_from_weights(o, classes);
    if (n <= 0) return classes_from_data(v, ps_worker_task_opts(o), classes);
    if (n < 2) {
        ps_error("--num-classes %d: a classifier needs at least 2", n);
        return PS_EINVAL;
    }
    *classes = n;
    return classes_given(v, n);
}

/* The lists, the number of classes and the loaders' options. */
static int video_data(ps_worker_t *p, video_t *v, int *classes)
{
    const ps_worker_opts_t *o = p->o;
    const video_opts_t *vo = vopts(p);
    char err[1024];
    int rc;
    if (!o->eval && !*o->export_onnx && (rc = load_list(o, vo->train_src, &v->train))) return rc;
    if (*vo->val_src && (rc = load_list(o, vo->val_src, &v->val))) return rc;
    if ((rc = video_classes(o, v, classes))) return rc;
    base_opts(o, &v->topt);
    v->topt.train = 1;
    v->topt.batch = p->batch;
    base_opts(o, &v->vopt);
    v->vopt.train = 0;
    v->vopt.n_clips = vo->val_clips;
    if (o->eval) { /* TSM's test protocol */
        if (vo->test_clips) v->vopt.n_clips = vo->test_clips;
        v->vopt.n_crops = vo->test_crops;
        /* three crops: full resolution (the shorter side scaled to the crop
         * size, as TSM's --full_res) unless --scale-size says otherwise */
        if (vo->test_crops == 3 && !vo->scale_size) v->vopt.scale_size = o->data.size;
    }
    v->vopt.batch = o->data.val_batch > 0 ? o->data.val_batch : p->batch;
    v->vopt.shuffle = 0;
    v->vopt.drop_last = 0;
    if (ps_video_opts_check(&v->topt, err, sizeof err) ||
        ps_video_opts_check(&v->vopt, err, sizeof err)) {
        ps_error("data options: %s", err);
        return PS_EINVAL;
    }
    v->K = ps_video_clips_per_sample(&v->vopt);
    if (v->val) {
        /* TSN: a video of at most T frames gives frame 1 for every segment;
         * dense: one shorter than the clip's span loops back to its start */
        const int dense = vo->sampling_kind == PS_VIDEO_SAMPLING_DENSE;
        const int need = dense ? vo->frames * vo->stride : vo->frames + 1;
        size_t shortv = 0;
        for (size_t i = 0; i < ps_video_list_size(v->val); i++)
            shortv += ps_video_list_frames(v->val, i) < need;
        if (shortv)
            ps_warn("%s: %zu of %zu videos have fewer than %d frames: %s", vo->val_src, shortv,
                    ps_video_list_size(v->val), need,
                    dense ? "their clips loop back to the first frame (--frames x --stride)"
                          : "TSM's test sampling then takes frame 1 for every segment (no "
                            "motion in those clips)");
    }
    v->max_clips = p->batch > v->vopt.batch * v->K ? p->batch : v->vopt.batch * v->K;
    if (*o->export_onnx) v->max_clips = 1; /* the graph has a symbolic batch */
    return 0;
}

/* --shift-place / --shift-div, or what --weights says: a TSM checkpoint's
 * names place the shift, worker/models/torch2safetensors.py records TSM's
 * shift_div (from the checkpoint's file name) as tsm.shift_div.  A flag
 * that contradicts the file is a usage error naming both. */
static int shift_options(const ps_worker_opts_t *o, const video_opts_t *vo, ps_model_config_t *cfg)
{
    static const char *const places[] = {"blockres", "block"};
    int place = !*vo->shift_place ? -1 : !strcmp(vo->shift_place, "block");
    ps_model_file_info_t fi = {.shift_place = -1};
    if (cfg->shift && *o->data.weights) /* a bad file: the load below reports it */
        ps_model_file_info(o->data.weights, &fi);
    if (fi.shift_place >= 0 && place >= 0 && place != fi.shift_place) {
        ps_error("--shift-place %s, but %s is a TSM checkpoint with the shift placed '%s'",
                 places[place], o->data.weights, places[fi.shift_place]);
        return PS_EINVAL;
    }
    if (fi.shift_div && vo->shift_div && vo->shift_div != fi.shift_div) {
        ps_error("--shift-div %d, but %s says tsm.shift_div %d", vo->shift_div, o->data.weights,
                 fi.shift_div);
        return PS_EINVAL;
    }
    cfg->shift_place = place >= 0            ? place
                       : fi.shift_place >= 0 ? fi.shift_place
                                             : PS_MODEL_SHIFT_BLOCKRES;
    cfg->shift_div = vo->shift_div ? vo->shift_div : fi.shift_div ? fi.shift_div : 8;
    if (cfg->shift)
        ps_info("temporal shift: place %s, 1/%d of the channels each way",
                places[cfg->shift_place], cfg->shift_div);
    return 0;
}

/* The model on its device and precision, initialised or loaded. */
static int video_model(ps_worker_t *p, video_t *v, int classes)
{
    const ps_worker_opts_t *o = p->o;
    const video_opts_t *vo = vopts(p);
    ps_model_config_t cfg;
    int rc;
    ps_model_config_default(&cfg);
    vo->row->config(&cfg, vo->row);
    cfg.num_classes = classes;
    cfg.n_segment = vo->frames;
    cfg.dropout = vo->dropout;
    cfg.partial_bn = vo->partial_bn;
    if (vo->bn_mode >= 0) {
        cfg.bn_mode = vo->bn_mode;
        cfg.partial_bn = vo->bn_mode == PS_MODEL_BN_PARTIAL;
    }
    cfg.width = o->data.width;
    if ((rc = shift_options(o, vo, &cfg))) return rc;
    if ((rc = ps_worker_open_device(p, &v->ctx, &v->be))) return rc;
    if (strcmp(o->prec.precision, "fp32")) {
        int prec = !strcmp(o->prec.precision, "bf16") ? PS_PRECISION_BF16 : PS_PRECISION_FP16;
        if ((rc = v->be->set_precision(&v->ctx, prec))) return rc;
        ps_info("precision %s: conv / linear on %s operands, fp32 BN, loss and master weights",
                o->prec.precision, o->prec.precision);
    }
    int size = o->data.size;
    if ((rc = ps_model_create(&v->m, &cfg, v->be, &v->ctx, v->max_clips, size, size)) ||
        (rc = v->be->sync(&v->ctx)))
        return rc;
    ps_model_init(v->m, o->seed, 0);
    static const char *const bn_names[] = {"train", "partial", "frozen"};
    ps_info("BN mode %s", bn_names[ps_model_bn_mode(v->m)]);
    ps_model_set_seed(v->m, o->seed);
    if (*o->data.weights) {
        const int inflate = !strcmp(vo->inflate, "centre") ? PS_MODEL_LOAD_INFLATE_CENTRE : 0;
        rc = ps_model_load(v->m, o->data.weights,
                           (o->eval ? PS_MODEL_LOAD_STRICT : PS_MODEL_LOAD_REPLACE_FC) | inflate |
                               (o->data.weights_partial ? PS_MODEL_LOAD_PARTIAL : 0));
        if (rc) return rc;
        ps_info("weights loaded from %s%s%s", o->data.weights,
                ps_model_fc_replaced(v->m) ? " (fc replaced)" : "",
                ps_model_inflated(v->m) ? (inflate ? " (2-D kernels inflated: centre)"
                                                   : " (2-D kernels inflated: mean)")
                                        : "");
    }
    return 0;
}

/* Group index of the BN statistics: right after the TSM recipe's groups. */
#define STAT_GROUP PS_MODEL_NGROUPS

/* Append to v->specs the running mean / var of every BN whose statistics a
 * training forward updates: those whose affine is trainable (TRAIN: all,
 * PARTIAL: bn1, FROZEN: none; ps_model.h). */
static int add_stat_specs(video_t *v)
{
    int nb, np;
    const ps_model_buffer_t *bu = ps_model_buffers(v->m, &nb);
    const ps_model_param_t *par = ps_model_params(v->m, &np);
    ps_tensor_spec_t *s = realloc(v->specs, sizeof *s * (size_t)(v->nspecs + nb));
    int *of = malloc(sizeof(int) * (size_t)(v->nspecs + nb));
    if (s) v->specs = s;
    if (!s || !of) {
        free(of);
        return PS_ENOMEM;
    }
    int n = v->nspecs;
    for (int i = 0; i < nb; i++) {
        if (!bu[i].f32) continue; /* num_batches_tracked: the same count everywhere */
        char wname[256];
        const char *dot = strrchr(bu[i].name, '.');
        int plen = dot ? (int)(dot - bu[i].name) : 0;
        snprintf(wname, sizeof wname, "%.*s.weight", plen, bu[i].name);
        int pi = ps_model_find_param(v->m, wname);
        if (pi < 0 || !par[pi].trainable) continue;
        s[n] = (ps_tensor_spec_t){.name = bu[i].name, .numel = bu[i].numel, .group = STAT_GROUP};
        of[n++] = i;
    }
    v->nspecs = n;
    v->param_of = of;
    return 0;
}

/* The flat vector's tensors, the partition table and the optimizer groups:
 * the TSM recipe's (biases x2, BN no decay, new fc), plus the AVERAGE group
 * of the BN statistics when there are any. */
static int video_table(ps_worker_t *p, video_t *v, uint32_t nservers)
{
    int rc;
    v->nspecs = ps_model_tensor_specs(v->m, &v->specs);
    if (v->nspecs < 0) return v->nspecs;
    v->nparams = v->nspecs;
    if (vopts(p)->bn_sync && (rc = add_stat_specs(v))) return rc;
    /* The statistics travel exactly (raw fp32 whatever --dtype / --codec):
     * partitions of their own, PS_PART_EXACT (ps_optim_exact_groups). */
    uint32_t exact = v->nspecs > v->nparams ? 1u << STAT_GROUP : 0;
    rc = ps_partition_table_build_ex(&p->table, v->specs, (uint32_t)v->nspecs,
                                     (size_t)p->o->partition_bytes, nservers, exact);
    if (rc) {
        ps_error("cannot build the partition table: %s", ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_worker_build_optim(p))) return rc;
    int n = ps_model_groups(v->m, p->optim.groups, PS_OPTIM_MAX_GROUPS);
    if (n < 0) return n;
    if (v->nspecs > v->nparams) {
        if (n != STAT_GROUP || n + 1 > PS_OPTIM_MAX_GROUPS) return PS_EINVAL;
        p->optim.groups[n] = (ps_param_group_t){1.0f, 0.0f};
        p->optim.group_kind[n++] = PS_GROUP_AVERAGE;
    }
    p->optim.ngroups = n;
    return 0;
}

/* The batch buffers and p->w / p->grad, with p->w = the model's tensors. */
static int video_buffers(ps_worker_t *p, video_t *v)
{
    const ps_worker_opts_t *o = p->o;
    if (!v->param_of) v->param_of = malloc(sizeof(int) * (size_t)v->nspecs);
    size_t frame_floats = (size_t)3 * o->data.size * o->data.size;
    v->clips = malloc(sizeof(float) * frame_floats * (size_t)vopts(p)->frames * (size_t)v->max_clips);
    v->labels = malloc(sizeof(int32_t) * (size_t)v->max_clips);
    v->idx = malloc(sizeof(int64_t) * (size_t)v->max_clips);
    p->numel = p->nparam_numel = 0;
    for (int i = 0; i < v->nspecs; i++) {
        p->numel += v->specs[i].numel;
        if (i < v->nparams) p->nparam_numel += v->specs[i].numel;
    }
    p->w = calloc(p->numel, sizeof(float));
    p->grad = calloc(p->numel, sizeof(float));
    if (!v->param_of || !v->clips || !v->labels || !v->idx || !p->w || !p->grad) {
        ps_error("out of memory for the %s model / batch buffers", o->model);
        return PS_ENOMEM;
    }
    int np;
    const ps_model_param_t *par = ps_model_params(v->m, &np);
    const ps_model_buffer_t *bu = ps_model_buffers(v->m, NULL);
    size_t off = 0;
    for (int i = 0; i < v->nspecs; i++) {
        if (i >= v->nparams) { /* param_of was set by add_stat_specs */
            memcpy(p->w + off, bu[v->param_of[i]].f32, sizeof(float) * v->specs[i].numel);
            off += v->specs[i].numel;
            continue;
        }
        v->param_of[i] = ps_model_find_param(v->m, v->specs[i].name);
        if (v->param_of[i] < 0 || par[v->param_of[i]].numel != v->specs[i].numel) {
            ps_error("model table mismatch at %s", v->specs[i].name);
            return PS_EMISMATCH;
        }
        memcpy(p->w + off, par[v->param_of[i]].w, sizeof(float) * v->specs[i].numel);
        off += v->specs[i].numel;
    }
    return 0;
}

static int video_setup(ps_worker_t *p, uint32_t nservers)
{
    const ps_worker_opts_t *o = p->o;
    const video_opts_t *vo = vopts(p);
    int classes, rc;
    if (!vo->row) {
        ps_error("--model: unknown model \"%s\" (%s)", o->model, ps_video_model_names());
        return PS_EINVAL;
    }
    video_t *v = calloc(1, sizeof *v);
    if (!v) return PS_ENOMEM;
    p->ts = v;
    v->top1 = v->top5 = v->val_loss = NAN;
    if ((rc = video_data(p, v, &classes)) || (rc = video_model(p, v, classes)) ||
        (rc = video_table(p, v, nservers)) || (rc = video_buffers(p, v)))
        return rc;
    if (v->nspecs > v->nparams)
        ps_info("BN running statistics: %d tensors averaged over the workers through the servers "
                "(--bn-sync)", v->nspecs - v->nparams);
    char smp[64] = "TSN segments";
    if (vo->sampling_kind == PS_VIDEO_SAMPLING_DENSE)
        snprintf(smp, sizeof smp, "dense, every %d. frame", vo->stride);
    ps_info("model %s: %zu trainable parameters in %d tensors, %u partitions on %u server(s), "
            "%d classes, T=%d (%s), %dx%d; the model computes on %s", o->model, p->numel,
            v->nspecs, p->table.nparts, nservers, classes, vo->frames, smp, o->data.size,
            o->data.size, vo->row->layout);
    return 0;
}

/* ---- a run ------------------------------------------------------------------- */

static double video_epoch(const ps_worker_t *p, uint64_t steps)
{
    const video_t *v = p->ts;
    size_t bpe = v && v->tl ? ps_video_loader_batches(v->tl) : 0;
    return bpe ? (double)steps / (double)bpe : 0;
}

/* The training loader, sharded by the rank now known; rank 0's validation CSV. */
static int video_start(ps_worker_t *p)
{
    video_t *v = p->ts;
    char err[1024];
    v->topt.rank = p->rank;
    v->topt.world = p->nworkers;
    if (ps_video_loader_new(v->train, &v->topt, &v->tl, err, sizeof err)) {
        ps_error("training loader: %s", err);
        return PS_EINVAL;
    }
    if (ps_video_loader_batches(v->tl) == 0) {
        ps_error("%s: %zu videos are fewer than one global batch of %d x %d",
                 vopts(p)->train_src, ps_video_list_size(v->train), p->nworkers, p->batch);
        return PS_EINVAL;
    }
    ps_info("epoch = %zu steps (%zu samples per rank)", ps_video_loader_batches(v->tl),
            ps_video_loader_samples(v->tl));
    return ps_worker_val_csv_open(p, "iteration,epoch,loss,top1,top5,nonfinite", &v->val_csv);
}

/* p->w -> the model's tensors (and BN statistics). */
static void scatter(ps_worker_t *p)
{
    video_t *v = p->ts;
    v->be->sync(&v->ctx);
    int np;
    const ps_model_param_t *par = ps_model_params(v->m, &np);
    const ps_model_buffer_t *bu = ps_model_buffers(v->m, NULL);
    size_t off = 0;
    for (int i = 0; i < v->nspecs; i++) {
        float *dst = i < v->nparams ? par[v->param_of[i]].w : bu[v->param_of[i]].f32;
        memcpy(dst, p->w + off, sizeof(float) * v->specs[i].numel);
        off += v->specs[i].numel;
    }
}

/* The model's gradients -> p->grad; the BN statistics' "gradient" is
 * w_pulled - local (AVERAGE group, ps_optim.h). */
static void gather(ps_worker_t *p)
{
    video_t *v = p->ts;
    int np;
    const ps_model_param_t *par = ps_model_params(v->m, &np);
    const ps_model_buffer_t *bu = ps_model_buffers(v->m, NULL);
    size_t off = 0;
    for (int i = 0; i < v->nspecs; i++) {
        size_t n = v->specs[i].numel;
        if (i < v->nparams) {
            memcpy(p->grad + off, par[v->param_of[i]].g, sizeof(float) * n);
        } else {
            const float *loc = bu[v->param_of[i]].f32;
            for (size_t k = 0; k < n; k++) p->grad[off + k] = p->w[off + k] - loc[k];
        }
        off += n;
    }
}

static double video_compute(ps_worker_t *p, uint64_t step)
{
    video_t *v = p->ts;
    size_t bpe = ps_video_loader_batches(v->tl);
    uint64_t epoch = step / bpe;
    size_t b = (size_t)(step % bpe);
    if (ps_video_loader_epoch(v->tl) != epoch || ps_video_loader_position(v->tl) != b)
        ps_video_loader_seek(v->tl, epoch, b);
    int n = ps_video_loader_next(v->tl, v->clips, v->labels, v->idx, &p->t_data);
    ps_video_io_t io;
    ps_video_loader_io(v->tl, &io, NULL);
    p->data_bytes = io.bytes, p->t_read = io.read_s, p->t_decode = io.decode_s;
    if (n != p->batch) {
        ps_error("training data: %s", n < 0 ? ps_video_loader_error(v->tl) : "short batch");
        p->compute_rc = n < 0 ? n : PS_ESTATE;
        return NAN;
    }
    scatter(p);
    float loss = NAN;
    ps_model_zero_grad(v->m);
    int rc = ps_model_forward(v->m, v->clips, n, v->labels, 1, &loss);
    if (!rc) rc = ps_model_backward(v->m);
    if (!rc) rc = v->be->sync(&v->ctx);
    if (rc) {
        ps_error("forward/backward failed at step %llu: %s", (unsigned long long)step,
                 ps_strerror(rc));
        p->compute_rc = rc;
        return NAN;
    }
    gather(p);
    return loss;
}

/* One video's logits averaged over its K views (clips x crops) into avg:
 * the raw logits, as TSM's test_models.py averages them (its --softmax,
 * off by default, would apply after the mean and not change the ranking);
 * its loss and ranks of the label into the sums.  0 when a logit is not
 * finite: a diverged model, and NaN compares false with everything, so the
 * rank count would call the video correct; it is wrong for top-1 and top-5
 * instead. */
static int score_video(const float *lg, int K, int C, int y, double *avg, double *loss,
                       size_t *c1, size_t *c5)
{
    double mx = -INFINITY, se = 0;
    int finite = 1, rank = 0;
    for (int c = 0; c < C; c++) {
        avg[c] = 0;
        for (int k = 0; k < K; k++) avg[c] += lg[(size_t)k * C + c];
        avg[c] /= K;
        finite &= isfinite(avg[c]) != 0;
        if (avg[c] > mx) mx = avg[c];
    }
    if (!finite) return 0;
    for (int c = 0; c < C; c++) se += exp(avg[c] - mx);
    *loss += -(avg[y] - mx - log(se));
    for (int c = 0; c < C; c++) rank += avg[c] > avg[y] || (avg[c] == avg[y] && c < y);
    *c1 += rank < 1;
    *c5 += rank < 5;
    return 1;
}

static void prediction_row(FILE *pred, const video_t *v, int i, const double *avg, int C, int finite)
{
    int best = finite ? 0 : -1; /* -1: no prediction from non-finite logits */
    for (int c = 1; c < C && finite; c++) best = avg[c] > avg[best] ? c : best;
    fprintf(pred, "%lld,%s,%d,%d", (long long)v->idx[i],
            ps_video_list_name(v->val, (size_t)v->idx[i]), v->labels[i], best);
    for (int c = 0; c < C; c++) fprintf(pred, ",%.9g", avg[c]);
    /* names last, so the logit columns stay where they are; quoted as CSV */
    for (int k = 0; v->names && k < 2; k++)
        ps_csv_put_name(pred, v->names, k ? best : v->labels[i]);
    fputc('\n', pred);
}

/* Validation over the whole --val-list (TSM's test: the mean of the views'
 * logits): mean loss, top-1/top-5; with pred one CSV row per video.  Videos
 * with non-finite logits count as wrong and make the loss NaN. */
static double video_eval_pass(ps_worker_t *p, size_t *videos, FILE *pred)
{
    video_t *v = p->ts;
    char err[1024];
    v->top1 = v->top5 = NAN;
    if (videos) *videos = 0;
    v->val_nonfinite = 0;
    if (!v->val) return NAN;
    if (!v->vl && ps_video_loader_new(v->val, &v->vopt, &v->vl, err, sizeof err)) {
        ps_error("validation loader: %s", err);
        return NAN;
    }
    scatter(p);
    ps_video_loader_set_epoch(v->vl, 0);
    int K = v->K, C = ps_model_config(v->m)->num_classes, n = 0;
    size_t count = 0, c1 = 0, c5 = 0, bad = 0;
    double loss = 0;
    double *avg = malloc(sizeof(double) * (size_t)C);
    while (avg && (n = ps_video_loader_next(v->vl, v->clips, v->labels, v->idx, NULL)) > 0) {
        if (ps_model_forward(v->m, v->clips, n * K, NULL, 0, NULL) || v->be->sync(&v->ctx)) break;
        const float *lg = ps_model_logits(v->m);
        for (int i = 0; i < n; i++, count++) {
            int finite = score_video(lg + (size_t)i * K * C, K, C, v->labels[i], avg, &loss, &c1, &c5);
            if (!finite) bad++, loss = NAN;
            if (pred) prediction_row(pred, v, i, avg, C, finite);
        }
    }
    free(avg);
    if (n < 0) {
        ps_error("validation data: %s", ps_video_loader_error(v->vl));
        return NAN;
    }
    if (!count) return NAN;
    v->val_nonfinite = bad;
    if (bad)
        ps_warn("validation: %zu of %zu videos have non-finite logits (counted wrong; loss NaN)",
                bad, count);
    v->top1 = (double)c1 / count;
    v->top5 = (double)c5 / count;
    if (videos) *videos = count;
    return loss / count;
}

static void val_csv_row(ps_worker_t *p, uint64_t step)
{
    video_t *v = p->ts;
    if (v->val_csv)
        fprintf(v->val_csv, "%llu,%.3f,%.6f,%.4f,%.4f,%zu\n", (unsigned long long)step,
                video_epoch(p, step), v->val_loss, v->top1, v->top5, v->val_nonfinite);
}

/* Rank 0 alone validates; the others meet it at the cluster loop's barrier
 * (a small message, cheap to resend) rather than sit in the next step's
 * PUSHPULL, whose 5 s retries would resend whole gradients. */
static int video_validate(ps_worker_t *p, uint64_t step)
{
    video_t *v = p->ts;
    if (!ps_worker_val_due(p, step)) return 0;
    if (p->rank != 0) return 1;
    double t0 = ps_worker_now();
    size_t n = 0;
    v->val_loss = video_eval_pass(p, &n, NULL);
    printf("val: iter=%llu videos=%zu loss=%.4f top1=%.4f top5=%.4f eval_s=%.1f",
           (unsigned long long)step, n, v->val_loss, v->top1, v->top5, ps_worker_now() - t0);
    if (v->val_nonfinite) printf(" nonfinite=%zu", v->val_nonfinite);
    printf("\n");
    fflush(stdout);
    val_csv_row(p, step);
    return 1;
}

static void video_progress(ps_worker_t *p, uint64_t step, double loss, float lr, double per_s,
                           double t_data, double t_compute, double t_comm)
{
    const video_t *v = p->ts;
    const ps_video_clip_cost_t c = ps_video_clip_cost(v && v->tl ? v->tl : NULL);
    printf("iter %llu/%llu epoch %.2f loss %.4f lr %.5g clips/s %.1f data-wait %.1f ms "
           "compute %.1f ms comm-wait %.1f ms data %.1f kB/clip decode %.1f ms/clip\n",
           (unsigned long long)step + 1, (unsigned long long)p->o->steps,
           video_epoch(p, step + 1), loss, (double)lr, per_s, t_data * 1e3, t_compute * 1e3,
           t_comm * 1e3, c.bytes / 1e3, c.read_ms + c.decode_ms);
}

static int video_save(ps_worker_t *p, const char *path)
{
    video_t *v = p->ts;
    scatter(p);
    return ps_model_save(v->m, path);
}

/* CRC32C of this worker's BN running statistics (the AVERAGE tensors of
 * p->w; 0 when there are none): equal on every rank when they agree. */
static uint32_t bn_crc(const ps_worker_t *p, int *ntensors)
{
    const video_t *v = p->ts;
    *ntensors = v->nspecs - v->nparams;
    if (!*ntensors) return 0;
    size_t off = p->nparam_numel;
    return ps_crc32c(0, p->w + off, (p->numel - off) * sizeof(float));
}

static void video_print_final(ps_worker_t *p, uint64_t steps_done)
{
    video_t *v = p->ts;
    const ps_worker_stats_t *s = &p->st;
    double ms = 1e3 / (s->counted ? (double)s->counted : 1.0);
    /* Validation on rank 0 only: the others would repeat the same pass
     * (with the same BN statistics, --bn-sync) and print nan, with
     * val=rank0 saying where the numbers are. */
    double t0 = ps_worker_now();
    if (p->rank == 0) v->val_loss = video_eval_pass(p, NULL, NULL);
    double eval_s = ps_worker_now() - t0;
    val_csv_row(p, steps_done);
    double cps = ps_worker_per_s(p);
    printf("final: rank=%d workers=%d model=%s steps=%llu epochs=%.2f batch=%d loss=%.6f "
           "top1=%.4f top5=%.4f val_loss=%.6f clips_per_s=%.2f cluster_clips_per_s=%.2f "
           "step_ms=%.1f data_wait_ms=%.1f compute_ms=%.1f comm_wait_ms=%.1f eval_s=%.1f "
           "wall_s=%.1f",
           p->rank, p->nworkers, p->o->model, (unsigned long long)steps_done,
           video_epoch(p, steps_done), p->batch, ps_worker_recent_loss(p), v->top1, v->top5,
           v->val_loss, cps, cps * p->nworkers, s->sum_step * ms, s->sum_data * ms,
           s->sum_compute * ms, s->sum_comm * ms, eval_s, ps_worker_now() - s->t_start);
    int nbn = 0;
    uint32_t crc = bn_crc(p, &nbn);
    printf(" val=%s bn_sync=%d bn_stats=%d bn_crc=%08x", p->rank == 0 ? "here" : "rank0",
           nbn > 0, nbn, (unsigned)crc);
    const ps_video_clip_cost_t c = ps_video_clip_cost(v->tl);
    printf(" frames_per_clip=%.0f bytes_per_clip=%.0f read_ms_per_clip=%.3f "
           "decode_ms_per_clip=%.3f", c.frames, c.bytes, c.read_ms, c.decode_ms);
    if (v->val_nonfinite) printf(" nonfinite=%zu", v->val_nonfinite);
    ps_worker_print_out(p);
    printf("\n");
    fflush(stdout);
}

/* --eval: --weights on --val-list, optionally with --predictions. */
static int video_eval(ps_worker_t *p)
{
    video_t *v = p->ts;
    double t0 = ps_worker_now();
    size_t n = 0;
    FILE *pred = NULL;
    const char *pp = p->o->data.predictions, *cn = vopts(p)->class_names; /* per-video CSV */
    char err[1024];
    if (*cn && ps_class_names_load_n(cn, ps_model_config(v->m)->num_classes, &v->names, err, sizeof err)) {
        ps_error("--class-names %s", err);
        return PS_EINVAL;
    }
    if (*pp) {
        if (!(pred = fopen(pp, "w"))) {
            ps_error("--predictions %s: %s", pp, strerror(errno));
            return PS_EIO;
        }
        int C = ps_model_config(v->m)->num_classes;
        fprintf(pred, "index,video,label,pred");
        for (int c = 0; c < C; c++) fprintf(pred, ",logit%d", c);
        fputs(v->names ? ",label_name,pred_name\n" : "\n", pred);
    }
    double loss = video_eval_pass(p, &n, pred);
    double dt = ps_worker_now() - t0;
    if (pred && (ferror(pred) | fclose(pred))) {
        ps_error("--predictions %s: write failed", pp);
        return PS_EIO;
    }
    if (!n) return PS_EIO;
    /* TSM's tables: "1-clip centre crop" and "N-clip x 3-crop" top-1 */
    printf("final: model=%s weights=%s videos=%zu clips=%d crops=%d top1=%.4f top5=%.4f "
           "val_loss=%.6f clips_per_s=%.2f wall_s=%.1f", p->o->model, p->o->data.weights, n,
           v->vopt.n_clips, v->vopt.n_crops, v->top1, v->top5, loss, (double)n * v->K / dt, dt);
    if (v->val_nonfinite) printf(" nonfinite=%zu", v->val_nonfinite);
    printf("\n");
    fflush(stdout);
    return 0;
}

/* Loss scaling in the backend: the CUDA backend applies the scale in its
 * cross-entropy backward, so the trainable parameters' gradients come out
 * scaled; the BN statistics after them are differences of running
 * averages, never scaled.  The CPU backend refuses: the loop scales. */
static int video_loss_scale(ps_worker_t *p, float scale, size_t *scaled)
{
    video_t *v = p->ts;
    *scaled = 0;
    if (v->be->set_loss_scale(&v->ctx, scale)) return 0;
    *scaled = p->nparam_numel;
    return 1;
}

/* --export-onnx: the model as setup left it (p->w: --weights or the init). */
static int video_export(ps_worker_t *p, const char *path)
{
    video_t *v = p->ts;
    scatter(p);
    return ps_model_export_onnx(v->m, path);
}

static ps_model_t *video_model_of(ps_worker_t *p) { return ((video_t *)p->ts)->m; }

static void video_teardown(ps_worker_t *p)
{
    video_t *v = p->ts;
    if (!v) return;
    ps_video_loader_destroy(&v->tl);
    ps_video_loader_destroy(&v->vl);
    ps_video_list_free(&v->train);
    ps_video_list_free(&v->val);
    ps_class_names_free(&v->names);
    if (v->be) v->be->sync(&v->ctx);
    ps_model_destroy(&v->m);
    if (v->be) v->be->release(&v->ctx);
    ps_ctx_free(&v->ctx);
    if (v->val_csv) fclose(v->val_csv);
    free(v->specs), free(v->param_of), free(v->clips), free(v->labels), free(v->idx);
    free(v);
    p->ts = NULL;
    p->be = NULL;
    p->ctx = NULL;
}

const ps_task_t ps_task_video = {
    .name = "video",
    .models = "tsm-r18|34|50 | tsn-r18|34|50 | i3d-r50-333|i3d-r50-311 | r3d-18 | mc3-18 | "
              "r2plus1d-18",
    .unit = "clips",
    .opts_size = sizeof(video_opts_t),
    .claims = video_claims,
    .opt_rows = video_rows,
    .check = video_check,
    .setup = video_setup,
    .start = video_start,
    .compute = video_compute,
    .validate = video_validate,
    .save = video_save,
    .progress = video_progress,
    .print_final = video_print_final,
    .eval = video_eval,
    .export_onnx = video_export,
    .loss_scale = video_loss_scale,
    .model = video_model_of,
    .teardown = video_teardown,
};
