// conv3d on the GPU through cuDNN's graph (backend) API: one operation
// graph per direction (forward, backward data, backward filter) and shape,
// each with an execution plan chosen ONCE from cuDNN's heuristics (mode A,
// then the fallback list; no timing runs) and cached.  Why the graph API
// here while conv2d.cu keeps the descriptor calls: the legacy calls are
// deprecated in cuDNN 9, the graph API is the supported path, and a new
// layer starts on it (docs/cuda.md, "3-D convolution").
//
// Plans are built device-less-style: the graphs are finalized without a
// handle and the heuristics and plans get the device through a DEVICEPROP
// descriptor made from the backend's handle once (cuDNN 9's replacement
// for the deprecated OPERATIONGRAPH_HANDLE / EXECUTION_PLAN_HANDLE).
//
// Engine choice: the first engine of the ranking whose plan finalizes,
// whose workspace fits under the state's limit and whose numerical notes
// fit the precision: fp32 takes no engine that down-converts its inputs or
// uses tensor cores (so fp32 matches the CPU as conv2d's FMA math does),
// half takes none with a reduced-precision reduction (fp32 accumulation).
//
// Precision fp16 / bf16: the operands are cast per call into half NDHWC
// staging buffers (x: NCDHW -> NDHWC, w: K,C,T,R,S -> K,T,R,S,C, dy
// likewise), the convolution runs on them with fp32 compute, and the
// results are widened back into the fp32 NCDHW tensors.  The 3-D models'
// other layers (BN, ReLU, pools, add) therefore see fp32 tensors: 3-D
// activations are not stored in half (docs/cuda.md says what that costs).
// The filter gradient is computed with beta 0 and then ADDED to dw, in
// both precisions (no engine has to support blending).
#include "cuda_int.h"

#include <string.h>

enum { C3_FWD = 0, C3_BWD_DATA = 1, C3_BWD_FILTER = 2 };
enum { UID_X = 1, UID_W = 2, UID_Y = 3 };

struct ps_cu_conv3d_entry {
    int key[22];
    cudnnBackendDescriptor_t plan[3];
    size_t ws[3]; // bytes
};

// ---- graph API helpers (a failure inside a layer is a device fault) -------

static cudnnBackendDescriptor_t be_new(cudnnBackendDescriptorType_t t)
{
    cudnnBackendDescriptor_t d = NULL;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(t, &d));
    return d;
}

#define BE_SET(desc, attr, type, n, ptr) \
    CUDNN_CHECK(cudnnBackendSetAttribute((desc), (attr), (type), (n), (ptr)))

// dims (N, C, D, H, W); NCDHW (ndhwc 0) or NDHWC (1) strides
static cudnnBackendDescriptor_t tensor5(int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                        int ndhwc)
{
    const int64_t n = dims[0], c = dims[1], dd = dims[2], h = dims[3], w = dims[4];
    (void)n;
    int64_t st[5];
    if (ndhwc) {
        st[0] = dd * h * w * c, st[1] = 1, st[2] = h * w * c, st[3] = w * c, st[4] = c;
    } else {
        st[0] = c * dd * h * w, st[1] = dd * h * w, st[2] = h * w, st[3] = w, st[4] = 1;
    }
    const int64_t align = 16;
    cudnnBackendDescriptor_t t = be_new(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    BE_SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    BE_SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 5, dims);
    BE_SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 5, st);
    BE_SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    BE_SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    CUDNN_CHECK(cudnnBackendFinalize(t));
    return t;
}

static cudnnBackendDescriptor_t conv_desc(const ps_conv3d_desc_t *d)
{
    const int64_t sd = 3;
    const int64_t dil[3] = {d->dil_t, d->dil_h, d->dil_w};
    const int64_t str[3] = {d->stride_t, d->stride_h, d->stride_w};
    const int64_t pad[3] = {d->pad_t, d->pad_h, d->pad_w};
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnBackendDescriptor_t c = be_new(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sd);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 3, dil);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 3, str);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 3, pad);
    BE_SET(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 3, pad);
    CUDNN_CHECK(cudnnBackendFinalize(c));
    return c;
}

// The device the heuristics and plans are for, made once per state.
static cudnnBackendDescriptor_t devprop(ps_cu_state *s)
{
    if (!s->c3_devprop) {
        cudnnBackendDescriptor_t p = be_new(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
        BE_SET(p, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &s->cudnn);
        CUDNN_CHECK(cudnnBackendFinalize(p));
        s->c3_devprop = p;
    }
    return (cudnnBackendDescriptor_t)s->c3_devprop;
}

// 1 when the engine of cfg may be used at this precision (see the top).
static int notes_ok(cudnnBackendDescriptor_t cfg, int fp32)
{
    cudnnBackendDescriptor_t eng = be_new(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t got = 0;
    int ok = 1;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &got, &eng) != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(eng);
        return 0;
    }
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nn = 0;
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn,
                                 notes) != CUDNN_STATUS_SUCCESS)
        nn = 0;
    for (int64_t i = 0; i < nn; i++) {
        if (fp32 && (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
                     notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
            ok = 0;
        if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) ok = 0;
    }
    cudnnBackendDestroyDescriptor(eng);
    return ok;
}

// The first usable plan of one heuristic mode's ranking, or NULL.
static cudnnBackendDescriptor_t plan_from(ps_cu_state *s, cudnnBackendDescriptor_t graph,
                                          cudnnBackendHeurMode_t mode, size_t *ws)
{
    cudnnBackendDescriptor_t heur = be_new(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendDescriptor_t dp = devprop(s);
    BE_SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    BE_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    BE_SET(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp);
    cudnnBackendDescriptor_t plan = NULL;
    if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(heur);
        return NULL;
    }
    int64_t n = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL));
    if (n > 64) n = 64;
    cudnnBackendDescriptor_t cfg[64];
    for (int64_t i = 0; i < n; i++) cfg[i] = be_new(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (n > 0)
        CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg));
    for (int64_t i = 0; i < got && !plan; i++) {
        if (!notes_ok(cfg[i], s->prec == PS_PRECISION_FP32)) continue;
        int64_t need = 0, cnt = 0;
        if (cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &cnt, &need) == CUDNN_STATUS_SUCCESS &&
            (size_t)need > s->ws_limit)
            continue;
        cudnnBackendDescriptor_t p = be_new(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        BE_SET(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &cfg[i]);
        BE_SET(p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp);
        int64_t pws = 0;
        if (cudnnBackendFinalize(p) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &cnt, &pws) == CUDNN_STATUS_SUCCESS &&
            (size_t)pws <= s->ws_limit) {
            plan = p;
            *ws = (size_t)pws;
        } else {
            cudnnBackendDestroyDescriptor(p);
        }
    }
    for (int64_t i = 0; i < n; i++) cudnnBackendDestroyDescriptor(cfg[i]);
    cudnnBackendDestroyDescriptor(heur);
    return plan;
}

// The plan of one direction: x (N,C,D,H,W), w (K,Cg,KT,R,S), y (N,K,O,P,Q).
static cudnnBackendDescriptor_t build_plan(ps_cu_state *s, int dir, const ps_conv3d_desc_t *d,
                                           int N, int D, int H, int W, size_t *ws)
{
    static const char *const names[3] = {"forward", "backward data", "backward filter"};
    const int half = s->prec != PS_PRECISION_FP32;
    const cudnnDataType_t dt = s->prec == PS_PRECISION_FP16   ? CUDNN_DATA_HALF
                               : s->prec == PS_PRECISION_BF16 ? CUDNN_DATA_BFLOAT16
                                                              : CUDNN_DATA_FLOAT;
    const int64_t xd[5] = {N, d->C, D, H, W};
    const int64_t wd[5] = {d->K, d->C / d->groups, d->KT, d->R, d->S};
    const int64_t yd[5] = {N, d->K, ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t),
                           ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h),
                           ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w)};
    cudnnBackendDescriptor_t x = tensor5(UID_X, dt, xd, half), w = tensor5(UID_W, dt, wd, half),
                             y = tensor5(UID_Y, dt, yd, half), cv = conv_desc(d);
    static const cudnnBackendDescriptorType_t optype[3] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    // per direction: conv desc, x (or dx), w (or dw), y (or dy), alpha, beta
    static const cudnnBackendAttributeName_t at[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
    const float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = be_new(optype[dir]);
    BE_SET(op, at[dir][0], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cv);
    BE_SET(op, at[dir][1], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    BE_SET(op, at[dir][2], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    BE_SET(op, at[dir][3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    BE_SET(op, at[dir][4], CUDNN_TYPE_FLOAT, 1, &alpha);
    BE_SET(op, at[dir][5], CUDNN_TYPE_FLOAT, 1, &beta);
    CUDNN_CHECK(cudnnBackendFinalize(op));
    cudnnBackendDescriptor_t graph = be_new(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    BE_SET(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    CUDNN_CHECK(cudnnBackendFinalize(graph));
    cudnnBackendDescriptor_t plan = plan_from(s, graph, CUDNN_HEUR_MODE_A, ws);
    if (!plan) plan = plan_from(s, graph, CUDNN_HEUR_MODE_FALLBACK, ws);
    cudnnBackendDestroyDescriptor(graph);
    cudnnBackendDestroyDescriptor(op);
    cudnnBackendDestroyDescriptor(cv);
    cudnnBackendDestroyDescriptor(x);
    cudnnBackendDestroyDescriptor(w);
    cudnnBackendDestroyDescriptor(y);
    if (!plan) {
        // no engine for this shape and precision: nothing sensible to compute
        ps_error("conv3d (cuda): no cuDNN engine for the %s of N=%d C=%d %dx%dx%d K=%d "
                 "kernel %dx%dx%d groups %d in %s within a %zu MiB workspace", names[dir], N,
                 d->C, D, H, W, d->K, d->KT, d->R, d->S, d->groups,
                 ps_precision_name((ps_precision_t)s->prec), s->ws_limit >> 20);
        abort();
    }
    return plan;
}

static ps_cu_conv3d_entry *entry3(ps_cu_state *s, const ps_conv3d_desc_t *d, int N, int D,
                                  int H, int W)
{
    const int key[22] = {N,           D,           H,           W,          d->C,
                         d->K,        d->KT,       d->R,        d->S,       d->stride_t,
                         d->stride_h, d->stride_w, d->pad_t,    d->pad_h,   d->pad_w,
                         d->dil_t,    d->dil_h,    d->dil_w,    d->groups,  s->prec,
                         0,           0};
    for (int i = 0; i < s->nconv3d; i++)
        if (!memcmp(s->conv3d[i].key, key, sizeof key)) return &s->conv3d[i];
    if (s->nconv3d == s->capconv3d) {
        int cap = s->capconv3d ? 2 * s->capconv3d : 16;
        void *p = realloc(s->conv3d, (size_t)cap * sizeof *s->conv3d);
        if (!p) {
            ps_error("conv3d (cuda): out of host memory for the plan cache");
            abort();
        }
        s->conv3d = (ps_cu_conv3d_entry *)p;
        s->capconv3d = cap;
    }
    ps_cu_conv3d_entry *e = &s->conv3d[s->nconv3d];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, sizeof key);
    for (int dir = 0; dir < 3; dir++) e->plan[dir] = build_plan(s, dir, d, N, D, H, W, &e->ws[dir]);
    ps_debug("conv3d (cuda): N=%d C=%d %dx%dx%d K=%d %dx%dx%d g%d %s: workspaces %zu / %zu / "
             "%zu B", N, d->C, D, H, W, d->K, d->KT, d->R, d->S, d->groups,
             ps_precision_name((ps_precision_t)s->prec), e->ws[0], e->ws[1], e->ws[2]);
    s->nconv3d++;
    return e;
}

void ps_cu_conv3d_free(ps_cu_state *s)
{
    for (int i = 0; i < s->nconv3d; i++)
        for (int dir = 0; dir < 3; dir++)
            if (s->conv3d[i].plan[dir]) cudnnBackendDestroyDescriptor(s->conv3d[i].plan[dir]);
    free(s->conv3d);
    s->conv3d = NULL;
    s->nconv3d = s->capconv3d = 0;
    if (s->c3_devprop) cudnnBackendDestroyDescriptor((cudnnBackendDescriptor_t)s->c3_devprop);
    s->c3_devprop = NULL;
}

// Run one plan on (x, w, y) device pointers (each direction's own roles).
static void run_plan(ps_cu_state *s, ps_cu_conv3d_entry *e, int dir, const void *x,
                     const void *w, const void *y)
{
    void *ws = ps_cu_workspace(s, e->ws[dir]);
    const int64_t uids[3] = {UID_X, UID_W, UID_Y};
    void *ptrs[3] = {(void *)x, (void *)w, (void *)y};
    cudnnBackendDescriptor_t vp = be_new(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    BE_SET(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    BE_SET(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    BE_SET(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    CUDNN_CHECK(cudnnBackendFinalize(vp));
    CUDNN_CHECK(cudnnBackendExecute(s->cudnn, e->plan[dir], vp));
    cudnnBackendDestroyDescriptor(vp);
}

// out (N,K,OPQ) += b[k]
__global__ void k_bias_add3(float *out, const float *b, size_t n, int K, size_t OPQ)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += b[(i / OPQ) % K];
}

static size_t opq(const ps_conv3d_desc_t *d, int D, int H, int W)
{
    return (size_t)ps_conv_out(D, d->KT, d->stride_t, d->pad_t, d->dil_t) *
           ps_conv_out(H, d->R, d->stride_h, d->pad_h, d->dil_h) *
           ps_conv_out(W, d->S, d->stride_w, d->pad_w, d->dil_w);
}

// 3-D tensors are fp32 here (see the top): a half-stored operand means a
// 2-D layer's output was fed to a 3-D one, which no model does.
static int refuse_half(ps_cu_state *s, const void *a, const void *b)
{
    if (ps_cu_is_half(s, a) || (b && ps_cu_is_half(s, b))) {
        ps_cu_half_mismatch("conv3d");
        return 1;
    }
    return 0;
}

void ps_cu_conv3d_forward(ps_ctx_t *ctx, float *out, const float *inp, const float *w,
                          const float *b, const ps_conv3d_desc_t *d, int N, int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!ps_conv3d_check("conv3d (cuda)", d, N, D, H, W) || refuse_half(s, inp, NULL)) return;
    ps_cu_conv3d_entry *e = entry3(s, d, N, D, H, W);
    const size_t OPQ = opq(d, D, H, W), DHW = (size_t)D * H * W;
    const int Cg = d->C / d->groups, TRS = d->KT * d->R * d->S;
    if (s->prec != PS_PRECISION_FP32) {
        void *xh = ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * d->C * DHW);
        void *wh = ps_cu_half_buf(s, PS_CU_H_W, (size_t)d->K * Cg * TRS);
        void *yh = ps_cu_half_buf(s, PS_CU_H_Y, (size_t)N * d->K * OPQ);
        ps_cu_to_half(s, xh, inp, N, d->C, (int)DHW, 1); // NCDHW -> NDHWC
        ps_cu_to_half(s, wh, w, d->K, Cg, TRS, 1);       // K,C,TRS -> K,TRS,C
        run_plan(s, e, C3_FWD, xh, wh, yh);
        ps_cu_from_half(s, out, yh, N, d->K, (int)OPQ, 1, 0);
    } else {
        run_plan(s, e, C3_FWD, inp, w, out);
    }
    ps_cu_mark(s, out, 0);
    if (b) {
        const size_t n = (size_t)N * d->K * OPQ;
        k_bias_add3<<<cu_grid(n, CU_BLOCK), CU_BLOCK, 0, s->stream>>>(out, b, n, d->K, OPQ);
        CU_LAUNCHED();
    }
}

void ps_cu_conv3d_backward(ps_ctx_t *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const ps_conv3d_desc_t *d, int N,
                           int D, int H, int W)
{
    ps_cu_state *s = cu_state(ctx);
    if (!ps_conv3d_check("conv3d (cuda)", d, N, D, H, W) || refuse_half(s, inp, dout)) return;
    ps_cu_conv3d_entry *e = entry3(s, d, N, D, H, W);
    const size_t OPQ = opq(d, D, H, W), DHW = (size_t)D * H * W;
    const int Cg = d->C / d->groups, TRS = d->KT * d->R * d->S;
    const size_t nw = (size_t)d->K * Cg * TRS;
    const int half = s->prec != PS_PRECISION_FP32;
    const void *dy = dout;
    if (half) {
        void *dyh = ps_cu_half_buf(s, PS_CU_H_Y, (size_t)N * d->K * OPQ);
        ps_cu_to_half(s, dyh, dout, N, d->K, (int)OPQ, 1);
        dy = dyh;
    }
    if (dw) { // beta 0 into scratch (half: the DW staging buffer), then ADDED
        const void *x = inp;
        if (half) {
            void *xh = ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * d->C * DHW);
            ps_cu_to_half(s, xh, inp, N, d->C, (int)DHW, 1);
            x = xh;
        }
        if (half) {
            void *dwh = ps_cu_half_buf(s, PS_CU_H_DW, nw);
            run_plan(s, e, C3_BWD_FILTER, x, dwh, dy);
            ps_cu_from_half(s, dw, dwh, d->K, Cg, TRS, 1, 1);
        } else {
            float *tmp = (float *)ps_cu_scratch(s, nw * sizeof(float));
            run_plan(s, e, C3_BWD_FILTER, x, tmp, dy);
            ps_cu_accumulate(ctx, dw, tmp, nw);
        }
    }
    if (dinp) { // OVERWRITE (beta 0)
        if (half) {
            void *wh = ps_cu_half_buf(s, PS_CU_H_W, nw);
            void *dxh = ps_cu_half_buf(s, PS_CU_H_X, (size_t)N * d->C * DHW);
            ps_cu_to_half(s, wh, w, d->K, Cg, TRS, 1);
            run_plan(s, e, C3_BWD_DATA, dxh, wh, dy);
            ps_cu_from_half(s, dinp, dxh, N, d->C, (int)DHW, 1, 0);
        } else {
            run_plan(s, e, C3_BWD_DATA, dinp, w, dy);
        }
        ps_cu_mark(s, dinp, 0);
    }
    if (db) ps_cu_channel_sum_acc(s, db, dout, N, d->K, (int)OPQ);
}
