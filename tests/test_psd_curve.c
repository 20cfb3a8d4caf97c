/* psd --curve: raw DEALER clients with their own CURVE key pairs against a
 * psd whose ZAP handler holds an allow-list.  An allowed key works (STATS,
 * INIT, PULL); an unknown key and a plaintext client get no reply at all and
 * a ZAP log line; CHECKPOINT / SHUTDOWN from a worker key are refused with
 * PS_EAUTH and accepted from the admin key.  psd refuses to start in CURVE
 * mode without usable keys.  Also the per-peer cap on waiting requests
 * (--max-peer-inflight): the peer over it gets PS_EAGAIN, others go on. */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

static const ps_tensor_spec_t TS[1] = {{"w", 16, 0}};
#define N 16
static ps_partition_table_t T;
static char dir[256];
static char srv_pub[41], srv_sec[41];

static void write_file(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A DEALER with key pair (pub, sec) or plaintext (pub NULL). */
static void *curve_dealer(int port, const char *pub, const char *sec, int tmo_ms)
{
    char ep[64];
    int linger = 0;
    if (!t_ctx) t_ctx = zmq_ctx_new();
    void *d = zmq_socket(t_ctx, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo_ms, sizeof tmo_ms);
    zmq_setsockopt(d, ZMQ_SNDTIMEO, &tmo_ms, sizeof tmo_ms);
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    if (pub) {
        zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, srv_pub, 40);
        zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(d, ep);
    return d;
}

static int stats(void *d, char *body, size_t cap)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    return t_call(d, &h, NULL, 0, NULL, 0, NULL, body, cap);
}

static int admin_verb(void *d, Ps__MsgType type, char *etext, size_t cap)
{
    Ps__Header h;
    ps_wire_header_init(&h, type);
    return t_call(d, &h, NULL, 0, NULL, 0, NULL, etext, cap);
}

/* The psd log holds `needle` (waits up to 2 s for it to be written). */
static int log_has(const tpsd_t *S, const char *needle)
{
    for (int i = 0; i < 200; i++) {
        FILE *f = fopen(S->log, "r");
        char line[1024];
        int found = 0;
        while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
        if (f) fclose(f);
        if (found) return 1;
        t_sleep_ms(10);
    }
    return 0;
}

/* psd must refuse to start with these CURVE options; the log says why. */
static void refuses(const char *what, const char *key, const char *allow, const char *needle)
{
    tpsd_t S;
    const char *args[] = {"--curve", "--curve-secret-key", key, "--curve-allow", allow, NULL};
    int started = tpsd_start(&S, "curve-bad", args) == 0;
    if (started) tpsd_stop(&S, SIGKILL);
    ok(!started, "refuses to start: %s", what);
    ok(log_has(&S, needle), "... and logs \"%s\"", needle);
    if (tap_failed_) tpsd_dump_log(&S, 10);
    unlink(S.log);
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    (void)t_dealer; /* this test builds its own (CURVE) sockets */
    if (!zmq_has("curve")) tap_skip_all("libzmq without CURVE");
    if (ps_partition_table_build(&T, TS, 1, 4096, 1)) tap_skip_all("partition table unavailable");
    snprintf(dir, sizeof dir, "/tmp/psd-test-curve-%d", (int)getpid());
    mkdir(dir, 0700);
    char allow[300], admin[300], key[300], line[64];
    snprintf(allow, sizeof allow, "%s/allow", dir);
    mkdir(allow, 0700);
    snprintf(admin, sizeof admin, "%s/admin.pub", dir);
    snprintf(key, sizeof key, "%s/server.key", dir);

    char wpub[41], wsec[41], apub[41], asec[41], xpub[41], xsec[41];
    zmq_curve_keypair(srv_pub, srv_sec);
    zmq_curve_keypair(wpub, wsec);
    zmq_curve_keypair(apub, asec);
    zmq_curve_keypair(xpub, xsec);
    snprintf(line, sizeof line, "%s\n", srv_sec);
    write_file("server.key", line);
    snprintf(line, sizeof line, "# worker 0\n%s\n", wpub);
    write_file("allow/w0.pub", line);
    write_file("allow/w0.key", "not a key: secret files in the directory are not read\n");
    snprintf(line, sizeof line, "%s\n", apub);
    write_file("admin.pub", line);

    /* ---- start-up refusals ---- */
    char missing[300], garbage[300];
    snprintf(missing, sizeof missing, "%s/nope.key", dir);
    snprintf(garbage, sizeof garbage, "%s/garbage.pub", dir);
    write_file("garbage.pub", "this is not a Z85 key\n");
    refuses("missing secret key file", missing, allow, "--curve-secret-key");
    refuses("allow-list entry not a Z85 key", key, garbage, "not a Z85 public key");
    refuses("secret key file not a key", garbage, allow, "not a Z85 secret key");

    tpsd_t S;
    const char *args[] = {"--curve", "--curve-secret-key", key, "--curve-allow", allow, "--curve-admin",
                          admin, "--num-workers", "1", "--max-peer-inflight", "2",
                          "--checkpoint-dir", dir, NULL};
    if (tpsd_start(&S, "curve", args)) {
        tpsd_dump_log(&S, 20);
        tap_skip_all("psd --curve did not start");
    }
    ok(log_has(&S, srv_pub), "psd logs its public key");

    /* ---- an allowed worker key ---- */
    void *w = curve_dealer(S.port, wpub, wsec, 3000);
    char body[8192] = "";
    is_int(stats(w, body, sizeof body), PS__MSG_TYPE__MSG_ACK, "allowed key: STATS answered");
    ok(strstr(body, "\"curve\":true") != NULL, "STATS says curve on");
    char spec[512];
    t_spec_json(spec, sizeof spec, TS, 1, 4096, 1, 1, "{\"lr\":0.1,\"momentum\":0}");
    float w0[N], out[N];
    for (int i = 0; i < N; i++) w0[i] = 0.5f * i - 3;
    is_int(t_init_spec(w, spec, T.hash, NULL), PS__MSG_TYPE__MSG_ACK, "allowed key: INIT spec");
    is_int(t_init_part(w, 0, w0, N), PS__MSG_TYPE__MSG_ACK, "allowed key: INIT weights");
    uint64_t v = 99;
    is_int(t_pull(w, 0, 0, out, N, &v), PS__MSG_TYPE__MSG_WEIGHTS, "allowed key: PULL");
    allclose(out, w0, N, 0, 0, "allowed key: weights round trip (encrypted)");

    /* ---- unknown key and plaintext: no reply at all ---- */
    void *x = curve_dealer(S.port, xpub, xsec, 1000);
    is_int(stats(x, body, sizeof body), PS_ETIMEOUT, "unknown key: no reply");
    char needle[128];
    snprintf(needle, sizeof needle, "refused unknown key %s", xpub);
    ok(log_has(&S, needle), "unknown key: ZAP log line names the key");
    zmq_close(x);
    void *pt = curve_dealer(S.port, NULL, NULL, 1000);
    is_int(stats(pt, body, sizeof body), PS_ETIMEOUT, "plaintext client: no reply");
    ok(log_has(&S, "handshake refused"), "plaintext client: log line");
    zmq_close(pt);

    /* ---- bounded waiting requests per peer ---- */
    Ps__Header h;
    int codes[3];
    for (int k = 0; k < 3; k++) {
        t_hdr(&h, PS__MSG_TYPE__MSG_PULL, -1, 0);
        h.has_rank = 0;
        h.has_min_version = 1, h.min_version = 5; /* never reached: waits */
        h.has_request_id = 1, h.request_id = 7000 + k;
        ps_wire_send(w, NULL, 0, &h, NULL, 0, NULL, NULL, 0);
    }
    ps_wire_msg_t m;
    codes[0] = t_recv(w, &m) == 0 ? (int)m.hdr->request_id : -1;
    codes[1] = m.hdr && m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : 0;
    ps_wire_msg_close(&m);
    ok(codes[0] == 7002 && codes[1] == PS_EAGAIN, "a peer over --max-peer-inflight 2 gets PS_EAGAIN (%d %d)",
       codes[0], codes[1]);
    void *w2 = curve_dealer(S.port, wpub, wsec, 3000);
    is_int(t_pull(w2, 0, 0, out, N, &v), PS__MSG_TYPE__MSG_WEIGHTS, "another peer is unaffected");
    zmq_close(w2);

    /* ---- admin verbs ---- */
    char et[512] = "";
    is_int(admin_verb(w, PS__MSG_TYPE__MSG_CHECKPOINT, et, sizeof et), PS_EAUTH, "worker key: CHECKPOINT refused");
    is_int(admin_verb(w, PS__MSG_TYPE__MSG_SHUTDOWN, et, sizeof et), PS_EAUTH, "worker key: SHUTDOWN refused");
    ok(strstr(et, "not an admin key") != NULL, "... saying so (%s)", et);
    void *a = curve_dealer(S.port, apub, asec, 5000);
    is_int(admin_verb(a, PS__MSG_TYPE__MSG_CHECKPOINT, NULL, 0), PS__MSG_TYPE__MSG_ACK, "admin key: CHECKPOINT");
    is_int(admin_verb(a, PS__MSG_TYPE__MSG_SHUTDOWN, NULL, 0), PS__MSG_TYPE__MSG_ACK, "admin key: SHUTDOWN");
    /* A retried SHUTDOWN during the linger is answered too. */
    is_int(admin_verb(a, PS__MSG_TYPE__MSG_SHUTDOWN, NULL, 0), PS__MSG_TYPE__MSG_ACK, "admin key: SHUTDOWN again");
    is_int(tpsd_stop(&S, 0), 0, "psd exits 0 after SHUTDOWN");
    zmq_close(a);
    zmq_close(w);
    if (tap_failed_) tpsd_dump_log(&S, 40);
    unlink(S.log);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) diag("could not remove %s", dir);
    if (t_ctx) zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
