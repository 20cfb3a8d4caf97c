/* psd client: CURVE keys.  Key files hold one Z85 key as
 * `psctl keygen PREFIX` writes them (PREFIX.pub / PREFIX.key); psd runs a ZAP
 * handler with an allow-list of client public keys, so a client whose key
 * is not listed is never answered (its requests time out). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_client_int.h"
#include "ps_error.h"
#include "ps_log.h"

#define Z85_LEN 40
#define KEY_FILE_MAX 4096 /* a key file is 41 bytes; anything much larger is not one */

static const char z85_chars[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

int ps_client_load_z85_key(const char *path, char out[41])
{
    char buf[KEY_FILE_MAX + 1];
    out[0] = 0;
    if (!path || !*path) {
        ps_error("CURVE key: no file name given");
        return PS_EINVAL;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        ps_error("CURVE key %s: cannot open: %s", path, strerror(errno));
        return PS_EIO;
    }
    size_t n = fread(buf, 1, KEY_FILE_MAX + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        ps_error("CURVE key %s: read error", path);
        return PS_EIO;
    }
    if (n > KEY_FILE_MAX) {
        ps_error("CURVE key %s: larger than %d bytes, not a key file", path, KEY_FILE_MAX);
        return PS_EINVAL;
    }
    buf[n] = 0;
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)buf[a])) a++;
    while (b > a && isspace((unsigned char)buf[b - 1])) b--;
    if (b == a) {
        ps_error("CURVE key %s: file is empty (want one %d-character Z85 key)", path, Z85_LEN);
        return PS_EINVAL;
    }
    for (size_t i = a; i < b; i++) {
        unsigned char ch = (unsigned char)buf[i];
        if (isspace(ch)) {
            ps_error("CURVE key %s: more than one word (want one %d-character Z85 key)", path, Z85_LEN);
            return PS_EINVAL;
        }
        if (!ch || !strchr(z85_chars, ch)) {
            ps_error("CURVE key %s: character %zu (0x%02x) is not in the Z85 alphabet", path,
                     i - a + 1, ch);
            return PS_EINVAL;
        }
    }
    if (b - a != Z85_LEN) {
        ps_error("CURVE key %s: %zu characters, a Z85 CURVE key has %d", path, b - a, Z85_LEN);
        return PS_EINVAL;
    }
    memcpy(out, buf + a, Z85_LEN);
    out[Z85_LEN] = 0;
    memset(buf, 0, sizeof buf); /* may be a secret key */
    return 0;
}

int ps_client_curve_load(ps_client_t *c)
{
    const ps_client_opts_t *o = &c->o;
    int nset = (o->ncurve_server_keys > 0 && o->curve_server_keys) + !!o->curve_public_key +
               !!o->curve_secret_key;
    if (nset == 0) return 0;
    if (nset != 3) {
        ps_error("CURVE needs all three: the servers' public key, and this client's public and "
                 "secret key files");
        return PS_EINVAL;
    }
    if (o->ncurve_server_keys != 1 && o->ncurve_server_keys != o->nservers) {
        ps_error("CURVE: %d server key files for %d servers (give one shared, or one per server)",
                 o->ncurve_server_keys, o->nservers);
        return PS_EINVAL;
    }
    if (!zmq_has("curve")) {
        ps_error("CURVE keys given but this libzmq was built without CURVE support");
        return PS_EUNSUPPORTED;
    }
    c->curve_server = calloc((size_t)o->nservers, sizeof *c->curve_server);
    if (!c->curve_server) return PS_ENOMEM;
    int rc;
    for (int s = 0; s < o->nservers; s++) {
        if (s > 0 && o->ncurve_server_keys == 1) {
            memcpy(c->curve_server[s], c->curve_server[0], sizeof c->curve_server[0]);
            continue;
        }
        if ((rc = ps_client_load_z85_key(o->curve_server_keys[s], c->curve_server[s])) < 0)
            return rc;
    }
    if ((rc = ps_client_load_z85_key(o->curve_public_key, c->curve_public)) < 0 ||
        (rc = ps_client_load_z85_key(o->curve_secret_key, c->curve_secret)) < 0)
        return rc;
    /* A public key in the secret key's place (or the reverse) would only
     * show up as a silent handshake failure: check the pair matches. */
    char derived[41];
    if (zmq_curve_public(derived, c->curve_secret) < 0) {
        ps_error("CURVE: %s does not decode as a secret key: %s", o->curve_secret_key,
                 zmq_strerror(errno));
        return PS_EINVAL;
    }
    if (strcmp(derived, c->curve_public)) {
        ps_error("CURVE: public key %s does not belong to secret key %s", o->curve_public_key,
                 o->curve_secret_key);
        return PS_EINVAL;
    }
    c->curve = 1;
    return 0;
}

int ps_client_curve_apply(ps_client_t *c, int s, void *sock)
{
    if (!c->curve) return 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->curve_server[s], 40) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->curve_public, 40) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->curve_secret, 40) < 0) {
        ps_error("server %d: setting the CURVE keys: %s", s, zmq_strerror(errno));
        return PS_EZMQ;
    }
    return 0;
}
