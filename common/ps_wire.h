/* Wire framing: a protobuf-c Header frame plus at most one raw payload frame
 * (docs/protocol.md).  The receiver checks every length and the checksum
 * before anyone looks at the payload, so handlers only ever see messages
 * whose header and payload agree. */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "proto/ps.pb-c.h"

#define PS_PROTO_VERSION 1u

/* Header.flags bits */
#define PS_FLAG_OVERFLOW   0x1u  /* PUSH: loss-scale overflow, skip this step everywhere;
                                    WEIGHTS: the update to this version was skipped */
#define PS_FLAG_NO_REPLY   0x2u  /* PUSH: no ACK wanted (errors are still reported) */
#define PS_FLAG_FROM_CKPT  0x4u  /* WELCOME: server state came from a checkpoint */
#define PS_FLAG_ROLLBACK   0x8u  /* ERROR PS_ESTATE to a sync push for a future
                                    iteration (the server restarted from an
                                    older checkpoint), or to a request that a
                                    rollback cancelled: `iteration` = the
                                    version to roll back to (MSG_ROLLBACK) */
#define PS_FLAG_DONE       0x10u /* BYE: the worker finished its steps */
#define PS_FLAG_FAILED     0x20u /* BYE: the worker failed: error_code and
                                    error_text say why, and the job stops */
#define PS_FLAG_PREFLIGHT  0x80u /* STATS: add what `psctl check` needs (the
                                    flags, the clock; the server writes a probe
                                    file in its checkpoint directory) */
#define PS_FLAG_STATE      0x100u /* sync PUSHPULL: this worker keeps the partition's
                                    state: its WEIGHTS reply carries raw fp32
                                    weights then momentum (2 * numel floats);
                                    INIT: the payload is weights, momentum and,
                                    optionally, the previous version's weights
                                    (rebuilding a server that lost its state) */
#define PS_FLAG_REBUILD    0x200u /* ERROR: this server holds nothing of the job
                                    (started empty): the workers rebuild it;
                                    PULL: wait for the partition's INIT */
#define PS_FLAG_JOIN       0x400u /* HELLO (to server 0): join a running sync job
                                    at the next step boundary (psworker --join);
                                    WELCOME: iteration = its first step */
#define PS_FLAG_EXACT      0x40u /* PULL (sync): the weights of exactly version
                                    min_version, also when the partition is one
                                    update past it (a worker that died between
                                    its pushes of that step computes it again) */

/* Largest header frame accepted.  Headers are small except INIT's body, the
 * JSON model spec (ResNet-50: ~160 tensors, RetinaNet ~300, ~20-30 KB), so
 * the bound is generous while still capping what the decoder allocates. */
#define PS_WIRE_MAX_HEADER (256u << 10)

typedef struct ps_wire_msg {
    Ps__Header *hdr;     /* unpacked header, NULL if the message was malformed */
    zmq_msg_t identity;  /* ROUTER peer identity (valid if has_identity) */
    int has_identity;
    zmq_msg_t payload;   /* raw payload bytes (valid if has_payload) */
    int has_payload;
    size_t wire_bytes;   /* bytes of every frame received but the identity (counters) */
    char user_id[96];    /* ZAP User-Id of the connection ("" if none): CURVE peers */
} ps_wire_msg_t;

/* Fill *h with defaults for a message of `type` (version set). */
void ps_wire_header_init(Ps__Header *h, Ps__MsgType type);

/* Receive one whole multipart message from `sock` (flags: 0 or ZMQ_DONTWAIT).
 * router != 0: the first frame is the peer identity.
 * Returns 0 with m->hdr set and validated (version, frame count, payload_len
 * equal to the payload frame size, CRC32C when checksum is present);
 * PS_EAGAIN when nothing is waiting (DONTWAIT);
 * PS_EPROTO / PS_EVERSION / PS_ECORRUPT when the message was malformed: all
 * of its frames are consumed, m->hdr is NULL or kept for the reply's
 * request_id, the identity is kept so the caller can answer with an ERROR,
 * and `err` says what was wrong.
 * The caller always calls ps_wire_msg_close(m) afterwards. */
int ps_wire_recv(void *sock, ps_wire_msg_t *m, int router, int flags, char *err, size_t errlen);
void ps_wire_msg_close(ps_wire_msg_t *m);

/* Send header + optional payload.  identity/idlen: ROUTER destination (NULL
 * on a DEALER).  payload_len and checksum are filled in here.  If ffn is not
 * NULL the payload is sent zero-copy and ffn(payload, hint) is called by
 * ZeroMQ when done (ownership passes only on success); otherwise it is copied.
 * flags: 0 or ZMQ_DONTWAIT.  Returns 0, PS_EAGAIN, or PS_EZMQ (logged). */
int ps_wire_send(void *sock, const void *identity, size_t idlen, Ps__Header *h,
                 const void *payload, size_t len, zmq_free_fn *ffn, void *hint, int flags);

/* ps_wire_send with a checksum the caller already computed over
 * payload[0..len) (a WEIGHTS buffer shared by many replies is summed once). */
int ps_wire_send_crc(void *sock, const void *identity, size_t idlen, Ps__Header *h,
                     const void *payload, size_t len, uint32_t crc, zmq_free_fn *ffn,
                     void *hint, int flags);

/* Send an ERROR reply carrying code (PS_E*) and a printf-style text. */
int ps_wire_send_error(void *sock, const void *identity, size_t idlen, uint64_t request_id,
                       uint32_t partition, int code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* Name of a message type ("PUSH"), "?" if unknown; for log lines. */
const char *ps_wire_type_name(int type);

#endif
