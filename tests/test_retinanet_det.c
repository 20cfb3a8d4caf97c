/* RetinaNet's detection-layer table (ps_retina_det_t, ps_retinanet.h), on
 * the CPU: the default (cfg.det NULL), the explicit ps_retina_det_cpu and a
 * counting table that forwards to the CPU references give bit-identical
 * losses, outputs and every gradient; every entry of a chosen table is
 * actually called (so the model calls none of the CPU functions behind
 * the table's back, which would break the CUDA copy); the losses equal the
 * CPU reference functions called directly on the model's outputs; and a
 * table that does not match the backend ("cuda" layers with the CPU
 * backend) is refused at create with PS_EINVAL, not run.  The CUDA copy
 * itself is compared with the CPU on a GPU by bench/gpu_bench rcheck. */
#include "tests/lib/tap.h"
#include "worker/det/det_layers.h"
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

static void c_upf(ps_ctx_t *x, float *o, const float *l, const float *t, int N, int C, int H,
                  int W, int P, int Q)
{
    calls[UPF]++;
    ps_retina_det_cpu.upsample_add_forward(x, o, l, t, N, C, H, W, P, Q);
}
static void c_upb(ps_ctx_t *x, float *dl, float *dt, const float *d, int N, int C, int H, int W,
                  int P, int Q)
{
    calls[UPB]++;
    ps_retina_det_cpu.upsample_add_backward(x, dl, dt, d, N, C, H, W, P, Q);
}
static int c_cnt(ps_ctx_t *x, const int32_t *l, int A)
{
    calls[CNT]++;
    return ps_retina_det_cpu.count_pos(x, l, A);
}
static int c_focf(ps_ctx_t *x, float *loss, const float *lg, const int32_t *l, float a, float g,
                  float nm, int A, int k)
{
    calls[FOCF]++;
    return ps_retina_det_cpu.focal_forward(x, loss, lg, l, a, g, nm, A, k);
}
static int c_focb(ps_ctx_t *x, float *d, const float *lg, const int32_t *l, float dl, float a,
                  float g, float nm, int A, int k)
{
    calls[FOCB]++;
    return ps_retina_det_cpu.focal_backward(x, d, lg, l, dl, a, g, nm, A, k);
}
static void c_slf(ps_ctx_t *x, float *loss, const float *p, const float *t, const int32_t *l,
                  float b, float nm, int A)
{
    calls[SLF]++;
    ps_retina_det_cpu.smoothl1_forward(x, loss, p, t, l, b, nm, A);
}
static void c_slb(ps_ctx_t *x, float *d, const float *p, const float *t, const int32_t *l,
                  float dl, float b, float nm, int A)
{
    calls[SLB]++;
    ps_retina_det_cpu.smoothl1_backward(x, d, p, t, l, dl, b, nm, A);
}
static void c_pf(ps_ctx_t *x, float *o, const float *i, int nA, int D, int H, int W)
{
    calls[PERMF]++;
    ps_retina_det_cpu.head_permute_forward(x, o, i, nA, D, H, W);
}
static void c_pb(ps_ctx_t *x, float *d, const float *o, int nA, int D, int H, int W)
{
    calls[PERMB]++;
    ps_retina_det_cpu.head_permute_backward(x, d, o, nA, D, H, W);
}
static int c_sync(ps_ctx_t *x)
{
    calls[SYNC]++;
    return ps_retina_det_cpu.sync(x);
}
static const ps_retina_det_t counting = {"cpu", c_upf, c_upb, c_cnt, c_focf, c_focb,
                                         c_slf, c_slb, c_pf,  c_pb,  c_sync};

typedef struct run {
    float lc, lb;
    float *cls, *box, *grad; /* outputs, all gradients concatenated */
    size_t ncls, nbox, ngrad;
} run_t;

static int make(ps_retina_t **m, ps_ctx_t *ctx, const ps_retina_det_t *det)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = 18;
    c.width = 8;
    c.fpn_channels = 16;
    c.num_classes = K;
    c.freeze_at = 0;
    c.det = det;
    return ps_retina_create(m, &c, &ps_backend_cpu, ctx, NIMG, SIZE, SIZE);
}

/* One training step (forward with targets, backward) with table det. */
static int step(run_t *r, ps_ctx_t *ctx, const ps_retina_det_t *det, const float *img,
                int32_t *lab, const float *box)
{
    ps_retina_t *m = NULL;
    memset(r, 0, sizeof *r);
    if (make(&m, ctx, det)) return -1;
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

    ps_retina_t *probe = NULL;
    is_int(make(&probe, &ctx, NULL), 0, "create with the default table");
    int A = probe ? ps_retina_num_anchors(probe) : 1;
    ps_retina_destroy(&probe);
    size_t rows = (size_t)NIMG * A;
    float *img = malloc(sizeof(float) * NIMG * 3 * SIZE * SIZE);
    float *box = malloc(sizeof(float) * rows * 4);
    int32_t *lab = malloc(sizeof(int32_t) * rows);
    if (!img || !box || !lab) return 1;
    ps_model_hash_fill(img, (size_t)NIMG * 3 * SIZE * SIZE, "images", 11, 1.0);
    ps_model_hash_fill(box, rows * 4, "box_targets", 11, 1.0);

    run_t def, cpu, cnt;
    is_int(step(&def, &ctx, NULL, img, lab, box), 0, "default table: training step");
    is_int(step(&cpu, &ctx, &ps_retina_det_cpu, img, lab, box), 0,
           "ps_retina_det_cpu: training step");
    memset(calls, 0, sizeof calls);
    is_int(step(&cnt, &ctx, &counting, img, lab, box), 0, "counting table: training step");
    ok(same(&def, &cpu), "explicit CPU table: losses, outputs, %zu gradients bit-identical",
       def.ngrad);
    ok(same(&def, &cnt), "counting table: bit-identical too");
    ok(def.lc > 0 && def.lb > 0, "both losses positive (cls %g, box %g)", def.lc, def.lb);
    static const char *names[NCALLS] = {"upsample_add_forward", "upsample_add_backward",
                                        "count_pos",            "focal_forward",
                                        "focal_backward",       "smoothl1_forward",
                                        "smoothl1_backward",    "head_permute_forward",
                                        "head_permute_backward", "sync"};
    /* 2 top-down merges each way; 5 levels x 2 heads x NIMG permutes */
    static const int want[NCALLS] = {2, 2, 1, 1, 1, 1, 1, 5 * 2 * NIMG, 5 * 2 * NIMG, 1};
    for (int i = 0; i < NCALLS; i++)
        is_int(calls[i], want[i], "the model calls %s through the table", names[i]);

    /* the table's losses against the references called directly */
    int npos = ps_det_count_pos(lab, (int)rows);
    float norm = npos > 1 ? (float)npos : 1.f, lc = -1, lb = -1;
    ps_det_focal_forward(&lc, def.cls, lab, 0.25f, 2.f, norm, (int)rows, K);
    ps_det_smoothl1_forward(&lb, def.box, box, lab, 1.f / 9.f, norm, (int)rows);
    ok(npos > 1 && !memcmp(&lc, &def.lc, sizeof lc) && !memcmp(&lb, &def.lb, sizeof lb),
       "losses == direct ps_det_focal/smoothl1_forward on the outputs (%d positives)", npos);

    /* a table that does not go with the backend is refused */
    ps_retina_det_t wrong = ps_retina_det_cpu;
    wrong.name = "cuda";
    ps_retina_t *m = NULL;
    ps_log_level = -1;
    int r = make(&m, &ctx, &wrong);
    ps_log_level = PS_LOG_WARN;
    ok(r == PS_EINVAL && !m, "\"cuda\" layers with the CPU backend refused (%d)", r);

    run_free(&def), run_free(&cpu), run_free(&cnt);
    free(img), free(box), free(lab);
    ps_ctx_free(&ctx);
    return tap_done();
}
