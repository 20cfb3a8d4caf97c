/* psworker --compute synthetic:<model>:<ms> (issue 7): a worker that moves
 * the real partition layout of a named model (worker/models/model_sizes.h: tsm-r50,
 * tsm-r18, i3d-r50, retinanet-r50) through psd or the ring, and stands in
 * for forward + backward with a fixed sleep of <ms> milliseconds -- a GPU
 * computes without the host CPU, so many emulated workers fit on 2 cores
 * and the network is what the run measures.
 *
 * The gradient is a fixed deterministic pattern (filled once: refilling
 * 25 M floats per step would be CPU the GPU would not take from the host),
 * small enough that hundreds of steps of SGD keep the weights finite.  The
 * optimizer is the model's usual one (lr, momentum, ... from the flags); in
 * ring mode the local update is skipped (on a GPU it is part of the
 * compute time, and 16 CPU updates of 25 M parameters would measure the
 * CPU, not the network); in PS mode the servers apply it, as they would.
 * The step is split into data wait (0: no data), compute (the sleep) and
 * communication wait, printed on the final: line and in the CSV. */
#include "worker/psworker/psworker.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/models/model_sizes.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/client/ps_client.h"

#define SYNTH_PREFIX "synthetic:"

int ps_worker_is_synthetic(const ps_worker_opts_t *o)
{
    return o->compute && *o->compute;
}

/* "synthetic:<model>:<ms>" -> model name (into buf) and milliseconds. */
static int parse_spec(const char *spec, char *model, size_t len, double *ms)
{
    const char *m = spec + strlen(SYNTH_PREFIX), *colon;
    if (strncmp(spec, SYNTH_PREFIX, strlen(SYNTH_PREFIX)) || !(colon = strrchr(m, ':')) ||
        colon == m || (size_t)(colon - m) >= len) {
        fprintf(stderr, "psworker: --compute: expected synthetic:<model>:<ms> with model one of "
                "%s, got \"%s\"\n", psbench_model_names(), spec);
        return PS_EINVAL;
    }
    memcpy(model, m, (size_t)(colon - m));
    model[colon - m] = 0;
    char *end;
    *ms = strtod(colon + 1, &end);
    if (end == colon + 1 || *end || !(*ms >= 0 && *ms <= 600000)) {
        fprintf(stderr, "psworker: --compute %s: <ms> must be a number in [0, 600000]\n", spec);
        return PS_EINVAL;
    }
    return 0;
}

static double g_ms; /* the emulated compute time of this process */

static double synth_compute(ps_worker_t *p, uint64_t step)
{
    (void)step;
    p->t_data = 0;
    if (g_ms > 0) {
        struct timespec ts = {(time_t)(g_ms / 1e3), (long)(fmod(g_ms, 1e3) * 1e6)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return 1.0; /* no loss to report: a constant keeps the CSV well-formed */
}

/* The PS-mode loop: the cluster loop's shape (HELLO, INIT by rank 0,
 * BARRIER, PULL, then PUSHPULL of every partition per step), without the
 * async / checkpoint-resume cases the study does not use. */
static int wait_all(ps_client_t *c, ps_req_t **req, uint32_t n, const char *what, uint64_t step)
{
    int first = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!req[i])
            continue;
        int rc = ps_client_wait(c, req[i], -1, NULL);
        req[i] = NULL;
        if (rc && !first) {
            ps_error("step %" PRIu64 ": %s of partition %u failed: %s (%s)", step, what, i,
                     ps_strerror(rc), ps_client_last_error(c));
            first = rc;
        }
    }
    return first;
}

static int run_ps(ps_worker_t *p, uint64_t *sent, uint64_t *recv)
{
    const ps_worker_opts_t *o = p->o;
    int rc;
    ps_req_t **req = calloc(p->table.nparts, sizeof *req);
    ps_client_t *c = NULL;
    if (!req)
        return PS_ENOMEM;
    if ((rc = ps_worker_client_connect(p, &c)))
        goto out;
    if (p->rank == 0) {
        char *spec = ps_worker_spec_json(p);
        int ck = 0;
        rc = spec ? ps_client_init(c, spec, p->w, &ck) : PS_ENOMEM;
        free(spec);
        if (rc) {
            ps_error("INIT failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
            goto out;
        }
    }
    if ((rc = ps_client_barrier(c))) {
        ps_error("barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
        goto out;
    }
    for (uint32_t i = 0; i < p->table.nparts && !rc; i++)
        rc = ps_client_pull(c, i, 0, p->w + p->table.parts[i].offset, &req[i]);
    {
        int r = wait_all(c, req, p->table.nparts, "pull", 0);
        if ((rc = rc ? rc : r))
            goto out;
    }
    if ((rc = ps_worker_output_open(p)))
        goto out;
    ps_client_counters_t k0, k1;
    ps_client_counters(c, &k0);
    p->st.t_start = ps_worker_now();
    for (uint64_t s = 0; s < o->steps && !rc; s++) {
        double t0 = ps_worker_now();
        synth_compute(p, s);
        double t1 = ps_worker_now();
        for (uint32_t i = 0; i < p->table.nparts && !rc; i++) {
            size_t off = p->table.parts[i].offset;
            rc = ps_client_pushpull(c, i, s, p->grad + off, p->w + off, 0, &req[i]);
        }
        int r = wait_all(c, req, p->table.nparts, "pushpull", s);
        rc = rc ? rc : r;
        double t2 = ps_worker_now();
        if (!rc)
            ps_worker_record_step(p, s, 1.0, t2 - t0, t1 - t0, t2 - t1);
    }
    ps_client_counters(c, &k1);
    *sent = k1.bytes_out - k0.bytes_out;
    *recv = k1.bytes_in - k0.bytes_in;
    if (!rc && (rc = ps_client_barrier(c)))
        ps_error("final barrier failed: %s (%s)", ps_strerror(rc), ps_client_last_error(c));
    if (!rc && p->rank == 0 && o->shutdown_servers && (rc = ps_client_shutdown_servers(c)))
        ps_error("SHUTDOWN failed: %s", ps_strerror(rc));
out:
    ps_client_destroy(&c);
    free(req);
    return rc;
}

int ps_worker_run_synthetic(const ps_worker_opts_t *o)
{
    char name[64];
    double ms;
    psbench_model_t m = {0};
    ps_worker_t p;
    int rc, ring = !strcmp(o->mode, "allreduce");
    uint64_t sent = 0, recv = 0;

    if ((rc = parse_spec(o->compute, name, sizeof name, &ms)))
        return rc;
    if (o->standalone || o->eval) {
        fprintf(stderr, "psworker: --compute synthetic needs --servers or --mode allreduce\n");
        return PS_EINVAL;
    }
    if ((rc = psbench_model_build(&m, name))) {
        fprintf(stderr, "psworker: --compute %s: unknown model \"%s\" (one of %s)\n", o->compute,
                name, psbench_model_names());
        return PS_EINVAL;
    }
    g_ms = ms;
    memset(&p, 0, sizeof p);
    p.o = o;
    p.rank = o->rank;
    p.nworkers = o->num_workers;
    p.batch = o->batch;
    p.top1 = p.top5 = p.val_loss = NAN;
    uint32_t nservers = 1;
    if (!ring)
        for (const char *q = o->servers; *q; q++) nservers += *q == ',';
    rc = ps_partition_table_build(&p.table, m.tensors, m.ntensors, (size_t)o->partition_bytes,
                                  nservers);
    if (rc) {
        ps_error("partition table of %s: %s", name, ps_strerror(rc));
        goto out;
    }
    p.numel = p.table.total_numel;
    if ((rc = ps_worker_build_optim(&p)))
        goto out;
    p.w = malloc(p.numel * sizeof(float));
    p.grad = malloc(p.numel * sizeof(float));
    if (!p.w || !p.grad) {
        ps_error("out of memory for %zu parameters", p.numel);
        rc = PS_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < p.numel; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(o->seed * 40503u);
        p.w[i] = ((float)(h % 2001u) - 1000.0f) * 1e-5f;
        /* o->rank, not the HELLO-assigned one: -1 there gives the 1x pattern */
        p.grad[i] = ((float)((h >> 11) % 2001u) - 1000.0f) * 1e-7f *
                    (float)(1 + (o->rank > 0 ? o->rank : 0) % 4);
    }
    ps_info("synthetic %s: %zu parameters (%.1f MB fp32) in %u partitions, compute %.1f ms, %s",
            name, p.numel, p.numel * 4e-6, p.table.nparts, ms, ring ? "ring" : "parameter server");
    if (ring) {
        /* A local update of 25 M parameters per step is GPU work: left out. */
        rc = ps_worker_allreduce_train(&p, synth_compute, 0);
        sent = p.st.wire_sent, recv = p.st.wire_recv;
    } else {
        rc = run_ps(&p, &sent, &recv);
    }
    if (!rc) {
        const ps_worker_stats_t *s = &p.st;
        double k = s->counted ? 1e3 / (double)s->counted : 0;
        double sps = s->sum_step > 0 ? (double)p.batch * s->counted / s->sum_step : 0;
        printf("final: rank=%d workers=%d model=synthetic:%s mode=%s dtype=%s codec=%s steps=%llu "
               "batch=%d step_ms=%.3f data_wait_ms=%.3f compute_ms=%.3f comm_wait_ms=%.3f "
               "samples_per_s=%.2f cluster_samples_per_s=%.2f sent_bytes_per_step=%.0f "
               "recv_bytes_per_step=%.0f wall_s=%.3f\n",
               p.rank, p.nworkers, name, ring ? "allreduce" : o->mode, ps_dtype_name(o->dt),
               ps_codec_name(o->codec_id), (unsigned long long)o->steps, p.batch,
               s->sum_step * k, s->sum_data * k, s->sum_compute * k, s->sum_comm * k, sps,
               sps * p.nworkers, (double)sent / (double)o->steps, (double)recv / (double)o->steps,
               ps_worker_now() - s->t_start);
        fflush(stdout);
    }
out:
    if (p.csv)
        fclose(p.csv);
    if (p.val_csv)
        fclose(p.val_csv);
    ps_partition_table_free(&p.table);
    free(p.w), free(p.grad), free(p.mom);
    psbench_model_free(&m);
    return rc;
}
