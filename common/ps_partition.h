/* Partition table: the model's trainable tensors, taken
 * in model order as one flat fp32 vector, are cut into partitions of at most
 * partition_bytes; small consecutive tensors share a partition, large ones are
 * split.  Partitions go to servers by a deterministic greedy balance of bytes.
 * Every process computes the same table; its hash is checked at HELLO. */
#ifndef PS_PARTITION_H
#define PS_PARTITION_H
#include <stddef.h>
#include <stdint.h>

typedef struct ps_tensor_spec {
    const char *name;  /* torchvision-style name, e.g. "layer1.0.conv1.weight" */
    size_t numel;
    int group;         /* optimizer parameter group (ps_optim.h), 0 = default */
} ps_tensor_spec_t;

/* ps_partition_t.flags */
#define PS_PART_EXACT 1u  /* holds only tensors of an exact group: sent raw fp32
                             both ways, whatever the wire dtype / codec */

typedef struct ps_partition {
    uint32_t id;
    uint32_t server;        /* owning server index */
    size_t offset;          /* first element in the flat model vector */
    size_t numel;
    uint32_t flags;         /* PS_PART_* */
} ps_partition_t;

typedef struct ps_partition_table {
    ps_tensor_spec_t *tensors; /* copy of the specs (names copied) */
    size_t *tensor_offset;     /* flat offset of each tensor */
    uint32_t ntensors;
    ps_partition_t *parts;     /* in model order: parts[i].id == i */
    uint32_t nparts;
    uint32_t nservers;
    size_t partition_bytes;
    size_t total_numel;
    uint32_t exact_groups;     /* bit g: group g's tensors are exact (build_ex) */
    uint64_t hash;             /* FNV-1a over names, sizes, groups, cuts and owners */
} ps_partition_table_t;

/* Build the table.  Returns 0, PS_EINVAL (no tensors, zero sizes, nservers 0,
 * partition_bytes < 4) or PS_ENOMEM. */
int ps_partition_table_build(ps_partition_table_t *t, const ps_tensor_spec_t *tensors,
                             uint32_t ntensors, size_t partition_bytes, uint32_t nservers);
/* The same, where bit g of exact_groups (g < 32) marks the tensors of group g
 * as state that must travel exactly (BN running statistics: an AVERAGE
 * group, ps_optim_exact_groups): a partition never mixes them with other
 * tensors, and theirs get PS_PART_EXACT, which the client sends and asks
 * back as raw fp32 whatever its dtype / codec.  exact_groups 0 is
 * ps_partition_table_build (same cuts, same hash). */
int ps_partition_table_build_ex(ps_partition_table_t *t, const ps_tensor_spec_t *tensors,
                                uint32_t ntensors, size_t partition_bytes, uint32_t nservers,
                                uint32_t exact_groups);
void ps_partition_table_free(ps_partition_table_t *t);

/* A piece of one tensor inside one partition (for per-group optimizer math). */
typedef struct ps_partition_segment {
    uint32_t tensor;       /* index into t->tensors */
    size_t part_offset;    /* first element within the partition */
    size_t numel;
} ps_partition_segment_t;

/* Fill up to max segments of partition p (in order); returns the count
 * (which may exceed max: call again with a bigger array). */
uint32_t ps_partition_segments(const ps_partition_table_t *t, uint32_t p,
                               ps_partition_segment_t *seg, uint32_t max);
/* Number of partitions owned by server s, and bytes owned. */
uint32_t ps_partition_count_for(const ps_partition_table_t *t, uint32_t s, size_t *bytes);

/* Partition holding flat element offset (< total_numel), or UINT32_MAX.
 * With the tensor's offset (t->tensor_offset[i]) and numel this gives the
 * partitions a tensor spans. */
uint32_t ps_partition_at(const ps_partition_table_t *t, size_t offset);
/* Index of the tensor called name, or PS_ENOTFOUND. */
int ps_partition_tensor_index(const ps_partition_table_t *t, const char *name);

/* The exact packing, assignment and hash rules (so another tool can
 * reproduce the hash) are written at the top of ps_partition.c.
 * Duplicate or empty tensor names are rejected with PS_EINVAL. */
#endif
