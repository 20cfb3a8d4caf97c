/* A small fork-join pool for the server's data-parallel loops (summing
 * gradient slots, scaling, scanning for NaN).  OpenMP would do, but
 * libgomp's idle threads spin between regions, and on a machine shared with
 * the workers that spinning took a third of psd's CPU; these threads sleep
 * on a condition variable instead.  The caller's thread works too. */
#include "psd.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"

struct psd_pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *th;
    int nth;                 /* helper threads (callers add one more) */
    uint64_t gen;            /* bumped for every job */
    int busy;                /* helpers still inside the current job */
    int quit;
    psd_pool_fn *fn;
    void *arg;
    size_t nchunks;
    atomic_size_t next;      /* next chunk to take */
};

static void run_chunks(psd_pool_t *p)
{
    size_t c;
    while ((c = atomic_fetch_add(&p->next, 1)) < p->nchunks) p->fn(p->arg, c);
}

static void *helper(void *arg)
{
    psd_pool_t *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int psd_pool_new(psd_pool_t **out, int nthreads)
{
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 8 ? 8 : n < 1 ? 1 : (int)n; /* memory-bound: more does not help */
    }
    psd_pool_t *p = calloc(1, sizeof *p);
    if (!p) return PS_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = calloc(nthreads, sizeof *p->th);
    if (!p->th) {
        free(p);
        return PS_ENOMEM;
    }
    for (int i = 0; i < nthreads - 1; i++) {
        if (pthread_create(&p->th[i], NULL, helper, p) != 0) {
            ps_warn("summation pool: %d of %d threads started", i + 1, nthreads);
            break;
        }
        p->nth++;
    }
    *out = p;
    return 0;
}

int psd_pool_threads(const psd_pool_t *p) { return p ? p->nth + 1 : 1; }

void psd_pool_run(psd_pool_t *p, psd_pool_fn *fn, void *arg, size_t nchunks)
{
    if (!p || p->nth == 0 || nchunks < 2) {
        for (size_t c = 0; c < nchunks; c++) fn(arg, c);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->nchunks = nchunks;
    atomic_store(&p->next, 0);
    p->busy = p->nth;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void psd_pool_destroy(psd_pool_t **pp)
{
    psd_pool_t *p = *pp;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nth; i++) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
    *pp = NULL;
}
