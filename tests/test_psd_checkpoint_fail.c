/* Failed checkpoint writes, through raw sockets (no root needed): a
 * directory named like the next checkpoint files stands where each file
 * would be renamed to, so every write fails at its rename (EISDIR) after
 * the data went out.  One sync worker, --checkpoint-every-steps 2.
 *  - aligned writes that fail are never reported as done: STATS
 *    aligned_checkpoint_version 0, checkpoint_version -1, checkpoint_writes
 *    0; checkpoint_failures counts them, errors too, checkpoint_last_error
 *    names the file and the cause, /metrics psd_checkpoint_failures_total;
 *  - CHECKPOINT that fails is answered ERROR naming the cause;
 *  - once the obstacles are gone CHECKPOINT is ACKed and STATS moves
 *    (checkpoint_version = aligned_checkpoint_version = the version saved);
 *  - SHUTDOWN whose final checkpoint fails: ACK whose body says so, and
 *    psd stops with exit status 1 (it neither stays up nor exits 0);
 *  - SIGTERM when every write fails: exit status 1; restarted with no
 *    checkpoint, a PUSHPULL of the job under way gets ERROR saying this
 *    server has no checkpoint of the job and why (its last write failed:
 *    ... Is a directory); with an empty directory "none in DIR"; without
 *    --checkpoint-dir that a restart loses the job. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define NT 2
static const ps_tensor_spec_t TS[NT] = {{"fc.weight", 300, 0}, {"fc.bias", 20, 1}};
#define N 320
static const char *OPTIM = "{\"lr\":0.1,\"momentum\":0.9,\"groups\":[{\"lr_mult\":1,\"wd_mult\":1},"
                           "{\"lr_mult\":1,\"wd_mult\":1}]}";
static ps_partition_table_t T;
static char dir[256], spec[4096];
#define NBLOCK 40 /* more than the writes this test makes */

static float grad_of(int it, int i) { return 0.01f * (float)((i + it) % 7); }

/* Directories at the paths of checkpoint files 1..NBLOCK (block = 1), or
 * removed again (block = 0). */
static void obstacles(const char *in, int block)
{
    for (int q = 1; q <= NBLOCK; q++) {
        char p[512];
        snprintf(p, sizeof p, "%s/psd-0-%012d.safetensors", in, q);
        if (block) mkdir(p, 0755);
        else rmdir(p);
    }
}

/* STATS as parsed JSON (NULL on failure). */
static cJSON *stats(void *d)
{
    Ps__Header h;
    char body[65536];
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    if (t_call(d, &h, NULL, 0, NULL, 0, NULL, body, sizeof body) != PS__MSG_TYPE__MSG_ACK) return NULL;
    return cJSON_Parse(body);
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -12345;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Poll STATS until checkpoint_failures >= want (the writes run off the
 * loop thread); the last STATS, to be freed. */
static cJSON *stats_failures(void *d, double want)
{
    cJSON *o = NULL;
    for (int i = 0; i < 500; i++) {
        cJSON_Delete(o);
        o = stats(d);
        if (o && num(o, "checkpoint_failures") >= want) break;
        t_sleep_ms(10);
    }
    return o;
}

/* GET /metrics from 127.0.0.1:port into buf; bytes read or -1. */
static int http_metrics(int port, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
    size_t n = 0;
    if (write(fd, req, strlen(req)) < 0) n = 0;
    for (ssize_t k; n + 1 < cap && (k = read(fd, buf + n, cap - 1 - n)) > 0;) n += (size_t)k;
    buf[n] = 0;
    close(fd);
    return (int)n;
}

static int checkpoint(void *d, char *text, size_t cap)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_CHECKPOINT);
    return t_call(d, &h, NULL, 0, NULL, 0, NULL, text, cap);
}

static int pushpull_error(void *d, int it, char *text, size_t cap)
{
    float g[N] = {0};
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, 0);
    h.has_iteration = 1, h.iteration = (uint64_t)it;
    h.has_numel = 1, h.numel = T.parts[0].numel;
    return t_call(d, &h, g, T.parts[0].numel * 4, NULL, 0, NULL, text, cap);
}

/* Four steps whose aligned checkpoints (versions 2, 4) fail; what STATS
 * and /metrics say of them. */
static void failed_aligned(tpsd_t *S, void *d, int mport)
{
    float w[N];
    int good = 1;
    for (int it = 0; it < 4; it++) good &= t_step_sync(d, &T, it, w, grad_of);
    ok(good, "4 sync steps while every checkpoint write fails");
    cJSON *o = stats_failures(d, 2);
    is_int((int)num(o, "checkpoint_failures"), 2, "STATS checkpoint_failures: the 2 aligned writes");
    is_int((int)num(o, "aligned_checkpoint_version"), 0, "STATS aligned_checkpoint_version stays 0");
    is_int((int)num(o, "checkpoint_version"), -1, "STATS checkpoint_version -1 (none durable)");
    is_int((int)num(o, "checkpoint_writes"), 0, "STATS checkpoint_writes 0");
    ok(num(o, "errors") >= 2, "STATS errors counts them (%g)", num(o, "errors"));
    const char *e = str(o, "checkpoint_last_error");
    ok(strstr(e, dir) && strstr(e, "Is a directory"), "checkpoint_last_error names the path and the cause: %s", e);
    double t = num(o, "checkpoint_last_error_time"), now = (double)time(NULL);
    ok(t > now - 60 && t < now + 5, "checkpoint_last_error_time is a recent Unix time (%.0f)", t);
    cJSON_Delete(o);
    char m[65536];
    ok(http_metrics(mport, m, sizeof m) > 0 && strstr(m, "\npsd_checkpoint_failures_total 2\n") &&
           strstr(m, "\npsd_errors_total{code=\"checkpoint_write\"} 2\n") &&
           strstr(m, "\npsd_aligned_checkpoint_version 0\n"),
       "/metrics: psd_checkpoint_failures_total 2, in psd_errors_total, aligned version 0");
    if (tap_failed_) tpsd_dump_log(S, 20);
}

/* CHECKPOINT fails, then succeeds once the way is clear. */
static void requested(void *d)
{
    char text[1024];
    is_int(checkpoint(d, text, sizeof text), PS_EIO, "CHECKPOINT that fails -> ERROR PS_EIO");
    ok(strstr(text, "not written") && strstr(text, "Is a directory"), "the ERROR names the cause: %s", text);
    obstacles(dir, 0);
    is_int(checkpoint(d, text, sizeof text), PS__MSG_TYPE__MSG_ACK, "way cleared: CHECKPOINT -> ACK");
    cJSON *o = stats(d);
    is_int((int)num(o, "checkpoint_writes"), 1, "STATS checkpoint_writes 1");
    is_int((int)num(o, "checkpoint_version"), 4, "STATS checkpoint_version 4 (the file written)");
    is_int((int)num(o, "aligned_checkpoint_version"), 4, "STATS aligned_checkpoint_version 4 (it is aligned)");
    is_int((int)num(o, "checkpoint_failures"), 3, "STATS checkpoint_failures 3 (the CHECKPOINT's too)");
    cJSON_Delete(o);
}

/* SHUTDOWN whose final checkpoint fails: ACK saying so, exit status 1. */
static void shutdown_fails(tpsd_t *S, void *d)
{
    char text[1024] = "";
    obstacles(dir, 1);
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_SHUTDOWN);
    is_int(t_call(d, &h, NULL, 0, NULL, 0, NULL, text, sizeof text), PS__MSG_TYPE__MSG_ACK,
           "SHUTDOWN whose final checkpoint fails -> ACK (the server stops)");
    ok(strstr(text, "without a final checkpoint") && strstr(text, "Is a directory"),
       "its body says the final checkpoint failed and why: %s", text);
    is_int(tpsd_stop(S, 0), 1, "psd stops by itself with exit status 1");
    obstacles(dir, 0);
}

/* A server whose writes all failed: SIGTERM (its final checkpoint fails:
 * exit status 1), restart: what a worker of the job is told. */
static void restarted(void)
{
    char dir2[300], text[1024] = "";
    snprintf(dir2, sizeof dir2, "%s-b", dir);
    mkdir(dir2, 0755);
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--checkpoint-dir", dir2,
                          "--checkpoint-every-steps", "2", "--log-level", "info", NULL};
    tpsd_t S;
    if (tpsd_start(&S, "ckfail-b", args)) {
        ok(0, "second psd started");
        return;
    }
    void *d = t_dealer(S.port);
    float w[N] = {0};
    obstacles(dir2, 1);
    int good = t_init_spec(d, spec, T.hash, NULL) == PS__MSG_TYPE__MSG_ACK;
    for (uint32_t p = 0; p < T.nparts; p++)
        good &= t_init_part(d, p, w + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    for (int it = 0; it < 3; it++) good &= t_step_sync(d, &T, it, w, grad_of);
    ok(good, "second psd: INIT and 3 steps, every checkpoint write failing");
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 1, "SIGTERM: the final checkpoint fails, exit status 1");
    obstacles(dir2, 0);
    if (tpsd_start(&S, "ckfail-b", args)) {
        ok(0, "psd restarted");
        return;
    }
    d = t_dealer(S.port);
    is_int(pushpull_error(d, 3, text, sizeof text), PS_ESTATE, "PUSHPULL of step 3 after the restart -> PS_ESTATE");
    ok(strstr(text, "server 0 has no checkpoint of this job (its last write failed: ") &&
           strstr(text, "Is a directory"),
       "the ERROR says server 0 has no checkpoint of the job and why: %s", text);
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "SIGTERM with no state to save: exit 0");
    if (tap_failed_) tpsd_dump_log(&S, 30);
    if (!getenv("PSD_KEEP_LOG")) {
        unlink(S.log);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir2);
        if (system(cmd) != 0) diag("cannot remove %s", dir2);
    }
}

/* The other two causes: an empty directory, no --checkpoint-dir. */
static void other_causes(void)
{
    char empty[300], text[1024] = "", want[400];
    snprintf(empty, sizeof empty, "%s-empty", dir);
    mkdir(empty, 0755);
    const char *a1[] = {"--num-workers", "1", "--checkpoint-dir", empty, NULL};
    const char *a2[] = {"--num-workers", "1", NULL};
    const char *const *args[2] = {a1, a2};
    for (int k = 0; k < 2; k++) {
        tpsd_t S;
        if (tpsd_start(&S, "ckfail", args[k])) {
            ok(0, "psd started");
            continue;
        }
        void *d = t_dealer(S.port);
        is_int(pushpull_error(d, 3, text, sizeof text), PS_ESTATE, "PUSHPULL before INIT -> PS_ESTATE");
        if (k == 0) snprintf(want, sizeof want, "server 0 has no checkpoint of this job (none in %s)", empty);
        else snprintf(want, sizeof want, "runs without --checkpoint-dir");
        ok(strstr(text, want) != NULL, "the ERROR says \"%s\": %s", want, text);
        zmq_close(d);
        tpsd_stop(&S, SIGTERM);
        unlink(S.log);
    }
    rmdir(empty);
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, NT, 512, 1)) tap_skip_all("partition table unavailable");
    snprintf(dir, sizeof dir, "/tmp/psd-test-ckfail-%d", (int)getpid());
    mkdir(dir, 0755);
    t_spec_json(spec, sizeof spec, TS, NT, 512, 1, 1, OPTIM);
    char mport[16];
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof a;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (sock < 0 || bind(sock, (struct sockaddr *)&a, sizeof a) || getsockname(sock, (struct sockaddr *)&a, &al))
        tap_skip_all("no free TCP port for /metrics");
    snprintf(mport, sizeof mport, "%d", ntohs(a.sin_port));
    close(sock);
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--checkpoint-dir", dir,
                          "--checkpoint-every-steps", "2", "--metrics-port", mport, "--log-level", "info",
                          NULL};
    tpsd_t S;
    if (tpsd_start(&S, "ckfail", args)) {
        ok(0, "psd started");
        return tap_done();
    }
    void *d = t_dealer(S.port);
    float w0[N];
    for (int i = 0; i < N; i++) w0[i] = 0.5f * (float)(i % 5);
    int good = t_init_spec(d, spec, T.hash, NULL) == PS__MSG_TYPE__MSG_ACK;
    for (uint32_t p = 0; p < T.nparts; p++)
        good &= t_init_part(d, p, w0 + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    ok(good, "INIT");
    obstacles(dir, 1);
    failed_aligned(&S, d, atoi(mport));
    requested(d);
    shutdown_fails(&S, d);
    zmq_close(d);
    if (tap_failed_) tpsd_dump_log(&S, 30);
    restarted();
    other_causes();
    if (!getenv("PSD_KEEP_LOG")) {
        unlink(S.log);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) diag("cannot remove %s", dir);
    }
    return tap_done();
}
