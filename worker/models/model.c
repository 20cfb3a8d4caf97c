/* ps_model.h's entry points that every model family shares: creation
 * picks the family from the configuration (cfg->arch: "" is the 2-D
 * ResNet, a name is a 3-D video model), forward / backward / FLOPs go
 * through the family's row, and the rest works on the tables and buffers
 * every family fills the same way (resnet_internal.h). */
#include "resnet_internal.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdlib.h>
#include <string.h>

int ps_model_create(ps_model_t **out, const ps_model_config_t *cfg, const ps_backend_t *be,
                    ps_ctx_t *ctx, int max_clips, int H, int W)
{
    if (out) *out = NULL;
    if (!out || !cfg) return PS_EINVAL;
    if (cfg->arch[0]) return ps_v3d_create(out, cfg, be, ctx, max_clips, H, W, 0);
    return ps_resnet_create(out, cfg, be, ctx, max_clips, H, W, 0);
}

int ps_model_count(const ps_model_config_t *cfg, int H, int W, ps_model_count_t *c)
{
    if (!cfg || !c) return PS_EINVAL;
    memset(c, 0, sizeof *c);
    ps_ctx_t ctx; /* not used: nothing is allocated or computed */
    memset(&ctx, 0, sizeof ctx);
    ps_model_t *m = NULL;
    int r = cfg->arch[0] ? ps_v3d_create(&m, cfg, &ps_backend_cpu, &ctx, 1, H, W, 1)
                         : ps_resnet_create(&m, cfg, &ps_backend_cpu, &ctx, 1, H, W, 1);
    if (r) return r;
    for (int i = 0; i < m->nparams; i++) {
        c->params += m->params[i].numel;
        if (m->params[i].trainable) c->trainable += m->params[i].numel;
    }
    for (int i = 0; i < m->nbuffers; i++)
        if (m->buffers[i].ndim == 1) c->bn_stats += m->buffers[i].numel;
    m->family->flops(m, 1, &c->fwd_flops, &c->bwd_flops);
    ps_model_destroy(&m);
    return 0;
}

static int arena_size(const ps_model_config_t *cfg, int max_n, int H, int W, size_t act_bytes,
                      int features, size_t *bytes)
{
    if (!cfg || !bytes || !act_bytes) return PS_EINVAL;
    if (cfg->arch[0]) {
        ps_error("ps_model_arena_size: the 3-D models keep fp32 activations; their arena is "
                 "what they allocate");
        return PS_EUNSUPPORTED;
    }
    ps_model_t *m = NULL;
    int r = ps_resnet_create_sized(&m, cfg, max_n, H, W, act_bytes, features);
    if (r) return r;
    *bytes = m->arena.used;
    ps_model_destroy(&m);
    return 0;
}

int ps_model_arena_size(const ps_model_config_t *cfg, int max_clips, int H, int W,
                        size_t act_bytes, size_t *bytes)
{
    return arena_size(cfg, max_clips, H, W, act_bytes, 0, bytes);
}

int ps_model_features_arena_size(const ps_model_config_t *cfg, int max_n, int H, int W,
                                 size_t act_bytes, size_t *bytes)
{
    return arena_size(cfg, max_n, H, W, act_bytes, 1, bytes);
}

size_t ps_model_arena_bytes(const ps_model_t *m) { return m->arena.size; }

void ps_model_destroy(ps_model_t **mp)
{
    if (!mp || !*mp) return;
    ps_model_t *m = *mp;
    if (m->family && m->family->free_impl) m->family->free_impl(m);
    ps_resnet_free_tables(m);
    ps_arena_free(&m->arena);
    free(m);
    *mp = NULL;
}

int ps_model_forward(ps_model_t *m, const float *input, int nclips, const int32_t *labels,
                     int training, float *loss)
{
    return m->family->forward(m, input, nclips, labels, training, loss);
}

int ps_model_backward(ps_model_t *m) { return m->family->backward(m); }

void ps_model_flops(const ps_model_t *m, int nclips, double *fwd, double *bwd)
{
    m->family->flops(m, nclips, fwd, bwd);
}

int ps_model_bn_mode(const ps_model_t *m) { return m->bn_mode; }
int ps_model_cfg_bn_mode(const ps_model_config_t *cfg)
{
    return cfg->bn_mode == PS_MODEL_BN_FROZEN                      ? PS_MODEL_BN_FROZEN
           : cfg->bn_mode == PS_MODEL_BN_PARTIAL || cfg->partial_bn ? PS_MODEL_BN_PARTIAL
                                                                    : PS_MODEL_BN_TRAIN;
}
const ps_model_config_t *ps_model_config(const ps_model_t *m) { return &m->cfg; }
const float *ps_model_logits(const ps_model_t *m) { return m->logits; }
int ps_model_fc_replaced(const ps_model_t *m) { return m->fc_replaced; }
int ps_model_inflated(const ps_model_t *m) { return m->inflated; }
const char *ps_model_arch(const ps_model_t *m) { return m->arch_name; }
void ps_model_set_seed(ps_model_t *m, uint64_t seed) { m->seed = seed; m->step = 0; }
void ps_model_set_step(ps_model_t *m, uint64_t step) { m->step = step; }

const ps_model_param_t *ps_model_params(const ps_model_t *m, int *n)
{
    if (n) *n = m->nparams;
    return m->params;
}

const ps_model_buffer_t *ps_model_buffers(const ps_model_t *m, int *n)
{
    if (n) *n = m->nbuffers;
    return m->buffers;
}

int ps_model_find_param(const ps_model_t *m, const char *name)
{
    return ps_mtab_find(m->params, m->nparams, name);
}

void ps_model_zero_grad(ps_model_t *m) { ps_mtab_zero_grad(m->params, m->nparams); }

void ps_model_set_hooks(ps_model_t *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                        void *ctx)
{
    m->grad_ready = grad_ready;
    m->weights_needed = weights_needed;
    m->hook_ctx = ctx;
}

static void set_hooks_of(void *m, ps_model_hook_fn grad_ready, ps_model_hook_fn weights_needed,
                         void *ctx)
{
    ps_model_set_hooks(m, grad_ready, weights_needed, ctx);
}

void ps_model_hookable(ps_model_t *m, ps_model_hookable_t *h)
{
    ps_mtab_hookable(h, m->params, m->nparams, m->buffers, m->nbuffers, m, set_hooks_of);
}
