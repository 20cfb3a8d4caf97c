/* Video loader: TSM batches through the shared prefetch ring
 * (worker/data/ps_prefetch.c), which owns the threads, slots and in-order
 * hand-out.  Which thread decodes a batch does not matter: a sample is a
 * pure function of (seed, epoch, index) (ps_video_load_sample), so the
 * output is the same for any thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_prefetch.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_list.h"

/* How many other videos a bad sample may try before the batch fails. */
#define MAX_SUBSTITUTES 64

typedef struct payload {
    float *clips;
    int32_t *labels;
    int64_t *idx;
    ps_video_io_t io; /* what decoding this batch cost */
} payload_t;

struct ps_video_loader {
    const ps_video_list_t *l;
    ps_video_opts_t o;
    size_t sample_floats;  /* K*T*3*H*W */
    int shuffle, drop_last;
    /* current epoch: written only by seek, with no fill running */
    uint64_t epoch, next_epoch;
    int64_t *order;
    size_t n_order, n_batches;
    ps_prefetch_t *pf;
    ps_video_io_t io_last, io_total; /* handed-out batches (the consumer's thread) */
};

/* Decodes batch b into p (no lock held; p is this caller's alone). */
static int fill(void *payload, size_t b, void *user, size_t *skipped, char *err, size_t errlen)
{
    ps_video_loader_t *ld = user;
    payload_t *p = payload;
    size_t B = (size_t)ld->o.batch, first = b * B;
    size_t n = ld->n_order - first < B ? ld->n_order - first : B;
    size_t N = ps_video_list_size(ld->l);
    memset(&p->io, 0, sizeof p->io);
    for (size_t j = 0; j < n; j++) {
        size_t idx = (size_t)ld->order[first + j];
        float *dst = p->clips + j * ld->sample_floats;
        int rc = ps_video_load_sample_io(ld->l, &ld->o, ld->epoch, idx, dst, &p->io, err, errlen);
        /* Skip mode: the next video in list order stands in, decoded with
         * its own (seed, epoch, index) stream, so the substitute is the same
         * whichever thread or rank meets the bad one. */
        for (int a = 0; rc < 0 && ld->o.skip_bad && a < MAX_SUBSTITUTES && (size_t)a + 1 < N; a++) {
            ps_warn("skipped: %s", err);
            (*skipped)++;
            idx = (idx + 1) % N;
            rc = ps_video_load_sample_io(ld->l, &ld->o, ld->epoch, idx, dst, &p->io, err, errlen);
        }
        if (rc < 0) return rc;
        p->labels[j] = ps_video_list_label(ld->l, idx);
        p->idx[j] = (int64_t)idx;
    }
    return (int)n;
}

static void payload_free(void *payload, void *user)
{
    (void)user;
    payload_t *p = payload;
    free(p->clips);
    free(p->labels);
    free(p->idx);
    free(p);
}

static int payload_alloc(void **out, void *user)
{
    ps_video_loader_t *ld = user;
    payload_t *p = calloc(1, sizeof *p);
    *out = p;
    if (!p) return PS_ENOMEM;
    p->clips = malloc(sizeof(float) * ld->sample_floats * (size_t)ld->o.batch);
    p->labels = malloc(sizeof(int32_t) * (size_t)ld->o.batch);
    p->idx = malloc(sizeof(int64_t) * (size_t)ld->o.batch);
    return p->clips && p->labels && p->idx ? 0 : PS_ENOMEM;
}

int ps_video_loader_new(const ps_video_list_t *l, const ps_video_opts_t *o,
                        ps_video_loader_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = ps_video_opts_check(o, err, errlen);
    if (rc < 0) return rc;
    ps_video_loader_t *ld = calloc(1, sizeof *ld);
    if (!ld) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    ld->l = l;
    ld->o = *o;
    ld->shuffle = o->shuffle < 0 ? o->train : o->shuffle;
    ld->drop_last = o->drop_last < 0 ? o->train : o->drop_last;
    ld->sample_floats = (size_t)ps_video_clips_per_sample(o) * o->n_segment * 3 * o->crop_h * o->crop_w;
    ld->order = malloc(sizeof(int64_t) * (ps_video_list_size(l) / (size_t)o->world + 1));
    if (!ld->order) {
        ps_errf(err, errlen, "out of memory");
        ps_video_loader_destroy(&ld);
        return PS_ENOMEM;
    }
    /* With no threads the caller decodes into its own buffers. */
    ps_prefetch_cfg_t c = { o->prefetch, o->threads, fill, payload_alloc, payload_free, ld };
    rc = ps_prefetch_new(&c, &ld->pf, err, errlen);
    if (rc < 0) {
        ps_video_loader_destroy(&ld);
        return rc;
    }
    ps_video_loader_set_epoch(ld, 0);
    *out = ld;
    return 0;
}

int ps_video_loader_set_epoch(ps_video_loader_t *ld, uint64_t epoch)
{
    return ps_video_loader_seek(ld, epoch, 0);
}

/* Called by the ring with no fill running. */
static size_t reposition(void *arg)
{
    ps_video_loader_t *ld = arg;
    ld->epoch = ld->next_epoch;
    size_t N = ps_video_list_size(ld->l);
    ld->n_order = ps_video_sampler_indices(N, ld->o.seed, ld->epoch, ld->o.rank, ld->o.world,
                                           ld->shuffle, ld->drop_last, ld->order);
    size_t B = (size_t)ld->o.batch;
    ld->n_batches = ld->drop_last ? ld->n_order / B : (ld->n_order + B - 1) / B;
    return ld->n_batches;
}

int ps_video_loader_seek(ps_video_loader_t *ld, uint64_t epoch, size_t batch)
{
    ld->next_epoch = epoch;
    ps_prefetch_seek(ld->pf, reposition, ld, batch);
    return 0;
}

int ps_video_loader_next(ps_video_loader_t *ld, float *clips, int32_t *labels, int64_t *indices,
                         double *wait_s)
{
    payload_t own = { clips, labels, NULL, { 0, 0, 0, 0, 0 } }, *p;
    if (ps_prefetch_threads(ld->pf) == 0 && ps_prefetch_position(ld->pf) < ld->n_batches) {
        own.idx = malloc(sizeof(int64_t) * (size_t)ld->o.batch);
        if (!own.idx) return PS_ENOMEM;
    }
    int n = ps_prefetch_get(ld->pf, &own, (void **)&p, wait_s);
    if (n > 0) {
        if (p != &own) {
            memcpy(clips, p->clips, sizeof(float) * ld->sample_floats * (size_t)n);
            memcpy(labels, p->labels, sizeof(int32_t) * (size_t)n);
        }
        if (indices) memcpy(indices, p->idx, sizeof(int64_t) * (size_t)n);
        ld->io_last = p->io;
        ps_video_io_add(&ld->io_total, &p->io);
        ps_prefetch_release(ld->pf);
    }
    free(own.idx);
    return n;
}

size_t ps_video_loader_batches(const ps_video_loader_t *ld) { return ld->n_batches; }
uint64_t ps_video_loader_epoch(const ps_video_loader_t *ld) { return ld->epoch; }
size_t ps_video_loader_position(const ps_video_loader_t *ld) { return ps_prefetch_position(ld->pf); }
size_t ps_video_loader_samples(const ps_video_loader_t *ld) { return ld->n_order; }
size_t ps_video_loader_skipped(const ps_video_loader_t *ld) { return ps_prefetch_skipped(ld->pf); }
const char *ps_video_loader_error(const ps_video_loader_t *ld) { return ps_prefetch_error(ld->pf); }

void ps_video_loader_io(const ps_video_loader_t *ld, ps_video_io_t *last, ps_video_io_t *total)
{
    if (last) *last = ld->io_last;
    if (total) *total = ld->io_total;
}

void ps_video_loader_destroy(ps_video_loader_t **ldp)
{
    ps_video_loader_t *ld = *ldp;
    if (!ld) return;
    ps_prefetch_destroy(&ld->pf);
    free(ld->order);
    free(ld);
    *ldp = NULL;
}
