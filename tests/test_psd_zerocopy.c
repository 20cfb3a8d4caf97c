/* psd sends fp32 raw WEIGHTS zero-copy straight from the weights buffer and
 * sums a completing raw push straight from the ZMQ message.  Checked here:
 * (1) replies still queued for a slow reader when an update comes keep the
 * version they were sent at (bit for bit, CRC intact): the sync update
 * writes the new weights into another buffer and leaves the old one to
 * those replies (STATS weights_left_to_replies > 0, so the case did occur);
 * (2) one worker (the gradient is read in place, no summation pass) and two
 * workers (rank-order sum, one of them read in place) give the closed-form
 * SGD update; (3) a PULL after the update sees the new weights. */
#include <math.h>

#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define N ((1u << 20) + 1000) /* 4 MiB partition: large enough to stay queued;
                                  * not a multiple of psd's 8192-element chunks */
#define NSLOW 6
static const char *OPTIM = "{\"lr\":0.5,\"momentum\":0}";

static float *W0, *G0, *G1, *OUT, *REF;

static void *slow_dealer(int port)
{
    /* Small receive buffers and no reading: replies pile up in psd. */
    char ep[64];
    int hwm = 1, buf = 4096, tmo = 20000, linger = 0;
    void *d = zmq_socket(t_ctx, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(d, ZMQ_RCVBUF, &buf, sizeof buf);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(d, ep);
    return d;
}

static int push(void *d, int rank, const float *g, float *out, uint64_t *ver)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, rank, 0);
    h.has_iteration = 1, h.iteration = 0;
    h.has_numel = 1, h.numel = N;
    return t_call(d, &h, g, (size_t)N * 4, out, N, ver, NULL, 0);
}

static long stats_num(void *d, const char *key)
{
    Ps__Header h;
    char body[8192], pat[64];
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    if (t_call(d, &h, NULL, 0, NULL, 0, NULL, body, sizeof body) != PS__MSG_TYPE__MSG_ACK) return -1;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(body, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

static void run(int W)
{
    tpsd_t S;
    char tag[16], spec[512], what[64];
    snprintf(tag, sizeof tag, "zc%d", W);
    /* The partition is just over psd's default --max-partition-bytes (4 MiB). */
    const char *args[] = {"--worker-timeout-ms", "0", "--max-partition-bytes", "8388608", NULL};
    ps_tensor_spec_t ts[1] = {{"w", N, 0}};
    ps_partition_table_t t;
    if (!ok(ps_partition_table_build(&t, ts, 1, (size_t)N * 4, 1) == 0 && t.nparts == 1,
            "W=%d: one 4 MiB partition", W))
        return;
    if (!ok(tpsd_start(&S, tag, args) == 0, "W=%d: psd started", W)) return;
    void *d = t_dealer(S.port), *d1 = t_dealer(S.port), *slow = slow_dealer(S.port);
    t_spec_json(spec, sizeof spec, ts, 1, (size_t)N * 4, 1, W, OPTIM);
    is_int(t_init_spec(d, spec, t.hash, NULL), PS__MSG_TYPE__MSG_ACK, "W=%d: INIT spec", W);
    is_int(t_init_part(d, 0, W0, N), PS__MSG_TYPE__MSG_ACK, "W=%d: INIT weights", W);

    /* The slow peer asks for the version-0 weights NSLOW times, reads nothing. */
    for (int k = 0; k < NSLOW; k++) {
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_PULL, -1, 0);
        h.has_request_id = 1, h.request_id = 7000 + k;
        ps_wire_send(slow, NULL, 0, &h, NULL, 0, NULL, NULL, 0);
    }
    t_sleep_ms(300); /* let psd queue the replies */

    uint64_t v = 0;
    if (W == 2) {
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 1, 0);
        h.has_iteration = 1, h.iteration = 0;
        h.has_numel = 1, h.numel = N;
        is_int(t_call(d1, &h, G1, (size_t)N * 4, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK,
               "W=2: rank 1 PUSH");
    }
    is_int(push(d, 0, G0, OUT, &v), PS__MSG_TYPE__MSG_WEIGHTS, "W=%d: rank 0 PUSHPULL", W);
    ok(v == 1, "W=%d: version 1 (%llu)", W, (unsigned long long)v);
    for (size_t i = 0; i < N; i++)
        REF[i] = W0[i] - 0.5f * (W == 1 ? G0[i] : (G0[i] + G1[i]) / 2.0f);
    snprintf(what, sizeof what, "W=%d: closed-form SGD step", W);
    allclose(OUT, REF, N, 1e-6, 1e-6, what);
    ok(stats_num(d, "weights_left_to_replies") >= 1,
       "W=%d: the update found replies in flight and left them the old weights (%ld)", W,
       stats_num(d, "weights_left_to_replies"));

    /* Now read the queued replies: still version 0, exactly W0, CRC ok. */
    int good = 0;
    for (int k = 0; k < NSLOW; k++) {
        ps_wire_msg_t m;
        char err[256];
        int rc = ps_wire_recv(slow, &m, 0, 0, err, sizeof err);
        if (rc == 0 && m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS && m.hdr->iteration == 0 &&
            m.has_payload && zmq_msg_size(&m.payload) == (size_t)N * 4 &&
            !memcmp(zmq_msg_data(&m.payload), W0, (size_t)N * 4))
            good++;
        else
            diag("slow reply %d: rc %d (%s)", k, rc, rc ? err : "");
        ps_wire_msg_close(&m);
    }
    is_int(good, NSLOW, "W=%d: replies queued before the update keep version 0, bit for bit", W);
    is_int(t_pull(d, 0, 0, OUT, N, &v), PS__MSG_TYPE__MSG_WEIGHTS, "W=%d: PULL after the update", W);
    ok(v == 1, "W=%d: ... at version 1", W);
    snprintf(what, sizeof what, "W=%d: ... the updated weights", W);
    allclose(OUT, REF, N, 1e-6, 1e-6, what);
    zmq_close(d);
    zmq_close(d1);
    zmq_close(slow);
    is_int(tpsd_stop(&S, SIGTERM), 0, "W=%d: psd exits 0", W);
    if (tap_failed_) tpsd_dump_log(&S, 30);
    unlink(S.log);
    ps_partition_table_free(&t);
}

int main(void)
{
    ps_log_set_level_str("warn");
    W0 = malloc((size_t)N * 4), G0 = malloc((size_t)N * 4), G1 = malloc((size_t)N * 4);
    OUT = malloc((size_t)N * 4), REF = malloc((size_t)N * 4);
    for (size_t i = 0; i < N; i++) {
        W0[i] = sinf(0.001f * i);
        G0[i] = cosf(0.003f * i);
        G1[i] = sinf(0.007f * i + 1.0f);
    }
    t_ctx = zmq_ctx_new();
    run(1);
    run(2);
    zmq_ctx_term(t_ctx);
    free(W0), free(G0), free(G1), free(OUT), free(REF);
    return tap_done();
}
