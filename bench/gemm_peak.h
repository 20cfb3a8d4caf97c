/* The device's measured matrix peak (bench/gemm_peak.cu), for
 * bench/gpu_bench.c's roofline line. */
#ifndef PS_BENCH_GEMM_PEAK_H
#define PS_BENCH_GEMM_PEAK_H

#ifdef __cplusplus
extern "C" {
#endif

/* TFLOP/s of a large cuBLAS GEMM (m=n=k=8192) on the current device,
 * averaged over `iters` after a warm-up.  half != 0: fp16 inputs, fp32
 * accumulate (cublasGemmEx, tensor cores); else cublasSgemm in the default
 * math mode (no TF32).  Returns 0, PS_EINVAL or PS_ECUDA. */
int ps_cuda_gemm_peak(int half, int iters, double *tflops);

#ifdef __cplusplus
}
#endif
#endif
