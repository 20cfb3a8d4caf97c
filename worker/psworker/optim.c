/* The optimizer configuration every process builds the same way (so the
 * servers' update rule and the standalone / ring-mode local update agree),
 * and the INIT spec rank 0 sends the servers (docs/protocol.md). */
#include "worker/psworker/psworker.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

static int parse_milestones(const char *s, ps_optim_config_t *c)
{
    c->nmilestones = 0;
    if (!s || !*s)
        return 0;
    const char *q = s;
    while (*q) {
        char *end;
        unsigned long long v = strtoull(q, &end, 10);
        if (end == q || (*end && *end != ',')) {
            ps_error("--milestones: expected comma-separated step numbers, got \"%s\"", s);
            return PS_EINVAL;
        }
        if (c->nmilestones == PS_OPTIM_MAX_MILESTONES) {
            ps_error("--milestones: at most %d milestones", PS_OPTIM_MAX_MILESTONES);
            return PS_EINVAL;
        }
        c->milestones[c->nmilestones++] = v;
        q = *end ? end + 1 : end;
    }
    return 0;
}

float ps_worker_ef_momentum(const ps_worker_opts_t *o)
{
    /* Ring mode refuses topk/sign; dampening has no DGC form (keep it on psd). */
    if (!o->wire.dgc_momentum || o->standalone || !strcmp(o->mode, "allreduce") ||
        (o->wire.codec_id != PS_CODEC_TOPK && o->wire.codec_id != PS_CODEC_SIGN) || o->optim.dampening != 0.f)
        return 0.f;
    /* auto: not for a dense top-k.  Momentum-factor masking drops the part
     * of an element's velocity momentum SGD would still apply after it is
     * sent, about m^(1/ratio): 0.9^100 ~ 0 at 1%, but 0.9^10 = 35% at 10%
     * (the smoke model at 10%, 120 steps: eval loss 1.07 with it, 0.43 without). */
    float ratio = o->wire.topk_ratio > 0.f ? o->wire.topk_ratio : PS_CODEC_TOPK_DEFAULT_RATIO;
    if (o->wire.dgc_momentum < 0 && o->wire.codec_id == PS_CODEC_TOPK && ratio > 0.0101f)
        return 0.f;
    return o->optim.momentum;
}

uint64_t ps_worker_topk_warmup(const ps_worker_opts_t *o)
{
    return o->wire.topk_warmup_steps >= 0 ? (uint64_t)o->wire.topk_warmup_steps : o->steps / 4;
}

int ps_worker_build_optim(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    ps_optim_config_t *c = &p->optim;
    char err[256] = "";

    ps_optim_config_default(c);
    c->lr = o->optim.lr;
    c->momentum = o->optim.momentum;
    c->dampening = o->optim.dampening;
    c->nesterov = o->optim.nesterov;
    c->weight_decay = o->optim.weight_decay;
    if (ps_worker_ef_momentum(o) > 0.f) {
        /* DGC momentum correction: the workers' pushes already carry the
         * velocity, so the servers apply it with plain SGD. */
        c->momentum = 0.f;
        c->nesterov = 0;
    }
    c->ref_batch = o->optim.ref_batch;
    c->global_batch = p->nworkers * p->batch;
    c->warmup_steps = o->optim.warmup_steps;
    c->warmup_factor = o->optim.warmup_factor;
    c->gamma = o->optim.gamma;
    c->total_steps = o->steps;
    c->min_lr = o->optim.min_lr;
    if (!strcmp(o->optim.schedule, "const") || !strcmp(o->optim.schedule, "constant"))
        c->sched = PS_SCHED_CONST;
    else if (!strcmp(o->optim.schedule, "step"))
        c->sched = PS_SCHED_STEP;
    else if (!strcmp(o->optim.schedule, "cosine"))
        c->sched = PS_SCHED_COSINE;
    else {
        ps_error("--schedule: unknown schedule \"%s\" (const, step or cosine)", o->optim.schedule);
        return PS_EINVAL;
    }
    int rc = parse_milestones(o->optim.milestones, c);
    if (rc)
        return rc;
    /* Two groups: weights (0) and biases (1), both 1x by default; the
     * split exists so the spec exercises per-group multipliers. */
    c->ngroups = 2;
    c->groups[0] = (ps_param_group_t){1.0f, 1.0f};
    c->groups[1] = (ps_param_group_t){1.0f, 1.0f};
    if (ps_optim_config_validate(c, err, sizeof err)) {
        ps_error("optimizer settings: %s", err);
        return PS_EINVAL;
    }
    return 0;
}

char *ps_worker_spec_json(const ps_worker_t *p)
{
    char *optim = ps_optim_config_to_json(&p->optim);
    size_t cap = 384 + (optim ? strlen(optim) : 0) + ps_worker_state_spec(p, NULL, 0);
    for (uint32_t i = 0; i < p->table.ntensors; i++) cap += strlen(p->table.tensors[i].name) + 48;
    char *s = malloc(cap);
    if (!optim || !s) {
        free(optim);
        free(s);
        return NULL;
    }
    size_t n = (size_t)snprintf(s, cap, "{\"tensors\":[");
    for (uint32_t i = 0; i < p->table.ntensors; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s[\"%s\",%zu,%d]", i ? "," : "",
                              p->table.tensors[i].name, p->table.tensors[i].numel,
                              p->table.tensors[i].group);
    n += (size_t)snprintf(s + n, cap - n,
                          "],\"partition_bytes\":%zu,\"num_servers\":%u,\"num_workers\":%d,"
                          "\"optim\":%s", p->table.partition_bytes, p->table.nservers,
                          p->nworkers, optim);
    n += ps_worker_state_spec(p, s + n, cap - n);
    /* elastic membership: the servers' lr rule, the batch keep-batch splits */
    n += (size_t)snprintf(s + n, cap - n, ",\"elastic\":{\"lr\":\"%s\",\"global_batch\":%llu}",
                          p->o->elastic_lr,
                          (unsigned long long)p->w0 * (unsigned long long)p->b0);
    snprintf(s + n, cap - n, "}");
    free(optim);
    return s;
}
