/* psd modes and membership: async (each push applied on arrival, scaled
 * 1/W, retries not applied twice), bounded staleness (old pushes refused
 * with PS_ESTALE, PULL min_version waits), and a lost worker in sync mode
 * (after --worker-timeout-ms the pending update and the barrier proceed with
 * the workers that remain, --on-worker-loss=continue; the lost one is live
 * again when it speaks, e.g. a HELLO with its rank, and pulls the current
 * weights), and --on-worker-loss=wait (the step waits for it). */
#include <math.h>

#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

static const ps_tensor_spec_t TS[1] = {{"w", 40, 0}};
#define N 40
static ps_partition_table_t T;
static const char *OPTIM = "{\"lr\":0.1,\"momentum\":0}";
static float W0[N];

static void *setup(tpsd_t *S, const char *const *args, int W)
{
    if (tpsd_start(S, "modes", args)) return NULL;
    void *d = t_dealer(S->port);
    char spec[1024];
    t_spec_json(spec, sizeof spec, TS, 1, 4096, 1, W, OPTIM);
    if (t_init_spec(d, spec, T.hash, NULL) != PS__MSG_TYPE__MSG_ACK ||
        t_init_part(d, 0, W0, N) != PS__MSG_TYPE__MSG_ACK) {
        zmq_close(d);
        return NULL;
    }
    return d;
}

static void grad(float *g, int r, int it)
{
    for (int i = 0; i < N; i++) g[i] = sinf(0.2f * i + r + 0.5f * it);
}

static int pushpull(void *d, int rank, uint64_t it, const float *g, float *out, uint64_t *ver,
                    int pushpull)
{
    Ps__Header h;
    t_hdr(&h, pushpull ? PS__MSG_TYPE__MSG_PUSHPULL : PS__MSG_TYPE__MSG_PUSH, rank, 0);
    h.has_iteration = 1, h.iteration = it;
    h.has_numel = 1, h.numel = N;
    return t_call(d, &h, g, N * 4, out, N, ver, NULL, 0);
}

static void stop(tpsd_t *S, void *d, const char *what)
{
    zmq_close(d);
    is_int(tpsd_stop(S, SIGTERM), 0, "%s: psd exits 0", what);
    if (tap_failed_) tpsd_dump_log(S, 30);
    unlink(S->log);
}

static void test_async(void)
{
    tpsd_t S;
    const char *args[] = {"--mode", "async", "--worker-timeout-ms", "0", NULL};
    void *d = setup(&S, args, 2);
    if (!ok(d != NULL, "async: psd started and initialised")) return;
    float g0[N], g1[N], out[N], ref[N];
    uint64_t v = 0;
    grad(g0, 0, 0);
    grad(g1, 1, 0);
    is_int(pushpull(d, 0, 0, g0, out, &v, 1), PS__MSG_TYPE__MSG_WEIGHTS, "async: rank 0 PUSHPULL answered at once");
    for (int i = 0; i < N; i++) ref[i] = W0[i] - 0.1f * (g0[i] / 2.0f);
    ok(v == 1, "async: version 1");
    allclose(out, ref, N, 1e-7, 1e-6, "async: w - lr * g0 / W");
    is_int(pushpull(d, 1, 0, g1, out, &v, 1), PS__MSG_TYPE__MSG_WEIGHTS, "async: rank 1 PUSHPULL");
    for (int i = 0; i < N; i++) ref[i] -= 0.1f * (g1[i] / 2.0f);
    ok(v == 2, "async: version 2");
    allclose(out, ref, N, 1e-7, 1e-6, "async: then - lr * g1 / W");
    is_int(pushpull(d, 0, 0, g0, out, &v, 1), PS__MSG_TYPE__MSG_WEIGHTS, "async: retried push answered");
    ok(v == 2, "async: retry not applied (version still 2)");
    allclose(out, ref, N, 0, 0, "async: retry leaves the weights");
    is_int(pushpull(d, 0, 2, g0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "async: PUSH acknowledged");
    is_int(t_pull(d, 0, 3, out, N, &v), PS__MSG_TYPE__MSG_WEIGHTS, "async: PULL");
    ok(v == 3, "async: PUSH applied (version 3)");
    stop(&S, d, "async");
}

static void test_ssp(void)
{
    tpsd_t S;
    const char *args[] = {"--mode", "ssp", "--staleness", "1", "--worker-timeout-ms", "0", NULL};
    void *d = setup(&S, args, 2);
    if (!ok(d != NULL, "ssp: psd started and initialised")) return;
    float g[N], out[N];
    uint64_t v = 0;
    grad(g, 0, 0);
    int good = 1;
    for (uint64_t it = 0; it < 3; it++) good &= pushpull(d, 0, it, g, out, &v, 1) == PS__MSG_TYPE__MSG_WEIGHTS && v == it + 1;
    ok(good, "ssp: rank 0 advances to version 3");
    char et[256];
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 1, 0);
    h.has_iteration = 1, h.iteration = 1;
    h.has_numel = 1, h.numel = N;
    is_int(t_call(d, &h, g, N * 4, NULL, 0, NULL, et, sizeof et), PS_ESTALE,
           "ssp: push of iteration 1 at version 3 with staleness 1 -> PS_ESTALE");
    diag("%s", et);
    is_int(pushpull(d, 1, 2, g, out, &v, 1), PS__MSG_TYPE__MSG_WEIGHTS, "ssp: push within the bound accepted");
    is_int(v, 4, "ssp: version 4");
    Ps__Header q;
    t_hdr(&q, PS__MSG_TYPE__MSG_PULL, 1, 0);
    q.has_min_version = 1, q.min_version = 5;
    q.has_request_id = 1, q.request_id = 777;
    ps_wire_send(d, NULL, 0, &q, NULL, 0, NULL, NULL, 0);
    zmq_pollitem_t pi = {d, 0, ZMQ_POLLIN, 0};
    ok(zmq_poll(&pi, 1, 100) == 0, "ssp: PULL min_version 5 waits at version 4");
    Ps__Header p2;
    t_hdr(&p2, PS__MSG_TYPE__MSG_PUSH, 0, 0);
    p2.has_iteration = 1, p2.iteration = 4;
    p2.has_numel = 1, p2.numel = N;
    p2.has_request_id = 1, p2.request_id = 778;
    ps_wire_send(d, NULL, 0, &p2, g, N * 4, NULL, NULL, 0);
    int got_pull = 0, got_ack = 0;
    for (int k = 0; k < 2; k++) {
        ps_wire_msg_t m;
        if (t_recv(d, &m) == 0) {
            got_pull |= m.hdr->request_id == 777 && m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS && m.hdr->iteration == 5;
            got_ack |= m.hdr->request_id == 778 && m.hdr->type == PS__MSG_TYPE__MSG_ACK;
        }
        ps_wire_msg_close(&m);
    }
    ok(got_pull && got_ack, "ssp: the waiting PULL is answered at version 5");
    stop(&S, d, "ssp");
}

static void test_lost_worker(void)
{
    tpsd_t S;
    const char *args[] = {"--worker-timeout-ms", "300", "--heartbeat-ms", "50", "--on-worker-loss",
                          "continue", NULL};
    /* 3 workers: ranks 0 and 2 push (both through d0), rank 1 goes silent. */
    void *d0 = setup(&S, args, 3);
    if (!ok(d0 != NULL, "loss: psd started and initialised")) return;
    void *d1 = t_dealer(S.port);
    Ps__Header hb;
    t_hdr(&hb, PS__MSG_TYPE__MSG_HEARTBEAT, 1, 0);
    is_int(t_call(d1, &hb, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "loss: rank 1 heartbeat ACK");

    float g0[N], g2[N], out[N], ref[N];
    grad(g0, 0, 0);
    grad(g2, 2, 0);
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, 0);
    h.has_iteration = 1, h.has_numel = 1, h.numel = N;
    h.has_request_id = 1, h.request_id = 4000;
    ps_wire_send(d0, NULL, 0, &h, g0, N * 4, NULL, NULL, 0);
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 2, 0);
    h.has_iteration = 1, h.has_numel = 1, h.numel = N;
    h.has_flags = 1, h.flags = PS_FLAG_NO_REPLY;
    ps_wire_send(d0, NULL, 0, &h, g2, N * 4, NULL, NULL, 0);
    Ps__Header b;
    t_hdr(&b, PS__MSG_TYPE__MSG_BARRIER, 0, 0);
    b.has_request_id = 1, b.request_id = 4001;
    ps_wire_send(d0, NULL, 0, &b, NULL, 0, NULL, NULL, 0);
    t_hdr(&b, PS__MSG_TYPE__MSG_BARRIER, 2, 0);
    b.has_request_id = 1, b.request_id = 4002;
    ps_wire_send(d0, NULL, 0, &b, NULL, 0, NULL, NULL, 0);
    /* Ranks 0 and 2 keep heartbeating (no reply wanted); rank 1 stays silent. */
    int got_w = 0, got_b = 0;
    uint64_t v = 0;
    for (int k = 0; k < 60 && !(got_w && got_b); k++) {
        for (int r = 0; r <= 2; r += 2) {
            Ps__Header hb0;
            t_hdr(&hb0, PS__MSG_TYPE__MSG_HEARTBEAT, r, 0);
            hb0.has_flags = 1, hb0.flags = PS_FLAG_NO_REPLY;
            ps_wire_send(d0, NULL, 0, &hb0, NULL, 0, NULL, NULL, 0);
        }
        zmq_pollitem_t pi = {d0, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&pi, 1, 50) <= 0) continue;
        ps_wire_msg_t m;
        if (t_recv(d0, &m) == 0) {
            if (m.hdr->request_id == 4000 && m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS) {
                got_w = 1;
                v = m.hdr->iteration;
                memcpy(out, zmq_msg_data(&m.payload), N * 4);
            }
            got_b |= m.hdr->request_id == 4001 && m.hdr->type == PS__MSG_TYPE__MSG_ACK;
        }
        ps_wire_msg_close(&m);
    }
    ok(got_w && v == 1, "loss: the update proceeds without the lost worker");
    ok(got_b, "loss: the barrier is released without it");
    for (int i = 0; i < N; i++) ref[i] = W0[i] - 0.1f * ((g0[i] + g2[i]) / 2);
    allclose(out, ref, N, 1e-7, 1e-6, "loss: mean over the two gradients that arrived (not / 3)");
    Ps__Header st;
    t_hdr(&st, PS__MSG_TYPE__MSG_STATS, 0, 0);
    char body[4096];
    t_call(d0, &st, NULL, 0, NULL, 0, NULL, body, sizeof body);
    ok(strstr(body, "\"live_workers\":2") != NULL, "loss: STATS live_workers 2");
    ok(strstr(body, "{\"rank\":1,\"state\":\"lost\"") != NULL, "loss: STATS workers[] says rank 1 lost");
    ok(strstr(body, "\"spec\":\"{\\\"tensors\\\"") != NULL, "loss: STATS carries the INIT spec");
    /* Rank 1 restarts: HELLO with its rank makes it live again, and a PULL
     * gets the current weights (version 1). */
    void *d2 = t_dealer(S.port);
    Ps__Header he;
    ps_wire_header_init(&he, PS__MSG_TYPE__MSG_HELLO);
    he.has_rank = 1, he.rank = 1;
    he.has_table_hash = 1, he.table_hash = T.hash;
    he.has_body = 1, he.body.data = (uint8_t *)"node-b", he.body.len = 6;
    is_int(t_call(d2, &he, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_WELCOME, "loss: rejoining rank 1 welcomed");
    t_call(d0, &st, NULL, 0, NULL, 0, NULL, body, sizeof body);
    ok(strstr(body, "{\"rank\":1,\"state\":\"live\",\"host\":\"node-b\"") != NULL,
       "loss: after HELLO rank 1 is live (host node-b)");
    float cur[N];
    uint64_t vc = 0;
    is_int(t_pull(d2, 0, 0, cur, N, &vc), PS__MSG_TYPE__MSG_WEIGHTS, "loss: rejoined rank pulls");
    ok(vc == 1, "loss: ... the current version 1");
    allclose(cur, ref, N, 0, 0, "loss: ... and the current weights");
    zmq_close(d2);
    /* Rank 1 returns: its push for the applied iteration is a retry. */
    float g1[N];
    grad(g1, 1, 0);
    is_int(pushpull(d1, 1, 0, g1, out, &v, 1), PS__MSG_TYPE__MSG_WEIGHTS, "loss: returning worker's old push answered");
    ok(v == 1, "loss: ... with the applied version, not applied again");
    allclose(out, ref, N, 0, 0, "loss: weights unchanged by the late push");
    t_call(d0, &st, NULL, 0, NULL, 0, NULL, body, sizeof body);
    ok(strstr(body, "\"live_workers\":3") != NULL, "loss: live again (STATS live_workers 3)");
    zmq_close(d1);
    stop(&S, d0, "loss");
}

/* --on-worker-loss=wait: the step waits for the lost worker; when it comes
 * back and pushes, the update is the mean over both. */
static void test_wait(void)
{
    tpsd_t S;
    const char *args[] = {"--worker-timeout-ms", "200", "--heartbeat-ms", "50", "--on-worker-loss",
                          "wait", NULL};
    void *d0 = setup(&S, args, 2);
    if (!ok(d0 != NULL, "wait: psd started and initialised")) return;
    void *d1 = t_dealer(S.port);
    Ps__Header hb;
    t_hdr(&hb, PS__MSG_TYPE__MSG_HEARTBEAT, 1, 0);
    is_int(t_call(d1, &hb, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "wait: rank 1 heartbeat ACK");
    float g0[N], g1[N], out[N], ref[N];
    grad(g0, 0, 0);
    grad(g1, 1, 0);
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, 0);
    h.has_iteration = 1, h.has_numel = 1, h.numel = N;
    h.has_request_id = 1, h.request_id = 5000;
    ps_wire_send(d0, NULL, 0, &h, g0, N * 4, NULL, NULL, 0);
    /* Well past the timeout: rank 1 is lost, and the step still waits. */
    int early = 0;
    for (int k = 0; k < 12; k++) {
        Ps__Header hb0;
        t_hdr(&hb0, PS__MSG_TYPE__MSG_HEARTBEAT, 0, 0);
        hb0.has_flags = 1, hb0.flags = PS_FLAG_NO_REPLY;
        ps_wire_send(d0, NULL, 0, &hb0, NULL, 0, NULL, NULL, 0);
        zmq_pollitem_t pi = {d0, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&pi, 1, 50) > 0) early = 1;
    }
    ok(!early, "wait: no update while rank 1 is lost");
    Ps__Header st;
    t_hdr(&st, PS__MSG_TYPE__MSG_STATS, -1, 0);
    st.has_rank = 0;
    char body[4096] = "";
    void *d2 = t_dealer(S.port);
    t_call(d2, &st, NULL, 0, NULL, 0, NULL, body, sizeof body);
    ok(strstr(body, "{\"rank\":1,\"state\":\"lost\"") != NULL && strstr(body, "\"on_worker_loss\":\"wait\""),
       "wait: STATS says rank 1 lost, policy wait");
    uint64_t v = 0;
    is_int(pushpull(d1, 1, 0, g1, out, &v, 1), PS__MSG_TYPE__MSG_WEIGHTS, "wait: rank 1 back, pushes");
    for (int i = 0; i < N; i++) ref[i] = W0[i] - 0.1f * ((g0[i] + g1[i]) / 2);
    ok(v == 1, "wait: version 1");
    allclose(out, ref, N, 1e-7, 1e-6, "wait: the update is the mean over both workers");
    ps_wire_msg_t m;
    int got = t_recv(d0, &m) == 0 && m.hdr->request_id == 5000 && m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS;
    ps_wire_msg_close(&m);
    ok(got, "wait: rank 0's PUSHPULL answered once the step completes");
    zmq_close(d1);
    zmq_close(d2);
    stop(&S, d0, "wait");
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, 1, 4096, 1)) tap_skip_all("partition table unavailable");
    for (int i = 0; i < N; i++) W0[i] = 0.1f * i - 1.0f;
    test_async();
    test_ssp();
    test_lost_worker();
    test_wait();
    if (t_ctx) zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
