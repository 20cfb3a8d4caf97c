/* Ring allreduce (worker/ps_ring.c): W = 2, 3, 4 ranks as threads on
 * loopback.  References are independent of the ring: the double-precision
 * sum of the inputs (with the rounding bound each wire dtype allows), exact
 * sums of integer-valued inputs, bit equality across ranks, a missing rank,
 * hand-made bad messages (framing as documented in ps_ring.h), and the
 * issue-7 property that SGD on ring-averaged gradients gives the same
 * weights as SGD on the psd-style rank-order average. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/ps_crc32c.h"
#include "common/ps_error.h"
#include "common/ps_log.h"
#include "common/ps_optim.h"
#include "common/ps_partition.h"
#include "tests/tap.h"
#include "worker/ps_ring.h"

#define MAXW 4
#define MAXCASES 16

/* Free loopback endpoints: bind to an ephemeral port, note it, close. */
static void free_endpoints(char eps[][64], int w)
{
    void *ctx = zmq_ctx_new(), *s[MAXW + 1];
    for (int i = 0; i < w; i++) {
        s[i] = zmq_socket(ctx, ZMQ_PULL);
        int zero = 0;
        zmq_setsockopt(s[i], ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_bind(s[i], "tcp://127.0.0.1:*")) {
            printf("Bail out! cannot bind a loopback port: %s\n", zmq_strerror(zmq_errno()));
            exit(1);
        }
        size_t len = 64;
        zmq_getsockopt(s[i], ZMQ_LAST_ENDPOINT, eps[i], &len);
    }
    for (int i = 0; i < w; i++) zmq_close(s[i]);
    zmq_ctx_term(ctx);
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
    is_int(cases[0].rc[0], PS_ETIMEOUT, "missing rank 2: rank 0 times out (%s)", ps_errname(cases[0].rc[0]));
    is_int(cases[0].rc[1], PS_ETIMEOUT, "missing rank 2: rank 1 times out (%s)", ps_errname(cases[0].rc[1]));
    is_int(cases[1].rc[0], PS_ESTATE, "the next call on a broken ring is refused");
    ok(dt < 5.0, "timeouts of 300 ms return promptly (%.2f s incl. linger)", dt);
    free_case(&cases[0], 3);
    free_case(&cases[1], 3);
}

/* All three ranks finish one allreduce, then rank 2 exits: the next call
 * on ranks 0 and 1 must time out, not hang. */
static void test_dead_rank(void)
{
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = 300;
    o.segment_bytes = 4096;
    rcase_t cases[2];
    fill_case(&cases[0], 3, 5000, PS_DT_FP32, 1, 11);
    fill_case(&cases[1], 3, 5000, PS_DT_FP32, 1, 12);
    char eps[3][64];
    free_endpoints(eps, 3);
    rank_arg_t args[3];
    pthread_t th[3];
    diag("two 'no progress' errors from ranks 0 and 1 expected below");
    for (int r = 0; r < 3; r++) {
        args[r] = (rank_arg_t){.rank = r, .world = 3, .opts = o, .cases = cases, .ncases = r == 2 ? 1 : 2};
        for (int i = 0; i < 3; i++) args[r].eps[i] = eps[i];
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    check_case(&cases[0], 3, "dead rank: the call before rank 2 exits");
    is_int(cases[1].rc[0], PS_ETIMEOUT, "rank 2 gone: rank 0 times out (%s)", ps_errname(cases[1].rc[0]));
    is_int(cases[1].rc[1], PS_ETIMEOUT, "rank 2 gone: rank 1 times out (%s)", ps_errname(cases[1].rc[1]));
    free_case(&cases[0], 3);
    free_case(&cases[1], 3);
}

/* A fake left neighbour (rank 1 of 2) sends rank 0 a hand-made message. */
static int fake_left(uint32_t magic, uint64_t n_claimed, int corrupt_crc, uint32_t op, int frames)
{
    char eps[2][64];
    free_endpoints(eps, 2);
    void *ctx = zmq_ctx_new(), *sink = zmq_socket(ctx, ZMQ_PULL), *push = zmq_socket(ctx, ZMQ_PUSH);
    int zero = 0;
    zmq_setsockopt(sink, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof zero);
    zmq_bind(sink, eps[1]); /* absorbs what rank 0 sends */
    const char *ep[2] = {eps[0], eps[1]};
    ps_ring_opts_t o;
    ps_ring_opts_default(&o);
    o.timeout_ms = 2000;
    ps_ring_t *r = NULL;
    int rc = ps_ring_new(&r, 0, 2, ep, &o);
    if (rc) return rc;
    zmq_connect(push, eps[0]);
    /* n = 10, W = 2: rank 0 first receives chunk 1 = elements [5, 10) */
    float vals[5] = {1, 2, 3, 4, 5};
    uint8_t msg[32 + sizeof vals];
    uint32_t crc = ps_crc32c(0, vals, sizeof vals) ^ (corrupt_crc ? 1u : 0u);
    uint32_t f32[] = {magic, 0x00010000u /* dtype 0, sender 1 */, op, 0};
    memcpy(msg, f32, 16); /* little-endian host, as the test machines are */
    memcpy(msg + 16, &n_claimed, 8);
    uint32_t cnt = 5;
    memcpy(msg + 24, &cnt, 4);
    memcpy(msg + 28, &crc, 4);
    memcpy(msg + 32, vals, sizeof vals);
    if (frames == 2) { /* [32-byte header][payload], as ps_ring.h documents */
        zmq_send(push, msg, 32, ZMQ_SNDMORE);
        zmq_send(push, msg + 32, sizeof vals, 0);
    } else {
        zmq_send(push, msg, sizeof msg, 0);
    }
    float data[10] = {0};
    rc = ps_ring_allreduce(r, data, 10, PS_DT_FP32);
    ps_ring_destroy(&r);
    zmq_close(sink);
    zmq_close(push);
    zmq_ctx_term(ctx);
    return rc;
}

static void test_bad_messages(void)
{
    diag("five ring errors expected below");
    int rc = fake_left(0x31525350u, 10, 1, 1, 2);
    is_int(rc, PS_ECORRUPT, "bad payload checksum -> PS_ECORRUPT (%s)", ps_errname(rc));
    rc = fake_left(0x31525350u, 11, 0, 1, 2);
    is_int(rc, PS_EMISMATCH, "neighbour with another n -> PS_EMISMATCH (%s)", ps_errname(rc));
    rc = fake_left(0xdeadbeefu, 10, 0, 1, 2);
    is_int(rc, PS_EPROTO, "bad magic -> PS_EPROTO (%s)", ps_errname(rc));
    rc = fake_left(0x31525350u, 10, 0, 1, 1);
    is_int(rc, PS_EPROTO, "header and payload in one frame -> PS_EPROTO (%s)", ps_errname(rc));
    rc = fake_left(0x31525350u, 10, 0, 7, 2);
    is_int(rc, PS_EPROTO, "message of another call -> PS_EPROTO (%s)", ps_errname(rc));
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
    test_ring_vs_ps_sgd();
    return tap_done();
}
