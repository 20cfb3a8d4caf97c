/* psworker's output: the per-iteration CSV, progress lines on stdout, the
 * model file and the final "final:" summary line that scripts parse. */
#include "worker/psworker/psworker.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

double ps_worker_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        ps_error("--out: path too long");
        return PS_EINVAL;
    }
    for (char *q = buf + 1;; q++) {
        if (*q != '/' && *q)
            continue;
        char c = *q;
        *q = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) {
            ps_error("cannot create directory %s: %s", buf, strerror(errno));
            return PS_EIO;
        }
        if (!c)
            break;
        *q = c;
    }
    return 0;
}

int ps_worker_output_open(ps_worker_t *p)
{
    char path[4200];
    const char *out = p->o->out;
    if (!out || !*out)
        return 0;
    int rc = make_dirs(out);
    if (rc)
        return rc;
    if (p->o->standalone)
        snprintf(path, sizeof path, "%s/metrics-standalone.csv", out);
    else
        snprintf(path, sizeof path, "%s/metrics-rank%d.csv", out, p->rank);
    if (!(p->csv = fopen(path, "w"))) {
        ps_error("cannot create %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    /* Line-buffered so progress can be followed (and tests can watch it) live. */
    setvbuf(p->csv, NULL, _IOLBF, 0);
    fprintf(p->csv, "iteration,loss,lr,step_ms,compute_ms,comm_wait_ms,data_wait_ms\n");
    if (p->vid && p->rank == 0) {
        snprintf(path, sizeof path, "%s/val%s.csv", out, p->o->standalone ? "-standalone" : "");
        if (!(p->val_csv = fopen(path, "w"))) {
            ps_error("cannot create %s: %s", path, strerror(errno));
            return PS_EIO;
        }
        setvbuf(p->val_csv, NULL, _IOLBF, 0);
        fprintf(p->val_csv, "iteration,epoch,loss,top1,top5,nonfinite\n");
    }
    return 0;
}

void ps_worker_record_step(ps_worker_t *p, uint64_t step, double loss, double t_step,
                           double t_compute, double t_comm)
{
    ps_worker_stats_t *s = &p->st;
    float lr = ps_optim_lr(&p->optim, step);
    /* compute as measured includes the wait for the batch: split it out */
    double t_data = p->t_data;
    t_compute -= t_data;
    /* The first step pays for connections and page faults: keep it out of
     * the throughput sums when there is more than one. */
    if (step > 0 || p->o->steps == 1) {
        s->sum_step += t_step;
        s->sum_compute += t_compute;
        s->sum_comm += t_comm;
        s->sum_data += t_data;
        s->counted++;
    }
    s->samples += (uint64_t)p->batch;
    s->recent_loss[s->nloss++ % 10] = loss;
    if (p->csv)
        fprintf(p->csv, "%llu,%.6f,%.6g,%.3f,%.3f,%.3f,%.3f\n", (unsigned long long)step, loss,
                (double)lr, t_step * 1e3, t_compute * 1e3, t_comm * 1e3, t_data * 1e3);
    int every = p->o->progress_every;
    if (every > 0 && ((step + 1) % (uint64_t)every == 0 || step + 1 == p->o->steps)) {
        double sps = s->counted ? p->batch * s->counted / s->sum_step : 0;
        if (p->vid)
            printf("iter %llu/%llu epoch %.2f loss %.4f lr %.5g clips/s %.1f data-wait %.1f ms "
                   "compute %.1f ms comm-wait %.1f ms\n",
                   (unsigned long long)step + 1, (unsigned long long)p->o->steps,
                   ps_worker_video_epoch(p, step + 1), loss, (double)lr, sps, t_data * 1e3,
                   t_compute * 1e3, t_comm * 1e3);
        else
        printf("iter %llu/%llu loss %.4f lr %.5g samples/s %.0f compute %.3f ms comm-wait %.3f ms\n",
               (unsigned long long)step + 1, (unsigned long long)p->o->steps, loss, (double)lr,
               sps, t_compute * 1e3, t_comm * 1e3);
        fflush(stdout);
    }
}

int ps_worker_save_model(ps_worker_t *p)
{
    char path[4200], err[256] = "", buf[64];
    const char *out = p->o->out;
    if (!out || !*out || (p->rank != 0 && !(p->vid && p->o->save_all_ranks)))
        return 0;
    if (p->rank == 0)
        snprintf(path, sizeof path, "%s/model.safetensors", out);
    else /* --save-all-ranks: each worker's own copy (BN statistics tests) */
        snprintf(path, sizeof path, "%s/model-rank%d.safetensors", out, p->rank);
    if (p->vid || p->det) {
        int vrc = p->det ? ps_worker_det_save(p, path) : ps_worker_video_save(p, path);
        if (vrc)
            ps_error("cannot save the model to %s: %s", path, ps_strerror(vrc));
        else
            ps_info("model written to %s", path);
        return vrc;
    }
    ps_st_writer_t *w = ps_st_writer_new();
    if (!w) {
        ps_error("cannot save %s: out of memory", path);
        return PS_ENOMEM;
    }
    int rc = 0;
    for (uint32_t i = 0; i < p->table.ntensors && !rc; i++) {
        int64_t shape[2];
        int nd = ps_smoke_shape(&p->dims, (int)i, shape);
        rc = ps_st_writer_add(w, p->table.tensors[i].name, PS_ST_F32, nd, shape,
                              p->w + p->table.tensor_offset[i]);
    }
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)p->st.nloss);
    if (!rc) rc = ps_st_writer_meta(w, "model", p->o->model);
    if (!rc) rc = ps_st_writer_meta(w, "steps", buf);
    if (!rc) rc = ps_st_writer_meta(w, "wire_dtype", p->o->standalone ? "none" : p->o->dtype);
    if (!rc) rc = ps_st_writer_save(w, path, err, sizeof err);
    ps_st_writer_destroy(&w);
    if (rc) {
        ps_error("cannot save the model to %s: %s (%s)", path, err, ps_strerror(rc));
        return rc;
    }
    ps_info("model written to %s", path);
    return 0;
}

void ps_worker_print_final(ps_worker_t *p, uint64_t steps_done)
{
    if (p->det) {
        ps_worker_det_print_final(p, steps_done);
        return;
    }
    const ps_worker_stats_t *s = &p->st;
    uint64_t n = s->nloss < 10 ? s->nloss : 10;
    double loss = 0, acc = 0, ms = 1e3 / (s->counted ? (double)s->counted : 1.0);
    for (uint64_t i = 0; i < n; i++) loss += s->recent_loss[i];
    loss = n ? loss / n : NAN;
    if (p->vid) {
        /* Validation on rank 0 only: the others would repeat the same pass
         * (with the same BN statistics, --bn-sync) and print nan, with
         * val=rank0 saying where the numbers are. */
        double t0 = ps_worker_now();
        if (p->rank == 0)
            p->val_loss = ps_worker_video_eval(p, &p->top1, &p->top5, NULL);
        double eval_s = ps_worker_now() - t0;
        if (p->val_csv)
            fprintf(p->val_csv, "%llu,%.3f,%.6f,%.4f,%.4f,%zu\n", (unsigned long long)steps_done,
                    ps_worker_video_epoch(p, steps_done), p->val_loss, p->top1, p->top5,
                    p->val_nonfinite);
        double cps = s->sum_step > 0 ? (double)p->batch * s->counted / s->sum_step : 0;
        printf("final: rank=%d workers=%d model=%s steps=%llu epochs=%.2f batch=%d loss=%.6f "
               "top1=%.4f top5=%.4f val_loss=%.6f clips_per_s=%.2f cluster_clips_per_s=%.2f "
               "step_ms=%.1f data_wait_ms=%.1f compute_ms=%.1f comm_wait_ms=%.1f eval_s=%.1f "
               "wall_s=%.1f",
               p->rank, p->nworkers, p->o->model, (unsigned long long)steps_done,
               ps_worker_video_epoch(p, steps_done), p->batch, loss, p->top1, p->top5, p->val_loss,
               cps, cps * p->nworkers, s->sum_step * ms, s->sum_data * ms, s->sum_compute * ms,
               s->sum_comm * ms, eval_s, ps_worker_now() - s->t_start);
        int nbn = 0;
        uint32_t bn_crc = ps_worker_video_bn_crc(p, &nbn);
        printf(" val=%s bn_sync=%d bn_stats=%d bn_crc=%08x", p->rank == 0 ? "here" : "rank0",
               nbn > 0, nbn, (unsigned)bn_crc);
        if (p->val_nonfinite) printf(" nonfinite=%zu", p->val_nonfinite);
        if (p->o->out && *p->o->out)
            printf(" out=%s%s", p->o->out, p->rank == 0 ? " model=model.safetensors" : "");
        printf("\n");
        fflush(stdout);
        return;
    }
    double eval_loss = ps_worker_eval(p, &acc);
    double sps = s->sum_step > 0 ? (double)p->batch * s->counted / s->sum_step : 0;
    printf("final: rank=%d workers=%d steps=%llu batch=%d loss=%.6f eval_loss=%.6f "
           "init_eval_loss=%.6f accuracy=%.4f samples_per_s=%.1f cluster_samples_per_s=%.1f "
           "step_ms=%.3f compute_ms=%.3f comm_wait_ms=%.3f stale_drops=%llu wall_s=%.3f",
           p->rank, p->nworkers, (unsigned long long)steps_done, p->batch, loss, eval_loss,
           p->init_eval_loss, acc, sps, sps * p->nworkers, s->sum_step * ms,
           s->sum_compute * ms, s->sum_comm * ms, (unsigned long long)s->stale_drops,
           ps_worker_now() - s->t_start);
    if (p->o->out && *p->o->out)
        printf(" out=%s%s", p->o->out, p->rank == 0 ? " model=model.safetensors" : "");
    printf("\n");
    fflush(stdout);
}
