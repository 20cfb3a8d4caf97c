/* Model weights in safetensors with torchvision names: what ps_model_save()
 * writes loads into torchvision.models.resnetXX / torchvision.models.video
 * with load_state_dict (strict=True), and a torchvision state dict or an
 * official TSM checkpoint converted to safetensors loads here (ps_weights.h;
 * fc replaced when the class count differs, 2-D kernels inflated into a 3-D
 * model's). */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"
#include "worker/models/ps_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_model_save(const ps_model_t *m, const char *path)
{
    return ps_mtab_save(m->params, m->nparams, m->buffers, m->nbuffers, m->arch_name, "model",
                        path);
}

static int fc_may_reinit(void *ctx, int i)
{
    const ps_model_t *m = ctx;
    return i == m->fc_pw || i == m->fc_pb;
}

/* The adapt hook of a load: a 2-D kernel (K, C, R, S) in the file for a 3-D
 * one (K, C, T, R, S), spread over the T slices: each slice kernel / T
 * ("mean" inflation: a clip of T equal frames then gives the 2-D net's
 * response), or the centre slice T/2 = kernel and the others 0 ("centre"). */
typedef struct inflate_ctx {
    ps_model_t *m;
    int centre, n;
} inflate_ctx_t;

static int inflate_kernel(void *ctx, int i, const float *src, int ndim, const int64_t *shape,
                          float *dst)
{
    inflate_ctx_t *c = ctx;
    const ps_model_param_t *p = &c->m->params[i];
    if (!(p->ndim == 5 && ndim == 4 && shape[0] == p->shape[0] && shape[1] == p->shape[1] &&
          shape[2] == p->shape[3] && shape[3] == p->shape[4]))
        return 0;
    const int T = p->shape[2];
    const size_t KC = (size_t)p->shape[0] * p->shape[1], RS = (size_t)p->shape[3] * p->shape[4];
    for (size_t kc = 0; kc < KC; kc++)
        for (int t = 0; t < T; t++) {
            float *d = dst + (kc * T + t) * RS;
            const float *k2 = src + kc * RS;
            for (size_t j = 0; j < RS; j++)
                d[j] = c->centre ? (t == T / 2 ? k2[j] : 0.0f) : k2[j] / (float)T;
        }
    c->n++;
    return 1;
}

static int may_reinit_fc(void *ctx, int i)
{
    return fc_may_reinit(((inflate_ctx_t *)ctx)->m, i);
}

/* A TSM checkpoint's shift placement (its ".net." levels) against the
 * model's: a checkpoint trained with the shift elsewhere loads without a
 * name failing, and computes something else. */
static int check_tsm_place(const ps_model_t *m, const char *path)
{
    ps_st_file_t f;
    char err[256] = "";
    if (ps_st_open(&f, path, err, sizeof err)) return 0; /* the loader reports it */
    const ps_weights_format_t *fm =
        ps_weights_detect(&f, ps_weights_resnet_formats, PS_WEIGHTS_RESNET_NFORMATS);
    int place = ps_weights_tsm_place(&f);
    ps_st_close(&f);
    if (fm != &ps_weights_tsm && fm != &ps_weights_tsm_bare) return 0; /* our names: no record */
    static const char *const names[] = {"blockres", "block"};
    if (place == PS_EMISMATCH) {
        ps_error("model load %s: the checkpoint shifts both conv1 inputs (blockres) and whole "
                 "blocks (block)", path);
        return PS_EMISMATCH;
    }
    if (place < 0) {
        if (m->cfg.shift)
            ps_warn("model load %s: the checkpoint has no temporal shift (TSN); this model "
                    "shifts (place %s)", path, names[m->cfg.shift_place]);
        return 0;
    }
    if (!m->cfg.shift || m->cfg.shift_place != place) {
        ps_error("model load %s: the checkpoint's temporal shift is placed '%s', the model's "
                 "is %s%s (--shift-place, or a tsm-* model)", path, names[place],
                 m->cfg.shift ? "'" : "absent (TSN)", m->cfg.shift ? names[m->cfg.shift_place] : "");
        return PS_EMISMATCH;
    }
    return 0;
}

int ps_model_file_info(const char *path, ps_model_file_info_t *info)
{
    ps_st_file_t f;
    char err[256] = "";
    info->shift_place = -1;
    info->shift_div = info->num_classes = 0;
    int r = ps_st_open(&f, path, err, sizeof err);
    if (r) {
        ps_error("model weights %s: %s", path, err);
        return r;
    }
    const ps_weights_format_t *fm =
        ps_weights_detect(&f, ps_weights_resnet_formats, PS_WEIGHTS_RESNET_NFORMATS);
    if (fm == &ps_weights_tsm || fm == &ps_weights_tsm_bare) {
        int place = ps_weights_tsm_place(&f);
        info->shift_place = place >= 0 ? place : -1;
    }
    const char *div = ps_st_meta(&f, "tsm.shift_div");
    if (div && atoi(div) >= 2 && atoi(div) <= 64) info->shift_div = atoi(div);
    long k = ps_weights_find(&f, fm, "fc.weight");
    if (k >= 0 && f.tensors[k].ndim == 2 && f.tensors[k].shape[0] <= (1 << 20))
        info->num_classes = (int)f.tensors[k].shape[0];
    ps_st_close(&f);
    return 0;
}

int ps_model_load(ps_model_t *m, const char *path, int flags)
{
    if (m->features_only) {
        ps_error("model load %s: a detector backbone loads through its detector "
                 "(ps_retina_load)", path);
        return PS_EINVAL;
    }
    inflate_ctx_t ic = {m, (flags & PS_MODEL_LOAD_INFLATE_CENTRE) != 0, 0};
    ps_weights_target_t t = {
        .what = "model", .params = m->params, .nparams = m->nparams, .buffers = m->buffers,
        .nbuffers = m->nbuffers, .ctx = &ic,
        .may_reinit = (flags & PS_MODEL_LOAD_REPLACE_FC) ? may_reinit_fc : NULL,
        .adapt = inflate_kernel};
    ps_weights_report_t rep;
    int r = check_tsm_place(m, path);
    if (!r)
        r = ps_weights_load(&t, path, ps_weights_resnet_formats, PS_WEIGHTS_RESNET_NFORMATS,
                            (flags & PS_MODEL_LOAD_PARTIAL) ? PS_WEIGHTS_PARTIAL : 0, &rep);
    if (r) return r;
    m->inflated = rep.adapted;
    if (rep.adapted)
        ps_info("model load %s: %d 2-D kernels inflated to 3-D (%s inflation)", path, rep.adapted,
                ic.centre ? "centre" : "mean");
    m->fc_replaced = rep.reinit > 0;
    if (m->fc_replaced) {
        /* TSM fine-tuning: a fresh fc, trained faster (lr x5 weight, x10 bias) */
        ps_resnet_init_fc(m, m->seed);
        m->fc_new = 1;
        m->params[m->fc_pw].group = PS_MODEL_GROUP_NEWFC_WEIGHT;
        m->params[m->fc_pb].group = PS_MODEL_GROUP_NEWFC_BIAS;
        ps_info("model load %s: fc has another class count; re-initialised for %d classes",
                path, m->cfg.num_classes);
    }
    ps_model_zero_grad(m);
    return 0;
}
