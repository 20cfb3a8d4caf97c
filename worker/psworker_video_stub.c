/* psworker without libjpeg: the video models are unavailable (configure did
 * not find libjpeg); every entry point says so. */
#include "worker/psworker.h"

#include <math.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

int ps_worker_is_video(const ps_worker_opts_t *o) { return strcmp(o->model, "smoke") != 0; }
int ps_worker_video_setup(ps_worker_t *p, uint32_t nservers)
{
    (void)p, (void)nservers;
    ps_error("--model %s: video models need libjpeg, which configure did not find "
             "(apt-get install libjpeg-dev and rebuild)", p->o->model);
    return PS_EUNSUPPORTED;
}
int ps_worker_video_groups(ps_worker_t *p) { (void)p; return PS_EUNSUPPORTED; }
void ps_worker_video_teardown(ps_worker_t *p) { (void)p; }
double ps_worker_video_compute(ps_worker_t *p, uint64_t step) { (void)p, (void)step; return NAN; }
double ps_worker_video_eval(ps_worker_t *p, double *top1, double *top5, size_t *videos)
{
    (void)p;
    *top1 = *top5 = NAN;
    if (videos) *videos = 0;
    return NAN;
}
int ps_worker_video_save(ps_worker_t *p, const char *path) { (void)p, (void)path; return PS_EUNSUPPORTED; }
struct ps_model *ps_worker_video_model(ps_worker_t *p, struct ps_ctx **cuda_ctx)
{
    (void)p;
    *cuda_ctx = NULL;
    return NULL;
}
uint32_t ps_worker_video_bn_crc(const ps_worker_t *p, int *ntensors)
{
    (void)p;
    if (ntensors) *ntensors = 0;
    return 0;
}
size_t ps_worker_video_clip_floats(const ps_worker_t *p) { (void)p; return 0; }
double ps_worker_video_epoch(const ps_worker_t *p, uint64_t steps) { (void)p, (void)steps; return 0; }
int ps_worker_run_eval(ps_worker_t *p) { (void)p; return PS_EUNSUPPORTED; }
int ps_worker_video_precision(ps_worker_t *p, const char *precision)
{
    (void)p, (void)precision;
    return PS_EUNSUPPORTED;
}
int ps_worker_video_loss_scale(ps_worker_t *p, float scale, size_t *scaled)
{
    (void)p, (void)scale;
    *scaled = 0;
    return 0;
}
