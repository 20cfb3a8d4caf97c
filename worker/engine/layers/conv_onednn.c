/* The oneDNN provider row (conv_provider.h): convolutions through oneDNN's
 * primitives, the library PyTorch's CPU convolutions use.
 *
 * Layouts: the engine's tensors are NCHW (NCDHW) fp32 and stay so.  Each
 * primitive is created with "any" layouts, so oneDNN picks the ones its
 * fastest kernel wants (blocked nChw8c / nChw16c for its direct kernels,
 * NHWC for the AMX ones), and the call reorders the operands into those
 * and the result back.  The reorders are part of what the selection times
 * (conv_select.c), so a shape goes to oneDNN only where kernel plus
 * reorders beat im2col + GEMM.  Weight gradients come out of oneDNN in its
 * layout and are reordered back with a "sum" post-op, which is the
 * accumulation (+=) the backend's contract asks for.
 *
 * Precision: fp32, or bf16 operands with fp32 results (conv2d's half
 * precision contract, ps_engine.h) where the CPU has native bf16 (AVX-512
 * BF16, AMX): the same reorders then round fp32 to bf16 on the way in.
 *
 * Per context (ctx->cpu_state): one stream, the plans made so far (one per
 * shape, direction and precision) and one buffer, grown to the largest
 * plan, that holds the reordered operands and the primitives' scratchpad.
 * oneDNN runs on the same OpenMP team as the rest of the engine (Debian's
 * build uses the OpenMP runtime), so it needs no thread set-up of its own.
 *
 * Without oneDNN at build time the row is there but supports nothing. */
#include "conv_provider.h"
#include "config.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PS_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>

#define MAXOP 4
#define ALIGN 64

/* ---- the process's CPU engine ---------------------------------------------- */

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void engine_open(void)
{
    dnnl_status_t st = dnnl_engine_create(&engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        ps_warn("oneDNN: no CPU engine (%s); convolutions use im2col + GEMM only",
                dnnl_status2str(st));
        engine = NULL;
    }
}

int ps_conv_onednn_available(void)
{
    pthread_once(&engine_once, engine_open);
    return engine != NULL;
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    static const struct { dnnl_cpu_isa_t isa; const char *name; } t[] = {
        {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
        {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
        {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
        {dnnl_cpu_isa_avx512_core, "avx512_core"},
        {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
        {dnnl_cpu_isa_avx2, "avx2"},
        {dnnl_cpu_isa_avx, "avx"},
        {dnnl_cpu_isa_sse41, "sse41"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if ((isa & t[i].isa) == t[i].isa) return t[i].name;
    return "generic";
}

const char *ps_conv_onednn_describe(char *buf, size_t len)
{
    const dnnl_version_t *v = dnnl_version();
    if (!ps_conv_onednn_available())
        snprintf(buf, len, "oneDNN %d.%d.%d: no CPU engine", v->major, v->minor, v->patch);
    else
        snprintf(buf, len, "oneDNN %d.%d.%d, %s", v->major, v->minor, v->patch,
                 isa_name(dnnl_get_effective_cpu_isa()));
    return buf;
}

int ps_conv_onednn_bf16(char *why, size_t len)
{
    if (!ps_conv_onednn_available()) {
        snprintf(why, len, "oneDNN has no CPU engine here");
        return 0;
    }
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
        snprintf(why, len, "this CPU has no native bf16 (oneDNN's best instruction set here: "
                 "%s; bf16 needs AVX-512 BF16 or AMX)", isa_name(isa));
        return 0;
    }
    return 1;
}

/* ---- plans ------------------------------------------------------------------- */

/* One operand of a call: where it lives for the caller (NCHW fp32) and for
 * the primitive, and the reorder between them when they differ. */
typedef struct operand {
    int arg;                  /* DNNL_ARG_* of the convolution */
    int out, accumulate;      /* written by the primitive; added into the caller's */
    dnnl_memory_desc_t user, prim;
    dnnl_primitive_t reorder; /* NULL: the primitive uses the caller's memory */
    dnnl_memory_t mu, mp;     /* on the caller's pointer / on our buffer */
    size_t off;               /* of mp in the buffer */
} operand_t;

typedef struct plan {
    ps_conv_shape_t s;
    ps_conv_dir_t dir;
    ps_precision_t prec;
    int ok;                   /* 0: oneDNN cannot do it (remembered, not retried) */
    dnnl_primitive_t conv;
    dnnl_memory_t scratch;
    size_t scratch_off, need; /* buffer bytes this plan uses */
    operand_t op[MAXOP];
    int nop;
    char impl[48];
    struct plan *next;
} plan_t;

typedef struct dstate {
    dnnl_stream_t stream;
    plan_t *plans;
    void *buf;
    size_t cap;
} dstate_t;

#define TRY(call)                                                                          \
    do {                                                                                   \
        dnnl_status_t st_ = (call);                                                        \
        if (st_ != dnnl_success) {                                                         \
            ps_debug("oneDNN: %s: %s", #call, dnnl_status2str(st_));                       \
            return st_;                                                                    \
        }                                                                                  \
    } while (0)

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Caller-side descriptors: activations NC(D)HW, weights (G,)K,C,(T,)R,S. */
static void act_dims(const ps_conv_shape_t *s, int ch, const int *sp, dnnl_dims_t d, int *nd)
{
    int n = 0;
    d[n++] = s->N, d[n++] = ch;
    for (int i = 3 - s->nsp; i < 3; i++) d[n++] = sp[i];
    *nd = n;
}

static dnnl_format_tag_t plain_tag(int nd)
{
    return nd == 3 ? dnnl_abc : nd == 4 ? dnnl_abcd : nd == 5 ? dnnl_abcde : dnnl_abcdef;
}

static dnnl_status_t user_mds(const ps_conv_shape_t *s, dnnl_memory_desc_t *src,
                              dnnl_memory_desc_t *wei, dnnl_memory_desc_t *dst,
                              dnnl_memory_desc_t *bias)
{
    dnnl_dims_t d;
    int nd;
    act_dims(s, s->C, s->in, d, &nd);
    TRY(dnnl_memory_desc_init_by_tag(src, nd, d, dnnl_f32, plain_tag(nd)));
    act_dims(s, s->K, s->out, d, &nd);
    TRY(dnnl_memory_desc_init_by_tag(dst, nd, d, dnnl_f32, plain_tag(nd)));
    nd = 0;
    if (s->groups > 1) d[nd++] = s->groups;
    d[nd++] = s->K / s->groups, d[nd++] = s->C / s->groups;
    for (int i = 3 - s->nsp; i < 3; i++) d[nd++] = s->ker[i];
    TRY(dnnl_memory_desc_init_by_tag(wei, nd, d, dnnl_f32, plain_tag(nd)));
    d[0] = s->K;
    TRY(dnnl_memory_desc_init_by_tag(bias, 1, d, dnnl_f32, dnnl_a));
    return dnnl_success;
}

/* "any" layout of the same dims with data type t. */
static dnnl_status_t any_md(dnnl_memory_desc_t *to, const dnnl_memory_desc_t *from,
                            dnnl_data_type_t t)
{
    return dnnl_memory_desc_init_by_tag(to, from->ndims, from->dims, t, dnnl_format_tag_any);
}

/* The convolution descriptor of direction dir over the given layouts. */
static dnnl_status_t conv_desc(dnnl_convolution_desc_t *cd, const ps_conv_shape_t *s,
                               ps_conv_dir_t dir, const dnnl_memory_desc_t *src,
                               const dnnl_memory_desc_t *wei, const dnnl_memory_desc_t *bias,
                               const dnnl_memory_desc_t *dst)
{
    dnnl_dims_t st, dil, pad;
    for (int i = 3 - s->nsp, j = 0; i < 3; i++, j++)
        st[j] = s->stride[i], dil[j] = s->dil[i] - 1, pad[j] = s->pad[i];
    /* symmetric padding: oneDNN's output size (in + 2p - extent) / s + 1
     * rounds down like PyTorch's */
    switch (dir) {
    case PS_CONV_FWD:
        return dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training,
                                                          dnnl_convolution_direct, src, wei,
                                                          bias, dst, st, dil, pad, pad);
    case PS_CONV_BWD_DATA:
        return dnnl_dilated_convolution_backward_data_desc_init(
            cd, dnnl_convolution_direct, src, wei, dst, st, dil, pad, pad);
    default:
        return dnnl_dilated_convolution_backward_weights_desc_init(
            cd, dnnl_convolution_direct, src, wei, NULL, dst, st, dil, pad, pad);
    }
}

static dnnl_status_t add_operand(plan_t *p, int arg, const dnnl_memory_desc_t *user,
                                 const dnnl_memory_desc_t *prim, int out, int accumulate)
{
    operand_t *o = &p->op[p->nop++];
    o->arg = arg, o->out = out, o->accumulate = accumulate;
    o->user = *user, o->prim = *prim;
    TRY(dnnl_memory_create(&o->mu, user, engine, DNNL_MEMORY_NONE));
    if (!accumulate && dnnl_memory_desc_equal(user, prim)) return dnnl_success;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (accumulate) { /* user += reorder(prim) */
        TRY(dnnl_primitive_attr_create(&attr));
        TRY(dnnl_post_ops_create(&po));
        TRY(dnnl_post_ops_append_sum(po, 1.0f));
        TRY(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_status_t st = out ? dnnl_reorder_primitive_desc_create(&rpd, prim, engine, user, engine,
                                                                attr)
                           : dnnl_reorder_primitive_desc_create(&rpd, user, engine, prim, engine,
                                                                attr);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return st;
    st = dnnl_primitive_create(&o->reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    if (st != dnnl_success) return st;
    TRY(dnnl_memory_create(&o->mp, prim, engine, DNNL_MEMORY_NONE));
    o->off = p->need;
    p->need += align_up(dnnl_memory_desc_get_size(prim));
    return dnnl_success;
}

/* Build p (shape, dir, prec set): primitive, operands, buffer layout. */
static dnnl_status_t plan_build(plan_t *p)
{
    const ps_conv_shape_t *s = &p->s;
    const dnnl_data_type_t lo = p->prec == PS_PRECISION_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t usrc, uwei, udst, ubias, asrc, awei, adst, asrc_f, adst_f, awei_f;
    TRY(user_mds(s, &usrc, &uwei, &udst, &ubias));
    /* the operands the convolution reads are in the low type, what it
     * writes stays fp32 */
    TRY(any_md(&asrc, &usrc, lo));
    TRY(any_md(&awei, &uwei, lo));
    TRY(any_md(&adst, &udst, lo));
    TRY(any_md(&asrc_f, &usrc, dnnl_f32));
    TRY(any_md(&awei_f, &uwei, dnnl_f32));
    TRY(any_md(&adst_f, &udst, dnnl_f32));

    dnnl_primitive_attr_t attr;
    TRY(dnnl_primitive_attr_create(&attr));
    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    dnnl_convolution_desc_t fd, cd;
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    dnnl_status_t st = conv_desc(&fd, s, PS_CONV_FWD, &asrc, &awei,
                                 s->bias && p->dir == PS_CONV_FWD ? &ubias : NULL, &adst_f);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&hint, &fd, attr, engine, NULL);
    if (st == dnnl_success && p->dir == PS_CONV_FWD) {
        pd = hint;
        hint = NULL;
    } else if (st == dnnl_success) {
        st = p->dir == PS_CONV_BWD_DATA ? conv_desc(&cd, s, p->dir, &asrc_f, &awei, NULL, &adst)
                                        : conv_desc(&cd, s, p->dir, &asrc, &awei_f, NULL, &adst);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &cd, attr, engine, hint);
    }
    if (hint) dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return st;

    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(p->impl, sizeof p->impl, "%s", impl);
#define MD(q) dnnl_primitive_desc_query_md(pd, q, 0)
    switch (p->dir) {
    case PS_CONV_FWD:
        st = add_operand(p, DNNL_ARG_SRC, &usrc, MD(dnnl_query_src_md), 0, 0);
        if (!st) st = add_operand(p, DNNL_ARG_WEIGHTS, &uwei, MD(dnnl_query_weights_md), 0, 0);
        if (!st && s->bias) st = add_operand(p, DNNL_ARG_BIAS, &ubias, &ubias, 0, 0);
        if (!st) st = add_operand(p, DNNL_ARG_DST, &udst, MD(dnnl_query_dst_md), 1, 0);
        break;
    case PS_CONV_BWD_DATA:
        st = add_operand(p, DNNL_ARG_DIFF_DST, &udst, MD(dnnl_query_diff_dst_md), 0, 0);
        if (!st) st = add_operand(p, DNNL_ARG_WEIGHTS, &uwei, MD(dnnl_query_weights_md), 0, 0);
        if (!st)
            st = add_operand(p, DNNL_ARG_DIFF_SRC, &usrc, MD(dnnl_query_diff_src_md), 1, 0);
        break;
    default:
        st = add_operand(p, DNNL_ARG_DIFF_DST, &udst, MD(dnnl_query_diff_dst_md), 0, 0);
        if (!st) st = add_operand(p, DNNL_ARG_SRC, &usrc, MD(dnnl_query_src_md), 0, 0);
        if (!st)
            st = add_operand(p, DNNL_ARG_DIFF_WEIGHTS, &uwei,
                             MD(dnnl_query_diff_weights_md), 1, 1);
        break;
    }
    const dnnl_memory_desc_t *smd = MD(dnnl_query_scratchpad_md);
#undef MD
    if (st == dnnl_success && smd && dnnl_memory_desc_get_size(smd) > 0) {
        st = dnnl_memory_create(&p->scratch, smd, engine, DNNL_MEMORY_NONE);
        p->scratch_off = p->need;
        p->need += align_up(dnnl_memory_desc_get_size(smd));
    }
    if (st == dnnl_success) st = dnnl_primitive_create(&p->conv, pd);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

static void plan_free(plan_t *p)
{
    for (int i = 0; i < p->nop; i++) {
        if (p->op[i].reorder) dnnl_primitive_destroy(p->op[i].reorder);
        if (p->op[i].mu) dnnl_memory_destroy(p->op[i].mu);
        if (p->op[i].mp) dnnl_memory_destroy(p->op[i].mp);
    }
    if (p->scratch) dnnl_memory_destroy(p->scratch);
    if (p->conv) dnnl_primitive_destroy(p->conv);
    free(p);
}

void ps_conv_onednn_free(void *state)
{
    dstate_t *d = state;
    if (!d) return;
    for (plan_t *p = d->plans, *next; p; p = next) next = p->next, plan_free(p);
    if (d->stream) dnnl_stream_destroy(d->stream);
    free(d->buf);
    free(d);
}

static dstate_t *dstate(ps_ctx_t *ctx)
{
    ps_cpu_state_t *cs = ps_cpu_state(ctx);
    if (!cs || !ps_conv_onednn_available()) return NULL;
    if (!cs->onednn) {
        dstate_t *d = calloc(1, sizeof *d);
        if (!d) return NULL;
        dnnl_status_t st = dnnl_stream_create(&d->stream, engine, dnnl_stream_default_flags);
        if (st != dnnl_success) {
            ps_warn("oneDNN: cannot create a stream (%s)", dnnl_status2str(st));
            free(d);
            return NULL;
        }
        cs->onednn = d;
    }
    return cs->onednn;
}

/* The plan of (s, dir) at ctx's precision, built on first use; NULL when
 * oneDNN cannot compute it. */
static plan_t *plan_get(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir)
{
    dstate_t *d = dstate(ctx);
    if (!d) return NULL;
    const ps_precision_t prec = ps_cpu_state(ctx)->precision;
    ps_conv_shape_t key = *s;
    if (dir != PS_CONV_FWD) key.bias = 0;
    for (plan_t *p = d->plans; p; p = p->next)
        if (p->dir == dir && p->prec == prec && !memcmp(&p->s, &key, sizeof key))
            return p->ok ? p : NULL;
    plan_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->s = key, p->dir = dir, p->prec = prec;
    dnnl_status_t st = plan_build(p);
    if (st != dnnl_success) {
        char sh[128];
        ps_debug("oneDNN: no %s %s convolution %s (%s)", ps_precision_name(prec),
                 ps_conv_dir_name[dir], ps_conv_shape_str(s, sh, sizeof sh),
                 dnnl_status2str(st));
        plan_t *stub = calloc(1, sizeof *stub); /* remember the refusal */
        plan_free(p);
        if (!stub) return NULL;
        stub->s = key, stub->dir = dir, stub->prec = prec;
        stub->next = d->plans, d->plans = stub;
        return NULL;
    }
    p->ok = 1;
    p->next = d->plans, d->plans = p;
    return p;
}

/* Run plan p on the caller's pointers (one per operand, in operand order). */
static int plan_exec(ps_ctx_t *ctx, plan_t *p, void *const *ptr)
{
    dstate_t *d = dstate(ctx);
    if (p->need > d->cap) {
        void *nb = NULL;
        if (posix_memalign(&nb, ALIGN, p->need)) {
            ps_error("oneDNN: cannot allocate %zu bytes of operand buffers", p->need);
            return PS_ENOMEM;
        }
        free(d->buf);
        d->buf = nb, d->cap = p->need;
    }
    char *buf = d->buf;
    dnnl_exec_arg_t args[MAXOP + 1];
    int na = 0;
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < p->nop && st == dnnl_success; i++) {
        operand_t *o = &p->op[i];
        st = dnnl_memory_set_data_handle(o->mu, ptr[i]);
        if (st == dnnl_success && o->reorder)
            st = dnnl_memory_set_data_handle(o->mp, buf + o->off);
        args[na++] = (dnnl_exec_arg_t){o->arg, o->reorder ? o->mp : o->mu};
        if (st == dnnl_success && o->reorder && !o->out) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, o->mu}, {DNNL_ARG_TO, o->mp}};
            st = dnnl_primitive_execute(o->reorder, d->stream, 2, ra);
        }
    }
    if (st == dnnl_success && p->scratch) {
        st = dnnl_memory_set_data_handle(p->scratch, buf + p->scratch_off);
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->scratch};
    }
    if (st == dnnl_success) st = dnnl_primitive_execute(p->conv, d->stream, na, args);
    for (int i = 0; i < p->nop && st == dnnl_success; i++) {
        operand_t *o = &p->op[i];
        if (!o->reorder || !o->out) continue;
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, o->mp}, {DNNL_ARG_TO, o->mu}};
        st = dnnl_primitive_execute(o->reorder, d->stream, 2, ra);
    }
    if (st == dnnl_success) st = dnnl_stream_wait(d->stream);
    if (st != dnnl_success) {
        char sh[128];
        ps_error("oneDNN: %s convolution %s failed: %s", ps_conv_dir_name[p->dir],
                 ps_conv_shape_str(&p->s, sh, sizeof sh), dnnl_status2str(st));
        return PS_EIO;
    }
    return 0;
}

/* ---- the row -------------------------------------------------------------------- */

static int dn_supports(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir)
{
    return plan_get(ctx, s, dir) != NULL;
}

static int dn_forward(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *out, const float *inp,
                      const float *w, const float *b)
{
    plan_t *p = plan_get(ctx, s, PS_CONV_FWD);
    if (!p) return PS_EUNSUPPORTED;
    void *ptr[MAXOP] = {(void *)inp, (void *)w};
    int n = 2;
    if (s->bias) ptr[n++] = (void *)b;
    ptr[n] = out;
    return plan_exec(ctx, p, ptr);
}

static int dn_backward_data(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp,
                            const float *dout, const float *w)
{
    plan_t *p = plan_get(ctx, s, PS_CONV_BWD_DATA);
    if (!p) return PS_EUNSUPPORTED;
    void *ptr[MAXOP] = {(void *)dout, (void *)w, dinp};
    return plan_exec(ctx, p, ptr);
}

static int dn_backward_weights(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dw,
                               const float *dout, const float *inp)
{
    plan_t *p = plan_get(ctx, s, PS_CONV_BWD_WEIGHTS);
    if (!p) return PS_EUNSUPPORTED;
    void *ptr[MAXOP] = {(void *)dout, (void *)inp, dw};
    return plan_exec(ctx, p, ptr);
}

static const char *dn_kernel(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir,
                             char *buf, size_t len)
{
    plan_t *p = plan_get(ctx, s, dir);
    snprintf(buf, len, "%s", p ? p->impl : "(none)");
    return buf;
}

#else /* no oneDNN in this build */

int ps_conv_onednn_available(void) { return 0; }

const char *ps_conv_onednn_describe(char *buf, size_t len)
{
    snprintf(buf, len, "no oneDNN (built without it)");
    return buf;
}

int ps_conv_onednn_bf16(char *why, size_t len)
{
    snprintf(why, len, "this build has no oneDNN (configured without it, or libdnnl-dev was missing)");
    return 0;
}

void ps_conv_onednn_free(void *state) { (void)state; }

static int dn_supports(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir)
{
    return 0;
}

static int dn_forward(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *out, const float *inp,
                      const float *w, const float *b)
{
    return PS_EUNSUPPORTED;
}

static int dn_backward_data(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp,
                            const float *dout, const float *w)
{
    return PS_EUNSUPPORTED;
}

static int dn_backward_weights(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dw,
                               const float *dout, const float *inp)
{
    return PS_EUNSUPPORTED;
}

static const char *dn_kernel(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir,
                             char *buf, size_t len)
{
    snprintf(buf, len, "(none)");
    return buf;
}

#endif

const ps_conv_provider_t ps_conv_onednn = {
    .name = "onednn",
    .supports = dn_supports,
    .forward = dn_forward,
    .backward_data = dn_backward_data,
    .backward_weights = dn_backward_weights,
    .backward = NULL,
    .kernel = dn_kernel,
};
