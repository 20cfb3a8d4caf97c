/* psctl check: a preflight of the servers before a job (or of a running
 * one).  Each server in --servers is asked for STATS with
 * PS_FLAG_PREFLIGHT (server/psd_preflight.c) and every line printed says
 * what was checked and, for a problem, what to fix:
 *   - it answers (else: nothing listens there, it does not resolve, or it
 *     listens but stays silent: CURVE keys not accepted, or not a psd);
 *   - it is the server its position says (--server-id = its place in
 *     --servers, ids distinct), and its --num-servers is the list's length;
 *   - the cluster agrees: --num-workers (and psctl's own --num-workers),
 *     --mode, --curve, --checkpoint-every-steps, the table once a job runs;
 *   - its checkpoint directory takes a file (the server writes, syncs and
 *     removes a probe) with room for a checkpoint: the server's own size
 *     once it holds the table, or the size --spec gives its share;
 *   - its wall clock is within --max-clock-skew-ms of psctl's (log lines
 *     and checkpoint times are compared across hosts).
 * Returns 0 when nothing is wrong, PS_EMISMATCH when something is (psctl
 * exits 1), after a last line counting the problems. */
#include "worker/tools/psctl_check.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_wire.h"

int psctl_endpoint_down(const char *ep)
{
    int fd = -1, res = -1;
    if (!strncmp(ep, "ipc://", 6)) {
        struct sockaddr_un ua = {.sun_family = AF_UNIX};
        if (strlen(ep + 6) >= sizeof ua.sun_path) return -1;
        strcpy(ua.sun_path, ep + 6);
        if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) return -1;
        res = connect(fd, (struct sockaddr *)&ua, sizeof ua) == 0 ? 0
              : (errno == ECONNREFUSED || errno == ENOENT) ? 1 : -1;
        close(fd);
        return res;
    }
    char host[256], *colon;
    if (strncmp(ep, "tcp://", 6) || snprintf(host, sizeof host, "%s", ep + 6) >= (int)sizeof host ||
        !(colon = strrchr(host, ':')))
        return -1;
    *colon = 0;
    const char *port = colon + 1;
    if (host[0] == '[' && colon > host + 1 && colon[-1] == ']') { /* [v6]:port */
        colon[-1] = 0;
        memmove(host, host + 1, strlen(host));
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) || !ai) return -2;
    if ((fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) >= 0) {
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            res = 0;
        } else if (errno == ECONNREFUSED) {
            res = 1;
        } else if (errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&pf, 1, 1000) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el))
                res = err == 0 ? 0 : err == ECONNREFUSED ? 1 : -1;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return res;
}

typedef struct srv {
    cJSON *st;          /* the STATS reply, NULL: no answer */
    const cJSON *pf;    /* its "preflight" object */
    double skew_s, unc_s; /* its clock minus psctl's, and the round trip's half */
} srv_t;

static int problems;

/* "FAIL ..." (a problem: exit 1) or "WARN ..." (legal, but risky). */
static void say(int problem, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int problem, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf(problem ? "FAIL " : "WARN ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    problems += problem;
}
#define fail(...) say(1, __VA_ARGS__)
#define warn(...) say(0, __VA_ARGS__)

static double num(const cJSON *o, const char *k, double dflt)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Ask server s; on no answer say why it may be. */
static void ask(const psctl_check_in_t *in, int s, srv_t *v)
{
    char *txt = NULL;
    double t0 = wall_s();
    int rc = ps_client_stats_ex(in->c, s, PS_FLAG_PREFLIGHT, &txt);
    double t1 = wall_s();
    if (!rc && txt) v->st = cJSON_Parse(txt);
    free(txt);
    if (v->st && !cJSON_IsObject(v->st)) cJSON_Delete(v->st), v->st = NULL;
    if (v->st) {
        v->pf = cJSON_GetObjectItemCaseSensitive(v->st, "preflight");
        v->skew_s = num(v->pf, "time_unix", NAN) - (t0 + t1) / 2;
        v->unc_s = (t1 - t0) / 2;
        printf("ok   server %d (%s): answers (psd on %s)\n", s, in->ep[s], str(v->pf, "host"));
        return;
    }
    int down = psctl_endpoint_down(in->ep[s]);
    if (down == 1)
        fail("server %d (%s): nothing listens there: start psd --server-id %d there, or fix "
             "--servers", s, in->ep[s], s);
    else if (down == -2)
        fail("server %d (%s): the host name does not resolve: fix --servers", s, in->ep[s]);
    else if (down == 0)
        fail("server %d (%s): accepts connections but does not answer (%s): under psd --curve "
             "give psctl the servers' key (--curve-server-key) and a key pair in their "
             "--curve-allow (--curve-public-key, --curve-secret-key); or it is not a psd, or "
             "stalled", s, in->ep[s], rc ? ps_strerror(rc) : "bad reply");
    else
        fail("server %d (%s): no answer (%s) and cannot be reached: check the address and the "
             "network", s, in->ep[s], rc ? ps_strerror(rc) : "bad reply");
}

/* Bytes of one checkpoint of server s's share of the table (weights and
 * momentum of its partitions). */
static double share_bytes(const ps_partition_table_t *t, int s)
{
    double b = 0;
    for (uint32_t i = 0; t && i < t->nparts; i++)
        if ((int)t->parts[i].server == s) b += 2.0 * (double)t->parts[i].numel * sizeof(float);
    return b;
}

/* The servers' answers agree on key (a number from STATS or its preflight). */
static void agree(const psctl_check_in_t *in, const srv_t *v, const char *key, int from_pf,
                  const char *flag)
{
    int first = -1, bad = 0;
    for (int s = 0; s < in->nserv; s++) {
        if (!v[s].st) continue;
        const cJSON *o = from_pf ? v[s].pf : v[s].st, *x = cJSON_GetObjectItemCaseSensitive(o, key);
        const cJSON *y = first < 0 ? NULL
                                   : cJSON_GetObjectItemCaseSensitive(from_pf ? v[first].pf : v[first].st, key);
        if (first < 0) first = s;
        else if (!cJSON_Compare(x, y, 1)) {
            char *a = cJSON_PrintUnformatted(y), *b = cJSON_PrintUnformatted(x);
            fail("%s differs: server %d has %s, server %d has %s: start every psd with the same %s",
                 key, first, a ? a : "?", s, b ? b : "?", flag);
            free(a), free(b);
            bad = 1;
            break;
        }
    }
    if (first >= 0 && !bad) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(
            from_pf ? v[first].pf : v[first].st, key));
        printf("ok   %s the same on every server (%s)\n", flag, a ? a : "?");
        free(a);
    }
}

static void check_ids(const psctl_check_in_t *in, const srv_t *v)
{
    for (int s = 0; s < in->nserv; s++) {
        if (!v[s].st) continue;
        int id = (int)num(v[s].st, "server_id", -1), ns = (int)num(v[s].pf, "num_servers", 0);
        if (id != s)
            fail("server %d (%s) runs with --server-id %d: --servers must list the servers in id "
                 "order, server 0 first, each id once", s, in->ep[s], id);
        for (int q = 0; q < s; q++)
            if (v[q].st && (int)num(v[q].st, "server_id", -2) == id)
                fail("servers %d and %d (%s, %s) both run with --server-id %d: give each psd its "
                     "own id 0..%d", q, s, in->ep[q], in->ep[s], id, in->nserv - 1);
        if (ns > 0 && ns != in->nserv)
            fail("server %d (%s) runs with --num-servers %d but --servers lists %d", s, in->ep[s],
                 ns, in->nserv);
        else if (ns == 0)
            warn("server %d (%s) runs without --num-servers: give it --num-servers %d, so a worker "
                 "given fewer servers is refused at once", s, in->ep[s], in->nserv);
        else if (id == s)
            printf("ok   server %d: --server-id %d of --num-servers %d\n", s, id, ns);
    }
}

static void check_workers(const psctl_check_in_t *in, const srv_t *v)
{
    agree(in, v, "num_workers", 0, "--num-workers");
    for (int s = 0; s < in->nserv; s++) {
        if (!v[s].st) continue;
        int w = (int)num(v[s].st, "num_workers", 0);
        if (w == 0)
            warn("server %d (%s) runs without --num-workers: it learns the count from the first "
                 "HELLO; give every psd the job's worker count", s, in->ep[s]);
        else if (in->num_workers > 0 && w != in->num_workers)
            fail("server %d (%s) runs with --num-workers %d, the workers will have %d", s,
                 in->ep[s], w, in->num_workers);
    }
}

static void check_ckpt(const psctl_check_in_t *in, const srv_t *v)
{
    agree(in, v, "checkpoint_every_steps", 1, "--checkpoint-every-steps");
    for (int s = 0; s < in->nserv; s++) {
        if (!v[s].st) continue;
        const char *dir = str(v[s].pf, "checkpoint_dir"), *err = str(v[s].pf, "checkpoint_dir_error");
        if (!*dir) {
            if (num(v[s].pf, "checkpoint_every_steps", 0) > 0)
                fail("server %d (%s) runs with --checkpoint-every-steps but no --checkpoint-dir",
                     s, in->ep[s]);
            else
                warn("server %d (%s) has no --checkpoint-dir: a restart of it loses its shard",
                     s, in->ep[s]);
            continue;
        }
        if (*err) {
            fail("server %d (%s): checkpoint directory %s does not take a file: %s: fix its "
                 "permissions or mount, or give another --checkpoint-dir", s, in->ep[s], dir, err);
            continue;
        }
        double free_b = num(v[s].pf, "checkpoint_free_bytes", -1);
        double need = num(v[s].pf, "checkpoint_bytes", 0);
        const char *from = "the server's table";
        if (need <= 0 && in->table) need = share_bytes(in->table, s), from = "--spec";
        if (need > 0 && free_b >= 0 && free_b < need)
            fail("server %d (%s): %s has %.1f MiB free, one checkpoint of its share needs %.1f "
                 "MiB (%s): free space or move --checkpoint-dir", s, in->ep[s], dir,
                 free_b / 1048576.0, need / 1048576.0, from);
        else if (need > 0)
            printf("ok   server %d: %s writable, %.1f MiB free, a checkpoint takes %.1f MiB (%s)\n",
                   s, dir, free_b / 1048576.0, need / 1048576.0, from);
        else
            printf("ok   server %d: %s writable, %.1f MiB free (give --spec to check the room a "
                   "checkpoint needs)\n", s, dir, free_b / 1048576.0);
    }
}

static void check_clocks(const psctl_check_in_t *in, const srv_t *v)
{
    for (int s = 0; s < in->nserv; s++) {
        if (!v[s].st) continue;
        double off = fabs(v[s].skew_s) - v[s].unc_s;
        if (isnan(v[s].skew_s))
            fail("server %d (%s) did not report its clock (an older psd?)", s, in->ep[s]);
        else if (off * 1e3 > in->max_skew_ms)
            fail("server %d (%s): its clock is %+.3f s off this host's (more than "
                 "--max-clock-skew-ms %d): run NTP / chrony on both", s, in->ep[s], v[s].skew_s,
                 in->max_skew_ms);
        else
            printf("ok   server %d: clock within %.3f s of this host's\n", s,
                   fabs(v[s].skew_s) + v[s].unc_s);
    }
}

/* The table of a running job, and what stops it. */
static void check_job(const psctl_check_in_t *in, const srv_t *v)
{
    for (int s = 0; s < in->nserv; s++) {
        if (!v[s].st) continue;
        const char *failed = str(v[s].st, "job_failed");
        if (*failed) fail("server %d (%s): the job was stopped: %s", s, in->ep[s], failed);
    }
    int held = 0;
    for (int s = 0; s < in->nserv; s++) held |= v[s].st && *str(v[s].st, "table_hash");
    if (held) agree(in, v, "table_hash", 0, "model (partition table)");
}

int psctl_check(const psctl_check_in_t *in)
{
    srv_t *v = calloc((size_t)in->nserv, sizeof *v);
    if (!v) return PS_ENOMEM;
    problems = 0;
    int up = 0;
    for (int s = 0; s < in->nserv; s++) {
        ask(in, s, &v[s]);
        up += v[s].st != NULL;
    }
    if (up) {
        check_ids(in, v);
        check_workers(in, v);
        agree(in, v, "mode", 0, "--mode");
        agree(in, v, "curve", 0, "--curve");
        check_ckpt(in, v);
        check_clocks(in, v);
        check_job(in, v);
    }
    for (int s = 0; s < in->nserv; s++) cJSON_Delete(v[s].st);
    free(v);
    if (problems) printf("%d problem(s): fix the lines marked FAIL\n", problems);
    else printf("all %d server(s) ready\n", in->nserv);
    return problems ? PS_EMISMATCH : 0;
}
