/* psctl export (psctl.c): every partition pulled from the servers and
 * written as safetensors, or with --onnx as the ONNX graph of the model.
 *
 * export needs the model spec (the INIT JSON: tensor names, sizes, groups,
 * partition_bytes) to rebuild the partition table; STATS does not carry it
 * (docs/protocol.md), so it comes from --spec: a JSON file, or a psd
 * checkpoint (.safetensors, whose __metadata__ "spec" is that JSON).  If a
 * future STATS reply has a "spec" member it is used when --spec is absent.
 * The spec has no shapes: tensors are exported 1-D unless --like names a
 * safetensors file (e.g. psworker's model.safetensors) to take shapes from.
 * export --onnx builds the model --model names around the pulled tensors
 * and writes its ONNX graph (psctl_onnx.c). */
#include "config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/client/ps_client.h"
#include "ps_error.h"
#include "ps_optim.h"
#include "ps_partition.h"
#include "ps_safetensors.h"
#include "worker/tools/psctl_internal.h"
#include "worker/tools/psctl_onnx.h"

/* The spec JSON: from --spec (JSON file or psd checkpoint), else STATS. */
char *psctl_spec_load(psctl_t *p)
{
    const char *path = p->o.spec;
    if (!path || !*path) {
        cJSON *st = psctl_stats(p, 0);
        const cJSON *sp = st ? cJSON_GetObjectItemCaseSensitive(st, "spec") : NULL;
        char *txt = NULL;
        if (cJSON_IsString(sp)) txt = strdup(sp->valuestring);
        else if (cJSON_IsObject(sp)) txt = cJSON_PrintUnformatted(sp);
        cJSON_Delete(st);
        if (!txt)
            fprintf(stderr, "psctl: export needs the model spec: --spec FILE (the INIT spec JSON, "
                            "or a psd checkpoint DIR/psd-0-N.safetensors); STATS does not carry it\n");
        return txt;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "psctl: --spec %s: %s\n", path, strerror(errno));
        return NULL;
    }
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\t' || c == '\r') {}
    fclose(f);
    if (c == '{') { /* a JSON spec file */
        f = fopen(path, "rb");
        char *buf = NULL;
        long n = -1;
        if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && n < (64L << 20) &&
            !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)n + 1)) &&
            fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = 0;
            fclose(f);
            return buf;
        }
        fprintf(stderr, "psctl: --spec %s: cannot read (or larger than 64 MiB)\n", path);
        if (f) fclose(f);
        free(buf);
        return NULL;
    }
    ps_st_file_t st;
    char err[256] = "";
    if (ps_st_open(&st, path, err, sizeof err)) {
        fprintf(stderr, "psctl: --spec %s: neither a JSON spec nor a safetensors file: %s\n", path, err);
        return NULL;
    }
    const char *sp = ps_st_meta(&st, "spec");
    char *txt = sp ? strdup(sp) : NULL;
    if (!sp) fprintf(stderr, "psctl: --spec %s: no \"spec\" in its __metadata__ (not a psd checkpoint?)\n", path);
    ps_st_close(&st);
    return txt;
}

/* Rebuild the partition table from the spec; checks its server count. */
int psctl_spec_table(psctl_t *p, const char *json)
{
    cJSON *j = cJSON_Parse(json);
    const cJSON *ts = j ? cJSON_GetObjectItemCaseSensitive(j, "tensors") : NULL;
    const cJSON *pb = j ? cJSON_GetObjectItemCaseSensitive(j, "partition_bytes") : NULL;
    const cJSON *ns = j ? cJSON_GetObjectItemCaseSensitive(j, "num_servers") : NULL;
    int rc = PS_EINVAL, n = cJSON_IsArray(ts) ? cJSON_GetArraySize(ts) : 0;
    ps_tensor_spec_t *spec = n > 0 ? calloc((size_t)n, sizeof *spec) : NULL;
    if (!j || !cJSON_IsObject(j) || n <= 0 || !cJSON_IsNumber(pb) || pb->valuedouble < 4 ||
        !cJSON_IsNumber(ns) || !spec) {
        fprintf(stderr, "psctl: spec: want {\"tensors\":[[name,numel,group],...],"
                        "\"partition_bytes\":N,\"num_servers\":S,...}\n");
        goto out;
    }
    if ((int)ns->valuedouble != p->nserv) {
        fprintf(stderr, "psctl: spec is for %d servers but --servers lists %d\n",
                (int)ns->valuedouble, p->nserv);
        rc = PS_EMISMATCH;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(ts, i);
        const cJSON *nm = cJSON_GetArrayItem(e, 0), *ne = cJSON_GetArrayItem(e, 1),
                    *gr = cJSON_GetArrayItem(e, 2);
        if (!cJSON_IsArray(e) || !cJSON_IsString(nm) || !cJSON_IsNumber(ne) ||
            ne->valuedouble < 1 || ne->valuedouble > 9.0e15 || (gr && !cJSON_IsNumber(gr))) {
            fprintf(stderr, "psctl: spec: tensors[%d] is not [name, numel >= 1, group]\n", i);
            goto out;
        }
        spec[i].name = nm->valuestring;
        spec[i].numel = (size_t)ne->valuedouble;
        spec[i].group = gr ? (int)gr->valuedouble : 0;
    }
    /* AVERAGE groups cut partitions of their own, as in psd (ps_optim_exact_groups) */
    uint32_t exact = 0;
    const cJSON *oj = cJSON_GetObjectItemCaseSensitive(j, "optim");
    char *otxt = cJSON_IsObject(oj) ? cJSON_PrintUnformatted(oj) : NULL;
    ps_optim_config_t oc;
    char oerr[256];
    if (otxt && !ps_optim_config_from_json(&oc, otxt, oerr, sizeof oerr)) exact = ps_optim_exact_groups(&oc);
    free(otxt);
    ps_partition_table_free(&p->table);
    rc = ps_partition_table_build_ex(&p->table, spec, (uint32_t)n, (size_t)pb->valuedouble,
                                     (uint32_t)p->nserv, exact);
    if (rc) fprintf(stderr, "psctl: spec: cannot build the partition table: %s\n", ps_strerror(rc));
out:
    free(spec);
    cJSON_Delete(j);
    return rc;
}

static int check_hashes(psctl_t *p)
{
    char want[24];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)p->table.hash);
    for (int s = 0; s < p->nserv; s++) {
        cJSON *st = psctl_stats(p, s);
        if (!st) return PS_EIO;
        const char *h = psctl_json_str(st, "table_hash");
        int bad = strcmp(h, want) != 0;
        if (bad)
            fprintf(stderr, "psctl: server %d has partition table %s, the spec gives %s%s\n", s,
                    h, want, strcmp(h, "-") ? "" : " (server not initialised yet)");
        cJSON_Delete(st);
        if (bad) return PS_EMISMATCH;
    }
    return 0;
}

/* The model's step counters (BN num_batches_tracked) from the spec's
 * "counters": [[name, value at step 0, per step], ...]: each a 0-dim int64
 * tensor with its value at the exported version, as the workers hold it
 * (worker/psworker/state.c).  Skipped, with a note, when the partitions are
 * at different versions (no one step to give).  *vals (malloc'd, kept
 * until the file is written) holds the values. */
static int add_counters(ps_st_writer_t *wr, const char *spec, uint64_t vmin, uint64_t vmax,
                        int64_t **vals)
{
    cJSON *j = cJSON_Parse(spec);
    const cJSON *cs = j ? cJSON_GetObjectItemCaseSensitive(j, "counters") : NULL;
    int n = cJSON_IsArray(cs) ? cJSON_GetArraySize(cs) : 0, rc = 0;
    if (n > 0 && vmin != vmax)
        printf("note: the %d step counters (num_batches_tracked) are left out: partitions at "
               "versions %llu..%llu\n", n, (unsigned long long)vmin, (unsigned long long)vmax);
    if (n <= 0 || vmin != vmax || !(*vals = calloc((size_t)n, sizeof **vals))) {
        cJSON_Delete(j);
        return n > 0 && vmin == vmax ? PS_ENOMEM : 0;
    }
    for (int i = 0; i < n && !rc; i++) {
        const cJSON *e = cJSON_GetArrayItem(cs, i), *nm = cJSON_GetArrayItem(e, 0),
                    *b = cJSON_GetArrayItem(e, 1), *k = cJSON_GetArrayItem(e, 2);
        if (!cJSON_IsString(nm) || !cJSON_IsNumber(b) || !cJSON_IsNumber(k)) {
            fprintf(stderr, "psctl: spec: counters[%d] is not [name, base, per_step]\n", i);
            rc = PS_EINVAL;
            break;
        }
        (*vals)[i] = (int64_t)b->valuedouble + (int64_t)vmin * (int64_t)k->valuedouble;
        rc = ps_st_writer_add(wr, nm->valuestring, PS_ST_I64, 0, NULL, &(*vals)[i]);
    }
    cJSON_Delete(j);
    return rc;
}

int psctl_export(psctl_t *p, const char *path)
{
    char *spec = psctl_spec_load(p);
    if (!spec) return PS_EINVAL;
    /* Reconnect with the real table: pulls are sized and routed by it. */
    ps_client_destroy(&p->c);
    int rc = psctl_spec_table(p, spec);
    if (!rc) rc = psctl_connect(p);
    if (!rc) rc = check_hashes(p);
    float *w = NULL;
    uint64_t *ver = NULL;
    ps_req_t **rq = NULL;
    ps_st_writer_t *wr = NULL;
    int64_t *counters = NULL;
    ps_st_file_t like;
    int have_like = 0;
    memset(&like, 0, sizeof like);
    if (rc) goto out;
    const ps_partition_table_t *t = &p->table;
    w = malloc(t->total_numel * sizeof *w);
    ver = calloc(t->nparts, sizeof *ver);
    rq = calloc(t->nparts, sizeof *rq);
    if (!w || !ver || !rq) {
        fprintf(stderr, "psctl: out of memory for a %zu-parameter model\n", t->total_numel);
        rc = PS_ENOMEM;
        goto out;
    }
    /* All pulls in flight at once; each reply lands in its slice of w. */
    uint32_t sent = 0;
    for (; sent < t->nparts && !rc; sent++)
        rc = ps_client_pull(p->c, sent, 0, w + t->parts[sent].offset, &rq[sent]);
    if (rc) sent--;
    for (uint32_t i = 0; i < sent; i++) {
        int r1 = ps_client_wait(p->c, rq[i], -1, &ver[i]);
        if (r1 && !rc) {
            fprintf(stderr, "psctl: PULL of partition %u from server %u failed: %s: %s\n", i,
                    t->parts[i].server, ps_strerror(r1), ps_client_last_error(p->c));
            rc = r1;
        }
    }
    if (rc) goto out;
    uint64_t vmin = ver[0], vmax = ver[0];
    for (uint32_t i = 1; i < t->nparts; i++) {
        if (ver[i] < vmin) vmin = ver[i];
        if (ver[i] > vmax) vmax = ver[i];
    }
    char err[256] = "";
    if (p->o.onnx) {
        psctl_onnx_opts_t oo = {.model = p->o.model, .frames = p->o.frames, .size = p->o.size,
                                .shift_place = p->o.shift_place, .shift_div = p->o.shift_div,
                                .like = p->o.like};
        rc = psctl_onnx_export(&oo, t, w, path);
        if (!rc && vmin != vmax)
            printf("note: partitions were at different versions (training was running); "
                   "stop the workers first for a consistent snapshot\n");
        goto out;
    }
    if (p->o.like && *p->o.like) {
        if (ps_st_open(&like, p->o.like, err, sizeof err)) {
            fprintf(stderr, "psctl: --like %s: %s\n", p->o.like, err);
            rc = PS_EINVAL;
            goto out;
        }
        have_like = 1;
    }
    if (!(wr = ps_st_writer_new())) {
        rc = PS_ENOMEM;
        goto out;
    }
    int reshaped = 0;
    for (uint32_t i = 0; i < t->ntensors && !rc; i++) {
        int64_t shape[PS_ST_MAX_DIMS] = {(int64_t)t->tensors[i].numel};
        int nd = 1;
        const ps_st_tensor_t *lt = have_like ? ps_st_find(&like, t->tensors[i].name) : NULL;
        if (lt) {
            size_t n = 1;
            for (int d = 0; d < lt->ndim; d++) n *= (size_t)lt->shape[d];
            if (n == t->tensors[i].numel) {
                nd = lt->ndim;
                memcpy(shape, lt->shape, sizeof(int64_t) * (size_t)nd);
                reshaped++;
            } else {
                fprintf(stderr, "psctl: --like: %s has %zu elements there, %zu here: kept 1-D\n",
                        t->tensors[i].name, n, t->tensors[i].numel);
            }
        }
        rc = ps_st_writer_add(wr, t->tensors[i].name, PS_ST_F32, nd, shape,
                              w + t->tensor_offset[i]);
    }
    if (!rc) rc = add_counters(wr, spec, vmin, vmax, &counters);
    char buf[64];
    if (!rc) rc = ps_st_writer_meta(wr, "format", "psctl-export-1");
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)t->hash);
    if (!rc) rc = ps_st_writer_meta(wr, "table_hash", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)vmin);
    if (!rc) rc = ps_st_writer_meta(wr, "version_min", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)vmax);
    if (!rc) rc = ps_st_writer_meta(wr, "version_max", buf);
    if (!rc) rc = ps_st_writer_meta(wr, "spec", spec);
    if (!rc) rc = ps_st_writer_save(wr, path, err, sizeof err);
    if (rc) {
        fprintf(stderr, "psctl: cannot write %s: %s (%s)\n", path, err, ps_strerror(rc));
        goto out;
    }
    printf("exported %u tensors (%zu parameters, %u partitions, versions %llu..%llu%s) to %s\n",
           t->ntensors, t->total_numel, t->nparts, (unsigned long long)vmin,
           (unsigned long long)vmax, have_like ? (reshaped ? ", shapes from --like" : ", 1-D") : ", 1-D",
           path);
    if (vmin != vmax)
        printf("note: partitions were at different versions (training was running); "
               "stop the workers first for a consistent snapshot\n");
out:
    ps_st_writer_destroy(&wr);
    free(counters);
    if (have_like) ps_st_close(&like);
    free(rq);
    free(ver);
    free(w);
    free(spec);
    return rc;
}
