/* Requests waiting for a reply (PULL / PUSHPULL waiters), counted per peer
 * (ROUTER identity), so one peer that floods the server with requests it
 * does not wait for is refused with PS_EAGAIN while the others go on.  An
 * open-addressing hash table keyed by the identity bytes; entries whose
 * count falls to zero are kept as reusable slots (few peers: one per worker
 * connection) until the table is 3/4 full; then it is rebuilt with only the
 * peers that have requests waiting (and doubled if they are many). */
#include "psd.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

typedef struct peer {
    uint8_t id[256];
    uint8_t idlen;
    uint8_t used;
    int waiting;
} peer_t;

struct psd_peers {
    peer_t *tab;
    size_t cap, used; /* slots, slots ever taken */
};

static uint64_t hash_id(const void *id, size_t n)
{
    const uint8_t *b = id;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static peer_t *find(psd_peers_t *p, const void *id, size_t n, int insert)
{
    if (n > 255) n = 255;
    size_t mask = p->cap - 1, i = hash_id(id, n) & mask;
    for (;; i = (i + 1) & mask) {
        peer_t *e = &p->tab[i];
        if (!e->used) {
            if (!insert) return NULL;
            e->used = 1;
            e->idlen = (uint8_t)n;
            memcpy(e->id, id, n);
            e->waiting = 0;
            p->used++;
            return e;
        }
        if (e->idlen == n && !memcmp(e->id, id, n)) return e;
    }
}

static int grow(psd_peers_t *p)
{
    /* Rehash in place when most slots are peers with nothing waiting. */
    size_t live = 0;
    for (size_t i = 0; i < p->cap; i++) live += p->tab[i].used && p->tab[i].waiting > 0;
    size_t ncap = !p->cap ? 64 : live * 2 > p->cap ? 2 * p->cap : p->cap;
    peer_t *old = p->tab;
    size_t ocap = p->cap;
    p->tab = calloc(ncap, sizeof *p->tab);
    if (!p->tab) {
        p->tab = old;
        return PS_ENOMEM;
    }
    p->cap = ncap;
    p->used = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].used && old[i].waiting > 0) {
            peer_t *e = find(p, old[i].id, old[i].idlen, 1);
            e->waiting = old[i].waiting;
        }
    free(old);
    return 0;
}

int psd_peers_acquire(psd_peers_t **pp, const void *id, size_t idlen, int cap)
{
    if (!*pp && !(*pp = calloc(1, sizeof **pp))) return PS_ENOMEM;
    psd_peers_t *p = *pp;
    if ((p->used + 1) * 4 > p->cap * 3 && grow(p)) return PS_ENOMEM;
    peer_t *e = find(p, id, idlen, 1);
    if (cap > 0 && e->waiting >= cap) return PS_EAGAIN;
    e->waiting++;
    return 0;
}

void psd_peers_release(psd_peers_t *p, const void *id, size_t idlen)
{
    if (!p || !p->cap) return;
    peer_t *e = find(p, id, idlen, 0);
    if (e && e->waiting > 0) e->waiting--;
}

void psd_peers_free(psd_peers_t **pp)
{
    if (!*pp) return;
    free((*pp)->tab);
    free(*pp);
    *pp = NULL;
}
