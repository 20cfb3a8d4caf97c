/* psworker --mode allreduce: data-parallel training without servers
 * (DESIGN.md section 2, ring mode; issue 7).
 *
 * Step: compute this rank's mean gradient (the same model glue as PS mode:
 * ps_worker_compute, or the synthetic stand-in), average it over all ranks
 * -- the ring's chunked, pipelined reduce-scatter + all-gather (worker/
 * ps_ring.h) or NCCL -- and apply ps_optim_apply_partition, partition by
 * partition with the step number as version, to this rank's own fp32
 * master copy and momentum.  That is what psd runs on the mean of the
 * pushes, so PS mode and ring mode give the same weights up to the order of
 * the fp32 sum (tests/test_allreduce.sh checks 1e-5 relative).
 *
 * The whole gradient goes through one allreduce call: the partitions are
 * contiguous in model order, so this is the same partitions' data with one
 * pipeline instead of one per partition (a dense sum does not care where a
 * partition ends; the ring cuts its own chunks).  Every rank starts from
 * the same weights (same --seed / --weights, as every PS-mode worker pulls
 * the same INIT) and the ring hands every rank bit-identical sums, so the
 * replicas never drift apart.
 *
 * Wire: fp32 / fp16 / bf16 only.  Top-k, sign and lz4 are refused here with
 * the reason (ps_ring.h: a sparse or 1-bit partial sum is not closed under
 * addition), as is --ef-rounding (its residual is kept per push, and a
 * ring partial sum is rounded at every hop, not once per worker).
 *
 * Loss scaling (--loss-scale; contract in worker/engine/ps_loss_scale.h,
 * "an overflow on any worker skips the step everywhere"): each rank scales,
 * checks and unscales its own gradient as in PS mode, then its overflow
 * flag (0 or 1) travels as one extra fp32 element after the PS_PART_EXACT
 * tail, so the ring sums the flags exactly (small integers in fp32, on any
 * --dtype) and every rank reads the same count.  The verdict is
 * "count > 0, or the mean is not finite": the second half catches an fp16
 * wire sum that saturated to Inf although every rank was clean, and since
 * the ring hands every rank the same bits of the mean, every rank reaches
 * the same verdict without another message.  On overflow every rank leaves
 * weights and momentum untouched (the schedule still counts the step) and
 * halves its scale -- what psd does in PS mode, so the two modes keep
 * giving the same weights (tests/test_allreduce_loss_scale.sh). */
#include "worker/psworker/psworker.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ps_error.h"
#include "ps_log.h"
#include "worker/comm/ps_ring.h"
#ifdef PS_HAVE_CUDA
#include "worker/engine/cuda/ps_cuda.h"
#include "worker/comm/ps_nccl.h"
#endif

/* Count the comma-separated non-empty fields of s. */
static int count_fields(const char *s)
{
    int n = 0, in = 0;
    for (; *s; s++) {
        if (*s == ',') in = 0;
        else if (!in) in = 1, n++;
    }
    return n;
}

int ps_worker_allreduce_check(ps_worker_opts_t *o)
{
    const char *me = "psworker: --mode allreduce";
    if (*o->servers) {
        fprintf(stderr, "%s runs without servers: give --peers instead of --servers\n", me);
        return PS_EINVAL;
    }
    int np = count_fields(o->peers);
    if (np < 1 || np > 65535) {
        fprintf(stderr, "%s needs --peers tcp://HOST:PORT,... (one endpoint per rank, "
                "rank r binds the r-th; 1..65535 of them)\n", me);
        return PS_EINVAL;
    }
    if (o->num_workers == 1) /* the default: the peer list says how many */
        o->num_workers = np;
    if (o->num_workers != np) {
        fprintf(stderr, "%s: --num-workers %d but --peers lists %d endpoints\n", me,
                o->num_workers, np);
        return PS_EINVAL;
    }
    if (o->rank < 0 || o->rank >= np) {
        fprintf(stderr, "%s needs --rank in [0, %d) (there is no server to assign one)\n",
                me, np);
        return PS_EINVAL;
    }
    if (strcmp(o->allreduce, "ring") && strcmp(o->allreduce, "nccl")) {
        fprintf(stderr, "psworker: --allreduce: expected ring|nccl, got \"%s\"\n", o->allreduce);
        return PS_EINVAL;
    }
    if (!strcmp(o->allreduce, "nccl")) {
#ifdef PS_HAVE_CUDA
        if (!ps_nccl_compiled()) {
            fprintf(stderr, "psworker: --allreduce nccl: this psworker was built with CUDA but "
                    "configure found no libnccl; use --allreduce ring\n");
            return PS_EINVAL;
        }
#else
        fprintf(stderr, "psworker: --allreduce nccl: this psworker was built without CUDA/NCCL; "
                "use --allreduce ring\n");
        return PS_EINVAL;
#endif
    }
    if (o->codec_id != PS_CODEC_RAW) {
        fprintf(stderr, "%s: --codec %s is not supported in ring mode: a ring forwards partial "
                "sums, and a top-k, sign or lz4-framed partial sum is not closed under "
                "addition (each hop would have to decode, add and re-compress with its own "
                "error feedback).  Use --dtype fp16|bf16 for a smaller wire, or PS mode "
                "(--servers) for topk/sign\n", me, ps_codec_name(o->codec_id));
        return PS_EINVAL;
    }
    if (o->ef_rounding) {
        fprintf(stderr, "%s: --ef-rounding is a PS-mode option (the residual of one push); "
                "ring partial sums are rounded at every hop\n", me);
        return PS_EINVAL;
    }
    if (o->ring_conns < 1 || o->ring_conns > 16) {
        fprintf(stderr, "psworker: --ring-conns must be in [1, 16]\n");
        return PS_EINVAL;
    }
    if (strcmp(o->mode, "allreduce")) /* unreachable from main; kept for callers */
        return PS_EINVAL;
    return 0;
}

/* The averaging backend: the TCP ring (worker/comm/ps_ring.h), or NCCL on a device buffer. */
typedef struct reducer {
    ps_ring_t *ring;
#ifdef PS_HAVE_CUDA
    ps_nccl_t *nccl;
    float *dbuf; /* (numel + 1) device copy of the gradient (+ loss-scale flag) */
#endif
} reducer_t;

static char **split_list(const char *list, int *n)
{
    size_t len = strlen(list);
    int cnt = count_fields(list) + 1;
    char **v = malloc(sizeof(char *) * (size_t)(cnt + 1) + len + 1);
    if (!v)
        return NULL;
    char *buf = (char *)(v + cnt + 1);
    memcpy(buf, list, len + 1);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        v[(*n)++] = tok;
    v[*n] = NULL;
    return v;
}

static int reducer_open(reducer_t *rd, const ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    int n = 0, rc;
    char **peers = split_list(o->peers, &n);
    int timeout = o->timeout_ms > 0 ? o->timeout_ms : 24 * 3600 * 1000;

    memset(rd, 0, sizeof *rd);
    if (!peers)
        return PS_ENOMEM;
    if (!strcmp(o->allreduce, "nccl")) {
#ifdef PS_HAVE_CUDA
        int dev = 0, ndev = ps_cuda_device_count();
        if (!strncmp(o->device, "cuda:", 5))
            dev = atoi(o->device + 5);
        else if (ndev > 0)
            dev = p->rank % ndev; /* one GPU per rank on a multi-GPU host */
        if (ndev < 1) {
            ps_error("--allreduce nccl: no CUDA device visible");
            rc = PS_EUNSUPPORTED;
        } else if ((rc = ps_nccl_new(&rd->nccl, p->rank, p->nworkers, peers[0], dev, timeout))) {
            ps_error("NCCL communicator (rank %d of %d, rendezvous %s, device %d): %s",
                     p->rank, p->nworkers, peers[0], dev, ps_strerror(rc));
        } else if ((rc = ps_cuda_malloc((void **)&rd->dbuf, (p->numel + 1) * sizeof(float)))) {
            /* + 1: the loss-scale flag after the EXACT tail (at most numel + 1) */
            ps_error("--allreduce nccl: no device memory for a %zu-float gradient", p->numel);
        }
#else
        rc = PS_EUNSUPPORTED;
#endif
        free(peers);
        return rc;
    }
    ps_ring_opts_t ro;
    ps_ring_opts_default(&ro);
    ro.timeout_ms = timeout;
    ro.nconn = o->ring_conns;
    rc = ps_ring_new(&rd->ring, p->rank, p->nworkers, (const char *const *)peers, &ro);
    if (rc)
        ps_error("cannot create ring rank %d of %d (bind %s): %s", p->rank, p->nworkers,
                 peers[p->rank], ps_strerror(rc));
    free(peers);
    return rc;
}

/* grad[0..n) := mean over ranks, in place on the host. */
static int reducer_mean(reducer_t *rd, float *grad, size_t n, ps_dtype_t dt)
{
#ifdef PS_HAVE_CUDA
    if (rd->nccl) {
        int rc = ps_cuda_memcpy_h2d(rd->dbuf, grad, n * sizeof(float));
        if (!rc)
            rc = ps_nccl_allreduce_mean(rd->nccl, rd->dbuf, n, dt, NULL);
        if (!rc)
            rc = ps_cuda_memcpy_d2h(grad, rd->dbuf, n * sizeof(float));
        return rc;
    }
#endif
    return ps_ring_allreduce_mean(rd->ring, grad, n, dt);
}

static void reducer_close(reducer_t *rd, ps_worker_stats_t *st)
{
    if (rd->ring)
        ps_ring_bytes(rd->ring, &st->wire_sent, &st->wire_recv);
    ps_ring_destroy(&rd->ring);
#ifdef PS_HAVE_CUDA
    if (rd->dbuf)
        ps_cuda_free(rd->dbuf);
    rd->dbuf = NULL;
    ps_nccl_destroy(&rd->nccl);
#endif
}

int ps_worker_allreduce_train(ps_worker_t *p, ps_worker_compute_fn compute, int local_update)
{
    const ps_worker_opts_t *o = p->o;
    reducer_t rd;
    /* Loss scaling (psworker_train.c's ps_worker_ls_*): the ring adds every
     * rank's overflow flag as one extra fp32 element after the EXACT tail. */
    float *ls_tail = NULL; /* (numel - nx) EXACT partitions + the flag */
    int rc;

    if (!p->mom && !(p->mom = calloc(p->numel, sizeof(float)))) {
        ps_error("out of memory for the momentum of %zu parameters", p->numel);
        return PS_ENOMEM;
    }
    {
        char tag[32];
        snprintf(tag, sizeof tag, "psworker[%d]", p->rank);
        ps_log_set_prog(tag);
    }
    if ((rc = reducer_open(&rd, p)))
        return rc;
    ps_info("rank %d of %d, allreduce %s, wire %s, %zu parameters in %u partitions", p->rank,
            p->nworkers, o->allreduce, ps_dtype_name(o->dt), p->numel, p->table.nparts);
    if ((rc = ps_worker_output_open(p)))
        goto out;
    /* PS_PART_EXACT partitions (BN statistics, at the end of the table)
     * are reduced in fp32 whatever --dtype, as in PS mode; with loss
     * scaling the overflow flag rides after them (see the top of the file). */
    size_t nx = p->numel;
    for (uint32_t i = p->table.nparts; i-- > 0 && (p->table.parts[i].flags & PS_PART_EXACT);)
        nx = p->table.parts[i].offset;
    if (o->ls_on) {
        if ((rc = ps_loss_scale_init(&p->ls, &o->ls_cfg)))
            goto out;
        if (!(ls_tail = malloc((p->numel - nx + 1) * sizeof(float)))) {
            rc = PS_ENOMEM;
            goto out;
        }
    }
    p->st.t_start = ps_worker_now();
    for (uint64_t s = 0; s < o->steps; s++) {
        double t0 = ps_worker_now();
        if (o->ls_on)
            ps_worker_ls_begin(p);
        double loss = compute(p, s);
        if (!isfinite(loss)) {
            rc = p->compute_rc ? p->compute_rc : PS_ENONFINITE;
            if (!p->compute_rc)
                ps_error("loss is not finite at step %" PRIu64 " (diverged: try a lower --lr)", s);
            goto out;
        }
        int ovf = o->ls_on ? ps_worker_ls_prepare(p, s) : 0, nflag = 0;
        double t1 = ps_worker_now();
        size_t nt = p->numel - nx; /* EXACT tail */
        if (o->ls_on) {
            memcpy(ls_tail, p->grad + nx, nt * sizeof(float));
            ls_tail[nt] = ovf ? 1.f : 0.f;
        }
        if ((nx && (rc = reducer_mean(&rd, p->grad, nx, o->dt))) ||
            (o->ls_on && (rc = reducer_mean(&rd, ls_tail, nt + 1, PS_DT_FP32))) ||
            (!o->ls_on && nt && (rc = reducer_mean(&rd, p->grad + nx, nt, PS_DT_FP32)))) {
            ps_error("step %" PRIu64 ": allreduce of %zu gradients failed: %s", s, p->numel,
                     ps_strerror(rc));
            goto out;
        }
        if (o->ls_on) {
            memcpy(p->grad + nx, ls_tail, nt * sizeof(float));
            /* the mean of W flags in {0, 1}: exactly 0 when nobody overflowed */
            nflag = ls_tail[nt] != 0.f;
        }
        double t2 = ps_worker_now();
        /* Every rank holds the same bits of the mean (and of the flag count),
         * so every rank reaches the same verdict here. */
        int nonfinite = (o->ls_on || local_update) && ps_loss_scale_has_overflow(p->grad, p->numel);
        int apply = 1;
        if (o->ls_on)
            apply = ps_worker_ls_finish(p, s, ovf ? "on this worker" : nflag ? "on another worker"
                                    : "in the sum of the gradients", nflag || nonfinite);
        else if (local_update && nonfinite) {
            /* no scaler to skip the step: all stop together, before an
             * Inf / NaN reaches the weights */
            ps_error("step %" PRIu64 ": the mean gradient is not finite (some worker's gradient "
                     "overflowed or diverged): stopping before it reaches the weights", s);
            rc = PS_ENONFINITE;
            goto out;
        }
        if (local_update && apply && (rc = ps_worker_apply_local(p, s)))
            goto out;
        double t3 = ps_worker_now();
        /* The local update is compute, like the backward; comm is the wait
         * for the neighbours only. */
        ps_worker_record_step(p, s, loss, t3 - t0, (t1 - t0) + (t3 - t2), t2 - t1);
        /* No barrier after a validation on rank 0: the next allreduce waits
         * for it (within timeout_ms, the same bound as a PS-mode PUSHPULL). */
        ps_worker_maybe_validate(p, s + 1);
    }
    ps_worker_ls_report(p);
out:
    free(ls_tail);
    reducer_close(&rd, &p->st);
    if (!rc && p->st.wire_sent)
        printf("wire: rank=%d sent_bytes=%" PRIu64 " recv_bytes=%" PRIu64
               " sent_bytes_per_step=%.0f\n", p->rank, p->st.wire_sent, p->st.wire_recv,
               (double)p->st.wire_sent / (double)o->steps);
    return rc;
}

int ps_worker_run_allreduce(ps_worker_t *p)
{
    ps_worker_initial_eval(p);
    int rc = ps_worker_allreduce_train(p, ps_worker_compute, 1);
    if (rc)
        return rc;
    if ((rc = ps_worker_save_model(p)))
        return rc;
    ps_worker_print_final(p, p->o->steps);
    return 0;
}
