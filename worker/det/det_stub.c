/* psworker without libjpeg: the detector's data pipeline is unavailable
 * (configure did not find libjpeg); every entry point says so. */
#include "worker/psworker.h"

#include <math.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

int ps_worker_is_det(const ps_worker_opts_t *o) { return !strncmp(o->model, "retinanet-r", 11); }
int ps_worker_det_setup(ps_worker_t *p, uint32_t nservers)
{
    (void)nservers;
    ps_error("--model %s: the detector needs libjpeg, which configure did not find "
             "(apt-get install libjpeg-dev and rebuild)", p->o->model);
    return PS_EUNSUPPORTED;
}
int ps_worker_det_groups(ps_worker_t *p) { (void)p; return PS_EUNSUPPORTED; }
void ps_worker_det_teardown(ps_worker_t *p) { (void)p; }
double ps_worker_det_compute(ps_worker_t *p, uint64_t step) { (void)p, (void)step; return NAN; }
int ps_worker_det_maybe_validate(ps_worker_t *p, uint64_t step) { (void)p, (void)step; return 0; }
int ps_worker_det_save(ps_worker_t *p, const char *path) { (void)p, (void)path; return PS_EUNSUPPORTED; }
void ps_worker_det_print_final(ps_worker_t *p, uint64_t steps_done) { (void)p, (void)steps_done; }
int ps_worker_det_run_eval(ps_worker_t *p) { (void)p; return PS_EUNSUPPORTED; }
