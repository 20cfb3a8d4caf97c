/* RetinaNet's detection layers through the backend table, on the CPU: a
 * counting copy of ps_backend_cpu (each detection slot, and sync, counts
 * its calls and forwards to the CPU's) gives losses, outputs and every
 * gradient bit-identical to ps_backend_cpu itself; every detection slot is
 * actually called the expected number of times (so the model calls none
 * of the CPU functions behind the table's back, which would break the
 * CUDA backend); and the losses equal the CPU slots called directly on the
 * model's outputs.  Host detection layers cannot meet a device backend's
 * pointers: the model takes every layer from its one backend table, so
 * there is no mix to refuse (and none to test).  The CUDA table's detection
 * slots are compared with the CPU on a GPU by tests/test_cuda_det and
 * bench/gpu_bench rcheck. */
#include "tests/lib/tap.h"
#include "worker/engine/ps_engine.h"
#include "worker/models/ps_retinanet.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>

#define NIMG 2
#define SIZE 64
#define K 3

enum { UPF, UPB, CNT, FOCF, FOCB, SLF, SLB, PERMF, PERMB, SYNC, NCALLS };
static int calls[NCALLS];
static const ps_backend_t *const cpu = &ps_backend_cpu;

static void c_upf(ps_ctx_t *x, float *o, const float *l, const float *t, int N, int C, int H,
                  int W, int P, int Q)
{
    calls[UPF]++;
    cpu->upsample_add_forward(x, o, l, t, N, C, H, W, P, Q);
}
static void c_upb(ps_ctx_t *x, float *dl, float *dt, const float *d, int N, int C, int H, int W,
                  int P, int Q)
{
    calls[UPB]++;
    cpu->upsample_add_backward(x, dl, dt, d, N, C, H, W, P, Q);
}
static int c_cnt(ps_ctx_t *x, const int32_t *l, int A)
{
    calls[CNT]++;
    return cpu->count_pos(x, l, A);
}
static int c_focf(ps_ctx_t *x, float *loss, const float *lg, const int32_t *l, float a, float g,
                  float nm, int A, int k)
{
    calls[FOCF]++;
    return cpu->focal_forward(x, loss, lg, l, a, g, nm, A, k);
}
static int c_focb(ps_ctx_t *x, float *d, const float *lg, const int32_t *l, float dl, float a,
                  float g, float nm, int A, int k)
{
    calls[FOCB]++;
    return cpu->focal_backward(x, d, lg, l, dl, a, g, nm, A, k);
}
static void c_slf(ps_ctx_t *x, float *loss, const float *p, const float *t, const int32_t *l,
                  float b, float nm, int A)
{
    calls[SLF]++;
    cpu->smoothl1_forward(x, loss, p, t, l, b, nm, A);
}
static void c_slb(ps_ctx_t *x, float *d, const float *p, const float *t, const int32_t *l,
                  float dl, float b, float nm, int A)
{
    calls[SLB]++;
    cpu->smoothl1_backward(x, d, p, t, l, dl, b, nm, A);
}
static void c_pf(ps_ctx_t *x, float *o, const float *i, int nA, int D, int H, int W)
{
    calls[PERMF]++;
    cpu->head_permute_forward(x, o, i, nA, D, H, W);
}
static void c_pb(ps_ctx_t *x, float *d, const float *o, int nA, int D, int H, int W)
{
    calls[PERMB]++;
    cpu->head_permute_backward(x, d, o, nA, D, H, W);
}
static int c_sync(ps_ctx_t *x)
{
    calls[SYNC]++;
    return cpu->sync(x);
}

/* ps_backend_cpu with the detection slots and sync counting */
static ps_backend_t counting;
static void counting_init(void)
{
    counting = ps_backend_cpu;
    counting.name = "cpu-counting";
    counting.upsample_add_forward = c_upf;
    counting.upsample_add_backward = c_upb;
    counting.count_pos = c_cnt;
    counting.focal_forward = c_focf;
    counting.focal_backward = c_focb;
    counting.smoothl1_forward = c_slf;
    counting.smoothl1_backward = c_slb;
    counting.head_permute_forward = c_pf;
    counting.head_permute_backward = c_pb;
    counting.sync = c_sync;
}

typedef struct run {
    float lc, lb;
    float *cls, *box, *grad; /* outputs, all gradients concatenated */
    size_t ncls, nbox, ngrad;
} run_t;

static int make(ps_retina_t **m, ps_ctx_t *ctx, const ps_backend_t *be)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = 18;
    c.width = 8;
    c.fpn_channels = 16;
    c.num_classes = K;
    c.freeze_at = 0;
    return ps_retina_create(m, &c, be, ctx, NIMG, SIZE, SIZE);
}

/* One training step (forward with targets, backward) on backend be. */
static int step(run_t *r, ps_ctx_t *ctx, const ps_backend_t *be, const float *img, int32_t *lab,
                const float *box)
{
    ps_retina_t *m = NULL;
    memset(r, 0, sizeof *r);
    if (make(&m, ctx, be)) return -1;
    ps_retina_init(m, 7, 1);
    int A = ps_retina_num_anchors(m), rows = NIMG * A;
    /* labels: a fixed mix of ignore / background / each class */
    for (int i = 0; i < rows; i++) {
        int v = i * 7919 % 13 - 1;
        lab[i] = v <= K ? v : 0;
    }
    int rc = ps_retina_forward(m, img, NIMG, lab, box, 1, &r->lc, &r->lb);
    if (!rc) rc = ps_retina_backward(m);
    int np;
    const ps_model_param_t *p = ps_retina_params(m, &np);
    for (int i = 0; i < np; i++) r->ngrad += p[i].numel;
    r->ncls = (size_t)rows * K;
    r->nbox = (size_t)rows * 4;
    r->cls = malloc(r->ncls * sizeof(float));
    r->box = malloc(r->nbox * sizeof(float));
    r->grad = malloc(r->ngrad * sizeof(float));
    if (!rc && r->cls && r->box && r->grad) {
        memcpy(r->cls, ps_retina_cls_out(m), r->ncls * sizeof(float));
        memcpy(r->box, ps_retina_box_out(m), r->nbox * sizeof(float));
        size_t off = 0;
        for (int i = 0; i < np; i++) {
            memcpy(r->grad + off, p[i].g, p[i].numel * sizeof(float));
            off += p[i].numel;
        }
    } else if (!rc) {
        rc = PS_ENOMEM;
    }
    ps_retina_destroy(&m);
    return rc;
}

static void run_free(run_t *r) { free(r->cls), free(r->box), free(r->grad); }

static int same(const run_t *a, const run_t *b)
{
    if (memcmp(&a->lc, &b->lc, sizeof a->lc) || memcmp(&a->lb, &b->lb, sizeof a->lb))
        diag("losses differ: %.9g %.9g vs %.9g %.9g", a->lc, a->lb, b->lc, b->lb);
    else if (memcmp(a->cls, b->cls, a->ncls * sizeof(float)) ||
             memcmp(a->box, b->box, a->nbox * sizeof(float)))
        diag("outputs differ");
    else if (a->ngrad == b->ngrad)
        for (size_t i = 0; i < a->ngrad; i++)
            if (memcmp(&a->grad[i], &b->grad[i], sizeof(float))) {
                diag("gradient %zu of %zu differs: %.9g vs %.9g", i, a->ngrad, a->grad[i],
                     b->grad[i]);
                break;
            }
    return a->ngrad == b->ngrad && !memcmp(&a->lc, &b->lc, sizeof a->lc) &&
           !memcmp(&a->lb, &b->lb, sizeof a->lb) &&
           !memcmp(a->cls, b->cls, a->ncls * sizeof(float)) &&
           !memcmp(a->box, b->box, a->nbox * sizeof(float)) &&
           !memcmp(a->grad, b->grad, a->ngrad * sizeof(float));
}

int main(void)
{
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 1); /* one thread: threaded GEMMs sum in a varying order */
    ps_log_level = PS_LOG_WARN;
    counting_init();
    is_int(ps_engine_check_backend(&counting), 0, "the counting copy is a complete table");

    ps_retina_t *probe = NULL;
    is_int(make(&probe, &ctx, cpu), 0, "create on the CPU backend");
    int A = probe ? ps_retina_num_anchors(probe) : 1;
    ps_retina_destroy(&probe);
    size_t rows = (size_t)NIMG * A;
    float *img = malloc(sizeof(float) * NIMG * 3 * SIZE * SIZE);
    float *box = malloc(sizeof(float) * rows * 4);
    int32_t *lab = malloc(sizeof(int32_t) * rows);
    if (!img || !box || !lab) return 1;
    ps_model_hash_fill(img, (size_t)NIMG * 3 * SIZE * SIZE, "images", 11, 1.0);
    ps_model_hash_fill(box, rows * 4, "box_targets", 11, 1.0);

    run_t ref, cnt;
    is_int(step(&ref, &ctx, cpu, img, lab, box), 0, "ps_backend_cpu: training step");
    memset(calls, 0, sizeof calls);
    is_int(step(&cnt, &ctx, &counting, img, lab, box), 0, "counting table: training step");
    ok(same(&ref, &cnt), "counting table: losses, outputs, %zu gradients bit-identical",
       ref.ngrad);
    ok(ref.lc > 0 && ref.lb > 0, "both losses positive (cls %g, box %g)", ref.lc, ref.lb);
    static const char *names[NCALLS] = {"upsample_add_forward", "upsample_add_backward",
                                        "count_pos",            "focal_forward",
                                        "focal_backward",       "smoothl1_forward",
                                        "smoothl1_backward",    "head_permute_forward",
                                        "head_permute_backward", "sync"};
    /* 2 top-down merges each way; 5 levels x 2 heads x NIMG permutes; one
     * sync before the host writes the labels */
    static const int want[NCALLS] = {2, 2, 1, 1, 1, 1, 1, 5 * 2 * NIMG, 5 * 2 * NIMG, 1};
    for (int i = 0; i < NCALLS; i++)
        is_int(calls[i], want[i], "the model calls %s through the table", names[i]);

    /* the model's losses against the slots called directly on its outputs */
    int npos = cpu->count_pos(&ctx, lab, (int)rows);
    float norm = npos > 1 ? (float)npos : 1.f, lc = -1, lb = -1;
    cpu->focal_forward(&ctx, &lc, ref.cls, lab, 0.25f, 2.f, norm, (int)rows, K);
    cpu->smoothl1_forward(&ctx, &lb, ref.box, box, lab, 1.f / 9.f, norm, (int)rows);
    ok(npos > 1 && !memcmp(&lc, &ref.lc, sizeof lc) && !memcmp(&lb, &ref.lb, sizeof lb),
       "losses == focal/smoothl1_forward called directly on the outputs (%d positives)", npos);

    run_free(&ref), run_free(&cnt);
    free(img), free(box), free(lab);
    ps_ctx_free(&ctx);
    return tap_done();
}
