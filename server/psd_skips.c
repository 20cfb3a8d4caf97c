/* The loss-scale verdicts of the sync steps: the versions v whose update
 * (v -> v+1) was skipped because a worker flagged an overflow, ascending.
 * A worker's loss scale (its value and its count of clean steps) is a
 * function of these verdicts, so a worker that resumes at step s, or rolls
 * back to it, replays its scaler over steps 0..s-1 from this list and
 * holds the scale an uninterrupted worker holds (worker/psworker/step.c).
 * The list is the shard's state like the weights: checkpointed (metadata
 * "skipped_steps"), cut back by a rollback, reported in STATS.  All
 * partitions of a step share its verdict, so one entry per step. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

void psd_skips_add(psd_store_t *st, uint64_t v)
{
    size_t i = st->nskips;
    while (i > 0 && st->skips[i - 1] > v) i--;
    if (i > 0 && st->skips[i - 1] == v) return; /* another partition of that step */
    if (st->nskips == st->skips_cap) {
        size_t cap = st->skips_cap ? 2 * st->skips_cap : 16;
        uint64_t *n = realloc(st->skips, cap * sizeof *n);
        if (!n) {
            ps_error("out of memory recording the skipped step %llu: a worker resuming later "
                     "replays its loss scale without it", (unsigned long long)v);
            return;
        }
        st->skips = n;
        st->skips_cap = cap;
    }
    memmove(st->skips + i + 1, st->skips + i, (st->nskips - i) * sizeof *st->skips);
    st->skips[i] = v;
    st->nskips++;
}

void psd_skips_cut(psd_store_t *st, uint64_t v)
{
    while (st->nskips > 0 && st->skips[st->nskips - 1] >= v) st->nskips--;
}

char *psd_skips_json(const psd_store_t *st)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < st->nskips; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)st->skips[i]));
    char *txt = a ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    return txt;
}

int psd_skips_parse(psd_store_t *st, const char *json, char *err, size_t errlen)
{
    cJSON *a = cJSON_Parse(json), *e;
    if (!cJSON_IsArray(a)) {
        cJSON_Delete(a);
        snprintf(err, errlen, "metadata skipped_steps is not a JSON array");
        return PS_EINVAL;
    }
    st->nskips = 0;
    cJSON_ArrayForEach(e, a)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0) {
            cJSON_Delete(a);
            snprintf(err, errlen, "metadata skipped_steps holds a non-version");
            return PS_EINVAL;
        }
        psd_skips_add(st, (uint64_t)e->valuedouble);
    }
    cJSON_Delete(a);
    return 0;
}
