/* --curve: CURVE encryption on the ROUTER socket and a ZAP 1.0 handler
 * (inproc://zeromq.zap.01, its own thread) that lets in only the public
 * keys of the allow-list and tells the handlers which of them are admins:
 * the reply's User-Id is "admin:<key>" or "worker:<key>", and ZeroMQ
 * attaches it to every frame received from that connection (read by
 * ps_wire_recv into ps_wire_msg_t.user_id).
 *
 * Key files are what `psctl keygen PREFIX` writes: PREFIX.key holds the Z85
 * secret key, PREFIX.pub the Z85 public key (40 characters, one line).  An
 * allow-list is a file with one Z85 public key per line ('#' comments and
 * blank lines ignored) or a directory whose *.pub files are read so.
 *
 * A plaintext client fails the handshake before ZAP is asked (mechanism
 * mismatch); the same thread watches the socket monitor so that is logged
 * too.  Log lines are rate limited (a scan of the port must not fill the
 * journal). */
#include "psd.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define MON_ENDPOINT "inproc://psd.curve.monitor"
#define KEYLEN 32

typedef struct zkey {
    uint8_t k[KEYLEN];
    int admin;
} zkey_t;

typedef struct zap {
    void *rep, *mon;
    pthread_t th;
    int started;
    atomic_int stop;
    zkey_t *keys;
    size_t nkeys, cap;
    /* log rate limit (ZAP thread only) */
    time_t win;
    int nlog;
    unsigned long suppressed;
} zap_t;

/* Trim s in place; returns it. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
    return s;
}

static int decode_key(const char *z85, uint8_t out[KEYLEN])
{
    return strlen(z85) == 40 && zmq_z85_decode(out, z85) ? 0 : PS_EINVAL;
}

static int add_key(zap_t *z, const uint8_t k[KEYLEN], int admin)
{
    for (size_t i = 0; i < z->nkeys; i++)
        if (!memcmp(z->keys[i].k, k, KEYLEN)) {
            z->keys[i].admin |= admin;
            return 0;
        }
    if (z->nkeys == z->cap) {
        size_t nc = z->cap ? 2 * z->cap : 16;
        zkey_t *t = realloc(z->keys, nc * sizeof *t);
        if (!t) return PS_ENOMEM;
        z->keys = t;
        z->cap = nc;
    }
    memcpy(z->keys[z->nkeys].k, k, KEYLEN);
    z->keys[z->nkeys++].admin = admin;
    return 0;
}

/* One key per line; every line must be a key, a comment or blank. */
static int load_key_file(zap_t *z, const char *path, int admin, int *count)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ps_error("--curve: cannot read key file %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    char line[256];
    int ln = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *t = trim(line);
        if (!*t || *t == '#') continue;
        uint8_t k[KEYLEN];
        if (decode_key(t, k)) {
            ps_error("--curve: %s line %d: not a Z85 public key (want 40 characters)", path, ln);
            rc = PS_EINVAL;
            break;
        }
        if ((rc = add_key(z, k, admin))) break;
        (*count)++;
    }
    fclose(f);
    return rc;
}

/* A file of keys, or a directory of *.pub files. */
static int load_keys(zap_t *z, const char *path, int admin)
{
    int count = 0, rc = 0;
    DIR *d = opendir(path);
    if (!d) {
        if (errno != ENOTDIR) {
            ps_error("--curve: %s: %s", path, strerror(errno));
            return PS_EIO;
        }
        rc = load_key_file(z, path, admin, &count);
    } else {
        struct dirent *e;
        while (!rc && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n < 5 || strcmp(e->d_name + n - 4, ".pub")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            rc = load_key_file(z, p, admin, &count);
        }
        closedir(d);
    }
    if (!rc && !count) {
        ps_error("--curve: %s holds no public key", path);
        rc = PS_EINVAL;
    }
    if (!rc) ps_info("--curve: %d %s key(s) from %s", count, admin ? "admin" : "allowed", path);
    return rc;
}

static int read_secret(const char *path, char z85[41])
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ps_error("--curve-secret-key %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    char line[256] = "";
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    char *t = ok ? trim(line) : line;
    uint8_t k[KEYLEN];
    if (decode_key(t, k)) {
        ps_error("--curve-secret-key %s: not a Z85 secret key (want 40 characters, as psctl keygen writes)",
                 path);
        memset(line, 0, sizeof line);
        return PS_EINVAL;
    }
    memcpy(z85, t, 41);
    memset(line, 0, sizeof line);
    return 0;
}

static void zlog(zap_t *z, const char *fmt, const char *a, const char *b)
{
    time_t now = time(NULL);
    if (now != z->win) {
        if (z->suppressed) ps_warn("ZAP: %lu more refusals not logged", z->suppressed);
        z->win = now;
        z->nlog = 0;
        z->suppressed = 0;
    }
    if (z->nlog++ < 10) ps_warn(fmt, a, b);
    else z->suppressed++;
}

static int send_str(void *sock, const char *s, int more)
{
    return zmq_send(sock, s, strlen(s), more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

/* One ZAP request: [version, request_id, domain, address, routing_id,
 * mechanism, credentials...] -> [version, request_id, status, text,
 * user_id, metadata]. */
static void zap_one(zap_t *z)
{
    char fr[8][256];
    size_t len[8] = {0};
    int n = 0, more = 1;
    uint8_t key[KEYLEN];
    int have_key = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->rep, 0) < 0) {
            zmq_msg_close(&m);
            return;
        }
        more = zmq_msg_more(&m);
        if (n < 8) {
            size_t l = zmq_msg_size(&m);
            len[n] = l < 255 ? l : 255;
            memcpy(fr[n], zmq_msg_data(&m), len[n]);
            fr[n][len[n]] = 0;
            if (n == 6 && l == KEYLEN) {
                memcpy(key, zmq_msg_data(&m), KEYLEN);
                have_key = 1;
            }
        }
        n++;
        zmq_msg_close(&m);
    }
    const char *status = "400", *text = "key not allowed";
    char uid[96] = "", zk[41] = "?";
    if (have_key) zmq_z85_encode(zk, key, KEYLEN);
    if (n < 6 || strcmp(fr[0], "1.0")) {
        text = "malformed ZAP request";
        zlog(z, "ZAP: malformed request (%s%s)", n < 6 ? "too few frames" : "version not 1.0", "");
    } else if (strcmp(fr[5], "CURVE") || !have_key) {
        text = "CURVE required";
        zlog(z, "ZAP: refused %s connection from %s (CURVE required)", fr[5], fr[3]);
    } else {
        for (size_t i = 0; i < z->nkeys; i++)
            if (!memcmp(z->keys[i].k, key, KEYLEN)) {
                status = "200";
                text = "OK";
                snprintf(uid, sizeof uid, "%s:%s", z->keys[i].admin ? "admin" : "worker", zk);
                break;
            }
        if (!uid[0]) zlog(z, "ZAP: refused unknown key %s from %s", zk, fr[3]);
        else ps_debug("ZAP: accepted %s from %s", uid, fr[3]);
    }
    /* request_id is echoed as received (binary-safe length). */
    if (send_str(z->rep, "1.0", 1) < 0 || zmq_send(z->rep, fr[1], n > 1 ? len[1] : 0, ZMQ_SNDMORE) < 0 ||
        send_str(z->rep, status, 1) < 0 || send_str(z->rep, text, 1) < 0 || send_str(z->rep, uid, 1) < 0 ||
        zmq_send(z->rep, "", 0, 0) < 0)
        ps_error("ZAP: cannot reply: %s", zmq_strerror(errno));
}

/* Socket monitor: handshakes that failed before (or at) ZAP. */
static void mon_one(zap_t *z)
{
    zmq_msg_t a, b;
    zmq_msg_init(&a);
    zmq_msg_init(&b);
    if (zmq_msg_recv(&a, z->mon, 0) < 0) goto out;
    if (!zmq_msg_more(&a) || zmq_msg_recv(&b, z->mon, 0) < 0) goto out;
    if (zmq_msg_size(&a) >= 6) {
        uint16_t ev;
        uint32_t val;
        memcpy(&ev, zmq_msg_data(&a), 2);
        memcpy(&val, (char *)zmq_msg_data(&a) + 2, 4);
        char ep[256], why[64];
        size_t l = zmq_msg_size(&b) < 255 ? zmq_msg_size(&b) : 255;
        memcpy(ep, zmq_msg_data(&b), l);
        ep[l] = 0;
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            snprintf(why, sizeof why, "mechanism mismatch (plaintext client?)");
        else
            snprintf(why, sizeof why, "event 0x%x, code 0x%x", ev, val);
        if (ev != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) /* ZAP refusals are logged by zap_one */
            zlog(z, "ZAP: handshake refused on %s: %s", ep, why);
    }
out:
    zmq_msg_close(&a);
    zmq_msg_close(&b);
}

static void *zap_thread(void *arg)
{
    zap_t *z = arg;
    zmq_pollitem_t it[2] = {{z->rep, 0, ZMQ_POLLIN, 0}, {z->mon, 0, ZMQ_POLLIN, 0}};
    while (!atomic_load(&z->stop)) {
        /* A short timeout so a stop request is seen without ctx shutdown. */
        int n = zmq_poll(it, z->mon ? 2 : 1, 100);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != ETERM) ps_error("ZAP: zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        if (it[0].revents & ZMQ_POLLIN) zap_one(z);
        if (z->mon && (it[1].revents & ZMQ_POLLIN)) mon_one(z);
    }
    return NULL;
}

static int set_opt(void *sock, int opt, const void *v, size_t n, const char *name)
{
    if (zmq_setsockopt(sock, opt, v, n) < 0) {
        ps_error("--curve: zmq_setsockopt(%s): %s", name, zmq_strerror(errno));
        return PS_EZMQ;
    }
    return 0;
}

static void zap_free(zap_t *z)
{
    if (!z) return;
    if (z->rep) zmq_close(z->rep);
    if (z->mon) zmq_close(z->mon);
    free(z->keys);
    free(z);
}

int psd_curve_setup(psd_t *s, void *sock)
{
    const psd_opts_t *o = &s->o;
    char sec[41], pub[41];
    int rc, one = 1, zero = 0;
    if (!o->curve) return 0;
    if (!zmq_has("curve")) {
        ps_error("--curve: this libzmq was built without CURVE support");
        return PS_EUNSUPPORTED;
    }
    if (!o->curve_secret_key || !o->curve_secret_key[0] || !o->curve_allow || !o->curve_allow[0]) {
        ps_error("--curve needs --curve-secret-key FILE and --curve-allow FILE_OR_DIR");
        return PS_EINVAL;
    }
    zap_t *z = calloc(1, sizeof *z);
    if (!z) return PS_ENOMEM;
    atomic_init(&z->stop, 0);
    if ((rc = read_secret(o->curve_secret_key, sec))) goto fail;
    if (zmq_curve_public(pub, sec) < 0) {
        ps_error("--curve-secret-key %s: cannot derive the public key: %s", o->curve_secret_key,
                 zmq_strerror(errno));
        rc = PS_EINVAL;
        goto fail;
    }
    if ((rc = load_keys(z, o->curve_allow, 0))) goto fail;
    if (o->curve_admin && o->curve_admin[0] && (rc = load_keys(z, o->curve_admin, 1))) goto fail;

    /* The handler must be bound before the first client connects. */
    rc = PS_EZMQ;
    z->rep = zmq_socket(s->zctx, ZMQ_REP);
    if (!z->rep || zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero) < 0 ||
        zmq_bind(z->rep, ZAP_ENDPOINT) < 0) {
        ps_error("--curve: cannot start the ZAP handler on " ZAP_ENDPOINT ": %s", zmq_strerror(errno));
        goto fail;
    }
    if (zmq_socket_monitor(sock, MON_ENDPOINT,
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
        z->mon = zmq_socket(s->zctx, ZMQ_PAIR);
        if (z->mon && zmq_connect(z->mon, MON_ENDPOINT) < 0) {
            zmq_close(z->mon);
            z->mon = NULL;
        }
    }
    if (!z->mon) ps_warn("--curve: no socket monitor (%s); plaintext refusals are not logged", zmq_strerror(errno));
    if ((rc = set_opt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "ZMQ_CURVE_SERVER")) ||
        (rc = set_opt(sock, ZMQ_CURVE_SECRETKEY, sec, 40, "ZMQ_CURVE_SECRETKEY")) ||
        /* With a domain set, libzmq refuses clients if no handler answers. */
        (rc = set_opt(sock, ZMQ_ZAP_DOMAIN, "psd", 3, "ZMQ_ZAP_DOMAIN")))
        goto fail;
    if (pthread_create(&z->th, NULL, zap_thread, z)) {
        ps_error("--curve: cannot start the ZAP thread: %s", strerror(errno));
        rc = PS_ENOMEM;
        goto fail;
    }
    z->started = 1;
    memset(sec, 0, sizeof sec);
    s->zap = z;
    ps_info("CURVE on: server public key %s, %zu keys allowed, ZAP handler " ZAP_ENDPOINT, pub, z->nkeys);
    return 0;
fail:
    memset(sec, 0, sizeof sec);
    zap_free(z);
    ps_error("--curve: refusing to start without a working ZAP handler");
    return rc;
}

void psd_curve_stop(psd_t *s)
{
    zap_t *z = s->zap;
    if (!z) return;
    atomic_store(&z->stop, 1);
    if (z->started) pthread_join(z->th, NULL);
    zap_free(z);
    s->zap = NULL;
}

int psd_curve_is_admin(const psd_t *s, const ps_wire_msg_t *m)
{
    if (!s->o.curve) return 1;
    return !strncmp(m->user_id, "admin:", 6);
}
