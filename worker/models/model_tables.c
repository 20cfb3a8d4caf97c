/* The parameter and buffer tables every model keeps (ps_model_t, ps_retina_t):
 * growing them, looking names up, zeroing gradients, the trainable specs for
 * the PS, and writing / reading them as safetensors with torchvision names.
 * One copy here, so that the classifier and the detectors cannot drift
 * apart in how a checkpoint is laid out. */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_mtab_add_param(ps_model_param_t **params, int *n, int *cap, const char *name, int ndim,
                      const int *shape, int group, int trainable)
{
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        ps_model_param_t *p = realloc(*params, c * sizeof *p);
        if (!p) return PS_ENOMEM;
        *params = p;
        *cap = c;
    }
    ps_model_param_t *p = &(*params)[*n];
    memset(p, 0, sizeof *p);
    if (!(p->name = strdup(name))) return PS_ENOMEM;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    p->group = group;
    p->trainable = trainable;
    return (*n)++;
}

void ps_mtab_free(ps_model_param_t **params, int *np, ps_model_buffer_t **buffers, int *nb)
{
    for (int i = 0; i < *np; i++) free((char *)(*params)[i].name);
    for (int i = 0; i < *nb; i++) free((char *)(*buffers)[i].name);
    free(*params);
    free(*buffers);
    *params = NULL;
    *buffers = NULL;
    *np = *nb = 0;
}

int ps_mtab_find(const ps_model_param_t *params, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(params[i].name, name)) return i;
    return -1;
}

void ps_mtab_zero_grad(ps_model_param_t *params, int n)
{
    for (int i = 0; i < n; i++) memset(params[i].g, 0, params[i].numel * sizeof(float));
}

int ps_mtab_tensor_specs(const ps_model_param_t *params, int n, ps_tensor_spec_t **specs)
{
    ps_tensor_spec_t *s = calloc(n ? n : 1, sizeof *s);
    if (!s) return PS_ENOMEM;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!params[i].trainable) continue;
        s[k].name = params[i].name;
        s[k].numel = params[i].numel;
        s[k].group = params[i].group;
        k++;
    }
    *specs = s;
    return k;
}

int ps_mtab_save(const ps_model_param_t *params, int np, const ps_model_buffer_t *buffers,
                 int nb, const char *arch, const char *what, const char *path)
{
    char err[256] = "";
    ps_st_writer_t *w = ps_st_writer_new();
    if (!w) return PS_ENOMEM;
    int r = 0;
    for (int i = 0; i < np && !r; i++) {
        const ps_model_param_t *p = &params[i];
        int64_t shape[PS_MODEL_MAX_NDIM];
        for (int d = 0; d < p->ndim; d++) shape[d] = p->shape[d];
        r = ps_st_writer_add(w, p->name, PS_ST_F32, p->ndim, shape, p->w);
    }
    for (int i = 0; i < nb && !r; i++) {
        const ps_model_buffer_t *b = &buffers[i];
        int64_t shape[1] = {(int64_t)b->numel};
        /* num_batches_tracked is a 0-dim int64 tensor in torchvision */
        r = b->i64 ? ps_st_writer_add(w, b->name, PS_ST_I64, 0, shape, b->i64)
                   : ps_st_writer_add(w, b->name, PS_ST_F32, 1, shape, b->f32);
    }
    if (!r) r = ps_st_writer_meta(w, "format", "pt");
    if (!r) r = ps_st_writer_meta(w, "ps.arch", arch);
    if (r) {
        ps_error("%s save %s: cannot add tensors: %s", what, path, ps_strerror(r));
    } else if ((r = ps_st_writer_save(w, path, err, sizeof err))) {
        ps_error("%s save %s: %s", what, path, err);
    }
    ps_st_writer_destroy(&w);
    return r;
}

int ps_mtab_read_buffers(const ps_st_file_t *f, ps_model_buffer_t *buffers, int nb,
                         const char *what, const char *path)
{
    char err[256] = "";
    for (int i = 0; i < nb; i++) {
        ps_model_buffer_t *b = &buffers[i];
        if (b->i64) {
            /* validated as one int64 (or absent: 0) by the caller */
            const ps_st_tensor_t *t = ps_st_find(f, b->name);
            int64_t v = 0;
            if (t) memcpy(&v, ps_st_tensor_data(f, t), 8); /* little-endian file, LE host */
            *b->i64 = v;
        } else {
            int r = ps_st_read_f32(f, b->name, b->f32, b->numel, err, sizeof err);
            if (r) {
                ps_error("%s load %s: %s", what, path, err);
                return r;
            }
        }
    }
    return 0;
}

void ps_mtab_take(ps_arena_t *a, ps_model_param_t *params, int np, ps_model_buffer_t *buffers,
                  int nb)
{
    for (int i = 0; i < np; i++) params[i].w = ps_arena_take(a, params[i].numel);
    for (int i = 0; i < np; i++) params[i].g = ps_arena_take(a, params[i].numel);
    for (int i = 0; i < nb; i++)
        if (buffers[i].ndim == 1) buffers[i].f32 = ps_arena_take(a, buffers[i].numel);
}

int ps_mtab_frozen(const char *name, int freeze_at)
{
    if (freeze_at >= 1 && (!strncmp(name, "conv1.", 6) || !strncmp(name, "bn1.", 4))) return 1;
    for (int s = 1; s < freeze_at && s <= 4; s++) {
        char pre[16];
        snprintf(pre, sizeof pre, "layer%d.", s);
        if (!strncmp(name, pre, strlen(pre))) return 1;
    }
    return 0;
}

int ps_mtab_add_backbone(ps_model_param_t **params, int *np, int *cap,
                         ps_model_buffer_t **buffers, int *nb, const ps_model_t *body,
                         const char *prefix, int freeze_at)
{
    char name[192];
    int nbp, nbb, r;
    const ps_model_param_t *bp = ps_model_params(body, &nbp);
    const ps_model_buffer_t *bb = ps_model_buffers(body, &nbb);
    for (int i = 0; i < nbp; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, bp[i].name);
        int trainable = bp[i].trainable && !ps_mtab_frozen(bp[i].name, freeze_at);
        if ((r = ps_mtab_add_param(params, np, cap, name, bp[i].ndim, bp[i].shape, bp[i].group,
                                   trainable)) < 0)
            return r;
        (*params)[r].w = bp[i].w;
        (*params)[r].g = bp[i].g;
    }
    *buffers = calloc(nbb ? nbb : 1, sizeof **buffers);
    if (!*buffers) return PS_ENOMEM;
    for (int i = 0; i < nbb; i++) {
        (*buffers)[i] = bb[i];
        snprintf(name, sizeof name, "%s%s", prefix, bb[i].name);
        if (!((*buffers)[i].name = strdup(name))) return PS_ENOMEM;
        (*nb)++;
    }
    return 0;
}

void ps_mhooks_set(ps_mhooks_t *h, ps_model_t *body, ps_model_hook_fn grad_ready,
                   ps_model_hook_fn weights_needed, void *ctx)
{
    *h = (ps_mhooks_t){grad_ready, weights_needed, ctx};
    ps_model_set_hooks(body, grad_ready, weights_needed, ctx);
}

void ps_mhooks_need(const ps_mhooks_t *h, ps_mgroup_t g)
{
    if (h->weights_needed && g.n > 0) h->weights_needed(h->ctx, g.first, g.n);
}

void ps_mhooks_ready(const ps_mhooks_t *h, ps_mgroup_t g)
{
    if (h->grad_ready && g.n > 0) h->grad_ready(h->ctx, g.first, g.n);
}

void ps_mtab_hookable(ps_model_hookable_t *h, ps_model_param_t *params, int np,
                      ps_model_buffer_t *buffers, int nb, void *model,
                      void (*set_hooks)(void *model, ps_model_hook_fn grad_ready,
                                        ps_model_hook_fn weights_needed, void *ctx))
{
    *h = (ps_model_hookable_t){.params = params, .nparams = np, .buffers = buffers,
                               .nbuffers = nb, .model = model, .set_hooks = set_hooks};
}
