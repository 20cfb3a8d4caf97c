/* st_i64 FILE.safetensors SUFFIX
 *
 * Prints the distinct values (ascending, space-separated) of every I64
 * tensor of FILE whose name ends with SUFFIX -- e.g. every BN layer's
 * num_batches_tracked -- or "none" when there is no such tensor.  Exit 0,
 * or 2 on a usage or file error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_safetensors.h"

static int cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: st_i64 FILE.safetensors SUFFIX\n");
        return 2;
    }
    ps_st_file_t f;
    char err[256];
    if (ps_st_open(&f, argv[1], err, sizeof err)) {
        fprintf(stderr, "st_i64: %s: %s\n", argv[1], err);
        return 2;
    }
    size_t ls = strlen(argv[2]), n = 0, cap = 0;
    int64_t *v = NULL;
    for (size_t k = 0; k < f.ntensors; k++) {
        const ps_st_tensor_t *t = &f.tensors[k];
        size_t ln = strlen(t->name);
        if (t->dtype != PS_ST_I64 || ln < ls || strcmp(t->name + ln - ls, argv[2])) continue;
        const uint8_t *d = ps_st_tensor_data(&f, t);
        for (size_t i = 0; i + 8 <= t->nbytes; i += 8) {
            if (n == cap) {
                int64_t *nv = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof *v);
                if (!nv) return 2;
                v = nv;
            }
            memcpy(&v[n++], d + i, 8); /* little-endian, as the host */
        }
    }
    qsort(v, n, sizeof *v, cmp);
    if (!n) printf("none");
    for (size_t i = 0; i < n; i++)
        if (i == 0 || v[i] != v[i - 1]) printf("%s%lld", i ? " " : "", (long long)v[i]);
    printf("\n");
    free(v);
    ps_st_close(&f);
    return 0;
}
