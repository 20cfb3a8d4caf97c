/* Dynamic loss scaling policy (see ps_loss_scale.h for the cluster
 * contract).  Powers of two only, so scaling and unscaling are exact and
 * every worker's scale is bit-identical after the same verdicts. */
#include "ps_loss_scale.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_wire.h"

#include <math.h>
#include <string.h>

void ps_loss_scale_config_default(ps_loss_scale_config_t *cfg)
{
    cfg->init_scale = 65536.0f;
    cfg->min_scale = 1.0f;
    cfg->max_scale = 16777216.0f;
    cfg->growth_interval = 2000;
}

static int pow2(float x)
{
    int e;
    return isfinite(x) && x > 0 && frexpf(x, &e) == 0.5f;
}

int ps_loss_scale_init(ps_loss_scale_t *ls, const ps_loss_scale_config_t *cfg)
{
    if (!ls) return PS_EINVAL;
    ps_loss_scale_config_t c;
    if (cfg) c = *cfg;
    else ps_loss_scale_config_default(&c);
    if (!pow2(c.init_scale) || !pow2(c.min_scale) || !pow2(c.max_scale) ||
        c.min_scale > c.init_scale || c.init_scale > c.max_scale || c.growth_interval <= 0) {
        ps_error("loss scale: init %g, min %g, max %g must be powers of two with "
                 "min <= init <= max, growth interval %d must be > 0", (double)c.init_scale,
                 (double)c.min_scale, (double)c.max_scale, c.growth_interval);
        return PS_EINVAL;
    }
    memset(ls, 0, sizeof *ls);
    ls->cfg = c;
    ls->scale = c.init_scale;
    return 0;
}

int ps_loss_scale_has_overflow(const float *g, size_t n)
{
    /* x - x is 0 for finite x and NaN for Inf/NaN; summing the differences
     * keeps the loop branch-free (vectorises), NaN propagates. */
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++) acc += g[i] - g[i];
    return acc != 0.0f; /* NaN != 0 is true; finite input gives exactly 0 */
}

uint32_t ps_loss_scale_push_flags(int local_overflow)
{
    return local_overflow ? PS_FLAG_OVERFLOW : 0u;
}

int ps_loss_scale_agree(int local_overflow, const uint32_t *flags, size_t n)
{
    int any = local_overflow != 0;
    for (size_t i = 0; flags && i < n; i++) any |= (flags[i] & PS_FLAG_OVERFLOW) != 0;
    return any;
}

int ps_loss_scale_update(ps_loss_scale_t *ls, int overflow)
{
    ls->steps++;
    if (overflow) {
        ls->skipped++;
        ls->clean = 0;
        if (ls->scale > ls->cfg.min_scale) ls->scale *= 0.5f;
        ps_debug("loss scale: overflow, step skipped, scale now %g", (double)ls->scale);
        return 0;
    }
    if (++ls->clean >= ls->cfg.growth_interval) {
        ls->clean = 0;
        if (ls->scale < ls->cfg.max_scale) ls->scale *= 2.0f;
    }
    return 1;
}

void ps_loss_scale_unscale(const ps_loss_scale_t *ls, float *g, size_t n)
{
    const float inv = 1.0f / ls->scale; /* exact: a power of two */
    for (size_t i = 0; i < n; i++) g[i] *= inv;
}
