/* The psd client of a psworker, from its options: endpoints, CURVE keys,
 * wire format, error feedback, timeouts; then HELLO and the rank checks. */
#include "worker/psworker/psworker.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/client/ps_client.h"

int ps_worker_client_connect(ps_worker_t *p, ps_client_t **cp)
{
    const ps_worker_opts_t *o = p->o;
    ps_client_opts_t co;
    ps_client_t *c = NULL;
    int nservers = 0, nkeys = 0, rc;
    char **servers = ps_worker_split_list(o->servers, &nservers);
    char **keys = *o->wire.curve_server_keys ? ps_worker_split_list(o->wire.curve_server_keys, &nkeys) : NULL;

    *cp = NULL;
    if (!servers || (*o->wire.curve_server_keys && !keys)) {
        rc = PS_ENOMEM;
        goto out;
    }
    ps_client_opts_default(&co);
    co.servers = (const char *const *)servers;
    co.nservers = nservers;
    co.rank = o->rank;
    co.num_workers = o->num_workers;
    co.dtype = o->wire.dt;
    co.codec = o->wire.codec_id;
    co.pull_codec = o->wire.pull_codec_id;
    co.topk_ratio = o->wire.topk_ratio;
    co.ef_rounding = o->wire.ef_rounding;
    co.ef_momentum = ps_worker_ef_momentum(o);
    co.ef_nesterov = o->optim.nesterov;
    co.topk_warmup_steps = ps_worker_topk_warmup(o);
    if (keys) {
        if (nkeys != 1 && nkeys != nservers) {
            ps_error("--curve-server-key: give 1 key file (shared by all servers) or one per "
                     "server (%d), got %d", nservers, nkeys);
            rc = PS_EINVAL;
            goto out;
        }
        co.curve_server_keys = (const char *const *)keys;
        co.ncurve_server_keys = nkeys;
        co.curve_public_key = o->wire.curve_public_key;
        co.curve_secret_key = o->wire.curve_secret_key;
    }
    co.timeout_ms = o->timeout_ms;
    co.retry_ms = o->retry_ms;
    co.heartbeat_ms = o->heartbeat_ms;
    co.stall_warn_ms = o->stall_warn_ms;
    co.keep_state = o->replicate_state && !strcmp(o->mode, "sync");
    if ((rc = ps_client_new(&c, &co, &p->table))) {
        ps_error("cannot create the client for %s: %s", o->servers, ps_strerror(rc));
        goto out;
    }
    rc = o->join ? ps_client_join(c, &p->join_at) : ps_client_hello(c);
    if (rc < 0) {
        ps_error("HELLO to %s failed: %s (%s)", servers[0], ps_strerror(rc),
                 ps_client_last_error(c));
        goto out;
    }
    if (rc >= o->num_workers && !o->join) { /* a joiner's rank may be above the start's */
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
    rc = 0;
    {
        char tag[32];
        snprintf(tag, sizeof tag, "psworker[%d]", p->rank);
        ps_log_set_prog(tag);
    }
    ps_info("rank %d of %d, %d server(s), wire %s/%s (pull %s)%s, mode %s", p->rank,
            o->num_workers, nservers, ps_dtype_name(o->wire.dt), ps_codec_name(o->wire.codec_id),
            o->wire.pull_codec_id >= 0 ? ps_codec_name((ps_codec_t)o->wire.pull_codec_id) : "auto",
            keys ? ", CURVE" : "", o->mode);
out:
    if (rc) ps_client_destroy(&c);
    *cp = c;
    free(servers);
    free(keys);
    return rc;
}
