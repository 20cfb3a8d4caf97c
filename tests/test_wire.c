/* ps_wire: round trips over inproc and ipc, zero-copy ownership, and every
 * malformed-message case gives its documented error while the socket stays
 * usable for the next message. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"
#include "tests/lib/tap.h"

/* Independent bitwise CRC32C (reflected polynomial 0x82F63B78). */
static uint32_t ref_crc32c(const void *buf, size_t n)
{
    const uint8_t *p = buf;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

static void *ctx, *router, *dealer;

/* Raw multipart send of arbitrary frames from the dealer. */
static void send_raw(int nframes, const void **frames, const size_t *lens)
{
    for (int i = 0; i < nframes; i++)
        zmq_send(dealer, frames[i], lens[i], i + 1 < nframes ? ZMQ_SNDMORE : 0);
}

static size_t pack_hdr(Ps__Header *h, uint8_t *buf)
{
    return ps__header__pack(h, buf);
}

/* A good message goes through after each malformed one. */
static void check_usable(const char *after)
{
    Ps__Header h;
    float v[3] = {1, 2, 3};
    ps_wire_msg_t m;
    char err[256];
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_PUSH);
    h.has_request_id = 1;
    h.request_id = 4242;
    int rc = ps_wire_send(dealer, NULL, 0, &h, v, sizeof v, NULL, NULL, 0);
    rc = rc ? rc : ps_wire_recv(router, &m, 1, 0, err, sizeof err);
    ok(rc == 0 && m.hdr && m.hdr->request_id == 4242 && m.has_payload &&
           !memcmp(zmq_msg_data(&m.payload), v, sizeof v),
       "socket usable after %s (rc %d %s)", after, rc, err);
    if (rc == 0 || rc == PS_EPROTO) ps_wire_msg_close(&m);
}

/* Receive on the router, expect error `want`, answer with ERROR and check
 * the dealer gets it with the request id (when the header was readable). */
static void expect_bad(const char *what, int want, uint64_t rid, int hdr_kept)
{
    ps_wire_msg_t m;
    char err[256];
    int rc = ps_wire_recv(router, &m, 1, 0, err, sizeof err);
    is_int(rc, want, "%s -> %s", what, ps_errname(want));
    diag("error text: %s", err);
    ok(err[0] != 0, "%s: error text set", what);
    ok(m.has_identity, "%s: identity kept for the reply", what);
    ok(hdr_kept ? m.hdr != NULL : 1, "%s: header kept", what);
    uint64_t id = m.hdr ? m.hdr->request_id : 0;
    int src = ps_wire_send_error(router, zmq_msg_data(&m.identity), zmq_msg_size(&m.identity), id,
                                 7, rc, "%s", err);
    ps_wire_msg_close(&m);
    is_int(src, 0, "%s: ERROR reply sent", what);

    ps_wire_msg_t r;
    rc = ps_wire_recv(dealer, &r, 0, 0, err, sizeof err);
    ok(rc == 0 && r.hdr && r.hdr->type == PS__MSG_TYPE__MSG_ERROR && r.hdr->error_code == want &&
           r.hdr->partition == 7 && r.hdr->error_text && strlen(r.hdr->error_text) > 0 &&
           (!hdr_kept || r.hdr->request_id == rid),
       "%s: dealer got ERROR(%s) for request %llu", what, ps_errname(want),
       (unsigned long long)rid);
    if (rc == 0) ps_wire_msg_close(&r);
    check_usable(what);
}

static atomic_int freed;
static void on_free(void *data, void *hint)
{
    (void)data;
    atomic_fetch_add(&freed, *(int *)hint);
}

static void round_trip(const char *endpoint)
{
    int tmo = 3000;
    char err[256];
    router = zmq_socket(ctx, ZMQ_ROUTER);
    dealer = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    ok(zmq_bind(router, endpoint) == 0, "bind %s", endpoint);
    ok(zmq_connect(dealer, endpoint) == 0, "connect %s", endpoint);

    /* Nothing waiting. */
    ps_wire_msg_t m;
    is_int(ps_wire_recv(router, &m, 1, ZMQ_DONTWAIT, err, sizeof err), PS_EAGAIN,
           "%s: DONTWAIT with nothing queued -> PS_EAGAIN", endpoint);

    /* Round trip with payload (copied). */
    size_t n = 10000;
    float *g = malloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++) g[i] = (float)i * 0.5f - 7.f;
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_PUSH);
    h.has_rank = 1, h.rank = 3;
    h.has_partition = 1, h.partition = 11;
    h.has_iteration = 1, h.iteration = 123456789012ull;
    h.has_numel = 1, h.numel = n;
    h.has_dtype = 1, h.dtype = PS__DTYPE__DT_FP32;
    h.has_request_id = 1, h.request_id = 99;
    h.has_flags = 1, h.flags = PS_FLAG_OVERFLOW;
    is_int(ps_wire_send(dealer, NULL, 0, &h, g, n * 4, NULL, NULL, 0), 0, "%s: send push", endpoint);
    int rc = ps_wire_recv(router, &m, 1, 0, err, sizeof err);
    is_int(rc, 0, "%s: recv push (%s)", endpoint, err);
    ok(m.hdr && m.hdr->type == PS__MSG_TYPE__MSG_PUSH && m.hdr->rank == 3 &&
           m.hdr->partition == 11 && m.hdr->iteration == 123456789012ull && m.hdr->numel == n &&
           m.hdr->request_id == 99 && m.hdr->flags == PS_FLAG_OVERFLOW,
       "%s: header fields survive", endpoint);
    ok(m.has_payload && zmq_msg_size(&m.payload) == n * 4 &&
           !memcmp(zmq_msg_data(&m.payload), g, n * 4),
       "%s: payload bytes survive", endpoint);
    ok(m.hdr && m.hdr->payload_len == n * 4 && m.hdr->has_checksum &&
           m.hdr->checksum == ref_crc32c(g, n * 4),
       "%s: payload_len and CRC32C match an independent CRC", endpoint);
    ok(m.wire_bytes > n * 4, "%s: wire_bytes counts header + payload", endpoint);

    /* Reply back through the identity, zero-copy. */
    int one = 1;
    atomic_store(&freed, 0);
    Ps__Header r;
    ps_wire_header_init(&r, PS__MSG_TYPE__MSG_WEIGHTS);
    r.has_request_id = 1, r.request_id = 99;
    rc = ps_wire_send(router, zmq_msg_data(&m.identity), zmq_msg_size(&m.identity), &r, g, n * 4,
                      on_free, &one, 0);
    is_int(rc, 0, "%s: zero-copy reply via identity", endpoint);
    ps_wire_msg_close(&m);
    ps_wire_msg_t back;
    rc = ps_wire_recv(dealer, &back, 0, 0, err, sizeof err);
    ok(rc == 0 && back.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS && back.hdr->request_id == 99 &&
           !memcmp(zmq_msg_data(&back.payload), g, n * 4),
       "%s: dealer got the zero-copy reply", endpoint);
    if (rc == 0) ps_wire_msg_close(&back);
    for (int i = 0; i < 200 && atomic_load(&freed) == 0; i++) usleep(5000);
    is_int(atomic_load(&freed), 1, "%s: free fn called exactly once after the send", endpoint);

    /* Unroutable identity on a mandatory router: error, free fn NOT called. */
    int mand = 1;
    zmq_setsockopt(router, ZMQ_ROUTER_MANDATORY, &mand, sizeof mand);
    atomic_store(&freed, 0);
    rc = ps_wire_send(router, "nobody", 6, &r, g, n * 4, on_free, &one, ZMQ_DONTWAIT);
    ok(rc == PS_EZMQ || rc == PS_EAGAIN, "%s: send to unknown peer fails (%s)", endpoint,
       ps_errname(rc));
    usleep(20000);
    is_int(atomic_load(&freed), 0, "%s: failed send keeps ownership with the caller", endpoint);

    /* Header only message. */
    Ps__Header b;
    ps_wire_header_init(&b, PS__MSG_TYPE__MSG_BARRIER);
    char body[] = "hostname-x";
    b.has_body = 1, b.body.data = (uint8_t *)body, b.body.len = strlen(body);
    ps_wire_send(dealer, NULL, 0, &b, NULL, 0, NULL, NULL, 0);
    rc = ps_wire_recv(router, &m, 1, 0, err, sizeof err);
    ok(rc == 0 && !m.has_payload && m.hdr->type == PS__MSG_TYPE__MSG_BARRIER &&
           m.hdr->body.len == strlen(body) && !memcmp(m.hdr->body.data, body, strlen(body)),
       "%s: header-only message with body", endpoint);
    ps_wire_msg_close(&m);

    /* ---- malformed messages ---- */
    uint8_t hb[PS_WIRE_MAX_HEADER + 64];
    const void *fr[4];
    size_t ln[4];

    uint8_t garbage[64];
    for (int i = 0; i < 64; i++) garbage[i] = (uint8_t)(0xff - i * 7);
    fr[0] = garbage, ln[0] = sizeof garbage;
    send_raw(1, fr, ln);
    expect_bad("garbage header", PS_EPROTO, 0, 0);

    fr[0] = "", ln[0] = 0;
    send_raw(1, fr, ln);
    expect_bad("empty header frame", PS_EPROTO, 0, 0);

    uint8_t *big = calloc(1, PS_WIRE_MAX_HEADER + 1);
    fr[0] = big, ln[0] = PS_WIRE_MAX_HEADER + 1;
    send_raw(1, fr, ln);
    expect_bad("oversized header frame", PS_EPROTO, 0, 0);
    free(big);

    /* Header missing the required type field. */
    Ps__Header x;
    ps__header__init(&x);
    x.version = PS_PROTO_VERSION;
    x.type = PS__MSG_TYPE__MSG_PUSH;
    size_t hl = pack_hdr(&x, hb);
    fr[0] = hb, ln[0] = hl - 2; /* cut the last field (type) */
    send_raw(1, fr, ln);
    expect_bad("truncated header", PS_EPROTO, 0, 0);

    float pl[4] = {1, 2, 3, 4};
    ps_wire_header_init(&x, PS__MSG_TYPE__MSG_PUSH);
    x.has_request_id = 1, x.request_id = 501;
    x.has_payload_len = 1, x.payload_len = sizeof pl;
    x.has_checksum = 1, x.checksum = ref_crc32c(pl, sizeof pl);
    hl = pack_hdr(&x, hb);
    fr[0] = hb, ln[0] = hl, fr[1] = pl, ln[1] = sizeof pl, fr[2] = pl, ln[2] = sizeof pl;
    send_raw(3, fr, ln);
    expect_bad("two payload frames", PS_EPROTO, 501, 1);

    fr[3] = pl, ln[3] = 4;
    send_raw(4, fr, ln);
    expect_bad("three payload frames", PS_EPROTO, 501, 1);

    x.payload_len = sizeof pl - 4;
    hl = pack_hdr(&x, hb);
    ln[0] = hl;
    send_raw(2, fr, ln);
    expect_bad("payload_len smaller than frame", PS_EPROTO, 501, 1);

    x.payload_len = sizeof pl + 4;
    hl = pack_hdr(&x, hb);
    ln[0] = hl;
    send_raw(2, fr, ln);
    expect_bad("payload_len larger than frame", PS_EPROTO, 501, 1);

    send_raw(1, fr, ln); /* header promises a payload that is missing */
    expect_bad("payload frame missing", PS_EPROTO, 501, 1);

    x.has_payload_len = 0;
    hl = pack_hdr(&x, hb);
    ln[0] = hl;
    send_raw(2, fr, ln);
    expect_bad("payload without payload_len", PS_EPROTO, 501, 1);

    x.has_payload_len = 1, x.payload_len = sizeof pl;
    x.checksum ^= 0x10;
    hl = pack_hdr(&x, hb);
    ln[0] = hl;
    send_raw(2, fr, ln);
    expect_bad("checksum mismatch", PS_ECORRUPT, 501, 1);

    x.checksum ^= 0x10;
    float flipped[4];
    memcpy(flipped, pl, sizeof pl);
    ((uint8_t *)flipped)[9] ^= 1;
    fr[1] = flipped;
    send_raw(2, fr, ln);
    expect_bad("one flipped payload bit", PS_ECORRUPT, 501, 1);
    fr[1] = pl;

    x.version = PS_PROTO_VERSION + 1;
    hl = pack_hdr(&x, hb);
    ln[0] = hl;
    send_raw(2, fr, ln);
    expect_bad("wrong protocol version", PS_EVERSION, 501, 1);

    x.version = PS_PROTO_VERSION;
    hl = pack_hdr(&x, hb);
    ln[0] = hl;
    send_raw(2, fr, ln);
    rc = ps_wire_recv(router, &m, 1, 0, err, sizeof err);
    is_int(rc, 0, "%s: hand-built valid message accepted (%s)", endpoint, err);
    ps_wire_msg_close(&m);

    /* Dealer side: a malformed reply is consumed whole as well. */
    fr[0] = garbage, ln[0] = 8, fr[1] = pl, ln[1] = 4, fr[2] = pl, ln[2] = 4;
    {
        /* Route raw frames router -> dealer: learn the dealer identity first. */
        ps_wire_header_init(&b, PS__MSG_TYPE__MSG_HEARTBEAT);
        ps_wire_send(dealer, NULL, 0, &b, NULL, 0, NULL, NULL, 0);
        ps_wire_recv(router, &m, 1, 0, err, sizeof err);
        zmq_send(router, zmq_msg_data(&m.identity), zmq_msg_size(&m.identity), ZMQ_SNDMORE);
        zmq_send(router, garbage, 8, ZMQ_SNDMORE);
        zmq_send(router, pl, 4, ZMQ_SNDMORE);
        zmq_send(router, pl, 4, 0);
        ps_wire_header_init(&r, PS__MSG_TYPE__MSG_ACK);
        r.has_request_id = 1, r.request_id = 77;
        ps_wire_send(router, zmq_msg_data(&m.identity), zmq_msg_size(&m.identity), &r, NULL, 0,
                     NULL, NULL, 0);
        ps_wire_msg_close(&m);
        rc = ps_wire_recv(dealer, &back, 0, 0, err, sizeof err);
        is_int(rc, PS_EPROTO, "%s: dealer: malformed reply -> PS_EPROTO", endpoint);
        ps_wire_msg_close(&back);
        rc = ps_wire_recv(dealer, &back, 0, 0, err, sizeof err);
        ok(rc == 0 && back.hdr->type == PS__MSG_TYPE__MSG_ACK && back.hdr->request_id == 77,
           "%s: dealer: next reply read cleanly", endpoint);
        if (rc == 0) ps_wire_msg_close(&back);
    }

    free(g);
    zmq_close(dealer);
    zmq_close(router);
}

int main(void)
{
    char ipc[128];
    ps_log_level = PS_LOG_WARN;
    is_int(ref_crc32c("123456789", 9), 0xE3069283u, "reference CRC32C check value");
    ctx = zmq_ctx_new();
    round_trip("inproc://wire-test");
    snprintf(ipc, sizeof ipc, "ipc:///tmp/ps-test-wire-%d", (int)getpid());
    round_trip(ipc);
    unlink(ipc + 6);
    ok(strcmp(ps_wire_type_name(PS__MSG_TYPE__MSG_PUSHPULL), "PUSHPULL") == 0 &&
           strcmp(ps_wire_type_name(999), "?") == 0,
       "type names");
    zmq_ctx_term(ctx);
    return tap_done();
}
