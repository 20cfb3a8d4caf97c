/* psworker's option table and the checks of the common groups; each task
 * checks its own options (task.h).  Messages go to stderr and name the flag;
 * a bad option is exit status 2. */
#include "worker/psworker/options.h"
#include "worker/psworker/task.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/comm/ps_allreduce.h"
#include "worker/engine/ps_engine.h"
#include "worker/psworker/task.h"
#ifdef PS_HAVE_CUDA
#include "worker/comm/ps_nccl.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#endif

static const char usage[] =
    "[--config FILE] (--servers tcp://H:P[,tcp://H:P...] | --standalone) [options]\n"
    "       psworker --eval --model tsm-r18 --weights model.safetensors --val-list L --root R\n"
    "       psworker --eval --model retinanet-r18 --weights W --val-json J --val-root R\n"
    "       psworker --export-onnx FILE.onnx --model tsm-r50 --weights W [--num-classes K]\n"
    "Train a model with sync data-parallel SGD through psd servers, or alone with\n"
    "--standalone: the built-in smoke model (2-layer MLP on generated data), a\n"
    "video model (tsm-r18|34|50 with temporal shift, tsn-r18|34|50 without, the 3-D\n"
    "i3d-r50-311|333, r3d-18, mc3-18, r2plus1d-18) on a TSM-format dataset\n"
    "(--train-list/--val-list/--root; psdata gen-video makes one), or a detector\n"
    "(retinanet-, fasterrcnn-, maskrcnn-, cascade-r18|34|50) on COCO-format data.\n"
    "Rank r of W trains on global batch positions r*B..r*B+B-1 of each step's\n"
    "W*B samples, so --standalone --batch W*B sees exactly the same data.\n"
    "Writes DIR/metrics-rankR.csv and (rank 0) DIR/model.safetensors, DIR/val.csv and\n"
    "DIR/plots/*.png (gnuplot) with --out DIR;\n"
    "the last stdout line starts with \"final:\" and holds key=value results.\n"
    "--mode allreduce --peers tcp://H:P,... --rank R: no servers, the workers average\n"
    "gradients over a ring (or NCCL) and each applies the same optimizer locally.";

#define ROW(name, type, dst, help, def) \
    rows[n++] = (ps_opt_t){name, type, dst, help, def}

static size_t job_rows(ps_worker_opts_t *o, ps_opt_t *rows)
{
    size_t n = 0;
    ROW("servers", PS_OPT_STRING, &o->servers, "comma-separated psd endpoints, server 0 first", "");
    ROW("standalone", PS_OPT_BOOL, &o->standalone, "train alone, no servers (reference run)", "false");
    ROW("eval", PS_OPT_BOOL, &o->eval, "evaluate --weights on the validation data and exit", "false");
    ROW("export-onnx", PS_OPT_STRING, &o->export_onnx, "write the model (--weights, else the initialisation) as ONNX to FILE and exit (video models, detector)", "");
    ROW("rank", PS_OPT_INT, &o->rank, "worker rank, -1 = assigned by server 0", "-1");
    ROW("num-workers", PS_OPT_INT, &o->num_workers, "number of workers W in the cluster", "1");
    ROW("model", PS_OPT_STRING, &o->model, ps_task_models(), "smoke");
    ROW("mode", PS_OPT_STRING, &o->mode, "servers' mode sync|async|ssp (sync checks versions), or allreduce", "sync");
    ROW("steps", PS_OPT_UINT64, &o->steps, "training steps (iterations)", "100");
    ROW("batch", PS_OPT_INT, &o->batch, "samples per worker per step (B)", "32");
    ROW("seed", PS_OPT_UINT64, &o->seed, "weight initialisation seed", "1");
    ROW("data-seed", PS_OPT_UINT64, &o->data_seed, "data order, augmentation and generated dataset seed", "1");
    ROW("partition-bytes", PS_OPT_UINT64, &o->partition_bytes, "max bytes per partition (1 MiB: several per server even for small models, so pushes, updates and replies pipeline)", "1048576");
    ROW("device", PS_OPT_STRING, &o->device, "compute device cpu | cuda | cuda:N (video models, detector)", "cpu");
    ROW("threads", PS_OPT_INT, &o->threads, "compute threads (0 = all cores)", "0");
    ROW("conv-kernels", PS_OPT_STRING, &o->conv_kernels, "--device cpu: convolution kernels auto (each layer shape times im2col+GEMM and oneDNN at its first call, keeps the faster) | gemm | onednn (one row everywhere it can: runs compared bit for bit across processes); \"\" = PS_CONV_KERNELS, else auto", "");
    ROW("overlap", PS_OPT_STRING, &o->overlap, "on|off: push each partition when its layers' backward ends, wait per layer in the next forward (default on for video models and detectors without --loss-scale / --clip-grad)", "");
    ROW("out", PS_OPT_STRING, &o->out, "run directory for CSV and model (\"\" = none)", "");
    ROW("save-all-ranks", PS_OPT_BOOL, &o->save_all_ranks, "every rank r > 0 also writes model-rank<r>.safetensors", "false");
    ROW("log-level", PS_OPT_STRING, &o->log_level, "error|warn|info|debug", "info");
    ROW("progress-every", PS_OPT_INT, &o->progress_every, "progress line every N steps (0 = off)", "10");
    /* The client's defaults: a sync PUSHPULL waits for the slowest worker,
     * which may be rank 0 validating a video model for minutes on a busy
     * machine, and every resend costs a whole gradient (45 MB for R18). */
    ROW("timeout-ms", PS_OPT_INT, &o->timeout_ms, "fail a request unanswered this long (0 = never)", "300000");
    ROW("retry-ms", PS_OPT_INT, &o->retry_ms, "resend an unanswered request after this", "5000");
    ROW("heartbeat-ms", PS_OPT_INT, &o->heartbeat_ms, "heartbeat period (0 = off)", "1000");
    ROW("stall-warn-ms", PS_OPT_INT, &o->stall_warn_ms, "warn, naming the server, message and partitions, when requests stay unanswered this long, then at 2x, 4x ... up to every 60 s (0 = off)", "10000");
    ROW("shutdown-servers", PS_OPT_BOOL, &o->shutdown_servers, "rank 0 shuts the servers down at the end", "false");
    ROW("step-sleep-ms", PS_OPT_INT, &o->step_sleep_ms, "sleep this long per step (emulated compute, tests)", "0");
    ROW("join", PS_OPT_BOOL, &o->join, "sync: join a running elastic job (psd --max-workers above --num-workers) at its next step boundary; give the job's --num-workers (the count it started with)", "false");
    ROW("elastic-lr", PS_OPT_STRING, &o->elastic_lr, "when workers join or leave (elastic job): keep-batch (the global batch W0*B stays, each worker takes W0*B/W; lr unchanged) | linear (each worker's batch stays; the servers scale lr by W/W0)", "keep-batch");
    ROW("replicate-state", PS_OPT_BOOL, &o->replicate_state, "sync: each worker keeps an exact copy of the servers' state of 1/W of the partitions (weights of two versions, momentum; sent with their replies), so a server that restarts empty, its disk lost, is rebuilt from the workers with no step lost", "false");
    ROW("debug-die-mid-step", PS_OPT_INT, &o->debug_die_mid_step, "testing: at step N push half the partitions, wait for their weights, then SIGKILL this worker (-1 = off)", "-1");
    ROW("metrics-port", PS_OPT_INT, &o->metrics_port, "Prometheus /metrics of this worker on this port (0 = off)", "0");
    ROW("metrics-bind", PS_OPT_STRING, &o->metrics_bind, "address of the /metrics listener", "127.0.0.1");
    ROW("plots", PS_OPT_BOOL, &o->plots, "rank 0 draws PNG plots of the run into DIR/plots/ at the end (--out; needs gnuplot)", "true");
    return n;
}

static size_t optim_rows(ps_worker_optim_opts_t *o, ps_opt_t *rows)
{
    size_t n = 0;
    ROW("lr", PS_OPT_FLOAT, &o->lr, "base learning rate", "0.05");
    ROW("momentum", PS_OPT_FLOAT, &o->momentum, "SGD momentum (0 = plain SGD)", "0.9");
    ROW("dampening", PS_OPT_FLOAT, &o->dampening, "momentum dampening (PyTorch)", "0");
    ROW("nesterov", PS_OPT_BOOL, &o->nesterov, "Nesterov momentum", "false");
    ROW("weight-decay", PS_OPT_FLOAT, &o->weight_decay, "L2 weight decay", "0");
    ROW("ref-batch", PS_OPT_INT, &o->ref_batch, "linear scaling rule: lr*W*B/ref (0 = off)", "0");
    ROW("warmup-steps", PS_OPT_UINT64, &o->warmup_steps, "linear warmup steps", "0");
    ROW("warmup-factor", PS_OPT_FLOAT, &o->warmup_factor, "warmup starts at factor*lr", "0.1");
    ROW("schedule", PS_OPT_STRING, &o->schedule, "lr schedule const|step|cosine", "const");
    ROW("milestones", PS_OPT_STRING, &o->milestones, "step schedule: steps \"30,60\"", "");
    ROW("gamma", PS_OPT_FLOAT, &o->gamma, "step schedule: lr *= gamma at each milestone", "0.1");
    ROW("min-lr", PS_OPT_FLOAT, &o->min_lr, "cosine schedule: final lr", "0");
    return n;
}

static size_t wire_rows(ps_worker_wire_opts_t *o, ps_opt_t *rows)
{
    size_t n = 0;
    ROW("dtype", PS_OPT_STRING, &o->dtype, "wire dtype fp32|fp16|bf16 (\"\" = --precision)", "");
    ROW("codec", PS_OPT_STRING, &o->codec, "pushed gradients raw|lz4|topk|sign (topk/sign: error feedback)", "raw");
    ROW("pull-codec", PS_OPT_STRING, &o->pull_codec, "pulled weights raw|lz4 (\"\" = follows --codec)", "");
    ROW("topk-ratio", PS_OPT_FLOAT, &o->topk_ratio, "topk: fraction of elements sent (0 = default)", "0");
    ROW("ef-rounding", PS_OPT_BOOL, &o->ef_rounding, "fp16/bf16 pushes: feed the rounding error back", "false");
    ROW("dgc-momentum", PS_OPT_INT, &o->dgc_momentum, "topk/sign: momentum kept on the worker (DGC), plain SGD on psd: 1, 0, -1 = auto (sign, topk-ratio <= 1%)", "-1");
    ROW("topk-warmup-steps", PS_OPT_INT, &o->topk_warmup_steps, "topk: density 25% down to --topk-ratio over N steps (-1 = steps/4)", "-1");
    ROW("curve-server-key", PS_OPT_STRING, &o->curve_server_keys, "CURVE: server public key file(s) FILE[,FILE...]", "");
    ROW("curve-public-key", PS_OPT_STRING, &o->curve_public_key, "CURVE: this worker's public key file", "");
    ROW("curve-secret-key", PS_OPT_STRING, &o->curve_secret_key, "CURVE: this worker's secret key file", "");
    return n;
}

static size_t ring_rows(ps_worker_ring_opts_t *o, ps_opt_t *rows)
{
    size_t n = 0;
    ROW("peers", PS_OPT_STRING, &o->peers, "--mode allreduce: every rank's endpoint tcp://H:P,... (rank r binds the r-th)", "");
    ROW("allreduce", PS_OPT_STRING, &o->allreduce, "--mode allreduce: ring (TCP) | nccl (CUDA builds)", "ring");
    ROW("ring-conns", PS_OPT_INT, &o->ring_conns, "--mode allreduce: connections to the right neighbour", "1");
    ROW("bn-sync-addr", PS_OPT_STRING, &o->bn_sync_addr, "--bn sync through servers: the address the other workers reach this one's BN ring at (\"\" = the one this host reaches server 0 from)", "");
    return n;
}

static size_t precision_rows(ps_worker_precision_opts_t *o, ps_opt_t *rows)
{
    size_t n = 0;
    ROW("precision", PS_OPT_STRING, &o->precision, "compute precision fp32|fp16|bf16 (fp16: --device cuda; bf16: cuda, or cpu with AVX-512 BF16 / AMX)", "fp32");
    ROW("loss-scale", PS_OPT_STRING, &o->loss_scale, "dynamic | static:S | off (\"\" = dynamic for fp16, else off)", "");
    ROW("loss-scale-window", PS_OPT_INT, &o->loss_scale_window, "dynamic loss scale: clean steps before it doubles", "2000");
    ROW("debug-overflow-at", PS_OPT_INT, &o->debug_overflow_at, "testing: make this worker's gradient of step N Inf (-1 = off)", "-1");
    return n;
}

static size_t data_rows(ps_worker_data_opts_t *o, ps_opt_t *rows)
{
    size_t n = 0;
    ROW("root", PS_OPT_STRING, &o->root, "data: directory the lists' frame_dir / the annotations' images are in", "");
    ROW("size", PS_OPT_INT, &o->size, "data: network input size H = W (video: the crop)", "112");
    ROW("flip", PS_OPT_INT, &o->flip, "data: random horizontal flip when training (0 for direction data)", "1");
    ROW("loader-threads", PS_OPT_INT, &o->loader_threads, "data: decode threads (0 = in the step)", "2");
    ROW("prefetch", PS_OPT_INT, &o->prefetch, "data: batches decoded ahead", "2");
    ROW("skip-bad", PS_OPT_BOOL, &o->skip_bad, "data: skip bad list entries / frames / images (counted)", "false");
    ROW("val-every", PS_OPT_INT, &o->val_every, "validate every N steps on rank 0 (0 = end only)", "0");
    ROW("val-batch", PS_OPT_INT, &o->val_batch, "samples per validation forward (0 = --batch)", "0");
    ROW("width", PS_OPT_INT, &o->width, "ResNet stem width (64 = torchvision)", "64");
    ROW("recompute", PS_OPT_BOOL, &o->recompute, "ResNet models (TSM / TSN, detector backbones): keep each stage's input only and recompute the stage, and every BN + ReLU from its conv output, in the backward (bit-identical gradients, less activation memory)", "false");
    ROW("bn", PS_OPT_STRING, &o->bn, "BN mode.  video: train|partial|frozen|sync (\"\" = --partial-bn); detector backbone: frozen (\"\", FrozenBatchNorm2d)|train|sync.  frozen: running statistics, fixed affine; train: each worker's batch statistics; sync: the statistics of every worker's batch, W x B samples normalised as one batch (cross-worker BN)", "");
    ROW("num-classes", PS_OPT_INT, &o->num_classes, "classes N, labels 0..N-1 (0 = from the data: "
        "the largest label + 1, and video labels must then be 0..K-1 without gaps)", "0");
    ROW("weights", PS_OPT_STRING, &o->weights, "safetensors to start from (or to evaluate with --eval): "
        "ours, a torchvision ResNet (fc of another size re-initialised; a detector's backbone), an official TSM checkpoint", "");
    ROW("weights-partial", PS_OPT_BOOL, &o->weights_partial, "--weights may lack model tensors (they keep their "
        "initialisation) and hold unknown ones (skipped); each is listed in the log", "false");
    ROW("predictions", PS_OPT_STRING, &o->predictions, "write predictions here: video --eval per-video CSV; detector: each validation's COCO results file", "");
    return n;
}

/* The whole table: the common groups, then every task's rows. */
static int build_rows(ps_worker_opts_t *o)
{
    size_t cap = 160 + PS_WORKER_MAX_TASKS * PS_TASK_MAX_OPTS, n = 0;
    ps_opt_t *rows = calloc(cap, sizeof *rows);
    if (!rows) return PS_ENOMEM;
    n += job_rows(o, rows + n);
    n += optim_rows(&o->optim, rows + n);
    n += wire_rows(&o->wire, rows + n);
    n += ring_rows(&o->ring, rows + n);
    n += precision_rows(&o->prec, rows + n);
    n += data_rows(&o->data, rows + n);
    for (int t = 0; ps_tasks[t]; t++) {
        if (t >= PS_WORKER_MAX_TASKS) return PS_EINVAL;
        const ps_task_t *k = ps_tasks[t];
        if (k->opts_size && !(o->task_opts[t] = calloc(1, k->opts_size))) return PS_ENOMEM;
        if (k->opt_rows) n += k->opt_rows(o->task_opts[t], rows + n);
    }
    o->rows = rows;
    /* one flag, one row: a second row of the same name would never be set */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (!strcmp(rows[i].name, rows[j].name)) {
                fprintf(stderr, "psworker: option --%s is defined twice\n", rows[i].name);
                return PS_EINVAL;
            }
    return n < cap ? 0 : PS_ENOMEM;
}

void ps_worker_opts_free(ps_worker_opts_t *o)
{
    if (o->rows) ps_config_free(o->rows);
    free(o->rows);
    for (int t = 0; t < PS_WORKER_MAX_TASKS; t++) free(o->task_opts[t]);
    memset(o, 0, sizeof *o);
}

void *ps_worker_task_opts(const ps_worker_opts_t *o)
{
    return o->task >= 0 ? o->task_opts[o->task] : NULL;
}

int ps_worker_count_fields(const char *s)
{
    int n = 0, in = 0;
    for (; *s; s++) {
        if (*s == ',') in = 0;
        else if (!in) in = 1, n++;
    }
    return n;
}

char **ps_worker_split_list(const char *list, int *n)
{
    size_t len = strlen(list);
    int cnt = ps_worker_count_fields(list) + 1;
    char **v = malloc(sizeof(char *) * (size_t)(cnt + 1) + len + 1);
    if (!v) return NULL;
    char *buf = (char *)(v + cnt + 1);
    memcpy(buf, list, len + 1);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        v[(*n)++] = tok;
    v[*n] = NULL;
    return v;
}

/* ---- checks of the common groups ------------------------------------------ */

int ps_worker_opt_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psworker: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return PS_EINVAL;
}

/* --dtype "" (default): the wire follows --precision (fp16 compute sends
 * fp16 gradients and gets fp16 weights back; the masters stay fp32 on the
 * servers); an invalid --precision is reported by precision_check. */
static int wire_check(ps_worker_opts_t *o)
{
    ps_worker_wire_opts_t *w = &o->wire;
    if (!*w->dtype) {
        if (ps_dtype_parse(o->prec.precision, &w->dt)) w->dt = PS_DT_FP32;
        char *name = strdup(ps_dtype_name(w->dt)); /* the name other code prints */
        if (!name) return PS_ENOMEM;
        free(w->dtype);
        w->dtype = name;
    } else if (ps_dtype_parse(w->dtype, &w->dt)) {
        return ps_worker_opt_error("--dtype: expected fp32|fp16|bf16, got \"%s\"", w->dtype);
    }
    if (ps_codec_parse(w->codec, &w->codec_id))
        return ps_worker_opt_error("--codec: expected raw|lz4|topk|sign, got \"%s\"", w->codec);
    w->pull_codec_id = -1;
    if (*w->pull_codec) {
        ps_codec_t pc;
        if (ps_codec_parse(w->pull_codec, &pc) || (pc != PS_CODEC_RAW && pc != PS_CODEC_LZ4))
            return ps_worker_opt_error("--pull-codec: expected raw|lz4 (weights are never sent lossy), got \"%s\"",
                       w->pull_codec);
        w->pull_codec_id = (int)pc;
    }
    if (w->dgc_momentum < -1 || w->dgc_momentum > 1)
        return ps_worker_opt_error("--dgc-momentum must be 1 (on), 0 (off) or -1 (auto)");
    if (w->topk_warmup_steps < -1)
        return ps_worker_opt_error("--topk-warmup-steps must be >= 0 (or -1 = auto)");
    if (!(w->topk_ratio >= 0 && w->topk_ratio <= 1))
        return ps_worker_opt_error("--topk-ratio must be in (0, 1] (0 = default %g)",
                   (double)PS_CODEC_TOPK_DEFAULT_RATIO);
    int nk = !!*w->curve_server_keys + !!*w->curve_public_key + !!*w->curve_secret_key;
    if (nk != 0 && nk != 3)
        return ps_worker_opt_error("CURVE needs all three of --curve-server-key, --curve-public-key and "
                   "--curve-secret-key (or none)");
    return 0;
}

/* --loss-scale static:S: S a power of two in [1, 2^24]. */
static int static_scale(ps_worker_precision_opts_t *pr, const char *s)
{
    char *end;
    double v = strtod(s, &end);
    int e;
    if (end == s || *end || !(v >= 1 && v <= 16777216.0) || frexp(v, &e) != 0.5)
        return ps_worker_opt_error("--loss-scale static:S: S must be a power of two in [1, 2^24], got \"%s\"", s);
    pr->ls_on = 1;
    /* min = init = max: overflows still skip the step, the scale stays. */
    pr->ls_cfg.init_scale = pr->ls_cfg.min_scale = pr->ls_cfg.max_scale = (float)v;
    return 0;
}

/* --precision / --loss-scale / --loss-scale-window / --debug-overflow-at
 * (whether the task computes in half on this device is the task's check). */
static int precision_check(ps_worker_opts_t *o)
{
    ps_worker_precision_opts_t *pr = &o->prec;
    if (strcmp(pr->precision, "fp32") && strcmp(pr->precision, "fp16") &&
        strcmp(pr->precision, "bf16"))
        return ps_worker_opt_error("--precision: expected fp32|fp16|bf16, got \"%s\"", pr->precision);
    ps_loss_scale_config_default(&pr->ls_cfg);
    const char *ls = *pr->loss_scale ? pr->loss_scale
                     : !strcmp(pr->precision, "fp16") ? "dynamic" : "off";
    pr->ls_on = 0;
    if (!strcmp(ls, "dynamic")) {
        pr->ls_on = 1;
        pr->ls_cfg.growth_interval = pr->loss_scale_window;
    } else if (!strncmp(ls, "static:", 7)) {
        if (static_scale(pr, ls + 7)) return PS_EINVAL;
    } else if (strcmp(ls, "off")) {
        return ps_worker_opt_error("--loss-scale: expected dynamic|static:S|off, got \"%s\"", ls);
    }
    if (pr->loss_scale_window < 1 || pr->loss_scale_window > 1000000)
        return ps_worker_opt_error("--loss-scale-window must be in [1, 1000000]");
    if (pr->debug_overflow_at < -1)
        return ps_worker_opt_error("--debug-overflow-at must be a step >= 0 (or -1 = off)");
    if (pr->debug_overflow_at >= 0 && !pr->ls_on)
        return ps_worker_opt_error("--debug-overflow-at needs loss scaling (--loss-scale dynamic|static:S): "
                   "without it an Inf gradient is a divergence, not a skip");
    return 0;
}

static int job_check(ps_worker_opts_t *o)
{
    if (strcmp(o->mode, "sync") && strcmp(o->mode, "async") && strcmp(o->mode, "ssp") &&
        strcmp(o->mode, "allreduce"))
        return ps_worker_opt_error("--mode: expected sync|async|ssp|allreduce, got \"%s\"", o->mode);
    if (*o->overlap && strcmp(o->overlap, "on") && strcmp(o->overlap, "off"))
        return ps_worker_opt_error("--overlap: expected on|off, got \"%s\"", o->overlap);
    if (o->steps < 1 || o->steps > (UINT64_C(1) << 40))
        return ps_worker_opt_error("--steps must be in [1, 2^40]");
    if (o->batch < 1 || o->batch > (1 << 20))
        return ps_worker_opt_error("--batch must be in [1, 1048576] (got %d)", o->batch);
    if (o->partition_bytes < 4 || o->partition_bytes > (UINT64_C(1) << 32))
        return ps_worker_opt_error("--partition-bytes must be in [4, 4 GiB]");
    if (o->step_sleep_ms < 0 || o->step_sleep_ms > 60000)
        return ps_worker_opt_error("--step-sleep-ms must be in [0, 60000]");
    if (strcmp(o->elastic_lr, "keep-batch") && strcmp(o->elastic_lr, "linear"))
        return ps_worker_opt_error("--elastic-lr: expected keep-batch|linear, got \"%s\"",
                                   o->elastic_lr);
    if (o->join && (strcmp(o->mode, "sync") || o->standalone || o->rank >= 0))
        return ps_worker_opt_error("--join needs --mode sync through servers and no --rank "
                                   "(server 0 gives the joiner its rank)");
    if (o->debug_die_mid_step < -1)
        return ps_worker_opt_error("--debug-die-mid-step must be a step >= 0 (or -1 = off)");
    if (o->debug_die_mid_step >= 0 && (strcmp(o->mode, "sync") || o->standalone))
        return ps_worker_opt_error("--debug-die-mid-step needs --mode sync through servers");
    if (o->threads < 0) return ps_worker_opt_error("--threads must be >= 0");
    if (*o->conv_kernels && strcmp(o->conv_kernels, "auto") && strcmp(o->conv_kernels, "gemm") &&
        strcmp(o->conv_kernels, "onednn"))
        return ps_worker_opt_error("--conv-kernels: expected auto|gemm|onednn, got \"%s\"",
                                   o->conv_kernels);
    if (o->metrics_port < 0 || o->metrics_port > 65535)
        return ps_worker_opt_error("--metrics-port must be in [0, 65535] (0 = off)");
    return 0;
}

/* Where the workers meet: servers, or the ring's peers. */
static int cluster_check(ps_worker_opts_t *o)
{
    if (o->eval && *o->export_onnx)
        return ps_worker_opt_error("--eval and --export-onnx are two runs: give one");
    if (o->eval || *o->export_onnx) o->standalone = 1; /* neither needs servers */
    if (o->standalone) return 0;
    if (!strcmp(o->mode, "allreduce")) return ps_worker_ring_check(o);
    if (!*o->servers) return ps_worker_opt_error("give --servers tcp://HOST:PORT[,...] or --standalone");
    if (o->num_workers < 1 || o->num_workers > 65536)
        return ps_worker_opt_error("--num-workers must be in [1, 65536]");
    if (o->rank < -1 || o->rank >= o->num_workers)
        return ps_worker_opt_error("--rank must be -1 (assigned) or in [0, %d)", o->num_workers);
    if (o->timeout_ms < 0 || o->retry_ms < 0 || o->heartbeat_ms < 0 || o->stall_warn_ms < 0)
        return ps_worker_opt_error("--timeout-ms, --retry-ms, --heartbeat-ms, --stall-warn-ms "
                                   "must be >= 0");
    return 0;
}

int ps_worker_data_opts_check(const ps_worker_opts_t *o)
{
    const ps_worker_data_opts_t *d = &o->data;
    if (d->size < 32 || d->size > 1024 || d->loader_threads < 0 || d->loader_threads > 64 ||
        d->prefetch < 1 || d->prefetch > 64 || d->val_every < 0 || d->val_batch < 0 ||
        d->num_classes < 0 || d->width < 8 || d->width > 512)
        return ps_worker_opt_error("data options out of range: --size 32..1024, --loader-threads 0..64, "
                   "--prefetch 1..64, --width 8..512, --val-every / --val-batch / "
                   "--num-classes >= 0");
    return 0;
}

int ps_worker_cpu_only(const ps_worker_opts_t *o, const char *why)
{
    return strcmp(o->device, "cpu") ? ps_worker_opt_error("--device %s: %s", o->device, why) : 0;
}

int ps_worker_fp32_only(const ps_worker_opts_t *o, const char *why)
{
    return strcmp(o->prec.precision, "fp32") ? ps_worker_opt_error("--precision %s: %s", o->prec.precision, why)
                                              : 0;
}

/* The CUDA device and the NCCL allreduce, in the builds that have them:
 * registered here, where --device and --allreduce are read. */
static void add_cuda(void)
{
#ifdef PS_HAVE_CUDA
    ps_engine_add_device(&ps_device_cuda);
    ps_allreduce_add_kind(&ps_allreduce_nccl);
#endif
}

static int check_all(ps_worker_opts_t *o)
{
    if (ps_log_set_level_str(o->log_level))
        return ps_worker_opt_error("--log-level: expected error|warn|info|debug, got \"%s\"", o->log_level);
    int rc;
    if ((rc = wire_check(o)) || (rc = precision_check(o)) || (rc = job_check(o)))
        return rc;
    if ((o->task = ps_task_find(o)) < 0)
        return ps_worker_opt_error("--model: unknown model \"%s\" (%s)", o->model, ps_task_models());
    const ps_task_t *t = ps_tasks[o->task];
    if ((rc = t->check(o))) return rc;
    return cluster_check(o);
}

int ps_worker_opts_parse(ps_worker_opts_t *o, int argc, char **argv)
{
    int npos = 0, rc;
    memset(o, 0, sizeof *o);
    o->task = -1;
    add_cuda();
    if ((rc = build_rows(o)) || (rc = ps_config_defaults(o->rows))) {
        if (rc == PS_ENOMEM) fprintf(stderr, "psworker: out of memory\n");
        return PS_EINVAL;
    }
    rc = ps_config_parse(o->rows, "psworker", usage, argc, argv, &npos);
    if (rc) return rc == 1 ? 1 : PS_EINVAL;
    if (npos > 0) {
        fprintf(stderr, "psworker: unexpected argument \"%s\" (see --help)\n", argv[1]);
        return PS_EINVAL;
    }
    return check_all(o) ? PS_EINVAL : 0;
}
