#include "ps_blas.h"
#include "config.h"
#include "ps_error.h"
#include "ps_log.h"

#include <cblas.h>
#ifdef PS_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define REEXEC_GUARD "PS_BLAS_REEXEC"

const char *ps_blas_corename(void)
{
    const char *s = openblas_get_corename();
    return s ? s : "unknown";
}

/* Rough capability rank of an OpenBLAS core name: 3 = AVX-512,
 * 2 = AVX2+FMA, 1 = AVX, 0 = older or unknown. */
static int core_rank(const char *name)
{
    static const char *avx512[] = {"skylakex", "cooperlake", "sapphirerapids", NULL};
    static const char *avx2[] = {"haswell", "zen", "skylake", "excavator", NULL};
    static const char *avx[] = {"sandybridge", "bulldozer", "piledriver", "steamroller", NULL};
    const char **tabs[] = {avx, avx2, avx512};
    for (int r = 2; r >= 0; r--)
        for (const char **p = tabs[r]; *p; p++)
            if (!strcasecmp(name, *p)) return r + 1;
    return 0;
}

const char *ps_blas_best_coretype(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SKYLAKEX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_is("amd") ? "ZEN" : "HASWELL";
#endif
    return NULL;
}

/* libgomp spins up to GOMP_SPINCOUNT (300,000 by default) before a thread
 * sleeps.  On a node shared with other processes (psd, other workers,
 * loader threads: the local cluster runs 4 processes on 2 cores) a spinning
 * thread steals the core its partner needs, and the engine's step got 5-15x
 * slower under load in our measurements.  A short spin keeps the benefit on
 * an idle node.  libgomp reads it before main(), hence the re-exec. */
#define PS_GOMP_SPINCOUNT "10000"

int ps_blas_autoselect(int argc, char **argv)
{
    (void)argc;
    if (getenv(REEXEC_GUARD)) return 0;
    const char *best = ps_blas_best_coretype();
    /* test hook: pretend OpenBLAS picked this core (tests/test_blas.c) */
    const char *cur = getenv("PS_BLAS_FAKE_CORENAME");
    if (!cur) cur = ps_blas_corename();
    int need_core = !getenv("OPENBLAS_CORETYPE") && best && core_rank(cur) < core_rank(best);
    int need_spin = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT");
    if (!need_core && !need_spin) return 0;

    if (need_core)
        ps_info("OpenBLAS chose core %s on a CPU that supports %s: re-executing with "
                "OPENBLAS_CORETYPE=%s", cur, best, best);
    if ((need_core && setenv("OPENBLAS_CORETYPE", best, 1)) ||
        (need_spin && setenv("GOMP_SPINCOUNT", PS_GOMP_SPINCOUNT, 1)) ||
        setenv(REEXEC_GUARD, "1", 1)) {
        ps_error("setenv: %s", strerror(errno));
        return PS_EIO;
    }
    execv("/proc/self/exe", argv);
    ps_error("re-exec of /proc/self/exe failed: %s; going on with OpenBLAS core %s",
             strerror(errno), cur);
    return PS_EIO;
}

void ps_blas_set_threads(int n)
{
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    openblas_set_num_threads(n);
}

int ps_blas_get_threads(void)
{
    return openblas_get_num_threads();
}

/* ---- which library multiplies ------------------------------------------ */

/* oneDNN's sgemm when the build has it and the CPU is AVX2-class: measured
 * against OpenBLAS's Zen kernel on this project's convolution and linear
 * shapes (2 threads, one slice each, AMD EPYC Zen 3) it was faster on every
 * shape but the tiniest (e.g. 256x784x64: 179 vs 135 GFLOP/s; 2048^3:
 * level).  On AVX-512 CPUs OpenBLAS (its SkylakeX kernels, which
 * ps_blas_autoselect makes sure of): there oneDNN 2.6's sgemm corrupted the
 * heap in small shapes called from the convolution's team (an Ice Lake
 * Xeon: glibc aborts in 22 of 30 runs of tests/test_recompute with the GEMM
 * row, 0 of 10 with OpenBLAS; ASan sees nothing in our code and valgrind
 * runs no AVX-512, so it is inside oneDNN's AVX-512 kernels).  PS_SGEMM
 * (openblas | onednn) overrides the choice.  OpenBLAS without oneDNN. */
static int use_onednn = -1; /* -1: not decided yet */

static int decide_library(void)
{
    if (use_onednn < 0) {
#ifdef PS_HAVE_ONEDNN
        const char *e = getenv("PS_SGEMM");
        if (e && !strcasecmp(e, "openblas"))
            use_onednn = 0;
        else if (e && !strcasecmp(e, "onednn"))
            use_onednn = 1;
        else
            use_onednn = dnnl_get_effective_cpu_isa() < dnnl_cpu_isa_avx512_core;
#else
        use_onednn = 0;
#endif
    }
    return use_onednn;
}

int ps_blas_set_library(const char *name)
{
    if (name && !strcasecmp(name, "openblas")) {
        use_onednn = 0;
        return 0;
    }
#ifdef PS_HAVE_ONEDNN
    if (!name || !strcasecmp(name, "onednn")) {
        use_onednn = 1;
        return 0;
    }
#else
    if (!name) {
        use_onednn = 0;
        return 0;
    }
#endif
    ps_error("sgemm library %s: unknown or not in this build (openblas%s)", name,
#ifdef PS_HAVE_ONEDNN
             ", onednn"
#else
             ""
#endif
    );
    return PS_EINVAL;
}

const char *ps_blas_library(void)
{
    return decide_library() ? "oneDNN" : "OpenBLAS";
}

/* One single-threaded row-major sgemm through the chosen library. */
static void sgemm1(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef PS_HAVE_ONEDNN
    if (decide_library()) {
        /* oneDNN threads a call made outside a parallel region over
         * omp_get_max_threads(); the callers here want one thread */
        int nt = 1;
#ifdef _OPENMP
        if (!omp_in_parallel()) nt = omp_get_max_threads(), omp_set_num_threads(1);
#endif
        dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                      A, lda, B, ldb, beta, C, ldc);
#ifdef _OPENMP
        if (nt != 1) omp_set_num_threads(nt);
#endif
        if (st == dnnl_success) return;
        static int warned;
        if (!warned++)
            ps_warn("oneDNN sgemm failed (status %d); this and later calls that fail go to "
                    "OpenBLAS", (int)st);
    }
#endif
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

#define SPLIT_ALIGN 16            /* slice edges on kernel-unroll multiples */
#define SPLIT_MIN_FLOPS (1 << 20) /* below this a team costs more than it saves */
#define SPLIT_MIN_SLICE 128       /* rows/columns below which slices stop paying */

void ps_blas_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int nt = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) nt = omp_get_max_threads();
#endif
    if (nt <= 1 || (double)M * N * K < SPLIT_MIN_FLOPS) {
        sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* cut the longer side: each slice keeps the full reduction (K), so the
     * slices write disjoint parts of C and need no reduction afterwards */
    const int split_n = N >= M;
    const int len = split_n ? N : M;
    /* a few slices per thread, handed out dynamically: a thread that loses
     * its core for a while (a busy machine) does not hold the others at the
     * barrier; each extra slice only re-packs the other operand once */
    int per = len >= nt * 4 * SPLIT_MIN_SLICE ? 4 : len >= nt * 2 * SPLIT_MIN_SLICE ? 2 : 1;
    int chunk = (len + nt * per - 1) / (nt * per);
    chunk = (chunk + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    const int parts = (len + chunk - 1) / chunk;
    const int team = parts < nt ? parts : nt;
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
    for (int t = 0; t < parts; t++) {
        const int lo = t * chunk, n = len - lo < chunk ? len - lo : chunk;
        if (split_n) {
            const float *Bt = trans_b ? B + (size_t)lo * ldb : B + lo;
            sgemm1(trans_a, trans_b, M, n, K, alpha, A, lda, Bt, ldb, beta, C + lo, ldc);
        } else {
            const float *At = trans_a ? A + lo : A + (size_t)lo * lda;
            sgemm1(trans_a, trans_b, n, N, K, alpha, At, lda, B, ldb, beta, C + (size_t)lo * ldc,
                   ldc);
        }
    }
}
