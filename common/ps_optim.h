/* The optimizer shared by psd and ring mode: SGD with
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

/* What the update does to a group's elements.
 *   SGD      torch.optim.SGD with the group's multipliers (the default).
 *   AVERAGE  non-trainable state kept equal on every worker (BN running
 *            statistics): w -= g, with no learning rate, schedule, warmup,
 *            weight decay or momentum (the momentum buffer is left alone).
 *            A worker sends g = w_pulled - local, where local is its own new
 *            value computed from w_pulled; the servers' mean over W workers
 *            makes w = mean(local) -- the average of the workers' values,
 *            exact up to one rounding of w.  Sent as a difference (not the
 *            value) so an async server that applies each push scaled by
 *            1/W moves w a 1/W step towards each worker's value.  On the
 *            wire always raw fp32 (ps_optim_exact_groups). */
typedef enum { PS_GROUP_SGD = 0, PS_GROUP_AVERAGE = 1 } ps_group_kind_t;

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
    /* ps_group_kind_t of groups[i] (0 = SGD; AVERAGE ignores the multipliers).
     * Beside groups[] rather than in it so existing {lr_mult, wd_mult}
     * initialisers stay complete. */
    int group_kind[PS_OPTIM_MAX_GROUPS];
    int ngroups;
} ps_optim_config_t;

/* Groups whose values must travel exactly, as a bitmask for
 * ps_partition_table_build_ex: the AVERAGE groups (BN running statistics
 * would be broken by sign / top-k and rounded by fp16 / bf16, and they are
 * few: raw fp32 costs nothing).  Worker and server derive the table from
 * it, so both cut the same partitions. */
uint32_t ps_optim_exact_groups(const ps_optim_config_t *c);

/* Defaults: lr 0.01, momentum 0.9, no decay, constant schedule, one group 1/1. */
void ps_optim_config_default(ps_optim_config_t *c);
/* Check ranges; on error writes a message into err and returns PS_EINVAL. */
int ps_optim_config_validate(const ps_optim_config_t *c, char *err, size_t errlen);

/* Learning rate for the update that takes version `step` to step+1.
 * Equal to torch's lr after `step` scheduler.step() calls with
 *   base = lr * global_batch / ref_batch   (lr alone when ref_batch == 0)
 *   SequentialLR([LinearLR(start_factor=warmup_factor, total_iters=W), main],
 *                milestones=[W])            (main alone when W == 0)
 * where W = warmup_steps and main is
 *   CONST:  base
 *   STEP:   MultiStepLR(milestones=[m - W for m in milestones], gamma):
 *           base * gamma^(number of milestones m <= step).  Milestones are
 *           absolute step numbers, strictly increasing, each >= W.
 *   COSINE: CosineAnnealingLR(T_max = total_steps - W, eta_min = min_lr):
 *           min_lr + (base - min_lr) * (1 + cos(pi * (step - W) / T_max)) / 2,
 *           and min_lr from total_steps on (torch would rise again).
 * During warmup: base * (warmup_factor + (1 - warmup_factor) * step / W). */
float ps_optim_lr(const ps_optim_config_t *c, uint64_t step);
/* The same for a parameter group with lr multiplier lr_mult, as torch does
 * it for a param group whose lr is base*lr_mult: warmup and step decay scale
 * it, and cosine decays it to min_lr itself (min_lr is not multiplied). */
float ps_optim_lr_group(const ps_optim_config_t *c, uint64_t step, float lr_mult);

/* One torch.optim.SGD step on n elements (lr and wd already include the
 * group multipliers; weight decay is skipped when wd == 0, as torch does):
 *   d = g + wd*w;  buf = first ? d : momentum*buf + (1-dampening)*d;
 *   d = nesterov ? d + momentum*buf : buf;  w -= lr*d
 * buf may be NULL when momentum == 0. */
void ps_optim_sgd(float *w, float *buf, const float *g, size_t n, float lr, float wd,
                  const ps_optim_config_t *c, int first);

/* Apply the update to one partition of table t: w, buf, grad hold that
 * partition's elements; each tensor segment uses its group's multipliers.
 * step = updates applied to this partition so far (0 means first).
 * Returns 0, or PS_EINVAL (bad partition index, buf NULL with momentum, a
 * tensor whose group is outside [0, ngroups)) with nothing modified. */
int ps_optim_apply_partition(const ps_optim_config_t *c, const ps_partition_table_t *t,
                             uint32_t part, float *w, float *buf, const float *grad,
                             uint64_t step);

/* torch.nn.utils.clip_grad_norm_ factor for a gradient whose squared L2 norm
 * is sqnorm: min(1, max_norm / (sqrt(sqnorm) + 1e-6)); 1 when max_norm <= 0.
 * An infinite norm gives 0 (as torch); NaN or negative sqnorm gives NaN so
 * the caller's non-finite check sees it and can skip the step. */
float ps_optim_clip_factor(double sqnorm, float max_norm);

/* Serialise to / from a JSON object text (for INIT and checkpoint metadata).
 * to_json returns a malloc'd string (NULL on out of memory); from_json
 * returns 0 or PS_EINVAL.  Keys are the field names above, except sched is
 * "const" | "step" | "cosine", nesterov is a bool, milestones an array and
 * groups an array of {"lr_mult": x, "wd_mult": y} (plus "kind": "average" for
 * an AVERAGE group; absent = "sgd", so SGD-only configs print as before);
 * nmilestones / ngroups come
 * from the array lengths.  from_json starts from ps_optim_config_default, so
 * absent keys take default values; unknown or duplicate keys, wrong types and
 * a result that fails ps_optim_config_validate are errors naming the key.
 * *c is written only on success. */
char *ps_optim_config_to_json(const ps_optim_config_t *c);
int ps_optim_config_from_json(ps_optim_config_t *c, const char *json, char *err, size_t errlen);
#endif
