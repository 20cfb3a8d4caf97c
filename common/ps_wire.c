/* Wire framing: [identity]? [Header] [payload]? over ZeroMQ (ps_wire.h). */
#include "ps_wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"

void ps_wire_header_init(Ps__Header *h, Ps__MsgType type)
{
    ps__header__init(h);
    h->version = PS_PROTO_VERSION;
    h->type = type;
}

const char *ps_wire_type_name(int type)
{
    static const char *names[] = {
        "?", "HELLO", "WELCOME", "INIT", "PUSH", "PULL", "PUSHPULL", "BARRIER",
        "HEARTBEAT", "CHECKPOINT", "STATS", "SHUTDOWN", "ERROR", "ACK", "WEIGHTS", "BYE",
        "ROLLBACK", "DRAIN", "MEMBERS",
    };
    if (type < 1 || type >= (int)(sizeof names / sizeof names[0])) return "?";
    return names[type];
}

void ps_wire_msg_close(ps_wire_msg_t *m)
{
    if (m->hdr) ps__header__free_unpacked(m->hdr, NULL);
    m->hdr = NULL;
    if (m->has_identity) zmq_msg_close(&m->identity);
    if (m->has_payload) zmq_msg_close(&m->payload);
    m->has_identity = m->has_payload = 0;
}

/* Read and drop the rest of a multipart message, so the next recv starts at
 * a message boundary whatever was wrong with this one.  Returns the number
 * of frames dropped and adds their bytes to *bytes. */
static int drain_rest(void *sock, size_t *bytes)
{
    int more = 1, n = 0;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            /* Parts of a multipart message arrive together; only EINTR /
             * ETERM can get here. */
            zmq_msg_close(&f);
            if (errno == EINTR) continue;
            break;
        }
        *bytes += zmq_msg_size(&f);
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        n++;
    }
    return n;
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int ps_wire_recv(void *sock, ps_wire_msg_t *m, int router, int flags, char *err, size_t errlen)
{
    zmq_msg_t hframe;
    int more, extra = 0;

    memset(m, 0, sizeof *m);
    if (err && errlen) err[0] = 0;

    if (router) {
        zmq_msg_init(&m->identity);
        if (zmq_msg_recv(&m->identity, sock, flags) < 0) {
            int e = errno;
            zmq_msg_close(&m->identity);
            if (e == EAGAIN) return PS_EAGAIN;
            ps_error("zmq_msg_recv(identity): %s", zmq_strerror(e));
            return fail(err, errlen, PS_EZMQ, "recv: %s", zmq_strerror(e));
        }
        m->has_identity = 1;
        if (!zmq_msg_more(&m->identity))
            return fail(err, errlen, PS_EPROTO, "message has no header frame");
        flags = 0; /* the rest of a multipart message is already here */
    }

    zmq_msg_init(&hframe);
    if (zmq_msg_recv(&hframe, sock, flags) < 0) {
        int e = errno;
        zmq_msg_close(&hframe);
        if (e == EAGAIN && !router) return PS_EAGAIN;
        ps_error("zmq_msg_recv(header): %s", zmq_strerror(e));
        return fail(err, errlen, PS_EZMQ, "recv: %s", zmq_strerror(e));
    }
    size_t hlen = zmq_msg_size(&hframe);
    m->wire_bytes = hlen;
    /* Set by a ZAP handler (psd --curve: which key, admin or not). */
    const char *uid = zmq_msg_gets(&hframe, "User-Id");
    if (uid) snprintf(m->user_id, sizeof m->user_id, "%s", uid);
    more = zmq_msg_more(&hframe);

    if (more) {
        zmq_msg_init(&m->payload);
        if (zmq_msg_recv(&m->payload, sock, 0) < 0) {
            int e = errno;
            zmq_msg_close(&m->payload);
            zmq_msg_close(&hframe);
            ps_error("zmq_msg_recv(payload): %s", zmq_strerror(e));
            return fail(err, errlen, PS_EZMQ, "recv: %s", zmq_strerror(e));
        }
        m->has_payload = 1;
        m->wire_bytes += zmq_msg_size(&m->payload);
        if (zmq_msg_more(&m->payload)) extra = drain_rest(sock, &m->wire_bytes);
    }

    if (hlen == 0 || hlen > PS_WIRE_MAX_HEADER) {
        zmq_msg_close(&hframe);
        return fail(err, errlen, PS_EPROTO, "header frame of %zu bytes (allowed 1..%u)", hlen,
                    (unsigned)PS_WIRE_MAX_HEADER);
    }
    m->hdr = ps__header__unpack(NULL, hlen, zmq_msg_data(&hframe));
    zmq_msg_close(&hframe);
    if (!m->hdr)
        return fail(err, errlen, PS_EPROTO, "header frame of %zu bytes is not a valid ps.Header",
                    hlen);

    /* Checked after the unpack so the ERROR reply can carry the request_id. */
    if (extra)
        return fail(err, errlen, PS_EPROTO,
                    "message has %d frames after the header, at most 1 payload frame allowed",
                    extra + 1);
    const Ps__Header *h = m->hdr;
    if (h->version != PS_PROTO_VERSION)
        return fail(err, errlen, PS_EVERSION, "protocol version %u, this build speaks %u",
                    h->version, PS_PROTO_VERSION);

    size_t plen = m->has_payload ? zmq_msg_size(&m->payload) : 0;
    uint64_t want = h->has_payload_len ? h->payload_len : 0;
    if (want != plen)
        return fail(err, errlen, PS_EPROTO, "payload_len %llu in header but payload frame has %zu bytes",
                    (unsigned long long)want, plen);
    if (h->has_checksum && plen) {
        uint32_t crc = ps_crc32c(0, zmq_msg_data(&m->payload), plen);
        if (crc != h->checksum)
            return fail(err, errlen, PS_ECORRUPT,
                        "payload checksum mismatch (header 0x%08x, computed 0x%08x over %zu bytes)",
                        h->checksum, crc, plen);
    }
    return 0;
}

/* Zero-copy payloads: ZeroMQ calls the free function from its I/O thread once
 * the frame is on the wire, but also from zmq_msg_close when a send fails.
 * The contract is that ownership passes only on success, so the caller's
 * function is wrapped and only forwarded to once the send succeeded. */
typedef struct zc_hint {
    zmq_free_fn *ffn;
    void *hint;
    atomic_int sent;
} zc_hint_t;

static void zc_free(void *data, void *hint)
{
    zc_hint_t *z = hint;
    if (atomic_load(&z->sent)) z->ffn(data, z->hint);
    free(z);
}

static int send_frames(void *sock, const void *identity, size_t idlen, Ps__Header *h,
                       const void *payload, size_t len, zmq_free_fn *ffn, void *hint, int flags)
{
    int has_payload = len > 0;
    size_t hsz = ps__header__get_packed_size(h);
    zmq_msg_t hf;
    int e;

    if (identity) {
        /* With ROUTER_MANDATORY an unroutable peer fails here, before any
         * frame is queued, so nothing half-sent is left behind. */
        if (zmq_send(sock, identity, idlen, flags | ZMQ_SNDMORE) < 0) {
            e = errno;
            if (e == EAGAIN) return PS_EAGAIN;
            ps_warn("send to peer (%zu-byte identity): %s", idlen, zmq_strerror(e));
            return PS_EZMQ;
        }
        flags &= ~ZMQ_DONTWAIT; /* committed: the remaining frames must follow */
    }
    if (zmq_msg_init_size(&hf, hsz) < 0) return PS_ENOMEM;
    ps__header__pack(h, zmq_msg_data(&hf));
    if (zmq_msg_send(&hf, sock, flags | (has_payload ? ZMQ_SNDMORE : 0)) < 0) {
        e = errno;
        zmq_msg_close(&hf);
        if (e == EAGAIN && !identity) return PS_EAGAIN;
        ps_error("zmq_msg_send(header): %s", zmq_strerror(e));
        return PS_EZMQ;
    }
    if (!has_payload) return 0;

    zmq_msg_t pf;
    zc_hint_t *z = NULL;
    if (ffn) {
        z = malloc(sizeof *z);
        if (!z) goto copy;
        z->ffn = ffn;
        z->hint = hint;
        atomic_init(&z->sent, 0);
        if (zmq_msg_init_data(&pf, (void *)payload, len, zc_free, z) < 0) {
            free(z);
            z = NULL;
            goto copy;
        }
        /* Mark as sent before the send: ZeroMQ may release the frame from
         * its I/O thread before zmq_msg_send even returns. */
        atomic_store(&z->sent, 1);
    } else {
    copy:
        if (zmq_msg_init_size(&pf, len) < 0) return PS_ENOMEM;
        memcpy(zmq_msg_data(&pf), payload, len);
    }
    if (zmq_msg_send(&pf, sock, flags & ~ZMQ_DONTWAIT) < 0) {
        e = errno;
        if (z) atomic_store(&z->sent, 0); /* still ours: close must not forward */
        zmq_msg_close(&pf);
        ps_error("zmq_msg_send(payload, %zu bytes): %s", len, zmq_strerror(e));
        return PS_EZMQ;
    }
    if (!z && ffn) ffn((void *)payload, hint); /* copied: the caller's buffer is free now */
    return 0;
}

int ps_wire_send_crc(void *sock, const void *identity, size_t idlen, Ps__Header *h,
                     const void *payload, size_t len, uint32_t crc, zmq_free_fn *ffn,
                     void *hint, int flags)
{
    h->version = PS_PROTO_VERSION;
    h->has_payload_len = 1;
    h->payload_len = payload ? len : 0;
    h->has_checksum = payload && len;
    h->checksum = payload && len ? crc : 0;
    return send_frames(sock, identity, idlen, h, payload, payload ? len : 0, ffn, hint, flags);
}

int ps_wire_send(void *sock, const void *identity, size_t idlen, Ps__Header *h,
                 const void *payload, size_t len, zmq_free_fn *ffn, void *hint, int flags)
{
    uint32_t crc = payload && len ? ps_crc32c(0, payload, len) : 0;
    return ps_wire_send_crc(sock, identity, idlen, h, payload, len, crc, ffn, hint, flags);
}

int ps_wire_send_error(void *sock, const void *identity, size_t idlen, uint64_t request_id,
                       uint32_t partition, int code, const char *fmt, ...)
{
    Ps__Header h;
    char text[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ERROR);
    h.has_request_id = 1;
    h.request_id = request_id;
    h.has_partition = 1;
    h.partition = partition;
    h.has_error_code = 1;
    h.error_code = code;
    h.error_text = text;
    /* Best effort and never blocking: an ERROR to a peer that is gone or
     * not reading must not stall the server. */
    return ps_wire_send(sock, identity, idlen, &h, NULL, 0, NULL, NULL, ZMQ_DONTWAIT);
}
