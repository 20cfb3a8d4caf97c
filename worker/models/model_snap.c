/* Step snapshots and their comparison (model_snap.h). */
#include "model_snap.h"

#include "ps_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ps_model_snap_relerr(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void *xalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        ps_error("snapshot: out of memory for %zu bytes", bytes);
        abort();
    }
    return p;
}

int ps_model_snap(ps_model_snap_t *s, const ps_model_t *m, int nlogits, float loss,
                  double grad_scale)
{
    memset(s, 0, sizeof *s);
    s->loss = loss;
    s->nlogits = (size_t)nlogits;
    s->logits = xalloc(s->nlogits * sizeof(float));
    memcpy(s->logits, ps_model_logits(m), s->nlogits * sizeof(float));
    int np = 0, nb = 0;
    const ps_model_param_t *p = ps_model_params(m, &np);
    s->name = xalloc((size_t)np * sizeof *s->name);
    s->g = xalloc((size_t)np * sizeof *s->g);
    s->numel = xalloc((size_t)np * sizeof *s->numel);
    for (int i = 0; i < np; i++) {
        if (!p[i].trainable) continue;
        const int k = s->np++;
        s->name[k] = strdup(p[i].name);
        s->numel[k] = p[i].numel;
        s->g[k] = xalloc(p[i].numel * sizeof(float));
        for (size_t j = 0; j < p[i].numel; j++)
            s->g[k][j] = (float)(p[i].g[j] * grad_scale);
    }
    const ps_model_buffer_t *b = ps_model_buffers(m, &nb);
    for (int i = 0; i < nb; i++)
        if (b[i].f32) s->nbufs += b[i].numel;
    s->bufs = xalloc(s->nbufs * sizeof(float));
    s->bname = xalloc((size_t)nb * sizeof *s->bname);
    s->boff = xalloc(((size_t)nb + 1) * sizeof *s->boff);
    size_t o = 0;
    for (int i = 0; i < nb; i++)
        if (b[i].f32) {
            memcpy(s->bufs + o, b[i].f32, b[i].numel * sizeof(float));
            s->bname[s->nb] = strdup(b[i].name);
            s->boff[s->nb++] = o;
            o += b[i].numel;
        }
    s->boff[s->nb] = o;
    return 0;
}

void ps_model_snap_free(ps_model_snap_t *s)
{
    for (int i = 0; i < s->np; i++) {
        free(s->name[i]);
        free(s->g[i]);
    }
    free(s->name);
    free(s->g);
    free(s->numel);
    for (int i = 0; i < s->nb; i++) free(s->bname[i]);
    free(s->bname);
    free(s->boff);
    free(s->logits);
    free(s->bufs);
    memset(s, 0, sizeof *s);
}

double ps_model_snap_cmp(const ps_model_snap_t *a, const ps_model_snap_t *ref,
                         const char **worst, double *elog, double *ebuf)
{
    const int shape_ok = a->np == ref->np && a->nlogits == ref->nlogits &&
                         a->nbufs == ref->nbufs;
    if (elog)
        *elog = shape_ok ? ps_model_snap_relerr(a->logits, ref->logits, a->nlogits) : INFINITY;
    if (ebuf) *ebuf = shape_ok ? ps_model_snap_relerr(a->bufs, ref->bufs, a->nbufs) : INFINITY;
    if (worst) *worst = "(shape mismatch)";
    if (!shape_ok) return INFINITY;
    double w = 0;
    for (int i = 0; i < a->np; i++) {
        const double e = a->numel[i] == ref->numel[i]
                             ? ps_model_snap_relerr(a->g[i], ref->g[i], a->numel[i])
                             : INFINITY;
        if (e > w || (i == 0 && e >= w)) {
            w = e;
            if (worst) *worst = ref->name[i];
        }
    }
    return w;
}

int ps_model_snap_equal(const ps_model_snap_t *a, const ps_model_snap_t *b)
{
    if (a->np != b->np || a->nlogits != b->nlogits || a->nbufs != b->nbufs ||
        a->loss != b->loss)
        return 0;
    if (memcmp(a->logits, b->logits, a->nlogits * sizeof(float)) ||
        memcmp(a->bufs, b->bufs, a->nbufs * sizeof(float)))
        return 0;
    for (int i = 0; i < a->np; i++)
        if (a->numel[i] != b->numel[i] || memcmp(a->g[i], b->g[i], a->numel[i] * sizeof(float)))
            return 0;
    return 1;
}

const char *ps_model_snap_worst_buf(const ps_model_snap_t *a, const ps_model_snap_t *ref,
                                    double *e)
{
    *e = INFINITY;
    if (a->nb != ref->nb || a->nbufs != ref->nbufs) return NULL;
    const char *w = NULL;
    *e = 0;
    for (int i = 0; i < a->nb; i++) {
        const size_t o = ref->boff[i], n = ref->boff[i + 1] - o;
        const double x = ps_model_snap_relerr(a->bufs + o, ref->bufs + o, n);
        if (!w || x > *e) {
            *e = x;
            w = ref->bname[i];
        }
    }
    return w;
}

int ps_model_snap_nonfinite(const ps_model_snap_t *s)
{
    int n = 0;
    for (int i = 0; i < s->np; i++)
        for (size_t j = 0; j < s->numel[i]; j++)
            if (!isfinite(s->g[i][j])) {
                n++;
                break;
            }
    return n;
}
