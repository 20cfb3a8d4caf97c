// The CUDA backend's life cycle and device control: handles, the stream,
// the bounded cuDNN workspace, completion events, managed arenas and the
// device memory counters.  The table itself (ps_backend_cuda) and the
// device row are filled by slot name in backend_cuda_table.c.
//
// Why these APIs (also docs/cuda.md):
//  - Convolution: cuDNN's legacy descriptor API (cudnnConvolutionForward /
//    BackwardData / BackwardFilter, algorithms from the _v7 heuristics,
//    chosen once per shape and cached, workspace bounded).  It is deprecated
//    in cuDNN 9 but present and stable, covers every case the CPU reference
//    has (groups, dilation, asymmetric stride/pad) in one call, and needs
//    ~150 lines; its pure-FP32 FMA math keeps fp32 results at the CPU
//    reference's.  The graph (backend) API is the supported path and the
//    one that pays for FP16/BF16 NHWC: conv + bias + relu fusion, runtime
//    fusion engines.  fp16/bf16 (mixed.cu) deliberately still use the
//    legacy calls with half NHWC descriptors (reason: docs/cuda.md); the
//    graph API comes with conv+BN+ReLU fusion.
//  - Batchnorm, pooling, activations: own kernels, not cuDNN.  cuDNN's
//    legacy BN/pooling calls are deprecated too, pooling cannot return the
//    argmax the table's contract saves, and the contract's details (NULL
//    gamma = affine off, frozen BN without dgamma/dbeta, parameter gradients
//    ACCUMULATED) are exact in twenty lines of kernel each.
//  - Linear: cuBLAS sgemm in its default (pure FP32, no TF32) math mode.
//  - TF32 is off everywhere (cuDNN FMA math, cuBLAS default math) so fp32
//    results match the CPU to ~1e-6 relative; a TF32 switch for speed is a
//    one-line change per library, left for the precision option.
#include "cuda_int.h"

extern "C" {
#include "worker/engine/cuda/ps_cuda.h"
}

#include <stdio.h>
#include <string.h>

#include <atomic>

// ---- device memory accounting -------------------------------------------
// Every device allocation the backend makes goes through these counters:
// the managed arenas, the cuDNN workspace, the reduction scratch.  cuDNN's
// and cuBLAS's own allocations (handles, cuBLAS workspace) and the CUDA
// context are not in them; the cudaMemGetInfo figures below include them
// (and any other process on the device).
static std::atomic<size_t> g_alloc_now{0}, g_alloc_peak{0}, g_used_peak{0};

static void mem_add(size_t bytes)
{
    size_t now = g_alloc_now.fetch_add(bytes) + bytes;
    size_t pk = g_alloc_peak.load();
    while (now > pk && !g_alloc_peak.compare_exchange_weak(pk, now)) {
    }
}
static void mem_sub(size_t bytes) { g_alloc_now.fetch_sub(bytes); }

void ps_cu_mem_account(long long delta)
{
    if (delta >= 0) mem_add((size_t)delta);
    else mem_sub((size_t)-delta);
}

void ps_cu_fail_(const char *what, const char *err, const char *file, int line)
{
    ps_error("%s:%d: %s failed: %s (CUDA fault, aborting)", file, line, what, err);
    abort();
}

void *ps_cu_scratch(ps_cu_state *s, size_t bytes)
{
    if (bytes > s->scratch_bytes) {
        // the stream may still use the old buffer
        CU_CHECK(cudaStreamSynchronize(s->stream));
        if (s->scratch) CU_CHECK(cudaFree(s->scratch));
        mem_sub(s->scratch_bytes);
        s->scratch = NULL;
        s->scratch_bytes = 0;
        size_t want = bytes < 4096 ? 4096 : bytes;
        CU_CHECK(cudaMalloc(&s->scratch, want));
        s->scratch_bytes = want;
        mem_add(want);
    }
    return s->scratch;
}

void *ps_cu_workspace(ps_cu_state *s, size_t bytes)
{
    if (bytes == 0) return NULL;
    if (bytes > s->ws_bytes) {
        CU_CHECK(cudaStreamSynchronize(s->stream));
        if (s->ws) CU_CHECK(cudaFree(s->ws));
        mem_sub(s->ws_bytes);
        s->ws = NULL;
        s->ws_bytes = 0;
        CU_CHECK(cudaMalloc(&s->ws, bytes));
        s->ws_bytes = bytes;
        mem_add(bytes);
    }
    return s->ws;
}

extern "C" int ps_cuda_backend_init(ps_ctx_t *ctx, int dev)
{
    if (!ctx) return PS_EINVAL;
    if (ctx->backend_state) {
        ps_error("ps_cuda_backend_init: context already has a backend state");
        return PS_ESTATE;
    }
    ps_cu_state *s = (ps_cu_state *)calloc(1, sizeof *s);
    if (!s) return PS_ENOMEM;
    s->device = dev;
    s->prec = PS_PRECISION_FP32;
    s->loss_scale = 1.0f;
    s->ws_limit = (size_t)512 << 20;
    const char *e = getenv("PS_CUDNN_WORKSPACE_MB");
    if (e && atol(e) > 0) s->ws_limit = (size_t)atol(e) << 20;
    int rc = PS_ECUDA;
    cudaError_t ce;
    cudnnStatus_t ds;
    cublasStatus_t bs;
    if ((ce = cudaSetDevice(dev)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        ps_error("cuda:%d: %s", dev, cudaGetErrorString(ce));
        goto fail;
    }
    if ((ds = cudnnCreate(&s->cudnn)) != CUDNN_STATUS_SUCCESS ||
        (ds = cudnnSetStream(s->cudnn, s->stream)) != CUDNN_STATUS_SUCCESS) {
        ps_error("cuda:%d: cuDNN: %s", dev, cudnnGetErrorString(ds));
        goto fail;
    }
    if ((bs = cublasCreate(&s->cublas)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetStream(s->cublas, s->stream)) != CUBLAS_STATUS_SUCCESS ||
        // pure FP32 (no TF32) so the fp32 backend matches the CPU reference
        (bs = cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        ps_error("cuda:%d: cuBLAS: %s", dev, cublasGetStatusString(bs));
        goto fail;
    }
    ctx->backend_state = s;
    ps_info("CUDA backend on cuda:%d (cuDNN %zu, workspace limit %zu MiB)", dev,
            (size_t)cudnnGetVersion(), s->ws_limit >> 20);
    return 0;
fail:
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->cudnn) cudnnDestroy(s->cudnn);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
    return rc;
}

extern "C" void ps_cuda_backend_free(ps_ctx_t *ctx)
{
    if (!ctx || !ctx->backend_state) return;
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    cudaStreamSynchronize(s->stream);
    ps_cu_conv_free(s);
    ps_cu_conv3d_free(s);
    if (s->ws) cudaFree(s->ws);
    if (s->scratch) cudaFree(s->scratch);
    mem_sub(s->ws_bytes + s->scratch_bytes);
    for (int i = 0; i < PS_CU_NHALF; i++) {
        if (s->half[i]) cudaFree(s->half[i]);
        mem_sub(s->half_bytes[i]);
    }
    for (int i = 0; i < s->nev; i++) cudaEventDestroy(s->ev[i]);
    free(s->ev);
    ps_cu_hset_free(s);
    cublasDestroy(s->cublas);
    cudnnDestroy(s->cudnn);
    cudaStreamDestroy(s->stream);
    free(s);
    ctx->backend_state = NULL;
}

extern "C" int ps_cuda_backend_sync(ps_ctx_t *ctx)
{
    if (!ctx || !ctx->backend_state) return PS_EINVAL;
    CU_RET(cudaStreamSynchronize(((ps_cu_state *)ctx->backend_state)->stream));
    return 0;
}

extern "C" void *ps_cuda_backend_stream(ps_ctx_t *ctx)
{
    return ctx && ctx->backend_state ? (void *)((ps_cu_state *)ctx->backend_state)->stream
                                     : NULL;
}

// ---- completion events ------------------------------------------------------
// Timing off: such events are the cheap kind (no timestamp), and a query /
// synchronise on them is all the communication thread needs.

// The host reads a gradient (after its event) and writes the next layers'
// weights in the managed arena while kernels run: that needs concurrent
// managed access (Linux, Pascal and later); without it the host would fault
// on pages the GPU holds, so there is no hand-off to make events for.
static int concurrent_managed(const ps_cu_state *s)
{
    int cma = 0;
    CU_RET(cudaDeviceGetAttribute(&cma, cudaDevAttrConcurrentManagedAccess, s->device));
    if (!cma) {
        ps_info("cuda:%d has no concurrent managed access: the host cannot read gradients "
                "while kernels run, so no completion events", s->device);
        return PS_EUNSUPPORTED;
    }
    return 0;
}

extern "C" int ps_cuda_backend_events(ps_ctx_t *ctx, int n)
{
    if (!ctx || !ctx->backend_state || n < 0 || n > 65536) return PS_EINVAL;
    ps_cu_state *s = (ps_cu_state *)ctx->backend_state;
    for (int i = 0; i < s->nev; i++) cudaEventDestroy(s->ev[i]);
    free(s->ev);
    s->ev = NULL;
    s->nev = 0;
    if (n == 0) return 0;
    const int rc = concurrent_managed(s);
    if (rc) return rc;
    s->ev = (cudaEvent_t *)calloc((size_t)n, sizeof *s->ev);
    if (!s->ev) return PS_ENOMEM;
    for (int i = 0; i < n; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&s->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            ps_error("cudaEventCreateWithFlags (%d of %d): %s", i, n, cudaGetErrorString(e));
            for (int k = 0; k < i; k++) cudaEventDestroy(s->ev[k]);
            free(s->ev);
            s->ev = NULL;
            return PS_ECUDA;
        }
    }
    s->nev = n;
    return 0;
}

static cudaEvent_t ev_of(ps_ctx_t *ctx, int slot)
{
    ps_cu_state *s = ctx ? (ps_cu_state *)ctx->backend_state : NULL;
    if (!s || slot < 0 || slot >= s->nev) {
        ps_error("event slot %d out of range (%d made)", slot, s ? s->nev : 0);
        return NULL;
    }
    return s->ev[slot];
}

extern "C" int ps_cuda_backend_event_record(ps_ctx_t *ctx, int slot)
{
    cudaEvent_t e = ev_of(ctx, slot);
    if (!e) return PS_EINVAL;
    CU_RET(cudaEventRecord(e, ((ps_cu_state *)ctx->backend_state)->stream));
    return 0;
}

extern "C" int ps_cuda_backend_event_query(ps_ctx_t *ctx, int slot)
{
    cudaEvent_t e = ev_of(ctx, slot);
    if (!e) return PS_EINVAL;
    cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return 1;
    if (r == cudaErrorNotReady) return 0;
    ps_error("cudaEventQuery(slot %d): %s", slot, cudaGetErrorString(r));
    return PS_ECUDA;
}

extern "C" int ps_cuda_backend_event_wait(ps_ctx_t *ctx, int slot)
{
    cudaEvent_t e = ev_of(ctx, slot);
    if (!e) return PS_EINVAL;
    CU_RET(cudaEventSynchronize(e));
    return 0;
}

extern "C" void ps_cuda_backend_set_workspace_limit(ps_ctx_t *ctx, size_t bytes)
{
    if (ctx && ctx->backend_state) ((ps_cu_state *)ctx->backend_state)->ws_limit = bytes;
}

extern "C" int ps_cuda_backend_conv_shapes(ps_ctx_t *ctx)
{
    return ctx && ctx->backend_state ? ((ps_cu_state *)ctx->backend_state)->nconv : 0;
}

// ---- managed arenas ------------------------------------------------------

// The live managed arenas and their sizes (a model has one or two), so a
// free can be subtracted from the counters.
#define MANAGED_MAX 64
static struct {
    void *p;
    size_t bytes;
} g_managed[MANAGED_MAX];
static std::atomic<int> g_managed_lock{0};

static void managed_note(void *p, size_t bytes)
{
    while (g_managed_lock.exchange(1)) {
    }
    int i;
    for (i = 0; i < MANAGED_MAX; i++) {
        if (bytes && !g_managed[i].p) { // add
            g_managed[i].p = p, g_managed[i].bytes = bytes;
            mem_add(bytes);
            break;
        }
        if (!bytes && g_managed[i].p == p) { // remove
            mem_sub(g_managed[i].bytes);
            g_managed[i].p = NULL, g_managed[i].bytes = 0;
            break;
        }
    }
    g_managed_lock.store(0);
    if (bytes && i == MANAGED_MAX) // only the accounting suffers
        ps_warn("more than %d managed arenas: device memory figures undercount", MANAGED_MAX);
}

static void *managed_alloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
    if (e != cudaSuccess) {
        ps_error("cudaMallocManaged(%zu bytes): %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    // zero on the device: gradients start at 0 and the pages start there
    e = cudaMemset(p, 0, bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        ps_error("cudaMemset(managed, %zu bytes): %s", bytes, cudaGetErrorString(e));
        cudaFree(p);
        return NULL;
    }
    managed_note(p, bytes);
    return p;
}

static void managed_free(void *p)
{
    if (!p) return;
    cudaDeviceSynchronize(); // kernels may still read the arena
    managed_note(p, 0);
    cudaFree(p);
}

extern "C" int ps_cuda_use_managed_arena(void)
{
    int dev = 0, managed = 0;
    CU_RET(cudaGetDevice(&dev));
    CU_RET(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
    if (!managed) {
        ps_error("cuda:%d has no managed memory support", dev);
        return PS_EUNSUPPORTED;
    }
    static const ps_arena_allocator_t al = {managed_alloc, managed_free};
    ps_arena_set_allocator(&al);
    return 0;
}

extern "C" int ps_cuda_prefetch(const void *p, size_t bytes, void *stream)
{
    int dev = 0;
    CU_RET(cudaGetDevice(&dev));
    cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = dev;
    CU_RET(cudaMemPrefetchAsync(p, bytes, loc, 0, (cudaStream_t)stream));
    return 0;
}

extern "C" int ps_cuda_device_sync(void)
{
    CU_RET(cudaDeviceSynchronize());
    return 0;
}

extern "C" size_t ps_cuda_mem_used(void)
{
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return tot - fr;
}

extern "C" int ps_cuda_backend_mem_stats(ps_ctx_t *ctx, ps_backend_mem_t *m, int reset_peak)
{
    (void)ctx; // the counters are process-wide
    if (!m) return PS_EINVAL;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        fr = tot = 0;
    }
    size_t used = tot - fr, pk = g_used_peak.load();
    while (used > pk && !g_used_peak.compare_exchange_weak(pk, used)) {
    }
    m->alloc_now = g_alloc_now.load();
    m->alloc_peak = g_alloc_peak.load();
    m->dev_used = used;
    m->dev_used_peak = g_used_peak.load();
    m->dev_total = tot;
    if (reset_peak) {
        g_alloc_peak.store(g_alloc_now.load());
        g_used_peak.store(0);
    }
    return 0;
}
