/* conv2d CPU backend benchmark: the convolution shapes of TSM-ResNet-50 at
 * 112x112 input, one training step's batch (2 clips x 8 frames = 16
 * images), forward and backward, in GFLOP/s against this machine's
 * measured sgemm peak (the roofline for a GEMM-based convolution).
 *
 *   conv_bench [-t threads] [-r reps] [-n images]
 *
 * Times are the best of reps.  They mean something only on an otherwise
 * idle machine; bench/conv_bench_torch.py times PyTorch on the same shapes.
 * The convolutions go through the CPU backend's slots, so the selection
 * (conv_provider.h) picks a row per shape at the first call; the rows that
 * ran are listed at the end (PS_CONV_KERNELS=gemm|onednn pins one). */
#include "bench/bench_kernels.h"
#include "worker/engine/layers/cpu_layers.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"

#include <cblas.h>
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

static float *rnd(size_t n)
{
    float *p = malloc(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "conv_bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

typedef struct {
    const char *name;
    int C, K, R, stride, H; /* square kernel and input, pad = R/2 */
} shape_t;

static const shape_t shapes[] = {
    {"stem 7x7/2 3->64 @112", 3, 64, 7, 2, 112},
    {"l1 1x1 64->64 @28", 64, 64, 1, 1, 28},
    {"l1 3x3 64->64 @28", 64, 64, 3, 1, 28},
    {"l1 1x1 64->256 @28", 64, 256, 1, 1, 28},
    {"l1 1x1 256->64 @28", 256, 64, 1, 1, 28},
    {"l2 3x3/2 128 @28", 128, 128, 3, 2, 28},
    {"l2 ds 1x1/2 256->512 @28", 256, 512, 1, 2, 28},
    {"l2 3x3 128 @14", 128, 128, 3, 1, 14},
    {"l2 1x1 512->128 @14", 512, 128, 1, 1, 14},
    {"l3 3x3 256 @7", 256, 256, 3, 1, 7},
    {"l3 1x1 1024->256 @7", 1024, 256, 1, 1, 7},
    {"l4 3x3 512 @4", 512, 512, 3, 1, 4},
    {"l4 1x1 512->2048 @4", 512, 2048, 1, 1, 4},
};

int main(int argc, char **argv)
{
    ps_blas_autoselect(argc, argv);
    int threads = 0, reps = 3, N = 16, opt;
    while ((opt = getopt(argc, argv, "t:r:n:")) != -1) {
        if (opt == 't') threads = atoi(optarg);
        else if (opt == 'r') reps = atoi(optarg);
        else if (opt == 'n') N = atoi(optarg);
        else {
            fprintf(stderr, "usage: conv_bench [-t threads] [-r reps] [-n images]\n");
            return 2;
        }
    }
    if (reps < 1 || N < 1) return 2;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, threads);
    bench_print_cpu(stdout);
    printf("OpenBLAS core %s, %d threads, %d images, %d reps\n", ps_blas_corename(),
           ctx.nthreads, N, reps);

    /* roofline: a large square sgemm */
    const int M = 1024;
    float *a = rnd((size_t)M * M), *b = rnd((size_t)M * M), *c = rnd((size_t)M * M);
    ps_blas_sgemm(0, 0, M, M, M, 1, a, M, b, M, 0, c, M);
    double t0, best = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = now();
        ps_blas_sgemm(0, 0, M, M, M, 1, a, M, b, M, 0, c, M);
        if (now() - t0 < best) best = now() - t0;
    }
    const double peak = 2.0 * M * M * M / best * 1e-9;
    printf("sgemm %dx%dx%d: %.1f GFLOP/s (peak used below)\n\n", M, M, M, peak);
    free(a), free(b), free(c);

    printf("%-28s %8s %8s %9s %9s %6s\n", "layer", "fwd ms", "bwd ms", "fwd GF/s", "bwd GF/s",
           "%peak");
    double tf_all = 0, tb_all = 0, fl_all = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape_t *sh = &shapes[s];
        ps_conv2d_desc_t d = {.C = sh->C, .K = sh->K, .R = sh->R, .S = sh->R,
                              .stride_h = sh->stride, .stride_w = sh->stride,
                              .pad_h = sh->R / 2, .pad_w = sh->R / 2, .dil_h = 1, .dil_w = 1,
                              .groups = 1};
        const int H = sh->H, P = ps_conv_out(H, d.R, d.stride_h, d.pad_h, 1);
        const size_t nx = (size_t)N * d.C * H * H, ny = (size_t)N * d.K * P * P;
        const size_t nw = (size_t)d.K * d.C * d.R * d.S;
        float *x = rnd(nx), *w = rnd(nw), *y = rnd(ny), *dy = rnd(ny), *dx = rnd(nx);
        float *dw = rnd(nw);
        if (ps_ctx_reserve(&ctx, ps_conv2d_workspace(&d, N, H, H))) return 1;
        const int first = s == 0; /* the stem needs no input gradient */
        ps_backend_cpu.conv2d_forward(&ctx, y, x, w, NULL, &d, N, H, H);
        ps_backend_cpu.conv2d_backward(&ctx, first ? NULL : dx, dw, NULL, dy, x, w, &d, N, H, H);
        /* best of reps: on a shared machine the minimum is the least disturbed run */
        double tf = 1e30, tb = 1e30;
        for (int r = 0; r < reps; r++) {
            t0 = now();
            ps_backend_cpu.conv2d_forward(&ctx, y, x, w, NULL, &d, N, H, H);
            double t1 = now();
            ps_backend_cpu.conv2d_backward(&ctx, first ? NULL : dx, dw, NULL, dy, x, w, &d, N, H,
                                           H);
            double t2 = now();
            if (t1 - t0 < tf) tf = t1 - t0;
            if (t2 - t1 < tb) tb = t2 - t1;
        }
        const double fl = 2.0 * ny * d.C * d.R * d.S;
        const double flb = fl * (first ? 1 : 2);
        printf("%-28s %8.2f %8.2f %9.1f %9.1f %5.0f%%\n", sh->name, tf * 1e3, tb * 1e3,
               fl / tf * 1e-9, flb / tb * 1e-9, (fl + flb) / (tf + tb) * 1e-9 / peak * 100);
        tf_all += tf, tb_all += tb, fl_all += fl + flb;
        free(x), free(w), free(y), free(dy), free(dx), free(dw);
    }
    printf("\nall shapes once: fwd %.1f ms, bwd %.1f ms, %.1f GFLOP/s = %.0f%% of sgemm peak\n",
           tf_all * 1e3, tb_all * 1e3, fl_all / (tf_all + tb_all) * 1e-9,
           fl_all / (tf_all + tb_all) * 1e-9 / peak * 100);
    bench_print_conv_kernels(stdout, 1);
    ps_ctx_free(&ctx);
    return 0;
}
