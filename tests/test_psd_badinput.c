/* psd under bad input: random bytes, truncated and extra frames, wrong
 * lengths and checksums, unknown partitions, wrong protocol version, wrong
 * numel / dtype / codec, NaN and Inf gradients (--reject-nonfinite), pushes
 * before INIT, bad INIT specs, raw TCP garbage, oversized messages and a
 * bit-flip fuzz of a valid PUSH.  After each: the server answers, with the
 * documented error code, and a PULL returns exactly the initial weights.
 * Also /metrics (200 with counters, 404 elsewhere). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "ps_crc32c.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* http_testlib.h helpers this test does not use */
#include "tests/lib/http_testlib.h"
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define NT 2
static const ps_tensor_spec_t TS[NT] = {{"conv.weight", 150, 0}, {"conv.bias", 30, 0}};
#define N 180
static ps_partition_table_t T;
static void *D;
static float W0[N];

static uint32_t rng = 12345;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}

static void intact(const char *after)
{
    float got[N];
    uint64_t ver = 99;
    int good = 1;
    for (uint32_t p = 0; p < T.nparts; p++) {
        int rc = t_pull(D, p, 0, got + T.parts[p].offset, T.parts[p].numel, &ver);
        good &= rc == PS__MSG_TYPE__MSG_WEIGHTS;
    }
    ok(good && !memcmp(got, W0, sizeof W0), "after %s: server answers, weights exactly initial", after);
}

/* Raw frames from the dealer, then the reply: its error code (0 if none
 * within ms, 1 if not an ERROR). */
static int raw(int nf, const void *const *fr, const size_t *ln, int wait_ms)
{
    for (int i = 0; i < nf; i++) zmq_send(D, fr[i], ln[i], i + 1 < nf ? ZMQ_SNDMORE : 0);
    if (!wait_ms) return 0;
    zmq_pollitem_t it = {D, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, wait_ms) <= 0) return 0;
    ps_wire_msg_t m;
    int rc = t_recv(D, &m);
    if (rc == 0) rc = m.hdr->type == PS__MSG_TYPE__MSG_ERROR ? m.hdr->error_code : 1;
    ps_wire_msg_close(&m);
    return rc;
}

/* A PUSH of partition p with the given tweaks; returns the reply code. */
static int push(uint32_t p, const void *payload, size_t len, int numel_delta, int dtype, int codec,
                int rank, char *et, size_t etl)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, rank, p);
    h.has_iteration = 1, h.iteration = 0;
    h.has_numel = 1, h.numel = (p < T.nparts ? T.parts[p].numel : 10) + numel_delta;
    h.has_dtype = 1, h.dtype = dtype;
    h.has_codec = 1, h.codec = codec;
    return t_call(D, &h, payload, len, NULL, 0, NULL, et, etl);
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, NT, 256, 1)) tap_skip_all("partition table unavailable");
    http_port = http_free_port();
    char mport[16];
    snprintf(mport, sizeof mport, "%d", http_port);
    tpsd_t S;
    const char *args[] = {"--num-workers", "2", "--worker-timeout-ms", "0", "--reject-nonfinite",
                          "--metrics-port", mport, "--max-msg-mb", "1", "--log-level", "info", NULL};
    if (tpsd_start(&S, "bad", args)) {
        ok(0, "psd started");
        return tap_done();
    }
    D = t_dealer(S.port);
    char et[1024];
    float g[N];
    for (int i = 0; i < N; i++) W0[i] = 0.5f - 0.01f * i, g[i] = 0;

    /* ---- before INIT ---- */
    is_int(push(0, g, T.parts[0].numel * 4, 0, 0, 0, 0, et, sizeof et), PS_ESTATE, "PUSH before INIT -> PS_ESTATE");
    diag("%s", et);
    is_int(t_pull(D, 0, 0, NULL, 0, NULL), PS_ESTATE, "PULL before INIT -> PS_ESTATE");
    const char *bad_specs[] = {
        "not json",
        "{\"tensors\":[],\"partition_bytes\":256,\"num_servers\":1,\"num_workers\":2}",
        "{\"tensors\":[[\"a\",-3,0]],\"partition_bytes\":256,\"num_servers\":1,\"num_workers\":2}",
        "{\"tensors\":[[\"a\",3,0]],\"partition_bytes\":256,\"num_servers\":1}",
        "{\"tensors\":[[\"a\",3,0]],\"partition_bytes\":256,\"num_servers\":1,\"num_workers\":2,\"optim\":{\"lr\":\"x\"}}",
        "{\"tensors\":[[\"a\",3,5]],\"partition_bytes\":256,\"num_servers\":1,\"num_workers\":2}",
        "{\"tensors\":[[\"a\",3,0]],\"partition_bytes\":256,\"num_servers\":2,\"num_workers\":2}",
        "{\"tensors\":[[\"a\",3,0]],\"partition_bytes\":256,\"num_servers\":1,\"num_workers\":7}",
        "[1,2,3]",
    };
    for (size_t i = 0; i < sizeof bad_specs / sizeof *bad_specs; i++) {
        int rc = t_init_spec(D, bad_specs[i], 0, NULL);
        ok(rc < 0, "bad INIT spec %zu refused (%s)", i, rc < 0 ? ps_errname(rc) : "accepted");
    }
    char spec[2048];
    t_spec_json(spec, sizeof spec, TS, NT, 256, 1, 2, "{\"lr\":0.5,\"momentum\":0.9}");
    is_int(t_init_spec(D, spec, T.hash ^ 0x100, NULL), PS_EMISMATCH, "INIT spec with a wrong table hash -> PS_EMISMATCH");
    is_int(t_init_spec(D, spec, T.hash, NULL), PS__MSG_TYPE__MSG_ACK, "INIT spec");
    is_int(push(0, g, T.parts[0].numel * 4, 0, 0, 0, 0, et, sizeof et), PS_ESTATE,
           "PUSH before the partition's weights -> PS_ESTATE");
    float nanw[N];
    memcpy(nanw, W0, sizeof W0);
    nanw[3] = NAN;
    Ps__Header ih;
    t_hdr(&ih, PS__MSG_TYPE__MSG_INIT, 0, 0);
    ih.has_numel = 1, ih.numel = T.parts[0].numel;
    is_int(t_call(D, &ih, nanw, ih.numel * 4, NULL, 0, NULL, NULL, 0), PS_ENONFINITE, "INIT weights with NaN refused");
    ih.numel += 1;
    is_int(t_call(D, &ih, W0, ih.numel * 4, NULL, 0, NULL, NULL, 0), PS_EMISMATCH, "INIT weights with wrong numel refused");
    int init_ok = 1;
    for (uint32_t p = 0; p < T.nparts; p++)
        init_ok &= t_init_part(D, p, W0 + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    ok(init_ok, "INIT %u partitions", T.nparts);
    intact("INIT");

    /* ---- random bytes ---- */
    uint8_t buf[4096];
    int all_err = 1;
    for (int k = 0; k < 50 && all_err; k++) {
        size_t n = 1 + rnd() % sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
        const void *fr[3] = {buf, buf + 1, buf + 2};
        size_t ln[3] = {n, n > 8 ? n - 8 : 1, 4};
        int nf = 1 + k % 3, rc = raw(nf, fr, ln, 2000);
        if (!(rc < 0)) {
            diag("random message %d (%zu bytes, %d frames) answered %d", k, n, nf, rc);
            all_err = 0;
        }
    }
    ok(all_err, "50 random messages all answered with ERROR");
    intact("random bytes");
    const void *e0[1] = {""};
    size_t el[1] = {0};
    is_int(raw(1, e0, el, 2000), PS_EPROTO, "empty message -> PS_EPROTO");

    /* ---- framing ---- */
    Ps__Header h;
    uint8_t hb[1024];
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 0, 0);
    h.has_iteration = 1, h.has_numel = 1, h.numel = T.parts[0].numel;
    h.has_payload_len = 1, h.payload_len = h.numel * 4;
    h.has_checksum = 1, h.checksum = ps_crc32c(0, g, h.numel * 4);
    size_t hl = ps__header__pack(&h, hb);
    const void *fr[3] = {hb, g, g};
    size_t ln[3] = {hl, h.numel * 4, 8};
    is_int(raw(1, fr, ln, 2000), PS_EPROTO, "truncated multipart (payload frame missing) -> PS_EPROTO");
    is_int(raw(3, fr, ln, 2000), PS_EPROTO, "extra frame -> PS_EPROTO");
    ln[1] -= 4;
    is_int(raw(2, fr, ln, 2000), PS_EPROTO, "payload shorter than payload_len -> PS_EPROTO");
    ln[1] += 4;
    h.checksum ^= 1;
    ln[0] = ps__header__pack(&h, hb);
    is_int(raw(2, fr, ln, 2000), PS_ECORRUPT, "checksum mismatch -> PS_ECORRUPT");
    h.checksum ^= 1;
    h.version = 7;
    ln[0] = ps__header__pack(&h, hb);
    is_int(raw(2, fr, ln, 2000), PS_EVERSION, "wrong protocol version -> PS_EVERSION");
    h.version = PS_PROTO_VERSION;
    hb[0] ^= 0xff;
    is_int(raw(2, fr, ln, 2000), PS_EPROTO, "corrupted header byte -> PS_EPROTO");
    intact("framing errors");

    /* ---- table checks ---- */
    size_t n0 = T.parts[0].numel;
    is_int(push(999, g, 40, 0, 0, 0, 0, et, sizeof et), PS_ENOTFOUND, "unknown partition -> PS_ENOTFOUND");
    diag("%s", et);
    is_int(t_pull(D, 77, 0, NULL, 0, NULL), PS_ENOTFOUND, "PULL of an unknown partition -> PS_ENOTFOUND");
    is_int(push(0, g, (n0 + 1) * 4, 1, 0, 0, 0, et, sizeof et), PS_EMISMATCH, "numel larger than the table -> PS_EMISMATCH");
    is_int(push(0, g, (n0 - 1) * 4, -1, 0, 0, 0, et, sizeof et), PS_EMISMATCH, "numel smaller than the table -> PS_EMISMATCH");
    is_int(push(0, g, n0 * 4 - 4, 0, 0, 0, 0, et, sizeof et), PS_EMISMATCH, "payload bytes != numel * 4 -> PS_EMISMATCH");
    diag("%s", et);
    is_int(push(0, g, n0 * 2 - 2, 0, 1, 0, 0, et, sizeof et), PS_EMISMATCH, "fp16 payload one element short -> PS_EMISMATCH");
    is_int(push(0, g, n0 * 4, 0, 7, 0, 0, et, sizeof et) < 0, 1, "unknown dtype refused");
    is_int(push(0, g, n0 * 4, 0, 0, 9, 0, et, sizeof et) < 0, 1, "unknown codec refused");
    memset(buf, 0xAB, sizeof buf);
    int rc = push(0, buf, 200, 0, 0, 1, 0, et, sizeof et);
    ok(rc == PS_ECORRUPT || rc == PS_EMISMATCH, "lz4 garbage refused (%s)", ps_errname(rc));
    {
        /* a blockwise sign push (PSG2, one scale per block) whose first
         * block claims one element more than it has */
        size_t bl[2] = {n0 / 2, n0 - n0 / 2}, len = 0;
        ps_codec_params_t prm = {.block_len = bl, .nblocks = 2};
        rc = ps_codec_encode_ex(buf, sizeof buf, &len, g, n0, PS_DT_FP32, PS_CODEC_SIGN, &prm, NULL);
        uint32_t b0 = (uint32_t)bl[0] + 1;
        memcpy(buf + 24, &b0, 4); /* little-endian block length (ps_codec.h) */
        int prc = rc ? rc : push(0, buf, len, 0, 0, PS_CODEC_SIGN, 0, et, sizeof et);
        ok(!rc && (prc == PS_ECORRUPT || prc == PS_EMISMATCH),
           "sign push with a corrupt block table refused (%s: %s)", ps_errname(prc), et);
    }
    is_int(push(0, g, n0 * 4, 0, 0, 0, 5, et, sizeof et), PS_ERANGE, "rank out of range -> PS_ERANGE");
    is_int(push(0, g, n0 * 4, 0, 0, 0, -1, et, sizeof et), PS_ERANGE, "rank -1 push -> PS_ERANGE");
    is_int(push(0, NULL, 0, 0, 0, 0, 0, et, sizeof et), PS_EPROTO, "push without payload -> PS_EPROTO");
    Ps__Header wh;
    t_hdr(&wh, PS__MSG_TYPE__MSG_WEIGHTS, 0, 0);
    is_int(t_call(D, &wh, NULL, 0, NULL, 0, NULL, NULL, 0), PS_EPROTO, "a reply type sent to the server -> PS_EPROTO");
    Ps__Header th;
    t_hdr(&th, PS__MSG_TYPE__MSG_PUSH, 0, 0);
    th.has_table_hash = 1, th.table_hash = T.hash + 1;
    th.has_numel = 1, th.numel = n0;
    is_int(t_call(D, &th, g, n0 * 4, NULL, 0, NULL, NULL, 0), PS_EMISMATCH, "push with another table hash -> PS_EMISMATCH");
    Ps__Header ck;
    t_hdr(&ck, PS__MSG_TYPE__MSG_CHECKPOINT, 0, 0);
    is_int(t_call(D, &ck, NULL, 0, NULL, 0, NULL, NULL, 0), PS_EUNSUPPORTED, "CHECKPOINT without a dir -> PS_EUNSUPPORTED");
    intact("table errors");

    /* ---- non-finite gradients ---- */
    float bad[N];
    memset(bad, 0, sizeof bad);
    bad[n0 - 1] = NAN;
    is_int(push(0, bad, n0 * 4, 0, 0, 0, 0, et, sizeof et), PS_ENONFINITE, "NaN gradient -> PS_ENONFINITE");
    diag("%s", et);
    bad[n0 - 1] = INFINITY;
    is_int(push(0, bad, n0 * 4, 0, 0, 0, 1, et, sizeof et), PS_ENONFINITE, "Inf gradient -> PS_ENONFINITE");
    uint16_t hnan[N];
    for (int i = 0; i < N; i++) hnan[i] = 0x7e00;
    is_int(push(0, hnan, n0 * 2, 0, 1, 0, 0, et, sizeof et), PS_ENONFINITE, "fp16 NaN gradient -> PS_ENONFINITE");
    intact("NaN / Inf gradients");

    /* ---- transport-level abuse ---- */
    {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(S.port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            for (int i = 0; i < 64; i++) buf[i] = (uint8_t)rnd();
            if (write(fd, buf, 64) < 0) diag("write: %s", strerror(errno));
        }
        close(fd);
        intact("raw TCP garbage");
        /* Over ZMQ_MAXMSGSIZE (--max-msg-mb 1): the connection is dropped
         * by ZeroMQ, the server carries on. */
        Ps__Header sh;
        t_hdr(&sh, PS__MSG_TYPE__MSG_STATS, 0, 0);
        char before[4096], after[4096];
        t_call(D, &sh, NULL, 0, NULL, 0, NULL, before, sizeof before);
        void *big = t_dealer(S.port);
        size_t bn = 4u << 20;
        char *bb = calloc(1, bn);
        zmq_send(big, bb, bn, 0);
        free(bb);
        t_sleep_ms(100);
        zmq_close(big);
        intact("an oversized message");
        t_call(D, &sh, NULL, 0, NULL, 0, NULL, after, sizeof after);
        const char *b0 = strstr(before, "\"bytes_in\":"), *b1 = strstr(after, "\"bytes_in\":");
        double in0 = b0 ? atof(b0 + 11) : 0, in1 = b1 ? atof(b1 + 11) : 1e12;
        ok(in1 - in0 < 1e6, "the 4 MiB message was dropped by ZMQ_MAXMSGSIZE (bytes_in +%.0f)", in1 - in0);
    }

    /* ---- bit-flip fuzz of a valid PUSH (zero gradient: even an accepted
     * mutant leaves the weights unchanged) ---- */
    {
        t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 0, 1);
        h.has_iteration = 1, h.iteration = 0;
        h.has_numel = 1, h.numel = T.parts[1].numel;
        h.has_payload_len = 1, h.payload_len = h.numel * 4;
        h.has_checksum = 1, h.checksum = ps_crc32c(0, g, h.numel * 4);
        h.has_request_id = 1, h.request_id = 5;
        size_t base = ps__header__pack(&h, hb);
        int answered = 0;
        for (int k = 0; k < 300; k++) {
            uint8_t mut[1024];
            memcpy(mut, hb, base);
            int flips = 1 + rnd() % 3;
            for (int f = 0; f < flips; f++) mut[rnd() % base] ^= (uint8_t)(1u << (rnd() % 8));
            size_t ml = base - (rnd() % 8 == 0 ? rnd() % base : 0);
            const void *ff[2] = {mut, g};
            size_t fl[2] = {ml ? ml : 1, h.numel * 4};
            raw(2, ff, fl, 0);
        }
        /* Drain whatever replies came back, then make sure the server is fine. */
        zmq_pollitem_t it = {D, 0, ZMQ_POLLIN, 0};
        while (zmq_poll(&it, 1, 300) > 0) {
            ps_wire_msg_t m;
            if (t_recv(D, &m) == 0) answered++;
            ps_wire_msg_close(&m);
        }
        diag("fuzz: %d replies to 300 mutated pushes", answered);
        ok(answered > 0, "fuzzed pushes are answered");
        intact("300 bit-flipped pushes");
    }

    /* ---- /metrics ---- */
    char resp[65536];
    is_int(http_get("/metrics", resp, sizeof resp), 200, "GET /metrics -> 200");
    ok(strstr(resp, "psd_bytes_in_total ") && strstr(resp, "psd_updates_total ") &&
           strstr(resp, "psd_live_workers 2") && strstr(resp, "psd_aggregation_seconds_count") &&
           strstr(resp, "psd_errors_total{code=\"PS_EPROTO\"}") &&
           strstr(resp, "psd_errors_total{code=\"PS_ENONFINITE\"} 4"),
       "metrics body has the counters (4 non-finite: 3 gradients, 1 INIT)");
    if (tap_failed_) diag("%s", resp);
    is_int(http_get("/other", resp, sizeof resp), 404, "GET /other -> 404");

    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0 on SIGTERM");
    if (tap_failed_) tpsd_dump_log(&S, 60);
    if (!getenv("PSD_KEEP_LOG")) unlink(S.log);
    zmq_close(D);
    zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
