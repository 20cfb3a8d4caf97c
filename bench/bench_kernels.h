/* What a CPU benchmark ran on and with: the CPU (model and the instruction
 * sets the kernels care about), OpenBLAS's core and oneDNN's instruction
 * set, and the convolution kernels the engine chose per layer shape
 * (worker/engine/layers/conv_provider.h).  Header-only, for the CPU
 * benchmarks (engine_bench, conv_bench, retina_bench); every line starts
 * with a word a script can grep ("cpu:", "kernels:", "conv:"). */
#ifndef PS_BENCH_KERNELS_H
#define PS_BENCH_KERNELS_H

#include "worker/engine/layers/conv_provider.h"
#include "worker/engine/ps_blas.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* "cpu: AMD EPYC 7B13, 2 online, avx2 fma" (model name and flags from
 * /proc/cpuinfo; only the flags that decide kernels) */
static inline void bench_print_cpu(FILE *f)
{
    static const char *const want[] = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                                       "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile",
                                       "avx512_fp16", NULL};
    char line[8192], model[256] = "unknown", flags[8192] = "";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    while (ci && fgets(line, sizeof line, ci)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (!strncmp(line, "model name", 10) && !strcmp(model, "unknown")) {
            snprintf(model, sizeof model, "%s", colon + 2);
            model[strcspn(model, "\n")] = '\0';
        } else if (!strncmp(line, "flags", 5) && !flags[0]) {
            snprintf(flags, sizeof flags, " %s", colon + 2);
            flags[strcspn(flags, "\n")] = ' ';
        }
    }
    if (ci) fclose(ci);
    fprintf(f, "cpu: %s, %ld online,", model, sysconf(_SC_NPROCESSORS_ONLN));
    for (int i = 0; want[i]; i++) {
        char pat[32];
        snprintf(pat, sizeof pat, " %s ", want[i]);
        if (strstr(flags, pat)) fprintf(f, " %s", want[i]);
    }
    char dn[96];
    fprintf(f, "\nkernels: sgemm by %s (OpenBLAS core %s); %s; conv selection %s\n",
            ps_blas_library(), ps_blas_corename(), ps_conv_onednn_describe(dn, sizeof dn),
            ps_conv_get_kernels());
}

/* The convolution kernels that ran: one summary line ("conv: fwd gemm:...
 * 120, ..."), and with per_shape one line per layer shape and direction
 * with the time of every candidate row. */
static inline void bench_print_conv_kernels(FILE *f, int per_shape)
{
    char sum[1024];
    fprintf(f, "conv: %s\n", ps_conv_summary(sum, sizeof sum));
    if (!per_shape) return;
    ps_conv_choice_t c[256];
    int n = ps_conv_choices(c, 256);
    for (int i = 0; i < n && i < 256; i++) {
        char sh[128];
        fprintf(f, "conv:   %-44s %-11s -> %s:%s", ps_conv_shape_str(&c[i].shape, sh, sizeof sh),
                ps_conv_dir_name[c[i].dir], c[i].provider, c[i].kernel);
        for (int r = 0; ps_conv_rows[r] && r < 4; r++)
            if (c[i].ms[r] > 0) fprintf(f, " %s=%.2fms", ps_conv_rows[r]->name, c[i].ms[r]);
        fprintf(f, "\n");
    }
}

#endif
