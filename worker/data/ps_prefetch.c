/* Bounded in-order prefetch ring (see ps_prefetch.h).  One mutex guards the
 * claim/consume counters; fills run unlocked on a slot no one else touches:
 * a slot is claimed only after its previous batch was released, and seek
 * waits for in-flight fills before the caller repositions. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/data/ps_image.h" /* ps_errf, ps_now_s */
#include "worker/data/ps_prefetch.h"

typedef struct slot {
    void *payload;
    int n;     /* fill's return: samples or a negative PS_E* */
    int ready; /* filled for the current generation */
    char err[1024];
} slot_t;

struct ps_prefetch {
    ps_prefetch_cfg_t c;
    slot_t *slots;
    pthread_t *th;
    int n_th;
    size_t n_batches, next_claim, next_consume;
    unsigned generation; /* bumped by seek: a late fill is dropped */
    int busy;            /* fills in progress */
    int stop, failed;
    size_t skipped;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    char err[1024];
};


static void *thread_main(void *arg)
{
    ps_prefetch_t *pf = arg;
    size_t ns = (size_t)pf->c.n_slots;
    pthread_mutex_lock(&pf->mu);
    for (;;) {
        while (!pf->stop && !(pf->next_claim < pf->n_batches &&
                              pf->next_claim < pf->next_consume + ns))
            pthread_cond_wait(&pf->work, &pf->mu);
        if (pf->stop) break;
        size_t b = pf->next_claim++;
        slot_t *s = &pf->slots[b % ns];
        unsigned gen = pf->generation;
        pf->busy++;
        pthread_mutex_unlock(&pf->mu);
        size_t skipped = 0;
        s->err[0] = 0;
        s->n = pf->c.fill(s->payload, b, pf->c.user, &skipped, s->err, sizeof s->err);
        pthread_mutex_lock(&pf->mu);
        pf->skipped += skipped;
        pf->busy--;
        if (gen == pf->generation) s->ready = 1;
        pthread_cond_broadcast(&pf->done);
    }
    pthread_mutex_unlock(&pf->mu);
    return NULL;
}

int ps_prefetch_new(const ps_prefetch_cfg_t *cfg, ps_prefetch_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->n_slots < 1 || cfg->n_threads < 0 || !cfg->fill ||
        (cfg->n_threads > 0 && (!cfg->alloc || !cfg->free))) {
        ps_errf(err, errlen, "prefetch: need >= 1 slot, >= 0 threads, fill (and alloc/free with threads)");
        return PS_EINVAL;
    }
    ps_prefetch_t *pf = calloc(1, sizeof *pf);
    if (!pf) { ps_errf(err, errlen, "out of memory"); return PS_ENOMEM; }
    pf->c = *cfg;
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->work, NULL);
    pthread_cond_init(&pf->done, NULL);
    pf->slots = calloc((size_t)cfg->n_slots, sizeof *pf->slots);
    pf->th = calloc((size_t)(cfg->n_threads ? cfg->n_threads : 1), sizeof(pthread_t));
    if (!pf->slots || !pf->th) goto oom;
    for (int i = 0; cfg->n_threads > 0 && i < cfg->n_slots; i++)
        if (cfg->alloc(&pf->slots[i].payload, cfg->user) < 0) goto oom;
    for (int i = 0; i < cfg->n_threads; i++) {
        if (pthread_create(&pf->th[i], NULL, thread_main, pf) != 0) {
            ps_errf(err, errlen, "cannot start loader thread %d", i);
            ps_prefetch_destroy(&pf);
            return PS_ENOMEM;
        }
        pf->n_th++;
    }
    *out = pf;
    return 0;
oom:
    ps_errf(err, errlen, "out of memory for %d prefetch slots", cfg->n_slots);
    ps_prefetch_destroy(&pf);
    return PS_ENOMEM;
}

void ps_prefetch_seek(ps_prefetch_t *pf, size_t (*reposition)(void *arg), void *arg,
                      size_t batch)
{
    pthread_mutex_lock(&pf->mu);
    pf->generation++;
    /* In-flight fills belong to the old position; wait them out so no
     * thread reads what reposition changes or writes a slot reused now. */
    while (pf->busy > 0) pthread_cond_wait(&pf->done, &pf->mu);
    pf->n_batches = reposition(arg);
    if (batch > pf->n_batches) batch = pf->n_batches;
    pf->next_claim = pf->next_consume = batch;
    for (int i = 0; i < pf->c.n_slots; i++) pf->slots[i].ready = 0;
    pf->failed = 0;
    pthread_cond_broadcast(&pf->work);
    pthread_mutex_unlock(&pf->mu);
}

int ps_prefetch_get(ps_prefetch_t *pf, void *inline_payload, void **payload, double *wait_s)
{
    double t0 = ps_now_s();
    *payload = NULL;
    if (wait_s) *wait_s = 0;
    if (pf->failed) return PS_ESTATE;
    if (pf->next_consume >= pf->n_batches) return 0;
    size_t b = pf->next_consume;
    int n;
    if (pf->n_th == 0) {
        size_t skipped = 0;
        char e[1024] = "";
        n = pf->c.fill(inline_payload, b, pf->c.user, &skipped, e, sizeof e);
        pf->skipped += skipped;
        if (wait_s) *wait_s = ps_now_s() - t0;
        if (n < 0) {
            pf->failed = 1;
            ps_errf(pf->err, sizeof pf->err, "%s", e);
            return n;
        }
        *payload = inline_payload;
        return n;
    }
    slot_t *s = &pf->slots[b % (size_t)pf->c.n_slots];
    pthread_mutex_lock(&pf->mu);
    while (!s->ready) pthread_cond_wait(&pf->done, &pf->mu);
    pthread_mutex_unlock(&pf->mu);
    if (wait_s) *wait_s = ps_now_s() - t0;
    n = s->n;
    if (n < 0) {
        pf->failed = 1;
        ps_errf(pf->err, sizeof pf->err, "%s", s->err);
        return n;
    }
    /* The slot stays the caller's until release moves past it. */
    *payload = s->payload;
    return n;
}

void ps_prefetch_release(ps_prefetch_t *pf)
{
    if (pf->n_th == 0) {
        pf->next_consume++;
        return;
    }
    pthread_mutex_lock(&pf->mu);
    pf->slots[pf->next_consume % (size_t)pf->c.n_slots].ready = 0;
    pf->next_consume++;
    pthread_cond_broadcast(&pf->work);
    pthread_mutex_unlock(&pf->mu);
}

size_t ps_prefetch_batches(const ps_prefetch_t *pf) { return pf->n_batches; }
size_t ps_prefetch_position(const ps_prefetch_t *pf) { return pf->next_consume; }
const char *ps_prefetch_error(const ps_prefetch_t *pf) { return pf->err; }
int ps_prefetch_threads(const ps_prefetch_t *pf) { return pf->n_th; }

size_t ps_prefetch_skipped(const ps_prefetch_t *pf)
{
    pthread_mutex_lock((pthread_mutex_t *)&pf->mu);
    size_t s = pf->skipped;
    pthread_mutex_unlock((pthread_mutex_t *)&pf->mu);
    return s;
}

void ps_prefetch_destroy(ps_prefetch_t **pfp)
{
    ps_prefetch_t *pf = *pfp;
    if (!pf) return;
    pthread_mutex_lock(&pf->mu);
    pf->stop = 1;
    pthread_cond_broadcast(&pf->work);
    pthread_mutex_unlock(&pf->mu);
    for (int i = 0; i < pf->n_th; i++) pthread_join(pf->th[i], NULL);
    for (int i = 0; pf->slots && pf->c.free && i < pf->c.n_slots; i++)
        if (pf->slots[i].payload) pf->c.free(pf->slots[i].payload, pf->c.user);
    free(pf->slots);
    free(pf->th);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->work);
    pthread_cond_destroy(&pf->done);
    free(pf);
    *pfp = NULL;
}
