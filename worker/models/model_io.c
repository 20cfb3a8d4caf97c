/* Model weights in safetensors with torchvision names: what ps_model_save()
 * writes loads into torchvision.models.resnetXX with load_state_dict
 * (strict=True), and a torchvision state dict converted to safetensors
 * loads here (with fc replaced when the class count differs). */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_model_save(const ps_model_t *m, const char *path)
{
    return ps_mtab_save(m->params, m->nparams, m->buffers, m->nbuffers, m->arch_name, "model",
                        path);
}

static int shape_matches(const ps_st_tensor_t *t, int ndim, const int *shape)
{
    if (t->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return 0;
    return 1;
}

static void fmt_shape(char *buf, size_t len, int ndim, const int64_t *s64, const int *s32)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "",
                              (long long)(s64 ? s64[d] : s32[d]));
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int is_fc(const ps_model_t *m, int i) { return i == m->fc_pw || i == m->fc_pb; }

/* A 2-D kernel (K, C, R, S) in the file for a 3-D one (K, C, T, R, S). */
static int inflatable(const ps_st_tensor_t *t, const ps_model_param_t *p)
{
    return p->ndim == 5 && t->ndim == 4 && t->shape[0] == p->shape[0] &&
           t->shape[1] == p->shape[1] && t->shape[2] == p->shape[3] &&
           t->shape[3] == p->shape[4];
}

/* Read the 2-D kernel of p's name and spread it over p's T slices: each
 * slice kernel / T (mean inflation), or the centre slice T/2 = kernel and
 * the others 0 (centre). */
static int read_inflated(const ps_st_file_t *f, ps_model_param_t *p, int centre, char *err,
                         size_t errlen)
{
    const int T = p->shape[2];
    const size_t KC = (size_t)p->shape[0] * p->shape[1], RS = (size_t)p->shape[3] * p->shape[4];
    float *k2 = malloc(KC * RS * sizeof *k2);
    if (!k2) return PS_ENOMEM;
    int r = ps_st_read_f32(f, p->name, k2, KC * RS, err, errlen);
    for (size_t kc = 0; kc < KC && !r; kc++)
        for (int t = 0; t < T; t++) {
            float *dst = p->w + (kc * T + t) * RS;
            const float *src = k2 + kc * RS;
            for (size_t i = 0; i < RS; i++)
                dst[i] = centre ? (t == T / 2 ? src[i] : 0.0f) : src[i] / (float)T;
        }
    free(k2);
    return r;
}

/* Pass 1: everything the file must satisfy, before a single weight moves. */
static int validate(ps_model_t *m, const ps_st_file_t *f, const char *path, int flags,
                    int *replace_fc)
{
    char a[128], b[128];
    *replace_fc = 0;
    for (int i = 0; i < m->nparams; i++) {
        const ps_model_param_t *p = &m->params[i];
        const ps_st_tensor_t *t = ps_st_find(f, p->name);
        if (!t) {
            ps_error("model load %s: tensor %s missing", path, p->name);
            return PS_ENOTFOUND;
        }
        if (t->dtype != PS_ST_F32 && t->dtype != PS_ST_F16 && t->dtype != PS_ST_BF16 &&
            t->dtype != PS_ST_F64) {
            ps_error("model load %s: tensor %s has dtype %s, want a float type", path, p->name,
                     ps_st_dtype_name(t->dtype));
            return PS_EMISMATCH;
        }
        if (shape_matches(t, p->ndim, p->shape) || inflatable(t, p)) continue;
        /* fc with another class count: same feature size, other K */
        if (is_fc(m, i) && (flags & PS_MODEL_LOAD_REPLACE_FC) && t->ndim == p->ndim &&
            (p->ndim == 1 || t->shape[1] == p->shape[1])) {
            *replace_fc = 1;
            continue;
        }
        fmt_shape(a, sizeof a, t->ndim, t->shape, NULL);
        fmt_shape(b, sizeof b, p->ndim, NULL, p->shape);
        ps_error("model load %s: tensor %s has shape %s, the model needs %s%s", path, p->name,
                 a, b, is_fc(m, i) ? " (pass PS_MODEL_LOAD_REPLACE_FC to re-initialise fc)" : "");
        return PS_EMISMATCH;
    }
    for (int i = 0; i < m->nbuffers; i++) {
        const ps_model_buffer_t *bu = &m->buffers[i];
        const ps_st_tensor_t *t = ps_st_find(f, bu->name);
        if (bu->i64) {
            /* absent in state dicts from before PyTorch 0.4.1: start at 0 */
            if (t && (t->dtype != PS_ST_I64 || t->nbytes != 8)) {
                ps_error("model load %s: %s must be one int64, got %s of %zu bytes", path,
                         bu->name, ps_st_dtype_name(t->dtype), t->nbytes);
                return PS_EMISMATCH;
            }
            continue;
        }
        if (!t) {
            ps_error("model load %s: tensor %s missing", path, bu->name);
            return PS_ENOTFOUND;
        }
        int n = (int)bu->numel;
        if (!shape_matches(t, 1, &n) || t->dtype == PS_ST_I64 || t->dtype == PS_ST_I32 ||
            t->dtype == PS_ST_I16 || t->dtype == PS_ST_I8 || t->dtype == PS_ST_U8 ||
            t->dtype == PS_ST_BOOL) {
            fmt_shape(a, sizeof a, t->ndim, t->shape, NULL);
            ps_error("model load %s: tensor %s is %s %s, the model needs float [%d]", path,
                     bu->name, ps_st_dtype_name(t->dtype), a, n);
            return PS_EMISMATCH;
        }
    }
    /* strict, like load_state_dict(strict=True): nothing unknown either */
    for (size_t k = 0; k < f->ntensors; k++) {
        const char *name = f->tensors[k].name;
        int known = ps_model_find_param(m, name) >= 0 ||
                    ((flags & PS_MODEL_LOAD_IGNORE_FC) &&
                     (!strcmp(name, "fc.weight") || !strcmp(name, "fc.bias")));
        for (int i = 0; i < m->nbuffers && !known; i++)
            known = !strcmp(m->buffers[i].name, name);
        if (!known) {
            ps_error("model load %s: unexpected tensor %s (not in %s)", path, name,
                     m->arch_name);
            return PS_EMISMATCH;
        }
    }
    return 0;
}

int ps_model_load(ps_model_t *m, const char *path, int flags)
{
    ps_st_file_t f;
    char err[256] = "";
    int r = ps_st_open(&f, path, err, sizeof err);
    if (r) {
        ps_error("model load %s: %s", path, err);
        return r;
    }
    int replace_fc = 0;
    if ((r = validate(m, &f, path, flags, &replace_fc))) goto out;

    int inflated = 0;
    for (int i = 0; i < m->nparams; i++) {
        ps_model_param_t *p = &m->params[i];
        if (replace_fc && is_fc(m, i)) continue;
        const ps_st_tensor_t *t = ps_st_find(&f, p->name);
        if (t && inflatable(t, p)) {
            inflated++;
            r = read_inflated(&f, p, flags & PS_MODEL_LOAD_INFLATE_CENTRE, err, sizeof err);
        } else {
            r = ps_st_read_f32(&f, p->name, p->w, p->numel, err, sizeof err);
        }
        if (r) {
            ps_error("model load %s: %s", path, err);
            goto out; /* cannot happen after validate() short of a broken reader */
        }
    }
    if ((r = ps_mtab_read_buffers(&f, m->buffers, m->nbuffers, "model", path))) goto out;
    m->fc_replaced = replace_fc;
    m->inflated = inflated;
    if (inflated)
        ps_info("model load %s: %d 2-D kernels inflated to 3-D (%s inflation)", path, inflated,
                flags & PS_MODEL_LOAD_INFLATE_CENTRE ? "centre" : "mean");
    if (replace_fc) {
        /* TSM fine-tuning: a fresh fc, trained faster (lr x5 weight, x10 bias) */
        ps_resnet_init_fc(m, m->seed);
        m->fc_new = 1;
        m->params[m->fc_pw].group = PS_MODEL_GROUP_NEWFC_WEIGHT;
        m->params[m->fc_pb].group = PS_MODEL_GROUP_NEWFC_BIAS;
        ps_info("model load %s: fc has another class count; re-initialised for %d classes",
                path, m->cfg.num_classes);
    }
    ps_model_zero_grad(m);
out:
    ps_st_close(&f);
    return r;
}
