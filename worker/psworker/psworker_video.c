/* psworker's video models: TSM / TSN ResNets (worker/models) fed by the
 * video data pipeline (worker/data).  The trainable tensors are kept as one
 * flat vector in model order (p->w, p->grad) -- the layout the partition
 * table, the client and ps_optim work on -- and copied into / out of the
 * model's own tables around each forward/backward.  The copies cost a few
 * milliseconds against seconds of compute and keep the cluster loop
 * identical for every model.
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
 * mean of what each would have computed, and rank 0 exports them. */
#include "worker/psworker/psworker.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_video.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/ps_model.h"

struct ps_worker_video {
    ps_ctx_t ctx;
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
    const ps_backend_t *be; /* the --device's table (ps_engine_open_device) */
};

/* --precision on the model's backend: fp16 / bf16 operands for conv and
 * linear on CUDA (docs/cuda.md); the CPU runs fp32 only (main refuses). */
int ps_worker_video_precision(ps_worker_t *p, const char *precision)
{
    struct ps_worker_video *v = p->vid;
    const ps_precision_t prec = !strcmp(precision, "bf16")   ? PS_PRECISION_BF16
                                : !strcmp(precision, "fp16") ? PS_PRECISION_FP16
                                                             : PS_PRECISION_FP32;
    int rc = v->be->set_precision(&v->ctx, prec);
    if (!rc && prec != PS_PRECISION_FP32)
        ps_info("precision %s: conv / linear on %s operands, fp32 BN, loss and master "
                "weights", precision, precision);
    return rc;
}

/* Loss scaling: 1 when the backend applies `scale` in its cross-entropy
 * backward (CUDA), 0 when the caller must scale (the CPU: fp32, exact).
 * *scaled = the elements p->grad[0..*scaled) that then come out scaled:
 * the trainable parameters; the BN statistics after them are differences
 * of running averages, never scaled. */
int ps_worker_video_loss_scale(ps_worker_t *p, float scale, size_t *scaled)
{
    struct ps_worker_video *v = p->vid;
    *scaled = 0;
    if (!v || v->be->set_loss_scale(&v->ctx, scale)) return 0;
    for (int i = 0; i < v->nparams; i++) *scaled += v->specs[i].numel;
    return 1;
}

int ps_worker_is_video(const ps_worker_opts_t *o) { return strcmp(o->model, "smoke") != 0; }

static int parse_model(const char *name, int *depth, int *shift)
{
    if (!strncmp(name, "tsm-r", 5)) *shift = 1;
    else if (!strncmp(name, "tsn-r", 5)) *shift = 0;
    else return PS_EINVAL;
    char *end;
    long d = strtol(name + 5, &end, 10);
    if (*end || (d != 18 && d != 34 && d != 50)) return PS_EINVAL;
    *depth = (int)d;
    return 0;
}

static int load_list(const ps_worker_opts_t *o, const char *path, ps_video_list_t **l)
{
    ps_video_list_opts_t lo;
    char err[2048];
    ps_video_list_opts_default(&lo);
    lo.root = o->root;
    lo.tmpl = o->tmpl;
    lo.skip_bad = o->skip_bad;
    int rc = o->packed ? ps_video_list_load_packed(path, &lo, l, err, sizeof err)
                       : ps_video_list_load(path, &lo, l, err, sizeof err);
    if (rc) ps_error("%s", err);
    else ps_info("%s: %zu videos, %d classes%s", path, ps_video_list_size(*l), ps_video_list_num_classes(*l),
                 o->packed ? " (packed)" : "");
    return rc;
}

static void base_opts(const ps_worker_opts_t *o, ps_video_opts_t *v)
{
    ps_video_opts_default(v);
    v->n_segment = o->frames;
    v->crop_h = v->crop_w = o->size;
    v->scale_size = o->scale_size;
    v->flip = o->flip;
    v->seed = o->data_seed;
    v->threads = o->loader_threads;
    v->prefetch = o->prefetch;
    v->skip_bad = o->skip_bad;
}

/* Group index of the BN statistics: right after the TSM recipe's groups. */
#define STAT_GROUP PS_MODEL_NGROUPS

/* Append to v->specs the running mean / var of every BN whose statistics a
 * training forward updates: those whose affine is trainable (TRAIN: all,
 * PARTIAL: bn1, FROZEN: none; ps_model.h). */
static int add_stat_specs(struct ps_worker_video *v)
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

int ps_worker_video_setup(ps_worker_t *p, uint32_t nservers)
{
    const ps_worker_opts_t *o = p->o;
    int depth, shift, rc;
    char err[1024];
    if (parse_model(o->model, &depth, &shift)) {
        ps_error("--model: unknown model \"%s\" (smoke, tsm-r18|34|50, tsn-r18|34|50)", o->model);
        return PS_EINVAL;
    }
    if (!o->eval && !*o->train_list) {
        ps_error("--model %s needs --train-list (and --root where the frame folders are)", o->model);
        return PS_EINVAL;
    }
    if (o->eval && !*o->val_list) {
        ps_error("--eval needs --val-list");
        return PS_EINVAL;
    }
    struct ps_worker_video *v = calloc(1, sizeof *v);
    if (!v) return PS_ENOMEM;
    v->be = &ps_backend_cpu; /* until --device is open */
    p->vid = v;
    if (!o->eval && (rc = load_list(o, o->train_list, &v->train))) return rc;
    if (*o->val_list && (rc = load_list(o, o->val_list, &v->val))) return rc;
    int classes = o->num_classes;
    if (!classes) {
        if (v->train) classes = ps_video_list_num_classes(v->train);
        if (v->val && ps_video_list_num_classes(v->val) > classes) classes = ps_video_list_num_classes(v->val);
    }
    if (classes < 2) {
        ps_error("the lists hold %d class(es); give --num-classes", classes);
        return PS_EINVAL;
    }
    base_opts(o, &v->topt);
    v->topt.train = 1;
    v->topt.batch = p->batch;
    base_opts(o, &v->vopt);
    v->vopt.train = 0;
    v->vopt.n_clips = o->val_clips;
    v->vopt.batch = o->val_batch > 0 ? o->val_batch : p->batch;
    v->vopt.shuffle = 0;
    v->vopt.drop_last = 0;
    if (ps_video_opts_check(&v->topt, err, sizeof err) || ps_video_opts_check(&v->vopt, err, sizeof err)) {
        ps_error("data options: %s", err);
        return PS_EINVAL;
    }
    v->K = ps_video_clips_per_sample(&v->vopt);
    if (v->val) {
        size_t shortv = 0;
        for (size_t i = 0; i < ps_video_list_size(v->val); i++)
            shortv += ps_video_list_frames(v->val, i) <= o->frames;
        if (shortv)
            ps_warn("%s: %zu of %zu videos have at most --frames %d frames: TSM's test sampling "
                    "then takes frame 1 for every segment (no motion in those clips)",
                    o->val_list, shortv, ps_video_list_size(v->val), o->frames);
    }
    v->max_clips = p->batch > v->vopt.batch * v->K ? p->batch : v->vopt.batch * v->K;

    ps_model_config_t cfg;
    ps_model_config_default(&cfg);
    cfg.depth = depth;
    cfg.shift = shift;
    cfg.num_classes = classes;
    cfg.n_segment = o->frames;
    cfg.dropout = o->dropout;
    cfg.partial_bn = o->partial_bn;
    if (o->bn_mode >= 0) {
        cfg.bn_mode = o->bn_mode;
        cfg.partial_bn = o->bn_mode == PS_MODEL_BN_PARTIAL;
    }
    cfg.width = o->width;
    if ((rc = ps_engine_init(&v->ctx, o->threads)) < 0) {
        ps_error("engine init failed: %s", ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_worker_open_device(o, &v->ctx, &v->be)))
        return rc;
    if ((rc = ps_worker_video_precision(p, o->precision)))
        return rc;
    if ((rc = ps_model_create(&v->m, &cfg, v->be, &v->ctx, v->max_clips, o->size, o->size)))
        return rc;
    if ((rc = v->be->sync(&v->ctx)))
        return rc;
    ps_model_init(v->m, o->seed, 0);
    static const char *const bn_names[] = {"train", "partial", "frozen"};
    ps_info("BN mode %s", bn_names[ps_model_bn_mode(v->m)]);
    ps_model_set_seed(v->m, o->seed);
    if (*o->weights) {
        rc = ps_model_load(v->m, o->weights, o->eval ? PS_MODEL_LOAD_STRICT : PS_MODEL_LOAD_REPLACE_FC);
        if (rc) return rc;
        ps_info("weights loaded from %s%s", o->weights, ps_model_fc_replaced(v->m) ? " (fc replaced)" : "");
    }
    v->nspecs = ps_model_tensor_specs(v->m, &v->specs);
    if (v->nspecs < 0) return v->nspecs;
    v->nparams = v->nspecs;
    if (o->bn_sync && (rc = add_stat_specs(v))) return rc;
    /* The statistics travel exactly (raw fp32 whatever --dtype / --codec):
     * partitions of their own, PS_PART_EXACT (ps_optim_exact_groups). */
    uint32_t exact = v->nspecs > v->nparams ? 1u << STAT_GROUP : 0;
    rc = ps_partition_table_build_ex(&p->table, v->specs, (uint32_t)v->nspecs, (size_t)o->partition_bytes,
                                     nservers, exact);
    if (rc) {
        ps_error("cannot build the partition table: %s", ps_strerror(rc));
        return rc;
    }
    if (!v->param_of) v->param_of = malloc(sizeof(int) * (size_t)v->nspecs);
    size_t frame_floats = (size_t)3 * o->size * o->size;
    v->clips = malloc(sizeof(float) * frame_floats * (size_t)o->frames * (size_t)v->max_clips);
    v->labels = malloc(sizeof(int32_t) * (size_t)v->max_clips);
    v->idx = malloc(sizeof(int64_t) * (size_t)v->max_clips);
    p->numel = 0;
    for (int i = 0; i < v->nspecs; i++) p->numel += v->specs[i].numel;
    p->w = calloc(p->numel, sizeof(float));
    p->grad = calloc(p->numel, sizeof(float));
    p->mom = o->standalone ? calloc(p->numel, sizeof(float)) : NULL;
    if (!v->param_of || !v->clips || !v->labels || !v->idx || !p->w || !p->grad || (o->standalone && !p->mom)) {
        ps_error("out of memory for the %s model / batch buffers", o->model);
        return PS_ENOMEM;
    }
    int np;
    const ps_model_param_t *par = ps_model_params(v->m, &np);
    size_t off = 0;
    const ps_model_buffer_t *bu = ps_model_buffers(v->m, NULL);
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
    if (v->nspecs > v->nparams)
        ps_info("BN running statistics: %d tensors averaged over the workers through the servers "
                "(--bn-sync)", v->nspecs - v->nparams);
    ps_info("model %s: %zu trainable parameters in %d tensors, %u partitions on %u server(s), "
            "%d classes, T=%d, %dx%d", o->model, p->numel, v->nspecs, p->table.nparts, nservers, classes,
            o->frames, o->size, o->size);
    return 0;
}

/* The optimizer groups of the TSM recipe (biases x2, BN no decay, new fc),
 * plus the AVERAGE group of the BN statistics when there are any. */
int ps_worker_video_groups(ps_worker_t *p)
{
    int n = ps_model_groups(p->vid->m, p->optim.groups, PS_OPTIM_MAX_GROUPS);
    if (n < 0) return n;
    if (p->vid->nspecs > p->vid->nparams) {
        if (n != STAT_GROUP || n + 1 > PS_OPTIM_MAX_GROUPS) return PS_EINVAL;
        p->optim.groups[n] = (ps_param_group_t){1.0f, 0.0f};
        p->optim.group_kind[n++] = PS_GROUP_AVERAGE;
    }
    p->optim.ngroups = n;
    return 0;
}

void ps_worker_video_teardown(ps_worker_t *p)
{
    struct ps_worker_video *v = p->vid;
    if (!v) return;
    ps_video_loader_destroy(&v->tl);
    ps_video_loader_destroy(&v->vl);
    ps_video_list_free(&v->train);
    ps_video_list_free(&v->val);
    v->be->sync(&v->ctx);
    ps_model_destroy(&v->m);
    v->be->release(&v->ctx);
    ps_ctx_free(&v->ctx);
    free(v->specs);
    free(v->param_of);
    free(v->clips);
    free(v->labels);
    free(v->idx);
    free(v);
    p->vid = NULL;
}

/* p->w -> the model's tensors (and BN statistics). */
static void scatter(ps_worker_t *p)
{
    struct ps_worker_video *v = p->vid;
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

double ps_worker_video_compute(ps_worker_t *p, uint64_t step)
{
    struct ps_worker_video *v = p->vid;
    p->t_data = 0;
    if (!v->tl) {
        /* Created on first use: the rank is known only after HELLO. */
        char err[1024];
        v->topt.rank = p->rank;
        v->topt.world = p->nworkers;
        if (ps_video_loader_new(v->train, &v->topt, &v->tl, err, sizeof err)) {
            ps_error("training loader: %s", err);
            p->compute_rc = PS_EINVAL;
            return NAN;
        }
        if (ps_video_loader_batches(v->tl) == 0) {
            ps_error("%s: %zu videos are fewer than one global batch of %d x %d", p->o->train_list,
                     ps_video_list_size(v->train), p->nworkers, p->batch);
            p->compute_rc = PS_EINVAL;
            return NAN;
        }
        ps_info("epoch = %zu steps (%zu samples per rank)", ps_video_loader_batches(v->tl),
                ps_video_loader_samples(v->tl));
    }
    size_t bpe = ps_video_loader_batches(v->tl);
    uint64_t epoch = step / bpe;
    size_t b = (size_t)(step % bpe);
    if (ps_video_loader_epoch(v->tl) != epoch || ps_video_loader_position(v->tl) != b)
        ps_video_loader_seek(v->tl, epoch, b);
    int n = ps_video_loader_next(v->tl, v->clips, v->labels, v->idx, &p->t_data);
    if (n != p->batch) {
        ps_error("training data: %s", n < 0 ? ps_video_loader_error(v->tl) : "short batch");
        p->compute_rc = n < 0 ? n : PS_ESTATE;
        return NAN;
    }
    scatter(p);
    float loss = NAN;
    ps_model_zero_grad(v->m);
    int rc = ps_model_forward(v->m, v->clips, n, v->labels, 1, &loss);
    if (!rc)
        rc = ps_model_backward(v->m);
    if (!rc)
        rc = v->be->sync(&v->ctx);
    if (rc) {
        ps_error("forward/backward failed at step %llu: %s", (unsigned long long)step, ps_strerror(rc));
        p->compute_rc = rc;
        return NAN;
    }
    int np;
    const ps_model_param_t *par = ps_model_params(v->m, &np);
    const ps_model_buffer_t *bu = ps_model_buffers(v->m, NULL);
    size_t off = 0;
    for (int i = 0; i < v->nspecs; i++) {
        size_t n = v->specs[i].numel;
        if (i < v->nparams) {
            memcpy(p->grad + off, par[v->param_of[i]].g, sizeof(float) * n);
        } else {
            /* AVERAGE group: w_pulled - local (ps_optim.h) */
            const float *loc = bu[v->param_of[i]].f32;
            for (size_t k = 0; k < n; k++) p->grad[off + k] = p->w[off + k] - loc[k];
        }
        off += n;
    }
    return loss;
}

/* Validation pass; with pred != NULL one CSV row per video: list index,
 * frame_dir, label, predicted class and the (clip-averaged) logits. */
static double video_eval(ps_worker_t *p, double *top1, double *top5, size_t *videos, FILE *pred)
{
    struct ps_worker_video *v = p->vid;
    char err[1024];
    *top1 = *top5 = NAN;
    if (videos) *videos = 0;
    p->val_nonfinite = 0;
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
        if (ps_model_forward(v->m, v->clips, n * K, NULL, 0, NULL) || v->be->sync(&v->ctx))
            break;
        const float *lg = ps_model_logits(v->m);
        for (int i = 0; i < n; i++) {
            /* multi-clip: mean of the clips' scores (TSM's test) */
            double mx = -INFINITY, se = 0;
            int finite = 1;
            for (int c = 0; c < C; c++) {
                avg[c] = 0;
                for (int k = 0; k < K; k++) avg[c] += lg[(size_t)(i * K + k) * C + c];
                avg[c] /= K;
                finite &= isfinite(avg[c]) != 0;
                if (avg[c] > mx) mx = avg[c];
            }
            int y = v->labels[i];
            count++;
            if (!finite) {
                /* A diverged model: NaN compares false with everything, so
                 * the rank count below would call the video correct.  It
                 * is wrong for top-1 and top-5, and the loss is NaN so the
                 * user sees it. */
                bad++;
                loss = NAN;
            } else {
                int rank = 0;
                for (int c = 0; c < C; c++) se += exp(avg[c] - mx);
                loss += -(avg[y] - mx - log(se));
                for (int c = 0; c < C; c++) rank += avg[c] > avg[y] || (avg[c] == avg[y] && c < y);
                c1 += rank < 1;
                c5 += rank < 5;
            }
            if (pred) {
                int best = finite ? 0 : -1; /* -1: no prediction from non-finite logits */
                for (int c = 1; c < C && finite; c++) best = avg[c] > avg[best] ? c : best;
                fprintf(pred, "%lld,%s,%d,%d", (long long)v->idx[i],
                        ps_video_list_name(v->val, (size_t)v->idx[i]), y, best);
                for (int c = 0; c < C; c++) fprintf(pred, ",%.9g", avg[c]);
                fputc('\n', pred);
            }
        }
    }
    free(avg);
    if (n < 0) {
        ps_error("validation data: %s", ps_video_loader_error(v->vl));
        return NAN;
    }
    if (!count) return NAN;
    p->val_nonfinite = bad;
    if (bad)
        ps_warn("validation: %zu of %zu videos have non-finite logits (counted wrong; loss NaN)", bad,
                count);
    *top1 = (double)c1 / count;
    *top5 = (double)c5 / count;
    if (videos) *videos = count;
    return loss / count;
}

double ps_worker_video_eval(ps_worker_t *p, double *top1, double *top5, size_t *videos)
{
    return video_eval(p, top1, top5, videos, NULL);
}

struct ps_model *ps_worker_video_model(ps_worker_t *p, struct ps_ctx **ctx,
                                       const struct ps_backend **be)
{
    *ctx = p->vid ? &p->vid->ctx : NULL;
    *be = p->vid ? p->vid->be : NULL;
    return p->vid ? p->vid->m : NULL;
}

int ps_worker_video_save(ps_worker_t *p, const char *path)
{
    scatter(p);
    return ps_model_save(p->vid->m, path);
}

uint32_t ps_worker_video_bn_crc(const ps_worker_t *p, int *ntensors)
{
    const struct ps_worker_video *v = p->vid;
    uint32_t crc = 0;
    if (ntensors) *ntensors = v ? v->nspecs - v->nparams : 0;
    if (!v || v->nspecs == v->nparams) return 0;
    size_t off = 0;
    for (int i = 0; i < v->nparams; i++) off += v->specs[i].numel;
    return ps_crc32c(crc, p->w + off, (p->numel - off) * sizeof(float));
}

size_t ps_worker_video_clip_floats(const ps_worker_t *p)
{
    return (size_t)3 * p->o->size * p->o->size * p->o->frames;
}

double ps_worker_video_epoch(const ps_worker_t *p, uint64_t steps)
{
    size_t bpe = p->vid && p->vid->tl ? ps_video_loader_batches(p->vid->tl) : 0;
    return bpe ? (double)steps / (double)bpe : 0;
}

int ps_worker_run_eval(ps_worker_t *p)
{
    if (!p->vid) {
        ps_error("--eval works on video models (--model tsm-r18 ...)");
        return PS_EINVAL;
    }
    if (!*p->o->weights)
        ps_warn("--eval without --weights: evaluating the initialisation");
    double t0 = ps_worker_now(), top1, top5;
    size_t n = 0;
    FILE *pred = NULL;
    const char *pp = p->o->predictions;
    if (pp && *pp) {
        if (!(pred = fopen(pp, "w"))) {
            ps_error("--predictions %s: %s", pp, strerror(errno));
            return PS_EIO;
        }
        int C = ps_model_config(p->vid->m)->num_classes;
        fprintf(pred, "index,video,label,pred");
        for (int c = 0; c < C; c++) fprintf(pred, ",logit%d", c);
        fputc('\n', pred);
    }
    double loss = video_eval(p, &top1, &top5, &n, pred);
    double dt = ps_worker_now() - t0;
    if (pred && (ferror(pred) | fclose(pred))) {
        ps_error("--predictions %s: write failed", pp);
        return PS_EIO;
    }
    if (!n) return PS_EIO;
    printf("final: model=%s weights=%s videos=%zu clips=%d top1=%.4f top5=%.4f val_loss=%.6f "
           "clips_per_s=%.2f wall_s=%.1f", p->o->model, p->o->weights, n, p->vid->K, top1, top5, loss,
           (double)n * p->vid->K / dt, dt);
    if (p->val_nonfinite) printf(" nonfinite=%zu", p->val_nonfinite);
    printf("\n");
    fflush(stdout);
    return 0;
}
