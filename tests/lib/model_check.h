/* Helpers of the whole-model tests against PyTorch goldens (test_resnet,
 * test_retinanet, test_model_io): where the goldens are, the deterministic
 * gradient sample both sides draw, the comparison of one "grad" line (the
 * tolerances are explained in tests/test_resnet.c) and a plain SGD step
 * over a parameter table.  Header-only like tests/lib/tap.h: each test is one
 * program. */
#ifndef PS_MODEL_CHECK_H
#define PS_MODEL_CHECK_H

#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"

#include "ps_optim.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s && *s ? s : ".";
}

/* Index of the j-th sampled element of a tensor: gen_resnet.py's
 * sample_index() (same hash). */
static inline uint64_t sample_index(const char *name, size_t numel, int j)
{
    uint64_t key = ps_model_fnv1a64(name) ^ 0x5A4D504C45ull;
    uint64_t k = (uint64_t)(ps_rng_uniform(key, (uint64_t)j) * 16777216.0f);
    return (k * numel) >> 24;
}

static inline double l2(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return sqrt(s);
}

/* " idx:val idx:val ..." against out[numel], |out-val| <= 1e-4 + 1e-3|val|;
 * returns the number of mismatches (each diagnosed), *cnt the pairs read. */
static inline int check_sample_list(const char *s, const float *out, size_t numel,
                                    const char *vname, const char *what, int *cnt)
{
    int bad = 0, n = 0;
    long idx;
    float val;
    int used;
    while (sscanf(s, " %ld:%f%n", &idx, &val, &used) == 2) {
        s += used;
        n++;
        if (idx < 0 || (size_t)idx >= numel || !(fabs(out[idx] - val) <= 1e-4 + 1e-3 * fabs(val))) {
            bad++;
            diag("%s: %s[%ld] = %.9g, PyTorch %.9g", vname, what, idx,
                 idx >= 0 && (size_t)idx < numel ? out[idx] : NAN, val);
        }
    }
    if (cnt) *cnt = n;
    return bad;
}

/* Relative slack of the norm check below (2e-3 unless a test states why
 * it needs more). */
static double model_check_norm_slack = 2e-3;

/* One golden line "grad NAME numel norm noise_max noise_p90 noise_n idx:val
 * ..." (off: where the samples start) against parameter p's gradient:
 *   norm within model_check_norm_slack + 3*noise_n (relative);
 *   >= 80% of the samples within 1e-2*|ref| + (2e-3 + 3*noise_p90)*rms;
 *   every sample within 1e-2*|ref| + (0.25 + 3*noise_max)*rms.
 * Returns the number of failures (each diagnosed); *ref_norm gets the
 * golden norm, or -1 when the element counts differ; the worst relative
 * norm error and the worst element error (in rms) are kept. */
static inline int check_grad_line(const char *vname, const char *name, const char *line, int off,
                                  const ps_model_param_t *p, double *ref_norm_out,
                                  double *worst_norm, double *worst_elem)
{
    int bad = 0;
    size_t numel;
    double ref_norm, noise_max, noise_p90, noise_n;
    *ref_norm_out = -1;
    sscanf(line, "grad %*s %zu %lf %lf %lf %lf", &numel, &ref_norm, &noise_max, &noise_p90,
           &noise_n);
    if (numel != p->numel) {
        diag("%s: %s has %zu elements, golden %zu", vname, name, p->numel, numel);
        return 1;
    }
    *ref_norm_out = ref_norm;
    double norm = l2(p->g, p->numel);
    double rel = fabs(norm - ref_norm) / (ref_norm > 0 ? ref_norm : 1);
    if (ref_norm == 0 ? norm != 0 : rel > model_check_norm_slack + 3 * noise_n) {
        bad++;
        diag("%s: |grad %s| = %.9g, PyTorch %.9g", vname, name, norm, ref_norm);
    }
    if (rel > *worst_norm) *worst_norm = rel;
    double rms = ref_norm / sqrt((double)numel);
    double tight = 2e-3 + 3 * noise_p90, loose = 0.25 + 3 * noise_max;
    int nsamp = 0, ntight = 0;
    const char *s = line + off;
    for (int j = 0;; j++) {
        long idx;
        float val;
        int used = 0;
        if (sscanf(s, " %ld:%f%n", &idx, &val, &used) != 2) break;
        s += used;
        if ((uint64_t)idx != sample_index(name, numel, j)) {
            bad++;
            diag("%s: sample %d of %s: index %ld, C hash gives %llu", vname, j, name, idx,
                 (unsigned long long)sample_index(name, numel, j));
            break;
        }
        double d = fabs((double)p->g[idx] - val), r = 1e-2 * fabs(val);
        nsamp++;
        ntight += d <= r + tight * rms;
        if (rms > 0 && d / rms > *worst_elem) *worst_elem = d / rms;
        if (!(d <= r + loose * rms)) {
            bad++;
            diag("%s: %s[%ld] = %.9g, PyTorch %.9g (rms %.3g)", vname, name, idx, p->g[idx], val,
                 rms);
        }
    }
    if (ntight < 0.8 * nsamp) {
        bad++;
        diag("%s: %s: only %d of %d samples within %.2g rms", vname, name, ntight, nsamp, tight);
    }
    return bad;
}

/* Index of a buffer of m by name, or -1. */
static inline int model_find_buffer(const ps_model_t *m, const char *name)
{
    int n;
    const ps_model_buffer_t *b = ps_model_buffers(m, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(b[i].name, name)) return i;
    return -1;
}

/* One golden line "buf NAME NUMEL idx:val ..." (BN running statistics) or
 * "count NAME V" (num_batches_tracked) against m's buffers.  Returns 0 when
 * the line is neither; else 1, with *nbuf counted and *bad counting the
 * mismatches (each diagnosed). */
static inline int check_buffer_line(const ps_model_t *m, const char *vname, const char *line,
                                    int *nbuf, int *bad)
{
    char name[128];
    int off = 0;
    if (sscanf(line, "buf %127s %*d%n", name, &off) == 1 && off > 0) {
        int bi = model_find_buffer(m, name);
        const ps_model_buffer_t *b = bi >= 0 ? &ps_model_buffers(m, NULL)[bi] : NULL;
        (*nbuf)++;
        if (!b || !b->f32) {
            (*bad)++;
            diag("%s: buffer %s missing", vname, name);
            return 1;
        }
        *bad += check_sample_list(line + off, b->f32, b->numel, vname, name, NULL);
        return 1;
    }
    if (sscanf(line, "count %127s", name) == 1) {
        long long want = 0;
        sscanf(line, "count %*s %lld", &want);
        int bi = model_find_buffer(m, name);
        (*nbuf)++;
        if (bi < 0 || !ps_model_buffers(m, NULL)[bi].i64 ||
            *ps_model_buffers(m, NULL)[bi].i64 != want) {
            (*bad)++;
            diag("%s: %s differs from PyTorch's %lld", vname, name, want);
        }
        return 1;
    }
    return 0;
}

/* Zeroed per-tensor buffers shaped like the table (SGD momentum, sums). */
static inline float **alloc_like(const ps_model_param_t *P, int np)
{
    float **b = calloc(np, sizeof *b);
    for (int i = 0; i < np; i++) b[i] = calloc(P[i].numel, sizeof(float));
    return b;
}

static inline void free_like(float **b, int np)
{
    for (int i = 0; i < np; i++) free(b[i]);
    free(b);
}

/* ps_optim_sgd on every trainable tensor with its group's multipliers. */
static inline void sgd_step(const ps_model_param_t *P, int np, float **mom,
                            const ps_optim_config_t *oc, int first)
{
    for (int i = 0; i < np; i++) {
        if (!P[i].trainable) continue;
        const ps_param_group_t *g = &oc->groups[P[i].group];
        ps_optim_sgd(P[i].w, mom[i], P[i].g, P[i].numel, oc->lr * g->lr_mult,
                     oc->weight_decay * g->wd_mult, oc, first);
    }
}

/* A detector's table at torchvision's ResNet-50 widths with freeze_at 2
 * (tests/test_retinanet, tests/test_fasterrcnn): its element count equals
 * torchvision's (want_total), 53 BNs x 3 buffers, the first name
 * backbone.body.conv1.weight and the last `last`, every name in names[]
 * present, and exactly every backbone BN, conv1 and layer1 frozen. */
static inline void check_r50_detector_table(const ps_model_param_t *P, int np, int nb,
                                            size_t want_total, const char *last,
                                            const char *const *names, int nnames)
{
    size_t total = 0;
    for (int i = 0; i < np; i++) total += P[i].numel;
    is_int(total, want_total, "R50-FPN 91 classes: torchvision's element count");
    is_int(nb, 53 * 3, "R50 backbone: 53 BNs x 3 buffers");
    ok(np > 0 && !strcmp(P[0].name, "backbone.body.conv1.weight") &&
       !strcmp(P[np - 1].name, last), "order: backbone.body.conv1.weight ... %s", last);
    int found = 0;
    for (int k = 0; k < nnames; k++)
        for (int i = 0; i < np; i++)
            if (!strcmp(P[i].name, names[k])) {
                found++;
                break;
            }
    is_int(found, nnames, "torchvision names present");
    int frozen_ok = 1;
    for (int k = 0; k < np; k++) {
        const char *n = P[k].name;
        int want_frozen = strstr(n, ".bn") || strstr(n, "downsample.1") ||
                          !strncmp(n, "backbone.body.conv1", 19) ||
                          !strncmp(n, "backbone.body.layer1.", 21);
        if (want_frozen == P[k].trainable) {
            frozen_ok = 0;
            diag("%s: trainable %d", n, P[k].trainable);
        }
    }
    ok(frozen_ok, "frozen: every backbone BN, conv1 and layer1; the rest trains");
}

#endif
