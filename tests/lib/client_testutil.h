/* Helper of the client tests (test_client, test_client_ef): a partition
 * table of nparts consecutive partitions (partition p on server p %
 * nservers) with the FNV hash of the sizes, as psd would hand out.
 * Header-only; free with free_table(). */
#ifndef PS_CLIENT_TESTUTIL_H
#define PS_CLIENT_TESTUTIL_H

#include "ps_partition.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline void make_table(ps_partition_table_t *t, uint32_t nparts, uint32_t nservers,
                              const size_t *numel)
{
    memset(t, 0, sizeof *t);
    t->parts = calloc(nparts, sizeof *t->parts);
    t->nparts = nparts;
    t->nservers = nservers;
    t->partition_bytes = 1 << 20;
    size_t off = 0;
    uint64_t h = 1469598103934665603ull;
    for (uint32_t p = 0; p < nparts; p++) {
        t->parts[p].id = p;
        t->parts[p].server = p % nservers;
        t->parts[p].offset = off;
        t->parts[p].numel = numel[p];
        off += numel[p];
        h = (h ^ numel[p]) * 1099511628211ull;
    }
    t->total_numel = off;
    t->hash = h;
}

static inline void free_table(ps_partition_table_t *t) { free(t->parts); }

#endif
