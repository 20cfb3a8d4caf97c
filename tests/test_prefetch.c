/* ps_prefetch: batches come out in order and exactly once whatever the
 * thread count and fill timing, at most n_slots are filled ahead, a failed
 * fill stops the consumer with its message until a seek, reposition runs
 * with no fill in flight, and destroy returns while threads are blocked on
 * a full ring or inside a slow fill. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "tests/lib/tap.h"
#include "worker/data/ps_prefetch.h"

#define MAXB 256

typedef struct payload {
    size_t batch;
    int check; /* a value derived from the batch, to catch mixed-up slots */
} payload_t;

typedef struct world {
    pthread_mutex_t mu;
    int fills[MAXB];      /* fill calls per batch */
    size_t consumed;      /* batches the test took (bumped before release) */
    int ahead_violations; /* fills of b >= consumed + n_slots */
    int in_flight, reposition_in_flight;
    int n_slots;
    size_t n_batches;
    long bad_batch;       /* fill fails here (-1: never) */
    int slow_us;
} world_t;

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

static int count_of(size_t b) { return (int)(b % 5) + 1; }

static int fill(void *payload, size_t b, void *user, size_t *skipped, char *err, size_t errlen)
{
    world_t *w = user;
    payload_t *p = payload;
    pthread_mutex_lock(&w->mu);
    if (b < MAXB) w->fills[b]++;
    if (b >= w->consumed + (size_t)w->n_slots) w->ahead_violations++;
    w->in_flight++;
    pthread_mutex_unlock(&w->mu);
    /* every third batch is slow so later ones finish first */
    if (w->slow_us && b % 3 == 0) sleep_us(w->slow_us);
    p->batch = b;
    p->check = (int)(b * 7 + 1);
    if (b % 4 == 0) (*skipped)++;
    pthread_mutex_lock(&w->mu);
    w->in_flight--;
    pthread_mutex_unlock(&w->mu);
    if ((long)b == w->bad_batch) {
        snprintf(err, errlen, "bad batch %zu", b);
        return PS_EIO;
    }
    return count_of(b);
}

static int p_alloc(void **out, void *user)
{
    (void)user;
    *out = calloc(1, sizeof(payload_t));
    return *out ? 0 : PS_ENOMEM;
}

static void p_free(void *p, void *user) { (void)user, free(p); }

static size_t reposition(void *arg)
{
    world_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->reposition_in_flight += w->in_flight;
    pthread_mutex_unlock(&w->mu);
    return w->n_batches;
}

static void world_init(world_t *w, int n_slots, size_t n_batches)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->n_slots = n_slots;
    w->n_batches = n_batches;
    w->bad_batch = -1;
}

static ps_prefetch_t *make(world_t *w, int threads)
{
    ps_prefetch_cfg_t c = { w->n_slots, threads, fill, p_alloc, p_free, w };
    ps_prefetch_t *pf = NULL;
    char err[256];
    if (ps_prefetch_new(&c, &pf, err, sizeof err) < 0) {
        diag("ps_prefetch_new: %s", err);
        return NULL;
    }
    return pf;
}

/* Consumes from the current position to the end; returns batches seen in
 * order with the right payload and count, or -1 at the first mismatch. */
static long drain(ps_prefetch_t *pf, world_t *w, size_t from)
{
    payload_t own;
    long seen = 0;
    for (size_t want = from;; want++) {
        void *pv;
        int n = ps_prefetch_get(pf, &own, &pv, NULL);
        if (n == 0) return want == w->n_batches ? seen : -1;
        payload_t *p = pv;
        if (n < 0 || p->batch != want || p->check != (int)(want * 7 + 1) || n != count_of(want)) {
            diag("batch %zu: n %d, payload batch %zu", want, n, n > 0 ? p->batch : 0);
            return -1;
        }
        pthread_mutex_lock(&w->mu);
        w->consumed = want + 1;
        pthread_mutex_unlock(&w->mu);
        ps_prefetch_release(pf);
        seen++;
    }
}

static void test_order(int threads, int slots)
{
    world_t w;
    world_init(&w, slots, 60);
    w.slow_us = 2000;
    ps_prefetch_t *pf = make(&w, threads);
    ok(pf != NULL, "new: %d threads, %d slots", threads, slots);
    if (!pf) return;
    ps_prefetch_seek(pf, reposition, &w, 0);
    is_int(drain(pf, &w, 0), 60, "%d threads: 60 batches in order with their payloads", threads);
    int once = 1;
    for (int b = 0; b < 60; b++) once &= w.fills[b] == 1;
    ok(once, "%d threads: every batch filled exactly once", threads);
    is_int(w.ahead_violations, 0, "%d threads: never more than %d batches ahead", threads, slots);
    is_int(ps_prefetch_skipped(pf), 15, "%d threads: skipped counts summed", threads);
    is_int(ps_prefetch_position(pf), 60, "position at the end");
    /* seek back while slow fills are in flight; reposition sees none */
    memset(w.fills, 0, sizeof w.fills);
    w.consumed = 10;
    ps_prefetch_seek(pf, reposition, &w, 10);
    sleep_us(1000);
    w.consumed = 30;
    ps_prefetch_seek(pf, reposition, &w, 30);
    is_int(w.reposition_in_flight, 0, "%d threads: reposition ran with no fill in flight", threads);
    is_int(drain(pf, &w, 30), 30, "%d threads: after seek, batches 30.. in order", threads);
    ps_prefetch_seek(pf, reposition, &w, 1000);
    is_int(ps_prefetch_position(pf), 60, "seek past the end clamps");
    ps_prefetch_destroy(&pf);
    ok(pf == NULL, "destroy NULLs the handle");
    pthread_mutex_destroy(&w.mu);
}

static void test_error(int threads)
{
    world_t w;
    world_init(&w, 3, 20);
    w.bad_batch = 7;
    ps_prefetch_t *pf = make(&w, threads);
    if (!ok(pf != NULL, "new")) return;
    ps_prefetch_seek(pf, reposition, &w, 0);
    payload_t own;
    void *pv;
    int n = 0;
    size_t b = 0;
    for (; b < 20; b++) {
        n = ps_prefetch_get(pf, &own, &pv, NULL);
        if (n <= 0) break;
        w.consumed = b + 1;
        ps_prefetch_release(pf);
    }
    is_int(b, 7, "%d threads: batches before the bad one delivered", threads);
    is_int(n, PS_EIO, "%d threads: the fill's error code comes back", threads);
    ok(strstr(ps_prefetch_error(pf), "bad batch 7") != NULL, "%d threads: message kept: '%s'",
       threads, ps_prefetch_error(pf));
    is_int(ps_prefetch_get(pf, &own, &pv, NULL), PS_ESTATE, "then PS_ESTATE");
    is_int(ps_prefetch_position(pf), 7, "position stays at the failed batch");
    w.consumed = 8;
    ps_prefetch_seek(pf, reposition, &w, 8);
    is_int(drain(pf, &w, 8), 12, "%d threads: seek past it clears the error", threads);
    ps_prefetch_destroy(&pf);
    pthread_mutex_destroy(&w.mu);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_destroy_blocked(void)
{
    world_t w;
    world_init(&w, 2, 100);
    ps_prefetch_t *pf = make(&w, 4);
    if (!ok(pf != NULL, "new")) return;
    ps_prefetch_seek(pf, reposition, &w, 0);
    sleep_us(50000); /* threads fill 2 slots then block on the full ring */
    int filled = 0;
    for (int b = 0; b < MAXB; b++) filled += w.fills[b];
    is_int(filled, 2, "full ring: only n_slots batches filled with no consumer");
    double t0 = now_s();
    ps_prefetch_destroy(&pf);
    ok(pf == NULL && now_s() - t0 < 5, "destroy returns with threads blocked on a full ring");
    pthread_mutex_destroy(&w.mu);

    /* and with threads inside a slow fill */
    world_init(&w, 4, 100);
    w.slow_us = 100000;
    pf = make(&w, 3);
    if (!ok(pf != NULL, "new")) return;
    ps_prefetch_seek(pf, reposition, &w, 0);
    sleep_us(10000);
    t0 = now_s();
    ps_prefetch_destroy(&pf);
    ok(pf == NULL && now_s() - t0 < 5, "destroy waits out a slow fill and returns");
    pthread_mutex_destroy(&w.mu);

    /* never seeked: threads idle on zero batches */
    world_init(&w, 2, 10);
    pf = make(&w, 2);
    ps_prefetch_destroy(&pf);
    ok(pf == NULL, "destroy before any seek");
    pthread_mutex_destroy(&w.mu);
}

int main(void)
{
    world_t w;
    world_init(&w, 0, 1);
    ps_prefetch_cfg_t bad = { 0, 2, fill, p_alloc, p_free, &w };
    ps_prefetch_t *pf = (ps_prefetch_t *)&w;
    char err[256] = "";
    is_int(ps_prefetch_new(&bad, &pf, err, sizeof err), PS_EINVAL, "0 slots rejected");
    ok(pf == NULL && err[0], "with a message: %s", err);
    bad.n_slots = 2, bad.alloc = NULL;
    is_int(ps_prefetch_new(&bad, &pf, err, sizeof err), PS_EINVAL, "threads without alloc rejected");
    pthread_mutex_destroy(&w.mu);

    test_order(0, 1);
    test_order(1, 2);
    test_order(4, 3);
    test_order(3, 8);
    test_error(0);
    test_error(1);
    test_error(4);
    test_destroy_blocked();
    return tap_done();
}
