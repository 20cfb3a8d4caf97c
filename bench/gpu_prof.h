/* PS_GPU_PROFILE=1 in gpu_bench time: a backend table wrapping every CUDA
 * entry, each call drained and host-timed, summed per layer kind. */
#ifndef PS_BENCH_GPU_PROF_H
#define PS_BENCH_GPU_PROF_H
#include "worker/engine/ps_engine.h"

/* ps_backend_cuda with every entry timed (counters reset) */
const ps_backend_t *gpu_prof_backend(void);
void gpu_prof_reset(void);
/* Print the table per step over `steps` steps; step_s: the profiled
 * step's median (seconds), for the percentages. */
void gpu_prof_print(int steps, double step_s);
#endif
