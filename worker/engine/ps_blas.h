/* BLAS set-up for the CPU backend: which library multiplies (oneDNN's
 * sgemm where the build has it, OpenBLAS otherwise), make OpenBLAS use a
 * kernel that fits this CPU, and control the thread counts.
 *
 * Why: Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) mis-detects some AVX-512
 * Xeons as "Prescott" and then runs SSE3 kernels about 5x slower.  The core
 * is chosen once, in the library's constructor, from OPENBLAS_CORETYPE, so
 * the only fix from inside a program is to set that variable and re-exec. */
#ifndef PS_BLAS_H
#define PS_BLAS_H

/* Call first thing in main() of any program that does GEMM (before any
 * threads exist).  If OPENBLAS_CORETYPE is unset and openblas_get_corename()
 * names a core weaker than the CPU supports (AVX-512 F/BW/VL/DQ ->
 * SKYLAKEX; AVX2+FMA -> HASWELL, or ZEN on AMD), sets OPENBLAS_CORETYPE and
 * re-executes /proc/self/exe with the same argv; it also bounds OpenMP
 * spin-waiting (GOMP_SPINCOUNT=10000 unless OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT is set), which libgomp reads before main() (an environment guard,
 * PS_BLAS_REEXEC, prevents loops; one info line is logged).  Returns 0 when
 * nothing had to be done (or the guard was already set); does not return on
 * a successful re-exec; returns PS_EIO if the re-exec failed (the program
 * may go on with the slow kernel).  Test hook: PS_BLAS_FAKE_CORENAME, when
 * set, stands in for the core OpenBLAS reports. */
int ps_blas_autoselect(int argc, char **argv);

/* The OpenBLAS core in use ("Haswell", "SkylakeX", ...); never NULL. */
const char *ps_blas_corename(void);

/* The core this CPU could use at best ("SKYLAKEX", "HASWELL", "ZEN" or
 * NULL when nothing better than the default is known). */
const char *ps_blas_best_coretype(void);

/* OpenBLAS's own thread count for direct cblas_* calls (n <= 0: number of
 * online CPUs).  The engine sets it to 1 and threads GEMMs itself with
 * ps_blas_sgemm (see there). */
void ps_blas_set_threads(int n);
int ps_blas_get_threads(void);

/* The library ps_blas_sgemm multiplies with: "oneDNN" (its sgemm, in
 * builds with oneDNN: faster than OpenBLAS on the engine's shapes, see
 * ps_blas.c) or "OpenBLAS".  PS_SGEMM=openblas in the environment, or
 * ps_blas_set_library("openblas"), picks OpenBLAS (tests run both); NULL
 * restores the default.  0 or PS_EINVAL (unknown name, or oneDNN asked in
 * a build without it; logged). */
int ps_blas_set_library(const char *name);
const char *ps_blas_library(void);

/* Row-major C = alpha*op(A)*op(B) + beta*C, op(A) M x K, op(B) K x N, as
 * cblas_sgemm, but threaded with OpenMP: the larger of M and N is cut into
 * one slice per OpenMP thread and each thread runs a single-threaded
 * sgemm of the library above on its slice.  Why: OpenBLAS's pthread pool and OpenMP's
 * pool each spin-wait after their work, so alternating GEMMs (OpenBLAS
 * threads) with OpenMP loops (im2col, BN) on the same cores oversubscribes
 * them - measured 5-20x slower convolutions on 2 busy cores.  With every
 * parallel region in one OpenMP team there is one set of threads.  Needs
 * OpenBLAS at 1 thread (ps_engine_init does it); inside a parallel region,
 * or for small products, it is one plain call. */
void ps_blas_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
