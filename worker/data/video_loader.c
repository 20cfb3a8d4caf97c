/* Loader threads with a bounded prefetch queue.
 *
 * Batch b of an epoch goes to slot b % prefetch; a thread may claim batch b
 * only while b < consumed + prefetch, so at most `prefetch` batches are
 * decoded ahead and a slot is never overwritten before it was read.  Which
 * thread decodes a batch does not matter: a sample is a pure function of
 * (seed, epoch, index) (ps_video_load_sample), so the output is the same for
 * any thread count. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_list.h"

/* How many other videos a bad sample may try before the batch fails. */
#define MAX_SUBSTITUTES 64

typedef struct slot {
    float *clips;
    int32_t *labels;
    int64_t *idx;
    int n;             /* samples in the batch */
    int ready;         /* decoded (rc says how) */
    int rc;
    char err[1024];
} slot_t;

struct ps_video_loader {
    const ps_video_list_t *l;
    ps_video_opts_t o;
    size_t sample_floats;  /* K*T*3*H*W */
    int shuffle, drop_last;
    /* current epoch */
    uint64_t epoch;
    int64_t *order;
    size_t n_order, n_batches;
    size_t next_claim, next_consume;
    unsigned generation;
    int busy;
    slot_t *slots;
    /* threads */
    pthread_t *th;
    int n_th;
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    size_t skipped;
    int failed;
    char err[1024];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Decodes batch b into s (no lock held; s is this caller's alone). */
static void produce(ps_video_loader_t *ld, size_t b, slot_t *s, size_t *skipped)
{
    size_t B = (size_t)ld->o.batch, first = b * B;
    size_t n = ld->n_order - first < B ? ld->n_order - first : B;
    size_t N = ps_video_list_size(ld->l);
    s->n = (int)n;
    s->rc = 0;
    for (size_t j = 0; j < n; j++) {
        size_t idx = (size_t)ld->order[first + j];
        float *dst = s->clips + j * ld->sample_floats;
        int rc = ps_video_load_sample(ld->l, &ld->o, ld->epoch, idx, dst, s->err, sizeof s->err);
        /* Skip mode: the next video in list order stands in, decoded with
         * its own (seed, epoch, index) stream, so the substitute is the same
         * whichever thread or rank meets the bad one. */
        for (int a = 0; rc < 0 && ld->o.skip_bad && a < MAX_SUBSTITUTES && (size_t)a + 1 < N; a++) {
            ps_warn("skipped: %s", s->err);
            (*skipped)++;
            idx = (idx + 1) % N;
            rc = ps_video_load_sample(ld->l, &ld->o, ld->epoch, idx, dst, s->err, sizeof s->err);
        }
        if (rc < 0) {
            s->rc = rc;
            return;
        }
        s->labels[j] = ps_video_list_label(ld->l, idx);
        s->idx[j] = (int64_t)idx;
    }
}

static void *thread_main(void *arg)
{
    ps_video_loader_t *ld = arg;
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
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->work, NULL);
    pthread_cond_init(&ld->done, NULL);
    ld->order = malloc(sizeof(int64_t) * (ps_video_list_size(l) / (size_t)o->world + 1));
    ld->slots = calloc((size_t)o->prefetch, sizeof *ld->slots);
    if (!ld->order || !ld->slots) goto oom;
    /* With no threads the caller decodes into its own buffers. */
    for (int i = 0; o->threads > 0 && i < o->prefetch; i++) {
        slot_t *s = &ld->slots[i];
        s->clips = malloc(sizeof(float) * ld->sample_floats * (size_t)o->batch);
        s->labels = malloc(sizeof(int32_t) * (size_t)o->batch);
        s->idx = malloc(sizeof(int64_t) * (size_t)o->batch);
        if (!s->clips || !s->labels || !s->idx) goto oom;
    }
    ld->th = calloc((size_t)(o->threads ? o->threads : 1), sizeof(pthread_t));
    if (!ld->th) goto oom;
    ps_video_loader_set_epoch(ld, 0);
    for (int i = 0; i < o->threads; i++) {
        if (pthread_create(&ld->th[i], NULL, thread_main, ld) != 0) {
            ps_errf(err, errlen, "cannot start loader thread %d", i);
            ps_video_loader_destroy(&ld);
            return PS_ENOMEM;
        }
        ld->n_th++;
    }
    *out = ld;
    return 0;
oom:
    ps_errf(err, errlen, "out of memory for %d prefetch batches of %d clips", o->prefetch, o->batch);
    ps_video_loader_destroy(&ld);
    return PS_ENOMEM;
}

int ps_video_loader_set_epoch(ps_video_loader_t *ld, uint64_t epoch)
{
    return ps_video_loader_seek(ld, epoch, 0);
}

int ps_video_loader_seek(ps_video_loader_t *ld, uint64_t epoch, size_t batch)
{
    pthread_mutex_lock(&ld->mu);
    ld->generation++;
    /* In-flight batches belong to the old epoch; wait them out so no thread
     * writes a slot the new epoch reuses. */
    while (ld->busy > 0) pthread_cond_wait(&ld->done, &ld->mu);
    ld->epoch = epoch;
    size_t N = ps_video_list_size(ld->l);
    ld->n_order = ps_video_sampler_indices(N, ld->o.seed, epoch, ld->o.rank, ld->o.world,
                                           ld->shuffle, ld->drop_last, ld->order);
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

int ps_video_loader_next(ps_video_loader_t *ld, float *clips, int32_t *labels, int64_t *indices,
                         double *wait_s)
{
    double t0 = now_s();
    if (wait_s) *wait_s = 0;
    if (ld->failed) return PS_ESTATE;
    if (ld->next_consume >= ld->n_batches) return 0;
    size_t b = ld->next_consume;
    if (ld->n_th == 0) {
        slot_t s = { clips, labels, NULL, 0, 0, 0, { 0 } };
        s.idx = malloc(sizeof(int64_t) * (size_t)ld->o.batch);
        if (!s.idx) return PS_ENOMEM;
        size_t skipped = 0;
        produce(ld, b, &s, &skipped);
        ld->skipped += skipped;
        if (indices && s.rc == 0) memcpy(indices, s.idx, sizeof(int64_t) * (size_t)s.n);
        free(s.idx);
        if (wait_s) *wait_s = now_s() - t0;
        if (s.rc < 0) {
            ld->failed = 1;
            ps_errf(ld->err, sizeof ld->err, "%s", s.err);
            return s.rc;
        }
        ld->next_consume++;
        return s.n;
    }
    slot_t *s = &ld->slots[b % (size_t)ld->o.prefetch];
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
    /* The slot stays ours until next_consume moves past it. */
    memcpy(clips, s->clips, sizeof(float) * ld->sample_floats * (size_t)n);
    memcpy(labels, s->labels, sizeof(int32_t) * (size_t)n);
    if (indices) memcpy(indices, s->idx, sizeof(int64_t) * (size_t)n);
    pthread_mutex_lock(&ld->mu);
    s->ready = 0;
    ld->next_consume++;
    pthread_cond_broadcast(&ld->work);
    pthread_mutex_unlock(&ld->mu);
    return n;
}

size_t ps_video_loader_batches(const ps_video_loader_t *ld) { return ld->n_batches; }
uint64_t ps_video_loader_epoch(const ps_video_loader_t *ld) { return ld->epoch; }
size_t ps_video_loader_position(const ps_video_loader_t *ld) { return ld->next_consume; }
size_t ps_video_loader_samples(const ps_video_loader_t *ld) { return ld->n_order; }

size_t ps_video_loader_skipped(const ps_video_loader_t *ld)
{
    pthread_mutex_lock((pthread_mutex_t *)&ld->mu);
    size_t s = ld->skipped;
    pthread_mutex_unlock((pthread_mutex_t *)&ld->mu);
    return s;
}

const char *ps_video_loader_error(const ps_video_loader_t *ld) { return ld->err; }

void ps_video_loader_destroy(ps_video_loader_t **ldp)
{
    ps_video_loader_t *ld = *ldp;
    if (!ld) return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = 1;
    pthread_cond_broadcast(&ld->work);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->n_th; i++) pthread_join(ld->th[i], NULL);
    for (int i = 0; ld->slots && i < ld->o.prefetch; i++) {
        free(ld->slots[i].clips);
        free(ld->slots[i].labels);
        free(ld->slots[i].idx);
    }
    free(ld->slots);
    free(ld->th);
    free(ld->order);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->work);
    pthread_cond_destroy(&ld->done);
    free(ld);
    *ldp = NULL;
}
