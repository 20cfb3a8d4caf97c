/* Elastic membership on the servers, through raw sockets (server/psd_elastic.c):
 * 2 psd with --num-workers 2 --max-workers 3, spec lr rule "linear".
 * Ranks 0 and 1 train 4 steps; rank 2 joins (HELLO with PS_FLAG_JOIN) and
 * server 0 names its first step E1 = its highest version + 2; the replies
 * of the steps before it carry the new epoch count; server 1 learns the
 * epochs from a MEMBERS message (as psworker does from server 0's STATS);
 * from E1 every update waits for all three; rank 1 is drained (MSG_DRAIN,
 * as psctl drain does) from E2 on, and the updates no longer wait for it.
 * Checked against the closed form of the same schedule: gradients are
 * rank-dependent integers, lr 0.25 x W / W0 (linear scaling), momentum 0,
 * so every mean and product is exact in fp32 and a step that waited for
 * the wrong ranks, divided by the wrong count or used the wrong lr shows
 * bitwise.  Refusals: a join past --max-workers, draining rank 0, a DRAIN
 * of a rank not in the job, MEMBERS that do not parse. */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define NT 2
#define N 16
static const ps_tensor_spec_t TS[NT] = {{"a", 8, 0}, {"b", 8, 0}};
static const char *OPTIM = "{\"lr\":0.25,\"momentum\":0,\"weight_decay\":0,\"sched\":\"const\","
                           "\"warmup_steps\":0,\"ref_batch\":0}";
static ps_partition_table_t T;
static void *D[3][2];  /* rank x server */
static const uint64_t SESSION[3] = {0x1111, 0x2222, 0x3333};

static float w0_of(int i) { return 0.5f * (float)(i % 23) - 3.0f; }
static float g_of(int r, int t, int i) { return (float)((r + 1) + t % 7 + i % 5); }

static int hello(int r, int s, int rank, uint32_t flags, uint64_t *it, uint32_t *epochs)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_HELLO, rank, 0);
    h.has_table_hash = 1, h.table_hash = T.hash;
    h.has_num_workers = 1, h.num_workers = 2;
    h.has_num_servers = 1, h.num_servers = 2;
    h.has_session = 1, h.session = SESSION[r];
    if (flags) h.has_flags = 1, h.flags = flags;
    h.has_request_id = 1, h.request_id = ++t_rid;
    if (ps_wire_send(D[r][s], NULL, 0, &h, NULL, 0, NULL, NULL, 0)) return PS_EZMQ;
    ps_wire_msg_t m;
    int rc = t_recv(D[r][s], &m);
    if (!rc) {
        rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : (int)m.hdr->rank;
        if (m.hdr->type == PS__MSG_TYPE__MSG_ERROR) printf("# HELLO: %s\n", m.hdr->error_text);
        if (it) *it = m.hdr->iteration;
        if (epochs) *epochs = m.hdr->has_epochs ? m.hdr->epochs : 0;
    }
    ps_wire_msg_close(&m);
    return rc;
}

/* One sync step of the ranks in `ranks` (bit r): every one pushes every
 * partition, then each reply is read; 1 when all are WEIGHTS of version
 * t + 1 equal to w (the closed form after the step).  *epochs: the most
 * epochs a reply named. */
static int step(int t, unsigned ranks, const float *w, uint32_t *epochs)
{
    for (int r = 0; r < 3; r++) {
        if (!((ranks >> r) & 1)) continue;
        for (uint32_t p = 0; p < T.nparts; p++) {
            size_t off = T.parts[p].offset, n = T.parts[p].numel;
            float g[N];
            for (size_t i = 0; i < n; i++) g[i] = g_of(r, t, (int)(off + i));
            Ps__Header h;
            t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, r, p);
            h.has_iteration = 1, h.iteration = (uint64_t)t;
            h.has_numel = 1, h.numel = n;
            h.has_session = 1, h.session = SESSION[r];
            h.has_request_id = 1, h.request_id = (uint64_t)(t * 100 + r * 10 + (int)p + 1);
            ps_wire_send(D[r][T.parts[p].server], NULL, 0, &h, g, n * 4, NULL, NULL, 0);
        }
    }
    int good = 1;
    for (int r = 0; r < 3; r++) {
        if (!((ranks >> r) & 1)) continue;
        for (uint32_t p = 0; p < T.nparts; p++) {
            ps_wire_msg_t m;
            if (t_recv(D[r][T.parts[p].server], &m)) {
                ps_wire_msg_close(&m);
                good = 0;
                continue;
            }
            const Ps__Header *h = m.hdr;
            size_t off = T.parts[h->partition].offset, n = T.parts[h->partition].numel;
            good &= h->type == PS__MSG_TYPE__MSG_WEIGHTS && h->iteration == (uint64_t)t + 1 &&
                    m.has_payload && zmq_msg_size(&m.payload) == n * 4 &&
                    !memcmp(zmq_msg_data(&m.payload), w + off, n * 4);
            if (h->has_epochs && h->epochs > *epochs) *epochs = h->epochs;
            ps_wire_msg_close(&m);
        }
    }
    return good;
}

/* The closed form of step t over the ranks in `ranks`: mean gradient in
 * rank order, lr 0.25 x W / 2. */
static void expect_step(float *w, int t, unsigned ranks)
{
    int n = __builtin_popcount(ranks);
    float lr = 0.25f * (float)n / 2.0f;
    for (int i = 0; i < N; i++) {
        float s = 0;
        for (int r = 0; r < 3; r++)
            if ((ranks >> r) & 1) s += g_of(r, t, i);
        w[i] -= lr * (s / (float)n);
    }
}

/* INIT from rank 0's process (its session): the spec, or a partition's weights. */
static int init(int s, const char *spec, uint32_t part, const float *w, size_t n)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_INIT, 0, spec ? 0xFFFFFFFFu : part);
    h.has_session = 1, h.session = SESSION[0];
    h.has_table_hash = 1, h.table_hash = T.hash;
    if (spec) {
        h.has_body = 1, h.body.data = (uint8_t *)spec, h.body.len = strlen(spec);
        return t_call(D[0][s], &h, NULL, 0, NULL, 0, NULL, NULL, 0);
    }
    h.has_numel = 1, h.numel = n;
    return t_call(D[0][s], &h, w, n * 4, NULL, 0, NULL, NULL, 0);
}

static int stats(int s, char *body, size_t len)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    return t_call(D[0][s], &h, NULL, 0, NULL, 0, NULL, body, len);
}

static int drain(int rank, uint64_t *from, char *et, size_t len)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_DRAIN);
    h.has_rank = 1, h.rank = rank;
    return t_call(D[0][0], &h, NULL, 0, NULL, 0, from, et, len);
}

static int members(int s, const char *json, char *et, size_t len)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_MEMBERS, 0, 0);
    h.has_session = 1, h.session = SESSION[0];
    h.has_body = 1, h.body.data = (uint8_t *)json, h.body.len = strlen(json);
    return t_call(D[0][s], &h, NULL, 0, NULL, 0, NULL, et, len);
}

/* The "epochs" array of a STATS body, copied into out. */
static void epochs_of(const char *body, char *out, size_t len)
{
    const char *e = strstr(body, "\"epochs\":");
    out[0] = 0;
    if (!e) return;
    e += 9;
    const char *z = e;
    for (int depth = 0; *z; z++) {
        depth += *z == '[' ? 1 : *z == ']' ? -1 : 0;
        if (!depth) break;
    }
    snprintf(out, len, "%.*s", (int)(z - e + 1), e);
}

int main(void)
{
    tpsd_t S[2];
    char spec[2048], et[512], body[16384], ep[256];
    (void)t_init_spec, (void)t_init_part; /* INIT goes with rank 0's session here (init) */
    if (ps_partition_table_build(&T, TS, NT, 32, 2) || T.nparts != 2 ||
        T.parts[0].server == T.parts[1].server) {
        printf("1..0 # SKIP the table does not put one partition on each server\n");
        return 77;
    }
    t_spec_json(spec, sizeof spec, TS, NT, 32, 2, 2, OPTIM);
    /* the elastic lr rule rides in the spec, as psworker sends it */
    snprintf(spec + strlen(spec) - 1, sizeof spec - strlen(spec) + 1,
             ",\"elastic\":{\"lr\":\"linear\",\"global_batch\":16}}");
    for (int s = 0; s < 2; s++) {
        char sid[8];
        snprintf(sid, sizeof sid, "%d", s);
        const char *extra[] = {"--server-id", sid, "--num-servers", "2", "--num-workers", "2",
                               "--max-workers", "3", "--mode", "sync", "--log-level", "info", NULL};
        if (tpsd_start(&S[s], s ? "elastic1" : "elastic0", extra)) {
            printf("1..0 # SKIP cannot start psd\n");
            return 77;
        }
    }
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 2; s++) D[r][s] = t_dealer(S[s].port);

    int ok_hello = 1;
    for (int r = 0; r < 2; r++)
        for (int s = 0; s < 2; s++) ok_hello &= hello(r, s, r, 0, NULL, NULL) == r;
    ok(ok_hello, "ranks 0 and 1 say HELLO to both servers");
    float w[N];
    for (int i = 0; i < N; i++) w[i] = w0_of(i);
    int init_ok = 1;
    for (int s = 0; s < 2; s++) init_ok &= init(s, spec, 0, NULL, 0) == PS__MSG_TYPE__MSG_ACK;
    for (uint32_t p = 0; p < T.nparts; p++)
        init_ok &= init((int)T.parts[p].server, NULL, p, w + T.parts[p].offset, T.parts[p].numel) ==
                   PS__MSG_TYPE__MSG_ACK;
    ok(init_ok, "INIT (spec with the linear lr rule, weights)");

    uint32_t seen = 0;
    int good = 1, t = 0;
    for (; t < 4; t++) {
        expect_step(w, t, 0x3);
        good &= step(t, 0x3, w, &seen);
    }
    ok(good, "steps 0-3 with ranks 0 and 1 (lr 0.25)");

    /* rank 2 joins */
    uint64_t e1 = 0;
    uint32_t nep = 0;
    int r2 = hello(2, 0, -1, PS_FLAG_JOIN, &e1, &nep);
    ok(r2 == 2 && e1 == 6 && nep == 2, "HELLO with PS_FLAG_JOIN: rank %d, first step %llu "
       "(server 0 at version 4: + 2), %u epochs", r2, (unsigned long long)e1, nep);
    is_int(hello(2, 1, 2, 0, NULL, NULL), 2, "rank 2 says HELLO to server 1");
    is_int(stats(0, body, sizeof body), PS__MSG_TYPE__MSG_ACK, "STATS of server 0");
    epochs_of(body, ep, sizeof ep);
    ok(!strcmp(ep, "[[0,[0,1]],[6,[0,1,2]]]") && strstr(body, "\"active_workers\":3") &&
       strstr(body, "\"max_workers\":3"), "server 0's epochs %s, active_workers 3", ep);
    is_int(members(1, ep, et, sizeof et), PS__MSG_TYPE__MSG_ACK, "MEMBERS to server 1");
    is_int(stats(1, body, sizeof body), PS__MSG_TYPE__MSG_ACK, "STATS of server 1");
    char ep1[256];
    epochs_of(body, ep1, sizeof ep1);
    ok(!strcmp(ep1, ep), "server 1 has the same epochs (%s)", ep1);
    is_int(members(1, "[[0,[0,9]]]", et, sizeof et), PS_EINVAL, "MEMBERS naming rank 9: refused (%s)", et);

    /* a third join: the job has its --max-workers */
    void *d3 = t_dealer(S[0].port);
    {
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_HELLO, -1, 0);
        h.has_table_hash = 1, h.table_hash = T.hash;
        h.has_num_workers = 1, h.num_workers = 2;
        h.has_flags = 1, h.flags = PS_FLAG_JOIN;
        is_int(t_call(d3, &h, NULL, 0, NULL, 0, NULL, et, sizeof et), PS_ESTATE,
               "a fourth worker's join: refused (%s)", et);
    }
    zmq_close(d3);

    good = 1;
    seen = 0;
    for (; t < 6; t++) {
        expect_step(w, t, 0x3);
        good &= step(t, 0x3, w, &seen);
    }
    ok(good && seen == 2, "steps 4-5 still with ranks 0 and 1; their replies name 2 epochs");
    good = 1;
    for (; t < 10; t++) {
        expect_step(w, t, 0x7);
        good &= step(t, 0x7, w, &seen);
    }
    ok(good, "steps 6-9 with ranks 0, 1, 2 (mean over 3, lr 0.25 x 3/2), bitwise the closed form");

    uint64_t e2 = 0;
    is_int(drain(0, &e2, et, sizeof et), PS_EINVAL, "draining rank 0: refused (%s)", et);
    is_int(drain(5, &e2, et, sizeof et), PS_EINVAL, "draining a rank not in the job: refused (%s)", et);
    is_int(drain(1, &e2, et, sizeof et), PS__MSG_TYPE__MSG_ACK, "DRAIN rank 1");
    is_int((int)e2, 12, "... from step 12 (server 0 at version 10: + 2)");
    stats(0, body, sizeof body);
    epochs_of(body, ep, sizeof ep);
    ok(!strcmp(ep, "[[0,[0,1]],[6,[0,1,2]],[12,[0,2]]]"), "server 0's epochs %s", ep);
    is_int(members(1, ep, et, sizeof et), PS__MSG_TYPE__MSG_ACK, "MEMBERS to server 1");
    good = 1;
    for (; t < 12; t++) {
        expect_step(w, t, 0x7);
        good &= step(t, 0x7, w, &seen);
    }
    for (; t < 16; t++) {
        expect_step(w, t, 0x5);
        good &= step(t, 0x5, w, &seen);
    }
    ok(good && seen == 3, "steps 10-11 with three ranks, 12-15 with ranks 0 and 2 (lr 0.25): "
       "bitwise the closed form");
    float got[N];
    uint64_t ver[2];
    int pulled = 1;
    for (uint32_t p = 0; p < T.nparts; p++)
        pulled &= t_pull(D[0][T.parts[p].server], p, 0, got + T.parts[p].offset, T.parts[p].numel,
                         &ver[p]) == PS__MSG_TYPE__MSG_WEIGHTS && ver[p] == 16;
    ok(pulled && !memcmp(got, w, sizeof w), "both servers end at version 16 with the closed form");

    for (int s = 0; s < 2; s++) {
        int rc = tpsd_stop(&S[s], SIGTERM);
        if (tap_failed_ || rc) tpsd_dump_log(&S[s], 30);
        if (!getenv("PSD_KEEP_LOG")) unlink(S[s].log);
    }
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 2; s++) zmq_close(D[r][s]);
    zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
