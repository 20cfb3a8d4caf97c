/* Shard checkpoints: one safetensors file per checkpoint,
 * DIR/psd-<server>-<seq>.safetensors, holding "w.<part>" (weights) and
 * "m.<part>" (momentum) for every partition this server owns, with metadata:
 *   format       "psd-checkpoint-1"
 *   server_id    this shard
 *   table_hash   hex; spec: the INIT spec JSON (rebuilds the table, optim)
 *   optim        the optimizer config JSON (informational)
 *   versions     JSON [[part, version, initialised, overflow, [pending ranks],
 *                [last iteration + 1 per rank]], ...] in part order
 *   updates      shard updates so far
 *   data_crc32c  hex CRC32C over w.p, m.p, then g.p.r of each pending rank,
 *                in `versions` order
 * "g.<part>.<rank>" are the sync gradients already received (and ACKed) for
 * the current iteration, so a restart does not lose a push that a worker
 * will not send again; the per-rank last iterations keep async retries
 * idempotent across a restart.
 * The writer makes it durable (temp, fsync, rename, fsync dir); the last two
 * are kept, and at start the newest one that verifies is loaded. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#define CKPT_FORMAT "psd-checkpoint-1"
#define CKPT_KEEP 2

/* Sequence numbers of this server's checkpoint files, newest first. */
static int list_ckpts(const char *dir, int sid, uint64_t **seqs, size_t *n)
{
    DIR *d = opendir(dir);
    *seqs = NULL;
    *n = 0;
    if (!d) return errno == ENOENT ? 0 : PS_EIO;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "psd-%d-", sid);
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, prefix, plen)) continue;
        char *end;
        unsigned long long q = strtoull(nm + plen, &end, 10);
        if (end == nm + plen || strcmp(end, ".safetensors")) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *t = realloc(*seqs, cap * sizeof *t);
            if (!t) break;
            *seqs = t;
        }
        (*seqs)[(*n)++] = q;
    }
    closedir(d);
    /* newest first */
    for (size_t i = 1; i < *n; i++)
        for (size_t j = i; j > 0 && (*seqs)[j] > (*seqs)[j - 1]; j--) {
            uint64_t t = (*seqs)[j];
            (*seqs)[j] = (*seqs)[j - 1];
            (*seqs)[j - 1] = t;
        }
    return 0;
}

static void ckpt_path(char *buf, size_t cap, const char *dir, int sid, uint64_t seq)
{
    snprintf(buf, cap, "%s/psd-%d-%012llu.safetensors", dir, sid, (unsigned long long)seq);
}

static void prune(psd_t *s)
{
    uint64_t *seqs;
    size_t n;
    if (list_ckpts(s->o.checkpoint_dir, s->o.server_id, &seqs, &n)) return;
    for (size_t i = CKPT_KEEP; i < n; i++) {
        char p[4096];
        ckpt_path(p, sizeof p, s->o.checkpoint_dir, s->o.server_id, seqs[i]);
        if (unlink(p) < 0) ps_warn("cannot remove old checkpoint %s: %s", p, strerror(errno));
    }
    free(seqs);
}

int psd_checkpoint_write(psd_t *s)
{
    psd_store_t *st = &s->st;
    const char *dir = s->o.checkpoint_dir;
    char path[4096], err[512] = "", num[64];
    int rc = PS_ENOMEM;
    double t0 = psd_now_s();

    if (!st->have_table) return PS_ESTATE;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        ps_error("checkpoint dir %s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    ps_st_writer_t *w = ps_st_writer_new();
    int W = st->nworkers;
    size_t nnames = 0;
    for (uint32_t i = 0; i < st->table.nparts; i++)
        if (st->parts[i].owned) {
            nnames += 2;
            for (int r = 0; r < W; r++) nnames += st->parts[i].slots && st->parts[i].have[r];
        }
    char (*names)[24] = calloc(nnames ? nnames : 1, sizeof *names);
    size_t ni = 0;
    cJSON *vers = cJSON_CreateArray();
    char *vjson = NULL;
    if (!w || !names || !vers) goto out;
    uint32_t crc = 0;
    size_t bytes = 0;
    for (uint32_t i = 0; i < st->table.nparts; i++) {
        psd_part_t *p = &st->parts[i];
        if (!p->owned) continue;
        int64_t shape[1] = {(int64_t)p->numel};
        snprintf(names[ni], 24, "w.%u", i);
        snprintf(names[ni + 1], 24, "m.%u", i);
        if ((rc = ps_st_writer_add(w, names[ni], PS_ST_F32, 1, shape, p->w)) ||
            (rc = ps_st_writer_add(w, names[ni + 1], PS_ST_F32, 1, shape, p->m)))
            goto out;
        ni += 2;
        crc = ps_crc32c(crc, p->w, p->numel * sizeof(float));
        crc = ps_crc32c(crc, p->m, p->numel * sizeof(float));
        bytes += 2 * p->numel * sizeof(float);
        cJSON *e = cJSON_CreateArray(), *pend = cJSON_CreateArray(), *last = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(i));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)p->version));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(p->initialised));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(p->overflow));
        for (int r = 0; r < W; r++) {
            cJSON_AddItemToArray(last, cJSON_CreateNumber((double)p->last_iter[r]));
            if (!p->slots || !p->have[r]) continue;
            const float *g = p->slots + (size_t)r * p->numel;
            snprintf(names[ni], 24, "g.%u.%d", i, r);
            if ((rc = ps_st_writer_add(w, names[ni], PS_ST_F32, 1, shape, g))) goto out;
            ni++;
            crc = ps_crc32c(crc, g, p->numel * sizeof(float));
            bytes += p->numel * sizeof(float);
            cJSON_AddItemToArray(pend, cJSON_CreateNumber(r));
        }
        cJSON_AddItemToArray(e, pend);
        cJSON_AddItemToArray(e, last);
        cJSON_AddItemToArray(vers, e);
    }
    rc = PS_ENOMEM;
    if (!(vjson = cJSON_PrintUnformatted(vers))) goto out;
    snprintf(num, sizeof num, "%d", s->o.server_id);
    if ((rc = ps_st_writer_meta(w, "format", CKPT_FORMAT)) ||
        (rc = ps_st_writer_meta(w, "server_id", num)) ||
        (rc = ps_st_writer_meta(w, "spec", st->spec_json)) ||
        (rc = ps_st_writer_meta(w, "optim", st->optim_json ? st->optim_json : "{}")) ||
        (rc = ps_st_writer_meta(w, "versions", vjson)))
        goto out;
    snprintf(num, sizeof num, "%016llx", (unsigned long long)st->table.hash);
    if ((rc = ps_st_writer_meta(w, "table_hash", num))) goto out;
    snprintf(num, sizeof num, "%llu", (unsigned long long)st->updates);
    if ((rc = ps_st_writer_meta(w, "updates", num))) goto out;
    snprintf(num, sizeof num, "%08x", crc);
    if ((rc = ps_st_writer_meta(w, "data_crc32c", num))) goto out;

    uint64_t seq = s->ckpt_seq + 1;
    ckpt_path(path, sizeof path, dir, s->o.server_id, seq);
    if ((rc = ps_st_writer_save(w, path, err, sizeof err))) {
        ps_error("checkpoint %s failed: %s", path, err);
        goto out;
    }
    s->ckpt_seq = seq;
    s->updates_at_ckpt = st->updates;
    ps_info("checkpoint written: %s (%u partitions, %.1f MiB, %.0f ms)", path, st->nowned,
            bytes / 1048576.0, (psd_now_s() - t0) * 1e3);
    prune(s);
    rc = 0;
out:
    if (rc == PS_ENOMEM) ps_error("checkpoint: out of memory");
    else if (rc && !err[0]) ps_error("checkpoint: %s", ps_strerror(rc));
    free(vjson);
    cJSON_Delete(vers);
    free(names);
    ps_st_writer_destroy(&w);
    return rc;
}

void psd_checkpoint_maybe(psd_t *s)
{
    if (s->o.checkpoint_every <= 0 || !s->o.checkpoint_dir || !s->o.checkpoint_dir[0]) return;
    if (s->st.updates - s->updates_at_ckpt >= (uint64_t)s->o.checkpoint_every) psd_checkpoint_write(s);
}

/* Forget a half-loaded state so the next candidate (or INIT) starts clean. */
static void reset_state(psd_t *s)
{
    psd_store_free(&s->st);
    free(s->workers);
    s->workers = NULL;
    s->nworkers = 0;
    char err[128];
    if (s->o.num_workers > 0) psd_members_set_count(s, s->o.num_workers, err, sizeof err);
}

static int bad(char *err, size_t errlen, const char *fmt, const char *a)
{
    snprintf(err, errlen, fmt, a);
    return PS_ECORRUPT;
}

/* The pending sync gradients and per-rank last iterations of one entry
 * [part, version, init, overflow, [ranks], [last]] (absent in older files).
 * Pending gradients only matter to a sync server; another mode drops them. */
static int load_pending(psd_t *s, const ps_st_file_t *f, psd_part_t *p, const cJSON *e, char *err,
                        size_t errlen)
{
    const cJSON *ovf = cJSON_GetArrayItem(e, 3), *pend = cJSON_GetArrayItem(e, 4),
                *last = cJSON_GetArrayItem(e, 5), *x;
    int W = s->st.nworkers;
    if (cJSON_IsNumber(ovf) && p->slots) p->overflow = ovf->valuedouble != 0;
    if (cJSON_IsArray(last)) {
        int r = 0;
        cJSON_ArrayForEach(x, last)
        {
            if (r < W && cJSON_IsNumber(x) && x->valuedouble >= 0) p->last_iter[r] = (uint64_t)x->valuedouble;
            r++;
        }
    }
    if (!cJSON_IsArray(pend) || !p->slots) return 0;
    cJSON_ArrayForEach(x, pend)
    {
        int r = (int)x->valuedouble;
        char nm[48], rerr[256];
        if (r >= W) {
            snprintf(err, errlen, "partition %u: pending gradient of rank %d but the cluster has %d", p->id,
                     r, W);
            return PS_ECORRUPT;
        }
        snprintf(nm, sizeof nm, "g.%u.%d", p->id, r);
        if (ps_st_read_f32(f, nm, p->slots + (size_t)r * p->numel, p->numel, rerr, sizeof rerr)) {
            snprintf(err, errlen, "%s", rerr);
            return PS_ECORRUPT;
        }
        p->have[r] = 1;
    }
    return 0;
}

/* Verify and load one file; on failure the server state is left empty. */
static int try_load(psd_t *s, const char *path, char *err, size_t errlen)
{
    ps_st_file_t f;
    int rc = ps_st_open(&f, path, err, errlen);
    if (rc) return rc;
    cJSON *vers = NULL;
    const char *fmt = ps_st_meta(&f, "format"), *sid = ps_st_meta(&f, "server_id"),
               *spec = ps_st_meta(&f, "spec"), *vj = ps_st_meta(&f, "versions"),
               *hash = ps_st_meta(&f, "table_hash"), *crcs = ps_st_meta(&f, "data_crc32c"),
               *upd = ps_st_meta(&f, "updates");
    rc = PS_ECORRUPT;
    if (!fmt || strcmp(fmt, CKPT_FORMAT)) {
        bad(err, errlen, "metadata format is \"%s\", want " CKPT_FORMAT, fmt ? fmt : "(missing)");
        goto out;
    }
    if (!sid || !spec || !vj || !hash || !crcs) {
        bad(err, errlen, "%smetadata key missing (server_id, spec, versions, table_hash, data_crc32c)", "");
        goto out;
    }
    if (atoi(sid) != s->o.server_id) {
        bad(err, errlen, "written by server %s", sid);
        goto out;
    }
    vers = cJSON_Parse(vj);
    if (!cJSON_IsArray(vers)) {
        bad(err, errlen, "metadata versions is not a JSON array: %.60s", vj);
        goto out;
    }
    /* Checksum first, before any of it is trusted. */
    uint32_t crc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vers)
    {
        const cJSON *id = cJSON_GetArrayItem(e, 0);
        if (!cJSON_IsNumber(id) || id->valuedouble < 0) {
            bad(err, errlen, "%sbad entry in metadata versions", "");
            goto out;
        }
        const cJSON *pend = cJSON_GetArrayItem(e, 4);
        int np = cJSON_IsArray(pend) ? cJSON_GetArraySize(pend) : 0;
        for (int k = 0; k < 2 + np; k++) {
            char nm[48];
            const cJSON *r = k >= 2 ? cJSON_GetArrayItem(pend, k - 2) : NULL;
            if (k >= 2 && (!cJSON_IsNumber(r) || r->valuedouble < 0 || r->valuedouble > 65535)) {
                bad(err, errlen, "%sbad pending rank in metadata versions", "");
                goto out;
            }
            if (k < 2) snprintf(nm, sizeof nm, "%c.%u", k ? 'm' : 'w', (unsigned)id->valuedouble);
            else snprintf(nm, sizeof nm, "g.%u.%d", (unsigned)id->valuedouble, (int)r->valuedouble);
            const ps_st_tensor_t *t = ps_st_find(&f, nm);
            if (!t || t->dtype != PS_ST_F32) {
                bad(err, errlen, "tensor %s missing or not F32", nm);
                goto out;
            }
            crc = ps_crc32c(crc, ps_st_tensor_data(&f, t), t->nbytes);
        }
    }
    if (strtoul(crcs, NULL, 16) != crc) {
        snprintf(err, errlen, "data checksum mismatch (metadata %s, computed %08x)", crcs, crc);
        goto out;
    }
    uint64_t want = strtoull(hash, NULL, 16);
    char serr[512];
    if ((rc = psd_store_set_spec(s, spec, strlen(spec), &want, serr, sizeof serr))) {
        snprintf(err, errlen, "stored spec: %s", serr);
        reset_state(s);
        goto out;
    }
    rc = PS_ECORRUPT;
    psd_store_t *st = &s->st;
    uint32_t loaded = 0;
    cJSON_ArrayForEach(e, vers)
    {
        const cJSON *id = cJSON_GetArrayItem(e, 0), *v = cJSON_GetArrayItem(e, 1),
                    *ini = cJSON_GetArrayItem(e, 2);
        uint32_t i = (uint32_t)id->valuedouble;
        if (i >= st->table.nparts || !st->parts[i].owned || !cJSON_IsNumber(v) || v->valuedouble < 0 ||
            !cJSON_IsNumber(ini)) {
            snprintf(err, errlen, "partition %u in metadata versions is not one of this shard's", i);
            reset_state(s);
            goto out;
        }
        psd_part_t *p = &st->parts[i];
        char nm[32], rerr[256];
        snprintf(nm, sizeof nm, "w.%u", i);
        if ((rc = ps_st_read_f32(&f, nm, p->w, p->numel, rerr, sizeof rerr)) == 0) {
            nm[0] = 'm';
            rc = ps_st_read_f32(&f, nm, p->m, p->numel, rerr, sizeof rerr);
        }
        if (rc) {
            snprintf(err, errlen, "%s", rerr);
            reset_state(s);
            rc = PS_ECORRUPT;
            goto out;
        }
        p->version = (uint64_t)v->valuedouble;
        p->initialised = ini->valuedouble != 0;
        if ((rc = load_pending(s, &f, p, e, err, errlen))) {
            reset_state(s);
            goto out;
        }
        loaded++;
    }
    if (loaded != st->nowned) {
        snprintf(err, errlen, "holds %u of the shard's %u partitions", loaded, st->nowned);
        reset_state(s);
        goto out;
    }
    st->updates = upd ? strtoull(upd, NULL, 10) : 0;
    st->from_ckpt = 1;
    s->updates_at_ckpt = st->updates;
    s->table_hash_seen = st->table.hash;
    s->have_hash_seen = 1;
    rc = 0;
out:
    cJSON_Delete(vers);
    ps_st_close(&f);
    return rc;
}

int psd_checkpoint_load(psd_t *s)
{
    const char *dir = s->o.checkpoint_dir;
    if (!dir || !dir[0]) return 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        ps_error("--checkpoint-dir %s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    uint64_t *seqs;
    size_t n;
    if (list_ckpts(dir, s->o.server_id, &seqs, &n)) {
        ps_error("--checkpoint-dir %s: cannot list: %s", dir, strerror(errno));
        return PS_EIO;
    }
    if (n) s->ckpt_seq = seqs[0]; /* new files sort after every existing one */
    for (size_t i = 0; i < n; i++) {
        char path[4096], err[1024] = "";
        ckpt_path(path, sizeof path, dir, s->o.server_id, seqs[i]);
        int lrc = try_load(s, path, err, sizeof err);
        if (lrc == 0) {
            uint64_t vmin = UINT64_MAX, vmax = 0;
            for (uint32_t k = 0; k < s->st.table.nparts; k++)
                if (s->st.parts[k].owned) {
                    uint64_t v = s->st.parts[k].version;
                    vmin = v < vmin ? v : vmin;
                    vmax = v > vmax ? v : vmax;
                }
            if (!s->st.nowned) vmin = 0;
            ps_info("loaded checkpoint %s: %u partitions, versions %llu..%llu, table 0x%016llx", path,
                    s->st.nowned, (unsigned long long)vmin, (unsigned long long)vmax,
                    (unsigned long long)s->st.table.hash);
            free(seqs);
            return 0;
        }
        ps_warn("checkpoint %s unusable: %s%s", path, err,
                i + 1 < n ? "; trying the previous one" : "");
        /* Set a corrupt file aside so it does not count as one of the
         * checkpoints kept, and so the next start does not try it again. */
        if (lrc == PS_ECORRUPT) {
            char aside[4200];
            snprintf(aside, sizeof aside, "%s.corrupt", path);
            if (rename(path, aside) == 0) ps_warn("renamed to %s", aside);
        }
    }
    if (n) ps_error("no usable checkpoint in %s: starting empty (INIT will set the weights)", dir);
    free(seqs);
    return 0;
}
