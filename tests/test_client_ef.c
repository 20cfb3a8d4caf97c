/* Client library, lossy pushes and CURVE, against the fake psd
 * (tests/lib/fake_psd.c, which applies w -= g with lr 1 for one worker):
 *  - top-k / sign pushes with error feedback: what the server applied plus
 *    the final residual equals the sum of the gradients (the EF identity,
 *    checked against sums computed here in double);
 *  - weights always come back exact (raw fp32 pull codec) whether the
 *    server honours Header.reply_codec or answers a PUSHPULL with the push's
 *    codec (then the client pulls again), and lossy WEIGHTS are refused;
 *  - a re-push of the same iteration resends the same bytes (the residual
 *    does not move twice); a loss-scale overflow goes out flagged with a raw
 *    payload and leaves the residual alone;
 *  - fp16 rounding feedback (ef_rounding), option validation;
 *  - CURVE key files: parsing and its errors, and a CURVE connection to a
 *    CURVE fake server (right server key: answered; wrong one: timeout). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/fake_psd.h"
#include "worker/client/ps_client.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"
#include "tests/lib/client_testutil.h"
#include "tests/lib/tap.h"

static ps_client_t *connect_ef(const ps_partition_table_t *t, fake_psd_t *f, ps_dtype_t dt,
                               ps_codec_t codec, float ratio, int ef_rounding, int retry_ms,
                               int timeout_ms)
{
    const char *eps[1] = {f->endpoint};
    ps_client_opts_t o;
    ps_client_opts_default(&o);
    o.servers = eps;
    o.nservers = 1;
    o.dtype = dt;
    o.codec = codec;
    o.topk_ratio = ratio;
    o.ef_rounding = ef_rounding;
    o.retry_ms = retry_ms;
    o.timeout_ms = timeout_ms;
    o.heartbeat_ms = 0;
    ps_client_t *c = NULL;
    int rc = ps_client_new(&c, &o, t);
    if (rc) diag("ps_client_new: %s", ps_strerror(rc));
    return c;
}

/* Gradient-like values, different every step. */
static float grad_of(size_t i, int it)
{
    double x = sin(0.37 * (double)i + 1.3 * it) * (1.0 + (double)((i * 13 + (size_t)it) % 7));
    return (float)(x * 0.01);
}

/* K pushpull steps through codec; then: server weights + residual identity,
 * pulled weights == server weights exactly, and how many re-pulls. */
static void test_ef_steps(ps_dtype_t dt, ps_codec_t codec, float ratio, int ef_rounding,
                          int honor)
{
    static const size_t sizes[] = {1000, 37, 4096};
    const int K = 6;
    ps_partition_table_t t;
    make_table(&t, 3, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    atomic_store(&f.honor_reply_codec, honor);
    ps_client_t *c = connect_ef(&t, &f, dt, codec, ratio, ef_rounding, 0, 60000);
    char tag[96];
    snprintf(tag, sizeof tag, "%s/%s%s ratio %g, %s", ps_dtype_name(dt), ps_codec_name(codec),
             ef_rounding ? "+ef" : "", (double)ratio, honor ? "reply_codec honoured" : "old server");
    size_t n = t.total_numel;
    float *w0 = malloc(n * sizeof *w0), *g = malloc(n * sizeof *g), *dst = malloc(n * sizeof *dst);
    double *gsum = calloc(n, sizeof *gsum);
    for (size_t i = 0; i < n; i++) w0[i] = (float)((int)(i % 50) - 25) * 0.125f;
    int rc = ps_client_hello(c) < 0;
    rc |= ps_client_init(c, "{}", w0, NULL) < 0;
    ok(!rc && ps_client_ef_residual(c, 0) != NULL, "%s: connected, residuals exist", tag);

    int npull0 = f.npull, steps_ok = 1, vok = 1;
    for (int it = 0; it < K; it++) {
        ps_req_t *r[3];
        for (size_t i = 0; i < n; i++) {
            g[i] = grad_of(i, it);
            gsum[i] += g[i];
        }
        for (uint32_t p = 0; p < 3; p++)
            rc |= ps_client_pushpull(c, p, (uint64_t)it, g + t.parts[p].offset,
                                     dst + t.parts[p].offset, 0, &r[p]);
        for (uint32_t p = 0; p < 3; p++) {
            uint64_t v = 0;
            int r1 = ps_client_wait(c, r[p], -1, &v);
            if (r1) diag("step %d part %u: %s (%s)", it, p, ps_strerror(r1), ps_client_last_error(c));
            steps_ok &= r1 == 0;
            vok &= v == (uint64_t)it + 1;
        }
    }
    ok(steps_ok && !rc, "%s: %d pushpull steps complete", tag, K);
    ok(vok, "%s: every reply has the version of its step", tag);
    /* expected: the server's weights rounded to the wire dtype, nothing more */
    int exact = 1;
    for (uint32_t p = 0; p < 3; p++) {
        size_t m = t.parts[p].numel, len = 0;
        void *enc = malloc(m * 4);
        float *want = malloc(m * sizeof *want);
        exact &= ps_codec_encode(enc, m * 4, &len, f.w[p], m, dt, PS_CODEC_RAW, NULL) == 0 &&
                 ps_codec_decode(want, m, enc, len, dt, PS_CODEC_RAW, 0, NULL) == 0 &&
                 memcmp(dst + t.parts[p].offset, want, m * sizeof(float)) == 0;
        free(enc);
        free(want);
    }
    ok(exact, "%s: pulled weights are the server's in the wire dtype, bit for bit (never lossy)", tag);
    int lossy = codec == PS_CODEC_TOPK || codec == PS_CODEC_SIGN;
    is_int(f.npull - npull0, honor || !lossy ? 0 : 3 * K, "%s: %s", tag,
           honor || !lossy ? "no extra PULL" : "one re-PULL per partition and step");
    is_int(f.push_codec[codec], 3 * K, "%s: every push went out as %s", tag, ps_codec_name(codec));

    /* EF identity: w0 - w_server == sum(g) - residual.  The fake sums in
     * fp32, so allow K roundings of |w| and of the sent values. */
    double worst = 0;
    for (uint32_t p = 0; p < 3; p++) {
        const float *res = ps_client_ef_residual(c, p);
        for (size_t i = 0; i < t.parts[p].numel; i++) {
            size_t k = t.parts[p].offset + i;
            double applied = (double)w0[k] - (double)f.w[p][i];
            double want = gsum[k] - (double)res[i];
            double tol = 1e-6 * K * (fabs((double)w0[k]) + fabs(gsum[k]) + 1.0);
            double e = fabs(applied - want) / tol;
            if (!(e <= worst)) worst = e;
        }
    }
    ok(worst <= 1, "%s: applied + residual == sum of gradients (worst %.3g of tolerance)", tag, worst);
    double rn = 0;
    for (uint32_t p = 0; p < 3; p++) {
        const float *res = ps_client_ef_residual(c, p);
        for (size_t i = 0; i < t.parts[p].numel; i++) rn += fabs(res[i]);
    }
    ok(rn > 0, "%s: the codec dropped something (residual L1 %.3g)", tag, rn);
    ps_client_ef_reset(c);
    double rz = 0;
    for (uint32_t p = 0; p < 3; p++)
        for (size_t i = 0; i < t.parts[p].numel; i++) rz += fabs(ps_client_ef_residual(c, p)[i]);
    ok(rz == 0, "%s: ps_client_ef_reset zeroes the residuals", tag);

    ps_client_destroy(&c);
    fake_psd_stop(&f);
    free(w0), free(g), free(dst), free(gsum);
    free_table(&t);
}

/* Re-push of one iteration, retried sends, overflow, lossy WEIGHTS. */
static void test_ef_edges(void)
{
    static const size_t sizes[] = {2000, 500};
    ps_partition_table_t t;
    make_table(&t, 2, 1, sizes);
    fake_psd_t f;
    fake_psd_start(&f, 0, &t, 0);
    ps_client_t *c = connect_ef(&t, &f, PS_DT_FP32, PS_CODEC_TOPK, 0.05f, 0, 0, 400);
    size_t n = t.total_numel, n0 = sizes[0];
    float *w0 = calloc(n, sizeof *w0), *g = malloc(n * sizeof *g), *dst = malloc(n * sizeof *dst);
    float *res1 = malloc(n0 * sizeof *res1);
    for (size_t i = 0; i < n; i++) g[i] = grad_of(i, 3);
    ps_client_hello(c);
    ps_client_init(c, "{}", w0, NULL);
    ps_req_t *r;

    /* The first send is lost and the handle times out; the caller pushes
     * the same iteration again: same bytes, residual moved once. */
    atomic_store(&f.drop_requests, 1);
    int rc = ps_client_push(c, 0, 0, g, 0, &r);
    is_int(rc == 0 ? ps_client_wait(c, r, -1, NULL) : rc, PS_ETIMEOUT, "lost push times out");
    memcpy(res1, ps_client_ef_residual(c, 0), n0 * sizeof *res1);
    rc = ps_client_push(c, 0, 0, g, 0, &r);
    is_int(rc == 0 ? ps_client_wait(c, r, -1, NULL) : rc, 0, "re-push of the same iteration acked");
    ok(memcmp(res1, ps_client_ef_residual(c, 0), n0 * sizeof *res1) == 0,
       "re-push: not compressed again (residual unchanged)");
    int applied_ok = 1;
    for (size_t i = 0; i < n0; i++) applied_ok &= f.w[0][i] == -(g[i] - res1[i]);
    ok(applied_ok, "re-push: the server applied exactly grad - residual");
    size_t k = 0;
    for (size_t i = 0; i < n0; i++) k += res1[i] == 0.f;
    is_int((long)k, (long)ps_codec_topk_k(n0, 0.05f), "top-k sent k = ceil(ratio * numel) elements");

    /* The same iteration twice at once (the first still in flight): the
     * second shares the first's bytes; the residual moves once. */
    ps_req_t *r2;
    float *res0 = malloc(sizes[1] * sizeof *res0), *resb = malloc(sizes[1] * sizeof *resb);
    memcpy(res0, ps_client_ef_residual(c, 1), sizes[1] * sizeof *res0);
    atomic_store(&f.delay_ms, 100);
    int a1 = ps_client_push(c, 1, 0, g + n0, 0, &r);
    memcpy(resb, ps_client_ef_residual(c, 1), sizes[1] * sizeof *resb);
    int a2 = ps_client_push(c, 1, 0, g + n0, 0, &r2);
    a1 = a1 ? a1 : ps_client_wait(c, r, -1, NULL);
    a2 = a2 ? a2 : ps_client_wait(c, r2, -1, NULL);
    atomic_store(&f.delay_ms, 0);
    ok(a1 == 0 && a2 == 0, "two pushes of one iteration in flight together complete");
    ok(memcmp(resb, ps_client_ef_residual(c, 1), sizes[1] * sizeof *resb) == 0 &&
           memcmp(res0, resb, sizes[1] * sizeof *resb) != 0,
       "... compressed once: the residual moved with the first only");
    int once = 1;
    for (size_t i = 0; i < sizes[1]; i++) once &= f.w[1][i] == -(g[n0 + i] - resb[i]);
    ok(once, "... and the server applied it once");
    free(res0);
    free(resb);

    /* Loss-scale overflow found by compression: flagged, raw, residual kept. */
    float *gi = malloc(n0 * sizeof *gi);
    for (size_t i = 0; i < n0; i++) gi[i] = grad_of(i, 4);
    gi[17] = INFINITY;
    memcpy(res1, ps_client_ef_residual(c, 0), n0 * sizeof *res1);
    float *wbefore = malloc(n0 * sizeof *wbefore);
    memcpy(wbefore, f.w[0], n0 * sizeof *wbefore);
    int ovf0 = f.noverflow, raw0 = f.push_codec[PS_CODEC_RAW];
    uint64_t v = 0;
    rc = ps_client_pushpull(c, 0, 1, gi, dst, 0, &r);
    is_int(rc == 0 ? ps_client_wait(c, r, -1, &v) : rc, 0, "overflowed step: pushpull completes");
    is_int(f.noverflow - ovf0, 1, "overflowed step: sent with PS_FLAG_OVERFLOW");
    is_int(f.push_codec[PS_CODEC_RAW] - raw0, 1, "overflowed step: payload raw, not top-k");
    ok(memcmp(res1, ps_client_ef_residual(c, 0), n0 * sizeof *res1) == 0,
       "overflowed step: residual untouched");
    ok(v == 2 && memcmp(wbefore, f.w[0], n0 * sizeof *wbefore) == 0 &&
           memcmp(dst, wbefore, n0 * sizeof *dst) == 0,
       "overflowed step: skipped, version advanced, weights back unchanged");
    /* ... and one the caller flags itself */
    rc = ps_client_push(c, 0, 2, g, PS_FLAG_OVERFLOW, &r);
    is_int(rc == 0 ? ps_client_wait(c, r, -1, NULL) : rc, 0, "caller-flagged overflow acked");
    ok(f.noverflow - ovf0 == 2 && memcmp(res1, ps_client_ef_residual(c, 0), n0 * sizeof *res1) == 0,
       "caller-flagged overflow: flagged, residual untouched");

    /* A server that answers a PULL with lossy weights is refused. */
    atomic_store(&f.force_codec, PS_CODEC_TOPK);
    rc = ps_client_pull(c, 1, 0, dst, &r);
    is_int(rc == 0 ? ps_client_wait(c, r, -1, NULL) : rc, PS_EPROTO, "lossy WEIGHTS refused");
    ok(strstr(ps_client_last_error(c), "lossy") != NULL, "... and the error says why: %s",
       ps_client_last_error(c));
    atomic_store(&f.force_codec, -1);

    ps_client_destroy(&c);
    fake_psd_stop(&f);

    /* Retries resend the same buffer: a lost reply, retry on. */
    fake_psd_start(&f, 0, &t, 0);
    c = connect_ef(&t, &f, PS_DT_FP16, PS_CODEC_SIGN, 0, 0, 150, 20000);
    ps_client_hello(c);
    ps_client_init(c, "{}", w0, NULL);
    atomic_store(&f.drop_replies, 1);
    rc = ps_client_push(c, 1, 0, g + n0, 0, &r);
    is_int(rc == 0 ? ps_client_wait(c, r, -1, NULL) : rc, 0, "sign push with a lost ACK completes");
    ps_client_counters_t kc;
    ps_client_counters(c, &kc);
    ok(kc.retries >= 1 && f.napplied == 1, "... after a retry, applied once");
    /* sign: every element moves by +-scale = mean |g| */
    double mean = 0;
    for (size_t i = 0; i < sizes[1]; i++) mean += fabs(g[n0 + i]);
    mean /= (double)sizes[1];
    int sign_ok = 1;
    for (size_t i = 0; i < sizes[1]; i++)
        sign_ok &= fabs(fabs(f.w[1][i]) - mean) <= 1e-6 * mean && (f.w[1][i] < 0) == (g[n0 + i] > 0);
    ok(sign_ok, "sign: the server applied -scale * sign(g), scale = mean |g| (%.4g)", mean);
    ps_client_destroy(&c);
    fake_psd_stop(&f);

    free(w0), free(g), free(dst), free(res1), free(gi), free(wbefore);
    free_table(&t);
}

static void test_opts(void)
{
    static const size_t sizes[] = {10};
    ps_partition_table_t t;
    make_table(&t, 1, 1, sizes);
    const char *eps[1] = {"tcp://127.0.0.1:1"};
    ps_client_opts_t o;
    ps_client_t *c = NULL;
    ps_client_opts_default(&o);
    o.servers = eps;
    o.nservers = 1;
    is_int(o.pull_codec, -1, "default pull codec follows the push codec");
    o.pull_codec = PS_CODEC_TOPK;
    is_int(ps_client_new(&c, &o, &t), PS_EINVAL, "a lossy pull codec is refused");
    o.pull_codec = -1;
    o.codec = PS_CODEC_TOPK;
    o.topk_ratio = 1.5f;
    is_int(ps_client_new(&c, &o, &t), PS_EINVAL, "topk_ratio 1.5 is refused");
    o.topk_ratio = 0.5f;
    is_int(ps_client_new(&c, &o, &t), 0, "topk with ratio 0.5 accepted");
    ps_client_destroy(&c);
    o.ef_momentum = 1.f;
    is_int(ps_client_new(&c, &o, &t), PS_EINVAL, "ef_momentum 1 is refused");
    o.ef_momentum = NAN;
    is_int(ps_client_new(&c, &o, &t), PS_EINVAL, "ef_momentum NaN is refused");
    o.ef_momentum = 0.9f;
    o.topk_warmup_steps = 100;
    is_int(ps_client_new(&c, &o, &t), 0, "topk with ef_momentum 0.9 and a warm-up accepted");
    ps_client_destroy(&c);
    o.ef_momentum = 0.f;
    o.topk_warmup_steps = 0;
    o.codec = PS_CODEC_RAW;
    o.dtype = PS_DT_FP16;
    ps_client_new(&c, &o, &t);
    ok(c && ps_client_ef_residual(c, 0) == NULL, "fp16 without ef_rounding: no error feedback");
    ps_client_destroy(&c);
    o.ef_rounding = 1;
    ps_client_new(&c, &o, &t);
    ok(c && ps_client_ef_residual(c, 0) != NULL, "fp16 with ef_rounding: error feedback");
    ps_client_destroy(&c);
    o.dtype = PS_DT_FP32;
    ps_client_new(&c, &o, &t);
    ok(c && ps_client_ef_residual(c, 0) == NULL, "fp32 raw: no error feedback even with ef_rounding");
    ps_client_destroy(&c);
    free_table(&t);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_curve(void)
{
    char dir[] = "/tmp/ps-client-curve.XXXXXX", p[8][256];
    char out[41];
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp");
        return;
    }
    for (int i = 0; i < 8; i++) snprintf(p[i], sizeof p[i], "%s/k%d", dir, i);
    const char *good = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
    char txt[128];
    snprintf(txt, sizeof txt, "  %s\n\n", good);
    write_file(p[0], txt);
    is_int(ps_client_load_z85_key(p[0], out), 0, "key file with whitespace and newline loads");
    ok(strcmp(out, good) == 0, "key text as written");
    write_file(p[1], "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf\n");
    is_int(ps_client_load_z85_key(p[1], out), PS_EINVAL, "39 characters refused");
    write_file(p[2], "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]y f7\n");
    is_int(ps_client_load_z85_key(p[2], out), PS_EINVAL, "two words refused");
    write_file(p[3], "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]y~7\n");
    is_int(ps_client_load_z85_key(p[3], out), PS_EINVAL, "a character outside Z85 refused");
    write_file(p[4], "\n");
    is_int(ps_client_load_z85_key(p[4], out), PS_EINVAL, "empty file refused");
    is_int(ps_client_load_z85_key(p[7], out), PS_EIO, "missing file: PS_EIO");
    is_int(out[0], 0, "out is empty after an error");

    if (!zmq_has("curve")) {
        for (int i = 0; i < 6; i++) ok(1, "# SKIP libzmq without CURVE");
        goto out;
    }
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    zmq_curve_keypair(spub, ssec);
    zmq_curve_keypair(cpub, csec);
    zmq_curve_keypair(opub, osec);
    snprintf(txt, sizeof txt, "%s\n", spub);
    write_file(p[0], txt);
    snprintf(txt, sizeof txt, "%s\n", cpub);
    write_file(p[1], txt);
    snprintf(txt, sizeof txt, "%s\n", csec);
    write_file(p[2], txt);
    snprintf(txt, sizeof txt, "%s\n", opub);
    write_file(p[3], txt);

    static const size_t sizes[] = {10};
    ps_partition_table_t t;
    make_table(&t, 1, 1, sizes);
    fake_psd_t f;
    fake_psd_start_ex(&f, 0, &t, 0, ssec);
    const char *eps[1] = {f.endpoint};
    const char *srvkey[1] = {p[0]}, *wrongkey[1] = {p[3]};
    ps_client_opts_t o;
    ps_client_t *c = NULL;
    ps_client_opts_default(&o);
    o.servers = eps;
    o.nservers = 1;
    o.heartbeat_ms = 0;
    o.retry_ms = 0;
    o.timeout_ms = 600;
    o.curve_server_keys = srvkey;
    o.ncurve_server_keys = 1;
    o.curve_public_key = p[1];
    is_int(ps_client_new(&c, &o, &t), PS_EINVAL, "CURVE with a key file missing is refused");
    o.curve_secret_key = p[3]; /* a public key where the secret belongs */
    is_int(ps_client_new(&c, &o, &t), PS_EINVAL, "CURVE: public/secret mismatch is refused");
    o.curve_secret_key = p[2];
    is_int(ps_client_new(&c, &o, &t), 0, "CURVE client created");
    is_int(ps_client_hello(c), 0, "CURVE: HELLO answered through the encrypted connection");
    ps_client_destroy(&c);
    o.curve_server_keys = wrongkey;
    ps_client_new(&c, &o, &t);
    is_int(c ? ps_client_hello(c) : -1, PS_ETIMEOUT, "CURVE: wrong server key gets no answer");
    ps_client_destroy(&c);
    o.curve_server_keys = NULL;
    o.ncurve_server_keys = 0;
    o.curve_public_key = o.curve_secret_key = NULL;
    ps_client_new(&c, &o, &t);
    is_int(c ? ps_client_hello(c) : -1, PS_ETIMEOUT, "plain client to a CURVE server: no answer");
    ps_client_destroy(&c);
    fake_psd_stop(&f);
    free_table(&t);
out:
    for (int i = 0; i < 8; i++) unlink(p[i]);
    rmdir(dir);
}

int main(void)
{
    ps_log_level = getenv("PS_LOG_LEVEL") ? atoi(getenv("PS_LOG_LEVEL")) : PS_LOG_ERROR - 1;
    test_ef_steps(PS_DT_FP32, PS_CODEC_TOPK, 0.1f, 0, 0);
    test_ef_steps(PS_DT_FP32, PS_CODEC_TOPK, 0.1f, 0, 1);
    test_ef_steps(PS_DT_FP16, PS_CODEC_TOPK, 0.02f, 0, 1);
    test_ef_steps(PS_DT_FP32, PS_CODEC_SIGN, 0, 0, 1);
    test_ef_steps(PS_DT_BF16, PS_CODEC_SIGN, 0, 0, 0);
    test_ef_steps(PS_DT_FP16, PS_CODEC_RAW, 0, 1, 1);
    test_ef_steps(PS_DT_BF16, PS_CODEC_LZ4, 0, 1, 0);
    test_ef_edges();
    test_opts();
    test_curve();
    return tap_done();
}
