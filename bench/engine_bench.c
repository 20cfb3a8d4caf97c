/* Training-step benchmark of the CPU engine: TSM-ResNet-18 and -50 (TSM's
 * training set-up: residual shift, partial BN, dropout 0.5, 400 classes),
 * 2 clips x 8 frames at 112x112, forward and backward timed separately,
 * median of N steps, achieved GFLOP/s from the layer shapes
 * (ps_model_flops) against this machine's sgemm peak measured in the same
 * run.  bench/engine_bench_torch.py does the same in PyTorch and
 * bench/engine_bench.sh runs both and prints the ratio.
 *
 *   engine_bench [-t threads] [-s steps] [-w warmup] [-n clips] [-H size] [-d depth]
 *
 * Lines starting with "RESULT" are for engine_bench.sh.  Figures mean
 * something only on an otherwise idle machine. */
#include "worker/engine/ps_blas.h"
#include "worker/models/ps_model.h"

#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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
        double t0 = now();
        ps_blas_sgemm(0, 0, M, M, M, 1, a, M, b, M, 0, c, M);
        double t = now() - t0;
        if (t < best) best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * M * M * M / best * 1e-9;
}

static int bench(ps_ctx_t *ctx, int depth, int clips, int H, int steps, int warmup,
                 double peak)
{
    ps_model_config_t cfg;
    ps_model_config_default(&cfg); /* TSM: shift, partial BN, dropout 0.5, 400 classes */
    cfg.depth = depth;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &cfg, &ps_backend_cpu, ctx, clips, H, H)) return 1;
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
        double t0 = now();
        ps_model_forward(m, x, clips, labels, 1, &loss);
        double t1 = now();
        ps_model_backward(m);
        double t2 = now();
        if (s >= 0) {
            tf[s] = t1 - t0;
            tb[s] = t2 - t1;
            ts[s] = t2 - t0;
        }
    }
    double fl_f, fl_b;
    ps_model_flops(m, clips, &fl_f, &fl_b);
    double mf = median(tf, steps), mb = median(tb, steps), ms = median(ts, steps);
    double gf = (fl_f + fl_b) / ms * 1e-9;
    printf("TSM-ResNet-%d %dx%dx3x%dx%d: fwd %.1f ms, bwd %.1f ms, step %.1f ms, %.2f clips/s, "
           "%.1f GFLOP/step, %.1f GFLOP/s (%.0f%% of sgemm peak), loss %.3f\n",
           depth, clips, cfg.n_segment, H, H, mf * 1e3, mb * 1e3, ms * 1e3, clips / ms,
           (fl_f + fl_b) * 1e-9, gf, peak > 0 ? 100 * gf / peak : 0, loss);
    printf("RESULT impl=c depth=%d fwd_ms=%.2f bwd_ms=%.2f step_ms=%.2f clips_per_s=%.3f "
           "gflop_step=%.3f gflops=%.2f\n", depth, mf * 1e3, mb * 1e3, ms * 1e3, clips / ms,
           (fl_f + fl_b) * 1e-9, gf);
    fflush(stdout);
    free(x), free(labels), free(tf), free(tb), free(ts);
    ps_model_destroy(&m);
    return 0;
}

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv); /* may re-exec with a better OpenBLAS core */
    int threads = 2, steps = 10, warmup = 2, clips = 2, H = 112, depth = 0, opt;
    while ((opt = getopt(argc, argv, "t:s:w:n:H:d:")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'n': clips = atoi(optarg); break;
        case 'H': H = atoi(optarg); break;
        case 'd': depth = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: engine_bench [-t threads] [-s steps] [-w warmup] "
                            "[-n clips] [-H size] [-d depth (0 = 18 and 50)]\n");
            return 2;
        }
    }
    if (steps < 1 || warmup < 0 || clips < 1 || H < 32) return 2;
    ps_log_level = PS_LOG_WARN;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, threads);
    double peak = sgemm_peak(2048, 3);
    printf("OpenBLAS core %s, %d threads; sgemm 2048^3 peak %.1f GFLOP/s\n", ps_blas_corename(),
           ctx.nthreads, peak);
    printf("RESULT impl=c sgemm_gflops=%.2f core=%s threads=%d\n", peak, ps_blas_corename(),
           ctx.nthreads);
    int rc = 0;
    if (depth == 0 || depth == 18) rc |= bench(&ctx, 18, clips, H, steps, warmup, peak);
    if (depth == 0 || depth == 50) rc |= bench(&ctx, 50, clips, H, steps, warmup, peak);
    if (depth == 34) rc |= bench(&ctx, 34, clips, H, steps, warmup, peak);
    ps_ctx_free(&ctx);
    return rc;
}
