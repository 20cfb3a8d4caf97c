/* Reader of the PSGOLD1 golden files that tests/golden/gen_layers.py and
 * gen_det.py write (little-endian): magic "PSGOLD1\n", then records until
 * EOF: u32 name length (1..63), the name, u32 dtype (0 f32, 1 i32), u32
 * ndim (<= 8), ndim u32 dims, numel * 4 bytes of data.  Every length is
 * checked against the file's end, so a truncated or corrupt file is a
 * diagnosed failure, never a crash.  Header-only like tests/lib/tap.h (one
 * table per test program). */
#ifndef PS_GOLDEN_IO_H
#define PS_GOLDEN_IO_H

#include "tests/lib/tap.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[64];
    int dtype; /* 0 f32, 1 i32 */
    int ndim, dims[8];
    size_t numel;
    void *data;
} golden_rec_t;

static golden_rec_t *golden_recs;
static int golden_nrecs;

static inline void golden_free(void)
{
    for (int i = 0; i < golden_nrecs; i++) free(golden_recs[i].data);
    free(golden_recs);
    golden_recs = NULL;
    golden_nrecs = 0;
}

/* Parse buf[0..end) holding at most max_records records; 0 or -1 (diag). */
static inline int golden_parse_(const uint8_t *gold, size_t end, const char *path,
                                int max_records)
{
    if (end < 8 || memcmp(gold, "PSGOLD1\n", 8)) return diag("%s: bad magic", path), -1;
    size_t off = 8;
#define GOLDEN_NEED_(n)                                                               \
    if ((n) > end - off) return diag("%s: truncated at byte %zu", path, off), -1
    while (off < end) {
        uint32_t u[2];
        GOLDEN_NEED_(4);
        memcpy(u, gold + off, 4), off += 4;
        if (u[0] == 0 || u[0] >= 64 || golden_nrecs == max_records)
            return diag("%s: bad record", path), -1;
        golden_rec_t *r = &golden_recs[golden_nrecs++];
        GOLDEN_NEED_(u[0]);
        memcpy(r->name, gold + off, u[0]), off += u[0];
        r->name[u[0]] = 0;
        GOLDEN_NEED_(8);
        memcpy(u, gold + off, 8), off += 8;
        if (u[0] > 1 || u[1] > 8) return diag("%s: %s: bad dtype/ndim", path, r->name), -1;
        r->dtype = (int)u[0], r->ndim = (int)u[1], r->numel = 1;
        for (int i = 0; i < r->ndim; i++) {
            GOLDEN_NEED_(4);
            memcpy(u, gold + off, 4), off += 4;
            r->dims[i] = (int)u[0];
            r->numel *= u[0];
        }
        GOLDEN_NEED_(r->numel * 4);
        /* names have any length, so the data is not aligned in the file */
        r->data = malloc(r->numel ? r->numel * 4 : 4);
        if (!r->data) return diag("out of memory"), -1;
        memcpy(r->data, gold + off, r->numel * 4);
        off += r->numel * 4;
    }
#undef GOLDEN_NEED_
    return 0;
}

/* Load path (at most max_records records) into golden_recs; 0 or -1. */
static inline int golden_load(const char *path, int max_records)
{
    FILE *f = fopen(path, "rb");
    if (!f) return diag("%s: cannot open", path), -1;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *gold = malloc(sz > 0 ? (size_t)sz : 1);
    if (!gold || sz < 0 || fread(gold, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(gold);
        return diag("%s: cannot read", path), -1;
    }
    fclose(f);
    golden_free();
    golden_recs = calloc(max_records > 0 ? max_records : 1, sizeof *golden_recs);
    int r = golden_recs ? golden_parse_(gold, (size_t)sz, path, max_records)
                        : (diag("out of memory"), -1);
    free(gold);
    return r;
}

static inline golden_rec_t *golden_find(const char *name)
{
    for (int i = 0; i < golden_nrecs; i++)
        if (!strcmp(golden_recs[i].name, name)) return &golden_recs[i];
    return NULL;
}

/* $top_srcdir/rel (top_srcdir "." when unset), loaded; on failure a TAP
 * "Bail out!" and exit 1, as the layer tests always did. */
static inline void golden_load_or_bail(const char *rel, int max_records)
{
    const char *top = getenv("top_srcdir");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", top ? top : ".", rel);
    if (golden_load(path, max_records)) {
        printf("Bail out! cannot load %s\n", path);
        exit(1);
    }
}

#endif
