/* Reporting the counters of psd_t (psd_metrics_t, kept by the code that
 * counts): the STATS reply, the periodic stats log line, and /metrics in
 * Prometheus text format (served by common/ps_http.c on psd's loop). */
#include "psd.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ps_error.h"
#include "ps_http.h"
#include "ps_log.h"

static const char *mode_name(psd_mode_t m)
{
    return m == PSD_SYNC ? "sync" : m == PSD_ASYNC ? "async" : "ssp";
}

/* STATS `errors`: ERROR replies sent plus checkpoint writes that failed. */
static uint64_t error_count(const psd_t *s)
{
    uint64_t errs = s->mx.ckpt_failures;
    for (int i = 0; i < PSD_NERR; i++) errs += s->mx.errors[i];
    return errs;
}

char *psd_stats_json(const psd_t *s, int preflight)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    uint64_t vmin = 0, vmax = 0;
    int first = 1;
    cJSON *parts = cJSON_AddObjectToObject(o, "partitions");
    if (s->st.have_table)
        for (uint32_t i = 0; i < s->st.table.nparts; i++) {
            const psd_part_t *p = &s->st.parts[i];
            if (!p->owned) continue;
            char k[16];
            snprintf(k, sizeof k, "%u", i);
            cJSON_AddNumberToObject(parts, k, (double)p->version);
            if (first || p->version < vmin) vmin = p->version;
            if (first || p->version > vmax) vmax = p->version;
            first = 0;
        }
    cJSON_AddNumberToObject(o, "server_id", s->o.server_id);
    cJSON_AddStringToObject(o, "mode", mode_name(s->mode));
    cJSON_AddNumberToObject(o, "version", (double)vmin); /* the shard's slowest partition */
    cJSON_AddNumberToObject(o, "version_max", (double)vmax);
    cJSON_AddNumberToObject(o, "rollbacks", (double)s->rollbacks);
    /* Checkpoints: versions of durable files only; failed writes counted. */
    cJSON_AddNumberToObject(o, "aligned_checkpoint_version", (double)s->aligned_v);
    cJSON_AddNumberToObject(o, "checkpoint_version", s->have_ckpt ? (double)s->ckpt_version : -1.0);
    cJSON_AddNumberToObject(o, "checkpoint_writes", (double)s->mx.ckpt_writes);
    cJSON_AddNumberToObject(o, "checkpoint_failures", (double)s->mx.ckpt_failures);
    cJSON_AddStringToObject(o, "checkpoint_last_error", s->mx.ckpt_error);
    cJSON_AddNumberToObject(o, "checkpoint_last_error_time", s->mx.ckpt_fail_time);
    cJSON_AddNumberToObject(o, "updates", (double)s->mx.updates);
    cJSON_AddNumberToObject(o, "skipped_updates", (double)s->mx.skipped);
    cJSON *sk = cJSON_AddArrayToObject(o, "skipped_steps");
    for (size_t i = 0; sk && i < s->st.nskips; i++)
        cJSON_AddItemToArray(sk, cJSON_CreateNumber((double)s->st.skips[i]));
    cJSON_AddNumberToObject(o, "bytes_in", (double)s->mx.bytes_in);
    cJSON_AddNumberToObject(o, "bytes_out", (double)s->mx.bytes_out);
    cJSON_AddNumberToObject(o, "msgs_in", (double)s->mx.msgs_in);
    cJSON_AddNumberToObject(o, "msgs_out", (double)s->mx.msgs_out);
    cJSON_AddNumberToObject(o, "dropped_replies", (double)s->mx.dropped_replies);
    cJSON_AddNumberToObject(o, "weights_copied", (double)s->mx.weights_cow);
    cJSON_AddNumberToObject(o, "weights_left_to_replies", (double)s->mx.weights_left);
    cJSON_AddNumberToObject(o, "peer_disconnects", (double)s->mx.disconnects);
    cJSON_AddNumberToObject(o, "max_msg_bytes", (double)s->maxmsg);
    ps_http_stats_t hs;
    ps_http_stats(s->http, &hs);
    cJSON_AddNumberToObject(o, "http_connections", hs.connections);
    cJSON_AddNumberToObject(o, "http_timeouts", (double)hs.timeouts);
    cJSON_AddNumberToObject(o, "http_rejected", (double)hs.rejected);
    cJSON_AddNumberToObject(o, "errors", (double)error_count(s));
    cJSON_AddNumberToObject(o, "live_workers", psd_members_live_count(s));
    cJSON_AddNumberToObject(o, "num_workers", s->w0);
    if (s->nepochs) { /* elastic: the membership, and how many are in it now */
        char *ej = psd_elastic_json(s);
        cJSON *ea = ej ? cJSON_Parse(ej) : NULL;
        free(ej);
        if (ea) cJSON_AddItemToObject(o, "epochs", ea);
        cJSON_AddNumberToObject(o, "max_workers", s->nworkers);
        cJSON_AddNumberToObject(o, "active_workers", psd_elastic_count(s, UINT64_MAX));
    }
    cJSON_AddNumberToObject(o, "owned_partitions", s->st.nowned);
    cJSON_AddBoolToObject(o, "from_checkpoint", s->st.from_ckpt);
    if (s->st.have_table) {
        char h[24];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)s->st.table.hash);
        cJSON_AddStringToObject(o, "table_hash", h);
    }
    cJSON_AddStringToObject(o, "on_worker_loss", s->o.loss_continue ? "continue" : "wait");
    /* false: no barrier released, no push yet; no worker can be lost before */
    cJSON_AddBoolToObject(o, "job_started", s->job_started);
    cJSON_AddBoolToObject(o, "curve", s->o.curve != 0);
    cJSON_AddBoolToObject(o, "shutting_down", s->shutting != 0);
    cJSON_AddBoolToObject(o, "checkpoint_in_flight", s->ckpt_job != NULL);
    /* Members as this server sees them (server 0 also knows hosts from
     * HELLO); last_seen_ms_ago is -1 for a rank never heard from. */
    cJSON *ws = cJSON_AddArrayToObject(o, "workers");
    uint64_t now = s->loop ? uv_now(s->loop) : 0;
    for (int r = 0; ws && r < s->nworkers; r++) {
        const psd_worker_t *w = &s->workers[r];
        static const char *const names[] = {"unknown", "live", "lost", "left", "done", "failed"};
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddNumberToObject(e, "rank", r);
        cJSON_AddStringToObject(e, "state", names[w->state]);
        cJSON_AddStringToObject(e, "host", w->host);
        cJSON_AddNumberToObject(e, "last_seen_ms_ago",
                                w->state == PSD_W_UNKNOWN ? -1.0 : (double)(now - w->last_seen_ms));
        cJSON_AddNumberToObject(e, "steps", (double)w->steps);
        cJSON_AddNumberToObject(e, "behind_s", psd_late_seconds(s, r));
        if (w->refused[0]) cJSON_AddStringToObject(e, "hello_refused", w->refused);
        cJSON_AddItemToArray(ws, e);
    }
    char late[512];
    psd_late_describe(s, late, sizeof late);
    if (late[0]) cJSON_AddStringToObject(o, "late", late);
    if (s->job_failed) cJSON_AddStringToObject(o, "job_failed", s->fail_text);
    /* The INIT spec (psctl export rebuilds the table from it); left out if
     * it would not fit in a reply header. */
    if (s->st.spec_json && strlen(s->st.spec_json) < PS_WIRE_MAX_HEADER / 2)
        cJSON_AddStringToObject(o, "spec", s->st.spec_json);
    cJSON_AddNumberToObject(o, "aggregation_seconds", s->mx.agg_seconds);
    cJSON_AddNumberToObject(o, "apply_seconds", s->mx.apply_seconds);
    if (preflight) psd_preflight_add(s, o);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return txt;
}

void psd_stats_log(psd_t *s)
{
    ps_info("stats: %llu updates, in %.1f MiB, out %.1f MiB, %d/%d workers live, %llu errors "
            "(%llu failed checkpoint writes), sum %.3f s, apply %.3f s, weights copied %llu times "
            "(send in flight)",
            (unsigned long long)s->mx.updates, s->mx.bytes_in / 1048576.0,
            s->mx.bytes_out / 1048576.0, psd_members_live_count(s), s->nworkers,
            (unsigned long long)error_count(s), (unsigned long long)s->mx.ckpt_failures,
            s->mx.agg_seconds,
            s->mx.apply_seconds, (unsigned long long)s->mx.weights_cow);
    /* Load-independent cost figures (wall clock is useless on a shared
     * machine): CPU time and page faults of the whole process, all threads. */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        ps_info("rusage: user %.3f s, sys %.3f s, minflt %ld, majflt %ld, vcsw %ld, ivcsw %ld, "
                "maxrss %ld KiB",
                ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
                ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6, ru.ru_minflt, ru.ru_majflt,
                ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_maxrss);
}

/* ---- /metrics (common/ps_http.c serves it) ---- */

static size_t render(void *arg, const ps_http_stats_t *st, char *buf, size_t cap)
{
    const psd_t *s = arg;
    const ps_http_stats_t hs = *st;
    size_t n = 0;
#define P(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__))
    P("# HELP psd_bytes_in_total Bytes received (headers and payloads).\n"
      "# TYPE psd_bytes_in_total counter\npsd_bytes_in_total %llu\n",
      (unsigned long long)s->mx.bytes_in);
    P("# HELP psd_bytes_out_total Bytes sent (headers and payloads).\n"
      "# TYPE psd_bytes_out_total counter\npsd_bytes_out_total %llu\n",
      (unsigned long long)s->mx.bytes_out);
    P("# HELP psd_messages_in_total Messages received.\n"
      "# TYPE psd_messages_in_total counter\npsd_messages_in_total %llu\n",
      (unsigned long long)s->mx.msgs_in);
    P("# HELP psd_updates_total Partition updates applied (version bumps).\n"
      "# TYPE psd_updates_total counter\npsd_updates_total %llu\n",
      (unsigned long long)s->mx.updates);
    P("# HELP psd_skipped_updates_total Updates skipped for loss-scale overflow.\n"
      "# TYPE psd_skipped_updates_total counter\npsd_skipped_updates_total %llu\n",
      (unsigned long long)s->mx.skipped);
    P("# HELP psd_live_workers Workers currently considered live.\n"
      "# TYPE psd_live_workers gauge\npsd_live_workers %d\n", psd_members_live_count(s));
    P("# HELP psd_rank_behind_seconds How long a rank has kept this server waiting (a sync "
      "step or a barrier it has not reached; 0: not late).\n"
      "# TYPE psd_rank_behind_seconds gauge\n");
    for (int r = 0; r < s->nworkers; r++)
        P("psd_rank_behind_seconds{rank=\"%d\"} %.3f\n", r, psd_late_seconds(s, r));
    P("# HELP psd_job_failed 1 when a worker's failure stopped the job (STATS job_failed says why).\n"
      "# TYPE psd_job_failed gauge\npsd_job_failed %d\n", s->job_failed);
    P("# HELP psd_aggregation_seconds Time summing worker gradients.\n"
      "# TYPE psd_aggregation_seconds summary\npsd_aggregation_seconds_sum %.9f\n"
      "psd_aggregation_seconds_count %llu\n",
      s->mx.agg_seconds, (unsigned long long)s->mx.agg_count);
    P("# HELP psd_apply_seconds Time in the optimizer step.\n"
      "# TYPE psd_apply_seconds summary\npsd_apply_seconds_sum %.9f\npsd_apply_seconds_count %llu\n",
      s->mx.apply_seconds, (unsigned long long)s->mx.apply_count);
    P("# HELP psd_dropped_replies_total Replies dropped (peer gone or not reading).\n"
      "# TYPE psd_dropped_replies_total counter\npsd_dropped_replies_total %llu\n",
      (unsigned long long)s->mx.dropped_replies);
    P("# HELP psd_peer_disconnects_total Peer connections closed (gone, or dropped by ZeroMQ for "
      "a message over psd_max_message_bytes).\n"
      "# TYPE psd_peer_disconnects_total counter\npsd_peer_disconnects_total %llu\n",
      (unsigned long long)s->mx.disconnects);
    P("# HELP psd_max_message_bytes ZMQ_MAXMSGSIZE: larger frames end the sender's connection.\n"
      "# TYPE psd_max_message_bytes gauge\npsd_max_message_bytes %lld\n", (long long)s->maxmsg);
    P("# HELP psd_http_connections Open connections to this /metrics listener.\n"
      "# TYPE psd_http_connections gauge\npsd_http_connections %d\n", hs.connections);
    P("# HELP psd_http_timeouts_total /metrics connections closed for not completing their "
      "request within %d ms.\n"
      "# TYPE psd_http_timeouts_total counter\npsd_http_timeouts_total %llu\n",
      PS_HTTP_DEADLINE_MS, (unsigned long long)hs.timeouts);
    P("# HELP psd_http_rejected_total /metrics connections closed at accept (%d already open).\n"
      "# TYPE psd_http_rejected_total counter\npsd_http_rejected_total %llu\n",
      PS_HTTP_MAX_CONNS, (unsigned long long)hs.rejected);
    P("# HELP psd_checkpoint_writes_total Checkpoint files made durable (fsync'd, renamed into place).\n"
      "# TYPE psd_checkpoint_writes_total counter\npsd_checkpoint_writes_total %llu\n",
      (unsigned long long)s->mx.ckpt_writes);
    P("# HELP psd_checkpoint_failures_total Checkpoint writes that failed (nothing saved; the "
      "cause is in the log and STATS checkpoint_last_error).\n"
      "# TYPE psd_checkpoint_failures_total counter\npsd_checkpoint_failures_total %llu\n",
      (unsigned long long)s->mx.ckpt_failures);
    P("# HELP psd_checkpoint_last_failure_timestamp_seconds Unix time of the last failed checkpoint "
      "write (0: none).\n# TYPE psd_checkpoint_last_failure_timestamp_seconds gauge\n"
      "psd_checkpoint_last_failure_timestamp_seconds %.3f\n", s->mx.ckpt_fail_time);
    P("# HELP psd_aligned_checkpoint_version Version of the newest durable aligned checkpoint "
      "(what a rollback can restore; 0: none).\n# TYPE psd_aligned_checkpoint_version gauge\n"
      "psd_aligned_checkpoint_version %llu\n", (unsigned long long)s->aligned_v);
    P("# HELP psd_errors_total Errors: ERROR replies sent, by code, and failed checkpoint writes "
      "(code=\"checkpoint_write\").\n# TYPE psd_errors_total counter\n");
    for (int i = 1; i < PSD_NERR; i++)
        if (s->mx.errors[i]) P("psd_errors_total{code=\"%s\"} %llu\n", ps_errname(-i),
                               (unsigned long long)s->mx.errors[i]);
    if (s->mx.errors[0]) P("psd_errors_total{code=\"other\"} %llu\n", (unsigned long long)s->mx.errors[0]);
    if (s->mx.ckpt_failures)
        P("psd_errors_total{code=\"checkpoint_write\"} %llu\n", (unsigned long long)s->mx.ckpt_failures);
#undef P
    return n;
}

int psd_metrics_start(psd_t *s)
{
    if (s->o.metrics_port <= 0) return 0;
    return ps_http_start(&s->http, s->loop, s->o.metrics_bind, s->o.metrics_port, render, s);
}

/* The listener and every open connection (freed by the loop's last run). */
void psd_metrics_stop(psd_t *s)
{
    ps_http_stop(&s->http);
}
