/* psworker: one data-parallel training process.  With --servers it trains
 * against psd servers (HELLO, INIT from rank 0, BARRIER, PULL, then
 * PUSHPULL per step); with --mode allreduce it averages gradients over a
 * ring of workers; with --standalone it trains the same model with the same
 * optimizer code alone, the single-process reference the cluster run is
 * compared with; --eval evaluates --weights; --export-onnx writes the
 * model as ONNX.  Exit status: 0 on success, 1
 * on a training or connection error, 2 on bad options. */
#include <stdio.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/engine/ps_blas.h"
#include "worker/psworker/psworker.h"

int main(int argc, char **argv)
{
    ps_worker_opts_t o;
    ps_worker_t p;
    /* Before any thread exists: a fast OpenBLAS core for this CPU and bounded
     * OpenMP spinning (both read by the libraries before main; may re-exec). */
    ps_blas_autoselect(argc, argv);
    ps_log_set_prog("psworker");
    int rc = ps_worker_opts_parse(&o, argc, argv);
    if (rc) {
        ps_worker_opts_free(&o);
        return rc == 1 ? 0 : 2;
    }
    int ring = !o.standalone && !strcmp(o.mode, "allreduce");
    uint32_t nservers = o.standalone || ring ? 1 : (uint32_t)ps_worker_count_fields(o.servers);
    if ((rc = ps_worker_setup(&p, &o, nservers))) {
        ps_worker_opts_free(&o);
        return rc == PS_EINVAL ? 2 : 1;
    }
    rc = *o.export_onnx ? ps_worker_run_export(&p)
         : o.eval ? ps_worker_run_eval(&p)
         : o.standalone ? ps_worker_run_standalone(&p)
         : ring ? ps_worker_run_ring(&p) : ps_worker_run_cluster(&p);
    if (!o.eval) ps_worker_plot(&p); /* a failed run's curves too: they show why */
    ps_worker_teardown(&p);
    ps_worker_opts_free(&o);
    if (rc) fprintf(stderr, "psworker: training failed: %s\n", ps_strerror(rc));
    return rc ? 1 : 0;
}
