/* What every loop does around a step, whatever the task: set-up and
 * teardown of the common state, the compute call, loss scaling, the local
 * optimizer update, device memory figures and the end of a run.
 *
 * Loss scaling (--loss-scale, contract in worker/engine/ps_loss_scale.h):
 * the step's gradient is the backward of scale*loss; it is checked for
 * Inf/NaN and unscaled before the push.  On the fp32 CPU path, multiplying
 * by a power of two commutes exactly with every operation of backward
 * (barring overflow / underflow, which is what the check is for), so
 * scaling the result is the scaled backward bit for bit; a CUDA backend in
 * half precision takes the scale as the loss gradient instead (the task's
 * loss_scale entry). */
#include "worker/psworker/psworker.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"

int ps_worker_setup(ps_worker_t *p, const ps_worker_opts_t *o, uint32_t nservers)
{
    memset(p, 0, sizeof *p);
    p->o = o;
    p->task = ps_tasks[o->task];
    p->rank = o->standalone ? 0 : o->rank;
    p->nworkers = o->standalone ? 1 : o->num_workers;
    p->batch = o->batch;
    int rc = p->task->setup(p, nservers);
    if (!rc) rc = ps_worker_state_init(p);
    if (!rc) rc = ps_worker_elastic_init(p);
    if (!rc && o->standalone && !(p->mom = calloc(p->numel, sizeof(float)))) {
        ps_error("out of memory for the momentum of %zu parameters", p->numel);
        rc = PS_ENOMEM;
    }
    if (rc) ps_worker_teardown(p);
    return rc;
}

void ps_worker_teardown(ps_worker_t *p)
{
    ps_worker_state_free(p);
    ps_worker_elastic_free(p);
    ps_worker_metrics_stop(p);
    if (p->task) p->task->teardown(p);
    if (p->csv) fclose(p->csv);
    ps_partition_table_free(&p->table);
    free(p->w), free(p->grad), free(p->mom);
    p->csv = NULL;
    p->w = p->grad = p->mom = NULL;
}

int ps_worker_open_device(ps_worker_t *p, ps_ctx_t *ctx, const ps_backend_t **be)
{
    const char *dev = p->o->device;
    int rc = ps_engine_init(ctx, p->o->threads);
    if (rc < 0) {
        ps_error("engine init failed: %s", ps_strerror(rc));
        return rc;
    }
    if (*p->o->conv_kernels && (rc = ps_engine_set_conv_kernels(p->o->conv_kernels)))
        return PS_EINVAL;
    if ((rc = ps_engine_open_device(dev, ctx, be))) {
        /* a device that cannot be used is a usage error: exit 2 */
        ps_error("--device %s: cannot use it (%s); --device cpu runs on the CPU", dev,
                 ps_strerror(rc));
        return PS_EINVAL;
    }
    p->be = *be;
    p->ctx = ctx;
    return 0;
}

int ps_worker_start(ps_worker_t *p)
{
    int rc = ps_worker_metrics_start(p);
    if (!rc) rc = ps_worker_output_open(p);
    if (!rc && p->task->start) rc = p->task->start(p);
    return rc;
}

double ps_worker_compute(ps_worker_t *p, uint64_t step)
{
    if (p->o->step_sleep_ms > 0) {
        struct timespec ts = {p->o->step_sleep_ms / 1000, (p->o->step_sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    p->t_data = p->t_read = p->t_decode = 0;
    p->data_bytes = 0;
    ps_worker_elastic_at(p, step);
    ps_worker_state_at(p, step);
    return p->task->compute(p, step);
}

int ps_worker_check_loss(const ps_worker_t *p, double loss, uint64_t step)
{
    if (isfinite(loss)) return 0;
    if (p->compute_rc) return p->compute_rc; /* the cause (bad data, ...) is already logged */
    ps_error("loss is not finite at step %" PRIu64 " (diverged: try a lower --lr)", step);
    return PS_ENONFINITE;
}

int ps_worker_val_due(const ps_worker_t *p, uint64_t step)
{
    int every = p->o->data.val_every;
    return every > 0 && step % (uint64_t)every == 0 && step < p->o->steps;
}

int ps_worker_validate(ps_worker_t *p, uint64_t step)
{
    return p->task->validate ? p->task->validate(p, step) : 0;
}

/* ---- loss scaling ------------------------------------------------------------ */

void ps_worker_ls_begin(ps_worker_t *p)
{
    p->ls_in_backend = 0;
    p->ls_scaled_numel = 0;
    if (p->o->prec.ls_on && p->task->loss_scale)
        p->ls_in_backend = p->task->loss_scale(p, ps_loss_scale_get(&p->ls), &p->ls_scaled_numel);
}

int ps_worker_ls_prepare(ps_worker_t *p, uint64_t step)
{
    const ps_worker_precision_opts_t *pr = &p->o->prec;
    if (!pr->ls_on) return 0;
    const float s = ps_loss_scale_get(&p->ls);
    float *g = p->grad;
    /* what the backend did not scale (all of it on the CPU; BN statistics
     * after the parameters on CUDA), scaled here: one exact unscale below */
    for (size_t i = p->ls_in_backend ? p->ls_scaled_numel : 0; i < p->numel; i++) g[i] *= s;
    if (pr->debug_overflow_at >= 0 && step == (uint64_t)pr->debug_overflow_at && p->numel) {
        ps_warn("step %" PRIu64 ": --debug-overflow-at: gradient set to Inf", step);
        g[0] = INFINITY;
    }
    int ovf = ps_loss_scale_has_overflow(g, p->numel);
    if (!ovf) ps_loss_scale_unscale(&p->ls, g, p->numel);
    return ovf;
}

/* Feeds the step's cluster-wide verdict to the scaler; logs every change of
 * the scale (one line per event, the sequence tests compare across
 * workers). */
int ps_worker_ls_finish(ps_worker_t *p, uint64_t step, const char *where, int verdict)
{
    if (!p->o->prec.ls_on) return 1;
    float before = ps_loss_scale_get(&p->ls);
    int applied = ps_loss_scale_update(&p->ls, verdict);
    float after = ps_loss_scale_get(&p->ls);
    if (!applied)
        ps_info("loss scale: step %" PRIu64 " skipped (overflow %s), scale %.0f -> %.0f", step,
                where, (double)before, (double)after);
    else if (after != before)
        ps_info("loss scale: step %" PRIu64 " clean, scale %.0f -> %.0f", step, (double)before,
                (double)after);
    return applied;
}

int ps_worker_ls_replay(ps_worker_t *p, uint64_t step, const uint64_t *skips, size_t n)
{
    if (!p->o->prec.ls_on) return 0;
    int rc = ps_loss_scale_init(&p->ls, &p->o->prec.ls_cfg);
    if (rc) return rc;
    size_t k = 0;
    for (uint64_t t = 0; t < step; t++) {
        while (k < n && skips[k] < t) k++;
        ps_loss_scale_update(&p->ls, k < n && skips[k] == t);
    }
    ps_info("loss scale: replayed steps 0..%" PRIu64 " from the servers' verdicts (%" PRIu64
            " skipped): scale %.0f", step, p->ls.skipped, (double)ps_loss_scale_get(&p->ls));
    return 0;
}

void ps_worker_ls_report(const ps_worker_t *p)
{
    if (p->o->prec.ls_on)
        ps_info("loss scale: final %.0f, %" PRIu64 " of %" PRIu64 " steps skipped for overflow",
                (double)ps_loss_scale_get(&p->ls), p->ls.skipped, p->ls.steps);
}

/* ---- the local update ------------------------------------------------------------ */

int ps_worker_apply_local(ps_worker_t *p, uint64_t step)
{
    for (uint32_t i = 0; i < p->table.nparts; i++) {
        size_t off = p->table.parts[i].offset;
        int rc = ps_optim_apply_partition(&p->optim, &p->table, i, p->w + off, p->mom + off,
                                          p->grad + off, step);
        if (rc) {
            ps_error("optimizer update of partition %u failed: %s", i, ps_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* ---- device memory ------------------------------------------------------------ */

/* Sampled after each step's backward (the backend frees nothing inside a
 * step, so usage is at its highest there), logged every --progress-every
 * steps and printed at the end. */
void ps_worker_devmem_step(ps_worker_t *p, uint64_t step)
{
    ps_backend_mem_t m;
    if (!p->be || p->be->mem_stats(p->ctx, &m, 1)) return;
    ps_worker_devmem_t *d = &p->devmem;
    if (m.alloc_peak > d->alloc_peak) d->alloc_peak = m.alloc_peak;
    if (m.dev_used_peak > d->used_peak) d->used_peak = m.dev_used_peak;
    d->total = m.dev_total;
    int every = p->o->progress_every;
    if (every > 0 && (step + 1) % (uint64_t)every == 0)
        ps_info("device memory, step %" PRIu64 ": peak %.0f MiB allocated by the backend, "
                "%.0f of %.0f MiB in use on the device", step, m.alloc_peak / 1048576.0,
                m.dev_used_peak / 1048576.0, m.dev_total / 1048576.0);
}

/* One stdout line before "final:" (bench/gpu_check.sh reads it). */
void ps_worker_devmem_report(const ps_worker_t *p)
{
    const ps_worker_devmem_t *d = &p->devmem;
    if (!d->total) return;
    printf("device_memory: peak_alloc_mib=%.1f peak_used_mib=%.1f total_mib=%.1f\n",
           d->alloc_peak / 1048576.0, d->used_peak / 1048576.0, d->total / 1048576.0);
    fflush(stdout);
}

int ps_worker_finish(ps_worker_t *p, uint64_t steps_done)
{
    char kern[512];
    ps_engine_conv_kernels(kern, sizeof kern);
    if (strcmp(kern, "no convolution yet")) ps_info("CPU convolution kernels: %s", kern);
    ps_worker_ls_report(p);
    int rc = ps_worker_save_model(p);
    if (rc) return rc;
    ps_worker_devmem_report(p);
    p->task->print_final(p, steps_done);
    return 0;
}
