/* Execution context of the CPU backend: thread counts and the scratch
 * workspace (im2col columns) shared by all layers of a model. */
#include "layers/conv_provider.h"
#include "ps_blas.h"
#include "ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int ps_engine_init(ps_ctx_t *ctx, int nthreads)
{
    if (!ctx) return PS_EINVAL;
    memset(ctx, 0, sizeof *ctx);
    if (nthreads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = c > 0 ? (int)c : 1;
    }
    ctx->nthreads = nthreads;
    /* One thread pool: OpenMP runs the loops and splits the GEMMs
     * (ps_blas_sgemm), OpenBLAS runs single-threaded inside each slice.
     * Two pools that both spin-wait would oversubscribe the cores. */
#ifdef _OPENMP
    ps_blas_set_threads(1);
    omp_set_num_threads(nthreads);
#else
    ps_blas_set_threads(nthreads); /* no OpenMP: OpenBLAS's threads are all there is */
#endif
    /* The core can only be changed by re-exec, which belongs at the top of
     * main() (ps_blas_autoselect); here we can only point at the problem. */
    const char *best = ps_blas_best_coretype();
    if (best && !getenv("OPENBLAS_CORETYPE") && !getenv("PS_BLAS_REEXEC"))
        ps_debug("OpenBLAS core %s (best for this CPU: %s); call ps_blas_autoselect() in "
                 "main() to switch if slower", ps_blas_corename(), best);
    return 0;
}

int ps_ctx_reserve(ps_ctx_t *ctx, size_t numel)
{
    if (numel <= ctx->workspace_numel) return 0;
    if (numel > SIZE_MAX / sizeof(float)) return PS_ENOMEM;
    void *p = NULL;
    if (posix_memalign(&p, 64, numel * sizeof(float))) {
        ps_error("workspace: cannot allocate %zu floats", numel);
        return PS_ENOMEM;
    }
    free(ctx->workspace);
    ctx->workspace = p;
    ctx->workspace_numel = numel;
    return 0;
}

void ps_ctx_free(ps_ctx_t *ctx)
{
    if (!ctx) return;
    ps_cpu_state_free(ctx);
    free(ctx->workspace);
    ctx->workspace = NULL;
    ctx->workspace_numel = 0;
}
