/* The CUDA backend's two rows (worker/engine/cuda/backend_cuda_table.c),
 * in every CUDA build, with or without a GPU:
 *   - ps_backend_cuda fills every required slot (a static table: no GPU
 *     needed), is asynchronous and has its copy_in;
 *   - ps_device_cuda joins the engine's device table;
 *   - without a GPU, "cuda:0" fails cleanly: PS_EINVAL, *be and ctx
 *     untouched, no CUDA call that could abort;
 *   - with one, "cuda:0" opens the CUDA table with its state in ctx, the
 *     events slot makes and frees slots (or says the device cannot hand
 *     gradients over), sync and the memory figures work, release frees
 *     the state; "cuda:N" past the device count is PS_EINVAL. */
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/engine/cuda/ps_cuda_backend.h"
#include "worker/engine/ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>

static void with_gpu(ps_ctx_t *ctx, int ndev)
{
    const ps_backend_t *be = NULL;
    is_int(ps_engine_open_device("cuda:0", ctx, &be), 0, "cuda:0 opens");
    ok(be == &ps_backend_cuda && ctx->backend_state, "... the CUDA table, its state in ctx");
    if (!be) return;
    int rc = be->events(ctx, 3);
    ok(rc == 0 || rc == PS_EUNSUPPORTED, "events(3): %s", rc ? "unsupported here" : "made");
    if (rc == 0) {
        ok(be->event_record(ctx, 2) == 0 && be->event_wait(ctx, 2) == 0 &&
               be->event_query(ctx, 2) == 1,
           "slot 2 recorded, waited for, done");
        is_int(be->events(ctx, 0), 0, "events freed");
    }
    ps_backend_mem_t m;
    ok(be->sync(ctx) == 0 && be->mem_stats(ctx, &m, 1) == 0 && m.dev_total > 0,
       "sync, memory figures (%zu MiB total)", m.dev_total >> 20);
    is_int(be->set_precision(ctx, PS_PRECISION_FP32), 0, "fp32 set");
    is_int(be->set_loss_scale(ctx, 1.0f), 0, "the backend applies the loss scale itself");
    be->release(ctx);
    ok(!ctx->backend_state, "release frees the state");
    ps_arena_set_allocator(NULL);
    char spec[32];
    snprintf(spec, sizeof spec, "cuda:%d", ndev);
    const ps_backend_t *none = NULL;
    ps_log_level = -1;
    is_int(ps_engine_open_device(spec, ctx, &none), PS_EINVAL, "%s (past the count) refused",
           spec);
    ps_log_level = PS_LOG_WARN;
}

int main(void)
{
    ps_log_level = PS_LOG_WARN;
    is_int(ps_engine_check_backend(&ps_backend_cuda), 0, "ps_backend_cuda fills every slot");
    ok(ps_backend_cuda.async == 1 && ps_backend_cuda.copy_in,
       "ps_backend_cuda is asynchronous and has its copy_in");
    is_int(ps_engine_add_device(&ps_device_cuda), 0, "the CUDA row added");
    const ps_device_t *d = NULL;
    int idx = -1;
    is_int(ps_engine_find_device("cuda:1", &d, &idx), 0, "\"cuda:1\" found");
    ok(d == &ps_device_cuda && idx == 1, "... the CUDA row, index 1");
    ps_ctx_t ctx;
    if (ps_engine_init(&ctx, 1)) return 1;
    const int ndev = ps_cuda_device_count();
    if (ndev == 0) {
        const ps_backend_t *be = NULL;
        ps_log_level = -1;
        is_int(ps_engine_open_device("cuda:0", &ctx, &be), PS_EINVAL,
               "cuda:0 without a GPU: PS_EINVAL");
        ps_log_level = PS_LOG_WARN;
        ok(!be && !ctx.backend_state, "... *be and ctx untouched");
    } else {
        with_gpu(&ctx, ndev);
    }
    ps_ctx_free(&ctx);
    return tap_done();
}
