/* The video task's set-up (task_video.c): the training and validation
 * lists (frame folders, packed shards or video files) and the number of
 * classes they imply, the loaders' options (TSM's test protocol with
 * --eval), the model on its device and precision, and the flat vector:
 * its tensors (the BN statistics appended for --bn-sync), the partition
 * table, the optimizer groups and p->w / p->grad. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/psworker/task_video_internal.h"

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

/* Channels of the BNs a training forward normalises with batch statistics
 * (every one in TRAIN mode): what --bn sync exchanges per step. */
static int bn_channels(const ps_model_t *m)
{
    int nb, n = 0;
    const ps_model_buffer_t *bu = ps_model_buffers(m, &nb);
    for (int i = 0; i < nb; i++) {
        size_t l = strlen(bu[i].name);
        if (bu[i].f32 && l > 12 && !strcmp(bu[i].name + l - 12, "running_mean")) n += (int)bu[i].numel;
    }
    return n;
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
    cfg.recompute = o->data.recompute;
    cfg.zero_init_residual = vo->zero_init_residual;
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
    ps_info("BN mode %s%s%s", vo->bn_cross ? "sync" : bn_names[ps_model_bn_mode(v->m)],
            o->data.recompute ? ", stages recomputed in the backward (--recompute)" : "",
            vo->zero_init_residual ? ", residual branches' last BN weights start at 0" : "");
    if (vo->bn_cross) p->bn_cross = bn_channels(v->m);
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
    /* --bn sync: every rank updates its running statistics with the same
     * numbers, so there is nothing to average */
    if (vopts(p)->bn_sync && !vopts(p)->bn_cross && (rc = add_stat_specs(v))) return rc;
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

int ps_task_video_setup(ps_worker_t *p, uint32_t nservers)
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
