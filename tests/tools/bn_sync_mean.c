/* bn_sync_mean OUT.safetensors A.safetensors B.safetensors [...]
 *
 * The reference side of tests/test_bn_sync.sh: writes OUT whose every F32
 * tensor is the element-wise mean of the inputs' (summed in double, rounded
 * once to float) and whose I64 tensors (num_batches_tracked) are copied
 * from A after checking every input holds the same.  The inputs must have
 * the same tensor names and shapes.  Exit 0, 1 on a mismatch, 2 on a usage
 * or file error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_safetensors.h"

#define MAXIN 8

int main(int argc, char **argv)
{
    if (argc < 4 || argc - 2 > MAXIN) {
        fprintf(stderr, "usage: bn_sync_mean OUT A B [... up to %d inputs]\n", MAXIN);
        return 2;
    }
    int nin = argc - 2, rc = 0;
    ps_st_file_t f[MAXIN];
    char err[512] = "";
    for (int i = 0; i < nin; i++)
        if (ps_st_open(&f[i], argv[i + 2], err, sizeof err)) {
            fprintf(stderr, "bn_sync_mean: %s: %s\n", argv[i + 2], err);
            while (i--) ps_st_close(&f[i]);
            return 2;
        }
    ps_st_writer_t *w = ps_st_writer_new();
    float **keep = calloc(f[0].ntensors + 1, sizeof *keep);
    if (!w || !keep) rc = 2;
    for (size_t k = 0; k < f[0].ntensors && !rc; k++) {
        const ps_st_tensor_t *t0 = &f[0].tensors[k];
        size_t n = 1;
        for (int d = 0; d < t0->ndim; d++) n *= (size_t)t0->shape[d];
        for (int i = 1; i < nin && !rc; i++) {
            const ps_st_tensor_t *ti = ps_st_find(&f[i], t0->name);
            if (!ti || ti->ndim != t0->ndim || ti->dtype != t0->dtype ||
                memcmp(ti->shape, t0->shape, sizeof(int64_t) * (size_t)t0->ndim) ||
                (t0->dtype == PS_ST_I64 && memcmp(ps_st_tensor_data(&f[0], t0),
                                                  ps_st_tensor_data(&f[i], ti), n * 8))) {
                fprintf(stderr, "bn_sync_mean: tensor %s differs in %s (missing, shape, dtype "
                        "or integer value)\n", t0->name, argv[i + 2]);
                rc = 1;
            }
        }
        if (rc) break;
        if (t0->dtype == PS_ST_I64) {
            rc = ps_st_writer_add(w, t0->name, PS_ST_I64, t0->ndim, t0->shape,
                                  ps_st_tensor_data(&f[0], t0)) ? 2 : 0;
            continue;
        }
        float *v = malloc(n * sizeof(float) + 1), *m = keep[k] = malloc(n * sizeof(float) + 1);
        double *acc = calloc(n + 1, sizeof(double));
        for (int i = 0; v && m && acc && i < nin && !rc; i++) {
            if (ps_st_read_f32(&f[i], t0->name, v, n, err, sizeof err)) {
                fprintf(stderr, "bn_sync_mean: %s: %s\n", argv[i + 2], err);
                rc = 2;
            }
            for (size_t e = 0; e < n && !rc; e++) acc[e] += v[e];
        }
        if (!v || !m || !acc) rc = 2;
        for (size_t e = 0; e < n && !rc; e++) m[e] = (float)(acc[e] / nin);
        if (!rc && ps_st_writer_add(w, t0->name, PS_ST_F32, t0->ndim, t0->shape, m)) rc = 2;
        free(v);
        free(acc);
    }
    if (!rc && (ps_st_writer_meta(w, "format", "pt") || ps_st_writer_save(w, argv[1], err, sizeof err))) {
        fprintf(stderr, "bn_sync_mean: cannot write %s: %s\n", argv[1], err);
        rc = 2;
    }
    ps_st_writer_destroy(&w);
    for (size_t k = 0; keep && k < f[0].ntensors; k++) free(keep[k]);
    free(keep);
    for (int i = 0; i < nin; i++) ps_st_close(&f[i]);
    return rc;
}
