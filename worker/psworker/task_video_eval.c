/* The video task's validation (task_video.c): TSM's test -- the mean of
 * each video's views' logits, top-1 / top-5 and the loss -- during
 * training on rank 0, at the end of a run with the final line, and as
 * --eval with its per-video predictions CSV. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_crc32c.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/psworker/task_video_internal.h"

/* One video's logits averaged over its K views (clips x crops) into avg:
 * the raw logits, as TSM's test_models.py averages them (its --softmax,
 * off by default, would apply after the mean and not change the ranking);
 * its loss and ranks of the label into the sums.  0 when a logit is not
 * finite: a diverged model, and NaN compares false with everything, so the
 * rank count would call the video correct; it is wrong for top-1 and top-5
 * instead. */
static int score_video(const float *lg, int K, int C, int y, double *avg, double *loss,
                       size_t *c1, size_t *c5)
{
    double mx = -INFINITY, se = 0;
    int finite = 1, rank = 0;
    for (int c = 0; c < C; c++) {
        avg[c] = 0;
        for (int k = 0; k < K; k++) avg[c] += lg[(size_t)k * C + c];
        avg[c] /= K;
        finite &= isfinite(avg[c]) != 0;
        if (avg[c] > mx) mx = avg[c];
    }
    if (!finite) return 0;
    for (int c = 0; c < C; c++) se += exp(avg[c] - mx);
    *loss += -(avg[y] - mx - log(se));
    for (int c = 0; c < C; c++) rank += avg[c] > avg[y] || (avg[c] == avg[y] && c < y);
    *c1 += rank < 1;
    *c5 += rank < 5;
    return 1;
}

static void prediction_row(FILE *pred, const video_t *v, int i, const double *avg, int C, int finite)
{
    int best = finite ? 0 : -1; /* -1: no prediction from non-finite logits */
    for (int c = 1; c < C && finite; c++) best = avg[c] > avg[best] ? c : best;
    fprintf(pred, "%lld,%s,%d,%d", (long long)v->idx[i],
            ps_video_list_name(v->val, (size_t)v->idx[i]), v->labels[i], best);
    for (int c = 0; c < C; c++) fprintf(pred, ",%.9g", avg[c]);
    /* names last, so the logit columns stay where they are; quoted as CSV */
    for (int k = 0; v->names && k < 2; k++)
        ps_csv_put_name(pred, v->names, k ? best : v->labels[i]);
    fputc('\n', pred);
}

/* Validation over the whole --val-list (TSM's test: the mean of the views'
 * logits): mean loss, top-1/top-5; with pred one CSV row per video.  Videos
 * with non-finite logits count as wrong and make the loss NaN. */
static double video_eval_pass(ps_worker_t *p, size_t *videos, FILE *pred)
{
    video_t *v = p->ts;
    char err[1024];
    v->top1 = v->top5 = NAN;
    if (videos) *videos = 0;
    v->val_nonfinite = 0;
    if (!v->val) return NAN;
    if (!v->vl && ps_video_loader_new(v->val, &v->vopt, &v->vl, err, sizeof err)) {
        ps_error("validation loader: %s", err);
        return NAN;
    }
    ps_task_video_scatter(p);
    ps_video_loader_set_epoch(v->vl, 0);
    int K = v->K, C = ps_model_config(v->m)->num_classes, n = 0;
    size_t count = 0, c1 = 0, c5 = 0, bad = 0;
    double loss = 0;
    double *avg = malloc(sizeof(double) * (size_t)C);
    while (avg && (n = ps_video_loader_next(v->vl, v->clips, v->labels, v->idx, NULL)) > 0) {
        if (ps_model_forward(v->m, v->clips, n * K, NULL, 0, NULL) || v->be->sync(&v->ctx)) break;
        const float *lg = ps_model_logits(v->m);
        for (int i = 0; i < n; i++, count++) {
            int finite = score_video(lg + (size_t)i * K * C, K, C, v->labels[i], avg, &loss, &c1, &c5);
            if (!finite) bad++, loss = NAN;
            if (pred) prediction_row(pred, v, i, avg, C, finite);
        }
    }
    free(avg);
    if (n < 0) {
        ps_error("validation data: %s", ps_video_loader_error(v->vl));
        return NAN;
    }
    if (!count) return NAN;
    v->val_nonfinite = bad;
    if (bad)
        ps_warn("validation: %zu of %zu videos have non-finite logits (counted wrong; loss NaN)",
                bad, count);
    v->top1 = (double)c1 / count;
    v->top5 = (double)c5 / count;
    if (videos) *videos = count;
    return loss / count;
}

static void val_csv_row(ps_worker_t *p, uint64_t step)
{
    video_t *v = p->ts;
    if (v->val_csv)
        fprintf(v->val_csv, "%llu,%.3f,%.6f,%.4f,%.4f,%zu\n", (unsigned long long)step,
                ps_task_video_epoch(p, step), v->val_loss, v->top1, v->top5, v->val_nonfinite);
}

/* Rank 0 alone validates; the others meet it at the cluster loop's barrier
 * (a small message, cheap to resend) rather than sit in the next step's
 * PUSHPULL, whose 5 s retries would resend whole gradients. */
int ps_task_video_validate(ps_worker_t *p, uint64_t step)
{
    video_t *v = p->ts;
    if (!ps_worker_val_due(p, step)) return 0;
    if (p->rank != 0) return 1;
    double t0 = ps_worker_now();
    size_t n = 0;
    v->val_loss = video_eval_pass(p, &n, NULL);
    printf("val: iter=%llu videos=%zu loss=%.4f top1=%.4f top5=%.4f eval_s=%.1f",
           (unsigned long long)step, n, v->val_loss, v->top1, v->top5, ps_worker_now() - t0);
    if (v->val_nonfinite) printf(" nonfinite=%zu", v->val_nonfinite);
    printf("\n");
    fflush(stdout);
    val_csv_row(p, step);
    return 1;
}
/* CRC32C of this worker's BN running statistics (the AVERAGE tensors of
 * p->w; with --bn sync the model's own, which the group keeps equal; 0
 * when there are none): equal on every rank when they agree. */
static uint32_t bn_crc(const ps_worker_t *p, int *ntensors)
{
    const video_t *v = p->ts;
    *ntensors = v->nspecs - v->nparams;
    if (vopts(p)->bn_cross) {
        int nb;
        uint32_t crc = 0;
        const ps_model_buffer_t *bu = ps_model_buffers(v->m, &nb);
        v->be->sync((ps_ctx_t *)&v->ctx);
        for (int i = 0; i < nb; i++)
            if (bu[i].f32) crc = ps_crc32c(crc, bu[i].f32, bu[i].numel * sizeof(float)), ++*ntensors;
        return crc;
    }
    if (!*ntensors) return 0;
    size_t off = p->nparam_numel;
    return ps_crc32c(0, p->w + off, (p->numel - off) * sizeof(float));
}

void ps_task_video_print_final(ps_worker_t *p, uint64_t steps_done)
{
    video_t *v = p->ts;
    const ps_worker_stats_t *s = &p->st;
    double ms = 1e3 / (s->counted ? (double)s->counted : 1.0);
    /* Validation on rank 0 only: the others would repeat the same pass
     * (with the same BN statistics, --bn-sync) and print nan, with
     * val=rank0 saying where the numbers are. */
    double t0 = ps_worker_now();
    if (p->rank == 0) v->val_loss = video_eval_pass(p, NULL, NULL);
    double eval_s = ps_worker_now() - t0;
    val_csv_row(p, steps_done);
    double cps = ps_worker_per_s(p);
    printf("final: rank=%d workers=%d model=%s steps=%llu epochs=%.2f batch=%d loss=%.6f "
           "top1=%.4f top5=%.4f val_loss=%.6f clips_per_s=%.2f cluster_clips_per_s=%.2f "
           "step_ms=%.1f data_wait_ms=%.1f compute_ms=%.1f comm_wait_ms=%.1f eval_s=%.1f "
           "wall_s=%.1f",
           p->rank, p->nworkers, p->o->model, (unsigned long long)steps_done,
           ps_task_video_epoch(p, steps_done), p->batch, ps_worker_recent_loss(p), v->top1, v->top5,
           v->val_loss, cps, cps * p->nworkers, s->sum_step * ms, s->sum_data * ms,
           s->sum_compute * ms, s->sum_comm * ms, eval_s, ps_worker_now() - s->t_start);
    int nbn = 0;
    uint32_t crc = bn_crc(p, &nbn);
    printf(" val=%s bn_sync=%d bn_stats=%d bn_crc=%08x", p->rank == 0 ? "here" : "rank0",
           nbn > 0, nbn, (unsigned)crc);
    if (vopts(p)->bn_cross) printf(" bn=sync bn_exchanges=%llu", (unsigned long long)p->bn_group.gathers);
    const ps_video_clip_cost_t c = ps_video_clip_cost(v->tl);
    printf(" frames_per_clip=%.0f bytes_per_clip=%.0f read_ms_per_clip=%.3f "
           "decode_ms_per_clip=%.3f", c.frames, c.bytes, c.read_ms, c.decode_ms);
    if (v->val_nonfinite) printf(" nonfinite=%zu", v->val_nonfinite);
    ps_worker_print_out(p);
    printf("\n");
    fflush(stdout);
}

/* --eval: --weights on --val-list, optionally with --predictions. */
int ps_task_video_eval(ps_worker_t *p)
{
    video_t *v = p->ts;
    double t0 = ps_worker_now();
    size_t n = 0;
    FILE *pred = NULL;
    const char *pp = p->o->data.predictions, *cn = vopts(p)->class_names; /* per-video CSV */
    char err[1024];
    if (*cn && ps_class_names_load_n(cn, ps_model_config(v->m)->num_classes, &v->names, err, sizeof err)) {
        ps_error("--class-names %s", err);
        return PS_EINVAL;
    }
    if (*pp) {
        if (!(pred = fopen(pp, "w"))) {
            ps_error("--predictions %s: %s", pp, strerror(errno));
            return PS_EIO;
        }
        int C = ps_model_config(v->m)->num_classes;
        fprintf(pred, "index,video,label,pred");
        for (int c = 0; c < C; c++) fprintf(pred, ",logit%d", c);
        fputs(v->names ? ",label_name,pred_name\n" : "\n", pred);
    }
    double loss = video_eval_pass(p, &n, pred);
    double dt = ps_worker_now() - t0;
    if (pred && (ferror(pred) | fclose(pred))) {
        ps_error("--predictions %s: write failed", pp);
        return PS_EIO;
    }
    if (!n) return PS_EIO;
    /* TSM's tables: "1-clip centre crop" and "N-clip x 3-crop" top-1 */
    printf("final: model=%s weights=%s videos=%zu clips=%d crops=%d top1=%.4f top5=%.4f "
           "val_loss=%.6f clips_per_s=%.2f wall_s=%.1f", p->o->model, p->o->data.weights, n,
           v->vopt.n_clips, v->vopt.n_crops, v->top1, v->top5, loss, (double)n * v->K / dt, dt);
    if (v->val_nonfinite) printf(" nonfinite=%zu", v->val_nonfinite);
    printf("\n");
    fflush(stdout);
    return 0;
}
