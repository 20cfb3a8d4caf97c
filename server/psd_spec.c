/* The INIT spec: the JSON model description an INIT brings (or a
 * checkpoint stores) -- {"tensors": [[name, numel, group], ...],
 * "partition_bytes", "num_servers", "num_workers", "optim": {...}}, see
 * docs/protocol.md.  It is parsed and checked here, its partition table
 * built and compared with the sender's hash and with a table already held;
 * then the message-size limit (psd_maxmsg.c) and the cluster size
 * (psd_members.c) must accept it before the store allocates the shard, so
 * that a refused INIT leaves no table behind. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

static int errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

static int json_uint(const cJSON *o, const char *key, double lo, double hi, long long *out,
                     int required, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        if (required) return errf(err, errlen, PS_EINVAL, "INIT spec: missing \"%s\"", key);
        return 1;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return errf(err, errlen, PS_EINVAL, "INIT spec: \"%s\" must be an integer in [%.0f, %.0f]",
                    key, lo, hi);
    *out = (long long)v->valuedouble;
    return 0;
}

/* Parse the tensor list [[name, numel, group], ...] into specs (names point
 * into the cJSON tree, which outlives the table build). */
static int parse_tensors(const cJSON *arr, ps_tensor_spec_t **out, uint32_t *n, char *err,
                         size_t errlen)
{
    if (!cJSON_IsArray(arr))
        return errf(err, errlen, PS_EINVAL, "INIT spec: \"tensors\" must be an array");
    int cnt = cJSON_GetArraySize(arr);
    if (cnt <= 0 || cnt > 1000000)
        return errf(err, errlen, PS_EINVAL, "INIT spec: \"tensors\" has %d entries", cnt);
    ps_tensor_spec_t *t = calloc(cnt, sizeof *t);
    if (!t) return PS_ENOMEM;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        const cJSON *nm = cJSON_GetArrayItem(e, 0), *ne = cJSON_GetArrayItem(e, 1),
                    *gr = cJSON_GetArrayItem(e, 2);
        if (!cJSON_IsArray(e) || !cJSON_IsString(nm) || !cJSON_IsNumber(ne) ||
            ne->valuedouble < 1 || ne->valuedouble > 4e12 ||
            ne->valuedouble != floor(ne->valuedouble) ||
            (gr && (!cJSON_IsNumber(gr) || gr->valuedouble < 0 ||
                    gr->valuedouble >= PS_OPTIM_MAX_GROUPS))) {
            free(t);
            return errf(err, errlen, PS_EINVAL,
                        "INIT spec: tensors[%d] must be [name, numel >= 1, group 0..%d]", i,
                        PS_OPTIM_MAX_GROUPS - 1);
        }
        t[i].name = nm->valuestring;
        t[i].numel = (size_t)ne->valuedouble;
        t[i].group = gr ? (int)gr->valuedouble : 0;
        i++;
    }
    *out = t;
    *n = (uint32_t)cnt;
    return 0;
}

/* partition_bytes, num_servers and num_workers, checked against this
 * server's flags and the cluster size when it is known already. */
static int parse_counts(const psd_t *s, const cJSON *root, long long *pbytes, long long *nserv,
                        long long *nwork, char *err, size_t errlen)
{
    int rc;
    if ((rc = json_uint(root, "partition_bytes", 4, 1e12, pbytes, 1, err, errlen)) ||
        (rc = json_uint(root, "num_servers", 1, 65536, nserv, 1, err, errlen)) < 0 ||
        (rc = json_uint(root, "num_workers", 1, 65536, nwork, 1, err, errlen)) < 0)
        return rc;
    if (s->o.num_servers > 0 && *nserv != s->o.num_servers)
        return errf(err, errlen, PS_EMISMATCH,
                    "INIT spec: num_servers %lld but this psd runs with --num-servers %d", *nserv,
                    s->o.num_servers);
    if (s->o.server_id >= *nserv)
        return errf(err, errlen, PS_EMISMATCH, "INIT spec: num_servers %lld but this is server %d",
                    *nserv, s->o.server_id);
    if (s->w0 > 0 && *nwork != s->w0)
        return errf(err, errlen, PS_EMISMATCH, "INIT spec: num_workers %lld but the cluster has %d",
                    *nwork, s->w0);
    return 0;
}

/* The "optim" object, validated; the defaults without one. */
static int parse_optim(const cJSON *root, ps_optim_config_t *oc, char *err, size_t errlen)
{
    ps_optim_config_default(oc);
    const cJSON *oj = cJSON_GetObjectItemCaseSensitive(root, "optim");
    if (!oj) return 0;
    if (!cJSON_IsObject(oj)) return errf(err, errlen, PS_EINVAL, "INIT spec: \"optim\" must be an object");
    char *ojson = cJSON_PrintUnformatted(oj);
    char oerr[256] = "";
    int rc = 0;
    if (!ojson || (rc = ps_optim_config_from_json(oc, ojson, oerr, sizeof oerr)) ||
        (rc = ps_optim_config_validate(oc, oerr, sizeof oerr)))
        rc = errf(err, errlen, PS_EINVAL, "INIT spec: optim: %s", oerr);
    free(ojson);
    return rc;
}

/* Build the table of the spec's tensors into *t.  0: a new table; 1: the
 * one this server holds already (a retried INIT, or an INIT after a
 * restart from a checkpoint: fine when it describes the same table); else
 * PS_E* with nothing built. */
static int build_table(const psd_t *s, const ps_tensor_spec_t *specs, uint32_t nt, long long pbytes,
                       long long nserv, const ps_optim_config_t *oc, const uint64_t *want_hash,
                       ps_partition_table_t *t, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < nt; i++)
        if (specs[i].group >= oc->ngroups)
            return errf(err, errlen, PS_EINVAL,
                        "INIT spec: tensor %s has group %d but optim defines %d group(s)",
                        specs[i].name, specs[i].group, oc->ngroups);
    /* AVERAGE groups (BN statistics) get partitions of their own that the
     * workers send raw fp32: the same cuts as theirs (ps_optim_exact_groups) */
    int rc = ps_partition_table_build_ex(t, specs, nt, (size_t)pbytes, (uint32_t)nserv,
                                         ps_optim_exact_groups(oc));
    if (rc)
        return errf(err, errlen, rc, "INIT spec: cannot build the partition table: %s",
                    ps_strerror(rc));
    if (want_hash && *want_hash != t->hash) {
        rc = errf(err, errlen, PS_EMISMATCH,
                  "partition table hash 0x%016llx from the spec differs from the sender's 0x%016llx",
                  (unsigned long long)t->hash, (unsigned long long)*want_hash);
        ps_partition_table_free(t);
        return rc;
    }
    if (!s->st.have_table) return 0;
    rc = 1;
    if (t->hash != s->st.table.hash)
        rc = errf(err, errlen, PS_EMISMATCH,
                  "partition table hash 0x%016llx differs from the one this server holds "
                  "(0x%016llx%s)",
                  (unsigned long long)t->hash, (unsigned long long)s->st.table.hash,
                  s->st.from_ckpt ? ", loaded from a checkpoint" : "");
    ps_partition_table_free(t);
    return rc;
}

/* Parse and check the spec into *sp (0), or 1 as build_table, or PS_E*. */
static int parse_spec(const psd_t *s, const char *json, size_t len, const uint64_t *want_hash,
                      psd_spec_t *sp, char *err, size_t errlen)
{
    ps_tensor_spec_t *specs = NULL;
    uint32_t nt = 0;
    long long pbytes = 0, nserv = 0, nwork = 0;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return errf(err, errlen, PS_EINVAL, "INIT spec: not a JSON object (%zu bytes)", len);
    }
    int rc = parse_tensors(cJSON_GetObjectItemCaseSensitive(root, "tensors"), &specs, &nt, err,
                           errlen);
    if (!rc) rc = parse_counts(s, root, &pbytes, &nserv, &nwork, err, errlen);
    if (!rc) rc = parse_optim(root, &sp->optim, err, errlen);
    /* elastic membership's lr rule (psworker --elastic-lr), and the global
     * batch that keep-batch splits over the workers */
    const cJSON *el = cJSON_GetObjectItemCaseSensitive(root, "elastic");
    const cJSON *lr = cJSON_GetObjectItemCaseSensitive(el, "lr"),
                *gb = cJSON_GetObjectItemCaseSensitive(el, "global_batch");
    sp->elastic_linear = cJSON_IsString(lr) && !strcmp(lr->valuestring, "linear");
    sp->global_batch = cJSON_IsNumber(gb) ? (long long)gb->valuedouble : 0;
    if (!rc)
        rc = build_table(s, specs, nt, pbytes, nserv, &sp->optim, want_hash, &sp->table, err,
                         errlen);
    free(specs);
    cJSON_Delete(root);
    if (rc) return rc;
    sp->nworkers = (int)nwork;
    sp->json = json;
    sp->len = len;
    sp->max_numel = 0;
    for (uint32_t i = 0; i < sp->table.nparts; i++)
        if (sp->table.parts[i].server == (uint32_t)s->o.server_id &&
            sp->table.parts[i].numel > sp->max_numel)
            sp->max_numel = sp->table.parts[i].numel;
    return 0;
}

int psd_spec_hold(psd_t *s, const char *json, size_t len, const uint64_t *want_hash, char *err,
                  size_t errlen)
{
    psd_spec_t sp;
    int rc = parse_spec(s, json, len, want_hash, &sp, err, errlen);
    if (rc) return rc > 0 ? 0 : rc;
    if ((rc = psd_maxmsg_for_table(s, sp.max_numel, err, errlen)) ||
        (rc = psd_members_set_count(s, sp.nworkers, err, errlen))) {
        ps_partition_table_free(&sp.table);
        return rc;
    }
    s->elastic_linear = sp.elastic_linear;
    s->global_batch = sp.global_batch;
    return psd_store_hold(s, &sp, err, errlen);
}
