/* BLAS set-up: ps_blas_sgemm's OpenMP slicing against a double-precision
 * reference (every transpose, both split directions, uneven slices), and
 * ps_blas_autoselect's re-exec when OpenBLAS reports a weaker core than the
 * CPU supports (simulated with PS_BLAS_FAKE_CORENAME: the program re-execs
 * itself once, and the checks run in the re-executed process). */
#include "tests/lib/tap.h"
#include "worker/engine/ps_blas.h"
#include "worker/engine/ps_engine.h"

#include <string.h>
#include <strings.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

static void check_gemm(int ta, int tb, int M, int N, int K)
{
    unsigned seed = 42u + (unsigned)(M * 7 + N * 3 + K + ta * 2 + tb);
    const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2; /* padded */
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc((size_t)M * ldc * 4);
    float *R = malloc((size_t)M * ldc * 4);
    for (size_t i = 0; i < na; i++) A[i] = frand(&seed);
    for (size_t i = 0; i < nb; i++) B[i] = frand(&seed);
    for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = R[i] = frand(&seed);
    const float alpha = 0.5f, beta = 0.75f;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k]) *
                     (tb ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n]);
            R[(size_t)m * ldc + n] = (float)(alpha * s + beta * R[(size_t)m * ldc + n]);
        }
    ps_blas_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    char what[96];
    snprintf(what, sizeof what, "sgemm %c%c M=%d N=%d K=%d (padding columns untouched too)",
             ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K);
    allclose(C, R, (long)M * ldc, 1e-4, 1e-4, what);
    free(A), free(B), free(C), free(R);
}

int main(int argc, char **argv)
{
    const char *best = ps_blas_best_coretype();
    if (!getenv("PS_BLAS_REEXEC") && !getenv("OPENBLAS_CORETYPE") && best) {
        /* nothing printed yet: the re-exec'd process writes all the TAP */
        char n[16];
        snprintf(n, sizeof n, "%d", argc);
        setenv("PS_BLAS_FAKE_CORENAME", "Prescott", 1);
        setenv("TEST_BLAS_ARGC", n, 1);
        setenv("TEST_BLAS_ARGV0", argv[0], 1);
        ps_blas_autoselect(argc, argv);
        printf("not ok 1 - ps_blas_autoselect re-executed the program\n1..1\n");
        return 1;
    }
    ps_blas_autoselect(argc, argv); /* guard or user setting: must return */
    ok(1, "ps_blas_autoselect returns when the guard or OPENBLAS_CORETYPE is set");
    if (best && getenv("PS_BLAS_FAKE_CORENAME")) {
        const char *ct = getenv("OPENBLAS_CORETYPE");
        ok(ct && !strcmp(ct, best), "re-exec set OPENBLAS_CORETYPE=%s (best for this CPU: %s)",
           ct ? ct : "(unset)", best);
        ok(!strcasecmp(ps_blas_corename(), best),
           "OpenBLAS now runs the %s core (reports %s)", best, ps_blas_corename());
        const char *a0 = getenv("TEST_BLAS_ARGV0"), *ac = getenv("TEST_BLAS_ARGC");
        ok(a0 && ac && !strcmp(a0, argv[0]) && atoi(ac) == argc,
           "argv survived the re-exec (%s, argc %d)", argv[0], argc);
        const char *sc = getenv("GOMP_SPINCOUNT");
        ok(getenv("OMP_WAIT_POLICY") || (sc && atoi(sc) > 0 && atoi(sc) <= 100000),
           "re-exec bounded OpenMP spinning (GOMP_SPINCOUNT=%s)", sc ? sc : "(unset)");
    } else {
        diag("re-exec path not exercised (OPENBLAS_CORETYPE set by the user, or no AVX2 CPU)");
    }
    diag("OpenBLAS core %s, best for this CPU %s", ps_blas_corename(), best ? best : "(default)");

    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    ok(ps_blas_get_threads() == 1, "engine runs OpenBLAS single-threaded (%d)",
       ps_blas_get_threads());
#ifdef _OPENMP
    omp_set_num_threads(3); /* uneven slices even on a 2-core machine */
#endif
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 37, 301, 129); /* split along N */
            check_gemm(ta, tb, 301, 33, 120); /* split along M */
            check_gemm(ta, tb, 5, 7, 3);      /* too small to split */
            check_gemm(ta, tb, 20, 1600, 40); /* several slices per thread */
            check_gemm(ta, tb, 1600, 24, 30);
        }
    ps_ctx_free(&ctx);
    return tap_done();
}
