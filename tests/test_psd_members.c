/* psd membership that must never be wrong in silence, through raw sockets:
 *  1. a rank never heard from is not counted live (STATS live_workers,
 *     the psd_live_workers gauge);
 *  2. a BYE claiming a rank that does not carry the session token of the
 *     process that said HELLO as that rank is refused (PS_EAUTH), and the
 *     rank stays in the job (its step is still waited for);
 *  3. a BYE before the end (no PS_FLAG_DONE) is waited for under the
 *     default --on-worker-loss=wait: the step does not complete without it,
 *     STATS "late" names the rank and why; the rank comes back (a new HELLO)
 *     and the step completes with every gradient;
 *  4. a BYE with PS_FLAG_FAILED stops the job: the other worker's waiting
 *     PUSHPULL is answered ERROR PS_EFAILED naming the failed rank and its
 *     error text, later requests get the same, STATS says job_failed; once
 *     every rank said HELLO again the job runs again;
 *  5. a HELLO refused (another table hash) for a rank no process holds,
 *     before the job started, answers the worker waiting at the start
 *     barrier with PS_EFAILED naming that rank and the cause, instead of
 *     leaving it waiting. */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define N 16
static const char *OPTIM = "{\"lr\":0.5,\"momentum\":0,\"weight_decay\":0,\"sched\":\"const\"}";
static const ps_tensor_spec_t TS[1] = {{"w", N, 0}};

static int hello(void *d, int rank, uint64_t hash, uint64_t session, char *et, size_t etlen)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_HELLO, rank, 0);
    h.has_table_hash = 1, h.table_hash = hash;
    h.has_num_workers = 1, h.num_workers = 2;
    if (session) h.has_session = 1, h.session = session;
    return t_call(d, &h, NULL, 0, NULL, 0, NULL, et, etlen);
}

static int bye(void *d, int rank, uint64_t session, uint32_t flags, const char *text, char *et,
               size_t etlen)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_BYE, rank, 0);
    if (session) h.has_session = 1, h.session = session;
    if (flags) h.has_flags = 1, h.flags = flags;
    if (text) h.has_error_code = 1, h.error_code = PS_EIO, h.error_text = (char *)text;
    return t_call(d, &h, NULL, 0, NULL, 0, NULL, et, etlen);
}

static int stats(void *d, char *body, size_t len)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    return t_call(d, &h, NULL, 0, NULL, 0, NULL, body, len);
}

/* Send rank r's PUSHPULL of step `it` (gradient all ones) without waiting. */
static uint64_t push(void *d, int r, int it, uint64_t session)
{
    float g[N];
    for (int i = 0; i < N; i++) g[i] = 1.0f;
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, r, 0);
    h.has_iteration = 1, h.iteration = (uint64_t)it;
    h.has_numel = 1, h.numel = N;
    h.has_session = 1, h.session = session;
    h.has_request_id = 1, h.request_id = ++t_rid;
    ps_wire_send(d, NULL, 0, &h, g, sizeof g, NULL, NULL, 0);
    return h.request_id;
}

/* The reply to request rid within ms: its type or error code; PS_ETIMEOUT. */
static int reply(void *d, uint64_t rid, int ms, char *et, size_t etlen)
{
    int tmo = ms;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    int rc = PS_ETIMEOUT;
    for (;;) {
        ps_wire_msg_t m;
        int r = t_recv(d, &m);
        if (r) {
            ps_wire_msg_close(&m);
            break;
        }
        if (m.hdr->request_id == rid) {
            rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : (int)m.hdr->type;
            if (et && etlen) snprintf(et, etlen, "%s", m.hdr->error_text ? m.hdr->error_text : "");
            ps_wire_msg_close(&m);
            break;
        }
        ps_wire_msg_close(&m);
    }
    tmo = 5000;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    return rc;
}

static void job_start(tpsd_t *S, void **d, ps_partition_table_t *T, const char *const *args)
{
    char spec[1024];
    if (!ok(tpsd_start(S, "members", args) == 0, "psd started")) exit(tap_done());
    ps_partition_table_build(T, TS, 1, 4096, 1);
    t_spec_json(spec, sizeof spec, TS, 1, 4096, 1, 2, OPTIM);
    d[0] = t_dealer(S->port);
    d[1] = t_dealer(S->port);
    is_int(t_init_spec(d[0], spec, T->hash, NULL), PS__MSG_TYPE__MSG_ACK, "INIT spec");
    float w[N] = {0};
    is_int(t_init_part(d[0], 0, w, N), PS__MSG_TYPE__MSG_ACK, "INIT weights");
}

static void membership(void)
{
    tpsd_t S;
    void *d[2];
    ps_partition_table_t T;
    char body[16384], et[512];
    const char *args[] = {"--num-workers", "2", "--worker-timeout-ms", "0", NULL};
    job_start(&S, d, &T, args);
    const uint64_t s0 = 0x1111, s1 = 0x2222;

    /* 1. nobody has spoken yet */
    is_int(stats(d[0], body, sizeof body), PS__MSG_TYPE__MSG_ACK, "STATS");
    ok(strstr(body, "\"live_workers\":1") && strstr(body, "\"rank\":1,\"state\":\"unknown\""),
       "only rank 0 spoke (its INIT): live_workers 1, rank 1 unknown (never heard from)");
    is_int(hello(d[0], 0, T.hash, s0, et, sizeof et), PS__MSG_TYPE__MSG_WELCOME, "HELLO rank 0");
    is_int(hello(d[1], 1, T.hash, s1, et, sizeof et), PS__MSG_TYPE__MSG_WELCOME, "HELLO rank 1");
    stats(d[0], body, sizeof body);
    ok(strstr(body, "\"live_workers\":2") != NULL, "after two HELLOs: live_workers 2");

    /* 2. a forged BYE for rank 1 (another connection, no token; then a wrong token) */
    void *x = t_dealer(S.port);
    is_int(bye(x, 1, 0, 0, NULL, et, sizeof et), PS_EAUTH, "a BYE for rank 1 without its token: PS_EAUTH");
    diag("%s", et);
    is_int(bye(x, 1, 0x9999, PS_FLAG_FAILED, "forged", et, sizeof et), PS_EAUTH,
           "... and with a wrong token (claiming a failure): PS_EAUTH");
    zmq_close(x);
    uint64_t r0 = push(d[0], 0, 0, s0);
    is_int(reply(d[0], r0, 300, NULL, 0), PS_ETIMEOUT, "rank 1 is still waited for at step 0");
    uint64_t r1 = push(d[1], 1, 0, s1);
    int a = reply(d[0], r0, 5000, NULL, 0), b = reply(d[1], r1, 5000, NULL, 0);
    ok(a == PS__MSG_TYPE__MSG_WEIGHTS && b == PS__MSG_TYPE__MSG_WEIGHTS,
       "step 0 completes with both gradients (the forged BYEs changed nothing)");

    /* 3. rank 1 leaves before the end: waited for (default --on-worker-loss=wait) */
    is_int(bye(d[1], 1, s1, 0, NULL, et, sizeof et), PS__MSG_TYPE__MSG_ACK, "rank 1 says BYE (not done)");
    r0 = push(d[0], 0, 1, s0);
    is_int(reply(d[0], r0, 400, NULL, 0), PS_ETIMEOUT, "step 1 waits for the rank that left");
    stats(d[0], body, sizeof body);
    ok(strstr(body, "\"late\":\"step 1: waiting") && strstr(body, "for rank 1 (left with BYE)"),
       "STATS late names rank 1 and why: %.120s", strstr(body, "\"late\"") ? strstr(body, "\"late\"") : "-");
    ok(strstr(body, "\"state\":\"left\"") != NULL, "STATS: rank 1 left");
    is_int(hello(d[1], 1, T.hash, s1 + 1, et, sizeof et), PS__MSG_TYPE__MSG_WELCOME,
           "rank 1 comes back (a new process)");
    r1 = push(d[1], 1, 1, s1 + 1);
    a = reply(d[0], r0, 5000, NULL, 0), b = reply(d[1], r1, 5000, NULL, 0);
    ok(a == PS__MSG_TYPE__MSG_WEIGHTS && b == PS__MSG_TYPE__MSG_WEIGHTS, "step 1 completes with both");
    float w[N];
    uint64_t v = 0;
    is_int(t_pull(d[0], 0, 0, w, N, &v), PS__MSG_TYPE__MSG_WEIGHTS, "PULL");
    ok(v == 2 && w[0] == -1.0f, "two steps of lr 0.5 on the mean of two gradients of 1: w = -1 (%g, v%llu)",
       (double)w[0], (unsigned long long)v);

    /* 4. rank 1 fails: the job stops for rank 0 with rank 1's reason */
    r0 = push(d[0], 0, 2, s0);
    is_int(reply(d[0], r0, 300, NULL, 0), PS_ETIMEOUT, "step 2: rank 0 waits for rank 1");
    is_int(bye(d[1], 1, s1 + 1, PS_FLAG_FAILED, "training data: train.txt:4: not a JPEG", et, sizeof et),
           PS__MSG_TYPE__MSG_ACK, "rank 1 says it failed");
    is_int(reply(d[0], r0, 5000, et, sizeof et), PS_EFAILED, "rank 0's waiting PUSHPULL: PS_EFAILED");
    ok(strstr(et, "worker rank 1 failed") && strstr(et, "not a JPEG"), "... naming rank 1 and its error: %s", et);
    et[0] = 0;
    is_int(t_pull(d[0], 0, 0, w, N, &v), PS_EFAILED, "a later PULL: PS_EFAILED");
    stats(d[0], body, sizeof body);
    ok(strstr(body, "\"job_failed\":\"worker rank 1 failed") != NULL, "STATS job_failed says why");
    is_int(hello(d[0], 0, T.hash, s0 + 1, et, sizeof et), PS__MSG_TYPE__MSG_WELCOME, "rank 0 restarted: HELLO");
    is_int(hello(d[1], 1, T.hash, s1 + 2, et, sizeof et), PS__MSG_TYPE__MSG_WELCOME, "rank 1 restarted: HELLO");
    stats(d[0], body, sizeof body);
    ok(!strstr(body, "job_failed"), "every rank said HELLO again: the failure is forgotten");
    r0 = push(d[0], 0, 2, s0 + 1);
    r1 = push(d[1], 1, 2, s1 + 2);
    a = reply(d[0], r0, 5000, NULL, 0), b = reply(d[1], r1, 5000, NULL, 0);
    ok(a == PS__MSG_TYPE__MSG_WEIGHTS && b == PS__MSG_TYPE__MSG_WEIGHTS, "the job trains again: step 2 completes");
    if (tap_failed_) tpsd_dump_log(&S, 30);
    zmq_close(d[0]), zmq_close(d[1]);
    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0");
    ps_partition_table_free(&T);
}

static void refused_start(void)
{
    tpsd_t S;
    void *d[2];
    ps_partition_table_t T;
    char et[512];
    const char *args[] = {"--num-workers", "2", NULL};
    job_start(&S, d, &T, args);
    is_int(hello(d[0], 0, T.hash, 0x31, et, sizeof et), PS__MSG_TYPE__MSG_WELCOME, "HELLO rank 0");
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_BARRIER, 0, 0);
    h.has_session = 1, h.session = 0x31;
    h.has_request_id = 1, h.request_id = ++t_rid;
    ps_wire_send(d[0], NULL, 0, &h, NULL, 0, NULL, NULL, 0);
    uint64_t rid = h.request_id;
    is_int(reply(d[0], rid, 300, NULL, 0), PS_ETIMEOUT, "rank 0 waits at the start barrier");
    is_int(hello(d[1], 1, T.hash ^ 7, 0x32, et, sizeof et), PS_EMISMATCH,
           "rank 1's HELLO with another table: PS_EMISMATCH");
    is_int(reply(d[0], rid, 5000, et, sizeof et), PS_EFAILED, "rank 0's barrier: PS_EFAILED");
    ok(strstr(et, "worker rank 1 cannot join") && strstr(et, "table hash"),
       "... naming rank 1 and the cause: %s", et);
    if (tap_failed_) tpsd_dump_log(&S, 30);
    zmq_close(d[0]), zmq_close(d[1]);
    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0");
    ps_partition_table_free(&T);
}

int main(void)
{
    membership();
    refused_start();
    zmq_ctx_term(t_ctx);
    return tap_done();
}
