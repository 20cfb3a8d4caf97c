/* The synthetic compute task (--compute synthetic:<model>:<ms>): a worker
 * that moves the real partition layout of a named model
 * (worker/models/model_sizes.h: tsm-r50, tsm-r18, i3d-r50-311, i3d-r50-333,
 * retinanet-r50) through psd or the ring, and stands in for forward +
 * backward with a fixed sleep of <ms> milliseconds -- a GPU computes without
 * the host CPU, so many emulated workers fit on 2 cores and the network is
 * what the run measures.  It runs the same loops as every task.
 *
 * The gradient is a fixed deterministic pattern (filled once: refilling
 * 25 M floats per step would be CPU the GPU would not take from the host),
 * small enough that hundreds of steps of SGD keep the weights finite.  The
 * optimizer is the model's usual one (lr, momentum, ... from the flags); in
 * ring mode the local update is left out (PS_TASK_NO_LOCAL_UPDATE: on a GPU
 * it is part of the compute time, and 16 CPU updates of 25 M parameters
 * would measure the CPU, not the network); in PS mode the servers apply it,
 * as they would.  The step is split into data wait (0: no data), compute
 * (the sleep) and communication wait, printed on the final: line and in
 * the CSV. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/models/model_sizes.h"
#include "worker/psworker/psworker.h"

#define SYNTH_PREFIX "synthetic:"

typedef struct synth_opts {
    char *compute;          /* "synthetic:<model>:<ms>" ("" = not this task) */
    /* derived by the check */
    char name[64];
    double ms;
} synth_opts_t;

typedef struct synth {
    psbench_model_t m;      /* the layout (owns the tensor names) */
} synth_t;

static const synth_opts_t *sopts(const ps_worker_t *p) { return ps_worker_task_opts(p->o); }

static int synth_claims(const ps_worker_opts_t *o, const void *topts)
{
    const synth_opts_t *s = topts;
    return s->compute && *s->compute;
}

static size_t synth_rows(void *topts, ps_opt_t *rows)
{
    synth_opts_t *s = topts;
    rows[0] = (ps_opt_t){"compute", PS_OPT_STRING, &s->compute,
                         "synthetic:<model>:<ms>: real partition layout, sleep for compute", ""};
    return 1;
}

/* "synthetic:<model>:<ms>" -> model name and milliseconds. */
static int parse_spec(synth_opts_t *s)
{
    const char *spec = s->compute, *m = spec + strlen(SYNTH_PREFIX), *colon;
    if (strncmp(spec, SYNTH_PREFIX, strlen(SYNTH_PREFIX)) || !(colon = strrchr(m, ':')) ||
        colon == m || (size_t)(colon - m) >= sizeof s->name)
        return ps_worker_opt_error("--compute: expected synthetic:<model>:<ms> with model one of "
                "%s, got \"%s\"", psbench_model_names(), spec);
    memcpy(s->name, m, (size_t)(colon - m));
    s->name[colon - m] = 0;
    char *end;
    s->ms = strtod(colon + 1, &end);
    if (end == colon + 1 || *end || !(s->ms >= 0 && s->ms <= 600000))
        return ps_worker_opt_error("--compute %s: <ms> must be a number in [0, 600000]", spec);
    return 0;
}

static int synth_check(ps_worker_opts_t *o)
{
    synth_opts_t *s = ps_worker_task_opts(o);
    if (parse_spec(s)) return PS_EINVAL;
    if (o->standalone || o->eval)
        return ps_worker_opt_error("--compute synthetic needs --servers or --mode allreduce");
    psbench_model_t m = {0};
    if (psbench_model_build(&m, s->name))
        return ps_worker_opt_error("--compute %s: unknown model \"%s\" (one of %s)", s->compute,
                s->name, psbench_model_names());
    psbench_model_free(&m);
    if (ps_worker_cpu_only(o, "synthetic compute runs no model (it sleeps in place of a GPU)") ||
        ps_worker_fp32_only(o, "synthetic compute runs no model (--dtype sets the wire)"))
        return PS_EINVAL;
    return 0;
}

static int synth_setup(ps_worker_t *p, uint32_t nservers)
{
    const ps_worker_opts_t *o = p->o;
    const synth_opts_t *so = sopts(p);
    synth_t *k = calloc(1, sizeof *k);
    if (!k) return PS_ENOMEM;
    p->ts = k;
    int rc = psbench_model_build(&k->m, so->name);
    if (!rc) rc = ps_partition_table_build(&p->table, k->m.tensors, k->m.ntensors,
                                           (size_t)o->partition_bytes, nservers);
    if (rc) {
        ps_error("partition table of %s: %s", so->name, ps_strerror(rc));
        return rc;
    }
    p->numel = p->nparam_numel = p->table.total_numel;
    if ((rc = ps_worker_build_optim(p))) return rc;
    p->w = malloc(p->numel * sizeof(float));
    p->grad = malloc(p->numel * sizeof(float));
    if (!p->w || !p->grad) {
        ps_error("out of memory for %zu parameters", p->numel);
        return PS_ENOMEM;
    }
    for (size_t i = 0; i < p->numel; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(o->seed * 40503u);
        p->w[i] = ((float)(h % 2001u) - 1000.0f) * 1e-5f;
        /* o->rank, not the HELLO-assigned one: -1 there gives the 1x pattern */
        p->grad[i] = ((float)((h >> 11) % 2001u) - 1000.0f) * 1e-7f *
                     (float)(1 + (o->rank > 0 ? o->rank : 0) % 4);
    }
    int ring = !strcmp(o->mode, "allreduce");
    ps_info("synthetic %s: %zu parameters (%.1f MB fp32) in %u partitions, compute %.1f ms, %s",
            so->name, p->numel, p->numel * 4e-6, p->table.nparts, so->ms,
            ring ? "ring" : "parameter server");
    return 0;
}

static double synth_compute(ps_worker_t *p, uint64_t step)
{
    double ms = sopts(p)->ms;
    (void)step;
    if (ms > 0) {
        struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return 1.0; /* no loss to report: a constant keeps the CSV well-formed */
}

static void synth_print_final(ps_worker_t *p, uint64_t steps_done)
{
    const ps_worker_opts_t *o = p->o;
    const ps_worker_stats_t *s = &p->st;
    double k = s->counted ? 1e3 / (double)s->counted : 0, sps = ps_worker_per_s(p);
    int ring = !strcmp(o->mode, "allreduce");
    printf("final: rank=%d workers=%d model=synthetic:%s mode=%s dtype=%s codec=%s steps=%llu "
           "batch=%d step_ms=%.3f data_wait_ms=%.3f compute_ms=%.3f comm_wait_ms=%.3f "
           "samples_per_s=%.2f cluster_samples_per_s=%.2f sent_bytes_per_step=%.0f "
           "recv_bytes_per_step=%.0f wall_s=%.3f\n",
           p->rank, p->nworkers, sopts(p)->name, ring ? "allreduce" : o->mode,
           ps_dtype_name(o->wire.dt), ps_codec_name(o->wire.codec_id),
           (unsigned long long)steps_done, p->batch, s->sum_step * k, s->sum_data * k,
           s->sum_compute * k, s->sum_comm * k, sps, sps * p->nworkers,
           (double)s->wire_sent / (double)o->steps, (double)s->wire_recv / (double)o->steps,
           ps_worker_now() - s->t_start);
    fflush(stdout);
}

static void synth_teardown(ps_worker_t *p)
{
    synth_t *k = p->ts;
    if (!k) return;
    psbench_model_free(&k->m);
    free(k);
    p->ts = NULL;
}

const ps_task_t ps_task_synthetic = {
    .name = "synthetic",
    .models = "--compute synthetic:<model>:<ms>",
    .flags = PS_TASK_NO_LOCAL_UPDATE,
    .opts_size = sizeof(synth_opts_t),
    .claims = synth_claims,
    .opt_rows = synth_rows,
    .check = synth_check,
    .setup = synth_setup,
    .compute = synth_compute,
    .print_final = synth_print_final,
    .teardown = synth_teardown,
};
