/* Cross-worker BN on the CUDA backend (batchnorm.cu's group path,
 * bn_exchange.cu), fp32: the checks of tests/test_bn_group.c against
 * PyTorch's SyncBatchNorm math (tests/lib/bn_group_check.h: W ranks, one
 * thread and one CUDA context each, a fake group) and its control.  The
 * half-storage group kernels and bn_forward_saved's coefficients are
 * checked on every machine by tests/test_cuda_emu.sh.  Exits 77 without a
 * GPU (a stage of bench/gpu_check.sh). */
#include "tests/lib/bn_group_check.h"
#include "tests/lib/cuda_devbuf.h"

#include "ps_log.h"

static float *cu_up(ps_ctx_t *ctx, const float *h, size_t n)
{
    float *d = dev(h, n);
    ps_cuda_half_forget(ctx, d); /* host data: fp32 */
    return d;
}
static void cu_down(ps_ctx_t *ctx, float *h, const float *d, size_t n)
{
    float *x = down_ctx(ctx, d, n * sizeof *x);
    memcpy(h, x, n * sizeof *x);
    free(x);
}
static void cu_release(float *d) { ps_cuda_free(d); }
static const bng_mem_t cu_mem = {cu_up, cu_down, cu_release};

int main(void)
{
    ps_log_set_level_str("error");
    if (ps_cuda_device_count() == 0) tap_skip_all("no CUDA device");
    golden_load_or_bail("tests/golden/bn_group_golden.bin", 256);
    static ps_ctx_t ctxs[BNG_MAXW];
    ps_ctx_t *ctxp[BNG_MAXW];
    for (int r = 0; r < BNG_MAXW; r++) {
        ps_engine_init(&ctxs[r], 1);
        if (ps_cuda_backend_init(&ctxs[r], 0)) {
            printf("Bail out! cuda backend init failed\n");
            return 1;
        }
        ctxp[r] = &ctxs[r];
    }
    static const char *const cases[] = {"even", "uneven", "offset"};
    for (int i = 0; i < 3; i++) {
        bng_check_case(cases[i], "cuda", &ps_backend_cuda, ctxp, &cu_mem);
        bng_control(cases[i], "cuda", &ps_backend_cuda, ctxp, &cu_mem);
    }
    for (int r = 0; r < BNG_MAXW; r++) {
        ps_cuda_backend_free(&ctxs[r]);
        ps_ctx_free(&ctxs[r]);
    }
    golden_free();
    return tap_done();
}
