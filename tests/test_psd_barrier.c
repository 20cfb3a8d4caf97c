/* psd start barrier and membership under a slow or reconnecting worker
 * (regression: a 2-worker sync job where rank 1's start BARRIER was never
 * answered while rank 0 trained on, alone after rank 1 gave up).
 *
 * 1. Lost ACK.  Rank 1's BARRIER is registered, then its connection goes
 *    away (psd then had re-bound its listener at INIT; the same happens when
 *    ZeroMQ reconnects under a new routing id, or the client reopens its
 *    socket).  Rank 0 arrives, the barrier is released, rank 1's ACK cannot
 *    be routed.  Rank 1 resends the same request from a new connection: it
 *    must be answered at once; queued, it waited for a rank 0 that was
 *    already training (the hang).  The next barrier must still hold until
 *    both arrive, and a late duplicate of the old request must not replace
 *    the one pending.
 * 2. Slow starter.  Rank 1 spoke, then went silent longer than
 *    --worker-timeout-ms before the job started: it must not be declared
 *    lost and the start barrier must not be released without it (rank 0
 *    would train with 1 of 2 workers).
 * 3. Paused at a barrier after the job started.  Rank 1 is at a barrier and
 *    goes silent past the timeout (lost, --on-worker-loss=continue): rank 0's
 *    barrier goes on, and rank 1 gets its ACK (queued for it, and again on a
 *    resend), rather than waiting for rank 0 forever.
 * 4. A restarted worker (test_rejoin). */
#pragma GCC diagnostic ignored "-Wunused-function" /* psd_testlib.h helpers not used here */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

static const ps_tensor_spec_t TS[1] = {{"w", 16, 0}};
#define N 16
static ps_partition_table_t T;

static void *setup(tpsd_t *S, const char *tag, const char *const *args)
{
    if (tpsd_start(S, tag, args)) return NULL;
    void *d = t_dealer(S->port);
    char spec[1024];
    float w0[N] = {0};
    t_spec_json(spec, sizeof spec, TS, 1, 4096, 1, 2, "{\"lr\":0.1,\"momentum\":0}");
    if (t_init_spec(d, spec, T.hash, NULL) != PS__MSG_TYPE__MSG_ACK ||
        t_init_part(d, 0, w0, N) != PS__MSG_TYPE__MSG_ACK) {
        zmq_close(d);
        return NULL;
    }
    return d;
}

static void send_type(void *d, Ps__MsgType type, int rank, uint64_t rid)
{
    Ps__Header h;
    t_hdr(&h, type, rank, 0);
    h.has_request_id = 1, h.request_id = rid;
    if (type == PS__MSG_TYPE__MSG_HEARTBEAT) h.has_flags = 1, h.flags = PS_FLAG_NO_REPLY;
    ps_wire_send(d, NULL, 0, &h, NULL, 0, NULL, NULL, 0);
}

static void barrier(void *d, int rank, uint64_t rid)
{
    send_type(d, PS__MSG_TYPE__MSG_BARRIER, rank, rid);
}

/* Wait up to ms for an ACK of request rid on d, sending rank hb_rank's
 * heartbeats through hb every 50 ms (hb NULL: none).  Other replies are
 * dropped; *other (optional) counts ACKs of other requests.  1: got it. */
static int await_ack(void *d, uint64_t rid, int ms, void *hb, int hb_rank, int *other)
{
    for (int t = 0; t < ms; t += 50) {
        if (hb) send_type(hb, PS__MSG_TYPE__MSG_HEARTBEAT, hb_rank, 0);
        zmq_pollitem_t pi = {d, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&pi, 1, 50) <= 0) continue;
        ps_wire_msg_t m;
        if (t_recv(d, &m) == 0) {
            int mine = m.hdr->type == PS__MSG_TYPE__MSG_ACK && m.hdr->request_id == rid;
            if (!mine && other && m.hdr->type == PS__MSG_TYPE__MSG_ACK) (*other)++;
            ps_wire_msg_close(&m);
            if (mine) return 1;
        } else {
            ps_wire_msg_close(&m);
        }
    }
    return 0;
}

static void stop(tpsd_t *S, void *d, const char *what)
{
    zmq_close(d);
    is_int(tpsd_stop(S, SIGTERM), 0, "%s: psd exits 0", what);
    if (tap_failed_) tpsd_dump_log(S, 30);
    unlink(S->log);
}

static void test_lost_ack(void)
{
    tpsd_t S;
    const char *args[] = {"--num-workers", "2", "--log-level", "info", NULL};
    void *d0 = setup(&S, "bar-ack", args);
    if (!ok(d0 != NULL, "ack: psd started and initialised")) return;
    void *d1a = t_dealer(S.port);
    barrier(d1a, 1, 7001);
    ok(!await_ack(d1a, 7001, 300, NULL, 0, NULL), "ack: rank 1 waits at the start barrier alone");
    zmq_close(d1a); /* its connection goes: the ACK will have nowhere to go */
    t_sleep_ms(200);
    barrier(d0, 0, 7002);
    ok(await_ack(d0, 7002, 3000, NULL, 0, NULL), "ack: rank 0 arrives, barrier released");
    void *d1 = t_dealer(S.port);
    barrier(d1, 1, 7001); /* the client's resend, from its new connection */
    ok(await_ack(d1, 7001, 3000, NULL, 0, NULL),
       "ack: rank 1's resend of the released BARRIER is answered (it hung here)");
    /* The next barrier still waits for both... */
    barrier(d1, 1, 7003);
    ok(!await_ack(d1, 7003, 300, NULL, 0, NULL), "ack: next barrier holds with 1 of 2 arrived");
    /* ... and a late duplicate of 7001 is answered without replacing 7003. */
    barrier(d1, 1, 7001);
    int other = 0;
    ok(!await_ack(d1, 7003, 300, NULL, 0, &other) && other == 1,
       "ack: a late duplicate is answered again, 7003 still pending");
    barrier(d0, 0, 7004);
    ok(await_ack(d0, 7004, 3000, NULL, 0, NULL) && await_ack(d1, 7003, 3000, NULL, 0, NULL),
       "ack: both released at the next barrier, each with its own request");
    zmq_close(d1);
    stop(&S, d0, "ack");
}

static void test_slow_starter(void)
{
    tpsd_t S;
    const char *args[] = {"--num-workers", "2",  "--worker-timeout-ms", "300", "--heartbeat-ms",
                          "50", "--on-worker-loss", "continue", "--log-level", "info", NULL};
    void *d0 = setup(&S, "bar-slow", args);
    if (!ok(d0 != NULL, "slow: psd started and initialised")) return;
    void *d1 = t_dealer(S.port);
    Ps__Header hb;
    t_hdr(&hb, PS__MSG_TYPE__MSG_HEARTBEAT, 1, 0);
    is_int(t_call(d1, &hb, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK,
           "slow: rank 1 speaks, then goes silent");
    barrier(d0, 0, 8001);
    ok(!await_ack(d0, 8001, 1200, d0, 0, NULL),
       "slow: start barrier not released without rank 1, silent 4x the timeout");
    char body[8192] = "";
    Ps__Header st;
    t_hdr(&st, PS__MSG_TYPE__MSG_STATS, 0, 0);
    t_call(d0, &st, NULL, 0, NULL, 0, NULL, body, sizeof body);
    ok(strstr(body, "{\"rank\":1,\"state\":\"lost\"") == NULL, "slow: rank 1 not declared lost");
    barrier(d1, 1, 8002);
    ok(await_ack(d1, 8002, 3000, d0, 0, NULL) && await_ack(d0, 8001, 3000, NULL, 0, NULL),
       "slow: rank 1 arrives, both released");

    /* Job started.  Rank 1 waits at the next barrier and goes silent. */
    barrier(d1, 1, 8003);
    int lost = 0;
    for (int k = 0; k < 40 && !lost; k++) {
        send_type(d0, PS__MSG_TYPE__MSG_HEARTBEAT, 0, 0);
        t_sleep_ms(50);
        if (k % 4 == 3) {
            t_call(d0, &st, NULL, 0, NULL, 0, NULL, body, sizeof body);
            lost = strstr(body, "{\"rank\":1,\"state\":\"lost\"") != NULL;
        }
    }
    ok(lost, "paused: after the job started, silent rank 1 is declared lost");
    barrier(d0, 0, 8004);
    ok(await_ack(d0, 8004, 3000, d0, 0, NULL), "paused: rank 0's barrier goes on without it");
    ok(await_ack(d1, 8003, 1000, NULL, 0, NULL), "paused: rank 1's ACK was queued for it");
    barrier(d1, 1, 8003); /* its resend crossed the ACK */
    ok(await_ack(d1, 8003, 3000, NULL, 0, NULL), "paused: and its resend is answered too");
    zmq_close(d1);
    stop(&S, d0, "slow");
}

/* 4. A worker process restarted into the running job (a new HELLO for its
 *    rank): its start BARRIER is answered at once, the other rank trains and
 *    will not come to a start barrier again.  Once it pushed, it is in step
 *    with the others: its next barrier waits for them as usual. */
static void test_rejoin(void)
{
    tpsd_t S;
    const char *args[] = {"--num-workers", "2", "--worker-timeout-ms", "0", "--log-level", "info",
                          NULL};
    void *d0 = setup(&S, "bar-rejoin", args);
    if (!ok(d0 != NULL, "rejoin: psd started and initialised")) return;
    void *d1 = t_dealer(S.port);
    barrier(d0, 0, 9001);
    barrier(d1, 1, 9002);
    ok(await_ack(d0, 9001, 3000, NULL, 0, NULL) && await_ack(d1, 9002, 3000, NULL, 0, NULL),
       "rejoin: start barrier released");
    zmq_close(d1); /* rank 1 dies; a new process takes its rank */
    void *d1n = t_dealer(S.port);
    Ps__Header he;
    ps_wire_header_init(&he, PS__MSG_TYPE__MSG_HELLO);
    he.has_rank = 1, he.rank = 1;
    he.has_table_hash = 1, he.table_hash = T.hash;
    is_int(t_call(d1n, &he, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_WELCOME,
           "rejoin: restarted rank 1 welcomed");
    barrier(d1n, 1, 1); /* a new process: request ids start over */
    ok(await_ack(d1n, 1, 2000, NULL, 0, NULL),
       "rejoin: its start BARRIER is answered while rank 0 trains");
    float g[N] = {0};
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 1, 0);
    h.has_iteration = 1, h.iteration = 0;
    h.has_numel = 1, h.numel = N;
    h.has_flags = 1, h.flags = PS_FLAG_NO_REPLY;
    ps_wire_send(d1n, NULL, 0, &h, g, sizeof g, NULL, NULL, 0);
    barrier(d1n, 1, 2);
    ok(!await_ack(d1n, 2, 300, NULL, 0, NULL), "rejoin: after its push, its next barrier waits");
    barrier(d0, 0, 9003);
    ok(await_ack(d0, 9003, 3000, NULL, 0, NULL) && await_ack(d1n, 2, 3000, NULL, 0, NULL),
       "rejoin: ... for rank 0, then both released");
    zmq_close(d1n);
    stop(&S, d0, "rejoin");
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, 1, 4096, 1)) tap_skip_all("partition table unavailable");
    test_lost_ack();
    test_slow_starter();
    test_rejoin();
    if (t_ctx) zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
