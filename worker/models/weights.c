/* The weights loader of every model (ps_weights.h): a file's names mapped
 * by its format's rules, checked against the model's tables, then copied.
 * Pass 1 decides what happens to every tensor and collects every problem;
 * pass 2 runs only when there is none, so a refused file changes nothing. */
#include "worker/models/ps_weights.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LISTED 20   /* problems logged by name; the rest counted */
#define NAME_MAX_LEN 512

int ps_weights_map_name(const ps_weights_format_t *f, const char *name, char *out,
                        size_t outlen)
{
    char cur[NAME_MAX_LEN];
    if (snprintf(cur, sizeof cur, "%s", name) >= (int)sizeof cur) return PS_ERANGE;
    for (int r = 0; r < f->nrules; r++) {
        const ps_weights_rule_t *ru = &f->rules[r];
        size_t lf = strlen(ru->from);
        char nxt[NAME_MAX_LEN];
        if (ru->kind == PS_WEIGHTS_DROP) {
            if (!strncmp(cur, ru->from, lf)) return 1;
            continue;
        }
        if (ru->kind == PS_WEIGHTS_PREFIX) {
            if (strncmp(cur, ru->from, lf)) continue;
            if (snprintf(nxt, sizeof nxt, "%s%s", ru->to, cur + lf) >= (int)sizeof nxt)
                return PS_ERANGE;
        } else { /* INFIX: every occurrence, left to right, without rescanning */
            size_t o = 0, lt = strlen(ru->to);
            const char *s = cur, *hit;
            while (lf && (hit = strstr(s, ru->from))) {
                size_t k = (size_t)(hit - s);
                if (o + k + lt >= sizeof nxt) return PS_ERANGE;
                memcpy(nxt + o, s, k);
                memcpy(nxt + o + k, ru->to, lt);
                o += k + lt;
                s = hit + lf;
            }
            if (o + strlen(s) >= sizeof nxt) return PS_ERANGE;
            strcpy(nxt + o, s);
        }
        memcpy(cur, nxt, sizeof cur);
    }
    if (snprintf(out, outlen, "%s", cur) >= (int)outlen) return PS_ERANGE;
    return 0;
}

const ps_weights_format_t *ps_weights_detect(const ps_st_file_t *f,
                                             const ps_weights_format_t *const *formats, int n)
{
    for (int i = 0; i < n; i++) {
        const char *d = formats[i]->detect;
        if (!d) return formats[i];
        size_t ld = strlen(d);
        for (size_t k = 0; k < f->ntensors; k++)
            if (!strncmp(f->tensors[k].name, d, ld)) return formats[i];
    }
    return NULL;
}

long ps_weights_find(const ps_st_file_t *f, const ps_weights_format_t *fm, const char *name)
{
    char mapped[NAME_MAX_LEN];
    for (size_t k = 0; fm && k < f->ntensors; k++)
        if (!ps_weights_map_name(fm, f->tensors[k].name, mapped, sizeof mapped) &&
            !strcmp(mapped, name))
            return (long)k;
    return -1;
}

int ps_weights_tensor_shape(const char *path, const ps_weights_format_t *const *formats,
                            int nformats, const char *name, int *ndim, int64_t *shape)
{
    ps_st_file_t f;
    char err[256] = "";
    int r = ps_st_open(&f, path, err, sizeof err);
    if (r) {
        ps_error("weights %s: %s", path, err);
        return r;
    }
    long k = ps_weights_find(&f, ps_weights_detect(&f, formats, nformats), name);
    if (k >= 0) {
        *ndim = f.tensors[k].ndim;
        memcpy(shape, f.tensors[k].shape, sizeof(int64_t) * (size_t)*ndim);
    }
    ps_st_close(&f);
    return k >= 0 ? 0 : PS_ENOTFOUND;
}

static void fmt_shape(char *buf, size_t len, int ndim, const int64_t *s64, const int *s32)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "",
                              (long long)(s64 ? s64[d] : s32[d]));
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int is_float(ps_st_dtype_t d)
{
    return d == PS_ST_F32 || d == PS_ST_F16 || d == PS_ST_BF16 || d == PS_ST_F64;
}

static int same_shape(const ps_st_tensor_t *t, int ndim, const int *shape)
{
    if (t->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return 0;
    return 1;
}

/* What pass 2 does with a model tensor. */
enum { KEEP = 0, LOAD, ADAPT, REINIT };

typedef struct load {
    const ps_weights_target_t *t;
    const char *path, *fmt;
    ps_st_file_t f;
    int *pfile, *bfile;   /* model param / buffer -> file tensor index or -1 */
    int *pact;            /* KEEP / LOAD / ADAPT / REINIT per param */
    float **adapted;      /* ADAPT: the converted values, per param */
    int nerr, first;      /* problems found, code of the first */
    size_t outside;       /* model tensors outside the format's `covers` */
} load_t;

__attribute__((format(printf, 3, 4))) static void problem(load_t *L, int code, const char *fmt,
                                                         ...)
{
    if (!L->nerr++) L->first = code;
    if (L->nerr > MAX_LISTED) return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ps_error("%s weights %s (%s names): %s", L->t->what, L->path, L->fmt, msg);
}

static int find_param(const ps_weights_target_t *t, const char *name)
{
    for (int i = 0; i < t->nparams; i++)
        if (!strcmp(t->params[i].name, name)) return i;
    return -1;
}

static int find_buffer(const ps_weights_target_t *t, const char *name)
{
    for (int i = 0; i < t->nbuffers; i++)
        if (!strcmp(t->buffers[i].name, name)) return i;
    return -1;
}

/* Every file tensor: to a model tensor, dropped, or unknown. */
static int map_file(load_t *L, const ps_weights_format_t *fm, unsigned flags,
                    ps_weights_report_t *rep)
{
    const ps_weights_target_t *t = L->t;
    char name[NAME_MAX_LEN], a[128];
    for (size_t k = 0; k < L->f.ntensors; k++) {
        const ps_st_tensor_t *ft = &L->f.tensors[k];
        int r = ps_weights_map_name(fm, ft->name, name, sizeof name);
        fmt_shape(a, sizeof a, ft->ndim, ft->shape, NULL);
        if (r == 1) {
            ps_info("%s weights %s: skipped %s %s (not part of this model)", t->what, L->path,
                    ft->name, a);
            rep->skipped++;
            continue;
        }
        if (r) {
            problem(L, PS_EMISMATCH, "tensor name too long: %.80s...", ft->name);
            continue;
        }
        int *slot = NULL;
        int i = find_param(t, name);
        if (i >= 0) slot = &L->pfile[i];
        else if ((i = find_buffer(t, name)) >= 0) slot = &L->bfile[i];
        if (!slot) {
            if (flags & PS_WEIGHTS_PARTIAL) {
                ps_info("%s weights %s: skipped %s %s (unknown here; --weights-partial)",
                        t->what, L->path, ft->name, a);
                rep->skipped++;
            } else {
                problem(L, PS_EMISMATCH, "unexpected tensor %s%s%s (no such tensor in this model)",
                        ft->name, strcmp(name, ft->name) ? " -> " : "",
                        strcmp(name, ft->name) ? name : "");
            }
            continue;
        }
        if (*slot >= 0) {
            problem(L, PS_EMISMATCH, "tensors %s and %s both map to %s",
                    L->f.tensors[*slot].name, ft->name, name);
            continue;
        }
        *slot = (int)k;
    }
    return 0;
}

/* A model tensor the file does not have. */
static void absent(load_t *L, const ps_weights_format_t *fm, unsigned flags, const char *name,
                   ps_weights_report_t *rep)
{
    if (fm->covers && strncmp(name, fm->covers, strlen(fm->covers))) {
        L->outside++;
        return;
    }
    if (flags & PS_WEIGHTS_PARTIAL) {
        ps_info("%s weights %s: %s not in the file, keeps its initialisation", L->t->what,
                L->path, name);
        rep->missing++;
        return;
    }
    problem(L, PS_ENOTFOUND, "tensor %s missing", name);
}

static int check_params(load_t *L, const ps_weights_format_t *fm, unsigned flags,
                        ps_weights_report_t *rep)
{
    const ps_weights_target_t *t = L->t;
    char a[128], b[128];
    for (int i = 0; i < t->nparams; i++) {
        const ps_model_param_t *p = &t->params[i];
        int k = L->pfile[i];
        if (k < 0) {
            absent(L, fm, flags, p->name, rep);
            continue;
        }
        const ps_st_tensor_t *ft = &L->f.tensors[k];
        if (!is_float(ft->dtype)) {
            problem(L, PS_EMISMATCH, "tensor %s has dtype %s, want a float type", ft->name,
                    ps_st_dtype_name(ft->dtype));
            continue;
        }
        if (same_shape(ft, p->ndim, p->shape)) {
            L->pact[i] = LOAD;
            continue;
        }
        fmt_shape(a, sizeof a, ft->ndim, ft->shape, NULL);
        fmt_shape(b, sizeof b, p->ndim, NULL, p->shape);
        if (t->adapt) {
            size_t n = ft->nbytes / ps_st_dtype_size(ft->dtype);
            float *src = malloc(sizeof(float) * (n ? n : 1));
            float *dst = malloc(sizeof(float) * p->numel);
            char err[256];
            int done = 0;
            if (!src || !dst) {
                free(src), free(dst);
                problem(L, PS_ENOMEM, "out of memory adapting %s", ft->name);
                continue;
            }
            if (!ps_st_read_f32(&L->f, ft->name, src, n, err, sizeof err))
                done = t->adapt(t->ctx, i, src, ft->ndim, ft->shape, dst);
            free(src);
            if (done) {
                L->pact[i] = ADAPT;
                L->adapted[i] = dst;
                ps_info("%s weights %s: %s adapted from %s to %s", t->what, L->path, ft->name, a,
                        b);
                continue;
            }
            free(dst);
        }
        if (t->may_reinit && t->may_reinit(t->ctx, i)) {
            L->pact[i] = REINIT;
            ps_info("%s weights %s: %s is %s in the file, %s here: re-initialised", t->what,
                    L->path, ft->name, a, b);
            continue;
        }
        problem(L, PS_EMISMATCH, "tensor %s has shape %s, the model needs %s for %s", ft->name, a,
                b, p->name);
    }
    return 0;
}

static void check_buffers(load_t *L, const ps_weights_format_t *fm, unsigned flags,
                          ps_weights_report_t *rep)
{
    const ps_weights_target_t *t = L->t;
    char a[128];
    for (int i = 0; i < t->nbuffers; i++) {
        const ps_model_buffer_t *bu = &t->buffers[i];
        int k = L->bfile[i];
        if (k < 0) {
            /* num_batches_tracked: absent before PyTorch 0.4.1, reads as 0 */
            if (!bu->i64) absent(L, fm, flags, bu->name, rep);
            continue;
        }
        const ps_st_tensor_t *ft = &L->f.tensors[k];
        fmt_shape(a, sizeof a, ft->ndim, ft->shape, NULL);
        if (bu->i64) {
            if (ft->dtype != PS_ST_I64 || ft->nbytes != 8)
                problem(L, PS_EMISMATCH, "%s must be one int64, got %s %s", ft->name,
                        ps_st_dtype_name(ft->dtype), a);
            continue;
        }
        int n = (int)bu->numel;
        if (!is_float(ft->dtype) || !same_shape(ft, 1, &n))
            problem(L, PS_EMISMATCH, "tensor %s is %s %s, the model needs float [%d] for %s",
                    ft->name, ps_st_dtype_name(ft->dtype), a, n, bu->name);
    }
}

/* Pass 2: nothing can fail short of a broken reader (the sizes are checked). */
static int copy_all(load_t *L, ps_weights_report_t *rep)
{
    const ps_weights_target_t *t = L->t;
    char err[256];
    for (int i = 0; i < t->nparams; i++) {
        ps_model_param_t *p = &t->params[i];
        if (t->kept_init) t->kept_init[i] = L->pact[i] == KEEP || L->pact[i] == REINIT;
        if (L->pact[i] == LOAD) {
            int r = ps_st_read_f32(&L->f, L->f.tensors[L->pfile[i]].name, p->w, p->numel, err,
                                   sizeof err);
            if (r) {
                ps_error("%s weights %s: %s", t->what, L->path, err);
                return r;
            }
            rep->loaded++;
        } else if (L->pact[i] == ADAPT) {
            memcpy(p->w, L->adapted[i], sizeof(float) * p->numel);
            rep->adapted++;
        } else if (L->pact[i] == REINIT) {
            rep->reinit++;
        }
    }
    for (int i = 0; i < t->nbuffers; i++) {
        ps_model_buffer_t *bu = &t->buffers[i];
        int k = L->bfile[i];
        if (bu->i64) {
            int64_t v = 0;
            if (k >= 0) memcpy(&v, ps_st_tensor_data(&L->f, &L->f.tensors[k]), 8); /* LE */
            *bu->i64 = v;
            rep->loaded += k >= 0;
            continue;
        }
        if (k < 0) continue;
        int r = ps_st_read_f32(&L->f, L->f.tensors[k].name, bu->f32, bu->numel, err, sizeof err);
        if (r) {
            ps_error("%s weights %s: %s", t->what, L->path, err);
            return r;
        }
        rep->loaded++;
    }
    return 0;
}

int ps_weights_load(const ps_weights_target_t *t, const char *path,
                    const ps_weights_format_t *const *formats, int nformats, unsigned flags,
                    ps_weights_report_t *rep)
{
    ps_weights_report_t dummy;
    if (!rep) rep = &dummy;
    memset(rep, 0, sizeof *rep);
    load_t L = {.t = t, .path = path, .fmt = "?"};
    char err[256] = "";
    int r = ps_st_open(&L.f, path, err, sizeof err);
    if (r) {
        ps_error("%s weights %s: %s", t->what, path, err);
        return r;
    }
    const ps_weights_format_t *fm = ps_weights_detect(&L.f, formats, nformats);
    if (!fm) {
        ps_error("%s weights %s: no tensor name of a known kind (first: %s)", t->what, path,
                 L.f.ntensors ? L.f.tensors[0].name : "none: the file is empty");
        ps_st_close(&L.f);
        return PS_EMISMATCH;
    }
    L.fmt = rep->format = fm->name;
    size_t np = (size_t)(t->nparams ? t->nparams : 1), nb = (size_t)(t->nbuffers ? t->nbuffers : 1);
    L.pfile = malloc(sizeof(int) * np);
    L.bfile = malloc(sizeof(int) * nb);
    L.pact = calloc(np, sizeof(int));
    L.adapted = calloc(np, sizeof(float *));
    if (!L.pfile || !L.bfile || !L.pact || !L.adapted) {
        r = PS_ENOMEM;
        ps_error("%s weights %s: out of memory", t->what, path);
        goto out;
    }
    for (int i = 0; i < t->nparams; i++) L.pfile[i] = -1;
    for (int i = 0; i < t->nbuffers; i++) L.bfile[i] = -1;
    /* model order first (a missing or misshaped weight says more than an
     * extra one), then what the file has that the model has not */
    int nerr_file;
    map_file(&L, fm, flags, rep);
    nerr_file = L.nerr;
    int first_file = L.first;
    L.nerr = 0;
    check_params(&L, fm, flags, rep);
    check_buffers(&L, fm, flags, rep);
    if (nerr_file) {
        if (!L.nerr) L.first = first_file;
        L.nerr += nerr_file;
    }
    if (L.nerr) {
        if (L.nerr > MAX_LISTED)
            ps_error("%s weights %s: ... %d problems in all (the first %d above)", t->what, path,
                     L.nerr, MAX_LISTED);
        ps_error("%s weights %s: refused; the model is unchanged", t->what, path);
        r = L.first;
        goto out;
    }
    if ((r = copy_all(&L, rep))) goto out;
    ps_info("%s weights %s (%s names): %d tensors loaded, %d adapted, %d re-initialised, "
            "%d skipped, %d missing (kept their initialisation)", t->what, path, fm->name,
            rep->loaded, rep->adapted, rep->reinit, rep->skipped, rep->missing);
    if (L.outside)
        ps_info("%s weights %s: %zu tensors outside %s* are not in such a file and keep "
                "their initialisation", t->what, path, L.outside, fm->covers);
out:
    for (int i = 0; L.adapted && i < t->nparams; i++) free(L.adapted[i]);
    free(L.adapted), free(L.pact), free(L.pfile), free(L.bfile);
    ps_st_close(&L.f);
    return r;
}
