/* The engine's device table and the device-control slots of its backend
 * tables (worker/engine/ps_engine.h), on every machine:
 *   - every table the engine ships fills every required slot (the CPU, the
 *     half-rounding reference), and an incomplete one is refused;
 *   - --device strings: "cpu" / "cpu:0" open the CPU table and leave ctx
 *     alone; bad strings, unknown kinds and "cuda" while the table has no
 *     CUDA row (this program adds none) are PS_EINVAL with *be untouched; a
 *     fake row added at run time is found, gets its index and can fail
 *     cleanly; a second row of the same name is refused, the same row
 *     twice is fine;
 *   - the CPU's device-control slots are the documented no-ops: sync 0,
 *     fp32 only, loss scale left to the caller, events always complete, no
 *     memory figures, release nothing;
 *   - the rounding backend's precision and loss scale follow its slots.
 * The CUDA rows are checked by tests/test_cuda_table (CUDA builds). */
#include "tests/lib/tap.h"
#include "worker/engine/backend_half_round.h"
#include "worker/engine/ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>

static int fake_opened, fake_index;

static int fake_open(ps_ctx_t *ctx, int index, const ps_backend_t **be)
{
    fake_opened++;
    fake_index = index;
    if (index == 7) return PS_EUNSUPPORTED; /* "device 7 cannot be used" */
    *be = &ps_backend_cpu;
    return 0;
}
static const ps_device_t fake = {"fake", "a CPU table under another name", fake_open};
static const ps_device_t fake_twin = {"fake", "another row of the same name", fake_open};

static ps_backend_t broken; /* the CPU table less one slot */
static int broken_open(ps_ctx_t *ctx, int index, const ps_backend_t **be)
{
    *be = &broken;
    return 0;
}
static const ps_device_t broken_row = {"broken", NULL, broken_open};

static void tables(void)
{
    is_int(ps_engine_check_backend(&ps_backend_cpu), 0, "ps_backend_cpu fills every slot");
    is_int(ps_engine_check_backend(&ps_backend_cpu_round), 0,
           "ps_backend_cpu_round fills every slot");
    broken = ps_backend_cpu;
    broken.focal_backward = NULL;
    ps_log_level = -1;
    is_int(ps_engine_check_backend(&broken), PS_EINVAL, "a table with an empty slot refused");
    ps_log_level = PS_LOG_WARN;
}

static void specs(ps_ctx_t *ctx)
{
    const ps_backend_t *be = NULL;
    is_int(ps_engine_open_device("cpu", ctx, &be), 0, "\"cpu\" opens");
    ok(be == &ps_backend_cpu && !ctx->backend_state, "... the CPU table, ctx untouched");
    be = NULL;
    is_int(ps_engine_open_device("cpu:0", ctx, &be), 0, "\"cpu:0\" opens");
    ok(be == &ps_backend_cpu, "... the CPU table");
    static const char *const bad[] = {"",      "gpu7",    "cpu:1",  "cuda:",  ":0", "cpu:x",
                                      "cpu:-1", "cpu:0x1", "cpu:99999", "cpu:0:0"};
    ps_log_level = -1;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        be = &ps_backend_cpu_round; /* must stay */
        is_int(ps_engine_open_device(bad[i], ctx, &be), PS_EINVAL, "\"%s\" refused", bad[i]);
        ok(be == &ps_backend_cpu_round && !ctx->backend_state, "... *be and ctx untouched");
    }
    is_int(ps_engine_open_device(NULL, ctx, &be), PS_EINVAL, "NULL spec refused");
    const ps_device_t *d = NULL;
    int idx = -1;
    is_int(ps_engine_find_device("cpu:0", &d, &idx), 0, "find \"cpu:0\"");
    ok(d && !strcmp(d->name, "cpu") && idx == 0, "... the cpu row, index 0");
    is_int(ps_engine_find_device("cuda:0", NULL, NULL), PS_EINVAL,
           "\"cuda:0\" without the CUDA row: PS_EINVAL");
    ps_log_level = PS_LOG_WARN;
}

static void rows(ps_ctx_t *ctx)
{
    const ps_backend_t *be = NULL;
    ps_log_level = -1;
    is_int(ps_engine_find_device("fake:3", NULL, NULL), PS_EINVAL, "\"fake\" unknown before");
    ps_log_level = PS_LOG_WARN;
    is_int(ps_engine_add_device(&fake), 0, "a row added");
    is_int(ps_engine_add_device(&fake), 0, "the same row again: fine");
    ps_log_level = -1;
    is_int(ps_engine_add_device(&fake_twin), PS_EINVAL, "another row named fake refused");
    ps_device_t nameless = {NULL, NULL, fake_open}, colon = {"a:b", NULL, fake_open};
    is_int(ps_engine_add_device(&nameless), PS_EINVAL, "a nameless row refused");
    is_int(ps_engine_add_device(&colon), PS_EINVAL, "a name with ':' refused");
    ps_log_level = PS_LOG_WARN;
    is_int(ps_engine_open_device("fake:3", ctx, &be), 0, "\"fake:3\" opens");
    ok(fake_opened == 1 && fake_index == 3 && be == &ps_backend_cpu,
       "... its open ran once with index 3 and its table came back");
    be = NULL;
    ps_log_level = -1;
    is_int(ps_engine_open_device("fake:7", ctx, &be), PS_EUNSUPPORTED,
           "an open that fails: its error comes back");
    ok(!be, "... *be untouched");
    is_int(ps_engine_add_device(&broken_row), 0, "a row handing out an incomplete table added");
    is_int(ps_engine_open_device("broken", ctx, &be), PS_EINVAL, "... opening it is refused");
    ok(!be, "... *be untouched");
    ps_log_level = PS_LOG_WARN;
}

static void cpu_slots(ps_ctx_t *ctx)
{
    const ps_backend_t *be = &ps_backend_cpu;
    ok(be->async == 0, "cpu: synchronous");
    is_int(be->sync(ctx), 0, "cpu: sync 0");
    is_int(be->set_precision(ctx, PS_PRECISION_FP32), 0, "cpu: fp32 accepted");
    ps_log_level = -1;
    is_int(be->set_precision(ctx, PS_PRECISION_FP16), PS_EUNSUPPORTED, "cpu: fp16 refused");
    is_int(be->set_precision(ctx, PS_PRECISION_BF16), PS_EUNSUPPORTED, "cpu: bf16 refused");
    ps_log_level = PS_LOG_WARN;
    is_int(be->set_loss_scale(ctx, 1024.0f), PS_EUNSUPPORTED, "cpu: the caller scales the loss");
    is_int(be->events(ctx, 4), 0, "cpu: 4 event slots");
    is_int(be->event_record(ctx, 2), 0, "cpu: record");
    is_int(be->event_query(ctx, 2), 1, "cpu: query says done");
    is_int(be->event_wait(ctx, 2), 0, "cpu: wait returns");
    is_int(be->events(ctx, 0), 0, "cpu: events freed");
    ps_backend_mem_t m;
    memset(&m, 0xff, sizeof m);
    is_int(be->mem_stats(ctx, &m, 1), PS_EUNSUPPORTED, "cpu: no device memory figures");
    ok(m.alloc_now == 0 && m.dev_total == 0, "... and the figures zeroed");
    be->release(ctx);
    ok(!ctx->backend_state, "cpu: release leaves ctx alone");
}

static void round_slots(void)
{
    ps_ctx_t ctx;
    const ps_backend_t *be = &ps_backend_cpu_round;
    if (ps_engine_init(&ctx, 1) || ps_hround_init(&ctx, PS_PRECISION_FP32, 1.0f)) {
        ok(0, "rounding backend set up");
        return;
    }
    /* a 1x1 conv with weight 1 writes its input back, rounded as CUDA
     * stores it: 1 + 2^-10 is exact in fp16, not in bf16 */
    const ps_conv2d_desc_t d = {.C = 1, .K = 1, .R = 1, .S = 1, .stride_h = 1, .stride_w = 1,
                                .dil_h = 1, .dil_w = 1, .groups = 1};
    const float x = 1.0f + 1.0f / 1024.0f, w = 1.0f;
    float y16 = 0, y32 = 0, ybf = 0;
    if (ps_ctx_reserve(&ctx, ps_conv2d_workspace(&d, 1, 1, 1))) abort();
    be->conv2d_forward(&ctx, &y32, &x, &w, NULL, &d, 1, 1, 1);
    is_int(be->set_precision(&ctx, PS_PRECISION_FP16), 0, "rounding: fp16 set through the slot");
    be->conv2d_forward(&ctx, &y16, &x, &w, NULL, &d, 1, 1, 1);
    is_int(be->set_precision(&ctx, PS_PRECISION_BF16), 0, "rounding: bf16 set through the slot");
    be->conv2d_forward(&ctx, &ybf, &x, &w, NULL, &d, 1, 1, 1);
    ok(y32 == x && y16 == x && ybf == 1.0f, "rounding: the conv output follows the slot (fp32 "
       "%.9g, fp16 %.9g, bf16 %.9g)", y32, y16, ybf);
    is_int(be->set_loss_scale(&ctx, 1024.0f), 0, "rounding: it applies the loss scale itself");
    ps_log_level = -1;
    is_int(be->set_loss_scale(&ctx, 0.0f), PS_EINVAL, "rounding: loss scale 0 refused");
    is_int(be->set_precision(&ctx, (ps_precision_t)7), PS_EINVAL, "rounding: precision 7 refused");
    is_int(ps_hround_init(&ctx, PS_PRECISION_FP16, 1.0f), PS_ESTATE,
           "rounding: a second init on the same ctx refused");
    ps_log_level = PS_LOG_WARN;
    be->release(&ctx);
    ok(!ctx.backend_state, "rounding: release frees its state");
    ps_ctx_free(&ctx);
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = PS_LOG_WARN;
    if (ps_engine_init(&ctx, 1)) return 1;
    tables();
    specs(&ctx);
    rows(&ctx);
    cpu_slots(&ctx);
    round_slots();
    ps_ctx_free(&ctx);
    return tap_done();
}
