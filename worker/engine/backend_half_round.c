/* The CPU rounding backend (backend_half_round.h says what is rounded and
 * why).  Each entry mirrors the matching function of worker/engine/cuda/
 * (conv2d.cu, linear.cu, batchnorm.cu, layers.cu, pool.cu): same tag rules
 * (an output takes its input's storage; conv2d always writes half; linear's
 * output and xent are fp32), same rounding points. */
#include "worker/engine/backend_half_round.h"
#include "layers/cpu_layers.h"
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct hround {
    ps_precision_t prec;
    float loss_scale;
    const void **key; /* pointers tagged; val 1 half, 0 fp32 */
    unsigned char *val;
    size_t n, cap;
    long mismatches, rounded;
} hround_t;

static const ps_backend_t *const cpu = &ps_backend_cpu;

static hround_t *st(ps_ctx_t *ctx)
{
    hround_t *h = ctx ? (hround_t *)ctx->backend_state : NULL;
    if (!h) {
        ps_error("rounding backend used without ps_hround_init()");
        abort(); /* a broken caller (no ps_hround_init), not an input error */
    }
    return h;
}

float ps_hround_value(ps_precision_t prec, float x)
{
    if (prec == PS_PRECISION_FP16) return ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(x));
    if (prec == PS_PRECISION_BF16) return ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(x));
    return x;
}

static int valid_prec(ps_precision_t prec)
{
    return prec == PS_PRECISION_FP32 || prec == PS_PRECISION_FP16 || prec == PS_PRECISION_BF16;
}

int ps_hround_init(ps_ctx_t *ctx, ps_precision_t prec, float loss_scale)
{
    if (!ctx || !valid_prec(prec) || !(loss_scale > 0)) return PS_EINVAL;
    if (ctx->backend_state) {
        ps_error("ps_hround_init: the context has a backend state already");
        return PS_ESTATE;
    }
    hround_t *h = calloc(1, sizeof *h);
    if (!h) return PS_ENOMEM;
    h->prec = prec;
    h->loss_scale = loss_scale;
    ctx->backend_state = h;
    return 0;
}

void ps_hround_free(ps_ctx_t *ctx)
{
    if (!ctx || !ctx->backend_state) return;
    hround_t *h = ctx->backend_state;
    free(h->key);
    free(h->val);
    free(h);
    ctx->backend_state = NULL;
}

void ps_hround_forget(ps_ctx_t *ctx)
{
    st(ctx)->n = 0;
}

/* A model has a few hundred tensors: a linear scan is plenty for a test. */
static long find(const hround_t *h, const void *p)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->key[i] == p) return (long)i;
    return -1;
}

static int is_half(const hround_t *h, const void *p)
{
    const long i = p ? find(h, p) : -1;
    return i >= 0 ? h->val[i] : 0;
}

int ps_hround_is_half(ps_ctx_t *ctx, const void *p)
{
    return is_half(st(ctx), p);
}

long ps_hround_mismatches(ps_ctx_t *ctx)
{
    return st(ctx)->mismatches;
}

long ps_hround_rounded(ps_ctx_t *ctx)
{
    return st(ctx)->rounded;
}

static void mark(hround_t *h, const void *p, int half)
{
    if (!p) return;
    const long i = find(h, p);
    if (i >= 0) {
        h->val[i] = (unsigned char)half;
        return;
    }
    if (h->n == h->cap) {
        const size_t nc = h->cap ? 2 * h->cap : 256;
        const void **k = realloc(h->key, nc * sizeof *k);
        if (k) h->key = k;
        unsigned char *v = k ? realloc(h->val, nc) : NULL;
        if (!k || !v) {
            ps_error("rounding backend: out of memory for %zu tags", nc);
            abort();
        }
        h->val = v;
        h->cap = nc;
    }
    h->key[h->n] = p;
    h->val[h->n++] = (unsigned char)half;
}

static void round_inplace(hround_t *h, float *x, size_t n)
{
    if (!x) return;
    for (size_t i = 0; i < n; i++) x[i] = ps_hround_value(h->prec, x[i]);
    h->rounded += (long)n;
}

/* A rounded copy of src (what a half staging buffer holds); free() it. */
static float *round_copy(hround_t *h, const float *src, size_t n)
{
    float *d = malloc((n ? n : 1) * sizeof *d);
    if (!d) {
        ps_error("rounding backend: out of memory for %zu floats", n);
        abort();
    }
    memcpy(d, src, n * sizeof *d);
    round_inplace(h, d, n);
    return d;
}

/* The storage of a layer's output from its inputs' (CUDA's h_same). */
static int same(hround_t *h, const char *what, const void *a, const void *b)
{
    const int ha = is_half(h, a), hb = b ? is_half(h, b) : ha;
    if (ha != hb) {
        ps_warn("rounding backend: %s got operands of different storage", what);
        h->mismatches++;
    }
    return ha;
}

static size_t wnumel(const ps_conv2d_desc_t *d)
{
    return (size_t)d->K * (d->C / d->groups) * d->R * d->S;
}

static void r_conv_fwd(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                       const float *b, const ps_conv2d_desc_t *d, int N, int H, int W)
{
    hround_t *h = st(ctx);
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    const size_t nin = (size_t)N * d->C * H * W, nout = (size_t)N * d->K * P * Q;
    float *x = is_half(h, inp) ? NULL : round_copy(h, inp, nin); /* fp32 input: cast */
    float *wr = round_copy(h, w, wnumel(d));
    cpu->conv2d_forward(ctx, out, x ? x : inp, wr, NULL, d, N, H, W);
    round_inplace(h, out, nout); /* cuDNN writes y half */
    mark(h, out, 1);
    if (b) { /* k_h_bias_add: st(ld(out) + b) */
        const size_t PQ = (size_t)P * Q;
        for (size_t i = 0; i < nout; i++) out[i] += b[(i / PQ) % d->K];
        round_inplace(h, out, nout);
    }
    free(x);
    free(wr);
}

static void r_conv_bwd(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, const ps_conv2d_desc_t *d, int N,
                       int H, int W)
{
    hround_t *h = st(ctx);
    const int P = ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h);
    const int Q = ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
    const size_t nin = (size_t)N * d->C * H * W, nout = (size_t)N * d->K * P * Q;
    const size_t nw = wnumel(d);
    const int hin = is_half(h, inp);
    float *dy = is_half(h, dout) ? NULL : round_copy(h, dout, nout);
    float *x = hin ? NULL : round_copy(h, inp, nin);
    float *wr = round_copy(h, w, nw);
    float *tdw = dw ? calloc(nw, sizeof *tdw) : NULL; /* cuDNN: beta 0 into half dwh */
    if (dw && !tdw) abort();
    cpu->conv2d_backward(ctx, dinp, tdw, NULL, dy ? dy : dout, x ? x : inp, wr, d, N, H, W);
    if (dw) {
        round_inplace(h, tdw, nw);
        for (size_t i = 0; i < nw; i++) dw[i] += tdw[i]; /* from_half(acc = 1) */
    }
    if (dinp) { /* written half (into the X staging buffer when inp is fp32) */
        round_inplace(h, dinp, nin);
        mark(h, dinp, hin);
    }
    /* the bias gradient reads dout as stored (fp32 or half) */
    if (db) cpu->conv2d_backward(ctx, NULL, NULL, db, dout, inp, w, d, N, H, W);
    free(dy);
    free(x);
    free(wr);
    free(tdw);
}

/* conv3d (cuda/conv3d.cu): half operands (input, weights, output gradient
 * cast per call), fp32 accumulation, results widened back into the fp32
 * NCDHW tensors: the outputs carry one half rounding but stay fp32
 * storage, so the 3-D models' other layers run in fp32 as on CUDA. */
static size_t wnumel3(const ps_conv3d_desc_t *d)
{
    return (size_t)d->K * (d->C / d->groups) * d->KT * d->R * d->S;
}

static size_t out3(const ps_conv3d_desc_t *d, int D, int H, int W)
{
    return (size_t)ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t) *
           ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
           ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
}

static void r_conv3d_fwd(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                         const float *b, const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    hround_t *h = st(ctx);
    const size_t nout = (size_t)N * d->K * out3(d, D, H, W);
    float *x = round_copy(h, inp, (size_t)N * d->C * D * H * W);
    float *wr = round_copy(h, w, wnumel3(d));
    cpu->conv3d_forward(ctx, out, x, wr, NULL, d, N, D, H, W);
    round_inplace(h, out, nout);
    mark(h, out, 0);
    if (b) { /* the bias is added to the widened fp32 output */
        const size_t OPQ = out3(d, D, H, W);
        for (size_t i = 0; i < nout; i++) out[i] += b[(i / OPQ) % d->K];
    }
    free(x);
    free(wr);
}

static void r_conv3d_bwd(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const ps_conv3d_desc_t *d, int N,
                         int D, int H, int W)
{
    hround_t *h = st(ctx);
    const size_t nin = (size_t)N * d->C * D * H * W, nout = (size_t)N * d->K * out3(d, D, H, W);
    const size_t nw = wnumel3(d);
    float *dy = round_copy(h, dout, nout), *x = round_copy(h, inp, nin), *wr = round_copy(h, w, nw);
    float *tdw = dw ? calloc(nw, sizeof *tdw) : NULL; /* written half, then added in fp32 */
    if (dw && !tdw) abort();
    cpu->conv3d_backward(ctx, dinp, tdw, NULL, dy, x, wr, d, N, D, H, W);
    if (dw) {
        round_inplace(h, tdw, nw);
        for (size_t i = 0; i < nw; i++) dw[i] += tdw[i];
    }
    if (dinp) {
        round_inplace(h, dinp, nin);
        mark(h, dinp, 0);
    }
    if (db) cpu->conv3d_backward(ctx, NULL, NULL, db, dout, inp, w, d, N, D, H, W);
    free(dy);
    free(x);
    free(wr);
    free(tdw);
}

static void r_linear_fwd(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                         const float *b, int N, int C, int K)
{
    hround_t *h = st(ctx);
    float *x = is_half(h, inp) ? NULL : round_copy(h, inp, (size_t)N * C);
    float *wr = round_copy(h, w, (size_t)K * C);
    cpu->linear_forward(ctx, out, x ? x : inp, wr, b, N, C, K); /* fp32 logits */
    mark(h, out, 0);
    free(x);
    free(wr);
}

static void r_linear_bwd(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int K)
{
    hround_t *h = st(ctx);
    if (is_half(h, dout)) {
        ps_warn("rounding backend: linear_backward got a half dout");
        h->mismatches++;
    }
    const int hin = is_half(h, inp);
    float *dy = round_copy(h, dout, (size_t)N * K);
    float *x = hin ? NULL : round_copy(h, inp, (size_t)N * C);
    float *wr = round_copy(h, w, (size_t)K * C);
    cpu->linear_backward(ctx, dinp, dw, NULL, dy, x ? x : inp, wr, N, C, K);
    if (dinp) {
        if (hin) round_inplace(h, dinp, (size_t)N * C);
        mark(h, dinp, hin);
    }
    if (db) cpu->linear_backward(ctx, NULL, NULL, db, dout, inp, w, N, C, K); /* fp32 dout */
    free(dy);
    free(x);
    free(wr);
}

static void r_bn_fwd_train(ps_ctx_t *ctx, float *out, float *save_mean, float *save_rstd,
                           float *run_mean, float *run_var, const float *inp,
                           const float *gamma, const float *beta, float eps, float momentum,
                           int N, int C, int HW)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->bn_forward_train(ctx, out, save_mean, save_rstd, run_mean, run_var, inp, gamma, beta,
                          eps, momentum, N, C, HW);
    if (hh) round_inplace(h, out, (size_t)N * C * HW);
    mark(h, out, hh);
}

static void r_bn_bwd_train(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                           const float *dout, const float *inp, const float *gamma,
                           const float *save_mean, const float *save_rstd, int N, int C, int HW)
{
    hround_t *h = st(ctx);
    const int hh = same(h, "bn_backward_train", inp, dout);
    cpu->bn_backward_train(ctx, dinp, dgamma, dbeta, dout, inp, gamma, save_mean, save_rstd, N,
                           C, HW);
    if (hh) round_inplace(h, dinp, (size_t)N * C * HW);
    mark(h, dinp, hh);
}

static void r_bn_fwd_saved(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                           const float *beta, const float *save_mean, const float *save_rstd,
                           int N, int C, int HW)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->bn_forward_saved(ctx, out, inp, gamma, beta, save_mean, save_rstd, N, C, HW);
    if (hh) round_inplace(h, out, (size_t)N * C * HW);
    mark(h, out, hh);
}

static void r_bn_fwd_eval(ps_ctx_t *ctx, float *out, const float *inp, const float *gamma,
                          const float *beta, const float *run_mean, const float *run_var,
                          float eps, int N, int C, int HW)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->bn_forward_eval(ctx, out, inp, gamma, beta, run_mean, run_var, eps, N, C, HW);
    if (hh) round_inplace(h, out, (size_t)N * C * HW);
    mark(h, out, hh);
}

static void r_bn_bwd_eval(ps_ctx_t *ctx, float *dinp, float *dgamma, float *dbeta,
                          const float *dout, const float *inp, const float *gamma,
                          const float *run_mean, const float *run_var, float eps, int N, int C,
                          int HW)
{
    hround_t *h = st(ctx);
    const int hh = same(h, "bn_backward_eval", inp, dout);
    cpu->bn_backward_eval(ctx, dinp, dgamma, dbeta, dout, inp, gamma, run_mean, run_var, eps, N,
                          C, HW);
    if (hh) round_inplace(h, dinp, (size_t)N * C * HW);
    mark(h, dinp, hh);
}

static void r_relu_fwd(ps_ctx_t *ctx, float *out, const float *inp, size_t n)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->relu_forward(ctx, out, inp, n);
    if (hh) round_inplace(h, out, n);
    mark(h, out, hh);
}

static void r_relu_bwd(ps_ctx_t *ctx, float *dinp, const float *dout, const float *out,
                       size_t n)
{
    hround_t *h = st(ctx);
    if (!dinp) return;
    const int hh = same(h, "relu_backward", dout, out);
    cpu->relu_backward(ctx, dinp, dout, out, n);
    if (hh) round_inplace(h, dinp, n);
    mark(h, dinp, hh);
}

static void r_maxpool_fwd(ps_ctx_t *ctx, float *out, int32_t *argmax, const float *inp,
                          const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->maxpool_forward(ctx, out, argmax, inp, d, N, C, H, W);
    const size_t n = (size_t)N * C * ps_conv_out(H, d->R, d->stride_h, d->pad_h, 1) *
                     ps_conv_out(W, d->S, d->stride_w, d->pad_w, 1);
    if (hh) round_inplace(h, out, n);
    mark(h, out, hh);
}

static void r_maxpool_bwd(ps_ctx_t *ctx, float *dinp, const float *dout, const int32_t *argmax,
                          const ps_pool_desc_t *d, int N, int C, int H, int W)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, dout);
    cpu->maxpool_backward(ctx, dinp, dout, argmax, d, N, C, H, W);
    if (hh) round_inplace(h, dinp, (size_t)N * C * H * W); /* gathered in fp32, stored once */
    mark(h, dinp, hh);
}

static void r_avgpool_fwd(ps_ctx_t *ctx, float *out, const float *inp, int N, int C, int HW)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->avgpool_forward(ctx, out, inp, N, C, HW);
    if (hh) round_inplace(h, out, (size_t)N * C);
    mark(h, out, hh);
}

static void r_avgpool_bwd(ps_ctx_t *ctx, float *dinp, const float *dout, int N, int C, int HW)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, dout);
    cpu->avgpool_backward(ctx, dinp, dout, N, C, HW);
    if (hh) round_inplace(h, dinp, (size_t)N * C * HW);
    mark(h, dinp, hh);
}

static void r_dropout_fwd(ps_ctx_t *ctx, float *out, uint8_t *mask, const float *inp, size_t n,
                          float p, uint64_t seed)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->dropout_forward(ctx, out, mask, inp, n, p, seed);
    if (hh) round_inplace(h, out, n);
    mark(h, out, hh);
}

static void r_dropout_bwd(ps_ctx_t *ctx, float *dinp, const float *dout, const uint8_t *mask,
                          size_t n, float p)
{
    hround_t *h = st(ctx);
    if (!dinp) return;
    const int hh = is_half(h, dout);
    cpu->dropout_backward(ctx, dinp, dout, mask, n, p);
    if (hh) round_inplace(h, dinp, n);
    mark(h, dinp, hh);
}

static float r_xent_fwd(ps_ctx_t *ctx, float *probs, const float *logits, const int32_t *labels,
                        int N, int K)
{
    hround_t *h = st(ctx);
    if (is_half(h, logits)) {
        ps_warn("rounding backend: xent got half logits");
        h->mismatches++;
    }
    mark(h, probs, 0);
    return cpu->xent_forward(ctx, probs, logits, labels, N, K);
}

static void r_xent_bwd(ps_ctx_t *ctx, float *dlogits, const float *probs, const int32_t *labels,
                       float dloss, int N, int K)
{
    hround_t *h = st(ctx);
    mark(h, dlogits, 0);
    cpu->xent_backward(ctx, dlogits, probs, labels, dloss * h->loss_scale, N, K);
}

static void r_tshift_fwd(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C,
                         int HW, int fold_div)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->tshift_forward(ctx, out, inp, B, T, C, HW, fold_div);
    mark(h, out, hh); /* moves values: nothing to round */
}

static void r_tshift_bwd(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T, int C,
                         int HW, int fold_div)
{
    hround_t *h = st(ctx);
    if (!dinp) return;
    const int hh = is_half(h, dout);
    cpu->tshift_backward(ctx, dinp, dout, B, T, C, HW, fold_div);
    mark(h, dinp, hh);
}

static void r_consensus_fwd(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int K)
{
    hround_t *h = st(ctx);
    const int hh = is_half(h, inp);
    cpu->consensus_forward(ctx, out, inp, B, T, K);
    if (hh) round_inplace(h, out, (size_t)B * K);
    mark(h, out, hh);
}

static void r_consensus_bwd(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T, int K)
{
    hround_t *h = st(ctx);
    if (!dinp) return;
    const int hh = is_half(h, dout);
    cpu->consensus_backward(ctx, dinp, dout, B, T, K);
    if (hh) round_inplace(h, dinp, (size_t)B * T * K);
    mark(h, dinp, hh);
}

static void r_add(ps_ctx_t *ctx, float *out, const float *a, const float *b, size_t n)
{
    hround_t *h = st(ctx);
    const int hh = same(h, "add", a, b);
    cpu->add(ctx, out, a, b, n);
    if (hh) round_inplace(h, out, n);
    mark(h, out, hh);
}

static void r_accumulate(ps_ctx_t *ctx, float *acc, const float *x, size_t n)
{
    hround_t *h = st(ctx);
    const int hh = same(h, "accumulate", acc, x);
    cpu->accumulate(ctx, acc, x, n);
    if (hh) round_inplace(h, acc, n);
    mark(h, acc, hh);
}

/* The precision and loss scale the rounding follows (ps_hround_init's,
 * changed here as on CUDA; a precision change forgets every tag). */
static int r_set_precision(ps_ctx_t *ctx, ps_precision_t precision)
{
    if (!valid_prec(precision)) {
        ps_error("rounding backend: unknown precision %d", (int)precision);
        return PS_EINVAL;
    }
    hround_t *h = st(ctx);
    h->prec = precision;
    h->n = 0;
    return 0;
}

static int r_set_loss_scale(ps_ctx_t *ctx, float scale)
{
    if (!(scale > 0) || !isfinite(scale)) {
        ps_error("rounding backend: loss scale %g must be finite and > 0", (double)scale);
        return PS_EINVAL;
    }
    st(ctx)->loss_scale = scale;
    return 0;
}

const ps_backend_t ps_backend_cpu_round = {
    .name = "cpu-round",
    .async = 0,
    .sync = ps_cpu_sync,
    .set_precision = r_set_precision,
    .set_loss_scale = r_set_loss_scale,
    .events = ps_cpu_events,
    .event_record = ps_cpu_event_record,
    .event_query = ps_cpu_event_query,
    .event_wait = ps_cpu_event_wait,
    .mem_stats = ps_cpu_mem_stats,
    /* rounded values stored as floats: a CPU layer writes 4 bytes each */
    .act_elsize = ps_cpu_act_elsize,
    .release = ps_hround_free,
    .conv2d_forward = r_conv_fwd,
    .conv2d_backward = r_conv_bwd,
    .bn_forward_train = r_bn_fwd_train,
    .bn_forward_saved = r_bn_fwd_saved,
    .bn_backward_train = r_bn_bwd_train,
    .bn_forward_eval = r_bn_fwd_eval,
    .bn_backward_eval = r_bn_bwd_eval,
    .relu_forward = r_relu_fwd,
    .relu_backward = r_relu_bwd,
    .maxpool_forward = r_maxpool_fwd,
    .maxpool_backward = r_maxpool_bwd,
    .avgpool_forward = r_avgpool_fwd,
    .avgpool_backward = r_avgpool_bwd,
    .linear_forward = r_linear_fwd,
    .linear_backward = r_linear_bwd,
    .dropout_forward = r_dropout_fwd,
    .dropout_backward = r_dropout_bwd,
    .xent_forward = r_xent_fwd,
    .xent_backward = r_xent_bwd,
    .tshift_forward = r_tshift_fwd,
    .tshift_backward = r_tshift_bwd,
    .consensus_forward = r_consensus_fwd,
    .consensus_backward = r_consensus_bwd,
    .add = r_add,
    .accumulate = r_accumulate,
    /* CUDA runs the detection layers in fp32: the CPU's, unrounded */
    .upsample_add_forward = ps_cpu_upsample_add_forward,
    .upsample_add_backward = ps_cpu_upsample_add_backward,
    .count_pos = ps_cpu_count_pos,
    .focal_forward = ps_cpu_focal_forward,
    .focal_backward = ps_cpu_focal_backward,
    .smoothl1_forward = ps_cpu_smoothl1_forward,
    .smoothl1_backward = ps_cpu_smoothl1_backward,
    .head_permute_forward = ps_cpu_head_permute_forward,
    .head_permute_backward = ps_cpu_head_permute_backward,
    .conv3d_forward = r_conv3d_fwd,
    .conv3d_backward = r_conv3d_bwd,
    /* CUDA pools 3-D tensors in fp32 (they are never half): the CPU's */
    .maxpool3d_forward = ps_cpu_maxpool3d_forward,
    .maxpool3d_backward = ps_cpu_maxpool3d_backward,
    .avgpool3d_forward = ps_cpu_avgpool3d_forward,
    .avgpool3d_backward = ps_cpu_avgpool3d_backward,
    .roi_align_forward = ps_cpu_roi_align_forward,
    .roi_align_backward = ps_cpu_roi_align_backward,
    .deconv_forward = ps_cpu_deconv_forward,
    .deconv_backward = ps_cpu_deconv_backward,
    .mask_bce_forward = ps_cpu_mask_bce_forward,
    .mask_bce_backward = ps_cpu_mask_bce_backward,
    .scale = ps_cpu_scale,
    /* NULL as on CUDA (cuda/backend_cuda_table.c): the model takes the unfused path */
    .bn_relu_forward_eval = NULL,
    .bn_relu_backward_eval = NULL,
};
