/* Error codes shared by every module: 0 is success, failures are negative
 * PS_E* values.  One X-macro table yields the enum and the strings so the two
 * cannot drift apart (libuv's habit). */
#ifndef PS_ERROR_H
#define PS_ERROR_H

#define PS_ERRNO_MAP(X)                                                     \
    X(INVAL,      -1,  "invalid argument")                                  \
    X(NOMEM,      -2,  "out of memory")                                     \
    X(IO,         -3,  "I/O error")                                         \
    X(PROTO,      -4,  "malformed or unexpected message")                   \
    X(RANGE,      -5,  "value out of range")                                \
    X(CORRUPT,    -6,  "data corrupt (checksum or format)")                 \
    X(NOTFOUND,   -7,  "not found")                                         \
    X(MISMATCH,   -8,  "size, shape or table mismatch")                     \
    X(ZMQ,        -9,  "ZeroMQ error")                                      \
    X(TIMEOUT,    -10, "timed out")                                         \
    X(AGAIN,      -11, "resource temporarily unavailable")                  \
    X(UNSUPPORTED,-12, "not supported")                                     \
    X(STATE,      -13, "operation not valid in the current state")          \
    X(NONFINITE,  -14, "non-finite value (NaN or Inf)")                     \
    X(AUTH,       -15, "not authorised")                                    \
    X(SHUTDOWN,   -16, "shutting down")                                     \
    X(VERSION,    -17, "protocol version mismatch")                         \
    X(STALE,      -18, "request too stale")                                 \
    X(CUDA,       -19, "CUDA error")                                        \
    X(FAILED,     -20, "the job was stopped by a failure")                  \
    X(CANCELED,   -21, "request cancelled")

enum {
    PS_OK = 0,
#define PS_ERR_ENUM_(name, code, text) PS_E##name = code,
    PS_ERRNO_MAP(PS_ERR_ENUM_)
#undef PS_ERR_ENUM_
};

/* Human-readable text for a PS_E* code (never NULL). */
const char *ps_strerror(int err);
/* Symbolic name ("PS_EINVAL") for a PS_E* code (never NULL). */
const char *ps_errname(int err);

#endif
