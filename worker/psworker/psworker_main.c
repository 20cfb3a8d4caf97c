/* psworker: one data-parallel training process.  With --servers it trains
 * against psd servers (HELLO, INIT from rank 0, BARRIER, PULL, then
 * PUSHPULL per step); with --standalone it trains the same model with the
 * same optimizer code alone, the single-process reference the cluster run is
 * compared with.  Exit status: 0 on success, 1 on a training or connection
 * error, 2 on bad options. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ps_config.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/models/ps_model.h"
#include "worker/psworker/psworker.h"

static const char usage[] =
    "[--config FILE] (--servers tcp://H:P[,tcp://H:P...] | --standalone) [options]\n"
    "       psworker --eval --model tsm-r18 --weights model.safetensors --val-list L --root R\n"
    "       psworker --eval --model retinanet-r18 --weights W --val-json J --val-root R\n"
    "Train a model with sync data-parallel SGD through psd servers, or alone with\n"
    "--standalone: the built-in smoke model (2-layer MLP on generated data), or a\n"
    "video model (tsm-r18|34|50 with temporal shift, tsn-r18|34|50 without) on a\n"
    "TSM-format dataset (--train-list/--val-list/--root; psdata gen-video makes one).\n"
    "Rank r of W trains on global batch positions r*B..r*B+B-1 of each step's\n"
    "W*B samples, so --standalone --batch W*B sees exactly the same data.\n"
    "Writes DIR/metrics-rankR.csv and (rank 0) DIR/model.safetensors with --out DIR;\n"
    "the last stdout line starts with \"final:\" and holds key=value results.\n"
    "--mode allreduce --peers tcp://H:P,... --rank R: no servers, the workers average\n"
    "gradients over a ring (or NCCL) and each applies the same optimizer locally.";

static void opts_default(ps_worker_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->servers = strdup("");
    o->rank = -1;
    o->num_workers = 1;
    o->model = strdup("smoke");
    o->mode = strdup("sync");
    o->steps = 100;
    o->batch = 32;
    o->lr = 0.05f;
    o->momentum = 0.9f;
    o->gamma = 0.1f;
    o->warmup_factor = 0.1f;
    o->schedule = strdup("const");
    o->milestones = strdup("");
    o->dtype = strdup(""); /* follows --precision */
    o->codec = strdup("raw");
    o->dgc_momentum = -1;
    o->topk_warmup_steps = -1;
    o->pull_codec = strdup("");
    o->curve_server_keys = strdup("");
    o->curve_public_key = strdup("");
    o->curve_secret_key = strdup("");
    o->device = strdup("cpu");
    o->bn = strdup("");
    o->partition_bytes = 4u << 20;
    o->seed = 1;
    o->data_seed = 1;
    o->out = strdup("");
    o->log_level = strdup("info");
    o->progress_every = 10;
    o->eval_samples = 1024;
    /* The client's defaults: a sync PUSHPULL waits for the slowest worker,
     * which may be rank 0 validating a video model for minutes on a busy
     * machine, and every resend costs a whole gradient (45 MB for R18). */
    o->timeout_ms = 300000;
    o->retry_ms = 5000;
    o->heartbeat_ms = 1000;
    o->train_list = strdup("");
    o->val_list = strdup("");
    o->root = strdup("");
    o->tmpl = strdup("img_%05d.jpg");
    o->weights = strdup("");
    o->train_json = strdup("");
    o->val_json = strdup("");
    o->val_root = strdup("");
    o->fpn_channels = 256;
    o->freeze_at = 2;
    o->score_thresh = 0.05f;
    o->bn_sync = 1;
    o->predictions = strdup("");
    o->frames = 8;
    o->size = 112;
    o->flip = 1;
    o->loader_threads = 2;
    o->prefetch = 2;
    o->val_clips = 1;
    o->dropout = 0.5f;
    o->width = 64;
    o->peers = strdup("");
    o->allreduce = strdup("ring");
    o->ring_conns = 1;
    o->compute = strdup("");
    o->overlap = strdup("");
    o->precision = strdup("fp32");
    o->loss_scale = strdup("");
    o->loss_scale_window = 2000;
    o->debug_overflow_at = -1;
}

static void opts_free(ps_worker_opts_t *o)
{
    free(o->servers), free(o->model), free(o->mode), free(o->schedule), free(o->milestones);
    free(o->dtype), free(o->codec), free(o->out), free(o->log_level), free(o->pull_codec);
    free(o->curve_server_keys), free(o->curve_public_key), free(o->curve_secret_key);
    free(o->device), free(o->bn), free(o->precision), free(o->loss_scale);
    free(o->train_list), free(o->val_list), free(o->root), free(o->tmpl), free(o->weights);
    free(o->train_json), free(o->val_json), free(o->val_root);
    free(o->predictions);
    free(o->peers), free(o->allreduce), free(o->compute);
    free(o->overlap);
}

/* --precision / --loss-scale / --loss-scale-window / --debug-overflow-at. */
static int loss_scale_check(ps_worker_opts_t *o)
{
    if (strcmp(o->precision, "fp32") && strcmp(o->precision, "fp16") &&
        strcmp(o->precision, "bf16")) {
        fprintf(stderr, "psworker: --precision: expected fp32|fp16|bf16, got \"%s\"\n",
                o->precision);
        return PS_EINVAL;
    }
    if (strcmp(o->precision, "fp32") && (!ps_worker_is_video(o) || !strcmp(o->device, "cpu"))) {
        /* fp16/bf16 compute is the CUDA backend's (docs/cuda.md): refuse
         * rather than train in fp32 while the user believes it is fp16. */
        fprintf(stderr, "psworker: --precision %s needs a video model on --device cuda[:N] "
                "(the CPU engine computes in fp32)\n", o->precision);
        return PS_EINVAL;
    }
    ps_loss_scale_config_default(&o->ls_cfg);
    const char *ls = *o->loss_scale ? o->loss_scale
                     : !strcmp(o->precision, "fp16") ? "dynamic" : "off";
    if (!strcmp(ls, "off")) {
        o->ls_on = 0;
    } else if (!strcmp(ls, "dynamic")) {
        o->ls_on = 1;
        o->ls_cfg.growth_interval = o->loss_scale_window;
    } else if (!strncmp(ls, "static:", 7)) {
        char *end;
        double v = strtod(ls + 7, &end);
        int e;
        if (end == ls + 7 || *end || !(v >= 1 && v <= 16777216.0) || frexp(v, &e) != 0.5) {
            fprintf(stderr, "psworker: --loss-scale static:S: S must be a power of two in "
                    "[1, 2^24], got \"%s\"\n", ls + 7);
            return PS_EINVAL;
        }
        o->ls_on = 1;
        /* min = init = max: overflows still skip the step, the scale stays. */
        o->ls_cfg.init_scale = o->ls_cfg.min_scale = o->ls_cfg.max_scale = (float)v;
    } else {
        fprintf(stderr, "psworker: --loss-scale: expected dynamic|static:S|off, got \"%s\"\n", ls);
        return PS_EINVAL;
    }
    if (o->loss_scale_window < 1 || o->loss_scale_window > 1000000) {
        fprintf(stderr, "psworker: --loss-scale-window must be in [1, 1000000]\n");
        return PS_EINVAL;
    }
    if (o->debug_overflow_at < -1) {
        fprintf(stderr, "psworker: --debug-overflow-at must be a step >= 0 (or -1 = off)\n");
        return PS_EINVAL;
    }
    if (o->debug_overflow_at >= 0 && !o->ls_on) {
        fprintf(stderr, "psworker: --debug-overflow-at needs loss scaling (--loss-scale "
                "dynamic|static:S): without it an Inf gradient is a divergence, not a skip\n");
        return PS_EINVAL;
    }
    return 0;
}

/* Range checks the option table cannot express; messages name the flag. */
static int opts_check(ps_worker_opts_t *o)
{
    if (ps_log_set_level_str(o->log_level)) {
        fprintf(stderr, "psworker: --log-level: expected error|warn|info|debug, got \"%s\"\n",
                o->log_level);
        return PS_EINVAL;
    }
    /* --dtype "" (default): the wire follows --precision (fp16 compute sends
     * fp16 gradients and gets fp16 weights back; the masters stay fp32 on
     * the servers); an invalid --precision is reported below. */
    if (!*o->dtype) {
        if (ps_dtype_parse(o->precision, &o->dt))
            o->dt = PS_DT_FP32;
        char *name = strdup(ps_dtype_name(o->dt)); /* the name other code prints */
        if (!name)
            return PS_ENOMEM;
        free(o->dtype);
        o->dtype = name;
    } else if (*o->dtype && ps_dtype_parse(o->dtype, &o->dt)) {
        fprintf(stderr, "psworker: --dtype: expected fp32|fp16|bf16, got \"%s\"\n", o->dtype);
        return PS_EINVAL;
    }
    if (ps_codec_parse(o->codec, &o->codec_id)) {
        fprintf(stderr, "psworker: --codec: expected raw|lz4|topk|sign, got \"%s\"\n", o->codec);
        return PS_EINVAL;
    }
    o->pull_codec_id = -1;
    if (*o->pull_codec) {
        ps_codec_t pc;
        if (ps_codec_parse(o->pull_codec, &pc) || (pc != PS_CODEC_RAW && pc != PS_CODEC_LZ4)) {
            fprintf(stderr, "psworker: --pull-codec: expected raw|lz4 (weights are never sent "
                    "lossy), got \"%s\"\n", o->pull_codec);
            return PS_EINVAL;
        }
        o->pull_codec_id = (int)pc;
    }
    if (o->dgc_momentum < -1 || o->dgc_momentum > 1) {
        fprintf(stderr, "psworker: --dgc-momentum must be 1 (on), 0 (off) or -1 (auto)\n");
        return PS_EINVAL;
    }
    if (o->topk_warmup_steps < -1) {
        fprintf(stderr, "psworker: --topk-warmup-steps must be >= 0 (or -1 = auto)\n");
        return PS_EINVAL;
    }
    if (!(o->topk_ratio >= 0 && o->topk_ratio <= 1)) {
        fprintf(stderr, "psworker: --topk-ratio must be in (0, 1] (0 = default %g)\n",
                (double)PS_CODEC_TOPK_DEFAULT_RATIO);
        return PS_EINVAL;
    }
    {
        int nk = !!*o->curve_server_keys + !!*o->curve_public_key + !!*o->curve_secret_key;
        if (nk != 0 && nk != 3) {
            fprintf(stderr, "psworker: CURVE needs all three of --curve-server-key, "
                    "--curve-public-key and --curve-secret-key (or none)\n");
            return PS_EINVAL;
        }
    }
    if (!*o->bn)
        o->bn_mode = -1;
    else if (!strcmp(o->bn, "train"))
        o->bn_mode = PS_MODEL_BN_TRAIN;
    else if (!strcmp(o->bn, "partial"))
        o->bn_mode = PS_MODEL_BN_PARTIAL;
    else if (!strcmp(o->bn, "frozen"))
        o->bn_mode = PS_MODEL_BN_FROZEN;
    else {
        fprintf(stderr, "psworker: --bn: expected train|partial|frozen, got \"%s\"\n", o->bn);
        return PS_EINVAL;
    }
    if (o->bn_mode == PS_MODEL_BN_TRAIN && o->partial_bn) {
        fprintf(stderr, "psworker: --bn train contradicts --partial-bn\n");
        return PS_EINVAL;
    }
    if (strcmp(o->device, "cpu")) {
        if (!ps_worker_is_video(o)) {
            fprintf(stderr, "psworker: --device %s: the smoke model runs on the CPU only "
                    "(--device applies to the video models)\n", o->device);
            return PS_EINVAL;
        }
        if (ps_engine_find_device(o->device, NULL, NULL)) { /* the cause is logged */
            fprintf(stderr, "psworker: --device %s: not a device of this psworker\n", o->device);
            return PS_EINVAL;
        }
    }
    if (loss_scale_check(o))
        return PS_EINVAL;
    if (strcmp(o->mode, "sync") && strcmp(o->mode, "async") && strcmp(o->mode, "ssp") &&
        strcmp(o->mode, "allreduce")) {
        fprintf(stderr, "psworker: --mode: expected sync|async|ssp|allreduce, got \"%s\"\n",
                o->mode);
        return PS_EINVAL;
    }
    if (*o->overlap && strcmp(o->overlap, "on") && strcmp(o->overlap, "off")) {
        fprintf(stderr, "psworker: --overlap: expected on|off, got \"%s\"\n", o->overlap);
        return PS_EINVAL;
    }
    if (o->steps < 1 || o->steps > (UINT64_C(1) << 40)) {
        fprintf(stderr, "psworker: --steps must be in [1, 2^40]\n");
        return PS_EINVAL;
    }
    if (o->batch < 1 || o->batch > (1 << 20)) {
        fprintf(stderr, "psworker: --batch must be in [1, 1048576] (got %d)\n", o->batch);
        return PS_EINVAL;
    }
    if (o->eval_samples < 1 || o->eval_samples > (1 << 20)) {
        fprintf(stderr, "psworker: --eval-samples must be in [1, 1048576]\n");
        return PS_EINVAL;
    }
    if (o->partition_bytes < 4 || o->partition_bytes > (UINT64_C(1) << 32)) {
        fprintf(stderr, "psworker: --partition-bytes must be in [4, 4 GiB]\n");
        return PS_EINVAL;
    }
    if (o->step_sleep_ms < 0 || o->step_sleep_ms > 60000) {
        fprintf(stderr, "psworker: --step-sleep-ms must be in [0, 60000]\n");
        return PS_EINVAL;
    }
    if (o->frames < 1 || o->frames > 256 || o->size < 32 || o->size > 1024 || o->val_clips < 1 ||
        o->val_clips > 32 || o->loader_threads < 0 || o->loader_threads > 64 || o->prefetch < 1 ||
        o->prefetch > 64 || o->val_every < 0 || o->val_batch < 0 || o->num_classes < 0 ||
        o->threads < 0 || !(o->dropout >= 0 && o->dropout < 1) || o->width < 8 || o->width > 512) {
        fprintf(stderr, "psworker: video options out of range: --frames 1..256, --size 32..1024, "
                "--val-clips 1..32, --loader-threads 0..64, --prefetch 1..64, --dropout [0,1), "
                "--width 8..512, counts >= 0\n");
        return PS_EINVAL;
    }
    if (o->bn_sync != 0 && o->bn_sync != 1) {
        fprintf(stderr, "psworker: --bn-sync must be 0 or 1\n");
        return PS_EINVAL;
    }
    if (*o->predictions && !o->eval) {
        fprintf(stderr, "psworker: --predictions goes with --eval (per-video rows of that evaluation)\n");
        return PS_EINVAL;
    }
    if (o->eval)
        o->standalone = 1; /* evaluation needs no servers */
    if (o->standalone)
        return 0;
    if (!strcmp(o->mode, "allreduce"))
        return ps_worker_allreduce_check(o);
    if (!*o->servers) {
        fprintf(stderr, "psworker: give --servers tcp://HOST:PORT[,...] or --standalone\n");
        return PS_EINVAL;
    }
    if (o->num_workers < 1 || o->num_workers > 65536) {
        fprintf(stderr, "psworker: --num-workers must be in [1, 65536]\n");
        return PS_EINVAL;
    }
    if (o->rank < -1 || o->rank >= o->num_workers) {
        fprintf(stderr, "psworker: --rank must be -1 (assigned) or in [0, %d)\n",
                o->num_workers);
        return PS_EINVAL;
    }
    if (o->timeout_ms < 0 || o->retry_ms < 0 || o->heartbeat_ms < 0) {
        fprintf(stderr, "psworker: --timeout-ms, --retry-ms, --heartbeat-ms must be >= 0\n");
        return PS_EINVAL;
    }
    return 0;
}

static uint32_t count_servers(const char *list)
{
    uint32_t n = 0;
    int in_tok = 0;
    for (const char *q = list; *q; q++) {
        if (*q == ',') in_tok = 0;
        else if (!in_tok) in_tok = 1, n++;
    }
    return n;
}

int main(int argc, char **argv)
{
    ps_worker_opts_t o;
    ps_worker_t p;
    int npos = 0, rc;

    /* Before any thread exists: a fast OpenBLAS core for this CPU and bounded
     * OpenMP spinning (both read by the libraries before main; may re-exec). */
    ps_blas_autoselect(argc, argv);
    opts_default(&o);
    const ps_opt_t table[] = {
        {"servers", PS_OPT_STRING, &o.servers, "comma-separated psd endpoints, server 0 first"},
        {"standalone", PS_OPT_BOOL, &o.standalone, "train alone, no servers (reference run)"},
        {"rank", PS_OPT_INT, &o.rank, "worker rank, -1 = assigned by server 0"},
        {"num-workers", PS_OPT_INT, &o.num_workers, "number of workers W in the cluster"},
        {"model", PS_OPT_STRING, &o.model, "smoke | tsm-r18|34|50 | tsn-r18|34|50 | retinanet-r18|34|50"},
        {"mode", PS_OPT_STRING, &o.mode, "servers' mode sync|async|ssp (sync checks versions)"},
        {"steps", PS_OPT_UINT64, &o.steps, "training steps (iterations)"},
        {"batch", PS_OPT_INT, &o.batch, "samples per worker per step (B)"},
        {"lr", PS_OPT_FLOAT, &o.lr, "base learning rate"},
        {"momentum", PS_OPT_FLOAT, &o.momentum, "SGD momentum (0 = plain SGD)"},
        {"dampening", PS_OPT_FLOAT, &o.dampening, "momentum dampening (PyTorch)"},
        {"nesterov", PS_OPT_BOOL, &o.nesterov, "Nesterov momentum"},
        {"weight-decay", PS_OPT_FLOAT, &o.weight_decay, "L2 weight decay"},
        {"ref-batch", PS_OPT_INT, &o.ref_batch, "linear scaling rule: lr*W*B/ref (0 = off)"},
        {"warmup-steps", PS_OPT_UINT64, &o.warmup_steps, "linear warmup steps"},
        {"warmup-factor", PS_OPT_FLOAT, &o.warmup_factor, "warmup starts at factor*lr"},
        {"schedule", PS_OPT_STRING, &o.schedule, "lr schedule const|step|cosine"},
        {"milestones", PS_OPT_STRING, &o.milestones, "step schedule: steps \"30,60\""},
        {"gamma", PS_OPT_FLOAT, &o.gamma, "step schedule: lr *= gamma at each milestone"},
        {"min-lr", PS_OPT_FLOAT, &o.min_lr, "cosine schedule: final lr"},
        {"dtype", PS_OPT_STRING, &o.dtype, "wire dtype fp32|fp16|bf16 (\"\" = --precision)"},
        {"codec", PS_OPT_STRING, &o.codec, "pushed gradients raw|lz4|topk|sign (topk/sign: error feedback)"},
        {"pull-codec", PS_OPT_STRING, &o.pull_codec, "pulled weights raw|lz4 (\"\" = follows --codec)"},
        {"topk-ratio", PS_OPT_FLOAT, &o.topk_ratio, "topk: fraction of elements sent (0 = default)"},
        {"ef-rounding", PS_OPT_BOOL, &o.ef_rounding, "fp16/bf16 pushes: feed the rounding error back"},
        {"dgc-momentum", PS_OPT_INT, &o.dgc_momentum, "topk/sign: momentum kept on the worker (DGC), plain SGD on psd: 1, 0, -1 = auto (sign, topk-ratio <= 1%)"},
        {"topk-warmup-steps", PS_OPT_INT, &o.topk_warmup_steps, "topk: density 25% down to --topk-ratio over N steps (-1 = steps/4)"},
        {"curve-server-key", PS_OPT_STRING, &o.curve_server_keys, "CURVE: server public key file(s) FILE[,FILE...]"},
        {"curve-public-key", PS_OPT_STRING, &o.curve_public_key, "CURVE: this worker's public key file"},
        {"curve-secret-key", PS_OPT_STRING, &o.curve_secret_key, "CURVE: this worker's secret key file"},
        {"device", PS_OPT_STRING, &o.device, "compute device cpu | cuda | cuda:N (video models)"},
        {"partition-bytes", PS_OPT_UINT64, &o.partition_bytes, "max bytes per partition"},
        {"seed", PS_OPT_UINT64, &o.seed, "weight initialisation seed"},
        {"data-seed", PS_OPT_UINT64, &o.data_seed, "generated dataset seed"},
        {"out", PS_OPT_STRING, &o.out, "run directory for CSV and model (\"\" = none)"},
        {"progress-every", PS_OPT_INT, &o.progress_every, "progress line every N steps (0 = off)"},
        {"eval-samples", PS_OPT_INT, &o.eval_samples, "held-out samples for eval loss"},
        {"timeout-ms", PS_OPT_INT, &o.timeout_ms, "fail a request unanswered this long (0 = never)"},
        {"retry-ms", PS_OPT_INT, &o.retry_ms, "resend an unanswered request after this"},
        {"heartbeat-ms", PS_OPT_INT, &o.heartbeat_ms, "heartbeat period (0 = off)"},
        {"step-sleep-ms", PS_OPT_INT, &o.step_sleep_ms, "sleep this long per step (emulated compute, tests)"},
        {"shutdown-servers", PS_OPT_BOOL, &o.shutdown_servers, "rank 0 shuts the servers down at the end"},
        {"log-level", PS_OPT_STRING, &o.log_level, "error|warn|info|debug"},
        {"train-list", PS_OPT_STRING, &o.train_list, "video: TSM list 'frame_dir num_frames label'"},
        {"val-list", PS_OPT_STRING, &o.val_list, "video: validation list"},
        {"root", PS_OPT_STRING, &o.root, "video: directory the lists' frame_dir are relative to"},
        {"tmpl", PS_OPT_STRING, &o.tmpl, "video: frame file template (img_%05d.jpg)"},
        {"packed", PS_OPT_BOOL, &o.packed, "video: the lists are psdata pack directories"},
        {"frames", PS_OPT_INT, &o.frames, "video: segments T per clip"},
        {"size", PS_OPT_INT, &o.size, "video: crop size (network input H = W)"},
        {"scale-size", PS_OPT_INT, &o.scale_size, "video: test resize of the shorter side (0 = size*256/224)"},
        {"flip", PS_OPT_INT, &o.flip, "video: random horizontal flip when training (0 for direction data)"},
        {"loader-threads", PS_OPT_INT, &o.loader_threads, "video: JPEG decode threads (0 = in the step)"},
        {"prefetch", PS_OPT_INT, &o.prefetch, "video: batches decoded ahead"},
        {"skip-bad", PS_OPT_BOOL, &o.skip_bad, "video: skip bad list entries / frames (counted)"},
        {"val-every", PS_OPT_INT, &o.val_every, "video: validate every N steps on rank 0 (0 = end only)"},
        {"val-batch", PS_OPT_INT, &o.val_batch, "video: videos per validation forward (0 = --batch)"},
        {"val-clips", PS_OPT_INT, &o.val_clips, "video: clips per validation video"},
        {"dropout", PS_OPT_FLOAT, &o.dropout, "video: dropout before fc"},
        {"partial-bn", PS_OPT_BOOL, &o.partial_bn, "video: TSM partial BN (only bn1 updates statistics)"},
        {"bn", PS_OPT_STRING, &o.bn, "video: BN mode train|partial|frozen (frozen: running stats, fixed affine)"},
        {"width", PS_OPT_INT, &o.width, "video: ResNet stem width (64 = torchvision)"},
        {"num-classes", PS_OPT_INT, &o.num_classes, "video: classes (0 = from the lists)"},
        {"threads", PS_OPT_INT, &o.threads, "video: compute threads (0 = all cores)"},
        {"eval", PS_OPT_BOOL, &o.eval, "evaluate --weights on --val-list and exit"},
        {"weights", PS_OPT_STRING, &o.weights, "safetensors to start from (or to evaluate with --eval)"},
        {"train-json", PS_OPT_STRING, &o.train_json, "detector: COCO training annotations (images under --root)"},
        {"val-json", PS_OPT_STRING, &o.val_json, "detector: COCO validation annotations"},
        {"val-root", PS_OPT_STRING, &o.val_root, "detector: validation image folder (\"\" = --root)"},
        {"fpn-channels", PS_OPT_INT, &o.fpn_channels, "detector: FPN and head channels (256 = torchvision)"},
        {"freeze-at", PS_OPT_INT, &o.freeze_at, "detector: frozen backbone stages (0 none, 2 = stem + layer1)"},
        {"score-thresh", PS_OPT_FLOAT, &o.score_thresh, "detector: validation keeps detections scoring above this (0.05)"},
        {"clip-grad", PS_OPT_FLOAT, &o.clip_grad, "detector: clip each worker's gradient to this L2 norm (0 = off)"},
        {"bn-sync", PS_OPT_INT, &o.bn_sync, "video: average BN running statistics over the workers (1) or not (0)"},
        {"save-all-ranks", PS_OPT_BOOL, &o.save_all_ranks, "every rank r > 0 also writes model-rank<r>.safetensors"},
        {"predictions", PS_OPT_STRING, &o.predictions, "--eval: write per-video predictions and logits to this CSV"},
        {"peers", PS_OPT_STRING, &o.peers, "--mode allreduce: every rank's endpoint tcp://H:P,... (rank r binds the r-th)"},
        {"allreduce", PS_OPT_STRING, &o.allreduce, "--mode allreduce: ring (TCP) | nccl (CUDA builds)"},
        {"ring-conns", PS_OPT_INT, &o.ring_conns, "--mode allreduce: connections to the right neighbour"},
        {"compute", PS_OPT_STRING, &o.compute, "synthetic:<model>:<ms>: real partition layout, sleep for compute"},
        {"overlap", PS_OPT_STRING, &o.overlap, "on|off: push each partition when its layers' backward ends, wait per layer in the next forward (default on for video models without --loss-scale)"},
        {"precision", PS_OPT_STRING, &o.precision, "compute precision fp32|fp16|bf16 (fp16/bf16: --device cuda)"},
        {"loss-scale", PS_OPT_STRING, &o.loss_scale, "dynamic | static:S | off (\"\" = dynamic for fp16, else off)"},
        {"loss-scale-window", PS_OPT_INT, &o.loss_scale_window, "dynamic loss scale: clean steps before it doubles"},
        {"debug-overflow-at", PS_OPT_INT, &o.debug_overflow_at, "testing: make this worker's gradient of step N Inf (-1 = off)"},
        {0},
    };

    ps_log_set_prog("psworker");
#ifdef PS_HAVE_CUDA
    ps_engine_add_device(&ps_device_cuda); /* --device cuda[:N] */
#endif
    rc = ps_config_parse(table, "psworker", usage, argc, argv, &npos);
    if (rc == 1) {
        opts_free(&o);
        return 0;
    }
    if (rc < 0) {
        opts_free(&o);
        return 2;
    }
    if (npos > 0) {
        fprintf(stderr, "psworker: unexpected argument \"%s\" (see --help)\n", argv[1]);
        opts_free(&o);
        return 2;
    }
    if (opts_check(&o)) {
        opts_free(&o);
        return 2;
    }
    if (ps_worker_is_synthetic(&o)) {
        rc = ps_worker_run_synthetic(&o);
        opts_free(&o);
        return rc == PS_EINVAL ? 2 : rc ? 1 : 0;
    }
    int ring = !o.standalone && !strcmp(o.mode, "allreduce");
    uint32_t nservers = o.standalone || ring ? 1 : count_servers(o.servers);
    if ((rc = ps_worker_setup(&p, &o, nservers))) {
        opts_free(&o);
        return rc == PS_EINVAL ? 2 : 1;
    }
    rc = o.eval ? (p.det ? ps_worker_det_run_eval(&p) : ps_worker_run_eval(&p))
         : o.standalone ? ps_worker_run_standalone(&p)
         : ring ? ps_worker_run_allreduce(&p) : ps_worker_run_cluster(&p);
    ps_worker_teardown(&p);
    opts_free(&o);
    if (rc)
        fprintf(stderr, "psworker: training failed: %s\n", ps_strerror(rc));
    return rc ? 1 : 0;
}
