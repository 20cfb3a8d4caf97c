/* Partition table: packing, greedy assignment and the table hash.
 *
 * The rules are written out here because every process (and any tool that
 * wants to reproduce the hash) must apply them identically:
 *  - cap = partition_bytes / 4 elements.  Tensors are walked in model order;
 *    when the open partition is non-empty and the next tensor would take it
 *    past cap, or the next tensor is exact (its group's bit is set in
 *    exact_groups) and the open partition's tensors are not or vice versa,
 *    the open partition is closed.  A tensor larger than cap is cut
 *    into cap-sized partitions of its own; its remainder opens a partition
 *    that later tensors may join.
 *  - Partitions are taken in descending size (ties: lower id first), each
 *    going to the server with the fewest bytes so far (ties: lower index).
 *  - hash = FNV-1a 64 over, in order: for each tensor its name bytes plus a
 *    0 byte, numel as u64 LE, group as i32 LE; then partition_bytes as u64 LE,
 *    nservers as u32 LE; then, only when exact_groups is not 0, exact_groups
 *    as u32 LE; then for each partition offset u64 LE, numel u64 LE,
 *    server u32 LE. */
#include "ps_partition.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

static uint64_t fnv_le(uint64_t h, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) h = (h ^ (uint8_t)(v >> (8 * i))) * FNV_PRIME;
    return h;
}

static int is_exact(const ps_tensor_spec_t *ts, uint32_t exact_groups)
{
    return ts->group >= 0 && ts->group < 32 && (exact_groups >> ts->group & 1u);
}

/* Walk the tensors and cut partitions; with parts == NULL only count. */
static size_t pack(const ps_tensor_spec_t *ts, uint32_t nt, size_t cap, uint32_t exact_groups,
                   ps_partition_t *parts)
{
    size_t np = 0, off = 0, open_off = 0, open_n = 0;
    int open_exact = 0, ex = 0;
#define EMIT(o, n, e)                                                       \
    do {                                                                    \
        if (parts) {                                                        \
            parts[np].id = (uint32_t)np;                                    \
            parts[np].offset = (o);                                         \
            parts[np].numel = (n);                                          \
            parts[np].flags = (e) ? PS_PART_EXACT : 0;                      \
        }                                                                   \
        np++;                                                               \
    } while (0)
    for (uint32_t i = 0; i < nt; i++) {
        size_t n = ts[i].numel;
        ex = is_exact(&ts[i], exact_groups);
        if (open_n && (open_n + n > cap || ex != open_exact)) {
            EMIT(open_off, open_n, open_exact);
            open_n = 0;
        }
        if (n > cap) {
            size_t full = n / cap;
            for (size_t k = 0; k < full; k++) EMIT(off + k * cap, cap, ex);
            if (n % cap) {
                open_off = off + full * cap;
                open_n = n % cap;
                open_exact = ex;
            }
        } else {
            if (!open_n) open_off = off, open_exact = ex;
            open_n += n;
        }
        off += n;
    }
    if (open_n) EMIT(open_off, open_n, open_exact);
#undef EMIT
    return np;
}

static int cmp_desc(const void *a, const void *b)
{
    const ps_partition_t *x = *(ps_partition_t *const *)a, *y = *(ps_partition_t *const *)b;
    if (x->numel != y->numel) return x->numel > y->numel ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int validate(const ps_tensor_spec_t *ts, uint32_t nt, size_t partition_bytes, uint32_t nservers)
{
    if (!ts || !nt) {
        ps_error("partition table: no tensors");
        return PS_EINVAL;
    }
    if (!nservers) {
        ps_error("partition table: nservers is 0");
        return PS_EINVAL;
    }
    if (partition_bytes < 4) {
        ps_error("partition table: partition_bytes %zu is less than one fp32", partition_bytes);
        return PS_EINVAL;
    }
    size_t total = 0;
    for (uint32_t i = 0; i < nt; i++) {
        if (!ts[i].name || !ts[i].name[0]) {
            ps_error("partition table: tensor %u has no name", i);
            return PS_EINVAL;
        }
        if (!ts[i].numel) {
            ps_error("partition table: tensor %u '%s' has 0 elements", i, ts[i].name);
            return PS_EINVAL;
        }
        if (ts[i].numel > SIZE_MAX / 4 - total) {
            ps_error("partition table: model size overflows at tensor %u '%s'", i, ts[i].name);
            return PS_EINVAL;
        }
        total += ts[i].numel;
    }
    /* names identify tensors on the wire and in checkpoints: no duplicates */
    const char **names = malloc(nt * sizeof *names);
    if (!names) return PS_ENOMEM;
    for (uint32_t i = 0; i < nt; i++) names[i] = ts[i].name;
    qsort(names, nt, sizeof *names, cmp_name);
    for (uint32_t i = 1; i < nt; i++)
        if (!strcmp(names[i - 1], names[i])) {
            ps_error("partition table: tensor name '%s' appears twice", names[i]);
            free(names);
            return PS_EINVAL;
        }
    free(names);
    return 0;
}

int ps_partition_table_build(ps_partition_table_t *t, const ps_tensor_spec_t *tensors,
                             uint32_t ntensors, size_t partition_bytes, uint32_t nservers)
{
    return ps_partition_table_build_ex(t, tensors, ntensors, partition_bytes, nservers, 0);
}

int ps_partition_table_build_ex(ps_partition_table_t *t, const ps_tensor_spec_t *tensors,
                                uint32_t ntensors, size_t partition_bytes, uint32_t nservers,
                                uint32_t exact_groups)
{
    memset(t, 0, sizeof *t);
    int rc = validate(tensors, ntensors, partition_bytes, nservers);
    if (rc) return rc;
    size_t cap = partition_bytes / 4;
    size_t np = pack(tensors, ntensors, cap, exact_groups, NULL);
    if (np > UINT32_MAX) {
        ps_error("partition table: %zu partitions of %zu bytes is too many", np, partition_bytes);
        return PS_EINVAL;
    }

    t->tensors = calloc(ntensors, sizeof *t->tensors);
    t->tensor_offset = calloc(ntensors, sizeof *t->tensor_offset);
    t->parts = calloc(np, sizeof *t->parts);
    size_t *load = calloc(nservers, sizeof *load);
    ps_partition_t **order = calloc(np, sizeof *order);
    if (!t->tensors || !t->tensor_offset || !t->parts || !load || !order) goto nomem;
    t->ntensors = ntensors;
    for (uint32_t i = 0; i < ntensors; i++) {
        t->tensors[i] = tensors[i];
        if (!(t->tensors[i].name = strdup(tensors[i].name))) goto nomem;
        t->tensor_offset[i] = t->total_numel;
        t->total_numel += tensors[i].numel;
    }
    t->nparts = (uint32_t)pack(tensors, ntensors, cap, exact_groups, t->parts);
    t->nservers = nservers;
    t->exact_groups = exact_groups;
    t->partition_bytes = partition_bytes;

    for (size_t i = 0; i < np; i++) order[i] = &t->parts[i];
    qsort(order, np, sizeof *order, cmp_desc);
    for (size_t i = 0; i < np; i++) {
        uint32_t best = 0;
        for (uint32_t s = 1; s < nservers; s++)
            if (load[s] < load[best]) best = s;
        order[i]->server = best;
        load[best] += order[i]->numel * 4;
    }

    uint64_t h = FNV_OFFSET;
    for (uint32_t i = 0; i < ntensors; i++) {
        h = fnv(h, t->tensors[i].name, strlen(t->tensors[i].name) + 1);
        h = fnv_le(h, t->tensors[i].numel, 8);
        h = fnv_le(h, (uint32_t)t->tensors[i].group, 4);
    }
    h = fnv_le(h, partition_bytes, 8);
    h = fnv_le(h, nservers, 4);
    if (exact_groups) h = fnv_le(h, exact_groups, 4); /* tables without stay as they were */
    for (uint32_t p = 0; p < t->nparts; p++) {
        h = fnv_le(h, t->parts[p].offset, 8);
        h = fnv_le(h, t->parts[p].numel, 8);
        h = fnv_le(h, t->parts[p].server, 4);
    }
    t->hash = h;
    free(load);
    free(order);
    return 0;

nomem:
    ps_error("partition table: out of memory for %u tensors / %zu partitions", ntensors, np);
    free(load);
    free(order);
    ps_partition_table_free(t);
    return PS_ENOMEM;
}

void ps_partition_table_free(ps_partition_table_t *t)
{
    if (!t) return;
    if (t->tensors)
        for (uint32_t i = 0; i < t->ntensors; i++) free((char *)t->tensors[i].name);
    free(t->tensors);
    free(t->tensor_offset);
    free(t->parts);
    memset(t, 0, sizeof *t);
}

/* index of the tensor holding flat element off (off < total_numel) */
static uint32_t tensor_at(const ps_partition_table_t *t, size_t off)
{
    uint32_t lo = 0, hi = t->ntensors - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (t->tensor_offset[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

uint32_t ps_partition_segments(const ps_partition_table_t *t, uint32_t p,
                               ps_partition_segment_t *seg, uint32_t max)
{
    if (!t || p >= t->nparts) return 0;
    const ps_partition_t *part = &t->parts[p];
    size_t pos = part->offset, end = part->offset + part->numel;
    uint32_t n = 0;
    for (uint32_t i = tensor_at(t, pos); i < t->ntensors && pos < end; i++) {
        size_t tend = t->tensor_offset[i] + t->tensors[i].numel;
        size_t stop = tend < end ? tend : end;
        if (seg && n < max) {
            seg[n].tensor = i;
            seg[n].part_offset = pos - part->offset;
            seg[n].numel = stop - pos;
        }
        n++;
        pos = stop;
    }
    return n;
}

uint32_t ps_partition_count_for(const ps_partition_table_t *t, uint32_t s, size_t *bytes)
{
    uint32_t n = 0;
    size_t b = 0;
    for (uint32_t p = 0; t && p < t->nparts; p++)
        if (t->parts[p].server == s) {
            n++;
            b += t->parts[p].numel * 4;
        }
    if (bytes) *bytes = b;
    return n;
}

uint32_t ps_partition_at(const ps_partition_table_t *t, size_t offset)
{
    if (!t || !t->nparts || offset >= t->total_numel) return UINT32_MAX;
    uint32_t lo = 0, hi = t->nparts - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (t->parts[mid].offset <= offset) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int ps_partition_tensor_index(const ps_partition_table_t *t, const char *name)
{
    for (uint32_t i = 0; t && name && i < t->ntensors; i++)
        if (!strcmp(t->tensors[i].name, name)) return (int)i;
    return PS_ENOTFOUND;
}
