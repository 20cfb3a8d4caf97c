/* st_compare A.safetensors REF.safetensors [--tol T] [--floor F] [--bytes]
 *
 * Compares two model files tensor by tensor (same names and shapes; any
 * float dtype, read as fp32; I64 tensors must be equal) with REF as the
 * reference, and prints
 *   max_abs   = max_i |a_i - b_i|
 *   norm_rel  = worst over tensors of max_i |a_i - b_i| / max_i |b_i|
 *   max_rel   = max_i |a_i - b_i| / max(|b_i|, floor)
 * The checked "max relative difference" is norm_rel: the error relative to
 * the tensor's scale (its largest weight).  A purely per-element relative
 * error is meaningless for weights that pass through zero (a weight of 1e-9
 * turns a harmless 1e-12 difference into 1e-3), so max_rel is reported for
 * information with a floor, and checked instead of norm_rel when --floor is
 * given.  --bytes: every tensor must also have the same dtype and the same
 * bytes (tells -0 from 0, and NaN payloads apart).  Exit 0 when within
 * tol, 1 when over (or a tensor is missing, differs in shape, or a value is
 * NaN), 2 on a usage or file error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_safetensors.h"

static size_t numel_of(const ps_st_tensor_t *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

int main(int argc, char **argv)
{
    const char *pa = NULL, *pb = NULL;
    double tol = 1e-6, floor_ = 1e-3;
    int use_floor = 0, bytes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tol") && i + 1 < argc) tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--floor") && i + 1 < argc) floor_ = atof(argv[++i]), use_floor = 1;
        else if (!strcmp(argv[i], "--bytes")) bytes = 1;
        else if (!pa) pa = argv[i];
        else if (!pb) pb = argv[i];
        else pa = NULL, pb = NULL, i = argc;
    }
    if (!pa || !pb || !(tol >= 0) || !(floor_ > 0)) {
        fprintf(stderr, "usage: st_compare A.safetensors REF.safetensors [--tol T] [--floor F] "
                        "[--bytes]\n");
        return 2;
    }
    ps_st_file_t a, b;
    char err[512];
    if (ps_st_open(&a, pa, err, sizeof err)) {
        fprintf(stderr, "st_compare: %s: %s\n", pa, err);
        return 2;
    }
    if (ps_st_open(&b, pb, err, sizeof err)) {
        fprintf(stderr, "st_compare: %s: %s\n", pb, err);
        ps_st_close(&a);
        return 2;
    }
    int bad = 0;
    double max_abs = 0, max_rel = 0, norm_rel = 0;
    const char *worst = "";
    size_t total = 0;
    if (a.ntensors != b.ntensors) {
        fprintf(stderr, "st_compare: %s has %zu tensors, %s has %zu\n", pa, a.ntensors, pb,
                b.ntensors);
        bad = 1;
    }
    for (size_t k = 0; k < b.ntensors && !bad; k++) {
        const ps_st_tensor_t *tb = &b.tensors[k], *ta = ps_st_find(&a, tb->name);
        if (!ta) {
            fprintf(stderr, "st_compare: tensor %s missing in %s\n", tb->name, pa);
            bad = 1;
            break;
        }
        if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * tb->ndim)) {
            fprintf(stderr, "st_compare: tensor %s: shapes differ\n", tb->name);
            bad = 1;
            break;
        }
        size_t n = numel_of(tb);
        if (bytes && (ta->dtype != tb->dtype || ta->nbytes != tb->nbytes ||
                      memcmp(ps_st_tensor_data(&a, ta), ps_st_tensor_data(&b, tb), tb->nbytes))) {
            fprintf(stderr, "st_compare: tensor %s: bytes differ\n", tb->name);
            bad = 1;
        }
        if (tb->dtype == PS_ST_I64 || ta->dtype == PS_ST_I64) {
            /* integer buffers (BN num_batches_tracked) must match exactly */
            if (ta->dtype != tb->dtype ||
                memcmp(ps_st_tensor_data(&a, ta), ps_st_tensor_data(&b, tb), n * 8)) {
                fprintf(stderr, "st_compare: integer tensor %s differs\n", tb->name);
                bad = 1;
            }
            total += n;
            continue;
        }
        float *va = malloc(n * sizeof(float) + 1), *vb = malloc(n * sizeof(float) + 1);
        if (!va || !vb || ps_st_read_f32(&a, tb->name, va, n, err, sizeof err) ||
            ps_st_read_f32(&b, tb->name, vb, n, err, sizeof err)) {
            fprintf(stderr, "st_compare: tensor %s: %s\n", tb->name, va && vb ? err : "no memory");
            free(va), free(vb);
            bad = 1;
            break;
        }
        double t_abs = 0, t_max = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)va[i] - vb[i]);
            if (isnan(d)) {
                fprintf(stderr, "st_compare: tensor %s[%zu]: NaN (%g vs %g)\n", tb->name, i,
                        va[i], vb[i]);
                bad = 1;
                break;
            }
            double r = d / fmax(fabs(vb[i]), floor_);
            if (d > t_abs) t_abs = d;
            if (fabs(vb[i]) > t_max) t_max = fabs(vb[i]);
            if (r > max_rel) max_rel = r, worst = tb->name;
        }
        if (t_abs > max_abs) max_abs = t_abs;
        if (t_max > 0 && t_abs / t_max > norm_rel) norm_rel = t_abs / t_max;
        total += n;
        free(va), free(vb);
    }
    printf("tensors=%zu elements=%zu max_abs=%.3g norm_rel=%.3g max_rel=%.3g (floor %g) "
           "checked=%s tol=%g worst_elem=%s\n", b.ntensors, total, max_abs, norm_rel, max_rel,
           floor_, use_floor ? "max_rel" : "norm_rel", tol, *worst ? worst : "-");
    ps_st_close(&a);
    ps_st_close(&b);
    if (bad)
        return 1;
    return (use_floor ? max_rel : norm_rel) <= tol ? 0 : 1;
}
