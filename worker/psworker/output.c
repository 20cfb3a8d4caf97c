/* psworker's output: the per-iteration CSV, progress lines on stdout, the
 * model file, the final "final:" summary line that scripts parse, and the
 * run's plots (worker/plot/). */
#include "worker/psworker/psworker.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ps_error.h"
#include "ps_log.h"
#include "worker/plot/ps_plot.h"

double ps_worker_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ps_worker_make_dirs(const char *path)
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
    int rc = ps_worker_make_dirs(out);
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
    /* the last column: the step's samples, named by what a sample is */
    fprintf(p->csv, "iteration,loss,lr,step_ms,compute_ms,comm_wait_ms,data_wait_ms,data_bytes,"
                    "read_ms,decode_ms,%s\n", p->task->unit ? p->task->unit : "samples");
    return 0;
}

int ps_worker_val_csv_open(const ps_worker_t *p, const char *header, FILE **f)
{
    const char *out = p->o->out;
    *f = NULL;
    if (p->rank != 0 || !out || !*out) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/val%s.csv", out, p->o->standalone ? "-standalone" : "");
    if (!(*f = fopen(path, "w"))) {
        ps_error("cannot create %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    setvbuf(*f, NULL, _IOLBF, 0);
    fprintf(*f, "%s\n", header);
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
        fprintf(p->csv, "%llu,%.6f,%.6g,%.3f,%.3f,%.3f,%.3f,%llu,%.3f,%.3f,%d\n",
                (unsigned long long)step, loss, (double)lr, t_step * 1e3, t_compute * 1e3,
                t_comm * 1e3, t_data * 1e3, (unsigned long long)p->data_bytes, p->t_read * 1e3,
                p->t_decode * 1e3, p->batch);
    ps_worker_metrics_step(p, step, loss, lr, (const double[4]){t_step, t_data, t_compute, t_comm});
    int every = p->o->progress_every;
    if (every > 0 && ((step + 1) % (uint64_t)every == 0 || step + 1 == p->o->steps)) {
        double sps = s->counted ? p->batch * s->counted / s->sum_step : 0;
        if (p->task->progress)
            p->task->progress(p, step, loss, lr, sps, t_data, t_compute, t_comm);
        else
            printf("iter %llu/%llu loss %.4f lr %.5g samples/s %.0f compute %.3f ms comm-wait "
                   "%.3f ms\n", (unsigned long long)step + 1, (unsigned long long)p->o->steps,
                   loss, (double)lr, sps, t_compute * 1e3, t_comm * 1e3);
        fflush(stdout);
    }
}

int ps_worker_save_model(ps_worker_t *p)
{
    char path[4200];
    const char *out = p->o->out;
    if (!out || !*out || !p->task->save || (p->rank != 0 && !p->o->save_all_ranks))
        return 0;
    if (p->rank == 0)
        snprintf(path, sizeof path, "%s/model.safetensors", out);
    else /* --save-all-ranks: each worker's own copy (BN statistics tests) */
        snprintf(path, sizeof path, "%s/model-rank%d.safetensors", out, p->rank);
    int rc = p->task->save(p, path);
    if (rc)
        ps_error("cannot save the model to %s: %s", path, ps_strerror(rc));
    else
        ps_info("model written to %s", path);
    return rc;
}

double ps_worker_recent_loss(const ps_worker_t *p)
{
    const ps_worker_stats_t *s = &p->st;
    uint64_t n = s->nloss < 10 ? s->nloss : 10;
    double loss = 0;
    for (uint64_t i = 0; i < n; i++) loss += s->recent_loss[i];
    return n ? loss / n : NAN;
}

double ps_worker_per_s(const ps_worker_t *p)
{
    const ps_worker_stats_t *s = &p->st;
    return s->sum_step > 0 ? (double)p->batch * s->counted / s->sum_step : 0;
}

void ps_worker_print_out(const ps_worker_t *p)
{
    if (p->rank_steps[0]) printf(" rank_steps=%s", p->rank_steps);
    if (p->o->out && *p->o->out)
        printf(" out=%s%s", p->o->out, p->rank == 0 ? " model=model.safetensors" : "");
}

void ps_worker_plot(const ps_worker_t *p)
{
    const char *out = p->o->out;
    if (!out || !*out || p->rank != 0 || !p->o->plots || !p->st.nloss) return;
    ps_plot_report_t rep;
    int rc = ps_plot_run(out, &rep);
    if (rc == PS_EUNSUPPORTED) return; /* said how to get them */
    if (rc) {
        ps_warn("no plots of this run (%s); after fixing the cause: psctl plot %s",
                ps_strerror(rc), out);
        return;
    }
    char list[PS_PLOT_MAX * (PS_PLOT_PATH + 1)] = "";
    size_t n = 0;
    for (int i = 0; i < rep.n && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, " %s", rep.files[i].path);
    ps_info("plots:%s", list);
    if (*rep.note) ps_info("plots: %s", rep.note);
}
