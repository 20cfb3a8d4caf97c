/* Fuzz target: the message decoder, ps_wire_recv, fed over an in-process
 * ZeroMQ PAIR pipe (inproc://, no network, no threads of ours), so the real
 * receive path runs: frame count, header size cap, protobuf-c unpack of
 * hostile bytes, version, payload_len against the payload frame, CRC32C.
 * Input: up to 4 frames, each u16 length (LE) + bytes; the last frame takes
 * what is left if its length runs past the end.  Frame 0 is the header.
 * Checks: the result is 0 or PS_EPROTO / PS_EVERSION / PS_ECORRUPT; on
 * success the header is what was promised; every frame of the message is
 * consumed whatever the outcome (the next read finds the pipe empty). */
#include "tests/fuzz/fuzz.h"

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"

#include <string.h>
#include <zmq.h>

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size);

static void *wire_fz_ctx, *wire_fz_tx, *wire_fz_rx;

static void wire_fz_setup(void)
{
    if (wire_fz_ctx) return;
    int timeout = 2000, linger = 0;
    wire_fz_ctx = zmq_ctx_new();
    wire_fz_rx = zmq_socket(wire_fz_ctx, ZMQ_PAIR);
    wire_fz_tx = zmq_socket(wire_fz_ctx, ZMQ_PAIR);
    if (!wire_fz_rx || !wire_fz_tx) abort();
    zmq_setsockopt(wire_fz_rx, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(wire_fz_rx, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(wire_fz_tx, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(wire_fz_rx, "inproc://ps-fuzz-wire") || zmq_connect(wire_fz_tx, "inproc://ps-fuzz-wire"))
        abort();
}

/* For the replay test: close the sockets so the run ends leak-free. */
static void wire_fz_teardown(void)
{
    if (!wire_fz_ctx) return;
    zmq_close(wire_fz_tx);
    zmq_close(wire_fz_rx);
    zmq_ctx_term(wire_fz_ctx);
    wire_fz_ctx = wire_fz_tx = wire_fz_rx = NULL;
}

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    ps_log_level = -1;
    wire_fz_setup();
    const uint8_t *frame[4];
    size_t flen[4], nframes = 0, pos = 0;
    while (nframes < 4 && pos + 2 <= size) {
        size_t l = (size_t)(data[pos] | data[pos + 1] << 8);
        pos += 2;
        if (l > size - pos) l = size - pos;
        frame[nframes] = data + pos;
        flen[nframes++] = l;
        pos += l;
    }
    if (!nframes) return 0;
    for (size_t i = 0; i < nframes; i++)
        if (zmq_send(wire_fz_tx, frame[i], flen[i], i + 1 < nframes ? ZMQ_SNDMORE : 0) < 0) abort();

    ps_wire_msg_t m;
    char err[256];
    int rc = ps_wire_recv(wire_fz_rx, &m, 0, 0, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == PS_EPROTO || rc == PS_EVERSION || rc == PS_ECORRUPT,
               "ps_wire_recv returned %d (%s)", rc, err);
    if (rc == 0) {
        FUZZ_CHECK(m.hdr && m.hdr->version == PS_PROTO_VERSION, "accepted header without version");
        size_t plen = m.has_payload ? zmq_msg_size(&m.payload) : 0;
        FUZZ_CHECK(nframes <= 2 && plen == (m.hdr->has_payload_len ? m.hdr->payload_len : 0),
                   "accepted %zu frames / payload %zu vs payload_len", nframes, plen);
        if (plen && m.hdr->has_checksum)
            FUZZ_CHECK(ps_crc32c(0, zmq_msg_data(&m.payload), plen) == m.hdr->checksum, "bad CRC accepted");
        FUZZ_CHECK(strlen(ps_wire_type_name(m.hdr->type)) > 0, "type name");
    } else {
        FUZZ_CHECK(err[0], "error %d without a message", rc);
    }
    ps_wire_msg_close(&m);
    /* A signal (libFuzzer's -timeout alarm) can interrupt the probe: EINTR
     * says nothing about the pipe, so ask again. */
    char probe;
    int got;
    do
        got = zmq_recv(wire_fz_rx, &probe, 1, ZMQ_DONTWAIT);
    while (got < 0 && zmq_errno() == EINTR);
    FUZZ_CHECK(got < 0 && zmq_errno() == EAGAIN, "frames left in the pipe after ps_wire_recv (%d, %s)",
               got, got < 0 ? zmq_strerror(zmq_errno()) : "a frame");
    return 0;
}
