/* psctl: operate a running psd cluster (docs/operations.md, section 4).
 *
 *   psctl --servers LIST status        members, versions, throughput, live workers
 *   psctl --servers LIST checkpoint    every server writes a checkpoint now
 *   psctl --servers LIST export FILE   pull every partition -> FILE.safetensors
 *   psctl --servers LIST export --onnx --model M FILE   ... -> FILE.onnx
 *                                      (psctl_export.c)
 *   psctl --servers LIST shutdown      checkpoint (if configured) and stop
 *   psctl --servers LIST drain RANK    an elastic job lets RANK go
 *   psctl --servers LIST check         preflight: what is wrong, what to fix
 *                                      (psctl_check.c)
 *   psctl keygen PREFIX                CURVE key pair: PREFIX.pub, PREFIX.key
 *   psctl plot DIR                     PNG plots of a psworker run directory
 *
 * psctl talks to the servers with the same client library as psworker, but
 * never says HELLO: it takes no rank, so it does not count as a worker,
 * sends no heartbeats and holds up no barrier.  Exit status: 0 success,
 * 1 a server failed or could not be reached, 2 bad usage. */
#include "config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "worker/client/ps_client.h"
#include "worker/tools/psctl_check.h"
#include "ps_config.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_partition.h"
#include "worker/plot/ps_plot.h"
#include "worker/tools/psctl_internal.h"

#define PSCTL_MAX_SERVERS 1024

static const char usage[] =
    "[--config FILE] [--servers tcp://H:P[,...]] VERB [ARG]\n"
    "Operate a running psd cluster.  Verbs:\n"
    "  status          per server: mode, versions, updates, live workers, traffic;\n"
    "                  rates over --interval-ms (0: one sample, no rates)\n"
    "  checkpoint      every server (or --server N) writes a checkpoint now\n"
    "  export FILE     pull every partition and write the model as safetensors\n"
    "                  (needs --spec: the INIT spec JSON or a psd checkpoint file);\n"
    "                  --onnx --model M [--frames T --size S]: as an ONNX graph\n"
    "  shutdown        every server checkpoints (when configured) and exits\n"
    "  drain RANK      an elastic job (psd --max-workers) lets RANK go at its next\n"
    "                  step boundary; the others go on (SIGTERM on a worker does it too)\n"
    "  check           preflight: every server answers, ids, sizes, modes, CURVE,\n"
    "                  checkpoint directories (writable, room for a checkpoint: --spec),\n"
    "                  clocks; prints what to fix, exit 1 on any problem\n"
    "  keygen PREFIX   CURVE key pair: PREFIX.pub (Z85 public key), PREFIX.key\n"
    "                  (Z85 secret key, mode 0600)\n"
    "  plot DIR        PNG plots of a psworker run directory (--out) into DIR/plots\n"
    "                  from its CSV files (needs gnuplot)\n"
    "CURVE (psd --curve): --curve-server-key FILE[,FILE...] (one shared, or one per\n"
    "server) with --curve-public-key FILE --curve-secret-key FILE (psctl keygen).\n"
    "--servers defaults to $PSCTL_SERVERS.  Exit status: 0 ok, 1 a server failed\n"
    "or did not answer, 2 bad usage.";

/* ---- servers and client --------------------------------------------------- */

static int split_servers(psctl_t *p)
{
    const char *s = p->o.servers;
    if (!s || !*s) s = getenv("PSCTL_SERVERS");
    if (!s || !*s) {
        fprintf(stderr, "psctl: give --servers tcp://HOST:PORT[,...] (or set PSCTL_SERVERS)\n");
        return PS_EINVAL;
    }
    char *copy = strdup(s), *save = NULL;
    p->ep = calloc(PSCTL_MAX_SERVERS, sizeof *p->ep);
    if (!copy || !p->ep) {
        free(copy);
        return PS_ENOMEM;
    }
    for (char *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (p->nserv == PSCTL_MAX_SERVERS) {
            fprintf(stderr, "psctl: more than %d servers\n", PSCTL_MAX_SERVERS);
            free(copy);
            return PS_EINVAL;
        }
        if (strncmp(tok, "tcp://", 6) && strncmp(tok, "ipc://", 6)) {
            fprintf(stderr, "psctl: --servers: \"%s\" is not tcp://HOST:PORT or ipc://PATH\n", tok);
            free(copy);
            return PS_EINVAL;
        }
        if (!(p->ep[p->nserv++] = strdup(tok))) {
            free(copy);
            return PS_ENOMEM;
        }
    }
    free(copy);
    if (!p->nserv) {
        fprintf(stderr, "psctl: --servers lists no server\n");
        return PS_EINVAL;
    }
    return 0;
}

/* --curve-server-key: one file for every server, or one per server. */
static int split_keys(psctl_t *p)
{
    const psctl_opts_t *o = &p->o;
    int any = *o->curve_server_key || *o->curve_public_key || *o->curve_secret_key;
    if (!any) return 0;
    if (!*o->curve_server_key || !*o->curve_public_key || !*o->curve_secret_key) {
        fprintf(stderr, "psctl: CURVE needs --curve-server-key, --curve-public-key and "
                        "--curve-secret-key together\n");
        return PS_EINVAL;
    }
    char *copy = strdup(o->curve_server_key), *save = NULL;
    p->skeys = calloc((size_t)p->nserv + 1, sizeof *p->skeys);
    if (!copy || !p->skeys) {
        free(copy);
        return PS_ENOMEM;
    }
    int rc = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        if (p->nskeys > p->nserv) break;
        if (!(p->skeys[p->nskeys++] = strdup(tok))) rc = PS_ENOMEM;
    }
    free(copy);
    if (!rc && p->nskeys != 1 && p->nskeys != p->nserv) {
        fprintf(stderr, "psctl: --curve-server-key lists %d files for %d servers (give one shared "
                        "file, or one per server)\n", p->nskeys, p->nserv);
        rc = PS_EINVAL;
    }
    return rc;
}

/* CURVE options of a client for every server (s < 0) or server s alone. */
static void set_curve(const psctl_t *p, ps_client_opts_t *co, int s)
{
    if (!p->nskeys) return;
    co->curve_server_keys = (const char *const *)(s < 0 || p->nskeys == 1 ? p->skeys : p->skeys + s);
    co->ncurve_server_keys = s < 0 ? p->nskeys : 1;
    co->curve_public_key = p->o.curve_public_key;
    co->curve_secret_key = p->o.curve_secret_key;
}

/* Connect with the current table (a one-element stand-in for control verbs:
 * the client needs a table, but control messages never name a partition). */
int psctl_connect(psctl_t *p)
{
    int rc;
    if (!p->table.nparts) {
        ps_tensor_spec_t one = {"psctl", 1, 0};
        if ((rc = ps_partition_table_build(&p->table, &one, 1, 4, (uint32_t)p->nserv))) return rc;
    }
    ps_client_opts_t co;
    ps_client_opts_default(&co);
    co.servers = (const char *const *)p->ep;
    co.nservers = p->nserv;
    co.rank = -1;           /* no HELLO: not a worker */
    co.heartbeat_ms = 0;
    co.timeout_ms = p->o.timeout_ms;
    /* CHECKPOINT and SHUTDOWN are not idempotent enough to resend blindly;
     * ZeroMQ queues requests until the connection is up anyway. */
    co.retry_ms = 0;
    set_curve(p, &co, -1);
    if ((rc = ps_client_new(&p->c, &co, &p->table))) {
        fprintf(stderr, "psctl: cannot set up the client: %s\n", ps_strerror(rc));
        return rc;
    }
    return 0;
}

cJSON *psctl_stats(psctl_t *p, int s)
{
    char *txt = NULL;
    int rc = ps_client_stats(p->c, s, &txt);
    if (rc) {
        fprintf(stderr, "psctl: server %d (%s): STATS failed: %s%s%s\n", s, p->ep[s],
                ps_strerror(rc), rc == PS_ETIMEOUT ? "" : ": ",
                rc == PS_ETIMEOUT ? "" : ps_client_last_error(p->c));
        return NULL;
    }
    cJSON *j = cJSON_Parse(txt);
    if (!j || !cJSON_IsObject(j))
        fprintf(stderr, "psctl: server %d: STATS reply is not a JSON object: %.200s\n", s, txt);
    free(txt);
    if (j && !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        j = NULL;
    }
    return j;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

const char *psctl_json_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "-";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- status ------------------------------------------------------------- */

static int in_scope(const psctl_t *p, int s)
{
    return p->o.server < 0 || p->o.server == s;
}

static int cmd_status(psctl_t *p)
{
    cJSON **a = calloc((size_t)p->nserv, sizeof *a), **b = calloc((size_t)p->nserv, sizeof *b);
    int failed = 0;
    if (!a || !b) return PS_ENOMEM;
    double t0 = now_s(), t1 = t0;
    for (int s = 0; s < p->nserv; s++)
        if (in_scope(p, s) && !(a[s] = psctl_stats(p, s))) failed++;
    if (p->o.interval_ms > 0 && failed < p->nserv) {
        struct timespec ts = {p->o.interval_ms / 1000, (p->o.interval_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        t1 = now_s();
        for (int s = 0; s < p->nserv; s++)
            if (a[s]) b[s] = psctl_stats(p, s);
    }
    if (p->o.json) {
        cJSON *out = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(out, "servers");
        for (int s = 0; s < p->nserv; s++) {
            if (!in_scope(p, s)) continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "endpoint", p->ep[s]);
            cJSON_AddBoolToObject(e, "up", a[s] != NULL);
            if (a[s]) cJSON_AddItemToObject(e, "stats", cJSON_Duplicate(a[s], 1));
            if (a[s] && b[s] && t1 > t0) {
                double dt = t1 - t0;
                cJSON_AddNumberToObject(e, "updates_per_s", (num(b[s], "updates") - num(a[s], "updates")) / dt);
                cJSON_AddNumberToObject(e, "bytes_in_per_s", (num(b[s], "bytes_in") - num(a[s], "bytes_in")) / dt);
                cJSON_AddNumberToObject(e, "bytes_out_per_s", (num(b[s], "bytes_out") - num(a[s], "bytes_out")) / dt);
            }
            cJSON_AddItemToArray(arr, e);
        }
        char *txt = cJSON_Print(out);
        printf("%s\n", txt ? txt : "{}");
        free(txt);
        cJSON_Delete(out);
    } else {
        /* Server 0 keeps membership: its counts are the cluster's. */
        const cJSON *m = a[0] ? a[0] : NULL;
        printf("cluster: %d server(s)", p->nserv);
        if (m)
            printf(", mode %s, table %s, workers %.0f/%.0f live", psctl_json_str(m, "mode"),
                   psctl_json_str(m, "table_hash"), num(m, "live_workers"),
                   isnan(num(m, "active_workers")) ? num(m, "num_workers") : num(m, "active_workers"));
        if (m && !isnan(num(m, "active_workers")))
            printf(" (elastic: %.0f in the job now, started with %.0f, at most %.0f)",
                   num(m, "active_workers"), num(m, "num_workers"), num(m, "max_workers"));
        printf("\n");
        const char *hash0 = NULL;
        for (int s = 0; s < p->nserv; s++) {
            if (!in_scope(p, s)) continue;
            if (!a[s]) {
                printf("server %d  %s  DOWN (no answer)\n", s, p->ep[s]);
                continue;
            }
            const cJSON *x = a[s];
            printf("server %d  %s  up  version %.0f..%.0f  updates %.0f (skipped %.0f)  "
                   "partitions %.0f  workers %.0f/%.0f  in %.1f MiB  out %.1f MiB  errors %.0f%s",
                   s, p->ep[s], num(x, "version"), num(x, "version_max"), num(x, "updates"),
                   num(x, "skipped_updates"), num(x, "owned_partitions"), num(x, "live_workers"),
                   num(x, "num_workers"), num(x, "bytes_in") / 1048576.0,
                   num(x, "bytes_out") / 1048576.0, num(x, "errors"),
                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "from_checkpoint"))
                       ? "  (resumed from checkpoint)" : "");
            if (b[s] && t1 > t0) {
                double dt = t1 - t0;
                printf("  | %.1f updates/s  in %.2f MiB/s  out %.2f MiB/s",
                       (num(b[s], "updates") - num(x, "updates")) / dt,
                       (num(b[s], "bytes_in") - num(x, "bytes_in")) / dt / 1048576.0,
                       (num(b[s], "bytes_out") - num(x, "bytes_out")) / dt / 1048576.0);
            }
            printf("\n");
            /* what the server waits for, and a failure that stopped the job */
            const char *late = psctl_json_str(x, "late"), *fail = psctl_json_str(x, "job_failed");
            if (strcmp(late, "-")) printf("  %s\n", late);
            if (strcmp(fail, "-")) printf("  JOB STOPPED: %s\n", fail);
            const char *h = psctl_json_str(x, "table_hash");
            if (strcmp(h, "-")) {
                if (hash0 && strcmp(hash0, h))
                    printf("WARNING: server %d has table %s, another server %s\n", s, h, hash0);
                if (!hash0) hash0 = h;
            }
        }
    }
    for (int s = 0; s < p->nserv; s++) cJSON_Delete(a[s]), cJSON_Delete(b[s]);
    free(a);
    free(b);
    return failed ? PS_EIO : 0;
}

/* ---- checkpoint / shutdown ------------------------------------------------ */

static int cmd_checkpoint(psctl_t *p)
{
    int failed = 0;
    for (int s = 0; s < p->nserv; s++) {
        if (!in_scope(p, s)) continue;
        int rc = ps_client_checkpoint(p->c, s);
        if (rc) {
            fprintf(stderr, "psctl: server %d (%s): CHECKPOINT failed: %s: %s\n", s, p->ep[s],
                    ps_strerror(rc), rc == PS_ETIMEOUT ? "no answer" : ps_client_last_error(p->c));
            failed++;
        } else {
            printf("server %d: checkpoint written\n", s);
        }
    }
    return failed ? PS_EIO : 0;
}

/* SHUTDOWN server by server, each on its own connection.  A server closes
 * its socket right after the ACK, and that ACK can be lost with the
 * connection (seen with libzmq: the reply is dropped when the peer's
 * disconnect is processed before it is read).  So an unanswered SHUTDOWN
 * is checked by probing the endpoint: nothing listening = it stopped.
 * Re-sending is harmless (a stopping server reads no further message). */
static int cmd_shutdown(psctl_t *p)
{
    int failed = 0, level = ps_log_level;
    /* the client's "no reply" warning is expected here: judged below */
    if (level < PS_LOG_INFO) ps_log_level = PS_LOG_ERROR;
    for (int s = 0; s < p->nserv; s++) {
        ps_tensor_spec_t one = {"psctl", 1, 0};
        ps_partition_table_t t1;
        ps_client_t *c = NULL;
        ps_client_opts_t co;
        ps_client_opts_default(&co);
        co.servers = (const char *const *)&p->ep[s];
        co.nservers = 1;
        co.rank = -1;
        co.heartbeat_ms = 0;
        co.retry_ms = 0;
        co.timeout_ms = p->o.timeout_ms < 1000 ? p->o.timeout_ms : 1000;
        set_curve(p, &co, s);
        int rc = ps_partition_table_build(&t1, &one, 1, 4, 1);
        if (!rc) rc = ps_client_new(&c, &co, &t1);
        int state = rc ? -2 : -1; /* -2 error, -1 unknown, 0 acked, 1 gone */
        double t_end = now_s() + p->o.timeout_ms / 1000.0;
        while (state == -1) {
            rc = ps_client_shutdown_servers(c);
            if (rc == 0) state = 0;
            else if (rc != PS_ETIMEOUT) state = -2;
            else if (psctl_endpoint_down(p->ep[s]) == 1) state = 1;
            else if (now_s() >= t_end) break;
        }
        if (state == 0) printf("server %d: SHUTDOWN acknowledged\n", s);
        else if (state == 1) printf("server %d: stopped (no longer listening)\n", s);
        else {
            fprintf(stderr, "psctl: server %d (%s): SHUTDOWN failed: %s: %s\n", s, p->ep[s],
                    ps_strerror(rc), rc == PS_ETIMEOUT ? "no answer" : ps_client_last_error(c));
            failed++;
        }
        ps_client_destroy(&c);
        ps_partition_table_free(&t1);
    }
    ps_log_level = level;
    return failed ? PS_EIO : 0;
}

/* ---- drain --------------------------------------------------------------- */

/* An elastic job lets rank R go at the next step boundary (server 0). */
static int cmd_drain(psctl_t *p, const char *arg)
{
    char *end;
    long r = strtol(arg, &end, 10);
    if (*end || r < 0 || r > 65535) {
        fprintf(stderr, "psctl: drain RANK: \"%s\" is not a rank\n", arg);
        return PS_EINVAL;
    }
    uint64_t from = 0;
    int rc = ps_client_drain(p->c, (int)r, &from);
    if (rc) {
        fprintf(stderr, "psctl: drain %ld: %s: %s\n", r, ps_strerror(rc), ps_client_last_error(p->c));
        return rc;
    }
    printf("rank %ld leaves the job at step %llu (the others go on)\n", r, (unsigned long long)from);
    return 0;
}

/* ---- check ---------------------------------------------------------------- */

static int cmd_check(psctl_t *p)
{
    int rc = 0;
    if (p->o.spec && *p->o.spec) { /* the model's table: the room a checkpoint needs */
        char *spec = psctl_spec_load(p);
        ps_client_destroy(&p->c);
        rc = spec ? psctl_spec_table(p, spec) : PS_EINVAL;
        free(spec);
        if (rc || (rc = psctl_connect(p))) return rc;
    }
    psctl_check_in_t in = {.c = p->c, .ep = p->ep, .nserv = p->nserv,
                           .num_workers = p->o.num_workers,
                           .table = p->o.spec && *p->o.spec ? &p->table : NULL,
                           .max_skew_ms = p->o.max_skew_ms};
    return psctl_check(&in);
}

/* ---- keygen --------------------------------------------------------------- */

/* Write text to path created with `mode` (never wider: O_EXCL unless force,
 * fchmod in case the file existed), fsync'd. */
static int write_key(const char *path, const char *text, mode_t mode, int force)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL), mode);
    if (fd < 0) {
        fprintf(stderr, "psctl: keygen: %s: %s%s\n", path, strerror(errno),
                errno == EEXIST ? " (use --force to overwrite)" : "");
        return PS_EIO;
    }
    size_t n = strlen(text);
    int rc = fchmod(fd, mode) || write(fd, text, n) != (ssize_t)n || fsync(fd) ? PS_EIO : 0;
    if (rc) fprintf(stderr, "psctl: keygen: %s: %s\n", path, strerror(errno));
    if (close(fd) && !rc) rc = PS_EIO;
    return rc;
}

static int cmd_keygen(psctl_t *p, const char *prefix)
{
    char pub[41], sec[41], path[4096], line[64];
    if (!zmq_has("curve")) {
        fprintf(stderr, "psctl: keygen: this libzmq was built without CURVE support\n");
        return PS_EUNSUPPORTED;
    }
    if (zmq_curve_keypair(pub, sec)) {
        fprintf(stderr, "psctl: keygen: zmq_curve_keypair: %s\n", zmq_strerror(errno));
        return PS_EZMQ;
    }
    if (snprintf(path, sizeof path, "%s.key", prefix) >= (int)sizeof path) return PS_EINVAL;
    snprintf(line, sizeof line, "%s\n", sec);
    int rc = write_key(path, line, 0600, p->o.force);
    memset(sec, 0, sizeof sec);
    memset(line, 0, sizeof line);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s.pub", prefix);
    snprintf(line, sizeof line, "%s\n", pub);
    if ((rc = write_key(path, line, 0644, p->o.force))) return rc;
    printf("public key %s\nwrote %s.pub and %s.key (secret, mode 0600)\n", pub, prefix, prefix);
    return 0;
}

/* ---- main ----------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static psctl_t p;
    psctl_opts_t *o = &p.o;
    int npos = 0, rc;
    const ps_opt_t opts[] = {
        {"servers", PS_OPT_STRING, &o->servers, "psd endpoints, server 0 first (default: $PSCTL_SERVERS)", ""},
        {"timeout-ms", PS_OPT_INT, &o->timeout_ms, "give up on a server after this long", "10000"},
        {"interval-ms", PS_OPT_INT, &o->interval_ms, "status: measure rates over this interval (0: off)", "1000"},
        {"server", PS_OPT_INT, &o->server, "status / checkpoint: only this server (-1: all)", "-1"},
        {"json", PS_OPT_BOOL, &o->json, "status: print the STATS replies as JSON", "false"},
        {"spec", PS_OPT_STRING, &o->spec, "export: model spec JSON file or psd checkpoint", ""},
        {"like", PS_OPT_STRING, &o->like, "export: take tensor shapes from this safetensors file "
         "(--onnx: the full model file, for tensors the servers do not hold)", ""},
        {"onnx", PS_OPT_BOOL, &o->onnx, "export: write the model as ONNX (needs --model)", "false"},
        {"model", PS_OPT_STRING, &o->model, "export --onnx: tsm-r18|34|50, tsn-r18|34|50, retinanet-r18|34|50", ""},
        {"frames", PS_OPT_INT, &o->frames, "export --onnx: segments T of a video model", "8"},
        {"size", PS_OPT_INT, &o->size, "export --onnx: input size H = W", "224"},
        {"shift-place", PS_OPT_STRING, &o->shift_place, "export --onnx: TSM shift placement blockres|block", "blockres"},
        {"shift-div", PS_OPT_INT, &o->shift_div, "export --onnx: TSM shift 1/N each way", "8"},
        {"force", PS_OPT_BOOL, &o->force, "keygen: overwrite existing key files", "false"},
        {"num-workers", PS_OPT_INT, &o->num_workers, "check: the workers' --num-workers (0: not checked)", "0"},
        {"max-clock-skew-ms", PS_OPT_INT, &o->max_skew_ms, "check: largest clock difference to a server", "2000"},
        {"log-level", PS_OPT_STRING, &o->log_level, "error | warn | info | debug", "warn"},
        {"curve-server-key", PS_OPT_STRING, &o->curve_server_key,
         "CURVE: servers' public key file (one shared, or FILE,FILE,... per server)", ""},
        {"curve-public-key", PS_OPT_STRING, &o->curve_public_key, "CURVE: this client's public key file", ""},
        {"curve-secret-key", PS_OPT_STRING, &o->curve_secret_key, "CURVE: this client's secret key file", ""},
        {0},
    };
    if (ps_config_defaults(opts)) return 2;
    ps_log_set_prog("psctl");
    rc = ps_config_parse(opts, "psctl", usage, argc, argv, &npos);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    if (ps_log_set_level_str(o->log_level)) {
        fprintf(stderr, "psctl: --log-level %s: want error|warn|info|debug\n", o->log_level);
        return 2;
    }
    if (npos < 1) {
        fprintf(stderr, "psctl: no verb given (status, checkpoint, export, shutdown, keygen, plot; see --help)\n");
        return 2;
    }
    const char *verb = argv[1], *arg = npos >= 2 ? argv[2] : NULL;
    int want_arg = !strcmp(verb, "export") || !strcmp(verb, "keygen") || !strcmp(verb, "plot") ||
                   !strcmp(verb, "drain");
    if (strcmp(verb, "status") && strcmp(verb, "checkpoint") && strcmp(verb, "shutdown") &&
        strcmp(verb, "check") && !want_arg) {
        fprintf(stderr, "psctl: unknown verb \"%s\" (status, checkpoint, export, shutdown, check, "
                        "drain, keygen, plot)\n", verb);
        return 2;
    }
    if (npos != 1 + want_arg) {
        fprintf(stderr, "psctl: %s %s\n", verb,
                want_arg ? "takes one argument (a file name, prefix or directory)" : "takes no argument");
        return 2;
    }
    if (o->timeout_ms < 1 || o->interval_ms < 0 || o->server < -1) {
        fprintf(stderr, "psctl: need --timeout-ms >= 1, --interval-ms >= 0, --server >= -1\n");
        return 2;
    }
    ps_plot_report_t rep;
    if (!strcmp(verb, "keygen")) {
        rc = cmd_keygen(&p, arg);
    } else if (!strcmp(verb, "plot")) { /* no servers: the run directory's CSV files */
        if (!(rc = ps_plot_run(arg, &rep))) ps_plot_report_print(&rep, stdout);
    } else {
        if ((rc = split_servers(&p)) || (rc = split_keys(&p))) return 2;
        if (o->server >= p.nserv) {
            fprintf(stderr, "psctl: --server %d but only %d server(s) listed\n", o->server, p.nserv);
            return 2;
        }
        if (!(rc = psctl_connect(&p))) {
            if (!strcmp(verb, "status")) rc = cmd_status(&p);
            else if (!strcmp(verb, "checkpoint")) rc = cmd_checkpoint(&p);
            else if (!strcmp(verb, "check")) rc = cmd_check(&p);
            else if (!strcmp(verb, "drain")) rc = cmd_drain(&p, arg);
            else if (!strcmp(verb, "shutdown")) {
                ps_client_destroy(&p.c); /* one connection per server instead */
                rc = cmd_shutdown(&p);
            }
            else rc = psctl_export(&p, arg);
        }
        ps_client_destroy(&p.c);
        ps_partition_table_free(&p.table);
    }
    for (int s = 0; s < p.nserv; s++) free(p.ep[s]);
    for (int k = 0; k < p.nskeys; k++) free(p.skeys[k]);
    free(p.skeys);
    free(p.ep);
    ps_config_free(opts);
    return rc == 0 ? 0 : rc == PS_EINVAL ? 2 : 1;
}
