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
 * asynchronous backend is synced before the host touches the arena.
 *
 * This file holds the task's row, its options and a training step; the
 * set-up is in task_video_setup.c, validation and --eval in
 * task_video_eval.c (task_video_internal.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/psworker/task_video_internal.h"

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
    ROW("zero-init-residual", PS_OPT_BOOL, &v->zero_init_residual, "video: the last BN weight of every residual "
        "branch starts at 0, so each block starts as the identity (torchvision's zero_init_residual): what trains "
        "ResNet-50 / I3D from scratch on small batches; needs --bn train or sync", "false");
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
    static const char *const modes[] = {"train", "partial", "frozen", "sync"};
    static const int mode_of[] = {PS_MODEL_BN_TRAIN, PS_MODEL_BN_PARTIAL, PS_MODEL_BN_FROZEN,
                                  PS_MODEL_BN_TRAIN};
    const char *bn = o->data.bn;
    v->bn_mode = -1;
    for (int i = 0; i < 4 && *bn; i++)
        if (!strcmp(bn, modes[i])) v->bn_mode = mode_of[i];
    v->bn_cross = !strcmp(bn, "sync");
    if (*bn && v->bn_mode < 0)
        return ps_worker_opt_error("--bn: expected train|partial|frozen|sync, got \"%s\"", bn);
    if (v->bn_mode == PS_MODEL_BN_TRAIN && v->partial_bn)
        return ps_worker_opt_error("--bn %s contradicts --partial-bn", bn);
    if (v->zero_init_residual && (v->bn_mode < 0 ? v->partial_bn : v->bn_mode != PS_MODEL_BN_TRAIN))
        return ps_worker_opt_error("--zero-init-residual needs trainable BN (--bn train or sync): a "
                                   "frozen or partial BN would keep each block's last BN weight at 0");
    if (o->data.recompute && strncmp(o->model, "tsm-", 4) && strncmp(o->model, "tsn-", 4))
        return ps_worker_opt_error("--recompute is implemented for the 2-D ResNets (tsm-*, tsn-*), "
                                   "not --model %s", o->model);
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

/* ---- a run ------------------------------------------------------------------- */

double ps_task_video_epoch(const ps_worker_t *p, uint64_t steps)
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
void ps_task_video_scatter(ps_worker_t *p)
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
    ps_task_video_scatter(p);
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

static void video_progress(ps_worker_t *p, uint64_t step, double loss, float lr, double per_s,
                           double t_data, double t_compute, double t_comm)
{
    const video_t *v = p->ts;
    const ps_video_clip_cost_t c = ps_video_clip_cost(v && v->tl ? v->tl : NULL);
    printf("iter %llu/%llu epoch %.2f loss %.4f lr %.5g clips/s %.1f data-wait %.1f ms "
           "compute %.1f ms comm-wait %.1f ms data %.1f kB/clip decode %.1f ms/clip "
           "arena %.1f MiB\n",
           (unsigned long long)step + 1, (unsigned long long)p->o->steps,
           ps_task_video_epoch(p, step + 1), loss, (double)lr, per_s, t_data * 1e3, t_compute * 1e3,
           t_comm * 1e3, c.bytes / 1e3, c.read_ms + c.decode_ms, p->arena_peak / 1048576.0);
}

static int video_save(ps_worker_t *p, const char *path)
{
    video_t *v = p->ts;
    ps_task_video_scatter(p);
    return ps_model_save(v->m, path);
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
    ps_task_video_scatter(p);
    return ps_model_export_onnx(v->m, path);
}

static ps_model_t *video_model_of(ps_worker_t *p) { return ((video_t *)p->ts)->m; }

static int video_hooks(ps_worker_t *p, ps_model_hookable_t *h, const char **why)
{
    (void)why;
    ps_model_hookable(video_model_of(p), h);
    return 1;
}

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
    .setup = ps_task_video_setup,
    .start = video_start,
    .compute = video_compute,
    .validate = ps_task_video_validate,
    .save = video_save,
    .progress = video_progress,
    .print_final = ps_task_video_print_final,
    .eval = ps_task_video_eval,
    .export_onnx = video_export,
    .loss_scale = video_loss_scale,
    .model = video_model_of,
    .hooks = video_hooks,
    .teardown = video_teardown,
};
