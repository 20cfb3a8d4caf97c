/* Peer for bench/ring_bench.c: Open MPI's MPI_Allreduce (in place, fp32 sum),
 * measured the same way: a one-element allreduce lines the ranks up, the
 * slowest rank's time per iteration, median over K.  Not built by make (no
 * MPI dependency): bench/ring_bench.sh compiles it with mpicc when present.
 * Prints: RESULT mpi n=W bytes=B median_s=T busbw_GBps=X
 * Usage: mpirun -np W ring_bench_mpi MiB[,MiB...] K warmup */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, W;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    const char *sizes = argc > 1 ? argv[1] : "16,100";
    int K = argc > 2 ? atoi(argv[2]) : 10, warm = argc > 3 ? atoi(argv[3]) : 2;
    if (K < 1) K = 1;
    char *list = strdup(sizes), *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t n = (size_t)(atof(tok) * 1048576.0) / sizeof(float);
        float *x = malloc(n * sizeof *x), one = 1.f;
        double *t = malloc((size_t)K * sizeof *t), *tmax = malloc((size_t)K * sizeof *t);
        for (size_t i = 0; i < n; i++) x[i] = (float)((i + (size_t)rank) % 1000) * 1e-3f;
        for (int it = 0; it < warm + K; it++) {
            MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (it >= warm) t[it - warm] = MPI_Wtime() - t0;
        }
        MPI_Reduce(t, tmax, K, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(tmax, (size_t)K, sizeof *tmax, cmp_d);
            double med = K % 2 ? tmax[K / 2] : 0.5 * (tmax[K / 2 - 1] + tmax[K / 2]);
            printf("RESULT mpi n=%d bytes=%zu median_s=%.6f busbw_GBps=%.3f\n", W, n * sizeof(float),
                   med, 2.0 * (W - 1) / W * (double)(n * sizeof(float)) / med / 1e9);
            fflush(stdout);
        }
        free(x);
        free(t);
        free(tmax);
    }
    free(list);
    MPI_Finalize();
    return 0;
}
