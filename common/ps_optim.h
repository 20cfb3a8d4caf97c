/* The optimizer shared by psd and ring mode (DESIGN.md section 6): SGD with
 * momentum in PyTorch's semantics (torch.optim.SGD), Nesterov, weight decay,
 * per-parameter-group lr / decay multipliers, warmup + step / cosine
 * schedules and the linear scaling rule.  Gradient-norm clipping needs the
 * whole gradient, so it is a factor the worker (or ring mode) computes. */
#ifndef PS_OPTIM_H
#define PS_OPTIM_H
#include <stddef.h>
#include <stdint.h>
#include "ps_partition.h"

typedef enum { PS_SCHED_CONST = 0, PS_SCHED_STEP = 1, PS_SCHED_COSINE = 2 } ps_sched_kind_t;

#define PS_OPTIM_MAX_MILESTONES 16
#define PS_OPTIM_MAX_GROUPS 16

typedef struct ps_param_group {
    float lr_mult;  /* TSM: biases 2, new fc weight 5 / bias 10 */
    float wd_mult;  /* TSM: 0 for biases and BN */
} ps_param_group_t;

typedef struct ps_optim_config {
    float lr;             /* base learning rate at ref_batch */
    float momentum;       /* 0 = plain SGD */
    float dampening;      /* PyTorch's dampening (0 by default) */
    int nesterov;
    float weight_decay;
    int ref_batch;        /* linear scaling rule: lr * global_batch / ref_batch (0 = off) */
    int global_batch;
    ps_sched_kind_t sched;
    uint64_t warmup_steps;      /* linear warmup from warmup_factor*lr to lr */
    float warmup_factor;
    uint64_t milestones[PS_OPTIM_MAX_MILESTONES]; /* step decay: lr *= gamma at each */
    int nmilestones;
    float gamma;
    uint64_t total_steps;       /* cosine: decays to min_lr at total_steps */
    float min_lr;
    ps_param_group_t groups[PS_OPTIM_MAX_GROUPS]; /* group 0 = default */
    int ngroups;
} ps_optim_config_t;

/* Defaults: lr 0.01, momentum 0.9, no decay, constant schedule, one group 1/1. */
void ps_optim_config_default(ps_optim_config_t *c);
/* Check ranges; on error writes a message into err and returns PS_EINVAL. */
int ps_optim_config_validate(const ps_optim_config_t *c, char *err, size_t errlen);

/* Learning rate for the update that takes version `step` to step+1. */
float ps_optim_lr(const ps_optim_config_t *c, uint64_t step);

/* One torch.optim.SGD step on n elements:
 *   d = g + wd*w;  buf = first ? d : momentum*buf + (1-dampening)*d;
 *   d = nesterov ? d + momentum*buf : buf;  w -= lr*d
 * buf may be NULL when momentum == 0. */
void ps_optim_sgd(float *w, float *buf, const float *g, size_t n, float lr, float wd,
                  const ps_optim_config_t *c, int first);

/* Apply the update to one partition of table t: w, buf, grad hold that
 * partition's elements; each tensor segment uses its group's multipliers.
 * step = updates applied to this partition so far (0 means first). */
int ps_optim_apply_partition(const ps_optim_config_t *c, const ps_partition_table_t *t,
                             uint32_t part, float *w, float *buf, const float *grad,
                             uint64_t step);

/* torch.nn.utils.clip_grad_norm_ factor for a gradient whose squared L2 norm
 * is sqnorm: min(1, max_norm / (sqrt(sqnorm) + 1e-6)); 1 when max_norm <= 0. */
float ps_optim_clip_factor(double sqnorm, float max_norm);

/* Serialise to / from a JSON object text (for INIT and checkpoint metadata).
 * to_json returns a malloc'd string; from_json returns 0 or PS_EINVAL. */
char *ps_optim_config_to_json(const ps_optim_config_t *c);
int ps_optim_config_from_json(ps_optim_config_t *c, const char *json, char *err, size_t errlen);
#endif
