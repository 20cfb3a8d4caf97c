/* psd checkpoint loading at start (the format: psd_checkpoint_internal.h):
 * the newest file of this server that verifies -- its metadata, then the
 * checksum over its data before any of it is trusted -- rebuilds the
 * shard; a corrupt one is set aside and the one before it tried.  With
 * none, why (for the workers' ERROR text). */
#include "psd_checkpoint_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

/* Forget a half-loaded state so the next candidate (or INIT) starts clean. */
static void reset_state(psd_t *s)
{
    psd_store_free(&s->st);
    free(s->workers);
    s->workers = NULL;
    s->nworkers = s->w0 = 0;
    free(s->epochs);
    s->epochs = NULL;
    s->nepochs = 0;
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

/* The metadata of a checkpoint file (pointing into the file). */
typedef struct ckpt_meta {
    const char *fmt, *sid, *spec, *vj, *hash, *crcs, *upd;
} ckpt_meta_t;

/* Read the metadata and check it: the format, every key there, and the
 * file written by this server.  0 or PS_ECORRUPT. */
static int read_meta(psd_t *s, const ps_st_file_t *f, ckpt_meta_t *mt, char *err, size_t errlen)
{
    mt->fmt = ps_st_meta(f, "format");
    mt->sid = ps_st_meta(f, "server_id");
    mt->spec = ps_st_meta(f, "spec");
    mt->vj = ps_st_meta(f, "versions");
    mt->hash = ps_st_meta(f, "table_hash");
    mt->crcs = ps_st_meta(f, "data_crc32c");
    mt->upd = ps_st_meta(f, "updates");
    if (!mt->fmt || strcmp(mt->fmt, CKPT_FORMAT))
        return bad(err, errlen, "metadata format is \"%s\", want " CKPT_FORMAT,
                   mt->fmt ? mt->fmt : "(missing)");
    if (!mt->sid || !mt->spec || !mt->vj || !mt->hash || !mt->crcs)
        return bad(err, errlen,
                   "%smetadata key missing (server_id, spec, versions, table_hash, data_crc32c)", "");
    if (atoi(mt->sid) != s->o.server_id) return bad(err, errlen, "written by server %s", mt->sid);
    return 0;
}

/* The checksum over every tensor that `versions` names (w.p, m.p, then
 * g.p.r of each pending rank), checked before any of the data is trusted.
 * 0 or PS_ECORRUPT. */
static int verify_data(const ps_st_file_t *f, const cJSON *vers, const char *crcs, char *err,
                       size_t errlen)
{
    uint32_t crc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vers)
    {
        const cJSON *id = cJSON_GetArrayItem(e, 0);
        if (!cJSON_IsNumber(id) || id->valuedouble < 0)
            return bad(err, errlen, "%sbad entry in metadata versions", "");
        const cJSON *pend = cJSON_GetArrayItem(e, 4);
        int np = cJSON_IsArray(pend) ? cJSON_GetArraySize(pend) : 0;
        for (int k = 0; k < 2 + np; k++) {
            char nm[48];
            const cJSON *r = k >= 2 ? cJSON_GetArrayItem(pend, k - 2) : NULL;
            if (k >= 2 && (!cJSON_IsNumber(r) || r->valuedouble < 0 || r->valuedouble > 65535))
                return bad(err, errlen, "%sbad pending rank in metadata versions", "");
            if (k < 2) snprintf(nm, sizeof nm, "%c.%u", k ? 'm' : 'w', (unsigned)id->valuedouble);
            else snprintf(nm, sizeof nm, "g.%u.%d", (unsigned)id->valuedouble, (int)r->valuedouble);
            const ps_st_tensor_t *t = ps_st_find(f, nm);
            if (!t || t->dtype != PS_ST_F32) return bad(err, errlen, "tensor %s missing or not F32", nm);
            crc = ps_crc32c(crc, ps_st_tensor_data(f, t), t->nbytes);
        }
    }
    if (strtoul(crcs, NULL, 16) != crc) {
        snprintf(err, errlen, "data checksum mismatch (metadata %s, computed %08x)", crcs, crc);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Every entry of `versions` into the shard just built from the file's
 * spec: weights, momentum, version, pending state; each one must be a
 * partition of this shard, and every partition of it must be there.
 * 0 or PS_ECORRUPT (the state is then half-loaded: reset_state). */
static int load_parts(psd_t *s, const ps_st_file_t *f, const cJSON *vers, char *err, size_t errlen)
{
    psd_store_t *st = &s->st;
    uint32_t loaded = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vers)
    {
        const cJSON *id = cJSON_GetArrayItem(e, 0), *v = cJSON_GetArrayItem(e, 1),
                    *ini = cJSON_GetArrayItem(e, 2);
        uint32_t i = (uint32_t)id->valuedouble;
        if (i >= st->table.nparts || !st->parts[i].owned || !cJSON_IsNumber(v) || v->valuedouble < 0 ||
            !cJSON_IsNumber(ini)) {
            snprintf(err, errlen, "partition %u in metadata versions is not one of this shard's", i);
            return PS_ECORRUPT;
        }
        psd_part_t *p = &st->parts[i];
        char nm[32], rerr[256];
        snprintf(nm, sizeof nm, "w.%u", i);
        psd_store_weights_writable(s, p);
        int rc = ps_st_read_f32(f, nm, p->w, p->numel, rerr, sizeof rerr);
        if (rc == 0) {
            nm[0] = 'm';
            rc = ps_st_read_f32(f, nm, p->m, p->numel, rerr, sizeof rerr);
        }
        if (rc) {
            snprintf(err, errlen, "%s", rerr);
            return PS_ECORRUPT;
        }
        p->version = (uint64_t)v->valuedouble;
        p->initialised = ini->valuedouble != 0;
        if ((rc = load_pending(s, f, p, e, err, errlen))) return rc;
        loaded++;
    }
    if (loaded != st->nowned) {
        snprintf(err, errlen, "holds %u of the shard's %u partitions", loaded, st->nowned);
        return PS_ECORRUPT;
    }
    return 0;
}

/* Verify and load one file; on failure the server state is left empty. */
static int try_load(psd_t *s, const char *path, char *err, size_t errlen)
{
    ps_st_file_t f;
    int rc = ps_st_open(&f, path, err, errlen);
    if (rc) return rc;
    ckpt_meta_t mt;
    cJSON *vers = NULL;
    if ((rc = read_meta(s, &f, &mt, err, errlen))) goto out;
    vers = cJSON_Parse(mt.vj);
    if (!cJSON_IsArray(vers)) {
        rc = bad(err, errlen, "metadata versions is not a JSON array: %.60s", mt.vj);
        goto out;
    }
    if ((rc = verify_data(&f, vers, mt.crcs, err, errlen))) goto out;
    /* The table, cluster size and message-size bound the spec implies, as
     * an INIT of it would set them. */
    uint64_t want = strtoull(mt.hash, NULL, 16);
    char serr[512] = "";
    if ((rc = psd_spec_hold(s, mt.spec, strlen(mt.spec), &want, serr, sizeof serr))) {
        snprintf(err, errlen, "stored spec: %s", serr);
        reset_state(s);
        goto out;
    }
    if ((rc = load_parts(s, &f, vers, err, errlen))) {
        reset_state(s);
        goto out;
    }
    psd_store_t *st = &s->st;
    const char *skips = ps_st_meta(&f, "skipped_steps"); /* absent: an older file */
    if (skips && (rc = psd_skips_parse(st, skips, err, errlen))) {
        reset_state(s);
        goto out;
    }
    psd_members_steps_load(s, ps_st_meta(&f, "rank_steps"));
    const char *epochs = ps_st_meta(&f, "epochs");
    if (epochs && (rc = psd_elastic_parse(s, epochs, err, errlen))) {
        reset_state(s);
        goto out;
    }
    st->updates = mt.upd ? strtoull(mt.upd, NULL, 10) : 0;
    st->from_ckpt = 1;
    s->updates_at_ckpt = st->updates;
    s->table_hash_seen = st->table.hash;
    s->have_hash_seen = 1;
out:
    cJSON_Delete(vers);
    ps_st_close(&f);
    return rc;
}

/* After a checkpoint was loaded: what STATS reports of it, and a warning
 * when the previous run's last write had failed (the file is older than
 * the state that server reached). */
static void loaded(psd_t *s, const char *path, const char *note, int noted)
{
    uint64_t vmin = 0, vmax = 0;
    if (!psd_checkpoint_versions(s, &vmin, &vmax)) vmin = vmax = 0;
    s->ckpt_version = vmin;
    s->have_ckpt = 1;
    if ((s->aligned_v = psd_checkpoint_aligned_version(s))) s->aligned_taken = s->aligned_v;
    ps_info("loaded checkpoint %s: %u partitions, versions %llu..%llu, table 0x%016llx", path,
            s->st.nowned, (unsigned long long)vmin, (unsigned long long)vmax,
            (unsigned long long)s->st.table.hash);
    if (noted)
        ps_warn("the last checkpoint write before this start failed (%s): resumed from the newest "
                "file that exists, older than the state this server had reached",
                note[0] ? note : "cause not recorded");
}

int psd_checkpoint_load(psd_t *s)
{
    const char *dir = s->o.checkpoint_dir;
    if (!dir || !dir[0]) return 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        ps_error("--checkpoint-dir %s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    psd_checkpoint_remove_stale(dir, s->o.server_id);
    uint64_t *seqs;
    size_t n;
    if (psd_checkpoint_list(dir, s->o.server_id, &seqs, &n)) {
        ps_error("--checkpoint-dir %s: cannot list: %s", dir, strerror(errno));
        return PS_EIO;
    }
    char note[600];
    int noted = psd_checkpoint_marker_read(dir, s->o.server_id, note, sizeof note);
    if (n) s->ckpt_seq = seqs[0]; /* new files sort after every existing one */
    for (size_t i = 0; i < n; i++) {
        char path[4096], err[1024] = "";
        psd_checkpoint_path(path, sizeof path, dir, s->o.server_id, seqs[i]);
        int lrc = try_load(s, path, err, sizeof err);
        if (lrc == 0) {
            loaded(s, path, note, noted);
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
    /* No state: a worker of a job under way will be told why. */
    if (noted && note[0])
        snprintf(s->ckpt_none, sizeof s->ckpt_none, "its last write failed: %s", note);
    else if (noted)
        snprintf(s->ckpt_none, sizeof s->ckpt_none,
                 "its last write failed; the cause could not be recorded, the disk may be full");
    else if (n)
        snprintf(s->ckpt_none, sizeof s->ckpt_none, "none of the %zu file(s) in %s is usable", n, dir);
    else
        snprintf(s->ckpt_none, sizeof s->ckpt_none, "none in %s", dir);
    if (n || noted)
        ps_error("no usable checkpoint in %s (%s): starting empty (INIT will set the weights)", dir,
                 s->ckpt_none);
    free(seqs);
    return 0;
}

void psd_checkpoint_why_none(const psd_t *s, char *buf, size_t cap)
{
    if (!s->o.checkpoint_dir || !s->o.checkpoint_dir[0])
        snprintf(buf, cap, "server %d holds no state of this job: no INIT since it started, and it "
                 "runs without --checkpoint-dir (a restart loses the job)", s->o.server_id);
    else
        snprintf(buf, cap, "server %d has no checkpoint of this job (%s) and no INIT since it started",
                 s->o.server_id, s->ckpt_none[0] ? s->ckpt_none : "none loaded");
}
