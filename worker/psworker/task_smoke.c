/* The smoke task: a 2-layer MLP (smoke_model.h) on generated data
 * (smoke_data.h), small enough that the whole parameter-server loop runs
 * end to end in seconds without the neural-network engine.  Its data are a
 * function of the sample index, so rank r of W reads exactly what
 * --standalone --batch W*B reads in positions r*B..r*B+B-1. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"
#include "worker/psworker/psworker.h"
#include "worker/psworker/smoke_data.h"
#include "worker/psworker/smoke_model.h"

typedef struct smoke_opts {
    int eval_samples;       /* held-out samples for the eval loss / accuracy */
} smoke_opts_t;

typedef struct smoke {
    ps_smoke_dims_t dims;
    ps_smoke_data_t data;
    ps_smoke_work_t work;
    double *wd, *gd;        /* (numel) double scratch for the model */
    float *x;               /* (cap, D) inputs */
    int *y;                 /* (cap) labels */
    int cap;                /* rows of x / y: max(batch, eval samples) */
    double init_eval_loss, init_eval_acc;
} smoke_t;

static int smoke_claims(const ps_worker_opts_t *o, const void *topts)
{
    (void)topts;
    return !strcmp(o->model, "smoke");
}

static size_t smoke_rows(void *topts, ps_opt_t *rows)
{
    smoke_opts_t *so = topts;
    rows[0] = (ps_opt_t){"eval-samples", PS_OPT_INT, &so->eval_samples,
                         "smoke: held-out samples for the eval loss", "1024"};
    return 1;
}

static int smoke_check(ps_worker_opts_t *o)
{
    const smoke_opts_t *so = ps_worker_task_opts(o);
    if (ps_worker_cpu_only(o, "the smoke model runs on the CPU only (--device applies to the "
                              "video models and the detector)") ||
        ps_worker_fp32_only(o, "the smoke model computes in fp32 (fp16 / bf16 need a video "
                               "model on --device cuda[:N])"))
        return PS_EINVAL;
    if (so->eval_samples < 1 || so->eval_samples > (1 << 20))
        return ps_worker_opt_error("--eval-samples must be in [1, 1048576]");
    return 0;
}

static int smoke_setup(ps_worker_t *p, uint32_t nservers)
{
    const ps_worker_opts_t *o = p->o;
    const smoke_opts_t *so = ps_worker_task_opts(o);
    ps_tensor_spec_t spec[PS_SMOKE_NTENSORS];
    smoke_t *k = calloc(1, sizeof *k);
    if (!k) return PS_ENOMEM;
    p->ts = k;
    ps_smoke_dims_default(&k->dims);
    p->numel = p->nparam_numel = ps_smoke_numel(&k->dims);
    ps_smoke_specs(&k->dims, spec);
    int rc = ps_partition_table_build(&p->table, spec, PS_SMOKE_NTENSORS,
                                      (size_t)o->partition_bytes, nservers);
    if (rc) {
        ps_error("cannot build the partition table (partition_bytes=%llu, servers=%u): %s",
                 (unsigned long long)o->partition_bytes, nservers, ps_strerror(rc));
        return rc;
    }
    /* the optimizer's default groups are the smoke model's: weights, biases */
    if ((rc = ps_worker_build_optim(p)) ||
        (rc = ps_smoke_data_init(&k->data, o->data_seed, k->dims.in, k->dims.classes)))
        return rc;
    k->cap = p->batch > so->eval_samples ? p->batch : so->eval_samples;
    if ((rc = ps_smoke_work_init(&k->work, k->cap, &k->dims))) return rc;
    p->w = calloc(p->numel, sizeof(float));
    p->grad = calloc(p->numel, sizeof(float));
    k->wd = calloc(p->numel, sizeof(double));
    k->gd = calloc(p->numel, sizeof(double));
    k->x = calloc((size_t)k->cap * (size_t)k->dims.in, sizeof(float));
    k->y = calloc((size_t)k->cap, sizeof(int));
    if (!p->w || !p->grad || !k->wd || !k->gd || !k->x || !k->y) {
        ps_error("out of memory for a %zu-parameter model", p->numel);
        return PS_ENOMEM;
    }
    ps_smoke_init(&k->dims, o->seed, p->w);
    ps_info("model smoke: %zu parameters, %u partitions of <= %llu bytes on %u server(s)",
            p->numel, p->table.nparts, (unsigned long long)o->partition_bytes, nservers);
    return 0;
}

/* Loss and accuracy of p->w over the held-out samples. */
static double smoke_eval(ps_worker_t *p, double *accuracy)
{
    smoke_t *k = p->ts;
    int n = ((const smoke_opts_t *)ps_worker_task_opts(p->o))->eval_samples, correct = 0;
    ps_smoke_data_batch(&k->data, PS_SMOKE_EVAL_BASE, n, k->x, k->y);
    double loss = ps_smoke_loss_grad(&k->dims, p->w, k->x, k->y, n, NULL, k->wd, NULL, &k->work,
                                     &correct);
    *accuracy = (double)correct / n;
    return loss;
}

/* The evaluation before training: instant here, and the final line
 * reports it beside the one after. */
static int smoke_start(ps_worker_t *p)
{
    smoke_t *k = p->ts;
    k->init_eval_loss = smoke_eval(p, &k->init_eval_acc);
    return 0;
}

static double smoke_compute(ps_worker_t *p, uint64_t step)
{
    smoke_t *k = p->ts;
    (void)step; /* p->step_first is the step's (elastic.c) */
    uint64_t first = p->step_first + (uint64_t)p->shard * (uint64_t)p->batch;
    ps_smoke_data_batch(&k->data, first, p->batch, k->x, k->y);
    return ps_smoke_loss_grad(&k->dims, p->w, k->x, k->y, p->batch, p->grad, k->wd, k->gd,
                              &k->work, NULL);
}

static int smoke_save(ps_worker_t *p, const char *path)
{
    smoke_t *k = p->ts;
    char err[256] = "", buf[64];
    ps_st_writer_t *w = ps_st_writer_new();
    if (!w) return PS_ENOMEM;
    int rc = 0;
    for (uint32_t i = 0; i < p->table.ntensors && !rc; i++) {
        int64_t shape[2];
        int nd = ps_smoke_shape(&k->dims, (int)i, shape);
        rc = ps_st_writer_add(w, p->table.tensors[i].name, PS_ST_F32, nd, shape,
                              p->w + p->table.tensor_offset[i]);
    }
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)p->st.nloss);
    if (!rc) rc = ps_st_writer_meta(w, "model", p->o->model);
    if (!rc) rc = ps_st_writer_meta(w, "steps", buf);
    if (!rc) rc = ps_st_writer_meta(w, "wire_dtype", p->o->standalone ? "none" : p->o->wire.dtype);
    if (!rc) rc = ps_st_writer_save(w, path, err, sizeof err);
    ps_st_writer_destroy(&w);
    if (rc) ps_error("%s: %s", path, err);
    return rc;
}

static void smoke_print_final(ps_worker_t *p, uint64_t steps_done)
{
    const smoke_t *k = p->ts;
    const ps_worker_stats_t *s = &p->st;
    double acc = 0, ms = 1e3 / (s->counted ? (double)s->counted : 1.0);
    double eval_loss = smoke_eval(p, &acc), sps = ps_worker_per_s(p);
    printf("final: rank=%d workers=%d steps=%llu batch=%d loss=%.6f eval_loss=%.6f "
           "init_eval_loss=%.6f accuracy=%.4f samples_per_s=%.1f cluster_samples_per_s=%.1f "
           "step_ms=%.3f compute_ms=%.3f comm_wait_ms=%.3f stale_drops=%llu wall_s=%.3f",
           p->rank, p->nworkers, (unsigned long long)steps_done, p->batch,
           ps_worker_recent_loss(p), eval_loss, k->init_eval_loss, acc, sps, sps * p->nworkers,
           s->sum_step * ms, s->sum_compute * ms, s->sum_comm * ms,
           (unsigned long long)s->stale_drops, ps_worker_now() - s->t_start);
    ps_worker_print_out(p);
    printf("\n");
    fflush(stdout);
}

static void smoke_teardown(ps_worker_t *p)
{
    smoke_t *k = p->ts;
    if (!k) return;
    ps_smoke_data_free(&k->data);
    ps_smoke_work_free(&k->work);
    free(k->wd), free(k->gd), free(k->x), free(k->y);
    free(k);
    p->ts = NULL;
}

const ps_task_t ps_task_smoke = {
    .name = "smoke",
    .models = "smoke",
    .flags = PS_TASK_ELASTIC,
    .opts_size = sizeof(smoke_opts_t),
    .claims = smoke_claims,
    .opt_rows = smoke_rows,
    .check = smoke_check,
    .setup = smoke_setup,
    .start = smoke_start,
    .compute = smoke_compute,
    .save = smoke_save,
    .print_final = smoke_print_final,
    .teardown = smoke_teardown,
};
