/* The CPU backend's RoIAlign slots (worker/engine/layers/roi_align.c)
 * against torchvision.ops.roi_align (tests/golden/gen_roi_align.py ->
 * roi_align_golden.bin, or the file named by argv[1]: the live check
 * tests/check_roi_align_torch.sh makes one with another seed) and float64
 * finite differences.  Cases: sampling ratio 1, 2, 3 and adaptive (0),
 * non-square bins, aligned=True, boxes partly and wholly off the image,
 * tiny / degenerate / point boxes, boxes many times the image, the
 * detector's shape over three images.
 *
 * Tolerances: forward 1e-6 + 1e-5|ref| (the same float operations in the
 * same order as torchvision's CPU kernel: in practice equal to the bit);
 * backward 1e-6 + 1e-5|ref| (torchvision's scatter order is kept per
 * plane).  Finite differences: the layer is linear in the map, so the
 * central difference with step 1 is exact up to the float rounding of the
 * outputs, summed in double: 1e-4 (relative to the largest gradient). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/golden_io.h"
#include "tests/lib/tap.h"
#include "worker/engine/ps_engine.h"

static ps_ctx_t ctx;
static const ps_backend_t *const be = &ps_backend_cpu;

static golden_rec_t *need(const char *name)
{
    golden_rec_t *r = golden_find(name);
    if (r) return r;
    printf("Bail out! golden record %s missing\n", name);
    exit(1);
}

typedef struct rcase {
    int N, C, H, W, PH, PW, sr, aligned, R;
    float scale;
    const float *feat, *rois, *out, *dout, *dfeat;
} rcase_t;

static rcase_t load_case(const char *c)
{
    char k[64];
#define REC(s) (snprintf(k, sizeof k, "%s.%s", c, s), need(k))
    const int32_t *cfg = REC("cfg")->data;
    rcase_t r = {.N = cfg[0], .C = cfg[1], .H = cfg[2], .W = cfg[3], .PH = cfg[4], .PW = cfg[5],
                 .sr = cfg[6], .aligned = cfg[7], .R = cfg[8],
                 .scale = ((const float *)REC("scale")->data)[0],
                 .feat = REC("feat")->data, .rois = REC("rois")->data, .out = REC("out")->data,
                 .dout = REC("dout")->data, .dfeat = REC("dfeat")->data};
#undef REC
    return r;
}

static float *nans(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static void fwd(const rcase_t *r, float *out, const float *feat)
{
    be->roi_align_forward(&ctx, out, feat, r->rois, r->R, r->N, r->C, r->H, r->W, r->PH, r->PW,
                          r->scale, r->sr, r->aligned);
}

static double dot_out(const rcase_t *r, float *out, const float *feat, size_t no)
{
    fwd(r, out, feat);
    double s = 0;
    for (size_t i = 0; i < no; i++) s += (double)out[i] * r->dout[i];
    return s;
}

/* central differences of sum(out * dout) at a sample of map positions */
static void finite_differences(const char *c, const rcase_t *r, const float *dfeat)
{
    size_t nf = (size_t)r->N * r->C * r->H * r->W, no = (size_t)r->R * r->C * r->PH * r->PW;
    float *f = malloc(nf * sizeof *f), *out = malloc(no * sizeof *out);
    memcpy(f, r->feat, nf * sizeof *f);
    double gmax = 0, worst = 0;
    for (size_t i = 0; i < nf; i++) gmax = fmax(gmax, fabs(dfeat[i]));
    int checked = 0, bad = 0;
    for (size_t i = 0; i < nf; i += 1 + nf / 97) {
        float v = f[i];
        f[i] = v + 1.0f;
        double lp = dot_out(r, out, f, no);
        f[i] = v - 1.0f;
        double lm = dot_out(r, out, f, no);
        f[i] = v;
        double e = fabs((lp - lm) / 2.0 - dfeat[i]);
        worst = fmax(worst, e);
        bad += e > 1e-4 * (gmax > 1 ? gmax : 1);
        checked++;
    }
    ok(bad == 0, "%s: gradient vs central differences at %d map positions (worst %.2g, max "
       "|grad| %.3g)", c, checked, worst, gmax);
    free(f);
    free(out);
}

static void check_case(const char *c, int fd)
{
    rcase_t r = load_case(c);
    size_t nf = (size_t)r.N * r.C * r.H * r.W, no = (size_t)r.R * r.C * r.PH * r.PW;
    float *out = nans(no), *dfeat = calloc(nf ? nf : 1, sizeof *dfeat);
    fwd(&r, out, r.feat);
    allclose(out, r.out, (long)no, 1e-6, 1e-5, c);
    be->roi_align_backward(&ctx, dfeat, r.dout, r.rois, r.R, r.N, r.C, r.H, r.W, r.PH, r.PW,
                           r.scale, r.sr, r.aligned);
    char what[96];
    snprintf(what, sizeof what, "%s backward", c);
    allclose(dfeat, r.dfeat, (long)nf, 1e-6, 1e-5, what);
    if (fd) finite_differences(c, &r, dfeat);
    free(out);
    free(dfeat);
}

/* backward accumulates; a bad batch index gives zero rows and no gradient;
 * R = 0 touches nothing */
static void check_contract(void)
{
    rcase_t r = load_case("det");
    size_t nf = (size_t)r.N * r.C * r.H * r.W, bins = (size_t)r.C * r.PH * r.PW;
    float *dfeat = malloc(nf * sizeof *dfeat), *two = malloc(nf * sizeof *two);
    memcpy(dfeat, r.dfeat, nf * sizeof *dfeat);
    be->roi_align_backward(&ctx, dfeat, r.dout, r.rois, r.R, r.N, r.C, r.H, r.W, r.PH, r.PW,
                           r.scale, r.sr, r.aligned);
    for (size_t i = 0; i < nf; i++) two[i] = 2 * r.dfeat[i];
    allclose(dfeat, two, (long)nf, 1e-5, 1e-5, "backward accumulates into dfeat (+=)");

    float rois[2 * 5] = {(float)r.N, 4, 4, 40, 40, -1, 4, 4, 40, 40};
    float *out = nans(2 * bins), *g = malloc(2 * bins * sizeof *g);
    for (size_t i = 0; i < 2 * bins; i++) g[i] = 1.0f;
    be->roi_align_forward(&ctx, out, r.feat, rois, 2, r.N, r.C, r.H, r.W, r.PH, r.PW, r.scale,
                          r.sr, r.aligned);
    int zero = 1;
    for (size_t i = 0; i < 2 * bins; i++) zero &= out[i] == 0.0f;
    ok(zero, "batch index N and -1: zero rows");
    memset(dfeat, 0, nf * sizeof *dfeat);
    be->roi_align_backward(&ctx, dfeat, g, rois, 2, r.N, r.C, r.H, r.W, r.PH, r.PW, r.scale,
                           r.sr, r.aligned);
    zero = 1;
    for (size_t i = 0; i < nf; i++) zero &= dfeat[i] == 0.0f;
    ok(zero, "batch index N and -1: no gradient");
    out[0] = 7.0f;
    be->roi_align_forward(&ctx, out, r.feat, rois, 0, r.N, r.C, r.H, r.W, r.PH, r.PW, r.scale,
                          r.sr, r.aligned);
    ok(out[0] == 7.0f, "R = 0 writes nothing");
    free(dfeat), free(two), free(out), free(g);
}

int main(int argc, char **argv)
{
    ps_engine_init(&ctx, 2);
    if (argc > 1) {
        if (golden_load(argv[1], 400)) {
            printf("Bail out! cannot load %s\n", argv[1]);
            return 1;
        }
    } else {
        golden_load_or_bail("tests/golden/roi_align_golden.bin", 400);
    }
    static const struct {
        const char *name;
        int fd;
    } cases[] = {{"sr2", 1},      {"sr1", 0},      {"sr3", 0},      {"sr0", 1},
                 {"rect", 0},     {"aligned", 0},  {"aligned0", 1}, {"off", 1},
                 {"off0", 0},     {"tiny20", 1},   {"tiny00", 0},   {"tiny21", 0},
                 {"tiny01", 1},   {"huge2", 0},    {"huge0", 1},    {"det", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(cases[i].name, cases[i].fd);
    check_contract();
    golden_free();
    ps_ctx_free(&ctx);
    return tap_done();
}
