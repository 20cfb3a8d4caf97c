/* psworker's training loops.
 *
 * Cluster (sync) step: compute this rank's mean gradient, PUSHPULL every
 * partition (all in flight together, issued in partition order so the
 * client's front-of-model priority matches), wait for all, which also
 * brings back the weights of the next version.  The iteration sent with a
 * partition's gradient is the version of the weights it was computed from;
 * in sync mode that is the step number, in async / bounded-staleness modes
 * the server uses it to measure staleness.
 *
 * Standalone step: the same gradient over the whole global batch, then the
 * same ps_optim_apply_partition the servers run, partition by partition. */
#include "worker/psworker.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/ps_client.h"

static int check_loss(const ps_worker_t *p, double loss, uint64_t step)
{
    if (isfinite(loss))
        return 0;
    if (p->compute_rc) /* the cause (bad data, ...) is already logged */
        return p->compute_rc;
    ps_error("loss is not finite at step %" PRIu64 " (diverged: try a lower --lr)", step);
    return PS_ENONFINITE;
}

int ps_worker_run_standalone(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    int rc = ps_worker_output_open(p);
    if (rc)
        return rc;
    ps_worker_initial_eval(p);
    p->st.t_start = ps_worker_now();
    for (uint64_t s = 0; s < o->steps; s++) {
        double t0 = ps_worker_now();
        double loss = ps_worker_compute(p, s);
        if ((rc = check_loss(p, loss, s)))
            return rc;
        double t1 = ps_worker_now();
        for (uint32_t i = 0; i < p->table.nparts; i++) {
            size_t off = p->table.parts[i].offset;
            rc = ps_optim_apply_partition(&p->optim, &p->table, i, p->w + off, p->mom + off,
                                          p->grad + off, s);
            if (rc) {
                ps_error("optimizer update of partition %u failed: %s", i, ps_strerror(rc));
                return rc;
            }
        }
        double t2 = ps_worker_now();
        ps_worker_record_step(p, s, loss, t2 - t0, t1 - t0, 0);
        ps_worker_maybe_validate(p, s + 1);
    }
    if ((rc = ps_worker_save_model(p)))
        return rc;
    ps_worker_print_final(p, o->steps);
    return 0;
}

/* Split "a,b,c" into a NULL-terminated array (one allocation). */
static char **split_servers(const char *list, int *n)
{
    size_t len = strlen(list);
    int cnt = 1;
    for (const char *q = list; *q; q++) cnt += *q == ',';
    char **v = malloc(sizeof(char *) * (size_t)(cnt + 1) + len + 1);
    if (!v)
        return NULL;
    char *buf = (char *)(v + cnt + 1);
    memcpy(buf, list, len + 1);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        if (*tok) v[(*n)++] = tok;
    v[*n] = NULL;
    return v;
}

/* Wait for every request in req[0..n) (NULL entries skipped), in order. */
static int wait_all(ps_client_t *c, ps_req_t **req, uint64_t *ver, uint32_t n, const char *what)
{
    int first_err = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!req[i])
            continue;
        int rc = ps_client_wait(c, req[i], -1, &ver[i]);
        req[i] = NULL;
        if (rc && !first_err) {
            ps_error("%s of partition %u failed: %s (%s)", what, i, ps_strerror(rc),
                     ps_client_last_error(c));
            first_err = rc;
        }
    }
    return first_err;
}

static int pull_all(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver)
{
    for (uint32_t i = 0; i < p->table.nparts; i++) {
        int rc = ps_client_pull(c, i, 0, p->w + p->table.parts[i].offset, &req[i]);
        if (rc) {
            ps_error("pull of partition %u: %s", i, ps_strerror(rc));
            wait_all(c, req, ver, i, "pull");
            return rc;
        }
    }
    return wait_all(c, req, ver, p->table.nparts, "pull");
}

/* One cluster step: push the gradient of every partition and get the new
 * weights back.  A gradient refused as too stale (bounded staleness) is
 * dropped and the partition's newest weights are pulled instead. */
static int cluster_step(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver,
                        uint64_t step, int sync)
{
    uint32_t n = p->table.nparts;
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        size_t off = p->table.parts[i].offset;
        rc = ps_client_pushpull(c, i, sync ? step : ver[i], p->grad + off, p->w + off, 0,
                                &req[i]);
        if (rc)
            ps_error("pushpull of partition %u at step %" PRIu64 ": %s", i, step,
                     ps_strerror(rc));
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!req[i])
            continue;
        uint64_t v = 0;
        int r = ps_client_wait(c, req[i], -1, &v);
        req[i] = NULL;
        if (r == PS_ESTALE && !sync) {
            p->st.stale_drops++;
            ps_debug("partition %u: gradient of version %" PRIu64 " too stale, pulling", i,
                     ver[i]);
            r = ps_client_pull(c, i, 0, p->w + p->table.parts[i].offset, &req[i]);
            if (!r)
                r = ps_client_wait(c, req[i], -1, &v);
            req[i] = NULL;
        }
        if (r) {
            if (!rc)
                ps_error("step %" PRIu64 ": partition %u failed: %s (%s)", step, i,
                         ps_strerror(r), ps_client_last_error(c));
            rc = rc ? rc : r;
            continue;
        }
        if (sync && v != step + 1 && !rc) {
            /* Exactly one update per step: anything else is a lost or doubled one. */
            ps_error("step %" PRIu64 ": partition %u came back at version %" PRIu64
                     ", expected %" PRIu64 " (lost or doubled update; or the servers do not "
                     "run --mode sync: give psworker the same --mode)", step, i, v, step + 1);
            rc = PS_ESTATE;
        }
        if (!sync && v < ver[i]) {
            /* The partition's version went backwards: its server restarted
             * from an older checkpoint.  Residuals of lossy pushes were
             * accumulated against weights that no longer exist. */
            ps_warn("partition %u went back from version %" PRIu64 " to %" PRIu64
                    " (server restored a checkpoint): resetting error feedback", i, ver[i], v);
            ps_client_ef_reset(c);
        }
        ver[i] = v;
    }
    return rc;
}

static int cluster_train(ps_worker_t *p, ps_client_t *c, ps_req_t **req, uint64_t *ver)
{
    const ps_worker_opts_t *o = p->o;
    int sync = !strcmp(o->mode, "sync"), rc, from_ckpt = 0;

    if (p->rank == 0) {
        char *spec = ps_worker_spec_json(p);
        if (!spec) {
            ps_error("cannot build the model spec: out of memory");
            return PS_ENOMEM;
        }
        rc = ps_client_init(c, spec, p->w, &from_ckpt);
        free(spec);
        if (rc) {
            ps_error("INIT failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
            return rc;
        }
        if (from_ckpt)
            ps_info("servers hold a checkpoint of this model: resuming from it");
    }
    if ((rc = ps_client_barrier(c))) {
        ps_error("start barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        return rc;
    }
    if ((rc = pull_all(p, c, req, ver)))
        return rc;
    uint64_t start = ver[0];
    for (uint32_t i = 1; i < p->table.nparts; i++) {
        if (ver[i] != start && sync) {
            ps_error("partitions start at different versions (%" PRIu64 " and %" PRIu64
                     "): servers restored from checkpoints of different steps",
                     start, ver[i]);
            return PS_ESTATE;
        }
        if (ver[i] < start) start = ver[i];
    }
    if (!sync)
        start = 0; /* versions count pushes, not steps, in async modes */
    else if (start > 0)
        ps_info("resuming at step %" PRIu64, start);
    if ((rc = ps_worker_output_open(p)))
        return rc;
    ps_worker_initial_eval(p);
    p->st.t_start = ps_worker_now();
    for (uint64_t s = start; s < o->steps; s++) {
        double t0 = ps_worker_now();
        double loss = ps_worker_compute(p, s);
        if ((rc = check_loss(p, loss, s)))
            return rc;
        double t1 = ps_worker_now();
        if ((rc = cluster_step(p, c, req, ver, s, sync)))
            return rc;
        double t2 = ps_worker_now();
        ps_worker_record_step(p, s, loss, t2 - t0, t1 - t0, t2 - t1);
        ps_worker_maybe_validate(p, s + 1);
    }
    /* Everyone finished: in async modes the newest weights are on the
     * servers, so every rank reads them back before evaluating / saving. */
    if ((rc = ps_client_barrier(c))) {
        ps_error("final barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        return rc;
    }
    if ((rc = pull_all(p, c, req, ver)))
        return rc;
    if ((rc = ps_worker_save_model(p)))
        return rc;
    ps_worker_print_final(p, o->steps);
    /* A second barrier: nobody may still be pulling when rank 0 shuts the
     * servers down. */
    if ((rc = ps_client_barrier(c))) {
        ps_error("exit barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        return rc;
    }
    if (p->rank == 0 && o->shutdown_servers && (rc = ps_client_shutdown_servers(c))) {
        ps_error("SHUTDOWN of the servers failed: %s (%s)", ps_strerror(rc),
                 ps_client_last_error(c));
        return rc;
    }
    return 0;
}

int ps_worker_run_cluster(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    ps_client_opts_t co;
    ps_client_t *c = NULL;
    int nservers = 0, nkeys = 0, rc;
    char **servers = split_servers(o->servers, &nservers);
    char **keys = *o->curve_server_keys ? split_servers(o->curve_server_keys, &nkeys) : NULL;
    ps_req_t **req = calloc(p->table.nparts, sizeof *req);
    uint64_t *ver = calloc(p->table.nparts, sizeof *ver);

    if (!servers || !req || !ver || (*o->curve_server_keys && !keys)) {
        rc = PS_ENOMEM;
        goto out;
    }
    ps_client_opts_default(&co);
    co.servers = (const char *const *)servers;
    co.nservers = nservers;
    co.rank = o->rank;
    co.num_workers = o->num_workers;
    co.dtype = o->dt;
    co.codec = o->codec_id;
    co.pull_codec = o->pull_codec_id;
    co.topk_ratio = o->topk_ratio;
    co.ef_rounding = o->ef_rounding;
    if (keys) {
        if (nkeys != 1 && nkeys != nservers) {
            ps_error("--curve-server-key: give 1 key file (shared by all servers) or one per "
                     "server (%d), got %d", nservers, nkeys);
            rc = PS_EINVAL;
            goto out;
        }
        co.curve_server_keys = (const char *const *)keys;
        co.ncurve_server_keys = nkeys;
        co.curve_public_key = o->curve_public_key;
        co.curve_secret_key = o->curve_secret_key;
    }
    co.timeout_ms = o->timeout_ms;
    co.retry_ms = o->retry_ms;
    co.heartbeat_ms = o->heartbeat_ms;
    if ((rc = ps_client_new(&c, &co, &p->table))) {
        ps_error("cannot create the client for %s: %s", o->servers, ps_strerror(rc));
        goto out;
    }
    rc = ps_client_hello(c);
    if (rc < 0) {
        ps_error("HELLO to %s failed: %s (%s)", servers[0], ps_strerror(rc),
                 ps_client_last_error(c));
        goto out;
    }
    if (rc >= o->num_workers) {
        ps_error("server 0 assigned rank %d but --num-workers is %d", rc, o->num_workers);
        rc = PS_EMISMATCH;
        goto out;
    }
    if (o->rank >= 0 && rc != o->rank) {
        ps_error("asked for rank %d, server 0 gave %d", o->rank, rc);
        rc = PS_EMISMATCH;
        goto out;
    }
    p->rank = rc;
    {
        char tag[32];
        snprintf(tag, sizeof tag, "psworker[%d]", p->rank);
        ps_log_set_prog(tag);
    }
    ps_info("rank %d of %d, %d server(s), wire %s/%s (pull %s)%s, mode %s", p->rank,
            o->num_workers, nservers, ps_dtype_name(o->dt), ps_codec_name(o->codec_id),
            o->pull_codec_id >= 0 ? ps_codec_name((ps_codec_t)o->pull_codec_id) : "auto",
            keys ? ", CURVE" : "", o->mode);
    rc = cluster_train(p, c, req, ver);
out:
    /* Destroying the client stops its I/O thread before the buffers that
     * in-flight requests point into (p->w, p->grad) are freed. */
    ps_client_destroy(&c);
    free(servers);
    free(keys);
    free(req);
    free(ver);
    return rc;
}
