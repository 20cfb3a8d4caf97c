/* --standalone: the same gradient over the whole global batch, then the
 * same ps_optim_apply_partition the servers run, partition by partition:
 * the one-process reference the cluster runs are compared with.  And
 * --eval: the task's evaluation of --weights; --export-onnx: its model
 * as ONNX. */
#include "worker/psworker/psworker.h"

#include <stdio.h>

#include "ps_error.h"
#include "ps_log.h"

int ps_worker_run_standalone(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    int rc = ps_worker_start(p);
    if (rc) return rc;
    if (o->prec.ls_on && (rc = ps_loss_scale_init(&p->ls, &o->prec.ls_cfg))) return rc;
    p->st.t_start = ps_worker_now();
    for (uint64_t s = 0; s < o->steps; s++) {
        double t0 = ps_worker_now();
        ps_worker_ls_begin(p);
        double loss = ps_worker_compute(p, s);
        if ((rc = ps_worker_check_loss(p, loss, s))) return rc;
        ps_worker_devmem_step(p, s);
        int ovf = ps_worker_ls_prepare(p, s);
        double t1 = ps_worker_now();
        /* Skipped: no update at all (weights, momentum), as on the servers;
         * the schedule still counts the step. */
        if (ps_worker_ls_finish(p, s, PS_WORKER_LS_WHERE(ovf), ovf) &&
            (rc = ps_worker_apply_local(p, s)))
            return rc;
        double t2 = ps_worker_now();
        ps_worker_record_step(p, s, loss, t2 - t0, t1 - t0, 0);
        ps_worker_validate(p, s + 1);
    }
    return ps_worker_finish(p, o->steps);
}

int ps_worker_run_eval(ps_worker_t *p)
{
    if (!p->task->eval) {
        ps_error("--eval: the %s task has no evaluation of --weights (the video models and "
                 "the detector have)", p->task->name);
        return PS_EINVAL;
    }
    if (!*p->o->data.weights) ps_warn("--eval without --weights: evaluating the initialisation");
    return p->task->eval(p);
}

int ps_worker_run_export(ps_worker_t *p)
{
    const char *path = p->o->export_onnx;
    if (!p->task->export_onnx) {
        ps_error("--export-onnx: the %s task has no ONNX export (the video models and the "
                 "detector have)", p->task->name);
        return PS_EINVAL;
    }
    if (!*p->o->data.weights) ps_warn("--export-onnx without --weights: exporting the initialisation");
    int rc = p->task->export_onnx(p, path);
    if (!rc) {
        printf("final: model=%s weights=%s onnx=%s\n", p->o->model, p->o->data.weights, path);
        fflush(stdout);
    }
    return rc;
}
