/* MSG_ROLLBACK on one psd, through raw sockets (docs/protocol.md "Rollback
 * after a server restart"): sync, one worker, --checkpoint-every-steps 2.
 * After 5 steps (aligned checkpoints at versions 2 and 4):
 *  - ROLLBACK without iteration -> PS_EPROTO; to a version with no aligned
 *    file (3) -> PS_ENOTFOUND; above the server (6) -> PS_ESTATE flagged
 *    PS_FLAG_ROLLBACK with iteration 5; none of these changes anything;
 *  - ROLLBACK(4) -> ACK; the weights are bitwise those pulled at version 4,
 *    a repeated ROLLBACK(4) is a no-op, a push for a future iteration is
 *    answered PS_ESTATE + PS_FLAG_ROLLBACK + iteration 4, and redoing step
 *    4 gives bitwise the first step 4's weights (momentum restored too);
 *  - a step skipped for loss-scale overflow (WEIGHTS flagged
 *    PS_FLAG_OVERFLOW) and rolled back leaves no flag on version 4 nor on
 *    the redone, normal step 4;
 *  - an async psd refuses ROLLBACK with PS_EUNSUPPORTED. */
#include <math.h>

#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define NT 2
static const ps_tensor_spec_t TS[NT] = {{"fc.weight", 300, 0}, {"fc.bias", 20, 1}};
#define N 320
static const char *OPTIM =
    "{\"lr\":0.05,\"momentum\":0.9,\"weight_decay\":0.001,\"sched\":\"step\",\"milestones\":[3],"
    "\"gamma\":0.1,\"groups\":[{\"lr_mult\":1,\"wd_mult\":1},{\"lr_mult\":2,\"wd_mult\":0}]}";
static ps_partition_table_t T;
static char dir[256], spec[4096];

static float grad_of(int it, int i) { return cosf(0.05f * i - 0.3f * it); }

/* The reply to request rid on d: type or ERROR code, its flags and
 * iteration (optional), WEIGHTS decoded into w (optional). */
static int reply_to(void *d, uint64_t rid, uint32_t *flags, uint64_t *iter, float *w)
{
    ps_wire_msg_t m;
    for (;;) {
        int rc = t_recv(d, &m);
        if (rc) {
            ps_wire_msg_close(&m);
            return rc == PS_EAGAIN ? PS_ETIMEOUT : rc;
        }
        if (m.hdr->request_id == rid) break;
        ps_wire_msg_close(&m);
    }
    int rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : (int)m.hdr->type;
    if (flags) *flags = m.hdr->has_flags ? m.hdr->flags : 0;
    if (iter) *iter = m.hdr->has_iteration ? m.hdr->iteration : UINT64_MAX;
    if (w && rc == PS__MSG_TYPE__MSG_WEIGHTS && m.has_payload &&
        ps_codec_decode(w, m.hdr->numel, zmq_msg_data(&m.payload), zmq_msg_size(&m.payload),
                        (ps_dtype_t)m.hdr->dtype, (ps_codec_t)m.hdr->codec, 0, NULL))
        rc = PS_ECORRUPT;
    ps_wire_msg_close(&m);
    return rc;
}

/* Send h, wait for its reply: type or ERROR code; *flags / *iter of the reply. */
static int call(void *d, Ps__Header *h, const void *pl, size_t len, uint32_t *flags, uint64_t *iter)
{
    h->has_request_id = 1, h->request_id = ++t_rid;
    if (ps_wire_send(d, NULL, 0, h, pl, len, NULL, NULL, 0)) return PS_EZMQ;
    return reply_to(d, h->request_id, flags, iter, NULL);
}

static int rollback(void *d, int has_v, uint64_t v, uint32_t *flags, uint64_t *iter)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ROLLBACK);
    h.has_rank = 1, h.rank = 0;
    h.has_iteration = has_v, h.iteration = v;
    return call(d, &h, NULL, 0, flags, iter);
}

/* Step it pushed as a loss-scale overflow (Inf gradient, PS_FLAG_OVERFLOW) on
 * every partition: 1 if every reply is WEIGHTS of version it + 1 flagged
 * PS_FLAG_OVERFLOW (the skipped update's echo). */
static int step_overflow(void *d, int it)
{
    int good = 1;
    for (uint32_t p = 0; p < T.nparts; p++) {
        size_t n = T.parts[p].numel;
        float g[N];
        for (size_t i = 0; i < n; i++) g[i] = INFINITY;
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, p);
        h.has_iteration = 1, h.iteration = (uint64_t)it;
        h.has_numel = 1, h.numel = n;
        h.has_flags = 1, h.flags = PS_FLAG_OVERFLOW;
        uint32_t fl = 0;
        uint64_t v = 0;
        good &= call(d, &h, g, n * 4, &fl, &v) == PS__MSG_TYPE__MSG_WEIGHTS && v == (uint64_t)it + 1 &&
                (fl & PS_FLAG_OVERFLOW);
    }
    return good;
}

/* OR of the flags of a PULL reply of every partition (-1: not WEIGHTS at want). */
static long pull_flags(void *d, uint64_t want)
{
    long all = 0;
    for (uint32_t p = 0; p < T.nparts; p++) {
        Ps__Header h;
        t_hdr(&h, PS__MSG_TYPE__MSG_PULL, -1, p);
        uint32_t fl = 0;
        uint64_t v = 0;
        if (call(d, &h, NULL, 0, &fl, &v) != PS__MSG_TYPE__MSG_WEIGHTS || v != want) return -1;
        all |= fl;
    }
    return all;
}

/* Rank 1 sends a PUSHPULL of partition p at `it` without waiting; returns
 * its request id (0 on a send error). */
static uint64_t send_push(void *d, int rank, uint32_t p, int it)
{
    size_t n = T.parts[p].numel, off = T.parts[p].offset;
    float g[N];
    for (size_t i = 0; i < n; i++) g[i] = grad_of(it, (int)(off + i));
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, rank, p);
    h.has_iteration = 1, h.iteration = (uint64_t)it;
    h.has_numel = 1, h.numel = n;
    h.has_request_id = 1, h.request_id = ++t_rid;
    return ps_wire_send(d, NULL, 0, &h, g, n * 4, NULL, NULL, 0) ? 0 : h.request_id;
}


/* One sync step of two workers (same gradient) over partitions from.. of
 * T: 1 if both get WEIGHTS of version it + 1, rank 0's into w. */
static int step2(void *d0, void *d1, int it, uint32_t from, float *w)
{
    int good = 1;
    for (uint32_t p = from; p < T.nparts; p++) {
        uint64_t r1 = send_push(d1, 1, p, it), r0 = send_push(d0, 0, p, it), v0 = 0, v1 = 0;
        uint32_t f0, f1;
        good &= r0 && r1 && reply_to(d0, r0, &f0, &v0, w + T.parts[p].offset) == PS__MSG_TYPE__MSG_WEIGHTS &&
                reply_to(d1, r1, &f1, &v1, NULL) == PS__MSG_TYPE__MSG_WEIGHTS && v0 == (uint64_t)it + 1 &&
                v1 == (uint64_t)it + 1;
    }
    return good;
}

/* Rank 1 pushes step `it` of partition 0 (held: rank 0's is missing), then
 * rank 0 pushes partition 1 at `future`.  Rank 0's reply: PS_ESTATE +
 * PS_FLAG_ROLLBACK + *v0; rank 1's request id in *r1. */
static int behind_then_future(void *d0, void *d1, int it, int future, uint64_t *r1, uint64_t *v0)
{
    uint32_t f0 = 0;
    *r1 = send_push(d1, 1, 0, it);
    t_sleep_ms(100); /* rank 1's push is held, waiting for rank 0's */
    uint64_t r0 = send_push(d0, 0, 1, future);
    int rc0 = r0 ? reply_to(d0, r0, &f0, v0, NULL) : PS_EZMQ;
    return rc0 == PS_ESTATE && (f0 & PS_FLAG_ROLLBACK);
}

/* Two workers, rank 1 a step behind rank 0: a server restarted from its
 * checkpoint of 4 while rank 0 had every reply of step 4 and rank 1's
 * reply was lost with it.  Rank 1's push of step 4 waits there for rank 0,
 * and rank 0, at step 5, pushes step 5 there.  That push from the future
 * draws the rollback verdict, and so must the push that waits: else rank 1
 * waits there for rank 0 while rank 0 waits on the other servers for rank
 * 1's step 5 -- until both time out.  On a server that never went back,
 * the same push is a bad message: refused, and the held push stays. */
static void behind_and_ahead(void)
{
    char dir2[300], spec2[4096];
    snprintf(dir2, sizeof dir2, "%s-2w", dir);
    mkdir(dir2, 0755);
    t_spec_json(spec2, sizeof spec2, TS, NT, 512, 1, 2, OPTIM);
    const char *args[] = {"--num-workers", "2", "--worker-timeout-ms", "0", "--checkpoint-dir", dir2,
                          "--checkpoint-every-steps", "2", "--log-level", "info", NULL};
    tpsd_t S;
    if (tpsd_start(&S, "rollback2", args)) {
        ok(0, "2-worker psd started");
        return;
    }
    void *d0 = t_dealer(S.port), *d1 = t_dealer(S.port);
    float w5[N], w[N], x[N], winit[N];
    for (int i = 0; i < N; i++) winit[i] = 0.2f * sinf(0.3f * i);
    int good = t_init_spec(d0, spec2, T.hash, NULL) == PS__MSG_TYPE__MSG_ACK;
    for (uint32_t p = 0; p < T.nparts; p++)
        good &= t_init_part(d0, p, winit + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    for (int it = 0; it < 4; it++) good &= step2(d0, d1, it, 0, w);
    if (!ok(good, "2 workers: 4 steps")) tpsd_dump_log(&S, 20);
    t_sleep_ms(300); /* the aligned checkpoint of version 4 */

    /* bad input: a server that never went back keeps rank 1's held push */
    uint64_t r1 = 0, v0 = 0, v1 = 0;
    uint32_t f1 = 0;
    int verdict = behind_then_future(d0, d1, 4, 9, &r1, &v0);
    ok(verdict && v0 == 4,
       "a forged push of step 9 -> PS_ESTATE, PS_FLAG_ROLLBACK, version 4 (%llu)", (unsigned long long)v0);
    uint64_t r0 = send_push(d0, 0, 0, 4);
    int rc0 = r0 ? reply_to(d0, r0, &f1, &v0, w5) : PS_EZMQ;
    int rc1 = r1 ? reply_to(d1, r1, &f1, &v1, NULL) : PS_EZMQ;
    ok(rc0 == PS__MSG_TYPE__MSG_WEIGHTS && rc1 == PS__MSG_TYPE__MSG_WEIGHTS && v0 == 5 && v1 == 5,
       "... and disturbs no one: rank 1's held push of step 4 completes with rank 0's (WEIGHTS 5)");
    ok(step2(d0, d1, 4, 1, w5), "step 4 on the other partitions");
    zmq_close(d0);
    zmq_close(d1);
    is_int(tpsd_stop(&S, SIGKILL), 128 + SIGKILL, "psd SIGKILLed at version 5");

    /* the same server restarted from its checkpoint of 4 */
    if (tpsd_start(&S, "rollback2", args)) {
        ok(0, "2-worker psd restarted");
        return;
    }
    d0 = t_dealer(S.port), d1 = t_dealer(S.port);
    verdict = behind_then_future(d0, d1, 4, 5, &r1, &v0);
    ok(verdict && v0 == 4,
       "restarted at 4: rank 0's push of step 5 -> PS_ESTATE, PS_FLAG_ROLLBACK, version 4 (%llu)",
       (unsigned long long)v0);
    rc1 = r1 ? reply_to(d1, r1, &f1, &v1, NULL) : PS_EZMQ;
    if (!ok(rc1 == PS_ESTATE && (f1 & PS_FLAG_ROLLBACK) && v1 == 4,
            "rank 1's waiting push of step 4 answered with the same verdict, not left waiting (%s, "
            "flags %u, %llu)", rc1 < 0 ? ps_strerror(rc1) : "a reply", f1, (unsigned long long)v1))
        tpsd_dump_log(&S, 10);
    uint32_t fl;
    uint64_t it;
    is_int(rollback(d0, 1, 4, &fl, &it), PS__MSG_TYPE__MSG_ACK, "ROLLBACK to 4 (partitions at 4: a no-op)");
    ok(step2(d0, d1, 4, 0, w) && !memcmp(w, w5, sizeof w),
       "both redo step 4: WEIGHTS of version 5, bitwise those before the kill");
    is_int(rollback(d0, 1, 4, &fl, &it), PS__MSG_TYPE__MSG_ACK, "ROLLBACK to 4 from the checkpoint");
    ok(step2(d0, d1, 4, 0, x) && !memcmp(x, w5, sizeof x),
       "step 4 redone again: the same, bitwise (the dropped push left nothing behind)");
    zmq_close(d0);
    zmq_close(d1);
    is_int(tpsd_stop(&S, SIGTERM), 0, "2-worker psd exits 0");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir2);
    if (system(cmd) != 0) diag("could not remove %s", dir2);
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, NT, 512, 1)) tap_skip_all("partition table unavailable");
    snprintf(dir, sizeof dir, "/tmp/psd-test-rollback-dir-%d", (int)getpid());
    mkdir(dir, 0755);
    t_spec_json(spec, sizeof spec, TS, NT, 512, 1, 1, OPTIM);
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--checkpoint-dir", dir,
                          "--checkpoint-every-steps", "2", "--log-level", "info", NULL};
    tpsd_t S;
    if (tpsd_start(&S, "rollback", args)) {
        ok(0, "psd started");
        return tap_done();
    }
    void *d = t_dealer(S.port);
    float w[N], w4[N], w5[N], x[N], winit[N];
    for (int i = 0; i < N; i++) winit[i] = 0.2f * sinf(0.3f * i);
    int good = t_init_spec(d, spec, T.hash, NULL) == PS__MSG_TYPE__MSG_ACK;
    for (uint32_t p = 0; p < T.nparts; p++)
        good &= t_init_part(d, p, winit + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    ok(good, "INIT");
    good = 1;
    for (int it = 0; it < 4; it++) good &= t_step_sync(d, &T, it, w, grad_of);
    memcpy(w4, w, sizeof w);
    good &= t_step_sync(d, &T, 4, w5, grad_of);
    if (!ok(good, "5 steps")) tpsd_dump_log(&S, 20);
    t_sleep_ms(300); /* the aligned checkpoint of version 4 is written off the loop thread */

    uint32_t fl = 0;
    uint64_t it = 0;
    is_int(rollback(d, 0, 0, &fl, &it), PS_EPROTO, "ROLLBACK without iteration -> PS_EPROTO");
    is_int(rollback(d, 1, 3, &fl, &it), PS_ENOTFOUND, "ROLLBACK to 3 (no aligned checkpoint) -> PS_ENOTFOUND");
    ok(t_pull_all(d, &T, x, NULL, 5) && !memcmp(x, w5, sizeof x), "... nothing changed (version 5, same weights)");
    is_int(rollback(d, 1, 6, &fl, &it), PS_ESTATE, "ROLLBACK to 6 (above the server) -> PS_ESTATE");
    ok((fl & PS_FLAG_ROLLBACK) && it == 5, "... flagged PS_FLAG_ROLLBACK with the server's version 5 "
       "(flags %u, iteration %llu)", fl, (unsigned long long)it);

    is_int(rollback(d, 1, 4, &fl, &it), PS__MSG_TYPE__MSG_ACK, "ROLLBACK to 4 -> ACK");
    ok(it == 4, "... ACK iteration 4 (%llu)", (unsigned long long)it);
    ok(t_pull_all(d, &T, x, NULL, 4) && !memcmp(x, w4, sizeof x), "weights bitwise those of version 4");
    is_int(rollback(d, 1, 4, &fl, &it), PS__MSG_TYPE__MSG_ACK, "repeated ROLLBACK to 4 -> ACK (no-op)");
    {
        Ps__Header h;
        float g[N] = {0};
        t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, 0);
        h.has_iteration = 1, h.iteration = 7;
        h.has_numel = 1, h.numel = T.parts[0].numel;
        is_int(call(d, &h, g, T.parts[0].numel * 4, &fl, &it), PS_ESTATE, "push for iteration 7 -> PS_ESTATE");
        ok((fl & PS_FLAG_ROLLBACK) && it == 4, "... flagged PS_FLAG_ROLLBACK, iteration 4 (flags %u, %llu)", fl,
           (unsigned long long)it);
    }
    ok(t_step_sync(d, &T, 4, x, grad_of), "step 4 again");
    ok(!memcmp(x, w5, sizeof x), "redone step 4 == the first step 4, bitwise (momentum and schedule restored)");
    /* A rolled-back skipped step: the overflow echo (skipped_ver) belongs
     * to the abandoned version and must not survive the rollback. */
    is_int(rollback(d, 1, 4, &fl, &it), PS__MSG_TYPE__MSG_ACK, "ROLLBACK to 4 again");
    ok(step_overflow(d, 4), "step 4 as a loss-scale overflow: WEIGHTS 5 flagged PS_FLAG_OVERFLOW");
    ok(t_pull_all(d, &T, x, NULL, 5) && !memcmp(x, w4, sizeof x), "... the update was skipped (weights of version 4)");
    is_int(rollback(d, 1, 4, &fl, &it), PS__MSG_TYPE__MSG_ACK, "ROLLBACK to 4 undoes the skipped step");
    long pf = pull_flags(d, 4);
    ok(pf == 0, "... PULL at 4: no PS_FLAG_OVERFLOW (flags %ld)", pf);
    ok(t_step_sync(d, &T, 4, x, grad_of) && !memcmp(x, w5, sizeof x), "step 4 redone normally == the first step 4, bitwise");
    pf = pull_flags(d, 5);
    ok(pf == 0, "... and version 5 is not flagged as skipped (flags %ld)", pf);
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0");

    behind_and_ahead();

    const char *aargs[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--mode", "async", NULL};
    if (tpsd_start(&S, "rollback", aargs)) {
        ok(0, "async psd started");
        return tap_done();
    }
    d = t_dealer(S.port);
    good = t_init_spec(d, spec, T.hash, NULL) == PS__MSG_TYPE__MSG_ACK;
    is_int(rollback(d, 1, 0, &fl, &it), PS_EUNSUPPORTED, "async: ROLLBACK -> PS_EUNSUPPORTED");
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "async psd exits 0");
    if (!getenv("PSD_KEEP_LOG")) unlink(S.log); /* both runs appended to it */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) diag("could not remove %s", dir);
    return tap_done();
}
