/* The two-stage detectors' slots of the CUDA table (worker/engine/cuda/
 * roi_align.cu) against the CPU table's (worker/engine/layers/roi_align.c,
 * itself checked against torchvision by tests/test_roi_align): RoIAlign
 * forward and backward on boxes inside, off, tiny and huge, fixed and
 * adaptive sampling, aligned both ways, several images, the detector's
 * shape (7 x 7, sampling 2, hundreds of RoIs).  Outputs are poisoned with
 * NaN first, so an element a kernel forgot shows up.  Exits 77 without a
 * GPU.
 *
 * Tolerances: forward exact (the kernel spells out the CPU's float
 * operations); backward 1e-6 x max|ref| + 1e-5 |ref| (atomic scatter-adds
 * in another order than the CPU's sequential ones: float rounding only). */
#include "tests/lib/cuda_testutil.h"
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/engine/ps_engine.h"
#include "ps_log.h"

#include <stdio.h>

static ps_ctx_t g, c; /* the CUDA backend's context, the CPU's */

static void *dev(const void *h, size_t bytes) { return cu_upload(h, bytes); }
static float *down(const void *d, size_t n) { return cu_download(&g, d, n); }

/* R random RoIs over a (16/scale)-pixel image: a mix of ordinary, off-map,
 * tiny and huge boxes on N images */
static float *make_rois(int R, int N, float img)
{
    float *r = malloc((size_t)R * 5 * sizeof *r);
    for (int i = 0; i < R; i++) {
        float *b = r + 5 * i, cx = (frand() * 0.75f + 0.5f) * img, cy = (frand() * 0.75f + 0.5f) * img;
        float side = i % 4 == 0 ? 0.3f : i % 4 == 1 ? img * 3 : (frand() + 1.2f) * img * 0.3f;
        b[0] = (float)(i % N);
        b[1] = cx - side * (0.5f + 0.2f * frand());
        b[2] = cy - side * (0.5f + 0.2f * frand());
        b[3] = cx + side * (0.5f + 0.2f * frand());
        b[4] = cy + side * (0.5f + 0.2f * frand());
    }
    return r;
}

static void test_roi_align(int R, int N, int C, int H, int W, int PH, int PW, float scale,
                           int sr, int aligned)
{
    char what[160];
    size_t nf = (size_t)N * C * H * W, no = (size_t)R * C * PH * PW;
    float *f = hrand(nf, 1, 0), *dy = hrand(no, 1, 0), *rois = make_rois(R, N, H / scale);
    float *y = hnan(no), *dx = calloc(nf, sizeof *dx), *poison = hnan(no);
    ps_backend_cpu.roi_align_forward(&c, y, f, rois, R, N, C, H, W, PH, PW, scale, sr, aligned);
    ps_backend_cpu.roi_align_backward(&c, dx, dy, rois, R, N, C, H, W, PH, PW, scale, sr,
                                      aligned);
    float *df = dev(f, nf * 4), *ddy = dev(dy, no * 4), *drois = dev(rois, (size_t)R * 20);
    float *dyo = dev(poison, no * 4), *ddx = dev(dx, nf * 4); /* backward accumulates: 2 x */
    ps_backend_cuda.roi_align_forward(&g, dyo, df, drois, R, N, C, H, W, PH, PW, scale, sr,
                                      aligned);
    ps_backend_cuda.roi_align_backward(&g, ddx, ddy, drois, R, N, C, H, W, PH, PW, scale, sr,
                                       aligned);
    float *gy = down(dyo, no), *gdx = down(ddx, nf);
    for (size_t i = 0; i < nf; i++) dx[i] *= 2;
    snprintf(what, sizeof what, "roi_align R=%d N=%d C=%d %dx%d -> %dx%d sampling %d aligned %d",
             R, N, C, H, W, PH, PW, sr, aligned);
    cmp_report(gy, y, no, 0, 0, what);
    snprintf(what, sizeof what, "roi_align backward (accumulated twice) R=%d sampling %d "
             "aligned %d", R, sr, aligned);
    cmp_report(gdx, dx, nf, 1e-6 * maxabs(dx, nf), 1e-5, what);
    ps_cuda_free(df), ps_cuda_free(ddy), ps_cuda_free(drois), ps_cuda_free(dyo), ps_cuda_free(ddx);
    free(f), free(dy), free(rois), free(y), free(dx), free(poison), free(gy), free(gdx);
}

int main(void)
{
    if (ps_cuda_device_count() == 0) tap_skip_all("no CUDA device");
    ps_log_level = PS_LOG_WARN;
    if (ps_engine_init(&c, 1) || ps_engine_init(&g, 1) || ps_cuda_backend_init(&g, 0)) {
        printf("Bail out! cannot initialise the CUDA backend\n");
        return 1;
    }
    char info[256] = "";
    ps_cuda_open(0, info, sizeof info);
    diag("device %s", info);
    /*              R  N  C   H   W  PH PW scale  sr al */
    test_roi_align(40, 2, 3, 10, 12, 7, 7, 0.25f, 2, 0);
    test_roi_align(40, 2, 3, 10, 12, 7, 7, 0.25f, 0, 0);
    test_roi_align(40, 2, 3, 10, 12, 3, 5, 0.25f, 1, 1);
    test_roi_align(40, 2, 3, 10, 12, 7, 7, 0.25f, 0, 1);
    test_roi_align(1024, 4, 64, 32, 32, 7, 7, 0.25f, 2, 0); /* the detector's P2 */
    test_roi_align(300, 2, 256, 13, 17, 14, 14, 0.0625f, 2, 0); /* Mask R-CNN's 14 x 14 */
    ps_cuda_backend_free(&g);
    ps_ctx_free(&g);
    ps_ctx_free(&c);
    return tap_done();
}
