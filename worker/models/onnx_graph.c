/* The ONNX graph builder (onnx_graph.h).  The graph is built directly as
 * protobuf-c messages (proto/onnx.proto), every string and array malloc'd,
 * so protobuf-c's own free_unpacked releases the whole tree; the model
 * around it exists only while ps_onnx_save packs it. */
#include "worker/models/onnx_graph.h"

#include "config.h"
#include "onnx.pb-c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ps_onnx {
    Onnx__GraphProto *gp;
    size_t cap_node, cap_init, cap_in, cap_out;
    Onnx__StringStringEntryProto **meta;
    size_t nmeta, cap_meta;
    const char **names;     /* every value and initializer name (owned by the messages) */
    size_t nnames, cap_names;
    int err;                /* first error, sticky */
};

__attribute__((format(printf, 3, 4))) static const char *fail(ps_onnx_t *g, int code,
                                                             const char *fmt, ...)
{
    if (g->err) return NULL;
    g->err = code;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ps_error("onnx export: %s", msg);
    return NULL;
}

/* Make room for one more element of an array of pointers. */
static int grow(ps_onnx_t *g, void *arrp, size_t n, size_t *cap)
{
    void ***arr = arrp;
    if (n < *cap) return 0;
    size_t c = *cap ? 2 * *cap : 64;
    void **p = realloc(*arr, c * sizeof *p);
    if (!p) {
        fail(g, PS_ENOMEM, "out of memory");
        return PS_ENOMEM;
    }
    *arr = p;
    *cap = c;
    return 0;
}

static char *dup(ps_onnx_t *g, const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d) fail(g, PS_ENOMEM, "out of memory");
    return d;
}

static int defined(const ps_onnx_t *g, const char *name)
{
    for (size_t i = 0; i < g->nnames; i++)
        if (!strcmp(g->names[i], name)) return 1;
    return 0;
}

/* Record a new value name; a duplicate is an error. */
static int define(ps_onnx_t *g, const char *name)
{
    if (defined(g, name)) {
        fail(g, PS_EINVAL, "the name %s is defined twice", name);
        return PS_EINVAL;
    }
    if (grow(g, &g->names, g->nnames, &g->cap_names)) return PS_ENOMEM;
    g->names[g->nnames++] = name;
    return 0;
}

int ps_onnx_new(ps_onnx_t **out, const char *graph_name)
{
    *out = NULL;
    ps_onnx_t *g = calloc(1, sizeof *g);
    Onnx__GraphProto *gp = malloc(sizeof *gp);
    if (!g || !gp) {
        free(g), free(gp);
        return PS_ENOMEM;
    }
    onnx__graph_proto__init(gp);
    g->gp = gp;
    if (!(gp->name = dup(g, graph_name))) {
        ps_onnx_destroy(&g);
        return PS_ENOMEM;
    }
    *out = g;
    return 0;
}

void ps_onnx_destroy(ps_onnx_t **gp)
{
    if (!gp || !*gp) return;
    ps_onnx_t *g = *gp;
    if (g->gp) onnx__graph_proto__free_unpacked(g->gp, NULL);
    for (size_t i = 0; i < g->nmeta; i++)
        onnx__string_string_entry_proto__free_unpacked(g->meta[i], NULL);
    free(g->meta);
    free(g->names);
    free(g);
    *gp = NULL;
}

int ps_onnx_error(const ps_onnx_t *g) { return g->err; }

/* ---- values, initializers, metadata ------------------------------------------ */

static Onnx__ValueInfoProto *value_info(ps_onnx_t *g, const char *name, int ndim,
                                        const int64_t *dims, const char *const *dim_names)
{
    Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
    Onnx__TypeProto *tp = calloc(1, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
    Onnx__TensorShapeProto *sh = calloc(1, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dd = calloc((size_t)(ndim > 0 ? ndim : 1), sizeof *dd);
    if (!vi || !tp || !tt || !sh || !dd) goto oom;
    onnx__value_info_proto__init(vi);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    vi->type = tp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tt->shape = sh;
    sh->dim = dd;
    for (int d = 0; d < ndim; d++) {
        Onnx__TensorShapeProto__Dimension *di = malloc(sizeof *di);
        if (!di) goto oom_tree;
        onnx__tensor_shape_proto__dimension__init(di);
        dd[d] = di;
        sh->n_dim++;
        if (dims[d] > 0) {
            di->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            di->dim_value = dims[d];
        } else {
            di->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            if (!(di->dim_param = dup(g, dim_names && dim_names[d] ? dim_names[d] : "dim")))
                goto oom_tree;
        }
    }
    if (!(vi->name = dup(g, name))) goto oom_tree;
    return vi;
oom:
    free(vi), free(tp), free(tt), free(sh), free(dd);
    fail(g, PS_ENOMEM, "out of memory");
    return NULL;
oom_tree:
    onnx__value_info_proto__free_unpacked(vi, NULL);
    fail(g, PS_ENOMEM, "out of memory");
    return NULL;
}

const char *ps_onnx_input(ps_onnx_t *g, const char *name, int ndim, const int64_t *dims,
                          const char *const *dim_names)
{
    if (g->err) return NULL;
    if (grow(g, &g->gp->input, g->gp->n_input, &g->cap_in)) return NULL;
    Onnx__ValueInfoProto *vi = value_info(g, name, ndim, dims, dim_names);
    if (!vi) return NULL;
    g->gp->input[g->gp->n_input++] = vi;
    return define(g, vi->name) ? NULL : vi->name;
}

const char *ps_onnx_output(ps_onnx_t *g, const char *value, int ndim, const int64_t *dims,
                           const char *const *dim_names)
{
    if (g->err || !value) return NULL;
    if (!defined(g, value)) return fail(g, PS_EINVAL, "output %s is no value of the graph", value);
    if (grow(g, &g->gp->output, g->gp->n_output, &g->cap_out)) return NULL;
    Onnx__ValueInfoProto *vi = value_info(g, value, ndim, dims, dim_names);
    if (!vi) return NULL;
    g->gp->output[g->gp->n_output++] = vi;
    return vi->name;
}

int ps_onnx_meta(ps_onnx_t *g, const char *key, const char *value)
{
    if (g->err) return g->err;
    if (grow(g, &g->meta, g->nmeta, &g->cap_meta)) return g->err;
    Onnx__StringStringEntryProto *e = malloc(sizeof *e);
    if (!e) return fail(g, PS_ENOMEM, "out of memory"), g->err;
    onnx__string_string_entry_proto__init(e);
    g->meta[g->nmeta++] = e;
    if (!(e->key = dup(g, key)) || !(e->value = dup(g, value))) return g->err;
    return 0;
}

/* A tensor initializer of raw little-endian bytes (data copied). */
static const char *initializer(ps_onnx_t *g, const char *name, int dtype, int ndim,
                               const int64_t *dims, const void *data, size_t nbytes)
{
    if (g->err) return NULL;
    if (!name || !data) return fail(g, PS_EINVAL, "initializer %s without data", name ? name : "?");
    if (grow(g, &g->gp->initializer, g->gp->n_initializer, &g->cap_init)) return NULL;
    Onnx__TensorProto *t = malloc(sizeof *t);
    if (!t) return fail(g, PS_ENOMEM, "out of memory");
    onnx__tensor_proto__init(t);
    g->gp->initializer[g->gp->n_initializer++] = t;
    t->has_data_type = 1;
    t->data_type = dtype;
    t->dims = malloc(sizeof(int64_t) * (size_t)(ndim > 0 ? ndim : 1));
    t->raw_data.data = malloc(nbytes ? nbytes : 1);
    if (!t->dims || !t->raw_data.data || !(t->name = dup(g, name)))
        return fail(g, PS_ENOMEM, "out of memory");
    t->n_dims = (size_t)ndim;
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)ndim);
    memcpy(t->raw_data.data, data, nbytes); /* the host is little-endian, as raw_data */
    t->raw_data.len = nbytes;
    t->has_raw_data = 1;
    return define(g, t->name) ? NULL : t->name;
}

const char *ps_onnx_weight(ps_onnx_t *g, const char *name, int ndim, const int *shape,
                           const float *data)
{
    int64_t dims[8];
    size_t n = 1;
    if (ndim < 0 || ndim > 8) return fail(g, PS_EINVAL, "weight %s of rank %d", name, ndim);
    for (int d = 0; d < ndim; d++) n *= (size_t)(dims[d] = shape[d]);
    return initializer(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims, data,
                       n * sizeof(float));
}

const char *ps_onnx_ints(ps_onnx_t *g, const char *name, int n, const int64_t *v)
{
    int64_t dim = n;
    return initializer(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, &dim, v,
                       (size_t)n * sizeof(int64_t));
}

/* ---- nodes --------------------------------------------------------------------- */

/* A node op(inputs) -> out; every named input must exist ("" = an omitted
 * optional input).  Returns the node for its attributes, NULL on error. */
static Onnx__NodeProto *node(ps_onnx_t *g, const char *op, const char *out, int nin,
                             const char *const *in)
{
    if (g->err) return NULL;
    for (int i = 0; i < nin; i++) {
        if (!in[i]) /* an earlier layer failed (then already logged) */
            return fail(g, PS_EINVAL, "%s %s: input %d missing", op, out, i), NULL;
        if (*in[i] && !defined(g, in[i]))
            return fail(g, PS_EINVAL, "%s %s: input %s is no value of the graph", op, out, in[i]),
                   NULL;
    }
    if (grow(g, &g->gp->node, g->gp->n_node, &g->cap_node)) return NULL;
    Onnx__NodeProto *n = malloc(sizeof *n);
    if (!n) return fail(g, PS_ENOMEM, "out of memory"), NULL;
    onnx__node_proto__init(n);
    g->gp->node[g->gp->n_node++] = n;
    n->input = calloc((size_t)(nin ? nin : 1), sizeof(char *));
    n->output = calloc(1, sizeof(char *));
    if (!n->input || !n->output) return fail(g, PS_ENOMEM, "out of memory"), NULL;
    for (int i = 0; i < nin; i++) {
        if (!(n->input[i] = dup(g, in[i]))) return NULL;
        n->n_input++;
    }
    if (!(n->output[0] = dup(g, out))) return NULL;
    n->n_output = 1;
    if (!(n->name = dup(g, out)) || !(n->op_type = dup(g, op))) return NULL;
    return define(g, n->output[0]) ? NULL : n;
}

static Onnx__AttributeProto *attr(ps_onnx_t *g, Onnx__NodeProto *n, const char *name,
                                  Onnx__AttributeProto__AttributeType type)
{
    if (!n || g->err) return NULL;
    Onnx__AttributeProto **a = realloc(n->attribute, (n->n_attribute + 1) * sizeof *a);
    if (!a) return fail(g, PS_ENOMEM, "out of memory"), NULL;
    n->attribute = a;
    Onnx__AttributeProto *at = malloc(sizeof *at);
    if (!at) return fail(g, PS_ENOMEM, "out of memory"), NULL;
    onnx__attribute_proto__init(at);
    a[n->n_attribute++] = at;
    at->has_type = 1;
    at->type = type;
    return (at->name = dup(g, name)) ? at : NULL;
}

static void attr_i(ps_onnx_t *g, Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (a) a->has_i = 1, a->i = v;
}

static void attr_f(ps_onnx_t *g, Onnx__NodeProto *n, const char *name, float v)
{
    Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (a) a->has_f = 1, a->f = v;
}

static void attr_ints(ps_onnx_t *g, Onnx__NodeProto *n, const char *name, int k,
                      const int64_t *v)
{
    Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    if (!a) return;
    if (!(a->ints = malloc(sizeof(int64_t) * (size_t)(k ? k : 1)))) {
        fail(g, PS_ENOMEM, "out of memory");
        return;
    }
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)k);
    a->n_ints = (size_t)k;
}

static void attr_s(ps_onnx_t *g, Onnx__NodeProto *n, const char *name, const char *v)
{
    Onnx__AttributeProto *a = attr(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    if (!a) return;
    char *s = dup(g, v);
    if (!s) return;
    a->has_s = 1;
    a->s.data = (uint8_t *)s;
    a->s.len = strlen(s);
}

static const char *out_of(Onnx__NodeProto *n) { return n ? n->output[0] : NULL; }

/* "<base><suffix>" into buf (node names are short; longer ones are cut and
 * then caught as duplicates at worst). */
static const char *sub(char *buf, size_t len, const char *base, const char *suffix)
{
    snprintf(buf, len, "%s%s", base, suffix);
    return buf;
}

/* ---- layers --------------------------------------------------------------------- */

const char *ps_onnx_conv(ps_onnx_t *g, const char *name, const char *x, const char *w,
                         const char *b, const ps_conv2d_desc_t *d)
{
    const char *in[3] = {x, w, b};
    Onnx__NodeProto *n = node(g, "Conv", name, b ? 3 : 2, in);
    int64_t k[2] = {d->R, d->S}, s[2] = {d->stride_h, d->stride_w};
    int64_t p[4] = {d->pad_h, d->pad_w, d->pad_h, d->pad_w}, dl[2] = {d->dil_h, d->dil_w};
    attr_ints(g, n, "kernel_shape", 2, k);
    attr_ints(g, n, "strides", 2, s);
    attr_ints(g, n, "pads", 4, p);
    attr_ints(g, n, "dilations", 2, dl);
    attr_i(g, n, "group", d->groups);
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_batchnorm(ps_onnx_t *g, const char *name, const char *x, const char *scale,
                              const char *bias, const char *mean, const char *var, float eps)
{
    const char *in[5] = {x, scale, bias, mean, var};
    Onnx__NodeProto *n = node(g, "BatchNormalization", name, 5, in);
    attr_f(g, n, "epsilon", eps);
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_relu(ps_onnx_t *g, const char *name, const char *x)
{
    return out_of(node(g, "Relu", name, 1, &x));
}

const char *ps_onnx_maxpool(ps_onnx_t *g, const char *name, const char *x,
                            const ps_pool_desc_t *d)
{
    Onnx__NodeProto *n = node(g, "MaxPool", name, 1, &x);
    int64_t k[2] = {d->R, d->S}, s[2] = {d->stride_h, d->stride_w};
    int64_t p[4] = {d->pad_h, d->pad_w, d->pad_h, d->pad_w};
    attr_ints(g, n, "kernel_shape", 2, k);
    attr_ints(g, n, "strides", 2, s);
    attr_ints(g, n, "pads", 4, p);
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_add(ps_onnx_t *g, const char *name, const char *a, const char *b)
{
    const char *in[2] = {a, b};
    return out_of(node(g, "Add", name, 2, in));
}

const char *ps_onnx_avgpool_flat(ps_onnx_t *g, const char *name, const char *x)
{
    char buf[256];
    const char *p = out_of(node(g, "GlobalAveragePool", sub(buf, sizeof buf, name, ".pool"), 1, &x));
    Onnx__NodeProto *n = node(g, "Flatten", name, 1, &p);
    attr_i(g, n, "axis", 1);
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_linear(ps_onnx_t *g, const char *name, const char *x, const char *w,
                           const char *b)
{
    const char *in[3] = {x, w, b};
    Onnx__NodeProto *n = node(g, "Gemm", name, 3, in);
    attr_i(g, n, "transB", 1);
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_reshape(ps_onnx_t *g, const char *name, const char *x, int ndim,
                            const int64_t *shape)
{
    char buf[256];
    const char *in[2] = {x, ps_onnx_ints(g, sub(buf, sizeof buf, name, ".shape"), ndim, shape)};
    return out_of(node(g, "Reshape", name, 2, in));
}

const char *ps_onnx_transpose(ps_onnx_t *g, const char *name, const char *x, int ndim,
                              const int64_t *perm)
{
    Onnx__NodeProto *n = node(g, "Transpose", name, 1, &x);
    attr_ints(g, n, "perm", ndim, perm);
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_concat(ps_onnx_t *g, const char *name, int n, const char *const *xs,
                           int axis)
{
    Onnx__NodeProto *nd = node(g, "Concat", name, n, xs);
    attr_i(g, nd, "axis", axis);
    return g->err ? NULL : out_of(nd);
}

const char *ps_onnx_mean(ps_onnx_t *g, const char *name, const char *x, int axis, int keepdims)
{
    Onnx__NodeProto *n = node(g, "ReduceMean", name, 1, &x);
    int64_t ax = axis;
    attr_ints(g, n, "axes", 1, &ax); /* an attribute up to opset 17 */
    attr_i(g, n, "keepdims", keepdims);
    return g->err ? NULL : out_of(n);
}

/* Slice of x along axes[0..n) from starts to ends (int64 constants). */
static const char *slice(ps_onnx_t *g, const char *name, const char *x, int n,
                         const int64_t *starts, const int64_t *ends, const int64_t *axes)
{
    char b1[256], b2[256], b3[256];
    const char *in[4] = {x, ps_onnx_ints(g, sub(b1, sizeof b1, name, ".starts"), n, starts),
                         ps_onnx_ints(g, sub(b2, sizeof b2, name, ".ends"), n, ends),
                         ps_onnx_ints(g, sub(b3, sizeof b3, name, ".axes"), n, axes)};
    return out_of(node(g, "Slice", name, 4, in));
}

/* Zero padding of a rank-5 value by `before` / `after` frames on axis 1. */
static const char *pad_time(ps_onnx_t *g, const char *name, const char *x, int before, int after)
{
    char buf[256];
    int64_t pads[10] = {0, before, 0, 0, 0, 0, after, 0, 0, 0};
    const char *in[2] = {x, ps_onnx_ints(g, sub(buf, sizeof buf, name, ".pads"), 10, pads)};
    Onnx__NodeProto *n = node(g, "Pad", name, 2, in);
    attr_s(g, n, "mode", "constant");
    return g->err ? NULL : out_of(n);
}

const char *ps_onnx_tshift(ps_onnx_t *g, const char *name, const char *x, int T, int C, int H,
                           int W, int fold_div)
{
    if (g->err) return NULL;
    int fold = fold_div > 0 ? C / fold_div : 0;
    if (T < 1 || fold < 1 || 2 * fold > C)
        return fail(g, PS_EINVAL, "temporal shift %s: T %d, C %d, fold_div %d", name, T, C,
                    fold_div);
    char b[6][256];
    int64_t view[5] = {-1, T, C, H, W}, flat[4] = {-1, C, H, W};
    const char *v = ps_onnx_reshape(g, sub(b[0], 256, name, ".view"), x, 5, view);
    /* channels [0, fold): frame t+1, a zero frame after the last */
    int64_t s1[2] = {1, 0}, e1[2] = {T, fold}, ax[2] = {1, 2};
    const char *next = slice(g, sub(b[1], 256, name, ".next"), v, 2, s1, e1, ax);
    next = pad_time(g, sub(b[2], 256, name, ".next_pad"), next, 0, 1);
    /* [fold, 2 fold): frame t-1, a zero frame before the first */
    int64_t s2[2] = {0, fold}, e2[2] = {T - 1, 2 * fold};
    const char *prev = slice(g, sub(b[3], 256, name, ".prev"), v, 2, s2, e2, ax);
    prev = pad_time(g, sub(b[4], 256, name, ".prev_pad"), prev, 1, 0);
    const char *parts[3] = {next, prev, NULL};
    int np = 2;
    if (2 * fold < C) { /* the rest unchanged */
        int64_t s3 = 2 * fold, e3 = C, a3 = 2;
        parts[np++] = slice(g, sub(b[5], 256, name, ".rest"), v, 1, &s3, &e3, &a3);
    }
    char cat[256];
    const char *joined = ps_onnx_concat(g, sub(cat, sizeof cat, name, ".cat"), np, parts, 2);
    return ps_onnx_reshape(g, name, joined, 4, flat);
}

const char *ps_onnx_upsample_add(ps_onnx_t *g, const char *name, const char *lateral,
                                 const char *top)
{
    char b[5][256];
    /* sizes = (N, C) of top ++ (H, W) of lateral */
    Onnx__NodeProto *n = node(g, "Shape", sub(b[0], 256, name, ".nc"), 1, &top);
    attr_i(g, n, "end", 2);
    const char *nc = out_of(n);
    n = node(g, "Shape", sub(b[1], 256, name, ".hw"), 1, &lateral);
    attr_i(g, n, "start", 2);
    const char *hw = out_of(n);
    const char *sz[2] = {nc, hw};
    const char *sizes = ps_onnx_concat(g, sub(b[2], 256, name, ".sizes"), 2, sz, 0);
    const char *in[4] = {top, "", "", sizes};
    n = node(g, "Resize", sub(b[3], 256, name, ".up"), 4, in);
    attr_s(g, n, "mode", "nearest");
    attr_s(g, n, "coordinate_transformation_mode", "asymmetric");
    attr_s(g, n, "nearest_mode", "floor");
    if (g->err) return NULL;
    return ps_onnx_add(g, name, lateral, out_of(n));
}

/* ---- the file ------------------------------------------------------------------- */

int ps_onnx_save(ps_onnx_t *g, const char *path)
{
    if (g->err) {
        ps_error("onnx export %s: not written: the graph has an error (%s)", path,
                 ps_strerror(g->err));
        return g->err;
    }
    if (!g->gp->n_output) {
        ps_error("onnx export %s: the graph has no output", path);
        return PS_EINVAL;
    }
    Onnx__OperatorSetIdProto op;
    onnx__operator_set_id_proto__init(&op);
    op.domain = "";
    op.has_version = 1;
    op.version = PS_ONNX_OPSET;
    Onnx__OperatorSetIdProto *ops[1] = {&op};
    Onnx__ModelProto mp;
    onnx__model_proto__init(&mp);
    mp.has_ir_version = 1;
    mp.ir_version = PS_ONNX_IR_VERSION;
    mp.n_opset_import = 1;
    mp.opset_import = ops;
    mp.producer_name = "psworker";
    mp.producer_version = PACKAGE_VERSION;
    mp.graph = g->gp;
    mp.n_metadata_props = g->nmeta;
    mp.metadata_props = g->meta;
    size_t len = onnx__model_proto__get_packed_size(&mp);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        ps_error("onnx export %s: out of memory for %zu bytes", path, len);
        return PS_ENOMEM;
    }
    size_t packed = onnx__model_proto__pack(&mp, buf);
    char err[512];
    const void *bufs[1] = {buf};
    int rc = packed == len ? ps_write_file_atomic(path, bufs, &len, 1, "onnx export", err, sizeof err)
                           : PS_EIO;
    if (packed != len) ps_error("onnx export %s: packed %zu of %zu bytes", path, packed, len);
    free(buf);
    if (!rc)
        ps_info("onnx export %s: %zu nodes, %zu initializers, opset %d, %.1f MB", path,
                g->gp->n_node, g->gp->n_initializer, PS_ONNX_OPSET, len / 1e6);
    return rc;
}
