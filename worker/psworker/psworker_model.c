/* psworker's model glue: the smoke model, its data, the partition table and
 * the optimizer configuration, built the same way in every process so that
 * the table hash and the update rule agree across the cluster. */
#include "worker/psworker/psworker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/engine/ps_engine.h"

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
    if (!o->dgc_momentum || o->standalone || !strcmp(o->mode, "allreduce") ||
        (o->codec_id != PS_CODEC_TOPK && o->codec_id != PS_CODEC_SIGN) || o->dampening != 0.f)
        return 0.f;
    /* auto: not for a dense top-k.  Momentum-factor masking drops the part
     * of an element's velocity momentum SGD would still apply after it is
     * sent, about m^(1/ratio): 0.9^100 ~ 0 at 1%, but 0.9^10 = 35% at 10%
     * (the smoke model at 10%, 120 steps: eval loss 1.07 with it, 0.43 without). */
    float ratio = o->topk_ratio > 0.f ? o->topk_ratio : PS_CODEC_TOPK_DEFAULT_RATIO;
    if (o->dgc_momentum < 0 && o->codec_id == PS_CODEC_TOPK && ratio > 0.0101f)
        return 0.f;
    return o->momentum;
}

uint64_t ps_worker_topk_warmup(const ps_worker_opts_t *o)
{
    return o->topk_warmup_steps >= 0 ? (uint64_t)o->topk_warmup_steps : o->steps / 4;
}

int ps_worker_build_optim(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    ps_optim_config_t *c = &p->optim;
    char err[256] = "";

    ps_optim_config_default(c);
    c->lr = o->lr;
    c->momentum = o->momentum;
    c->dampening = o->dampening;
    c->nesterov = o->nesterov;
    c->weight_decay = o->weight_decay;
    if (ps_worker_ef_momentum(o) > 0.f) {
        /* DGC momentum correction: the workers' pushes already carry the
         * velocity, so the servers apply it with plain SGD. */
        c->momentum = 0.f;
        c->nesterov = 0;
    }
    c->ref_batch = o->ref_batch;
    c->global_batch = p->nworkers * p->batch;
    c->warmup_steps = o->warmup_steps;
    c->warmup_factor = o->warmup_factor;
    c->gamma = o->gamma;
    c->total_steps = o->steps;
    c->min_lr = o->min_lr;
    if (!strcmp(o->schedule, "const") || !strcmp(o->schedule, "constant"))
        c->sched = PS_SCHED_CONST;
    else if (!strcmp(o->schedule, "step"))
        c->sched = PS_SCHED_STEP;
    else if (!strcmp(o->schedule, "cosine"))
        c->sched = PS_SCHED_COSINE;
    else {
        ps_error("--schedule: unknown schedule \"%s\" (const, step or cosine)", o->schedule);
        return PS_EINVAL;
    }
    int rc = parse_milestones(o->milestones, c);
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

int ps_worker_open_device(const ps_worker_opts_t *o, ps_ctx_t *ctx, const ps_backend_t **be)
{
    int rc = ps_engine_open_device(o->device, ctx, be);
    if (rc) {
        ps_error("--device %s: cannot use it (%s); --device cpu runs on the CPU", o->device,
                 ps_strerror(rc));
        return PS_EINVAL; /* a usage error (exit 2), whatever the cause */
    }
    return 0;
}

int ps_worker_setup(ps_worker_t *p, const ps_worker_opts_t *o, uint32_t nservers)
{
    ps_tensor_spec_t spec[PS_SMOKE_NTENSORS];
    int rc;

    memset(p, 0, sizeof *p);
    p->o = o;
    p->rank = o->standalone ? 0 : o->rank;
    p->nworkers = o->standalone ? 1 : o->num_workers;
    p->batch = o->batch;
    p->top1 = p->top5 = p->val_loss = NAN;
    if (ps_worker_is_det(o)) {
        if ((rc = ps_worker_det_setup(p, nservers)) || (rc = ps_worker_build_optim(p)) ||
            (rc = ps_worker_det_groups(p)))
            goto fail;
        return 0;
    }
    if (ps_worker_is_video(o)) {
        if ((rc = ps_worker_video_setup(p, nservers)) || (rc = ps_worker_build_optim(p)) ||
            (rc = ps_worker_video_groups(p)))
            goto fail;
        return 0;
    }
    ps_smoke_dims_default(&p->dims);
    p->numel = ps_smoke_numel(&p->dims);
    ps_smoke_specs(&p->dims, spec);
    rc = ps_partition_table_build(&p->table, spec, PS_SMOKE_NTENSORS,
                                  (size_t)o->partition_bytes, nservers);
    if (rc) {
        ps_error("cannot build the partition table (partition_bytes=%llu, servers=%u): %s",
                 (unsigned long long)o->partition_bytes, nservers, ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_worker_build_optim(p)))
        goto fail;
    if ((rc = ps_smoke_data_init(&p->data, o->data_seed, p->dims.in, p->dims.classes)))
        goto fail;
    p->cap = p->batch > o->eval_samples ? p->batch : o->eval_samples;
    if ((rc = ps_smoke_work_init(&p->work, p->cap, &p->dims)))
        goto fail;
    p->w = calloc(p->numel, sizeof(float));
    p->grad = calloc(p->numel, sizeof(float));
    p->mom = o->standalone ? calloc(p->numel, sizeof(float)) : NULL;
    p->wd = calloc(p->numel, sizeof(double));
    p->gd = calloc(p->numel, sizeof(double));
    p->x = calloc((size_t)p->cap * (size_t)p->dims.in, sizeof(float));
    p->y = calloc((size_t)p->cap, sizeof(int));
    if (!p->w || !p->grad || (o->standalone && !p->mom) || !p->wd || !p->gd || !p->x || !p->y) {
        ps_error("out of memory for a %zu-parameter model", p->numel);
        rc = PS_ENOMEM;
        goto fail;
    }
    ps_smoke_init(&p->dims, o->seed, p->w);
    ps_info("model smoke: %zu parameters, %u partitions of <= %llu bytes on %u server(s)",
            p->numel, p->table.nparts, (unsigned long long)o->partition_bytes, nservers);
    return 0;
fail:
    ps_worker_teardown(p);
    return rc;
}

void ps_worker_teardown(ps_worker_t *p)
{
    ps_worker_video_teardown(p);
    ps_worker_det_teardown(p);
    if (p->csv)
        fclose(p->csv);
    if (p->val_csv)
        fclose(p->val_csv);
    p->val_csv = NULL;
    ps_partition_table_free(&p->table);
    ps_smoke_data_free(&p->data);
    ps_smoke_work_free(&p->work);
    free(p->w), free(p->grad), free(p->mom), free(p->wd), free(p->gd), free(p->x), free(p->y);
    p->csv = NULL;
    p->w = p->grad = p->mom = NULL;
    p->wd = p->gd = NULL;
    p->x = NULL;
    p->y = NULL;
}

double ps_worker_compute(ps_worker_t *p, uint64_t step)
{
    if (p->o->step_sleep_ms > 0) {
        struct timespec ts = {p->o->step_sleep_ms / 1000, (p->o->step_sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (p->vid)
        return ps_worker_video_compute(p, step);
    if (p->det)
        return ps_worker_det_compute(p, step);
    uint64_t first = step * (uint64_t)p->nworkers * (uint64_t)p->batch +
                     (uint64_t)p->rank * (uint64_t)p->batch;
    ps_smoke_data_batch(&p->data, first, p->batch, p->x, p->y);
    return ps_smoke_loss_grad(&p->dims, p->w, p->x, p->y, p->batch, p->grad, p->wd, p->gd,
                              &p->work, NULL);
}

double ps_worker_eval(ps_worker_t *p, double *accuracy)
{
    if (p->vid) {
        p->val_loss = ps_worker_video_eval(p, &p->top1, &p->top5, NULL);
        if (accuracy)
            *accuracy = p->top1;
        return p->val_loss;
    }
    int n = p->o->eval_samples, correct = 0;
    ps_smoke_data_batch(&p->data, PS_SMOKE_EVAL_BASE, n, p->x, p->y);
    double loss = ps_smoke_loss_grad(&p->dims, p->w, p->x, p->y, n, NULL, p->wd, NULL,
                                     &p->work, &correct);
    if (accuracy)
        *accuracy = (double)correct / n;
    return loss;
}

void ps_worker_initial_eval(ps_worker_t *p)
{
    /* A full validation pass before training costs minutes for a video
     * model and says little (chance level); smoke's is instant. */
    if (p->vid || p->det) {
        p->init_eval_loss = p->init_eval_acc = NAN;
        return;
    }
    p->init_eval_loss = ps_worker_eval(p, &p->init_eval_acc);
}

int ps_worker_maybe_validate(ps_worker_t *p, uint64_t step)
{
    int every = p->o->val_every;
    if (p->det)
        return ps_worker_det_maybe_validate(p, step);
    if (!p->vid || every <= 0 || step % (uint64_t)every != 0 || step >= p->o->steps)
        return 0;
    /* Rank 0 alone validates; the others meet it at the caller's barrier
     * (a small message, cheap to resend) rather than sit in the next
     * step's PUSHPULL, whose 5 s retries would resend whole gradients. */
    if (p->rank != 0)
        return 1;
    double t0 = ps_worker_now();
    size_t n = 0;
    p->val_loss = ps_worker_video_eval(p, &p->top1, &p->top5, &n);
    printf("val: iter=%llu videos=%zu loss=%.4f top1=%.4f top5=%.4f eval_s=%.1f",
           (unsigned long long)step, n, p->val_loss, p->top1, p->top5, ps_worker_now() - t0);
    if (p->val_nonfinite) printf(" nonfinite=%zu", p->val_nonfinite);
    printf("\n");
    fflush(stdout);
    if (p->val_csv)
        fprintf(p->val_csv, "%llu,%.3f,%.6f,%.4f,%.4f,%zu\n", (unsigned long long)step,
                ps_worker_video_epoch(p, step), p->val_loss, p->top1, p->top5, p->val_nonfinite);
    return 1;
}

char *ps_worker_spec_json(const ps_worker_t *p)
{
    char *optim = ps_optim_config_to_json(&p->optim);
    size_t cap = 256 + (optim ? strlen(optim) : 0);
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
    snprintf(s + n, cap - n,
             "],\"partition_bytes\":%zu,\"num_servers\":%u,\"num_workers\":%d,\"optim\":%s}",
             p->table.partition_bytes, p->table.nservers, p->nworkers, optim);
    free(optim);
    return s;
}
