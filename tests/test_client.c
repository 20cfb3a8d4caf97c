/* Client library against scripted fake servers (tests/lib/fake_psd.c): data
 * arrives intact for every dtype x codec, front-of-model priority, retries
 * of lost requests and lost replies (no doubled update), duplicate replies
 * ignored, ERROR replies, timeouts, handle reuse, reconnect to a restarted
 * server, control messages, no cross-worker deadlock against a sync
 * fake for two workers however pushes are submitted, and cancelling a
 * request that waits on the other worker.  The fake applies
 * w -= g (lr 1, one worker; the sync fake w -= the sum), so every expected
 * value is computed independently here in fp32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/lib/fake_psd.h"
#include "worker/client/ps_client.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"
#include "tests/lib/client_testutil.h"
#include "tests/lib/tap.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static ps_client_t *connect1(const ps_partition_table_t *t, fake_psd_t *f, int nf,
                             ps_dtype_t dt, ps_codec_t codec, int retry_ms, int timeout_ms,
                             int max_inflight)
{
    const char *eps[4];
    for (int i = 0; i < nf; i++) eps[i] = f[i].endpoint;
    ps_client_opts_t o;
    ps_client_opts_default(&o);
    o.servers = eps;
    o.nservers = nf;
    o.dtype = dt;
    o.codec = codec;
    o.retry_ms = retry_ms;
    o.timeout_ms = timeout_ms;
    o.heartbeat_ms = 0;
    if (max_inflight) o.max_inflight = max_inflight;
    ps_client_t *c = NULL;
    int rc = ps_client_new(&c, &o, t);
    if (rc) diag("ps_client_new: %s", ps_strerror(rc));
    return c;
}

/* Values exactly representable in fp16 and bf16 (and their differences). */
static float w0_of(size_t i) { return (float)((int)(i % 64) - 32) / 8.0f; }
static float g_of(size_t i, int it) { return (float)((int)((i * 7 + (size_t)it) % 16) - 8) / 16.0f; }

static void test_roundtrip(ps_dtype_t dt, ps_codec_t codec)
{
    static const size_t sizes[] = {1, 1000, 4097, 65536};
    ps_partition_table_t t;
    make_table(&t, 4, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    ps_client_t *c = connect1(&t, &f, 1, dt, codec, 0, 60000, 0);
    const char *tag = ps_dtype_name(dt), *ctag = ps_codec_name(codec);

    is_int(ps_client_hello(c), 0, "%s/%s: hello assigns rank 0", tag, ctag);
    is_int(ps_client_rank(c), 0, "%s/%s: rank kept", tag, ctag);
    float *w = malloc(t.total_numel * sizeof *w), *g = malloc(t.total_numel * sizeof *g);
    float *dst = malloc(t.total_numel * sizeof *dst), *want = malloc(t.total_numel * sizeof *want);
    for (size_t i = 0; i < t.total_numel; i++) w[i] = w0_of(i);
    int ck = -1;
    is_int(ps_client_init(c, "{\"tensors\":[]}", w, &ck), 0, "%s/%s: init", tag, ctag);
    is_int(ck, 0, "%s/%s: not from checkpoint", tag, ctag);
    is_int(f.nspec, 1, "%s/%s: one spec INIT", tag, ctag);
    is_int(f.ninit_w, 4, "%s/%s: one weight INIT per partition", tag, ctag);
    int same = 1;
    for (uint32_t p = 0; p < 4; p++)
        same &= memcmp(f.w[p], w + t.parts[p].offset, sizeof(float) * t.parts[p].numel) == 0;
    ok(same, "%s/%s: server holds the initial weights bit for bit", tag, ctag);

    /* pushpull every partition at once */
    ps_req_t *r[4];
    for (size_t i = 0; i < t.total_numel; i++) {
        g[i] = g_of(i, 0);
        want[i] = w[i] - g[i];
        dst[i] = -999.0f;
    }
    int rc = 0;
    for (uint32_t p = 0; p < 4; p++) {
        size_t o = t.parts[p].offset;
        rc |= ps_client_pushpull(c, p, 0, g + o, dst + o, 0, &r[p]);
    }
    is_int(rc, 0, "%s/%s: pushpull submitted", tag, ctag);
    int vok = 1;
    for (uint32_t p = 0; p < 4; p++) {
        uint64_t v = 0;
        rc |= ps_client_wait(c, r[p], -1, &v);
        vok &= v == 1;
    }
    is_int(rc, 0, "%s/%s: pushpull completed", tag, ctag);
    ok(vok, "%s/%s: weights come back with version 1", tag, ctag);
    ok(memcmp(dst, want, t.total_numel * sizeof *dst) == 0,
       "%s/%s: pulled weights == w0 - g exactly", tag, ctag);

    /* push (ACK) then pull of a later version */
    for (size_t i = 0; i < t.total_numel; i++) {
        g[i] = g_of(i, 1);
        want[i] -= g[i];
    }
    for (uint32_t p = 0; p < 4; p++) rc |= ps_client_push(c, p, 1, g + t.parts[p].offset, 0, &r[p]);
    for (uint32_t p = 0; p < 4; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    is_int(rc, 0, "%s/%s: push acked", tag, ctag);
    memset(dst, 0, t.total_numel * sizeof *dst);
    uint64_t v = 0;
    for (uint32_t p = 0; p < 4; p++) rc |= ps_client_pull(c, p, 2, dst + t.parts[p].offset, &r[p]);
    for (uint32_t p = 0; p < 4; p++) rc |= ps_client_wait(c, r[p], -1, &v);
    is_int(rc, 0, "%s/%s: pull min_version 2", tag, ctag);
    is_int(v, 2, "%s/%s: version 2", tag, ctag);
    ok(memcmp(dst, want, t.total_numel * sizeof *dst) == 0, "%s/%s: w0 - g0 - g1 exactly", tag,
       ctag);

    /* arbitrary values: rounding within the wire dtype's precision */
    for (uint32_t p = 0; p < 4; p++)
        for (size_t i = 0; i < t.parts[p].numel; i++) {
            double x = sin((double)(i + 17 * p)) * 3.0;
            f.w[p][i] = (float)(x + (x >= 0 ? 0.01 : -0.01));
            want[t.parts[p].offset + i] = f.w[p][i];
        }
    for (uint32_t p = 0; p < 4; p++) rc |= ps_client_pull(c, p, 0, dst + t.parts[p].offset, &r[p]);
    for (uint32_t p = 0; p < 4; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    double rtol = dt == PS_DT_FP32 ? 0 : dt == PS_DT_FP16 ? 1.0 / 2048 : 1.0 / 256;
    is_int(rc, 0, "%s/%s: pull of arbitrary values", tag, ctag);
    allclose(dst, want, (long)t.total_numel, 0, rtol, "arbitrary values within wire precision");

    ps_client_counters_t k;
    ps_client_counters(c, &k);
    ok(k.requests == 1 + 1 + 4 + 12 + 4, "%s/%s: request counter (%llu)", tag, ctag,
       (unsigned long long)k.requests);
    ok(k.bytes_out > 0 && k.bytes_in > 0 && k.retries == 0 && k.errors == 0,
       "%s/%s: byte counters move, no retries or errors", tag, ctag);
    ps_client_destroy(&c);
    ok(c == NULL, "destroy NULLs the pointer");
    fake_psd_stop(&f);
    free(w);
    free(g);
    free(dst);
    free(want);
    free_table(&t);
}

static void test_priority(void)
{
    size_t sizes[8];
    for (int i = 0; i < 8; i++) sizes[i] = 256;
    ps_partition_table_t t;
    make_table(&t, 8, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    ps_client_t *c = connect1(&t, &f, 1, PS_DT_FP32, PS_CODEC_RAW, 0, 60000, 1);
    float dst[8][256];
    ps_req_t *r[8];
    int rc = 0;
    /* 7 goes out alone (max_inflight 1) to a server that does not answer
     * yet; the rest, submitted back to front meanwhile, must then leave
     * front first. */
    ps_client_counters_t k;
    int ready = 0;
    rc |= ps_client_pull(c, 0, 0, dst[0], &r[0]); /* connect first */
    rc |= ps_client_wait(c, r[0], -1, NULL);
    pthread_mutex_lock(&f.mu);
    f.norder = 0;
    pthread_mutex_unlock(&f.mu);
    atomic_store(&f.stall, 1);
    ps_client_counters(c, &k);
    uint64_t out0 = k.bytes_out; /* no heartbeats: only requests move it */
    rc |= ps_client_pull(c, 7, 0, dst[7], &r[7]);
    for (int i = 0; i < 5000 && !ready; i++) { /* until 7 is on the wire */
        ps_client_counters(c, &k);
        ready = k.bytes_out > out0;
        if (!ready) usleep(1000);
    }
    ok(ready, "priority: the first request went out alone");
    for (int p = 6; p >= 0; p--) rc |= ps_client_pull(c, (uint32_t)p, 0, dst[p], &r[p]);
    usleep(20 * 1000);
    atomic_store(&f.stall, 0);
    for (int p = 0; p < 8; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    is_int(rc, 0, "priority: all pulls done");
    is_int(f.norder, 8, "priority: 8 requests arrived");
    int asc = f.norder == 8 && f.order[0] == 7;
    for (int i = 1; i < f.norder; i++) asc &= f.order[i] == (uint32_t)(i - 1);
    ok(asc, "priority: queued partitions go out in id order (7 first, then 0..6)");
    diag("arrival order: %u %u %u %u %u %u %u %u", f.order[0], f.order[1], f.order[2], f.order[3],
         f.order[4], f.order[5], f.order[6], f.order[7]);
    ps_client_destroy(&c);
    fake_psd_stop(&f);
    free_table(&t);
}

static void test_faults(void)
{
    static const size_t sizes[] = {1000, 3000, 500};
    ps_partition_table_t t;
    make_table(&t, 3, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    /* Fast retries; the timeout stays generous (a loaded CI machine), a
     * second client below has a short one. */
    ps_client_t *c = connect1(&t, &f, 1, PS_DT_FP32, PS_CODEC_LZ4, 40, 20000, 0);
    float w[4500], g[4500], dst[4500], want[4500];
    for (int i = 0; i < 4500; i++) w[i] = w0_of((size_t)i);
    ps_client_hello(c);
    ps_client_init(c, "{}", w, NULL);
    memcpy(want, w, sizeof w);
    ps_req_t *r[3];
    int rc = 0, it = 0;

    /* lost requests: resent after retry_ms */
    atomic_store(&f.drop_requests, 2);
    for (int i = 0; i < 4500; i++) {
        g[i] = g_of((size_t)i, it);
        want[i] -= g[i];
    }
    for (uint32_t p = 0; p < 3; p++)
        rc |= ps_client_pushpull(c, p, (uint64_t)it, g + t.parts[p].offset, dst + t.parts[p].offset,
                                 0, &r[p]);
    for (uint32_t p = 0; p < 3; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    ps_client_counters_t k;
    ps_client_counters(c, &k);
    is_int(rc, 0, "lost requests: pushpull still succeeds");
    ok(k.retries >= 2, "lost requests: resent (%llu retries)", (unsigned long long)k.retries);
    ok(memcmp(dst, want, sizeof dst) == 0, "lost requests: weights right");

    /* lost replies: the resend must not apply the gradient twice */
    it++;
    int applied0 = f.napplied;
    atomic_store(&f.drop_replies, 3);
    for (int i = 0; i < 4500; i++) {
        g[i] = g_of((size_t)i, it);
        want[i] -= g[i];
    }
    for (uint32_t p = 0; p < 3; p++)
        rc |= ps_client_pushpull(c, p, (uint64_t)it, g + t.parts[p].offset, dst + t.parts[p].offset,
                                 0, &r[p]);
    for (uint32_t p = 0; p < 3; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    is_int(rc, 0, "lost replies: pushpull succeeds");
    is_int(f.napplied - applied0, 3, "lost replies: each partition updated exactly once");
    ok(memcmp(dst, want, sizeof dst) == 0, "lost replies: weights right");

    /* duplicated replies over many reused handles */
    atomic_store(&f.dup_replies, 1);
    int bad = 0;
    for (int n = 0; n < 60; n++) {
        it++;
        for (int i = 0; i < 4500; i++) {
            g[i] = g_of((size_t)i, it);
            want[i] -= g[i];
        }
        for (uint32_t p = 0; p < 3; p++)
            rc |= ps_client_pushpull(c, p, (uint64_t)it, g + t.parts[p].offset,
                                     dst + t.parts[p].offset, 0, &r[p]);
        for (uint32_t p = 0; p < 3; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
        bad += memcmp(dst, want, sizeof dst) != 0;
    }
    atomic_store(&f.dup_replies, 0);
    is_int(rc, 0, "duplicate replies: 60 steps succeed");
    is_int(bad, 0, "duplicate replies: weights right at every step");

    /* ERROR reply for one partition; the others in the same batch succeed */
    it++;
    atomic_store(&f.err_part, 1);
    int rcs[3];
    for (int i = 0; i < 4500; i++) g[i] = 0;
    for (uint32_t p = 0; p < 3; p++)
        ps_client_pushpull(c, p, (uint64_t)it, g + t.parts[p].offset, dst + t.parts[p].offset, 0,
                           &r[p]);
    for (uint32_t p = 0; p < 3; p++) rcs[p] = ps_client_wait(c, r[p], -1, NULL);
    is_int(rcs[1], PS_ESTALE, "ERROR reply: the server's code comes back");
    ok(strstr(ps_client_last_error(c), "fake stale") != NULL, "ERROR reply: text kept: %s",
       ps_client_last_error(c));
    ok(rcs[0] == 0 && rcs[2] == 0, "ERROR reply: other partitions unaffected");
    atomic_store(&f.err_part, -1);

    /* a reply that does not fit the request is refused, dst untouched */
    atomic_store(&f.bad_weights, 0);
    for (int i = 0; i < 1000; i++) dst[i] = 7.0f;
    rc = ps_client_pull(c, 0, 0, dst, &r[0]);
    rc |= ps_client_wait(c, r[0], -1, NULL);
    is_int(rc, PS_EMISMATCH, "WEIGHTS with the wrong numel refused");
    ok(dst[0] == 7.0f && dst[999] == 7.0f, "... and dst is untouched");
    atomic_store(&f.bad_weights, -1);

    /* malformed and unsolicited replies are dropped; the real one still counts */
    ps_client_counters(c, &k);
    uint64_t errors0 = k.errors;
    atomic_store(&f.garbage, 1);
    rc = 0;
    for (uint32_t p = 0; p < 3; p++) rc |= ps_client_pull(c, p, 0, dst + t.parts[p].offset, &r[p]);
    for (uint32_t p = 0; p < 3; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    atomic_store(&f.garbage, 0);
    is_int(rc, 0, "garbage replies: pulls still succeed");
    int same = 1;
    for (uint32_t p = 0; p < 3; p++)
        same &= memcmp(dst + t.parts[p].offset, f.w[p], t.parts[p].numel * sizeof(float)) == 0;
    ok(same, "garbage replies: the real weights arrive");
    ps_client_counters(c, &k);
    ok(k.errors - errors0 >= 3 * 7, "garbage replies: counted as errors (%llu)",
       (unsigned long long)(k.errors - errors0));
    {
        /* retries off: a corrupt reply fails its request with the reason */
        ps_client_t *c3 = connect1(&t, &f, 1, PS_DT_FP32, PS_CODEC_RAW, 0, 20000, 0);
        atomic_store(&f.garbage, 1);
        rc = ps_client_pull(c3, 0, 0, dst, &r[0]);
        rc |= ps_client_wait(c3, r[0], -1, NULL);
        atomic_store(&f.garbage, 0);
        ok(rc == PS_EPROTO || rc == PS_ECORRUPT,
           "garbage replies, no retries: the request fails at once (%s: %s)", ps_errname(rc),
           ps_client_last_error(c3));
        ps_client_destroy(&c3);
    }

    /* a partition nobody answers: retried, then PS_ETIMEOUT */
    ps_client_t *c2 = connect1(&t, &f, 1, PS_DT_FP32, PS_CODEC_RAW, 40, 400, 0);
    atomic_store(&f.silent_part, 2);
    double t0 = now_s();
    rc = ps_client_pull(c2, 2, 0, dst + 4000, &r[2]);
    rc |= ps_client_wait(c2, r[2], -1, NULL);
    double el = now_s() - t0;
    is_int(rc, PS_ETIMEOUT, "silent server: PS_ETIMEOUT");
    ok(el > 0.3 && el < 20.0, "silent server: after about timeout_ms (%.3f s)", el);
    ps_client_counters(c2, &k);
    ok(k.retries >= 2, "silent server: resent with backoff before giving up (%llu)",
       (unsigned long long)k.retries);
    ok(strstr(ps_client_last_error(c2), "no reply") != NULL, "timeout text: %s",
       ps_client_last_error(c2));
    ps_client_destroy(&c2);
    atomic_store(&f.silent_part, -1);

    /* wait's own timeout keeps the handle */
    atomic_store(&f.delay_ms, 150);
    int pend = -1;
    rc = ps_client_pull(c, 0, 0, dst, &r[0]);
    int rc1 = ps_client_wait_ex(c, r[0], 10, NULL, &pend);
    is_int(rc1, PS_ETIMEOUT, "wait(10 ms) on a slow reply times out");
    is_int(pend, 1, "... and the handle is still pending");
    rc1 = ps_client_wait_ex(c, r[0], -1, NULL, &pend);
    ok(rc1 == 0 && pend == 0, "waiting again completes it");
    atomic_store(&f.delay_ms, 0);

    /* handles are recycled: many more requests than the pool holds */
    int fails = 0;
    for (int n = 0; n < 3000; n++) {
        if (ps_client_pull(c, (uint32_t)(n % 3), 0, dst + t.parts[n % 3].offset, &r[0]) ||
            ps_client_wait(c, r[0], -1, NULL))
            fails++;
    }
    is_int(fails, 0, "3000 sequential requests through a recycled pool");

    /* caller errors */
    is_int(ps_client_pull(c, 3, 0, dst, &r[0]), PS_ERANGE, "partition out of range");
    is_int(ps_client_push(c, 0, 0, NULL, 0, &r[0]), PS_EINVAL, "NULL gradient");
    ps_req_t *bogus = (ps_req_t *)(void *)dst;
    is_int(ps_client_wait(c, bogus, 0, NULL), PS_EINVAL, "foreign handle refused");

    /* PS_FLAG_NO_REPLY push completes once sent; a later pull sees it */
    it++;
    for (int i = 0; i < 4500; i++) {
        g[i] = g_of((size_t)i, it);
        want[i] -= g[i];
    }
    rc = 0;
    /* (partition 1 missed the iteration that got an ERROR: versions differ) */
    uint64_t ver[3] = {f.version[0], f.version[1], f.version[2]};
    for (uint32_t p = 0; p < 3; p++)
        rc |= ps_client_push(c, p, ver[p], g + t.parts[p].offset, PS_FLAG_NO_REPLY, &r[p]);
    for (uint32_t p = 0; p < 3; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    for (uint32_t p = 0; p < 3; p++)
        rc |= ps_client_pull(c, p, ver[p] + 1, dst + t.parts[p].offset, &r[p]);
    for (uint32_t p = 0; p < 3; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    is_int(rc, 0, "NO_REPLY push then pull");
    ok(memcmp(dst, want, sizeof dst) == 0, "NO_REPLY push applied");

    ps_client_destroy(&c);
    fake_psd_stop(&f);
    free_table(&t);
}

static void test_control(void)
{
    static const size_t sizes[] = {100, 200, 300, 400, 500, 600};
    ps_partition_table_t t;
    make_table(&t, 6, 2, sizes);
    fake_psd_t f[2];
    fake_psd_start(&f[0], 0, &t, 0);
    fake_psd_start(&f[1], 1, &t, 0);
    const char *eps[2] = {f[0].endpoint, f[1].endpoint};
    ps_client_opts_t o;
    ps_client_opts_default(&o);
    o.servers = eps;
    o.nservers = 2;
    o.heartbeat_ms = 30;
    o.rank = 3;
    o.num_workers = 4;
    ps_client_t *c = NULL;
    is_int(ps_client_new(&c, &o, &t), 0, "two servers: client created");
    is_int(ps_client_hello(c), 3, "configured rank confirmed");
    float w[2100], dst[2100];
    for (int i = 0; i < 2100; i++) w[i] = (float)i;
    int ck = -1;
    is_int(ps_client_init(c, "{\"x\":1}", w, &ck), 0, "init on two servers");
    ok(f[0].nspec == 1 && f[1].nspec == 1, "spec sent to every server");
    ok(f[0].ninit_w == 3 && f[1].ninit_w == 3, "weights sent to each partition's owner");
    ps_req_t *r[6];
    int rc = 0;
    for (uint32_t p = 0; p < 6; p++) rc |= ps_client_pull(c, p, 0, dst + t.parts[p].offset, &r[p]);
    for (uint32_t p = 0; p < 6; p++) rc |= ps_client_wait(c, r[p], -1, NULL);
    ok(rc == 0 && memcmp(dst, w, sizeof w) == 0, "pulls from both servers give the initial weights");
    is_int(ps_client_barrier(c), 0, "barrier");
    is_int(f[0].nbarrier, 1, "barrier goes to server 0");
    char *js = NULL;
    is_int(ps_client_stats(c, 1, &js), 0, "stats");
    ok(js && strstr(js, "\"server\":1"), "stats body from server 1: %s", js ? js : "(null)");
    free(js);
    is_int(ps_client_checkpoint(c, 1), 0, "checkpoint");
    is_int(f[1].nckpt, 1, "checkpoint reached server 1");
    usleep(300 * 1000);
    ok(f[0].nheartbeat >= 2 && f[1].nheartbeat >= 2, "heartbeats to both servers (%d, %d)",
       f[0].nheartbeat, f[1].nheartbeat);
    is_int(ps_client_shutdown_servers(c), 0, "shutdown");
    ok(f[0].nshutdown == 1 && f[1].nshutdown == 1, "shutdown reached both");
    ps_client_destroy(&c);
    usleep(100 * 1000);
    ok(f[0].nbye == 1 && f[1].nbye == 1, "BYE on destroy");

    /* servers restored from a checkpoint: no weights sent */
    f[0].from_ckpt = f[1].from_ckpt = 1;
    o.heartbeat_ms = 0;
    ps_client_new(&c, &o, &t);
    ps_client_hello(c);
    ck = -1;
    is_int(ps_client_init(c, "{\"x\":1}", w, &ck), 0, "init against checkpointed servers");
    is_int(ck, 1, "from_ckpt reported");
    ok(f[0].ninit_w == 3 && f[1].ninit_w == 3, "no weight INITs sent");
    ps_client_destroy(&c);

    /* wrong table hash */
    f[0].table_hash ^= 1;
    ps_client_new(&c, &o, &t);
    is_int(ps_client_hello(c), PS_EMISMATCH, "hello with a different table hash refused");
    ok(strstr(ps_client_last_error(c), "hash") != NULL, "... saying why: %s",
       ps_client_last_error(c));
    ps_client_destroy(&c);

    o.nservers = 1;
    is_int(ps_client_new(&c, &o, &t), PS_EMISMATCH, "server count must match the table");
    ok(c == NULL, "no client on error");
    fake_psd_stop(&f[0]);
    fake_psd_stop(&f[1]);
    free_table(&t);
}

static void test_restart(void)
{
    static const size_t sizes[] = {5000};
    ps_partition_table_t t;
    make_table(&t, 1, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    int port = atoi(strrchr(f.endpoint, ':') + 1);
    fake_psd_stop(&f);
    /* the server is down when the request is made, and comes back later */
    fake_psd_t f2;
    memset(&f2, 0, sizeof f2);
    snprintf(f2.endpoint, sizeof f2.endpoint, "tcp://127.0.0.1:%d", port);
    ps_client_t *c = connect1(&t, &f2, 1, PS_DT_BF16, PS_CODEC_RAW, 100, 60000, 0);
    float dst[5000];
    for (int i = 0; i < 5000; i++) dst[i] = 1.0f;
    ps_req_t *r;
    int rc = ps_client_pull(c, 0, 0, dst, &r);
    usleep(300 * 1000);
    if (fake_psd_start(&f2, 0, &t, port) < 0) {
        ok(1, "# SKIP port %d taken meanwhile", port);
        ps_client_wait(c, r, -1, NULL);
    } else {
        rc |= ps_client_wait(c, r, -1, NULL);
        is_int(rc, 0, "request made while the server was down completes after it starts");
        ok(dst[0] == 0.0f && dst[4999] == 0.0f, "... with the new server's weights");
    }
    ps_client_destroy(&c);
    fake_psd_stop(&f2);
    free_table(&t);
}

/* A server that accepted the connection and then stopped reading: frames
 * stay inside ZeroMQ (zero-copy, pointing at the caller's gradient).  The
 * requests must still time out and hand the buffers back, and the client
 * must work again once the server does. */
static void test_hung_server(void)
{
    static const size_t sizes[] = {(size_t)1 << 20};
    ps_partition_table_t t;
    make_table(&t, 1, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    ps_client_t *c = connect1(&t, &f, 1, PS_DT_FP32, PS_CODEC_RAW, 0, 1500, 0);
    float *g = calloc(sizes[0], sizeof *g);
    ps_req_t *r[8];
    int rc = ps_client_pull(c, 0, 0, g, &r[0]);
    rc |= ps_client_wait(c, r[0], -1, NULL);
    is_int(rc, 0, "hung server: connected");
    atomic_store(&f.stall, 1);
    usleep(50 * 1000);
    int n = 0, timeouts = 0;
    for (int i = 0; i < 8; i++) n += ps_client_push(c, 0, 0, g, 0, &r[i]) == 0;
    double t0 = now_s();
    for (int i = 0; i < n; i++) timeouts += ps_client_wait(c, r[i], -1, NULL) == PS_ETIMEOUT;
    double el = now_s() - t0;
    is_int(timeouts, 8, "hung server: all 8 pushes of 4 MiB time out");
    ok(el < 20, "hung server: and their buffers come back (%.2f s)", el);
    atomic_store(&f.stall, 0);
    rc = ps_client_pull(c, 0, 0, g, &r[0]);
    rc |= ps_client_wait(c, r[0], -1, NULL);
    is_int(rc, 0, "hung server: works again after it recovers");
    ps_client_destroy(&c);
    fake_psd_stop(&f);
    free(g);
    free_table(&t);
}

/* The cross-worker deadlock of a reply-bounded push window (ps_client.h,
 * "Flow control"): against a sync server for 2 workers, A pushes the back
 * half of the model one partition at a time (as backward produces it), then
 * B submits the whole step at once, then A the front half.  With at most
 * max_inflight pushes awaiting replies, A's window would hold the back
 * partitions and B's (lowest id first) the front ones, each waiting in the
 * server for the other's copy: nothing completes until timeout_ms.  The
 * client must finish the step, for any max_inflight and send queue. */
static ps_client_t *connect_sync(const ps_partition_table_t *t, fake_psd_t *f, int max_inflight,
                                 size_t sendq)
{
    const char *eps[1] = {f->endpoint};
    ps_client_opts_t o;
    ps_client_opts_default(&o);
    o.servers = eps;
    o.nservers = 1;
    o.num_workers = 2;
    o.retry_ms = 0;         /* a resend would not free a window anyway */
    o.timeout_ms = 10000;   /* a deadlock fails the waits instead of hanging */
    o.heartbeat_ms = 0;
    if (max_inflight) o.max_inflight = max_inflight;
    if (sendq) o.send_queue_bytes = sendq;
    ps_client_t *c = NULL;
    int rc = ps_client_new(&c, &o, t);
    if (rc) diag("ps_client_new: %s", ps_strerror(rc));
    return c;
}

static void test_sync_no_deadlock(int max_inflight, size_t sendq, const char *tag)
{
    enum { NP = 24, NE = 1000 };  /* 24 partitions > 2 x the default window */
    size_t sizes[NP];
    for (int i = 0; i < NP; i++) sizes[i] = NE;
    ps_partition_table_t t;
    make_table(&t, NP, 1, sizes);
    fake_psd_t f;
    fake_psd_start_sync(&f, 0, &t, 0, 2);
    ps_client_t *a = connect_sync(&t, &f, max_inflight, sendq);
    ps_client_t *b = connect_sync(&t, &f, max_inflight, sendq);
    int ra = ps_client_hello(a), rb = ps_client_hello(b);
    ok(ra >= 0 && rb >= 0 && ra != rb, "%s: two workers, ranks %d and %d", tag, ra, rb);
    static float ga[NP * NE], gb[NP * NE], da[NP * NE], db[NP * NE], want[NP * NE];
    for (size_t i = 0; i < NP * NE; i++) {
        ga[i] = (float)((int)(i % 13) - 6) / 4.0f; /* exact sums */
        gb[i] = (float)((int)(i % 7) - 3) / 8.0f;
        want[i] = 0.0f - (ga[i] + gb[i]);          /* the fake starts from w = 0 */
        da[i] = db[i] = -999.0f;
    }
    ps_req_t *qa[NP] = {0}, *qb[NP] = {0};
    int rc = 0;
    double t0 = now_s();
    for (int p = NP - 1; p >= NP / 2; p--) { /* A: back half, one by one */
        rc |= ps_client_pushpull(a, (uint32_t)p, 0, ga + (size_t)p * NE, da + (size_t)p * NE, 0,
                                 &qa[p]);
        usleep(2000);
    }
    for (int i = 0; i < 2000; i++) { /* until A's pushes reached the server */
        pthread_mutex_lock(&f.mu);
        int n = f.norder;
        pthread_mutex_unlock(&f.mu);
        if (n >= (max_inflight ? max_inflight : 8)) break;
        usleep(1000);
    }
    usleep(20000);
    for (int p = 0; p < NP; p++) /* B: the whole step at once */
        rc |= ps_client_pushpull(b, (uint32_t)p, 0, gb + (size_t)p * NE, db + (size_t)p * NE, 0,
                                 &qb[p]);
    for (int p = NP / 2 - 1; p >= 0; p--) { /* A: front half, one by one */
        usleep(2000);
        rc |= ps_client_pushpull(a, (uint32_t)p, 0, ga + (size_t)p * NE, da + (size_t)p * NE, 0,
                                 &qa[p]);
    }
    is_int(rc, 0, "%s: all pushpulls submitted", tag);
    int fa = 0, fb = 0, vok = 1;
    for (int p = 0; p < NP; p++) {
        uint64_t v = 0;
        int r1 = qa[p] ? ps_client_wait(a, qa[p], -1, &v) : PS_EINVAL;
        fa += r1 != 0;
        vok &= r1 != 0 || v == 1;
        int r2 = qb[p] ? ps_client_wait(b, qb[p], -1, &v) : PS_EINVAL;
        fb += r2 != 0;
        vok &= r2 != 0 || v == 1;
    }
    double dt = now_s() - t0;
    ok(fa == 0 && fb == 0, "%s: every pushpull of both workers completed (failed: A %d, B %d)", tag,
       fa, fb);
    ok(dt < 8.0, "%s: no wait for the timeout (%.2f s)", tag, dt);
    ok(vok, "%s: weights of version 1", tag);
    ok(memcmp(da, want, sizeof da) == 0 && memcmp(db, want, sizeof db) == 0,
       "%s: both workers got w0 - (gA + gB) exactly", tag);
    is_int(f.napplied, NP, "%s: one sync update per partition", tag);
    ps_client_destroy(&a);
    ps_client_destroy(&b);
    fake_psd_stop(&f);
    free_table(&t);
}

/* ps_client_cancel and ps_client_wait_unless against the sync fake: a
 * PUSHPULL that waits for another worker is given up on at once, its late
 * reply is dropped (the caller's buffer is left alone) and the handles are
 * reusable; wait_unless with the count unmoved is a plain wait. */
static void test_cancel(void)
{
    enum { NP = 2, NE = 1000 };
    size_t sizes[NP] = {NE, NE};
    ps_partition_table_t t;
    make_table(&t, NP, 1, sizes);
    fake_psd_t f;
    fake_psd_start_sync(&f, 0, &t, 0, 2);
    ps_client_t *a = connect_sync(&t, &f, 0, 0);
    ps_client_t *b = connect_sync(&t, &f, 0, 0);
    int ra = ps_client_hello(a), rb = ps_client_hello(b);
    ok(ra >= 0 && rb >= 0 && ra != rb, "cancel: two workers, ranks %d and %d", ra, rb);
    static float g[NP * NE], da[NP * NE], db[NP * NE];
    for (size_t i = 0; i < NP * NE; i++) g[i] = 0.5f, da[i] = db[i] = -999.0f;
    ps_req_t *qa = NULL, *qb = NULL;
    int rc = ps_client_pushpull(a, 0, 0, g, da, 0, &qa);
    usleep(100 * 1000); /* on the server, waiting for B */
    double t0 = now_s();
    ps_client_cancel(a, qa);
    double dt = now_s() - t0;
    ok(rc == 0 && dt < 8.0, "cancel: a PUSHPULL waiting for the other worker given up on in %.3f s "
       "(its timeout is 10 s)", dt);
    rc = ps_client_pushpull(b, 0, 0, g, db, 0, &qb);
    uint64_t v = 0;
    rc |= ps_client_wait(b, qb, -1, &v);
    ok(rc == 0 && v == 1 && db[0] == -1.0f, "cancel: the other worker's push completes the update (v %llu)",
       (unsigned long long)v);
    usleep(200 * 1000); /* the reply to the cancelled request arrives */
    int untouched = 1;
    for (size_t i = 0; i < NE; i++) untouched &= da[i] == -999.0f;
    ok(untouched, "cancel: its late reply is dropped, the buffer left alone");
    /* partition 1: both push; A waits with wait_unless and the count unmoved */
    unsigned seen = ps_client_rebuilds(a);
    rc = ps_client_pushpull(a, 1, 0, g + NE, da + NE, 0, &qa);
    rc |= ps_client_pushpull(b, 1, 0, g + NE, db + NE, 0, &qb);
    int pending = -1;
    uint32_t fl = 0;
    int r1 = ps_client_wait_unless(a, qa, seen, &v, &fl, &pending);
    rc |= ps_client_wait(b, qb, -1, NULL);
    ok(rc == 0 && r1 == 0 && pending == 0 && v == 1 && da[NE] == -1.0f && seen == 0,
       "wait_unless: no rebuild said, a plain wait (rc %d, pending %d, v %llu)", r1, pending,
       (unsigned long long)v);
    ps_req_t *q = NULL;
    rc = ps_client_pull(a, 0, 0, da, &q);
    rc |= ps_client_wait(a, q, -1, &v);
    ok(rc == 0 && v == 1 && da[0] == -1.0f, "cancel: handles reusable after it (pull at v %llu)",
       (unsigned long long)v);
    ps_client_destroy(&a);
    ps_client_destroy(&b);
    fake_psd_stop(&f);
    free_table(&t);
}

int main(void)
{
    alarm(240); /* a hang is a failure, not a stuck CI job */
    ps_log_level = getenv("PS_LOG_LEVEL") ? atoi(getenv("PS_LOG_LEVEL")) : PS_LOG_ERROR - 1;
    static const ps_dtype_t dts[] = {PS_DT_FP32, PS_DT_FP16, PS_DT_BF16};
    static const ps_codec_t cs[] = {PS_CODEC_RAW, PS_CODEC_LZ4};
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 2; k++) test_roundtrip(dts[d], cs[k]);
    test_priority();
    test_faults();
    test_control();
    test_restart();
    test_hung_server();
    test_sync_no_deadlock(0, 0, "sync, default options");
    test_sync_no_deadlock(1, 1, "sync, max_inflight 1, 1-byte send queue");
    test_cancel();
    return tap_done();
}
