/* The parts of a run's state that follow from the step alone.  They are
 * set from the step before each step's compute, so a process restarted at
 * step s, or rolled back to it, holds exactly what an uninterrupted run
 * holds there (the weights, momentum and BN running statistics are the
 * servers'; the loss scale is replayed from the servers' verdicts, step.c):
 *  - the model's step counters: a BN's num_batches_tracked counts the
 *    training forwards it ran with batch statistics, one per step for the
 *    BNs whose affine is trainable and none for the others (ps_model.h, BN
 *    modes), so at step s it is base + s * per_step, base being its value
 *    at step 0 (0, or what --weights brought);
 *  - the model's forward counter, which seeds the dropout masks.
 * The counters also go into the INIT spec ("counters": [[name, base,
 * per_step], ...]), so psctl export writes them for the version it
 * exports. */
#include "worker/psworker/psworker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/ps_model.h"

struct ps_worker_counter {
    const char *name;       /* the model's buffer name (outlives p) */
    int64_t *value;         /* in the model */
    int64_t base;           /* at step 0 */
    int per_step;
};

static ps_model_t *model_of(const ps_worker_t *p)
{
    return p->task->model ? p->task->model((ps_worker_t *)p) : NULL;
}

int ps_worker_state_init(ps_worker_t *p)
{
    ps_model_t *m = model_of(p);
    if (!m) return 0;
    int nb = 0, n = 0;
    const ps_model_buffer_t *bu = ps_model_buffers(m, &nb);
    const ps_model_param_t *par = ps_model_params(m, NULL);
    p->counters = calloc(nb > 0 ? (size_t)nb : 1, sizeof *p->counters);
    if (!p->counters) {
        ps_error("out of memory for the model's step counters");
        return PS_ENOMEM;
    }
    for (int i = 0; i < nb; i++) {
        if (!bu[i].i64) continue;
        /* "<bn>.num_batches_tracked" counts when "<bn>.weight" trains */
        char wname[256];
        const char *dot = strrchr(bu[i].name, '.');
        snprintf(wname, sizeof wname, "%.*s.weight", dot ? (int)(dot - bu[i].name) : 0,
                 bu[i].name);
        int pi = ps_model_find_param(m, wname);
        p->counters[n++] = (struct ps_worker_counter){
            .name = bu[i].name, .value = bu[i].i64, .base = *bu[i].i64,
            .per_step = pi >= 0 && par[pi].trainable};
    }
    p->ncounters = n;
    return 0;
}

void ps_worker_state_free(ps_worker_t *p)
{
    free(p->counters);
    p->counters = NULL;
    p->ncounters = 0;
}

void ps_worker_state_at(ps_worker_t *p, uint64_t step)
{
    ps_model_t *m = model_of(p);
    if (m) ps_model_set_step(m, step);
    for (int i = 0; i < p->ncounters; i++) {
        struct ps_worker_counter *k = &p->counters[i];
        *k->value = k->base + (int64_t)step * k->per_step;
    }
}

size_t ps_worker_state_spec(const ps_worker_t *p, char *buf, size_t cap)
{
    size_t n = 0;
    if (!p->ncounters) return 0;
    n += (size_t)snprintf(buf, cap, ",\"counters\":[");
    for (int i = 0; i < p->ncounters; i++) {
        const struct ps_worker_counter *k = &p->counters[i];
        n += (size_t)snprintf(buf ? buf + n : NULL, n < cap ? cap - n : 0, "%s[\"%s\",%lld,%d]",
                              i ? "," : "", k->name, (long long)k->base, k->per_step);
    }
    n += (size_t)snprintf(buf ? buf + n : NULL, n < cap ? cap - n : 0, "]");
    return n;
}
