/* A scripted stand-in for psd, for the client's unit tests: one thread with
 * a ROUTER socket built on ps_wire that speaks the protocol of
 * docs/protocol.md for ONE worker (lr 1: a push of g makes w -= g), and can
 * misbehave on request: drop requests or replies, duplicate replies, delay,
 * answer ERROR, never answer. */
#ifndef FAKE_PSD_H
#define FAKE_PSD_H
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_partition.h"

#define FAKE_MAX_LOG 8192

typedef struct fake_psd {
    /* configuration (set before fake_psd_start; knobs may change later) */
    int server_id;
    const ps_partition_table_t *t;
    uint64_t table_hash;         /* what WELCOME says (default t->hash) */
    int from_ckpt;               /* INIT spec answered with PS_FLAG_FROM_CKPT */
    atomic_int drop_requests;    /* ignore the next N data requests entirely */
    atomic_int drop_replies;     /* apply the next N data requests but lose the reply */
    atomic_int dup_replies;      /* send every reply twice */
    atomic_int delay_ms;         /* sleep before every data reply */
    atomic_int err_part;         /* this partition gets ERROR(PS_ESTALE) (-1: none) */
    atomic_int silent_part;      /* this partition is never answered (-1: none) */
    atomic_int garbage;          /* precede every data reply with malformed replies */
    atomic_int stall;            /* stop reading the socket (a hung peer) */
    atomic_int bad_weights;      /* WEIGHTS of this partition claim one element too many (-1: none) */
    atomic_int honor_reply_codec;/* encode WEIGHTS with Header.reply_codec (a fixed psd);
                                    0: with the request's codec (psd before the fix) */
    atomic_int force_codec;      /* >= 0: every WEIGHTS uses this codec (a broken server) */
    int sync_workers;            /* > 1: a sync server for that many workers
                                    (fake_psd_start_sync) */

    /* state: fp32 weights and version per partition (only owned ones used) */
    float **w;
    uint64_t *version;
    float **acc;                   /* sync: gradient sum of the current version */
    unsigned *pushed;              /* sync: bit r = rank r pushed (ranks < 32) */
    struct fake_waiter *waiters;   /* sync: replies held back */
    int next_rank;

    /* what arrived (under mu) */
    pthread_mutex_t mu;
    uint32_t order[FAKE_MAX_LOG];  /* partition of every data request, arrival order */
    int norder;
    int nhello, nspec, ninit_w, napplied, nbarrier, nstats, nckpt, nshutdown, nbye, nheartbeat;
    int nbad;                      /* malformed messages */
    int npull, noverflow;          /* PULLs; pushes flagged PS_FLAG_OVERFLOW */
    int push_codec[4];             /* pushes applied, by codec of their payload */

    char endpoint[128];            /* tcp://127.0.0.1:PORT, for the client */
    void *ctx, *sock;
    pthread_t th;
    atomic_int stop;
} fake_psd_t;

/* Bind (port 0 = any free port) and start the thread. */
int fake_psd_start(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port);
/* The same as a CURVE server with this Z85 secret key (no ZAP handler:
 * any client key is let in) when curve_secret is not NULL. */
int fake_psd_start_ex(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port,
                      const char *curve_secret);
/* A sync server for nworkers (ranks 0..nworkers-1, at most 32): a PUSH /
 * PUSHPULL of partition p is answered only once every rank pushed p for the
 * current version; then w -= the sum of their gradients. */
int fake_psd_start_sync(fake_psd_t *f, int server_id, const ps_partition_table_t *t, int port,
                        int nworkers);
void fake_psd_stop(fake_psd_t *f);
#endif
