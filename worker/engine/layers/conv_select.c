/* The CPU conv2d and conv3d slots, and which provider row
 * (conv_provider.h) computes each layer shape.
 *
 * Selection: the first time a process meets a shape (with its thread count
 * and precision) in a direction, every row that supports it is timed on
 * that very call's operands -- one untimed call each (oneDNN generates its
 * kernel there), then ROUNDS timed calls each, alternating rows so a burst
 * of load elsewhere hits all of them -- and the fastest best time wins.  A
 * row must beat im2col + GEMM by MARGIN to replace it: the GEMM row is the
 * reference, and a near tie is not worth a different rounding.  The choice
 * is logged (info) with every row's time and kept for the rest of the
 * process, shared by every context, so two models of one process compute
 * the same shape the same way.  Two processes may choose differently on a
 * loaded machine; runs that must match bit for bit across processes pin
 * the rows with PS_CONV_KERNELS (conv_provider.h).
 *
 * The first step of a model is therefore slower (each new shape costs
 * about 1 + ROUNDS calls per candidate row and direction); at TSM-ResNet-50
 * on 2 cores that is a few seconds, logged as it happens. */
#include "conv_provider.h"
#include "cpu_layers.h"
#include "ps_error.h"
#include "ps_log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define ROUNDS 2     /* timed calls per row after the untimed one */
#define MARGIN 0.97  /* another row replaces GEMM below this fraction of its time */
const ps_conv_provider_t *const ps_conv_rows[] = {&ps_conv_gemm, &ps_conv_onednn, NULL};
/* the rows above; ps_conv_choice_t keeps a time per row */
#define NROWS ((int)(sizeof ps_conv_rows / sizeof *ps_conv_rows) - 1)
_Static_assert(sizeof ps_conv_rows / sizeof *ps_conv_rows - 1 <=
                   sizeof ((ps_conv_choice_t *)0)->ms / sizeof(double),
               "ps_conv_choice_t.ms has a slot per row");
const char *const ps_conv_dir_name[PS_CONV_NDIR] = {"fwd", "bwd-data", "bwd-weights"};

/* ---- shapes ---------------------------------------------------------------- */

void ps_conv_shape_2d(ps_conv_shape_t *s, const ps_conv2d_desc_t *d, int N, int H, int W,
                      int bias)
{
    memset(s, 0, sizeof *s); /* shapes are compared with memcmp */
    s->nsp = 2, s->N = N, s->C = d->C, s->K = d->K, s->groups = d->groups, s->bias = !!bias;
    s->in[0] = s->ker[0] = s->out[0] = s->stride[0] = s->dil[0] = 1;
    s->in[1] = H, s->in[2] = W, s->ker[1] = d->R, s->ker[2] = d->S;
    s->stride[1] = d->stride_h, s->stride[2] = d->stride_w;
    s->pad[1] = d->pad_h, s->pad[2] = d->pad_w, s->dil[1] = d->dil_h, s->dil[2] = d->dil_w;
    s->out[1] = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    s->out[2] = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
}

void ps_conv_shape_3d(ps_conv_shape_t *s, const ps_conv3d_desc_t *d, int N, int D, int H, int W,
                      int bias)
{
    memset(s, 0, sizeof *s);
    s->nsp = 3, s->N = N, s->C = d->C, s->K = d->K, s->groups = d->groups, s->bias = !!bias;
    const int in[3] = {D, H, W}, ker[3] = {d->KT, d->R, d->S};
    const int st[3] = {d->stride_t, d->stride_h, d->stride_w};
    const int pad[3] = {d->pad_t, d->pad_h, d->pad_w}, dil[3] = {d->dil_t, d->dil_h, d->dil_w};
    for (int i = 0; i < 3; i++) {
        s->in[i] = in[i], s->ker[i] = ker[i], s->stride[i] = st[i], s->pad[i] = pad[i];
        s->dil[i] = dil[i], s->out[i] = ps_conv_out(in[i], ker[i], st[i], pad[i], dil[i]);
    }
}

void ps_conv_shape_desc3d(const ps_conv_shape_t *s, ps_conv3d_desc_t *d)
{
    *d = (ps_conv3d_desc_t){.C = s->C, .K = s->K, .KT = s->ker[0], .R = s->ker[1],
                            .S = s->ker[2], .stride_t = s->stride[0], .stride_h = s->stride[1],
                            .stride_w = s->stride[2], .pad_t = s->pad[0], .pad_h = s->pad[1],
                            .pad_w = s->pad[2], .dil_t = s->dil[0], .dil_h = s->dil[1],
                            .dil_w = s->dil[2], .groups = s->groups};
}

void ps_conv_shape_desc2d(const ps_conv_shape_t *s, ps_conv2d_desc_t *d)
{
    *d = (ps_conv2d_desc_t){.C = s->C, .K = s->K, .R = s->ker[1], .S = s->ker[2],
                            .stride_h = s->stride[1], .stride_w = s->stride[2],
                            .pad_h = s->pad[1], .pad_w = s->pad[2], .dil_h = s->dil[1],
                            .dil_w = s->dil[2], .groups = s->groups};
}

const char *ps_conv_shape_str(const ps_conv_shape_t *s, char *buf, size_t len)
{
    const int a = s->nsp == 3 ? 0 : 1; /* first axis printed */
    char k[32] = "", st[32] = "", in[48] = "";
    for (int i = a, nk = 0, ns = 0, ni = 0; i < 3; i++) {
        nk += snprintf(k + nk, sizeof k - nk, "%s%d", i > a ? "x" : "", s->ker[i]);
        ns += snprintf(st + ns, sizeof st - ns, "%s%d", i > a ? "," : "", s->stride[i]);
        ni += snprintf(in + ni, sizeof in - ni, "%s%d", i > a ? "x" : "", s->in[i]);
    }
    snprintf(buf, len, "%d->%d %s/%s p%d,%d%s%s @%s N%d", s->C, s->K, k, st, s->pad[1],
             s->pad[2], s->groups > 1 ? " grouped" : "", s->dil[1] > 1 ? " dilated" : "", in,
             s->N);
    return buf;
}

/* ---- per-context state ----------------------------------------------------- */

ps_cpu_state_t *ps_cpu_state(ps_ctx_t *ctx)
{
    if (!ctx) return NULL;
    if (!ctx->cpu_state) {
        ps_cpu_state_t *st = calloc(1, sizeof *st);
        if (!st) {
            ps_error("cpu backend: out of memory for its context state");
            return NULL;
        }
        st->precision = PS_PRECISION_FP32;
        ctx->cpu_state = st;
    }
    return ctx->cpu_state;
}

float *ps_cpu_scratch(ps_ctx_t *ctx, size_t n)
{
    ps_cpu_state_t *st = ps_cpu_state(ctx);
    if (!st) return NULL;
    if (st->scratch_n < n) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, n * sizeof *p)) {
            ps_error("cpu backend: cannot allocate %zu floats of scratch", n);
            return NULL;
        }
        free(st->scratch);
        st->scratch = p, st->scratch_n = n;
    }
    return st->scratch;
}

void ps_cpu_state_free(ps_ctx_t *ctx)
{
    if (!ctx || !ctx->cpu_state) return;
    ps_cpu_state_t *st = ctx->cpu_state;
    ps_conv_onednn_free(st->onednn);
    free(st->scratch);
    free(st);
    ctx->cpu_state = NULL;
}

/* ---- the choices, process-wide --------------------------------------------- */

typedef struct choice {
    ps_conv_choice_t c;
    int threads;
    ps_precision_t prec;
    int row; /* index into ps_conv_rows */
} choice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static choice_t **choices; /* in the order made */
static int nchoices, capchoices;
static char mode[32];      /* "" = auto */
static int mode_read;      /* PS_CONV_KERNELS looked at */

static int row_index(const char *name)
{
    for (int i = 0; ps_conv_rows[i]; i++)
        if (!strcmp(ps_conv_rows[i]->name, name)) return i;
    return -1;
}

static void forget_all(void)
{
    for (int i = 0; i < nchoices; i++) free(choices[i]);
    free(choices);
    choices = NULL, nchoices = capchoices = 0;
}

static int set_mode_locked(const char *m)
{
    if (m && *m && strcmp(m, "auto") && row_index(m) < 0) {
        char known[96] = "auto";
        for (int i = 0; ps_conv_rows[i]; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), ", %s",
                     ps_conv_rows[i]->name);
        ps_error("conv kernels %s: unknown (known: %s)", m, known);
        return PS_EINVAL;
    }
    snprintf(mode, sizeof mode, "%s", m && strcmp(m, "auto") ? m : "");
    mode_read = 1;
    forget_all();
    return 0;
}

int ps_conv_set_kernels(const char *m)
{
    pthread_mutex_lock(&lock);
    int rc = set_mode_locked(m);
    pthread_mutex_unlock(&lock);
    return rc;
}

static void read_env_locked(void)
{
    if (mode_read) return;
    const char *e = getenv("PS_CONV_KERNELS");
    if (set_mode_locked(e) && e) {
        ps_warn("PS_CONV_KERNELS=%s ignored: choosing kernels by measurement", e);
        set_mode_locked(NULL);
    }
}

const char *ps_conv_get_kernels(void)
{
    pthread_mutex_lock(&lock);
    read_env_locked();
    pthread_mutex_unlock(&lock);
    return mode[0] ? mode : "auto";
}

static choice_t *find_locked(const ps_conv_shape_t *s, ps_conv_dir_t dir, int threads,
                             ps_precision_t prec)
{
    for (int i = 0; i < nchoices; i++) {
        choice_t *c = choices[i];
        if (c->c.dir == dir && c->threads == threads && c->prec == prec &&
            !memcmp(&c->c.shape, s, sizeof *s))
            return c;
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One call of direction dir through row r (operands as ps_conv_run's). */
static int call_row(const ps_conv_provider_t *r, ps_ctx_t *ctx, const ps_conv_shape_t *s,
                    ps_conv_dir_t dir, float *y, const float *a, const float *b,
                    const float *bias)
{
    switch (dir) {
    case PS_CONV_FWD: return r->forward(ctx, s, y, a, b, bias);
    case PS_CONV_BWD_DATA: return r->backward_data(ctx, s, y, a, b);
    default: return r->backward_weights(ctx, s, y, a, b);
    }
}

/* Time the candidate rows on this call's operands; fills c->row, c->c.ms,
 * c->c.measured.  A weight gradient is accumulated into a scratch copy
 * while timing; forward / data-gradient outputs are overwritten anyway. */
static void measure(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir, float *y,
                    const float *a, const float *b, const float *bias, choice_t *c)
{
    if (mode[0]) { /* forced: that row where it can (asked first: a row's
                    * supports() may build what the call needs) */
        const int f = row_index(mode);
        if (f >= 0 && ps_conv_rows[f]->supports(ctx, s, dir)) {
            c->row = f;
            return;
        }
    }
    int cand[NROWS], n = 0;
    for (int i = 0; ps_conv_rows[i] && i < NROWS; i++)
        if (ps_conv_rows[i]->supports(ctx, s, dir)) cand[n++] = i;
    c->row = n ? cand[0] : 0;
    ps_cpu_state_t *st = ps_cpu_state(ctx);
    if (!n && st && st->precision != PS_PRECISION_FP32) {
        char sh[128];
        ps_warn("conv %s %s: no %s kernel for this shape; it is computed in fp32",
                ps_conv_shape_str(s, sh, sizeof sh), ps_conv_dir_name[dir],
                ps_precision_name(st->precision));
    }
    if (mode[0] || n <= 1) return; /* forced elsewhere: the first row that can */
    float *scratch = NULL;
    if (dir == PS_CONV_BWD_WEIGHTS) {
        size_t nw = (size_t)s->K * (s->C / s->groups) * s->ker[0] * s->ker[1] * s->ker[2];
        scratch = calloc(nw, sizeof *scratch);
        if (!scratch) {
            ps_warn("conv: no memory to time the kernels; using im2col + GEMM");
            return;
        }
        y = scratch;
    }
    double best[NROWS];
    int failed[NROWS] = {0};
    for (int i = 0; i < NROWS; i++) best[i] = 1e30;
    for (int round = 0; round <= ROUNDS; round++)
        for (int j = 0; j < n; j++) {
            const int i = cand[round & 1 ? n - 1 - j : j]; /* alternate the order */
            if (failed[i]) continue;
            double t0 = now_s();
            if (call_row(ps_conv_rows[i], ctx, s, dir, y, a, b, bias)) {
                failed[i] = 1;
                continue;
            }
            double t = now_s() - t0;
            if (round > 0 && t < best[i]) best[i] = t;
        }
    free(scratch);
    int win = -1;
    for (int j = 0; j < n; j++) {
        const int i = cand[j];
        if (failed[i]) continue;
        c->c.ms[i] = best[i] * 1e3;
        if (win < 0 || best[i] < best[win] * (win == 0 ? MARGIN : 1.0)) win = i;
    }
    c->row = win < 0 ? 0 : win;
    c->c.measured = 1;
}

static void log_choice(const choice_t *c)
{
    char sh[128], times[160] = "", k[64];
    size_t used = 0;
    for (int i = 0; ps_conv_rows[i] && i < NROWS; i++)
        if (c->c.ms[i] > 0)
            used += (size_t)snprintf(times + used, sizeof times - used, "%s%s %.2f ms",
                                     used ? ", " : "", ps_conv_rows[i]->name, c->c.ms[i]);
    snprintf(k, sizeof k, "%s", c->c.kernel);
    if (c->c.measured)
        ps_info("conv %s %s: %s -> %s %s", ps_conv_shape_str(&c->c.shape, sh, sizeof sh),
                ps_conv_dir_name[c->c.dir], times, c->c.provider, k);
    else /* forced, or a single candidate: nothing was decided here */
        ps_debug("conv %s %s: %s %s (%s)", ps_conv_shape_str(&c->c.shape, sh, sizeof sh),
                 ps_conv_dir_name[c->c.dir], c->c.provider, k,
                 mode[0] ? "forced" : "the only candidate");
}

/* The row for (s, dir) at ctx's precision and this thread count, measured
 * on this call's operands when new.  Returns the row index. */
static int choose(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir, float *y,
                  const float *a, const float *b, const float *bias)
{
    ps_cpu_state_t *st = ps_cpu_state(ctx);
    const ps_precision_t prec = st ? st->precision : PS_PRECISION_FP32;
    const int threads = ps_cpu_team_threads();
    pthread_mutex_lock(&lock);
    read_env_locked();
    choice_t *c = find_locked(s, dir, threads, prec);
    if (!c) {
        static int told;
        if (!told++ && !mode[0])
            ps_info("conv: timing the CPU convolution kernels of each new layer shape "
                    "(once per shape and process)");
        c = calloc(1, sizeof *c);
        choice_t **grown = nchoices == capchoices
                               ? realloc(choices, (capchoices * 2 + 16) * sizeof *choices)
                               : choices;
        if (!c || !grown) {
            free(c);
            pthread_mutex_unlock(&lock);
            ps_warn("conv: out of memory for the kernel choices; using im2col + GEMM");
            return 0;
        }
        if (grown != choices) choices = grown, capchoices = capchoices * 2 + 16;
        c->c.shape = *s, c->c.dir = dir, c->threads = threads, c->prec = prec;
        measure(ctx, s, dir, y, a, b, bias, c);
        const ps_conv_provider_t *r = ps_conv_rows[c->row];
        c->c.provider = r->name;
        r->kernel(ctx, s, dir, c->c.kernel, sizeof c->c.kernel);
        choices[nchoices++] = c;
        log_choice(c);
    }
    c->c.calls++;
    const int row = c->row;
    pthread_mutex_unlock(&lock);
    return row;
}

/* A row failed at run time: GEMM from now on for this shape. */
static void demote(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir)
{
    ps_cpu_state_t *st = ps_cpu_state(ctx);
    pthread_mutex_lock(&lock);
    choice_t *c = find_locked(s, dir, ps_cpu_team_threads(), st ? st->precision : PS_PRECISION_FP32);
    if (c) {
        c->row = 0, c->c.provider = ps_conv_gemm.name;
        ps_conv_gemm.kernel(ctx, s, dir, c->c.kernel, sizeof c->c.kernel);
    }
    pthread_mutex_unlock(&lock);
}

int ps_conv_run(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir, float *y,
                const float *a, const float *b, const float *bias)
{
    const int row = choose(ctx, s, dir, y, a, b, bias);
    int rc = call_row(ps_conv_rows[row], ctx, s, dir, y, a, b, bias);
    if (rc && row != 0) {
        char sh[128];
        ps_warn("conv %s %s: %s failed (%s); im2col + GEMM from now on",
                ps_conv_shape_str(s, sh, sizeof sh), ps_conv_dir_name[dir],
                ps_conv_rows[row]->name, ps_strerror(rc));
        demote(ctx, s, dir);
        rc = call_row(&ps_conv_gemm, ctx, s, dir, y, a, b, bias);
    }
    return rc;
}

int ps_conv_run_backward(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp, float *dw,
                         const float *dout, const float *inp, const float *w)
{
    if (dinp && dw) {
        const int rd = choose(ctx, s, PS_CONV_BWD_DATA, dinp, dout, w, NULL);
        const int rw = choose(ctx, s, PS_CONV_BWD_WEIGHTS, dw, dout, inp, NULL);
        const ps_conv_provider_t *r = ps_conv_rows[rd];
        if (rd == rw && r->backward) {
            int rc = r->backward(ctx, s, dinp, dw, dout, inp, w);
            if (!rc || rd == 0) return rc;
        }
    }
    int rc = 0;
    if (dinp) rc = ps_conv_run(ctx, s, PS_CONV_BWD_DATA, dinp, dout, w, NULL);
    if (dw && !rc) rc = ps_conv_run(ctx, s, PS_CONV_BWD_WEIGHTS, dw, dout, inp, NULL);
    return rc;
}

/* ---- the slots --------------------------------------------------------------- */

void ps_cpu_conv2d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!ps_conv2d_valid(d, N, H, W)) return;
    ps_conv_shape_t s;
    ps_conv_shape_2d(&s, d, N, H, W, b != NULL);
    ps_conv_run(ctx, &s, PS_CONV_FWD, out, inp, w, b);
}

void ps_cpu_conv2d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv2d_desc_t *d, int N, int H, int W)
{
    if (!ps_conv2d_valid(d, N, H, W)) return;
    ps_conv_shape_t s;
    ps_conv_shape_2d(&s, d, N, H, W, 0);
    if (db) ps_cpu_conv_bias_grad(db, dout, N, d->K, (size_t)s.out[1] * s.out[2]);
    if (dinp || dw) ps_conv_run_backward(ctx, &s, dinp, dw, dout, inp, w);
}

void ps_cpu_conv3d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                           const float *b, const ps_conv3d_desc_t *d, int N, int D, int H,
                           int W)
{
    if (!ps_conv3d_check("conv3d", d, N, D, H, W)) return;
    ps_conv_shape_t s;
    ps_conv_shape_3d(&s, d, N, D, H, W, b != NULL);
    ps_conv_run(ctx, &s, PS_CONV_FWD, out, inp, w, b);
}

void ps_cpu_conv3d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w,
                            const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    if (!ps_conv3d_check("conv3d", d, N, D, H, W)) return;
    ps_conv_shape_t s;
    ps_conv_shape_3d(&s, d, N, D, H, W, 0);
    if (db) ps_cpu_conv_bias_grad(db, dout, N, d->K, (size_t)s.out[0] * s.out[1] * s.out[2]);
    if (dinp || dw) ps_conv_run_backward(ctx, &s, dinp, dw, dout, inp, w);
}

/* ---- what ran ------------------------------------------------------------------ */

int ps_conv_choices(ps_conv_choice_t *out, int max)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nchoices && i < max; i++) out[i] = choices[i]->c;
    const int n = nchoices;
    pthread_mutex_unlock(&lock);
    return n;
}

const char *ps_conv_summary(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&lock);
    for (int dir = 0; dir < PS_CONV_NDIR; dir++) {
        /* calls per distinct provider:kernel, in order of first appearance */
        char seen[16][80];
        long calls[16];
        int ns = 0;
        for (int i = 0; i < nchoices; i++) {
            const ps_conv_choice_t *c = &choices[i]->c;
            if ((int)c->dir != dir) continue;
            char k[80];
            snprintf(k, sizeof k, "%s:%s", c->provider, c->kernel);
            int j = 0;
            while (j < ns && strcmp(seen[j], k)) j++;
            if (j == ns && ns < 16) snprintf(seen[ns], sizeof seen[ns], "%s", k), calls[ns++] = 0;
            if (j < ns) calls[j] += c->calls;
        }
        if (!ns) continue;
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s", used ? "; " : "",
                                 ps_conv_dir_name[dir]);
        for (int j = 0; j < ns; j++)
            used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s %s %ld",
                                     j ? "," : "", seen[j], calls[j]);
    }
    pthread_mutex_unlock(&lock);
    if (!buf[0]) snprintf(buf, len, "no convolution yet");
    return buf;
}

/* ---- the public face (ps_engine.h) ----------------------------------------------- */

int ps_engine_set_conv_kernels(const char *mode)
{
    return ps_conv_set_kernels(mode);
}

const char *ps_engine_conv_kernels(char *buf, size_t len)
{
    return ps_conv_summary(buf, len);
}
