/* Helpers for the psd tests: start ./psd on a free port (fork/exec, port read
 * from --port-file), talk to it through raw DEALER sockets built on ps_wire,
 * and stop it.  Header-only (static) so each test program stays one file. */
#ifndef PSD_TESTLIB_H
#define PSD_TESTLIB_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_codec.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_partition.h"
#include "ps_wire.h"

typedef struct tpsd {
    pid_t pid;
    int port;
    char port_file[256];
    char log[256];
} tpsd_t;

static void *t_ctx;

static void t_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *t_builddir(void)
{
    const char *b = getenv("top_builddir");
    return b && *b ? b : ".";
}

/* Start psd with extra args (NULL-terminated); 0 on success. */
static int tpsd_start(tpsd_t *p, const char *tag, const char *const *extra)
{
    char exe[512];
    const char *argv[64];
    int n = 0;
    snprintf(exe, sizeof exe, "%s/psd", t_builddir());
    snprintf(p->port_file, sizeof p->port_file, "/tmp/psd-test-%s-%d.port", tag, (int)getpid());
    snprintf(p->log, sizeof p->log, "/tmp/psd-test-%s-%d.log", tag, (int)getpid());
    unlink(p->port_file);
    argv[n++] = exe;
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--port-file";
    argv[n++] = p->port_file;
    argv[n++] = "--stats-every-s";
    argv[n++] = "0";
    for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout);
    p->pid = fork();
    if (p->pid < 0) return -1;
    if (p->pid == 0) {
        /* The server log goes to a file (shown on failure), not into TAP. */
        FILE *f = freopen(p->log, "a", stderr);
        (void)f;
        execv(exe, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(p->port_file, "r");
        if (f) {
            int ok = fscanf(f, "%d", &p->port) == 1;
            fclose(f);
            if (ok && p->port > 0) return 0;
        }
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            return -1;
        }
        t_sleep_ms(10);
    }
    return -1;
}

/* Exit status of psd after signal sig (0 = none, just wait); -1 on timeout. */
static int tpsd_stop(tpsd_t *p, int sig)
{
    int st = 0;
    if (p->pid <= 0) return -1;
    if (sig) kill(p->pid, sig);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            unlink(p->port_file);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        t_sleep_ms(10);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
    return -1;
}

static void tpsd_dump_log(const tpsd_t *p, int lines)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "tail -n %d %s | sed 's/^/# psd: /'", lines, p->log);
    fflush(stdout);
    if (system(cmd) < 0) perror("system");
}

static void *t_dealer(int port)
{
    char ep[64];
    int tmo = 5000, linger = 0;
    if (!t_ctx) t_ctx = zmq_ctx_new();
    void *d = zmq_socket(t_ctx, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(d, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(d, ep);
    return d;
}

/* Receive one reply; returns ps_wire_recv's code (m must be closed). */
static int t_recv(void *d, ps_wire_msg_t *m)
{
    char err[256];
    return ps_wire_recv(d, m, 0, 0, err, sizeof err);
}

static uint64_t t_rid = 1000;

/* Send h (+payload) and wait for the reply; returns the reply type or a
 * negative PS_E* (ERROR's code, or the receive error).  out (optional)
 * receives the reply's payload (up to cap floats, fp32 raw requested). */
static int t_call(void *d, Ps__Header *h, const void *payload, size_t len, float *out, size_t cap,
                  uint64_t *version, char *etext, size_t etlen)
{
    ps_wire_msg_t m;
    h->has_request_id = 1;
    h->request_id = ++t_rid;
    if (ps_wire_send(d, NULL, 0, h, payload, len, NULL, NULL, 0)) return PS_EZMQ;
    int rc;
    for (;;) {
        rc = t_recv(d, &m);
        if (rc) {
            ps_wire_msg_close(&m);
            return rc == PS_EAGAIN ? PS_ETIMEOUT : rc;
        }
        if (m.hdr->request_id == h->request_id) break;
        ps_wire_msg_close(&m); /* a late reply to an earlier request */
    }
    int type = m.hdr->type;
    if (etext && etlen) etext[0] = 0;
    if (type == PS__MSG_TYPE__MSG_ERROR) {
        rc = m.hdr->error_code;
        if (etext && m.hdr->error_text) snprintf(etext, etlen, "%s", m.hdr->error_text);
    } else {
        rc = type;
        if (version) *version = m.hdr->iteration;
        if (out && m.has_payload && m.hdr->numel <= cap &&
            ps_codec_decode(out, m.hdr->numel, zmq_msg_data(&m.payload), zmq_msg_size(&m.payload),
                            (ps_dtype_t)m.hdr->dtype, (ps_codec_t)m.hdr->codec, 0, NULL) != 0)
            rc = PS_ECORRUPT;
        if (etext && m.hdr->has_body)
            snprintf(etext, etlen, "%.*s", (int)m.hdr->body.len, (const char *)m.hdr->body.data);
    }
    ps_wire_msg_close(&m);
    return rc;
}

static void t_hdr(Ps__Header *h, Ps__MsgType type, int rank, uint32_t part)
{
    ps_wire_header_init(h, type);
    h->has_rank = 1, h->rank = rank;
    h->has_partition = 1, h->partition = part;
}

/* INIT spec: returns the reply type / error. */
static int t_init_spec(void *d, const char *spec, uint64_t hash, uint32_t *flags)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_INIT);
    h.has_rank = 1, h.rank = 0;
    h.has_partition = 1, h.partition = 0xFFFFFFFFu;
    h.has_table_hash = 1, h.table_hash = hash;
    h.has_body = 1, h.body.data = (uint8_t *)spec, h.body.len = strlen(spec);
    ps_wire_msg_t m;
    h.has_request_id = 1, h.request_id = ++t_rid;
    if (ps_wire_send(d, NULL, 0, &h, NULL, 0, NULL, NULL, 0)) return PS_EZMQ;
    int rc = t_recv(d, &m);
    if (rc) {
        ps_wire_msg_close(&m);
        return rc;
    }
    rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : (int)m.hdr->type;
    if (m.hdr->type == PS__MSG_TYPE__MSG_ERROR) printf("# INIT spec error: %s\n", m.hdr->error_text);
    if (flags) *flags = m.hdr->flags;
    ps_wire_msg_close(&m);
    return rc;
}

static int t_init_part(void *d, uint32_t part, const float *w, size_t n)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_INIT, 0, part);
    h.has_numel = 1, h.numel = n;
    return t_call(d, &h, w, n * 4, NULL, 0, NULL, NULL, 0);
}

static int t_pull(void *d, uint32_t part, uint64_t min_version, float *out, size_t n,
                  uint64_t *version)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PULL, -1, part);
    h.has_min_version = 1, h.min_version = min_version;
    return t_call(d, &h, NULL, 0, out, n, version, NULL, 0);
}

/* One sync step over every partition of T (W = 1: each PUSHPULL applies at
 * once): element i of the gradient is grad(it, i); the new weights land in
 * w.  1 if every reply is WEIGHTS of version it + 1. */
static inline int t_step_sync(void *d, const ps_partition_table_t *T, int it, float *w,
                              float (*grad)(int it, int i))
{
    int good = 1;
    for (uint32_t p = 0; p < T->nparts; p++) {
        size_t off = T->parts[p].offset, n = T->parts[p].numel;
        float *g = malloc(n * sizeof *g);
        if (!g) return 0;
        for (size_t i = 0; i < n; i++) g[i] = grad(it, (int)(off + i));
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, p);
        h.has_iteration = 1, h.iteration = (uint64_t)it;
        h.has_numel = 1, h.numel = n;
        uint64_t v = 0;
        good &= t_call(d, &h, g, n * 4, w + off, n, &v, NULL, 0) == PS__MSG_TYPE__MSG_WEIGHTS &&
                v == (uint64_t)it + 1;
        free(g);
    }
    return good;
}

/* Pull every partition of T into w.  ver (optional) gets each partition's
 * version; want != UINT64_MAX also requires that version.  1 if all good. */
static inline int t_pull_all(void *d, const ps_partition_table_t *T, float *w, uint64_t *ver,
                             uint64_t want)
{
    int good = 1;
    for (uint32_t p = 0; p < T->nparts; p++) {
        uint64_t v = 0;
        good &= t_pull(d, p, 0, w + T->parts[p].offset, T->parts[p].numel, &v) ==
                    PS__MSG_TYPE__MSG_WEIGHTS &&
                (want == UINT64_MAX || v == want);
        if (ver) ver[p] = v;
    }
    return good;
}

/* Build "tensors" JSON for a table spec. */
static void t_spec_json(char *buf, size_t cap, const ps_tensor_spec_t *ts, int nt, size_t pbytes,
                        int nservers, int nworkers, const char *optim)
{
    size_t o = (size_t)snprintf(buf, cap, "{\"tensors\":[");
    for (int i = 0; i < nt; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s[\"%s\",%zu,%d]", i ? "," : "", ts[i].name,
                              ts[i].numel, ts[i].group);
    snprintf(buf + o, cap - o,
             "],\"partition_bytes\":%zu,\"num_servers\":%d,\"num_workers\":%d,\"optim\":%s}", pbytes,
             nservers, nworkers, optim);
}

#endif
