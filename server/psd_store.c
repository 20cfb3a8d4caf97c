/* The shard store: the partition table of a checked INIT spec (psd_spec.c),
 * per-partition fp32 weights / momentum / version, the per-rank gradient
 * slots of the current iteration, the rank-order reduction + optimizer step,
 * and the encoded WEIGHTS buffers shared by replies.  It keeps its own state
 * only: membership, the socket and replies are its callers' business. */
#include "psd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"

int psd_mode_parse(const char *s, psd_mode_t *m)
{
    if (!strcmp(s, "sync")) *m = PSD_SYNC;
    else if (!strcmp(s, "async")) *m = PSD_ASYNC;
    else if (!strcmp(s, "ssp")) *m = PSD_SSP;
    else return PS_EINVAL;
    return 0;
}

void psd_buf_unref(psd_buf_t *b)
{
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) free(b);
}

void psd_buf_zmq_free(void *data, void *hint)
{
    (void)data;
    psd_buf_unref(hint);
}

void psd_store_drop_cache(psd_part_t *p)
{
    for (int d = 0; d < PSD_NDTYPE; d++)
        for (int c = 0; c < PSD_NCODEC; c++) {
            psd_buf_unref(p->cache[d][c]);
            p->cache[d][c] = NULL;
        }
}

/* A weights buffer of numel floats, one reference (the partition's). */
static psd_buf_t *wbuf_new(size_t numel, int zero)
{
    size_t len = numel * sizeof(float);
    psd_buf_t *b = zero ? calloc(1, sizeof *b + len) : malloc(sizeof *b + len);
    if (!b) return NULL;
    atomic_init(&b->refs, 1);
    b->version = UINT64_MAX; /* no CRC computed yet */
    b->len = len;
    b->crc = 0;
    return b;
}

int psd_store_weights_writable(psd_t *s, psd_part_t *p)
{
    psd_store_drop_cache(p);
    if (!p->wbuf || atomic_load(&p->wbuf->refs) == 1) {
        /* Only the partition holds it: no send in flight can see the write.
         * (New references are only taken on this thread.) */
        if (p->wbuf) p->wbuf->version = UINT64_MAX;
        return 0;
    }
    s->mx.weights_cow++;
    psd_buf_t *nb = wbuf_new(p->numel, 0);
    if (!nb) {
        ps_error("partition %u: out of memory for a copy of the weights while a reply is in "
                 "flight; updating in place (that reply will fail its checksum and be retried)",
                 p->id);
        return PS_ENOMEM;
    }
    memcpy(nb->data, p->wbuf->data, p->numel * sizeof(float));
    psd_buf_unref(p->wbuf);
    p->wbuf = nb;
    p->w = (float *)nb->data;
    return 0;
}

const float *psd_store_slot(const psd_part_t *p, int r)
{
    if (p->direct && r == p->direct_rank) return p->direct;
    if (p->held_on && p->held_on[r]) return zmq_msg_data(&p->held[r]);
    return p->slots + (size_t)r * p->numel;
}

void psd_store_release_held(psd_part_t *p)
{
    for (int r = 0; p->held_on && r < p->nheld; r++)
        if (p->held_on[r]) {
            zmq_msg_close(&p->held[r]);
            p->held_on[r] = 0;
        }
}

void psd_store_drop_pending(psd_t *s, psd_part_t *p)
{
    if (p->have) memset(p->have, 0, (size_t)s->st.nworkers);
    psd_store_release_held(p);
    p->direct = NULL;
    p->overflow = 0;
    p->wait_since_ms = 0;
}

static void part_free(psd_part_t *p)
{
    psd_store_release_held(p);
    free(p->held);
    free(p->held_on);
    psd_buf_unref(p->wbuf);
    free(p->seg);
    free(p->m);
    free(p->slots);
    psd_buf_unref(p->prevbuf);
    free(p->have);
    free(p->last_iter);
    psd_store_drop_cache(p);
    while (p->waiters) {
        psd_waiter_t *n = p->waiters->next;
        free(p->waiters);
        p->waiters = n;
    }
    memset(p, 0, sizeof *p);
}

void psd_store_free(psd_store_t *st)
{
    if (st->parts)
        for (uint32_t i = 0; i < st->table.nparts; i++) part_free(&st->parts[i]);
    free(st->parts);
    if (st->have_table) ps_partition_table_free(&st->table);
    free(st->spec_json);
    free(st->optim_json);
    free(st->gsum);
    free(st->scratch);
    free(st->skips);
    memset(st, 0, sizeof *st);
}

int psd_store_scratch(psd_store_t *st, size_t n)
{
    if (n <= st->scratch_cap) return 0;
    void *p = realloc(st->scratch, n);
    if (!p) {
        ps_error("codec scratch of %zu bytes: out of memory", n);
        return PS_ENOMEM;
    }
    st->scratch = p;
    st->scratch_cap = n;
    return 0;
}

/* Chunks small enough to stay in L1/L2 while every slot is added in. */
#define SUM_CHUNK 8192

static size_t nchunks_of(size_t n) { return (n + SUM_CHUNK - 1) / SUM_CHUNK; }

typedef struct scan_job {
    const float *g;
    size_t n;
    atomic_int bad;
} scan_job_t;

static void scan_chunk(void *arg, size_t c)
{
    scan_job_t *j = arg;
    size_t lo = c * SUM_CHUNK, hi = lo + SUM_CHUNK < j->n ? lo + SUM_CHUNK : j->n;
    int bad = 0;
    for (size_t i = lo; i < hi; i++) bad |= !isfinite(j->g[i]);
    if (bad) atomic_store(&j->bad, 1);
}

int psd_store_nonfinite(psd_t *s, const float *g, size_t n)
{
    scan_job_t j = {.g = g, .n = n};
    atomic_init(&j.bad, 0);
    psd_pool_run(s->pool, scan_chunk, &j, nchunks_of(n));
    return atomic_load(&j.bad);
}

/* The tensor segments of partition i, checked to tile it in order with
 * valid groups; NULL (and the unfused optimizer path) otherwise. */
static psd_seg_t *part_segments(const psd_store_t *st, uint32_t i, uint32_t *nseg)
{
    const ps_partition_table_t *t = &st->table;
    uint32_t n = ps_partition_segments(t, i, NULL, 0);
    ps_partition_segment_t *ps = n ? malloc(n * sizeof *ps) : NULL;
    psd_seg_t *seg = n ? malloc(n * sizeof *seg) : NULL;
    size_t covered = 0;
    if (!ps || !seg || ps_partition_segments(t, i, ps, n) != n) goto bad;
    for (uint32_t k = 0; k < n; k++) {
        if (ps[k].tensor >= t->ntensors || ps[k].part_offset != covered) goto bad;
        int g = t->tensors[ps[k].tensor].group;
        if (g < 0 || g >= st->optim.ngroups) goto bad;
        seg[k] = (psd_seg_t){.off = ps[k].part_offset, .n = ps[k].numel, .group = g};
        covered += ps[k].numel;
    }
    if (covered != t->parts[i].numel) goto bad;
    free(ps);
    *nseg = n;
    return seg;
bad:
    free(ps);
    free(seg);
    *nseg = 0;
    return NULL;
}

static int alloc_shard(psd_t *s, char *err, size_t errlen)
{
    psd_store_t *st = &s->st;
    const ps_partition_table_t *t = &st->table;
    int W = st->nworkers;
    st->parts = calloc(t->nparts, sizeof *st->parts);
    if (!st->parts) return PS_ENOMEM;
    for (uint32_t i = 0; i < t->nparts; i++) {
        psd_part_t *p = &st->parts[i];
        p->id = i;
        p->numel = t->parts[i].numel;
        if (t->parts[i].server != (uint32_t)s->o.server_id) continue;
        p->owned = 1;
        p->prev_version = UINT64_MAX;
        st->nowned++;
        if (p->numel > st->max_numel) st->max_numel = p->numel;
        if ((p->wbuf = wbuf_new(p->numel, 1))) p->w = (float *)p->wbuf->data;
        p->seg = part_segments(st, i, &p->nseg);
        p->m = calloc(p->numel, sizeof(float));
        p->have = calloc(W, 1);
        p->last_iter = calloc(W, sizeof(uint64_t));
        if (s->mode == PSD_SYNC) {
            p->slots = malloc((size_t)W * p->numel * sizeof(float));
            p->held = calloc(W, sizeof *p->held);
            p->held_on = calloc(W, 1);
            p->nheld = W;
            if (!p->held || !p->held_on) {
                snprintf(err, errlen, "out of memory allocating partition %u", i);
                return PS_ENOMEM;
            }
        }
        if (!p->w || !p->m || !p->have || !p->last_iter || (s->mode == PSD_SYNC && !p->slots)) {
            snprintf(err, errlen, "out of memory allocating partition %u (%zu floats x %d slots)", i,
                     p->numel, W);
            return PS_ENOMEM;
        }
    }
    st->gsum = malloc((st->max_numel ? st->max_numel : 1) * sizeof(float));
    if (!st->gsum) return PS_ENOMEM;
    return 0;
}

int psd_store_hold(psd_t *s, psd_spec_t *sp, char *err, size_t errlen)
{
    psd_store_t *st = &s->st;
    st->table = sp->table;
    st->have_table = 1;
    st->optim = sp->optim;
    /* slots for every rank the job may have (elastic: --max-workers) */
    st->nworkers = s->nworkers > sp->nworkers ? s->nworkers : sp->nworkers;
    st->optim_json = ps_optim_config_to_json(&sp->optim);
    st->spec_json = strndup(sp->json, sp->len);
    int rc = alloc_shard(s, err, errlen);
    if (rc < 0) {
        if (rc == PS_ENOMEM && !err[0]) snprintf(err, errlen, "out of memory allocating the shard");
        psd_store_free(st);
        return rc;
    }
    size_t bytes = 0;
    ps_partition_count_for(&st->table, s->o.server_id, &bytes);
    ps_info("table 0x%016llx: %u tensors, %u partitions, this server owns %u (%.1f MiB), %d workers",
            (unsigned long long)st->table.hash, st->table.ntensors, st->table.nparts, st->nowned,
            bytes / 1048576.0, st->nworkers);
    if (st->nowned == 0) ps_warn("this server owns no partition of the table");
    return 0;
}

static void apply_grad(psd_t *s, psd_part_t *p, const float *g)
{
    psd_store_weights_writable(s, p);
    double t0 = psd_now_s();
    ps_optim_config_t c = s->st.optim;
    float k = psd_elastic_lr_scale(s, p->version);
    c.lr *= k, c.min_lr *= k; /* every schedule is linear in (lr, min_lr) */
    int rc = ps_optim_apply_partition(&c, &s->st.table, p->id, p->w, p->m, g, p->version);
    if (rc) ps_error("partition %u: optimizer step failed: %s", p->id, ps_strerror(rc));
    s->mx.apply_seconds += psd_now_s() - t0;
    s->mx.apply_count++;
}

static void bump_version(psd_t *s, psd_part_t *p)
{
    p->version++;
    s->st.updates++;
    s->mx.updates++;
    psd_store_drop_cache(p);
}

typedef struct sum_job {
    const float *const *src_of; /* (n) gradient of each contributor, rank order */
    size_t numel;
    int n;
    float *g;            /* (numel) mean gradient out */
    const float *src;    /* async: the one gradient to scale */
} sum_job_t;

/* Deterministic: every element is summed in rank order whichever thread
 * runs the chunk, then divided by the contributor count. */
static void sum_chunk(void *arg, size_t c)
{
    const sum_job_t *j = arg;
    size_t lo = c * SUM_CHUNK, hi = lo + SUM_CHUNK < j->numel ? lo + SUM_CHUNK : j->numel;
    float *g = j->g, div = (float)j->n;
    const float *s0 = j->src_of[0];
    if (j->n == 2) { /* one pass over memory for the common two-worker case */
        const float *s1 = j->src_of[1];
        for (size_t i = lo; i < hi; i++) g[i] = (s0[i] + s1[i]) / div;
        return;
    }
    for (size_t i = lo; i < hi; i++) g[i] = s0[i];
    for (int k = 1; k < j->n; k++) {
        const float *sk = j->src_of[k];
        for (size_t i = lo; i < hi; i++) g[i] += sk[i];
    }
    for (size_t i = lo; i < hi; i++) g[i] /= div;
}

static void scale_chunk(void *arg, size_t c)
{
    const sum_job_t *j = arg;
    size_t lo = c * SUM_CHUNK, hi = lo + SUM_CHUNK < j->numel ? lo + SUM_CHUNK : j->numel;
    float div = (float)j->n;
    for (size_t i = lo; i < hi; i++) j->g[i] = j->src[i] / div;
}

/* Sum + optimizer in one pass: each chunk's mean gradient is formed in a
 * buffer that stays in L1 and applied to the chunk's weights / momentum
 * right away, so the mean never goes to memory and back.  Element for
 * element the same operations as sum_chunk then ps_optim_apply_partition
 * (ps_optim_sgd is element-wise), in rank order: deterministic. */
/* ---- CRC32C of the new weights, one chunk at a time ----
 * The fused pass also checksums each chunk of new weights while it is in L1;
 * the chunk CRCs are joined in order with the GF(2) "append len zero bytes"
 * operator (as zlib's crc32_combine), so the zero-copy fp32 reply needs no
 * separate pass over the partition. */
#define CRC_POLY 0x82f63b78u

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

/* op: the operator that advances a CRC over len zero bytes (len > 0). */
static void crc_zeros_op(uint32_t op[32], size_t len)
{
    uint32_t a[32], b[32], t[32], *cur = a, *nxt = b;
    int have = 0;
    a[0] = CRC_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) a[n] = 1u << (n - 1);
    gf2_square(b, a); /* 2 bits */
    gf2_square(a, b); /* 4 bits */
    for (; len; len >>= 1) {
        gf2_square(nxt, cur); /* 8, 16, ... bits = 1, 2, ... bytes */
        uint32_t *x = cur;
        cur = nxt;
        nxt = x;
        if (len & 1) {
            if (!have) memcpy(op, cur, sizeof t);
            else {
                for (int n = 0; n < 32; n++) t[n] = gf2_times(cur, op[n]);
                memcpy(op, t, sizeof t);
            }
            have = 1;
        }
    }
}

/* CRC of A || B from crc(A), crc(B) and |B| (zeros operator of |B|). */
static uint32_t crc_join(uint32_t crc_a, uint32_t crc_b, const uint32_t op_b[32])
{
    return gf2_times(op_b, crc_a) ^ crc_b;
}

typedef struct fuse_job {
    const float *const *src_of; /* (n) sources in rank order */
    int n;
    float div;                  /* mean = sum / div */
    const psd_part_t *p;
    const ps_optim_config_t *c;
    int first;
    uint32_t *crc;              /* (nchunks) CRC32C of each chunk's new weights */
    float *dst;                 /* (numel) where the new weights go: p->w (in place),
                                 * or another buffer (the old weights are kept) */
} fuse_job_t;

static void fuse_chunk(void *arg, size_t c)
{
    const fuse_job_t *j = arg;
    const psd_part_t *p = j->p;
    size_t lo = c * SUM_CHUNK, hi = lo + SUM_CHUNK < p->numel ? lo + SUM_CHUNK : p->numel;
    float gch[SUM_CHUNK];
    const float *g;
    if (j->n == 1 && j->div == 1.0f) {
        g = j->src_of[0] + lo; /* x / 1 == x: read the gradient where it lies */
    } else {
        size_t k = hi - lo;
        const float *s0 = j->src_of[0] + lo;
        if (j->n == 1) {
            for (size_t i = 0; i < k; i++) gch[i] = s0[i] / j->div;
        } else if (j->n == 2) {
            const float *s1 = j->src_of[1] + lo;
            for (size_t i = 0; i < k; i++) gch[i] = (s0[i] + s1[i]) / j->div;
        } else {
            for (size_t i = 0; i < k; i++) gch[i] = s0[i];
            for (int r = 1; r < j->n; r++) {
                const float *sr = j->src_of[r] + lo;
                for (size_t i = 0; i < k; i++) gch[i] += sr[i];
            }
            for (size_t i = 0; i < k; i++) gch[i] /= j->div;
        }
        g = gch;
    }
    float *w = j->dst;
    if (w != p->w) memcpy(w + lo, p->w + lo, (hi - lo) * sizeof(float));
    /* The segments overlapping [lo, hi): binary search for the first. */
    uint32_t a = 0, b = p->nseg;
    while (b - a > 1) {
        uint32_t mid = (a + b) / 2;
        if (p->seg[mid].off <= lo) a = mid;
        else b = mid;
    }
    for (uint32_t k = a; k < p->nseg && p->seg[k].off < hi; k++) {
        const psd_seg_t *sg = &p->seg[k];
        size_t s0 = sg->off > lo ? sg->off : lo, e = sg->off + sg->n < hi ? sg->off + sg->n : hi;
        if (s0 >= e) continue;
        ps_optim_sgd(w + s0, p->m ? p->m + s0 : NULL, g + (s0 - lo), e - s0, sg->lr, sg->wd, j->c,
                     j->first);
    }
    if (j->crc) j->crc[c] = ps_crc32c(0, w + lo, (hi - lo) * sizeof(float));
}

/* mean(src_of[0..n)) * n / div, then the optimizer step; 1 when done, 0
 * when the partition needs the unfused path (no usable segment list).
 * nb: the buffer the new weights go to, p->w left as it was (NULL: in
 * place in p->wbuf). */
static int fused_apply(psd_t *s, psd_part_t *p, const float *const *src_of, int n, float div,
                       psd_buf_t *nb)
{
    const ps_optim_config_t *c = &s->st.optim;
    if (!p->seg || !p->nseg) return 0;
    for (uint32_t k = 0; k < p->nseg; k++) {
        if (p->seg[k].group >= c->ngroups) return 0;
        /* AVERAGE groups (BN statistics, ps_optim.h) are not SGD: unfused path */
        if (c->group_kind[p->seg[k].group] != PS_GROUP_SGD) return 0;
        const ps_param_group_t *g = &c->groups[p->seg[k].group];
        /* As ps_optim_apply_partition computes them (elastic linear
         * scaling: times W_v / W0) */
        p->seg[k].lr = ps_optim_lr_group(c, p->version, g->lr_mult) *
                       psd_elastic_lr_scale(s, p->version);
        p->seg[k].wd = (float)((double)c->weight_decay * g->wd_mult);
    }
    if (!nb) psd_store_weights_writable(s, p);
    psd_buf_t *out = nb ? nb : p->wbuf;
    double t0 = psd_now_s();
    size_t nch = nchunks_of(p->numel);
    fuse_job_t j = {.src_of = src_of, .n = n, .div = div, .p = p, .c = c, .first = p->version == 0,
                    .crc = malloc(nch * sizeof(uint32_t)), .dst = nb ? (float *)nb->data : p->w};
    psd_pool_run(s->pool, fuse_chunk, &j, nch);
    if (j.crc && out) {
        static uint32_t op_full[32];
        static int have_op;
        uint32_t op_last[32];
        if (!have_op) crc_zeros_op(op_full, SUM_CHUNK * sizeof(float)), have_op = 1;
        size_t last = (p->numel - (nch - 1) * SUM_CHUNK) * sizeof(float);
        if (last != SUM_CHUNK * sizeof(float)) crc_zeros_op(op_last, last);
        uint32_t crc = j.crc[0];
        for (size_t k = 1; k < nch; k++)
            crc = crc_join(crc, j.crc[k], k == nch - 1 && last != SUM_CHUNK * sizeof(float) ? op_last : op_full);
        /* Valid for the version this update produces (bump_version follows). */
        out->crc = crc;
        out->version = p->version + 1;
    }
    free(j.crc);
    /* The aggregation is part of this pass: its time is in apply_seconds. */
    s->mx.apply_seconds += psd_now_s() - t0;
    s->mx.apply_count++;
    s->mx.agg_count++;
    return 1;
}

void psd_store_forget_prev(psd_part_t *p)
{
    p->prev_version = UINT64_MAX;
    p->prev_skipped = 0;
}

/* The buffer the next version's weights go to: the one of the version
 * before (prevbuf) when no reply of it is in flight any more, else a new
 * one; NULL when out of memory (then the update is made in place and no
 * version is kept). */
static psd_buf_t *spare_buffer(psd_part_t *p)
{
    psd_buf_t *b = p->prevbuf;
    p->prevbuf = NULL;
    psd_store_forget_prev(p);
    if (b && atomic_load(&b->refs) == 1) {
        b->version = UINT64_MAX; /* its CRC is the fused pass's to set */
        return b;
    }
    psd_buf_unref(b); /* the replies in flight keep their references */
    if (!(b = wbuf_new(p->numel, 0)))
        ps_warn("partition %u: out of memory for the previous version's weights: a worker "
                "that dies between its pushes cannot rejoin exactly", p->id);
    return b;
}

/* The update made in nb: it becomes the weights, the old ones the version
 * before (the partition's reference moves with them). */
static void swap_in(psd_t *s, psd_part_t *p, psd_buf_t *nb)
{
    psd_store_drop_cache(p);
    if (p->wbuf && atomic_load(&p->wbuf->refs) > 1) s->mx.weights_left++;
    p->prevbuf = p->wbuf;
    p->wbuf = nb;
    p->w = (float *)nb->data;
}

float *psd_store_prev_writable(psd_part_t *p)
{
    if (p->prevbuf && atomic_load(&p->prevbuf->refs) > 1) {
        psd_buf_unref(p->prevbuf);
        p->prevbuf = NULL;
    }
    if (!p->prevbuf) p->prevbuf = wbuf_new(p->numel, 0);
    return psd_store_prev(p);
}

void psd_store_apply_sync(psd_t *s, psd_part_t *p)
{
    int W = s->st.nworkers, n = 0;
    const float *src_of[W > 0 ? W : 1];
    for (int r = 0; r < W; r++)
        if (p->have[r]) src_of[n++] = psd_store_slot(p, r);
    uint64_t from = p->version;
    int from_skipped = p->skipped_ver && p->skipped_ver == p->version;
    psd_buf_t *nb = spare_buffer(p);
    if (p->overflow) {
        /* info, not debug: rare, and the one trace of a skipped step here */
        ps_info("partition %u iteration %llu: loss-scale overflow flagged, update skipped",
                p->id, (unsigned long long)p->version);
        s->mx.skipped++;
        psd_skips_add(&s->st, p->version);
        /* the weights stay; the version before is the same values */
        if (nb) memcpy(nb->data, p->w, p->numel * sizeof(float)), swap_in(s, p, nb);
    } else if (n > 0 && fused_apply(s, p, src_of, n, (float)n, nb)) {
        /* done in one pass, into nb: the old weights stay the version before */
        if (nb) swap_in(s, p, nb);
    } else if (n > 0) {
        double t0 = psd_now_s();
        /* One contributor: its gradient is the mean (x / 1 is exact), so
         * the optimizer reads it where it lies, with no summation pass. */
        const float *g = src_of[0];
        if (n > 1) {
            sum_job_t j = {.src_of = src_of, .numel = p->numel, .n = n, .g = s->st.gsum};
            psd_pool_run(s->pool, sum_chunk, &j, nchunks_of(p->numel));
            g = s->st.gsum;
        }
        s->mx.agg_seconds += psd_now_s() - t0;
        s->mx.agg_count++;
        if (nb) memcpy(nb->data, p->w, p->numel * sizeof(float)), swap_in(s, p, nb);
        apply_grad(s, p, g);
    } else if (nb) {
        psd_buf_unref(nb); /* nothing applied: no version to keep */
        nb = NULL;
    }
    memset(p->have, 0, W);
    psd_store_release_held(p);
    p->direct = NULL;
    int skipped = p->overflow;
    p->overflow = 0;
    bump_version(s, p);
    p->skipped_ver = skipped ? p->version : 0;
    if (nb) p->prev_version = from, p->prev_skipped = from_skipped;
}

void psd_store_apply_async(psd_t *s, psd_part_t *p, const float *grad)
{
    if (fused_apply(s, p, &grad, 1, (float)s->st.nworkers, NULL)) {
        bump_version(s, p);
        return;
    }
    float *g = s->st.gsum;
    double t0 = psd_now_s();
    sum_job_t j = {.numel = p->numel, .n = s->st.nworkers, .g = g, .src = grad};
    psd_pool_run(s->pool, scale_chunk, &j, nchunks_of(p->numel));
    s->mx.agg_seconds += psd_now_s() - t0;
    s->mx.agg_count++;
    apply_grad(s, p, g);
    bump_version(s, p);
}

/* w (numel floats, version v) encoded into a new buffer with one reference. */
static psd_buf_t *encode_new(psd_t *s, const float *w, size_t numel, uint64_t v, int dtype,
                             int codec, int *err)
{
    size_t cap = ps_codec_bound(dtype, codec, numel);
    size_t need = ps_codec_scratch_size(dtype, codec, numel);
    if (!cap || psd_store_scratch(&s->st, need ? need : 1)) {
        *err = cap ? PS_ENOMEM : PS_EUNSUPPORTED;
        return NULL;
    }
    psd_buf_t *b = malloc(sizeof *b + cap);
    if (!b) {
        *err = PS_ENOMEM;
        return NULL;
    }
    int rc = ps_codec_encode(b->data, cap, &b->len, w, numel, dtype, codec, s->st.scratch);
    if (rc) {
        free(b);
        *err = rc;
        return NULL;
    }
    b->version = v;
    b->crc = ps_crc32c(0, b->data, b->len);
    atomic_init(&b->refs, 1);
    return b;
}

psd_buf_t *psd_store_encoded(psd_t *s, psd_part_t *p, int dtype, int codec, int *err)
{
    if (dtype < 0 || dtype >= PSD_NDTYPE || codec < 0 || codec >= PSD_NCODEC) {
        *err = PS_EINVAL;
        return NULL;
    }
    psd_buf_t *b = p->cache[dtype][codec];
    if (b && b->version == p->version) {
        atomic_fetch_add(&b->refs, 1);
        return b;
    }
    if (dtype == PS_DT_FP32 && codec == PS_CODEC_RAW && p->wbuf) {
        /* Raw fp32 is the weights' own bytes (the codec's wire format is
         * little-endian fp32, as this host): send the weights buffer itself,
         * zero-copy; psd_store_weights_writable moves the weights to a new
         * buffer if an update comes while such a send is in flight. */
        b = p->wbuf;
        if (b->version != p->version) {
            b->crc = ps_crc32c(0, b->data, b->len);
            b->version = p->version;
        }
        atomic_fetch_add(&b->refs, 2); /* the cache's and the caller's */
        psd_buf_unref(p->cache[dtype][codec]);
        p->cache[dtype][codec] = b;
        return b;
    }
    if (!(b = encode_new(s, p->w, p->numel, p->version, dtype, codec, err))) return NULL;
    atomic_fetch_add(&b->refs, 1); /* the cache's and the caller's */
    psd_buf_unref(p->cache[dtype][codec]);
    p->cache[dtype][codec] = b;
    return b;
}

psd_buf_t *psd_store_encoded_prev(psd_t *s, psd_part_t *p, int dtype, int codec, int *err)
{
    if (dtype < 0 || dtype >= PSD_NDTYPE || codec < 0 || codec >= PSD_NCODEC) {
        *err = PS_EINVAL;
        return NULL;
    }
    if (!p->prevbuf || p->prev_version == UINT64_MAX) {
        *err = PS_ESTATE;
        return NULL;
    }
    return encode_new(s, psd_store_prev(p), p->numel, p->prev_version, dtype, codec, err);
}
