/* Ring allreduce (worker/comm/ps_ring.c): W = 2, 3, 4 ranks as threads on
 * loopback.  References are independent of the ring: the double-precision
 * sum of the inputs (with the rounding bound each wire dtype allows), exact
 * sums of integer-valued inputs, bit equality across ranks, a missing rank,
 * hand-made bad messages (framing as documented in ps_ring.h), and the
 * property that SGD on ring-averaged gradients gives the same
 * weights as SGD on the psd-style rank-order average. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "common/ps_crc32c.h"
#include "common/ps_error.h"
#include "common/ps_log.h"
#include "common/ps_optim.h"
#include "common/ps_partition.h"
#include "tests/lib/tap.h"
#include "worker/comm/ps_ring.h"

#define MAXW 4
#define MAXCASES 16

/* Free loopback endpoints: bind to an ephemeral port, note it, close. */
static void free_endpoints(char eps[][64], int w)
{
    int fds[MAXW + 1];
    for (int i = 0; i < w; i++) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t l = sizeof sa;
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&sa, sizeof sa) ||
            getsockname(fds[i], (struct sockaddr *)&sa, &l)) {
            printf("Bail out! cannot bind a loopback port: %s\n", strerror(errno));
            exit(1);
        }
        snprintf(eps[i], 64, "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    }
    for (int i = 0; i < w; i++) close(fds[i]);
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static float urand(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)rng_next(s) / (double)(1ull << 31) * 2.0 - 1.0);
}

typedef struct rcase {
    size_t n;
    ps_dtype_t dt;
    int integer;          /* integer-valued inputs: the fp32 sum is exact */
    float *in[MAXW];      /* inputs per rank */
    float *out[MAXW];     /* results per rank */
    int rc[MAXW];
} rcase_t;

typedef struct rank_arg {
    int rank, world;
    const char *eps[MAXW];
    ps_ring_opts_t opts;
    rcase_t *cases;
    int ncases;
    int new_rc;
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    ps_ring_t *r = NULL;
    a->new_rc = ps_ring_new(&r, a->rank, a->world, a->eps, &a->opts);
    for (int c = 0; c < a->ncases; c++) {
        rcase_t *k = &a->cases[c];
        k->rc[a->rank] = a->new_rc ? a->new_rc : ps_ring_allreduce(r, k->out[a->rank], k->n, k->dt);
    }
    ps_ring_destroy(&r);
    return NULL;
}

/* Start ranks [0, nstart) of a ring of W and run all cases on each. */
static void run_ring(int W, int nstart, const ps_ring_opts_t *o, rcase_t *cases, int ncases,
                     rank_arg_t *args)
{
    char eps[MAXW][64];
    free_endpoints(eps, W);
    pthread_t th[MAXW];
    for (int r = 0; r < nstart; r++) {
        args[r] = (rank_arg_t){.rank = r, .world = W, .opts = *o, .cases = cases, .ncases = ncases};
        for (int i = 0; i < W; i++) args[r].eps[i] = eps[i];
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < nstart; r++) pthread_join(th[r], NULL);
}

static void fill_case(rcase_t *k, int W, size_t n, ps_dtype_t dt, int integer, uint64_t seed)
{
    k->n = n;
    k->dt = dt;
    k->integer = integer;
    for (int r = 0; r < W; r++) {
        k->in[r] = malloc((n ? n : 1) * sizeof(float));
        k->out[r] = malloc((n ? n : 1) * sizeof(float));
        uint64_t s = seed * 1000003u + (uint64_t)r * 7919u + 1;
        for (size_t i = 0; i < n; i++)
            k->in[r][i] = integer ? (float)((int)(rng_next(&s) % 2001) - 1000) : urand(&s);
        memcpy(k->out[r], k->in[r], n * sizeof(float));
        k->rc[r] = -999;
    }
}

static void free_case(rcase_t *k, int W)
{
    for (int r = 0; r < W; r++) {
        free(k->in[r]);
        free(k->out[r]);
    }
}

/* Check one case: every rank returned 0, results bit-identical across ranks,
 * and within the rounding bound of the exact (double) sum:
 *   fp32: (W-1) additions, each off by <= 2^-24 * |partial| <= 2^-24 * S;
 *   fp16/bf16: W quantisations of partial sums (ps_ring.h), u = 2^-11 / 2^-8,
 * with S = sum_i |x_i| per element. */
static void check_case(const rcase_t *k, int W, const char *what)
{
    int allrc = 1, same = 1;
    for (int r = 0; r < W; r++) allrc &= k->rc[r] == 0;
    ok(allrc, "%s: every rank returns 0 (rank 0: %s)", what, ps_errname(k->rc[0]));
    for (int r = 1; r < W; r++) same &= !memcmp(k->out[r], k->out[0], k->n * sizeof(float));
    ok(same, "%s: result bit-identical on all %d ranks", what, W);
    double u = k->dt == PS_DT_FP32 ? 0x1p-24 * (W - 1) * 1.01 : (k->dt == PS_DT_FP16 ? 0x1p-11 : 0x1p-8) * W * 1.01;
    size_t bad = 0, worst = 0;
    double worst_ex = -1;
    for (size_t i = 0; i < k->n; i++) {
        double sum = 0, abs = 0;
        for (int r = 0; r < W; r++) {
            sum += k->in[r][i];
            abs += fabs(k->in[r][i]);
        }
        double err = fabs(k->out[0][i] - sum);
        double lim = k->integer && k->dt == PS_DT_FP32 ? 0 : u * abs + 1e-30;
        if (!(err <= lim)) {
            bad++;
            if (err - lim > worst_ex) worst_ex = err - lim, worst = i;
        }
    }
    if (!ok(bad == 0, "%s: %zu elements equal the exact sum within the %s bound", what, k->n,
            k->integer && k->dt == PS_DT_FP32 ? "exact" : ps_dtype_name(k->dt)))
        diag("%zu bad; worst element %zu exceeds its bound by %g", bad, worst, worst_ex);
}

static void test_sums(int W, const ps_ring_opts_t *o, const char *label)
{
    static const size_t sizes[] = {0, 1, 2, 3, 5, 1000, 12345, 100003};
    rcase_t cases[MAXCASES];
    int nc = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        fill_case(&cases[nc++], W, sizes[s], PS_DT_FP32, 0, 10 * W + s);
    fill_case(&cases[nc++], W, 4097, PS_DT_FP32, 1, 99);
    fill_case(&cases[nc++], W, 30011, PS_DT_FP16, 0, 77);
    fill_case(&cases[nc++], W, 3, PS_DT_FP16, 0, 78);
    fill_case(&cases[nc++], W, 30011, PS_DT_BF16, 0, 79);
    rank_arg_t args[MAXW];
    run_ring(W, W, o, cases, nc, args);
    for (int c = 0; c < nc; c++) {
        char what[128];
        snprintf(what, sizeof what, "%s W=%d n=%zu %s%s", label, W, cases[c].n,
                 ps_dtype_name(cases[c].dt), cases[c].integer ? " integers" : "");
        check_case(&cases[c], W, what);
        free_case(&cases[c], W);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Ranks 0 and 1 of a ring of 3 run; rank 2 never starts. */
static void test_missing_rank(void)
{
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = 300;
    rcase_t cases[2];
    fill_case(&cases[0], 3, 1000, PS_DT_FP32, 0, 5);
    fill_case(&cases[1], 3, 10, PS_DT_FP32, 0, 6);
    rank_arg_t args[MAXW];
    diag("two 'no progress' errors from ranks 0 and 1 expected below");
    double t0 = now_s();
    run_ring(3, 2, &o, cases, 2, args);
    double dt = now_s() - t0;
    /* the first rank to time out resets its connections, so the other may
     * learn it from a reset (PS_EIO) just before its own timeout */
    int r0 = cases[0].rc[0], r1 = cases[0].rc[1];
    ok((r0 == PS_ETIMEOUT || r0 == PS_EIO) && (r1 == PS_ETIMEOUT || r1 == PS_EIO) &&
           (r0 == PS_ETIMEOUT || r1 == PS_ETIMEOUT),
       "missing rank 2: ranks 0 and 1 fail, one by timing out (%s, %s)", ps_errname(r0), ps_errname(r1));
    is_int(cases[1].rc[0], PS_ESTATE, "the next call on a broken ring is refused");
    ok(dt < 5.0, "timeouts of 300 ms return promptly (%.2f s incl. linger)", dt);
    free_case(&cases[0], 3);
    free_case(&cases[1], 3);
}

/* All three ranks finish one allreduce, then rank 2 exits: the next call
 * on ranks 0 and 1 must fail at once (closed / reset connection), not hang
 * and not wait for the timeout. */
static void test_dead_rank(void)
{
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = 20000;
    o.segment_bytes = 4096;
    rcase_t cases[2];
    fill_case(&cases[0], 3, 5000, PS_DT_FP32, 1, 11);
    fill_case(&cases[1], 3, 5000, PS_DT_FP32, 1, 12);
    char eps[3][64];
    free_endpoints(eps, 3);
    rank_arg_t args[3];
    pthread_t th[3];
    diag("'closed the connection' / 'reset' errors from ranks 0 and 1 expected below");
    double t0 = now_s();
    for (int r = 0; r < 3; r++) {
        args[r] = (rank_arg_t){.rank = r, .world = 3, .opts = o, .cases = cases, .ncases = r == 2 ? 1 : 2};
        for (int i = 0; i < 3; i++) args[r].eps[i] = eps[i];
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    double dt = now_s() - t0;
    check_case(&cases[0], 3, "dead rank: the call before rank 2 exits");
    is_int(cases[1].rc[0], PS_EIO, "rank 2 gone: rank 0 sees its connection closed (%s)", ps_errname(cases[1].rc[0]));
    is_int(cases[1].rc[1], PS_EIO, "rank 2 gone: rank 1 fails too (%s)", ps_errname(cases[1].rc[1]));
    ok(dt < 5.0, "rank 2 gone: noticed in %.2f s, long before the 20 s timeout", dt);
    free_case(&cases[0], 3);
    free_case(&cases[1], 3);
}

/* A fake left neighbour (rank 1 of 2) talks to rank 0 by hand over TCP,
 * with the hello and framing ps_ring.h documents. */
typedef struct fake {
    uint32_t magic;       /* message header magic */
    uint64_t n_claimed;
    int corrupt_crc;
    uint32_t op;
    int hello_rank;       /* rank the hello claims */
    uint64_t hello_seg;   /* segment size the hello claims */
    int stranger;         /* first a connection that is not a ring peer */
    int cut;              /* close the connection in the middle of the payload */
    int finish;           /* also send the all-gather message: a complete call */
    int dribble;          /* write everything 3 bytes at a time (partial
                             hellos, headers, elements and trailers) */
    int mutate;           /* 1: flip bits mxor at byte mpos of the whole
                             stream (hello + both messages), 2: cut it to
                             mpos bytes; then close the connection */
    size_t mpos;
    uint8_t mxor;
} fake_t;

static void fake_default(fake_t *f)
{
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    *f = (fake_t){.magic = 0x31525350u, .n_claimed = 10, .op = 1, .hello_rank = 1,
                  .hello_seg = o.segment_bytes};
}

static int tcp_to(const char *ep)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    sa.sin_port = htons((uint16_t)atoi(strrchr(ep, ':') + 1));
    for (int tries = 0; tries < 200; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small writes go out alone */
        if (!connect(fd, (struct sockaddr *)&sa, sizeof sa)) return fd;
        close(fd);
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* One ring message from rank 1: header, count floats, CRC trailer. */
static size_t fake_msg(uint8_t *m, const fake_t *f, uint32_t index, const float *vals, uint32_t cnt,
                       int corrupt)
{
    memset(m, 0, 32);
    put_le(m, f->magic, 4);
    put_le(m + 6, 1, 2); /* dtype fp32 (0), sender rank 1 */
    put_le(m + 8, f->op, 4);
    put_le(m + 12, index, 4);
    put_le(m + 16, f->n_claimed, 8);
    put_le(m + 24, cnt, 4);
    memcpy(m + 32, vals, cnt * sizeof(float));
    /* trailer: CRC32C of the payload */
    put_le(m + 32 + cnt * sizeof(float), ps_crc32c(0, vals, cnt * sizeof(float)) ^ (corrupt ? 1u : 0u), 4);
    return 32 + cnt * sizeof(float) + 4;
}

typedef struct dribble_arg {
    ps_ring_t *r;
    float *data;
    int rc;
} dribble_arg_t;

static void *dribble_call(void *p)
{
    dribble_arg_t *a = p;
    a->rc = ps_ring_allreduce(a->r, a->data, 10, PS_DT_FP32);
    return NULL;
}

static int fake_left(const fake_t *f, float data[10])
{
    char eps[2][64];
    free_endpoints(eps, 2);
    /* rank 1's listening socket: the kernel takes rank 0's connection and
     * the little it sends without an accept */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    sa.sin_port = htons((uint16_t)atoi(strrchr(eps[1], ':') + 1));
    int sink = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(sink, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(sink, (struct sockaddr *)&sa, sizeof sa) || listen(sink, 4)) return -999;
    const char *ep[2] = {eps[0], eps[1]};
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = f->mutate ? 150 : 2000;
    ps_ring_t *r = NULL;
    int rc = ps_ring_new(&r, 0, 2, ep, &o);
    if (rc) return rc;
    int stranger = -1;
    if (f->stranger) { /* e.g. a port scan or a health check: no hello */
        stranger = tcp_to(eps[0]);
        if (write(stranger, "GET / HTTP/1.0\r\n\r\n0123456789012345", 34) != 34) return -998;
    }
    int fd = tcp_to(eps[0]);
    uint8_t hello[32] = {0};
    put_le(hello, 0x48525350u, 4); /* "PSRH" */
    put_le(hello + 4, 1, 2);       /* version */
    put_le(hello + 6, (uint64_t)f->hello_rank, 2);
    put_le(hello + 8, 2, 4);       /* world */
    put_le(hello + 12, 0, 2);      /* connection 0 */
    put_le(hello + 14, 1, 2);      /* of 1 */
    put_le(hello + 16, f->hello_seg, 8);
    put_le(hello + 24, 1, 4);      /* checksums on */
    uint8_t msg[2][32 + 5 * sizeof(float) + 4];
    /* n = 10, W = 2: rank 0 first receives chunk 1 = elements [5, 10), then
     * (all-gather) the finished chunk 0 = elements [0, 5) */
    float vals[5] = {1, 2, 3, 4, 5}, fin[5] = {-1, -2, -3, -4, -5};
    size_t l0 = fake_msg(msg[0], f, 0, vals, 5, f->corrupt_crc);
    size_t l1 = fake_msg(msg[1], f, 1, fin, 5, 0);
    /* the whole stream; the variants send a prefix of it, or alter it */
    uint8_t all[32 + sizeof msg];
    memcpy(all, hello, 32);
    memcpy(all + 32, msg[0], l0);
    memcpy(all + 32 + l0, msg[1], l1);
    size_t len = 32 + (f->cut ? l0 - 8 : l0) + (f->finish ? l1 : 0);
    if (f->mutate == 1) all[f->mpos % len] ^= f->mxor;
    else if (f->mutate == 2) len = f->mpos % len;
    int wr = 1;
    if (f->dribble) { /* from a thread-less fake: the ring must see the
                         pieces, so its call runs in a child thread */
        dribble_arg_t da = {.r = r, .data = data};
        pthread_t th;
        pthread_create(&th, NULL, dribble_call, &da);
        for (size_t o = 0; wr && o < len; o += 3) {
            size_t k = len - o < 3 ? len - o : 3;
            wr = write(fd, all + o, k) == (ssize_t)k;
            struct timespec ts = {0, 300000};
            nanosleep(&ts, NULL);
        }
        pthread_join(th, NULL);
        rc = wr ? da.rc : -997;
    } else {
        wr = write(fd, all, len) == (ssize_t)len;
        if (f->cut || f->mutate) { /* then the connection ends */
            close(fd);
            fd = -1;
        }
        rc = wr ? ps_ring_allreduce(r, data, 10, PS_DT_FP32) : -997;
    }
    ps_ring_destroy(&r);
    if (fd >= 0) close(fd);
    if (stranger >= 0) close(stranger);
    close(sink);
    return rc;
}

static void test_bad_messages(void)
{
    fake_t f;
    float d[10] = {0};
    diag("seven ring errors and a warning expected below");
    /* one planted fault each */
    struct {
        fake_t f;
        int want;
        const char *what;
    } bc[7];
    for (int i = 0; i < 7; i++) fake_default(&bc[i].f);
    bc[0].f.corrupt_crc = 1, bc[0].want = PS_ECORRUPT, bc[0].what = "bad payload checksum";
    bc[1].f.n_claimed = 11, bc[1].want = PS_EMISMATCH, bc[1].what = "neighbour with another n";
    bc[2].f.magic = 0xdeadbeefu, bc[2].want = PS_EPROTO, bc[2].what = "bad magic";
    bc[3].f.op = 7, bc[3].want = PS_EPROTO, bc[3].what = "message of another call";
    bc[4].f.hello_seg = 4096, bc[4].want = PS_EMISMATCH, bc[4].what = "neighbour with another segment size";
    bc[5].f.hello_rank = 0, bc[5].want = PS_EMISMATCH, bc[5].what = "hello from the wrong rank";
    bc[6].f.cut = 1, bc[6].want = PS_EIO, bc[6].what = "connection closed inside a message";
    for (int i = 0; i < 7; i++) {
        int rc = fake_left(&bc[i].f, d);
        is_int(rc, bc[i].want, "%s -> %s (%s)", bc[i].what, ps_errname(bc[i].want), ps_errname(rc));
    }
    /* the control: the same hand-made messages, complete and correct, make
     * a whole allreduce -- so the failures above are the planted faults;
     * and a stranger's connection before them is dropped without harm */
    fake_default(&f);
    f.finish = 1;
    f.stranger = 1;
    float x[10] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
    int rc = fake_left(&f, x);
    is_int(rc, 0, "well-formed messages after a stranger's connection: the call completes (%s)",
           ps_errname(rc));
    int good = 1;
    for (int i = 0; i < 5; i++) good &= x[i] == -(float)(i + 1) && x[5 + i] == 60 + 10 * i + (float)(i + 1);
    ok(good, "rank 0 holds its sums [5,10) and the all-gathered chunk [0,5)");
    /* the same bytes 3 at a time: hello, headers, floats and trailers all
     * arrive split, so every partial-read path runs */
    fake_default(&f);
    f.finish = 1;
    f.dribble = 1;
    float y[10] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
    rc = fake_left(&f, y);
    is_int(rc, 0, "the same messages 3 bytes at a time: the call completes (%s)", ps_errname(rc));
    ok(!memcmp(x, y, sizeof x), "and gives the same bits");
}

static void test_args(void)
{
    const char *ep[2] = {"tcp://127.0.0.1:1", NULL};
    ps_ring_t *r = (ps_ring_t *)1;
    is_int(ps_ring_new(&r, 2, 2, ep, NULL), PS_EINVAL, "rank >= world rejected");
    ok(r == NULL, "no ring on error");
    is_int(ps_ring_new(&r, 0, 2, ep, NULL), PS_EINVAL, "missing endpoint rejected");
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.nconn = 0;
    is_int(ps_ring_new(&r, 0, 1, ep, &o), PS_EINVAL, "nconn 0 rejected");
    is_int(ps_ring_new(&r, 0, 1, ep, NULL), 0, "world of one needs no sockets");
    float x[3] = {1, 2, 3};
    is_int(ps_ring_allreduce(r, x, 3, PS_DT_FP32), 0, "world of one: allreduce is the identity");
    ok(x[0] == 1 && x[2] == 3, "world of one leaves data unchanged");
    is_int(ps_ring_allreduce(r, NULL, 3, PS_DT_FP32), PS_EINVAL, "NULL data rejected");
    is_int(ps_ring_allreduce(r, x, 3, (ps_dtype_t)9), PS_EINVAL, "unknown dtype rejected");
    ps_ring_destroy(&r);
    ok(r == NULL, "destroy NULLs the pointer");

    /* endpoints: malformed ones and a port in use are refused by name */
    char eps[2][64];
    free_endpoints(eps, 2);
    const char *bad[][2] = {{"tcp//127.0.0.1:5000", eps[1]}, {eps[0], "tcp://127.0.0.1:0"},
                            {eps[0], "tcp://127.0.0.1:65536"}, {eps[0], "tcp://*:5000"},
                            {eps[0], "udp://127.0.0.1:5000"}, {eps[0], "tcp://[::1:5000"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        is_int(ps_ring_new(&r, 0, 2, bad[i], NULL), PS_EINVAL, "endpoints %s, %s rejected", bad[i][0],
               bad[i][1]);
    int busy = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    sa.sin_port = htons((uint16_t)atoi(strrchr(eps[0], ':') + 1));
    if (bind(busy, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(busy, 1) == 0) {
        const char *ep2[2] = {eps[0], eps[1]};
        is_int(ps_ring_new(&r, 0, 2, ep2, NULL), PS_EIO, "a port in use: PS_EIO (bind fails)");
    } else {
        ok(1, "# SKIP cannot hold a loopback port");
    }
    close(busy);
}

/* A ring of two ranks on the given endpoints sums n integer-valued floats. */
static void two_ranks(const char *e0, const char *e1, size_t n, uint64_t seed, const char *what)
{
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = 20000;
    rcase_t k;
    fill_case(&k, 2, n, PS_DT_FP32, 1, seed);
    rank_arg_t args[2];
    pthread_t th[2];
    for (int rk = 0; rk < 2; rk++) {
        args[rk] = (rank_arg_t){.rank = rk, .world = 2, .opts = o, .cases = &k, .ncases = 1};
        args[rk].eps[0] = e0;
        args[rk].eps[1] = e1;
        pthread_create(&th[rk], NULL, rank_main, &args[rk]);
    }
    for (int rk = 0; rk < 2; rk++) pthread_join(th[rk], NULL);
    check_case(&k, 2, what);
    free_case(&k, 2);
}

/* The same ring over IPv6 loopback ([::1] endpoints), where the host has it. */
static void test_ipv6(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    socklen_t l = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &l)) {
        if (fd >= 0) close(fd);
        for (int i = 0; i < 3; i++) ok(1, "# SKIP no IPv6 loopback here");
        return;
    }
    int fd2 = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 sb = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    l = sizeof sb;
    if (fd2 < 0 || bind(fd2, (struct sockaddr *)&sb, sizeof sb) || getsockname(fd2, (struct sockaddr *)&sb, &l)) {
        close(fd);
        if (fd2 >= 0) close(fd2);
        for (int i = 0; i < 3; i++) ok(1, "# SKIP no second IPv6 loopback port");
        return;
    }
    char e0[64], e1[64];
    snprintf(e0, sizeof e0, "tcp://[::1]:%d", ntohs(sa.sin6_port));
    snprintf(e1, sizeof e1, "tcp://[::1]:%d", ntohs(sb.sin6_port));
    close(fd);
    close(fd2);
    two_ranks(e0, e1, 3001, 77, "IPv6 [::1]");
}

/* The well-formed stream of test_bad_messages with one random fault --
 * a flipped bit anywhere (hello, headers, payloads, trailers) or a cut at
 * any byte -- 200 times: the call never crashes or hangs, and it either
 * fails with a clean error or (a bit in a field the ring ignores) returns
 * exactly the right sums.  Run under ASan + UBSan in CI. */
static void test_stream_faults(void)
{
    const float want[10] = {-1, -2, -3, -4, -5, 61, 72, 83, 94, 105};
    uint64_t seed = 12345;
    int bad = 0, nok = 0, nerr = 0, slow = 0;
    diag("200 faulty streams: ring errors and warnings expected below");
    for (int i = 0; i < 200; i++) {
        fake_t f;
        fake_default(&f);
        f.finish = 1;
        f.mutate = rng_next(&seed) % 10 < 7 ? 1 : 2;
        f.mpos = (size_t)rng_next(&seed);
        f.mxor = (uint8_t)(1u << (rng_next(&seed) % 8));
        float x[10] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
        double t0 = now_s();
        int rc = fake_left(&f, x);
        if (now_s() - t0 > 2.0) slow++;
        if (rc == 0) {
            nok++;
            if (memcmp(x, want, sizeof want)) bad++;
        } else if (rc == PS_ECORRUPT || rc == PS_EPROTO || rc == PS_EMISMATCH || rc == PS_EIO ||
                   rc == PS_ETIMEOUT || rc == PS_EVERSION) {
            nerr++;
        } else {
            diag("case %d (mutate %d at %zu): unexpected %s", i, f.mutate, f.mpos, ps_errname(rc));
            bad++;
        }
    }
    ok(bad == 0, "200 faulty streams: %d clean errors, %d correct results, %d wrong", nerr, nok, bad);
    ok(nerr > 150, "most faults are caught (%d of 200)", nerr);
    ok(slow == 0, "each returns promptly (150 ms timeout; %d took over 2 s)", slow);
}

/* Endpoints by host name ("localhost"): the rank that binds and the one
 * that connects must resolve it to the same address family. */
static void test_hostname(void)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo("localhost", "1", &hints, &res) || !res) {
        for (int i = 0; i < 3; i++) ok(1, "# SKIP localhost does not resolve here");
        return;
    }
    freeaddrinfo(res);
    char eps[2][64], e0[64], e1[64];
    free_endpoints(eps, 2);
    snprintf(e0, sizeof e0, "tcp://localhost:%s", strrchr(eps[0], ':') + 1);
    snprintf(e1, sizeof e1, "tcp://localhost:%s", strrchr(eps[1], ':') + 1);
    two_ranks(e0, e1, 1001, 78, "tcp://localhost endpoints");
}

/* ---- PS mode vs ring mode: the same SGD, 20 steps ----------------------- */

#define SGD_W 3
#define SGD_STEPS 20
static const ps_tensor_spec_t sgd_specs[] = {
    {"conv1.weight", 3 * 16 * 3 * 3 * 8, 0}, {"bn1.weight", 16, 1}, {"bn1.bias", 16, 1},
    {"layer1.0.conv1.weight", 16 * 16 * 9, 0}, {"fc.weight", 16 * 101, 2}, {"fc.bias", 101, 3},
};

typedef struct sgd_ctx {
    ps_partition_table_t t;
    ps_optim_config_t c;
    const char *eps[SGD_W];
    ps_ring_opts_t o;
} sgd_ctx_t;

/* The gradient rank r computes at a step: pulls w towards a rank-specific
 * target plus noise, so the weights feed back into the gradients and any
 * divergence between the two modes would compound over the steps. */
static void sgd_grad(float *g, const float *w, size_t n, int rank, int step)
{
    uint64_t s = 1234567u + (uint64_t)rank * 1000003u + (uint64_t)step * 7919u, t = 42u + rank;
    for (size_t i = 0; i < n; i++) g[i] = (w[i] - 0.5f * urand(&t)) + 0.1f * urand(&s);
}

static void sgd_init(float *w, size_t n)
{
    uint64_t s = 99;
    for (size_t i = 0; i < n; i++) w[i] = urand(&s);
}

static int sgd_apply(const sgd_ctx_t *x, float *w, float *mom, const float *g, int step)
{
    for (uint32_t p = 0; p < x->t.nparts; p++) {
        size_t off = x->t.parts[p].offset;
        int rc = ps_optim_apply_partition(&x->c, &x->t, p, w + off, mom + off, g + off, (uint64_t)step);
        if (rc) return rc;
    }
    return 0;
}

typedef struct sgd_rank {
    sgd_ctx_t *x;
    int rank, rc;
    float *w;
} sgd_rank_t;

static void *sgd_rank_main(void *p)
{
    sgd_rank_t *a = p;
    size_t n = a->x->t.total_numel;
    float *mom = calloc(n, sizeof *mom), *g = malloc(n * sizeof *g);
    ps_ring_t *r = NULL;
    a->rc = ps_ring_new(&r, a->rank, SGD_W, a->x->eps, &a->x->o);
    sgd_init(a->w, n);
    for (int step = 0; step < SGD_STEPS && !a->rc; step++) {
        sgd_grad(g, a->w, n, a->rank, step);
        if (!(a->rc = ps_ring_allreduce_mean(r, g, n, PS_DT_FP32)))
            a->rc = sgd_apply(a->x, a->w, mom, g, step);
    }
    ps_ring_destroy(&r);
    free(mom);
    free(g);
    return NULL;
}

static void test_ring_vs_ps_sgd(void)
{
    sgd_ctx_t x;
    int rc = ps_partition_table_build(&x.t, sgd_specs, sizeof sgd_specs / sizeof *sgd_specs, 4096, 2);
    if (!ok(rc == 0, "partition table for the SGD comparison")) return;
    ps_optim_config_default(&x.c);
    x.c.lr = 0.05f;
    x.c.momentum = 0.9f;
    x.c.nesterov = 1;
    x.c.weight_decay = 1e-4f;
    x.c.sched = PS_SCHED_COSINE;
    x.c.warmup_steps = 3;
    x.c.warmup_factor = 0.1f;
    x.c.total_steps = SGD_STEPS;
    x.c.groups[1] = (ps_param_group_t){2.f, 0.f};
    x.c.groups[2] = (ps_param_group_t){5.f, 1.f};
    x.c.groups[3] = (ps_param_group_t){10.f, 0.f};
    x.c.ngroups = 4;
    char err[256];
    ok(ps_optim_config_validate(&x.c, err, sizeof err) == 0, "optimizer config valid (%s)", err);
    ps_ring_opts_default(&x.o);
    x.o.segment_bytes = 8192;
    char eps[SGD_W][64];
    free_endpoints(eps, SGD_W);
    for (int i = 0; i < SGD_W; i++) x.eps[i] = eps[i];
    size_t n = x.t.total_numel;

    /* ring mode: every rank owns its weights */
    sgd_rank_t a[SGD_W];
    pthread_t th[SGD_W];
    for (int r = 0; r < SGD_W; r++) {
        a[r] = (sgd_rank_t){.x = &x, .rank = r, .w = malloc(n * sizeof(float))};
        pthread_create(&th[r], NULL, sgd_rank_main, &a[r]);
    }
    for (int r = 0; r < SGD_W; r++) pthread_join(th[r], NULL);

    /* PS mode as psd does it: sum in rank order, divide by W, same optimizer */
    float *w = malloc(n * sizeof *w), *mom = calloc(n, sizeof *mom), *g = malloc(n * sizeof *g),
          *gr = malloc(n * sizeof *gr), *w0 = malloc(n * sizeof *w0);
    sgd_init(w, n);
    memcpy(w0, w, n * sizeof *w);
    for (int step = 0; step < SGD_STEPS; step++) {
        for (int r = 0; r < SGD_W; r++) {
            sgd_grad(gr, w, n, r, step);
            for (size_t i = 0; i < n; i++) g[i] = r ? g[i] + gr[i] : gr[i];
        }
        for (size_t i = 0; i < n; i++) g[i] /= (float)SGD_W;
        sgd_apply(&x, w, mom, g, step);
    }
    double moved = 0;
    for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs(w[i] - w0[i]));
    ok(moved > 0.1, "SGD moved the weights (max |dw| = %.3f): the comparison means something", moved);
    int same = 1;
    for (int r = 0; r < SGD_W; r++) {
        is_int(a[r].rc, 0, "ring SGD rank %d ran %d steps (%s)", r, SGD_STEPS, ps_errname(a[r].rc));
        if (r) same &= !memcmp(a[r].w, a[0].w, n * sizeof(float));
    }
    ok(same, "ring mode: all %d ranks hold bit-identical weights", SGD_W);
    allclose(a[0].w, w, (long)n, 1e-6, 1e-5, "ring-mode weights == PS-mode weights after 20 steps");
    for (int r = 0; r < SGD_W; r++) free(a[r].w);
    free(w);
    free(mom);
    free(g);
    free(gr);
    free(w0);
    ps_partition_table_free(&x.t);
}

int main(void)
{
    ps_log_set_prog("test_ring");
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = 20000;
    o.segment_bytes = 4096; /* many segments per chunk: exercises the pipeline */
    test_args();
    test_ipv6();
    test_hostname();
    for (int W = 2; W <= 4; W++) test_sums(W, &o, "1 conn");
    o.nconn = 3; /* several connections: messages arrive out of order */
    test_sums(3, &o, "3 conns");
    test_sums(4, &o, "3 conns");
    o.nconn = 1;
    o.window = 1; /* tightest flow control must not deadlock */
    test_sums(4, &o, "window 1");
    o.window = 0; /* no flow control */
    o.segment_bytes = 1u << 20;
    test_sums(2, &o, "1 MiB segments, no window");
    test_missing_rank();
    test_dead_rank();
    test_bad_messages();
    test_stream_faults();
    test_ring_vs_ps_sgd();
    return tap_done();
}
