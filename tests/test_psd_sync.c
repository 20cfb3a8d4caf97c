/* psd sync aggregation end to end: three raw DEALER "workers" HELLO, INIT,
 * BARRIER and push known gradients; the pulled weights must equal an
 * independent closed-form torch.optim.SGD update (momentum, weight decay,
 * per-group multipliers) of the rank-ordered mean gradient.  Also: pushes
 * arriving out of rank order are still summed in rank order, duplicates are
 * not applied twice, a retried PUSHPULL gets the same weights, and
 * PS_FLAG_OVERFLOW skips the step while the version advances. */
#include <math.h>
#include <poll.h>

#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define W 3
#define NT 3
static const ps_tensor_spec_t TS[NT] = {{"a.weight", 10, 0}, {"a.bias", 3, 1}, {"b.weight", 250, 0}};
#define N 263
static const char *OPTIM = "{\"lr\":0.1,\"momentum\":0.9,\"weight_decay\":0.01,\"sched\":\"const\","
                           "\"warmup_steps\":0,\"ref_batch\":0,"
                           "\"groups\":[{\"lr_mult\":1,\"wd_mult\":1},{\"lr_mult\":2,\"wd_mult\":0}]}";

static ps_partition_table_t T;
static void *D[W];

static float grad_of(int r, int it, int i)
{
    /* element 5 needs rank order: (1e8 + -1e8) + 1 = 1, but 1e8 + (-1e8 + 1) = 0 */
    if (i == 5) return r == 0 ? 1e8f : r == 1 ? -1e8f : 1.0f;
    return sinf(0.37f * i + 1.3f * r + 0.71f * it) * (1.0f + r);
}

static void send_push(int r, uint32_t p, int it, int pushpull, uint32_t flags, uint64_t rid)
{
    size_t off = T.parts[p].offset, n = T.parts[p].numel;
    float g[N];
    for (size_t i = 0; i < n; i++) g[i] = grad_of(r, it, (int)(off + i));
    Ps__Header h;
    t_hdr(&h, pushpull ? PS__MSG_TYPE__MSG_PUSHPULL : PS__MSG_TYPE__MSG_PUSH, r, p);
    h.has_iteration = 1, h.iteration = (uint64_t)it;
    h.has_numel = 1, h.numel = n;
    h.has_request_id = 1, h.request_id = rid;
    h.has_table_hash = 1, h.table_hash = T.hash;
    if (flags) h.has_flags = 1, h.flags = flags;
    ps_wire_send(D[r], NULL, 0, &h, g, n * 4, NULL, NULL, 0);
}

/* Next reply on worker r: its type (or error code); weights into out. */
static int expect(int r, uint64_t rid, float *out, uint64_t *version)
{
    ps_wire_msg_t m;
    int rc = t_recv(D[r], &m);
    if (rc) {
        ps_wire_msg_close(&m);
        return rc == PS_EAGAIN ? PS_ETIMEOUT : rc;
    }
    rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : (int)m.hdr->type;
    if (m.hdr->request_id != rid) rc = -999;
    if (version) *version = m.hdr->iteration;
    if (out && m.has_payload) memcpy(out, zmq_msg_data(&m.payload), zmq_msg_size(&m.payload));
    ps_wire_msg_close(&m);
    return rc;
}

static int quiet(int r, int ms)
{
    zmq_pollitem_t it = {D[r], 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, ms) == 0;
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, NT, 400, 1)) tap_skip_all("partition table unavailable");
    tpsd_t S;
    const char *args[] = {"--num-workers", "3", "--worker-timeout-ms", "0", "--threads", "2",
                          "--log-level", "info", NULL};
    if (tpsd_start(&S, "sync", args)) {
        ok(0, "psd started");
        return tap_done();
    }
    diag("psd on port %d, %u partitions", S.port, T.nparts);
    for (int r = 0; r < W; r++) D[r] = t_dealer(S.port);

    /* HELLO: ranks assigned in arrival order; a retry keeps the rank. */
    for (int r = 0; r < W; r++) {
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_HELLO, -1, 0);
        h.has_table_hash = 1, h.table_hash = T.hash;
        h.has_num_workers = 1, h.num_workers = W;
        Ps__Header *hp = &h;
        ps_wire_msg_t m;
        hp->has_request_id = 1, hp->request_id = 50 + r;
        ps_wire_send(D[r], NULL, 0, hp, NULL, 0, NULL, NULL, 0);
        int rc = t_recv(D[r], &m);
        ok(rc == 0 && m.hdr->type == PS__MSG_TYPE__MSG_WELCOME && m.hdr->rank == r &&
               m.hdr->num_workers == W && m.hdr->table_hash == T.hash,
           "HELLO %d -> WELCOME rank %d", r, rc == 0 ? m.hdr->rank : -1);
        ps_wire_msg_close(&m);
    }
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_HELLO, -1, 0);
    h.has_table_hash = 1, h.table_hash = T.hash;
    uint64_t ver;
    is_int(t_call(D[1], &h, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_WELCOME, "HELLO retry");
    h.table_hash = T.hash ^ 1;
    char et[512];
    is_int(t_call(D[1], &h, NULL, 0, NULL, 0, NULL, et, sizeof et), PS_EMISMATCH,
           "HELLO with another table hash -> PS_EMISMATCH");
    diag("%s", et);

    /* INIT */
    char spec[4096];
    t_spec_json(spec, sizeof spec, TS, NT, 400, 1, W, OPTIM);
    is_int(t_init_spec(D[0], spec, T.hash, NULL), PS__MSG_TYPE__MSG_ACK, "INIT spec");
    float w[N], mom[N] = {0}, w0[N];
    for (int i = 0; i < N; i++) w0[i] = w[i] = cosf(0.1f * i);
    int init_ok = 1;
    for (uint32_t p = 0; p < T.nparts; p++)
        init_ok &= t_init_part(D[0], p, w + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    ok(init_ok, "INIT weights of %u partitions", T.nparts);
    is_int(t_init_part(D[0], 0, mom, T.parts[0].numel), PS__MSG_TYPE__MSG_ACK,
           "second INIT of a partition is acknowledged");

    /* BARRIER: nobody is released before all three arrived. */
    for (int r = 0; r < W; r++) {
        Ps__Header b;
        t_hdr(&b, PS__MSG_TYPE__MSG_BARRIER, r, 0);
        b.has_request_id = 1, b.request_id = 70 + r;
        ps_wire_send(D[r], NULL, 0, &b, NULL, 0, NULL, NULL, 0);
        if (r == 1) ok(quiet(0, 150), "barrier holds with 2 of 3 arrived");
    }
    for (int r = 0; r < W; r++) is_int(expect(r, 70 + r, NULL, NULL), PS__MSG_TYPE__MSG_ACK, "barrier ACK %d", r);

    float got[N];
    int pulled = 1;
    for (uint32_t p = 0; p < T.nparts; p++)
        pulled &= t_pull(D[1], p, 0, got + T.parts[p].offset, T.parts[p].numel, &ver) ==
                  PS__MSG_TYPE__MSG_WEIGHTS && ver == 0;
    ok(pulled && !memcmp(got, w0, sizeof w0), "PULL returns the initial weights at version 0");

    /* Iterations 0..3; iteration 2 has an overflowed worker. */
    const float lr = 0.1f, mu = 0.9f, wd = 0.01f;
    static float wv[5][N]; /* the servers' weights of each version */
    memcpy(wv[0], w0, sizeof w0);
    for (int it = 0; it < 4; it++) {
        int overflow = it == 2;
        float wnew[N];
        int all_ok = 1, dup_ok = 1, retry_ok = 1, order_hold = 1;
        for (uint32_t p = 0; p < T.nparts; p++) {
            uint64_t base = 1000 * (it + 1) + 10 * p;
            /* arrival order 2, 0, 1: the sum must still be in rank order */
            send_push(2, p, it, 0, 0, base + 2);
            all_ok &= expect(2, base + 2, NULL, NULL) == PS__MSG_TYPE__MSG_ACK;
            send_push(0, p, it, 1, 0, base + 0);
            send_push(2, p, it, 0, 0, base + 3); /* duplicate while pending */
            dup_ok &= expect(2, base + 3, NULL, NULL) == PS__MSG_TYPE__MSG_ACK;
            order_hold &= quiet(0, 20);
            send_push(1, p, it, 1, overflow ? PS_FLAG_OVERFLOW : 0, base + 1);
            float r0[N], r1[N];
            uint64_t v0 = 0, v1 = 0;
            all_ok &= expect(0, base + 0, r0, &v0) == PS__MSG_TYPE__MSG_WEIGHTS;
            all_ok &= expect(1, base + 1, r1, &v1) == PS__MSG_TYPE__MSG_WEIGHTS;
            all_ok &= v0 == (uint64_t)it + 1 && v1 == (uint64_t)it + 1;
            all_ok &= !memcmp(r0, r1, T.parts[p].numel * 4);
            memcpy(wnew + T.parts[p].offset, r0, T.parts[p].numel * 4);
            /* a retried PUSHPULL of an applied iteration: same weights, no update */
            send_push(1, p, it, 1, 0, base + 5);
            float r2[N];
            retry_ok &= expect(1, base + 5, r2, &v1) == PS__MSG_TYPE__MSG_WEIGHTS && v1 == (uint64_t)it + 1 &&
                        !memcmp(r2, r0, T.parts[p].numel * 4);
        }
        memcpy(wv[it + 1], wnew, sizeof wnew);
        ok(all_ok, "iteration %d: every partition updated to version %d", it, it + 1);
        ok(dup_ok, "iteration %d: duplicate pending push acknowledged", it);
        ok(order_hold, "iteration %d: PUSHPULL waits for all workers", it);
        ok(retry_ok, "iteration %d: retried PUSHPULL gets the same weights", it);

        /* Independent reference: torch.optim.SGD on the rank-ordered mean. */
        if (!overflow)
            for (int i = 0; i < N; i++) {
                float g = grad_of(0, it, i);
                g += grad_of(1, it, i);
                g += grad_of(2, it, i);
                g /= 3.0f;
                int grp = (i >= 10 && i < 13) ? 1 : 0;
                float d = g + wd * (grp ? 0.0f : 1.0f) * w[i];
                mom[i] = it == 0 ? d : mu * mom[i] + d;
                w[i] -= lr * (grp ? 2.0f : 1.0f) * mom[i];
            }
        if (overflow) ok(!memcmp(wnew, w, sizeof w), "iteration %d: overflow flag skips the update", it);
        else allclose(wnew, w, N, 1e-6, 1e-5, "weights equal closed-form SGD");
        is_close(wnew[5], w[5], 1e-6, 1e-5, "iteration %d: element 5 summed in rank order", it);
    }

    /* PULL with PS_FLAG_EXACT: the weights of exactly that version, the
     * current one or the one before (what a worker that died between its
     * pushes of a step computes it again from); older ones are gone. */
    {
        int cur = 1, prev = 1;
        for (uint32_t p = 0; p < T.nparts; p++) {
            size_t off = T.parts[p].offset, n = T.parts[p].numel;
            float buf[N];
            uint64_t v = 0;
            Ps__Header x;
            t_hdr(&x, PS__MSG_TYPE__MSG_PULL, 1, p);
            x.has_min_version = 1, x.min_version = 4;
            x.has_flags = 1, x.flags = PS_FLAG_EXACT;
            cur &= t_call(D[1], &x, NULL, 0, buf, N, &v, NULL, 0) == PS__MSG_TYPE__MSG_WEIGHTS &&
                   v == 4 && !memcmp(buf, wv[4] + off, n * 4);
            x.min_version = 3;
            prev &= t_call(D[1], &x, NULL, 0, buf, N, &v, NULL, 0) == PS__MSG_TYPE__MSG_WEIGHTS &&
                    v == 3 && !memcmp(buf, wv[3] + off, n * 4) && memcmp(buf, wv[4] + off, n * 4);
        }
        ok(cur, "PULL exact version 4 (current): the weights of version 4");
        ok(prev, "PULL exact version 3 (one before): the weights of version 3, not 4");
        Ps__Header x;
        t_hdr(&x, PS__MSG_TYPE__MSG_PULL, 1, 0);
        x.has_min_version = 1, x.min_version = 2;
        x.has_flags = 1, x.flags = PS_FLAG_EXACT;
        is_int(t_call(D[1], &x, NULL, 0, NULL, 0, NULL, et, sizeof et), PS_ESTATE,
               "PULL exact version 2 (two before): PS_ESTATE (%s)", et);
    }

    /* A push ahead of the current version is refused. */
    Ps__Header ph;
    t_hdr(&ph, PS__MSG_TYPE__MSG_PUSH, 0, 0);
    ph.has_iteration = 1, ph.iteration = 99;
    ph.has_numel = 1, ph.numel = T.parts[0].numel;
    is_int(t_call(D[0], &ph, w, T.parts[0].numel * 4, NULL, 0, NULL, et, sizeof et), PS_ESTATE,
           "push for a future iteration -> PS_ESTATE");

    /* PULL with min_version waits for the version. */
    Ps__Header q;
    t_hdr(&q, PS__MSG_TYPE__MSG_PULL, 0, 1);
    q.has_min_version = 1, q.min_version = 5;
    q.has_request_id = 1, q.request_id = 9001;
    ps_wire_send(D[0], NULL, 0, &q, NULL, 0, NULL, NULL, 0);
    ok(quiet(0, 100), "PULL min_version=5 waits at version 4");
    for (int r = 0; r < W; r++) {
        send_push(r, 1, 4, 0, 0, 9100 + r);
        if (expect(r, 9100 + r, NULL, NULL) != PS__MSG_TYPE__MSG_ACK) diag("push %d not acked", r);
    }
    uint64_t v5 = 0;
    is_int(expect(0, 9001, NULL, &v5), PS__MSG_TYPE__MSG_WEIGHTS, "waiting PULL answered after the update");
    is_int(v5, 5, "at version 5");

    /* STATS */
    Ps__Header st;
    t_hdr(&st, PS__MSG_TYPE__MSG_STATS, 0, 0);
    {
        static char body[16384];
        is_int(t_call(D[0], &st, NULL, 0, NULL, 0, NULL, body, sizeof body), PS__MSG_TYPE__MSG_ACK,
               "STATS");
        ok(strstr(body, "\"updates\":") && strstr(body, "\"live_workers\":3"), "STATS body: %.200s",
           body);
    }

    /* BYE from a worker that finished (PS_FLAG_DONE): the remaining two
     * complete iterations alone (a BYE before the end is waited for:
     * tests/test_psd_members.c). */
    Ps__Header bye;
    t_hdr(&bye, PS__MSG_TYPE__MSG_BYE, 2, 0);
    bye.has_flags = 1, bye.flags = PS_FLAG_DONE;
    is_int(t_call(D[2], &bye, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "BYE");
    send_push(0, 0, 4, 0, 0, 9200);
    send_push(1, 0, 4, 1, 0, 9201);
    expect(0, 9200, NULL, NULL);
    is_int(expect(1, 9201, NULL, &v5), PS__MSG_TYPE__MSG_WEIGHTS, "after BYE two workers complete an update");

    /* reply_codec: WEIGHTS in the codec asked for, not the request's;
     * lossy codecs are refused for weights. */
    {
        float raw[N], viaz[N];
        uint64_t vr = 0;
        size_t n1 = T.parts[1].numel;
        is_int(t_pull(D[0], 1, 0, raw, N, &vr), PS__MSG_TYPE__MSG_WEIGHTS, "PULL raw");
        Ps__Header q2;
        t_hdr(&q2, PS__MSG_TYPE__MSG_PULL, 0, 1);
        q2.has_reply_codec = 1, q2.reply_codec = PS__CODEC__CODEC_LZ4;
        q2.has_request_id = 1, q2.request_id = 9300;
        ps_wire_send(D[0], NULL, 0, &q2, NULL, 0, NULL, NULL, 0);
        ps_wire_msg_t m;
        int got = t_recv(D[0], &m) == 0 && m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS &&
                  m.hdr->codec == PS__CODEC__CODEC_LZ4 && m.has_payload &&
                  ps_codec_decode(viaz, n1, zmq_msg_data(&m.payload), zmq_msg_size(&m.payload),
                                  PS_DT_FP32, PS_CODEC_LZ4, 0, NULL) == 0;
        ps_wire_msg_close(&m);
        ok(got, "PULL reply_codec=lz4: WEIGHTS encoded lz4");
        ok(got && !memcmp(raw, viaz, n1 * 4), "... and equal to the raw weights");
        t_hdr(&q2, PS__MSG_TYPE__MSG_PULL, 0, 1);
        q2.has_reply_codec = 1, q2.reply_codec = PS__CODEC__CODEC_TOPK;
        is_int(t_call(D[0], &q2, NULL, 0, NULL, 0, NULL, NULL, 0), PS_EINVAL, "PULL reply_codec=topk refused");
    }

    Ps__Header sd;
    t_hdr(&sd, PS__MSG_TYPE__MSG_SHUTDOWN, 0, 0);
    is_int(t_call(D[0], &sd, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "SHUTDOWN acknowledged");
    is_int(tpsd_stop(&S, 0), 0, "psd exits 0 after SHUTDOWN");
    if (tap_failed_) tpsd_dump_log(&S, 40);
    if (!getenv("PSD_KEEP_LOG")) unlink(S.log);
    for (int r = 0; r < W; r++) zmq_close(D[r]);
    zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
