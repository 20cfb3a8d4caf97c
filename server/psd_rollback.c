/* Coordinated rollback after a server restart (sync mode).
 *
 * A psd killed while workers run restarts from its newest checkpoint at
 * version V, behind the workers and the other servers (at I > V).  Sync
 * pushes for I then get ERROR(PS_ESTATE) flagged PS_FLAG_ROLLBACK with
 * iteration = V; the worker sends MSG_ROLLBACK(V) to every server, each
 * restores its aligned checkpoint of version V (--checkpoint-every-steps,
 * the same V on every server: see maybe_aligned in psd_checkpoint_write.c), and
 * the workers pull at V and recompute from step V (their data is a
 * function of the step).  At most one checkpoint interval is recomputed;
 * the weights after it are those of one consistent version everywhere.
 *
 * The restore comes from the checkpoint file, not from a copy in memory:
 * the restarted server has only its file anyway, and the files are the
 * thing that is known to be durable on every server. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

/* Is every entry of the file's `versions` at version v, one per owned
 * partition?  Then verify the data checksum (as the loader does). */
static int aligned_file(psd_t *s, const ps_st_file_t *f, uint64_t v, char *err, size_t errlen)
{
    const char *vj = ps_st_meta(f, "versions"), *crcs = ps_st_meta(f, "data_crc32c"),
               *hash = ps_st_meta(f, "table_hash");
    if (!vj || !crcs || !hash || strtoull(hash, NULL, 16) != s->st.table.hash) {
        snprintf(err, errlen, "metadata missing or another table");
        return 0;
    }
    cJSON *vers = cJSON_Parse(vj), *e;
    int ok = cJSON_IsArray(vers) && cJSON_GetArraySize(vers) == (int)s->st.nowned;
    uint32_t crc = 0;
    for (e = ok ? vers->child : NULL; e && ok; e = e->next) {
        const cJSON *id = cJSON_GetArrayItem(e, 0), *ver = cJSON_GetArrayItem(e, 1),
                    *pend = cJSON_GetArrayItem(e, 4);
        if (!cJSON_IsNumber(id) || !cJSON_IsNumber(ver) || (uint64_t)ver->valuedouble != v ||
            id->valuedouble < 0 || id->valuedouble >= s->st.table.nparts ||
            !s->st.parts[(uint32_t)id->valuedouble].owned) {
            snprintf(err, errlen, "not an aligned checkpoint of version %llu", (unsigned long long)v);
            ok = 0;
            break;
        }
        uint32_t pid = (uint32_t)id->valuedouble;
        int np = cJSON_IsArray(pend) ? cJSON_GetArraySize(pend) : 0;
        for (int k = 0; k < 2 + np && ok; k++) {
            char nm[48];
            const cJSON *r = k >= 2 ? cJSON_GetArrayItem(pend, k - 2) : NULL;
            if (k >= 2 && !cJSON_IsNumber(r)) ok = 0;
            else if (k < 2) snprintf(nm, sizeof nm, "%c.%u", k ? 'm' : 'w', pid);
            else snprintf(nm, sizeof nm, "g.%u.%d", pid, (int)r->valuedouble);
            const ps_st_tensor_t *t = ok ? ps_st_find(f, nm) : NULL;
            if (!t || t->dtype != PS_ST_F32 ||
                (k < 2 && t->nbytes != s->st.parts[pid].numel * sizeof(float))) {
                snprintf(err, errlen, "tensor %s missing or of the wrong size", ok ? nm : "g.?");
                ok = 0;
                break;
            }
            crc = ps_crc32c(crc, ps_st_tensor_data(f, t), t->nbytes);
        }
    }
    if (ok && strtoul(crcs, NULL, 16) != crc) {
        snprintf(err, errlen, "data checksum mismatch");
        ok = 0;
    }
    cJSON_Delete(vers);
    return ok;
}

/* Restore the partitions above v from the file; 0 or PS_E* (text in err). */
static int restore(psd_t *s, uint64_t v, char *err, size_t errlen, char *used, size_t usedlen)
{
    uint64_t *seqs;
    size_t n;
    const char *dir = s->o.checkpoint_dir;
    if (psd_checkpoint_list(dir, s->o.server_id, &seqs, &n)) {
        snprintf(err, errlen, "cannot list %s", dir);
        return PS_EIO;
    }
    int rc = PS_ENOTFOUND;
    snprintf(err, errlen, "no checkpoint of version %llu among %zu file(s) in %s",
             (unsigned long long)v, n, dir);
    for (size_t i = 0; i < n && rc; i++) {
        char path[4096], why[256];
        ps_st_file_t f;
        psd_checkpoint_path(path, sizeof path, dir, s->o.server_id, seqs[i]);
        if (ps_st_open(&f, path, why, sizeof why)) continue;
        if (!aligned_file(s, &f, v, why, sizeof why)) {
            ps_debug("rollback: %s: %s", path, why);
            ps_st_close(&f);
            continue;
        }
        /* Verified and sized: the reads below cannot fail half-way. */
        for (uint32_t k = 0; k < s->st.table.nparts; k++) {
            psd_part_t *p = &s->st.parts[k];
            if (!p->owned || p->version <= v) continue;
            char nm[32], rerr[256];
            psd_store_weights_writable(s, p);
            snprintf(nm, sizeof nm, "w.%u", k);
            ps_st_read_f32(&f, nm, p->w, p->numel, rerr, sizeof rerr);
            nm[0] = 'm';
            ps_st_read_f32(&f, nm, p->m, p->numel, rerr, sizeof rerr);
            psd_store_drop_cache(p);
            psd_store_drop_pending(s, p);
            p->skipped_ver = 0;
            psd_store_forget_prev(p);
            p->version = v;
            p->rebuilt = 0;
            psd_waiters_cancel(s, p, v); /* that future is gone */
            psd_waiters_notify(s, p);
        }
        psd_members_steps_load(s, ps_st_meta(&f, "rank_steps")); /* as of v */
        snprintf(used, usedlen, "%s", path);
        ps_st_close(&f);
        rc = 0;
    }
    free(seqs);
    return rc;
}

void psd_handle_rollback(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    if (!s->st.have_table) {
        char why[900];
        psd_checkpoint_why_none(s, why, sizeof why);
        psd_send_error(s, PSD_ID_OF(m), h, PS_ESTATE, "ROLLBACK before INIT: %s", why);
        return;
    }
    if (s->mode != PSD_SYNC) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EUNSUPPORTED, "ROLLBACK is for sync mode only");
        return;
    }
    if (!h->has_iteration) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EPROTO, "ROLLBACK without iteration (the version)");
        return;
    }
    uint64_t v = h->iteration, vmin = UINT64_MAX, vmax = 0;
    for (uint32_t k = 0; k < s->st.table.nparts; k++) {
        const psd_part_t *p = &s->st.parts[k];
        if (!p->owned) continue;
        if (!p->initialised) {
            psd_send_error(s, PSD_ID_OF(m), h, PS_ESTATE, "ROLLBACK: partition %u has no weights", k);
            return;
        }
        vmin = p->version < vmin ? p->version : vmin;
        vmax = p->version > vmax ? p->version : vmax;
    }
    if (vmin != UINT64_MAX && vmin < v) {
        /* This server is behind v (it restarted from an older file): the
         * worker rolls everyone back to its version instead. */
        psd_send_rollback_error(s, PSD_ID_OF(m), h, vmin,
                                "ROLLBACK to %llu: partitions here are at %llu (cannot roll forward)",
                                (unsigned long long)v, (unsigned long long)vmin);
        return;
    }
    if (vmax > v) {
        char err[1400] = "", used[4200] = "";
        int rc = s->o.checkpoint_dir && s->o.checkpoint_dir[0]
                     ? restore(s, v, err, sizeof err, used, sizeof used)
                     : (snprintf(err, sizeof err, "psd runs without --checkpoint-dir"), PS_EUNSUPPORTED);
        if (rc && s->mx.ckpt_failures) {
            /* Say why the file is missing when this server's writes failed. */
            size_t k = strlen(err);
            snprintf(err + k, sizeof err - k, " (%llu checkpoint write(s) failed here, the last: %s)",
                     (unsigned long long)s->mx.ckpt_failures, s->mx.ckpt_error);
        }
        if (rc) {
            ps_error("ROLLBACK to version %llu impossible: %s", (unsigned long long)v, err);
            psd_send_error(s, PSD_ID_OF(m), h, rc, "ROLLBACK to version %llu: %s", (unsigned long long)v,
                           err);
            return;
        }
        s->aligned_v = s->aligned_taken = v; /* restored from a durable file of v */
        psd_skips_cut(&s->st, v);           /* those steps are redone */
        s->rollbacks++;
        ps_warn("rolled back from versions %llu..%llu to %llu (%s): %llu step(s) to redo",
                (unsigned long long)vmin, (unsigned long long)vmax, (unsigned long long)v, used,
                (unsigned long long)(vmax - v));
    }
    Ps__Header a;
    ps_wire_header_init(&a, PS__MSG_TYPE__MSG_ACK);
    a.has_request_id = 1, a.request_id = h->request_id;
    a.has_iteration = 1, a.iteration = v;
    psd_send(s, PSD_ID_OF(m), &a, NULL, 0);
}

/* Why every pending push goes, not only the partition the future push
 * named: a worker one step behind the others (its reply lost with the old
 * server) waits here for a push the workers ahead will only make after
 * their rollback, while they wait on other servers for its next push -- a
 * cycle no timeout but the workers' would end.  Answered with the rollback
 * verdict, the worker behind rolls back too, and since the data and the
 * gradient of a step are functions of the step, the pushes redone are the
 * ones dropped. */
uint32_t psd_rollback_drop_round(psd_t *s)
{
    uint32_t dropped = 0;
    for (uint32_t k = 0; s->st.have_table && k < s->st.table.nparts; k++) {
        psd_part_t *p = &s->st.parts[k];
        if (!p->owned) continue;
        int pending = 0;
        for (int r = 0; p->have && r < s->st.nworkers; r++) pending |= p->have[r];
        psd_store_drop_pending(s, p);
        psd_waiters_cancel(s, p, p->version); /* answered: roll back to it */
        dropped += pending != 0;
    }
    if (dropped)
        ps_warn("a push from a later step than this server's versions: the pending pushes of %u "
                "partition(s) dropped and their workers told to roll back (the round is redone)",
                dropped);
    return dropped;
}
