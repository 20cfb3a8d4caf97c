/* Bounded in-order prefetch ring shared by the video and detection loaders.
 *
 * Batch b of the current pass goes to slot b % n_slots; a thread may claim
 * batch b only while b < consumed + n_slots, so at most n_slots batches are
 * filled ahead and a slot is never overwritten before it was read.  Batches
 * are handed out strictly in order (get/release), whichever thread filled
 * them.  With n_threads == 0 the caller's get fills its own payload inline.
 *
 * Error contract: a failed fill stops the consumer at that batch; get
 * returns the fill's code once, then PS_ESTATE until the next seek. */
#ifndef PS_PREFETCH_H
#define PS_PREFETCH_H

#include <stddef.h>

typedef struct ps_prefetch ps_prefetch_t;

/* Fills batch `batch` into `payload` (no lock held; the payload is this
 * call's alone).  Returns the batch's sample count (> 0) or a negative
 * PS_E* with the cause in err.  Adds replaced bad samples to *skipped. */
typedef int (*ps_prefetch_fill_fn)(void *payload, size_t batch, void *user, size_t *skipped,
                                   char *err, size_t errlen);

typedef struct ps_prefetch_cfg {
    int n_slots;                     /* ring size (>= 1) */
    int n_threads;                   /* fill threads; 0 = fill inline in get */
    ps_prefetch_fill_fn fill;
    /* per-slot payloads, only made when n_threads > 0; alloc returns 0 or
     * a negative PS_E*, free must accept what a failed alloc left */
    int (*alloc)(void **payload, void *user);
    void (*free)(void *payload, void *user);
    void *user;
} ps_prefetch_cfg_t;

/* Starts the threads idle (no batches until the first seek). */
int ps_prefetch_new(const ps_prefetch_cfg_t *cfg, ps_prefetch_t **out, char *err, size_t errlen);

/* Waits out in-flight fills, then calls reposition(arg) with no fill
 * running (so it may change whatever fill reads); it returns the new number
 * of batches.  Consumption restarts at `batch` (clamped) and the error
 * state clears. */
void ps_prefetch_seek(ps_prefetch_t *pf, size_t (*reposition)(void *arg), void *arg,
                      size_t batch);

/* Next batch in order: > 0 samples with *payload set (owned by the caller
 * until release), 0 at the end, or a negative PS_E*.  inline_payload is
 * filled when there are no threads. */
int ps_prefetch_get(ps_prefetch_t *pf, void *inline_payload, void **payload, double *wait_s);
void ps_prefetch_release(ps_prefetch_t *pf);

size_t ps_prefetch_batches(const ps_prefetch_t *pf);
size_t ps_prefetch_position(const ps_prefetch_t *pf); /* next batch get returns */
size_t ps_prefetch_skipped(const ps_prefetch_t *pf);
const char *ps_prefetch_error(const ps_prefetch_t *pf); /* cause of the last failed fill */
int ps_prefetch_threads(const ps_prefetch_t *pf);

/* Stops and joins the threads (a fill in progress finishes first), frees
 * the payloads, NULLs *pf. */
void ps_prefetch_destroy(ps_prefetch_t **pf);

#endif
