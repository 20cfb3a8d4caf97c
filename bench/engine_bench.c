/* Training-step benchmark of the CPU engine: TSM-ResNet-18 and -50 (TSM's
 * training set-up: residual shift, partial BN, dropout 0.5, 400 classes),
 * 2 clips x 8 frames at 112x112, forward and backward timed separately,
 * median of N steps, achieved GFLOP/s from the layer shapes
 * (ps_model_flops) against this machine's sgemm peak measured in the same
 * run.  bench/engine_bench_torch.py does the same in PyTorch and
 * bench/engine_bench.sh runs both and prints the ratio.
 *
 *   engine_bench [-t threads] [-s steps] [-w warmup] [-n clips] [-H size] [-T frames]
 *                [-d depth | -m model,...] [-p] [-k] [-P fp32|bf16]
 *
 * -m: tsm-r18|34|50 (default tsm-r18,tsm-r50) or the 3-D models (r3d-18,
 * mc3-18, r2plus1d-18, i3d-r50-333, i3d-r50-311), clips of T frames
 * (default 8; the 3-D models take the clip as one NCDHW volume).
 *
 * -P bf16: the CPU backend's bf16 precision (oneDNN bf16 convolutions,
 * fp32 accumulation, BN and weights) where the CPU has native bf16; else
 * one "RESULT ... refused=1" line saying why, and exit 0.
 * Prints the CPU, OpenBLAS's core, oneDNN's instruction set and, after
 * each model, the convolution kernels that ran (-k: per layer shape, with
 * every candidate's time from the selection).  The selection runs in the
 * warm-up steps (each model starts with a fresh one).
 * -p: run through a backend table that times every layer call and print
 * the share of each layer kind (conv fwd/bwd, BN, ReLU, ...) - the profile
 * behind any optimisation.
 * Lines starting with "RESULT" are for engine_bench.sh.  Figures mean
 * something only on an otherwise idle machine. */
#include "worker/engine/ps_blas.h"
#include "worker/models/ps_model.h"

#include "bench/bench_kernels.h"
#include "bench/bench_util.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double sgemm_peak(int M, int reps)
{
    float *a = malloc(sizeof(float) * M * M), *b = malloc(sizeof(float) * M * M);
    float *c = malloc(sizeof(float) * M * M);
    if (!a || !b || !c) return 0;
    for (size_t i = 0; i < (size_t)M * M; i++) {
        a[i] = (float)(i % 17) * 0.01f;
        b[i] = (float)(i % 13) * 0.02f;
    }
    ps_blas_sgemm(0, 0, M, M, M, 1, a, M, b, M, 0, c, M);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        ps_blas_sgemm(0, 0, M, M, M, 1, a, M, b, M, 0, c, M);
        double t = bench_now() - t0;
        if (t < best) best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * M * M * M / best * 1e-9;
}

/* ---- profile: a backend table that times every layer call ----------------- */

enum { P_CONV_F, P_CONV_B, P_BN_F, P_BN_B, P_RELU, P_POOL, P_TSHIFT, P_ADD, P_HEAD, P_N };
static const char *pname[P_N] = {"conv fwd", "conv bwd", "bn fwd", "bn bwd", "relu",
                                 "pool", "tshift", "add/acc", "head"};
static double ptime[P_N];
static const ps_backend_t *real = &ps_backend_cpu;
#define T0 double t0_ = bench_now()
#define T1(k) ptime[k] += bench_now() - t0_

static void w_conv_f(ps_ctx_t *c, float *o, const float *i, const float *w, const float *b,
                     const ps_conv2d_desc_t *d, int N, int H, int W)
{ T0; real->conv2d_forward(c, o, i, w, b, d, N, H, W); T1(P_CONV_F); }
static void w_conv_b(ps_ctx_t *c, float *di, float *dw, float *db, const float *dout,
                     const float *i, const float *w, const ps_conv2d_desc_t *d, int N, int H,
                     int W)
{ T0; real->conv2d_backward(c, di, dw, db, dout, i, w, d, N, H, W); T1(P_CONV_B); }
static void w_bn_ft(ps_ctx_t *c, float *o, float *sm, float *sr, float *rm, float *rv,
                    const float *i, const float *g, const float *b, float eps, float mom, int N,
                    int C, int HW)
{ T0; real->bn_forward_train(c, o, sm, sr, rm, rv, i, g, b, eps, mom, N, C, HW); T1(P_BN_F); }
static void w_bn_bt(ps_ctx_t *c, float *di, float *dg, float *db, const float *dout,
                    const float *i, const float *g, const float *sm, const float *sr, int N,
                    int C, int HW)
{ T0; real->bn_backward_train(c, di, dg, db, dout, i, g, sm, sr, N, C, HW); T1(P_BN_B); }
static void w_bn_fe(ps_ctx_t *c, float *o, const float *i, const float *g, const float *b,
                    const float *rm, const float *rv, float eps, int N, int C, int HW)
{ T0; real->bn_forward_eval(c, o, i, g, b, rm, rv, eps, N, C, HW); T1(P_BN_F); }
static void w_bn_be(ps_ctx_t *c, float *di, float *dg, float *db, const float *dout,
                    const float *i, const float *g, const float *rm, const float *rv, float eps,
                    int N, int C, int HW)
{ T0; real->bn_backward_eval(c, di, dg, db, dout, i, g, rm, rv, eps, N, C, HW); T1(P_BN_B); }
static void w_relu_f(ps_ctx_t *c, float *o, const float *i, size_t n)
{ T0; real->relu_forward(c, o, i, n); T1(P_RELU); }
static void w_relu_b(ps_ctx_t *c, float *di, const float *dout, const float *o, size_t n)
{ T0; real->relu_backward(c, di, dout, o, n); T1(P_RELU); }
static void w_mp_f(ps_ctx_t *c, float *o, int32_t *am, const float *i, const ps_pool_desc_t *d,
                   int N, int C, int H, int W)
{ T0; real->maxpool_forward(c, o, am, i, d, N, C, H, W); T1(P_POOL); }
static void w_mp_b(ps_ctx_t *c, float *di, const float *dout, const int32_t *am,
                   const ps_pool_desc_t *d, int N, int C, int H, int W)
{ T0; real->maxpool_backward(c, di, dout, am, d, N, C, H, W); T1(P_POOL); }
static void w_ap_f(ps_ctx_t *c, float *o, const float *i, int N, int C, int HW)
{ T0; real->avgpool_forward(c, o, i, N, C, HW); T1(P_POOL); }
static void w_ap_b(ps_ctx_t *c, float *di, const float *dout, int N, int C, int HW)
{ T0; real->avgpool_backward(c, di, dout, N, C, HW); T1(P_POOL); }
static void w_lin_f(ps_ctx_t *c, float *o, const float *i, const float *w, const float *b, int N,
                    int C, int K)
{ T0; real->linear_forward(c, o, i, w, b, N, C, K); T1(P_HEAD); }
static void w_lin_b(ps_ctx_t *c, float *di, float *dw, float *db, const float *dout,
                    const float *i, const float *w, int N, int C, int K)
{ T0; real->linear_backward(c, di, dw, db, dout, i, w, N, C, K); T1(P_HEAD); }
static void w_do_f(ps_ctx_t *c, float *o, uint8_t *mk, const float *i, size_t n, float p,
                   uint64_t seed)
{ T0; real->dropout_forward(c, o, mk, i, n, p, seed); T1(P_HEAD); }
static void w_do_b(ps_ctx_t *c, float *di, const float *dout, const uint8_t *mk, size_t n,
                   float p)
{ T0; real->dropout_backward(c, di, dout, mk, n, p); T1(P_HEAD); }
static float w_xe_f(ps_ctx_t *c, float *pr, const float *l, const int32_t *lab, int N, int K)
{ T0; float r = real->xent_forward(c, pr, l, lab, N, K); T1(P_HEAD); return r; }
static void w_xe_b(ps_ctx_t *c, float *dl, const float *pr, const int32_t *lab, float d, int N,
                   int K)
{ T0; real->xent_backward(c, dl, pr, lab, d, N, K); T1(P_HEAD); }
static void w_ts_f(ps_ctx_t *c, float *o, const float *i, int B, int T, int C, int HW, int f)
{ T0; real->tshift_forward(c, o, i, B, T, C, HW, f); T1(P_TSHIFT); }
static void w_ts_b(ps_ctx_t *c, float *di, const float *dout, int B, int T, int C, int HW, int f)
{ T0; real->tshift_backward(c, di, dout, B, T, C, HW, f); T1(P_TSHIFT); }
static void w_cs_f(ps_ctx_t *c, float *o, const float *i, int B, int T, int K)
{ T0; real->consensus_forward(c, o, i, B, T, K); T1(P_HEAD); }
static void w_cs_b(ps_ctx_t *c, float *di, const float *dout, int B, int T, int K)
{ T0; real->consensus_backward(c, di, dout, B, T, K); T1(P_HEAD); }
static void w_add(ps_ctx_t *c, float *o, const float *a, const float *b, size_t n)
{ T0; real->add(c, o, a, b, n); T1(P_ADD); }
static void w_acc(ps_ctx_t *c, float *a, const float *x, size_t n)
{ T0; real->accumulate(c, a, x, n); T1(P_ADD); }

static void w_conv3_f(ps_ctx_t *c, float *o, const float *i, const float *w, const float *b,
                      const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{ T0; real->conv3d_forward(c, o, i, w, b, d, N, D, H, W); T1(P_CONV_F); }
static void w_conv3_b(ps_ctx_t *c, float *di, float *dw, float *db, const float *dout,
                      const float *i, const float *w, const ps_conv3d_desc_t *d, int N, int D,
                      int H, int W)
{ T0; real->conv3d_backward(c, di, dw, db, dout, i, w, d, N, D, H, W); T1(P_CONV_B); }

/* the CPU table with the timing wrappers over the slots above (the rest,
 * 3-D pools included, untimed: they count as time outside the kinds) */
static ps_backend_t profiled;
static void profiled_init(void)
{
    profiled = ps_backend_cpu;
    profiled.name = "cpu+profile";
    profiled.conv2d_forward = w_conv_f, profiled.conv2d_backward = w_conv_b;
    profiled.conv3d_forward = w_conv3_f, profiled.conv3d_backward = w_conv3_b;
    profiled.bn_forward_train = w_bn_ft, profiled.bn_backward_train = w_bn_bt;
    profiled.bn_forward_eval = w_bn_fe, profiled.bn_backward_eval = w_bn_be;
    /* the fused BN + ReLU off, so the two kinds are timed apart */
    profiled.bn_relu_forward_eval = NULL, profiled.bn_relu_backward_eval = NULL;
    profiled.relu_forward = w_relu_f, profiled.relu_backward = w_relu_b;
    profiled.maxpool_forward = w_mp_f, profiled.maxpool_backward = w_mp_b;
    profiled.avgpool_forward = w_ap_f, profiled.avgpool_backward = w_ap_b;
    profiled.linear_forward = w_lin_f, profiled.linear_backward = w_lin_b;
    profiled.dropout_forward = w_do_f, profiled.dropout_backward = w_do_b;
    profiled.xent_forward = w_xe_f, profiled.xent_backward = w_xe_b;
    profiled.tshift_forward = w_ts_f, profiled.tshift_backward = w_ts_b;
    profiled.consensus_forward = w_cs_f, profiled.consensus_backward = w_cs_b;
    profiled.add = w_add, profiled.accumulate = w_acc;
}

static int profile, per_shape;
static ps_precision_t precision = PS_PRECISION_FP32;

/* One model by name: "tsm-r18|34|50" (TSM's training set-up: residual
 * shift, partial BN, dropout 0.5) or a 3-D architecture ("r3d-18",
 * "i3d-r50-311", ...: BN in training mode; dropout 0.5 for I3D as in
 * Non-local's, none for torchvision's video ResNets), T frames a clip,
 * 400 classes. */
static int bench(ps_ctx_t *ctx, const char *name, int clips, int T, int H, int steps,
                 int warmup, double peak)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg); /* TSM: shift, partial BN, dropout 0.5, 400 classes */
    int depth = 0, shift = 0;
    if (ps_model_parse_name(name, &depth, &shift) == 0) {
        cfg.depth = depth;
        cfg.shift = shift;
    } else {
        snprintf(cfg.arch, sizeof cfg.arch, "%s", name);
        cfg.partial_bn = 0;
        cfg.dropout = strncmp(name, "i3d", 3) ? 0.0f : 0.5f;
    }
    cfg.n_segment = T;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &cfg, profile ? &profiled : &ps_backend_cpu, ctx, clips, H, H))
        return 1;
    ps_conv_set_kernels(ps_conv_get_kernels()); /* this model's own choices */
    memset(ptime, 0, sizeof ptime);
    ps_model_init(m, 1, 0);
    ps_model_set_seed(m, 1);
    size_t nx = (size_t)clips * cfg.n_segment * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    int32_t *labels = malloc(clips * sizeof *labels);
    double *tf = malloc(steps * sizeof *tf), *tb = malloc(steps * sizeof *tb);
    double *ts = malloc(steps * sizeof *ts);
    if (!x || !labels || !tf || !tb || !ts) return 1;
    ps_model_hash_fill(x, nx, "input", 1, 1.0);
    for (int i = 0; i < clips; i++) labels[i] = i % cfg.num_classes;
    float loss = 0;
    for (int s = -warmup; s < steps; s++) {
        ps_model_zero_grad(m);
        double t0 = bench_now();
        ps_model_forward(m, x, clips, labels, 1, &loss);
        double t1 = bench_now();
        ps_model_backward(m);
        double t2 = bench_now();
        if (s >= 0) {
            tf[s] = t1 - t0;
            tb[s] = t2 - t1;
            ts[s] = t2 - t0;
        }
    }
    double fl_f, fl_b;
    ps_model_flops(m, clips, &fl_f, &fl_b);
    double mf = bench_median(tf, steps), mb = bench_median(tb, steps);
    double ms = bench_median(ts, steps);
    double gf = (fl_f + fl_b) / ms * 1e-9;
    printf("%s %s %dx%dx3x%dx%d: fwd %.1f ms, bwd %.1f ms, step %.1f ms, %.2f clips/s, "
           "%.1f GFLOP/step, %.1f GFLOP/s (%.0f%% of sgemm peak), loss %.3f\n", name,
           ps_precision_name(precision), clips, cfg.n_segment, H, H, mf * 1e3, mb * 1e3,
           ms * 1e3, clips / ms, (fl_f + fl_b) * 1e-9, gf, peak > 0 ? 100 * gf / peak : 0, loss);
    printf("RESULT impl=c prec=%s model=%s fwd_ms=%.2f bwd_ms=%.2f step_ms=%.2f "
           "clips_per_s=%.3f gflop_step=%.3f gflops=%.2f\n", ps_precision_name(precision), name,
           mf * 1e3, mb * 1e3, ms * 1e3, clips / ms, (fl_f + fl_b) * 1e-9, gf);
    if (profile) {
        double all = 0;
        for (int k = 0; k < P_N; k++) all += ptime[k];
        printf("  where the time goes (all %d steps, %.2f s in layers):", steps + warmup, all);
        for (int k = 0; k < P_N; k++)
            printf("%s %s %.1f%%", k ? "," : "", pname[k], 100 * ptime[k] / (all > 0 ? all : 1));
        printf("\n");
    }
    bench_print_conv_kernels(stdout, per_shape);
    fflush(stdout);
    free(x), free(labels), free(tf), free(tb), free(ts);
    ps_model_destroy(&m);
    return 0;
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv); /* may re-exec with a better OpenBLAS core */
    int threads = 2, steps = 10, warmup = 2, clips = 2, H = 112, T = 8, depth = 0, opt;
    const char *models = NULL;
    while ((opt = getopt(argc, argv, "t:s:w:n:H:d:m:T:pkP:")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'n': clips = atoi(optarg); break;
        case 'H': H = atoi(optarg); break;
        case 'd': depth = atoi(optarg); break;
        case 'm': models = optarg; break;
        case 'T': T = atoi(optarg); break;
        case 'p': profile = 1; break;
        case 'k': per_shape = 1; break;
        case 'P':
            if (!strcmp(optarg, "bf16")) precision = PS_PRECISION_BF16;
            else if (strcmp(optarg, "fp32")) return 2;
            break;
        default:
            fprintf(stderr, "usage: engine_bench [-t threads] [-s steps] [-w warmup] "
                            "[-n clips] [-H size] [-T frames] [-d depth (0 = 18 and 50)] [-m model,...] [-p] [-k] "
                            "[-P fp32|bf16]\n");
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || clips < 1 || H < 32 || T < 1) return 2;
    ps_log_level = PS_LOG_WARN;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, threads);
    double peak = sgemm_peak(2048, 3);
    bench_print_cpu(stdout);
    printf("OpenBLAS core %s, %d threads; sgemm 2048^3 peak %.1f GFLOP/s\n", ps_blas_corename(),
           ctx.nthreads, peak);
    printf("RESULT impl=c sgemm_gflops=%.2f core=%s threads=%d\n", peak, ps_blas_corename(),
           ctx.nthreads);
    char why[192];
    if (precision != PS_PRECISION_FP32 &&
        !ps_engine_cpu_precision_ok(precision, why, sizeof why)) {
        printf("%s: not measured: %s\nRESULT impl=c prec=%s refused=1\n",
               ps_precision_name(precision), why, ps_precision_name(precision));
        ps_ctx_free(&ctx);
        return 0;
    }
    if (ps_backend_cpu.set_precision(&ctx, precision)) return 1;
    char list[256];
    if (models)
        snprintf(list, sizeof list, "%s", models);
    else if (depth)
        snprintf(list, sizeof list, "tsm-r%d", depth);
    else
        snprintf(list, sizeof list, "tsm-r18,tsm-r50");
    profiled_init();
    int rc = 0;
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save))
        rc |= bench(&ctx, name, clips, T, H, steps, warmup, peak);
    ps_ctx_free(&ctx);
    return rc;
}
