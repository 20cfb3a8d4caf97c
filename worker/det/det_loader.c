/* Detection loader threads with a bounded prefetch queue: the scheme of
 * worker/data/video_loader.c (batch b goes to slot b % prefetch and is
 * claimed only while b < consumed + prefetch), with the anchor assignment
 * done here on the CPU, next to the JPEG decode, so the training step only
 * runs the network.  A sample is a pure function of (seed, epoch, index),
 * so any thread count gives the same batches. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/det/det_data.h"

/* How many other images a bad sample may try before the batch fails. */
#define MAX_SUBSTITUTES 64

typedef struct slot {
    ps_det_batch_t b;
    int n, ready, rc;
    char err[1024];
} slot_t;

struct ps_det_loader {
    const ps_det_dataset_t *ds;
    ps_det_data_opts_t o;
    const float *anchors;
    int A, shuffle, drop_last;
    uint64_t epoch;
    int64_t *order;
    size_t n_order, n_batches, next_claim, next_consume;
    unsigned generation;
    int busy;
    slot_t *slots;
    pthread_t *th;
    int n_th, stop, failed;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    size_t skipped;
    char err[1024];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void produce(ps_det_loader_t *ld, size_t bi, slot_t *s, size_t *skipped)
{
    size_t B = (size_t)ld->o.batch, first = bi * B;
    size_t n = ld->n_order - first < B ? ld->n_order - first : B;
    size_t N = ps_det_dataset_size(ld->ds), S2 = (size_t)ld->o.size * ld->o.size * 3;
    s->n = (int)n;
    s->rc = 0;
    s->b.npos = 0;
    for (size_t j = 0; j < n; j++) {
        size_t idx = (size_t)ld->order[first + j];
        int np = 0;
        int32_t *lab = s->b.labels ? s->b.labels + j * (size_t)ld->A : NULL;
        float *bt = s->b.box_targets ? s->b.box_targets + j * (size_t)ld->A * 4 : NULL;
        int rc = ps_det_load_sample(ld->ds, &ld->o, ld->anchors, ld->A, ld->epoch, idx,
                                    s->b.img + j * S2, lab, bt, &s->b.geom[j], &np, s->err,
                                    sizeof s->err);
        /* skip mode: the next image in dataset order stands in, with its own
         * (seed, epoch, index) stream, whoever meets the bad one */
        for (int a = 0; rc < 0 && ld->o.skip_bad && a < MAX_SUBSTITUTES && (size_t)a + 1 < N; a++) {
            ps_warn("skipped: %s", s->err);
            (*skipped)++;
            idx = (idx + 1) % N;
            rc = ps_det_load_sample(ld->ds, &ld->o, ld->anchors, ld->A, ld->epoch, idx,
                                    s->b.img + j * S2, lab, bt, &s->b.geom[j], &np, s->err,
                                    sizeof s->err);
        }
        if (rc < 0) {
            s->rc = rc;
            return;
        }
        s->b.idx[j] = (int64_t)idx;
        s->b.npos += np;
    }
}

static void *thread_main(void *arg)
{
    ps_det_loader_t *ld = arg;
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->stop && !(ld->next_claim < ld->n_batches &&
                              ld->next_claim < ld->next_consume + (size_t)ld->o.prefetch))
            pthread_cond_wait(&ld->work, &ld->mu);
        if (ld->stop) break;
        size_t b = ld->next_claim++;
        slot_t *s = &ld->slots[b % (size_t)ld->o.prefetch];
        unsigned gen = ld->generation;
        ld->busy++;
        pthread_mutex_unlock(&ld->mu);
        size_t skipped = 0;
        produce(ld, b, s, &skipped);
        pthread_mutex_lock(&ld->mu);
        ld->skipped += skipped;
        ld->busy--;
        if (gen == ld->generation) s->ready = 1;
        pthread_cond_broadcast(&ld->done);
    }
    pthread_mutex_unlock(&ld->mu);
    return NULL;
}

int ps_det_batch_alloc(const ps_det_loader_t *ld, ps_det_batch_t *b)
{
    size_t B = (size_t)ld->o.batch, A = (size_t)ld->A;
    memset(b, 0, sizeof *b);
    b->img = malloc(sizeof(float) * B * 3 * (size_t)ld->o.size * ld->o.size);
    b->idx = malloc(sizeof(int64_t) * B);
    b->geom = malloc(sizeof(ps_det_geom_t) * B);
    if (ld->o.train) {
        b->labels = malloc(sizeof(int32_t) * B * A);
        b->box_targets = malloc(sizeof(float) * B * A * 4);
    }
    if (!b->img || !b->idx || !b->geom || (ld->o.train && (!b->labels || !b->box_targets))) {
        ps_det_batch_free(b);
        return PS_ENOMEM;
    }
    return 0;
}

void ps_det_batch_free(ps_det_batch_t *b)
{
    free(b->img), free(b->labels), free(b->box_targets), free(b->idx), free(b->geom);
    memset(b, 0, sizeof *b);
}

int ps_det_loader_new(const ps_det_dataset_t *ds, const ps_det_data_opts_t *o,
                      const float *anchors, int A, ps_det_loader_t **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    int rc = ps_det_data_opts_check(o, err, errlen);
    if (rc < 0) return rc;
    ps_det_loader_t *ld = calloc(1, sizeof *ld);
    if (!ld) return ps_errf(err, errlen, "out of memory"), PS_ENOMEM;
    ld->ds = ds;
    ld->o = *o;
    ld->anchors = anchors;
    ld->A = A;
    ld->shuffle = o->shuffle < 0 ? o->train : o->shuffle;
    ld->drop_last = o->drop_last < 0 ? o->train : o->drop_last;
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->work, NULL);
    pthread_cond_init(&ld->done, NULL);
    ld->order = malloc(sizeof(int64_t) * (ps_det_dataset_size(ds) / (size_t)o->world + 2));
    ld->slots = calloc((size_t)o->prefetch, sizeof *ld->slots);
    ld->th = calloc((size_t)(o->threads ? o->threads : 1), sizeof(pthread_t));
    if (!ld->order || !ld->slots || !ld->th) goto oom;
    for (int i = 0; o->threads > 0 && i < o->prefetch; i++)
        if (ps_det_batch_alloc(ld, &ld->slots[i].b)) goto oom;
    ps_det_loader_seek(ld, 0, 0);
    for (int i = 0; i < o->threads; i++) {
        if (pthread_create(&ld->th[i], NULL, thread_main, ld) != 0) {
            ps_errf(err, errlen, "cannot start loader thread %d", i);
            ps_det_loader_destroy(&ld);
            return PS_ENOMEM;
        }
        ld->n_th++;
    }
    *out = ld;
    return 0;
oom:
    ps_errf(err, errlen, "out of memory for %d prefetch batches of %d images", o->prefetch, o->batch);
    ps_det_loader_destroy(&ld);
    return PS_ENOMEM;
}

int ps_det_loader_seek(ps_det_loader_t *ld, uint64_t epoch, size_t batch)
{
    pthread_mutex_lock(&ld->mu);
    ld->generation++;
    /* in-flight batches belong to the old position: wait them out */
    while (ld->busy > 0) pthread_cond_wait(&ld->done, &ld->mu);
    ld->epoch = epoch;
    ld->n_order = ps_video_sampler_indices(ps_det_dataset_size(ld->ds), ld->o.seed, epoch,
                                           ld->o.rank, ld->o.world, ld->shuffle, ld->drop_last,
                                           ld->order);
    size_t B = (size_t)ld->o.batch;
    ld->n_batches = ld->drop_last ? ld->n_order / B : (ld->n_order + B - 1) / B;
    if (batch > ld->n_batches) batch = ld->n_batches;
    ld->next_claim = ld->next_consume = batch;
    for (int i = 0; i < ld->o.prefetch; i++) ld->slots[i].ready = 0;
    ld->failed = 0;
    pthread_cond_broadcast(&ld->work);
    pthread_mutex_unlock(&ld->mu);
    return 0;
}

static void copy_batch(const ps_det_loader_t *ld, ps_det_batch_t *dst, const ps_det_batch_t *src,
                       int n)
{
    size_t S2 = (size_t)ld->o.size * ld->o.size * 3, A = (size_t)ld->A;
    memcpy(dst->img, src->img, sizeof(float) * S2 * (size_t)n);
    if (dst->labels && src->labels) memcpy(dst->labels, src->labels, sizeof(int32_t) * A * (size_t)n);
    if (dst->box_targets && src->box_targets)
        memcpy(dst->box_targets, src->box_targets, sizeof(float) * 4 * A * (size_t)n);
    memcpy(dst->idx, src->idx, sizeof(int64_t) * (size_t)n);
    memcpy(dst->geom, src->geom, sizeof(ps_det_geom_t) * (size_t)n);
    dst->npos = src->npos;
}

int ps_det_loader_next(ps_det_loader_t *ld, ps_det_batch_t *b, double *wait_s)
{
    double t0 = now_s();
    if (wait_s) *wait_s = 0;
    if (ld->failed) return PS_ESTATE;
    if (ld->next_consume >= ld->n_batches) return 0;
    size_t bi = ld->next_consume;
    if (ld->n_th == 0) {
        slot_t s;
        memset(&s, 0, sizeof s);
        s.b = *b;
        size_t skipped = 0;
        produce(ld, bi, &s, &skipped);
        ld->skipped += skipped;
        b->npos = s.b.npos;
        if (wait_s) *wait_s = now_s() - t0;
        if (s.rc < 0) {
            ld->failed = 1;
            ps_errf(ld->err, sizeof ld->err, "%s", s.err);
            return s.rc;
        }
        ld->next_consume++;
        return s.n;
    }
    slot_t *s = &ld->slots[bi % (size_t)ld->o.prefetch];
    pthread_mutex_lock(&ld->mu);
    while (!s->ready) pthread_cond_wait(&ld->done, &ld->mu);
    pthread_mutex_unlock(&ld->mu);
    if (wait_s) *wait_s = now_s() - t0;
    int n = s->n, rc = s->rc;
    if (rc < 0) {
        ld->failed = 1;
        ps_errf(ld->err, sizeof ld->err, "%s", s->err);
        return rc;
    }
    copy_batch(ld, b, &s->b, n);
    pthread_mutex_lock(&ld->mu);
    s->ready = 0;
    ld->next_consume++;
    pthread_cond_broadcast(&ld->work);
    pthread_mutex_unlock(&ld->mu);
    return n;
}

size_t ps_det_loader_batches(const ps_det_loader_t *ld) { return ld->n_batches; }
uint64_t ps_det_loader_epoch(const ps_det_loader_t *ld) { return ld->epoch; }
size_t ps_det_loader_position(const ps_det_loader_t *ld) { return ld->next_consume; }
size_t ps_det_loader_samples(const ps_det_loader_t *ld) { return ld->n_order; }

size_t ps_det_loader_skipped(const ps_det_loader_t *ld)
{
    pthread_mutex_lock((pthread_mutex_t *)&ld->mu);
    size_t s = ld->skipped;
    pthread_mutex_unlock((pthread_mutex_t *)&ld->mu);
    return s;
}

const char *ps_det_loader_error(const ps_det_loader_t *ld) { return ld->err; }

void ps_det_loader_destroy(ps_det_loader_t **ldp)
{
    ps_det_loader_t *ld = *ldp;
    if (!ld) return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = 1;
    pthread_cond_broadcast(&ld->work);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->n_th; i++) pthread_join(ld->th[i], NULL);
    for (int i = 0; ld->slots && i < ld->o.prefetch; i++) ps_det_batch_free(&ld->slots[i].b);
    free(ld->slots), free(ld->th), free(ld->order);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->work);
    pthread_cond_destroy(&ld->done);
    free(ld);
    *ldp = NULL;
}
