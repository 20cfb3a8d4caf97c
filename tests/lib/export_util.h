/* Helpers of the model export programs (tests/tools/model_export.c,
 * tests/tools/retina_export.c) that hand C-computed tensors to the PyTorch-side
 * checks: the output folder and raw float32 files.  Header-only; "prog"
 * names the program in error messages. */
#ifndef PS_EXPORT_UTIL_H
#define PS_EXPORT_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* dir/name <- n float32 (host order: little-endian here, as numpy reads) */
static inline int export_write_raw(const char *prog, const char *dir, const char *name,
                                   const float *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof *p, n, f) != n || fclose(f)) {
        fprintf(stderr, "%s: cannot write %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    return 0;
}

/* mkdir that accepts an existing folder; 0 or 1 (message printed) */
static inline int export_mkdir(const char *prog, const char *dir)
{
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "%s: mkdir %s: %s\n", prog, dir, strerror(errno));
        return 1;
    }
    return 0;
}

#endif
