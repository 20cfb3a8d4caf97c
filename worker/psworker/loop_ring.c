/* psworker --mode allreduce: data-parallel training without servers.
 *
 * Step: compute this rank's mean gradient (the task's compute, as in PS
 * mode), average it over all ranks -- the ring's chunked, pipelined
 * reduce-scatter + all-gather (worker/comm/ps_ring.h) or NCCL, through
 * worker/comm/ps_allreduce.h -- and apply ps_optim_apply_partition, partition by
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

#include "ps_error.h"
#include "ps_log.h"
#include "worker/comm/ps_allreduce.h"

int ps_worker_ring_check(ps_worker_opts_t *o)
{
    ps_worker_ring_opts_t *r = &o->ring;
    char why[256];
    if (*o->servers)
        return ps_worker_opt_error("--mode allreduce runs without servers: give --peers instead "
                                   "of --servers");
    int np = ps_worker_count_fields(r->peers);
    if (np < 1 || np > 65535)
        return ps_worker_opt_error("--mode allreduce needs --peers tcp://HOST:PORT,... (one "
                                   "endpoint per rank, rank r binds the r-th; 1..65535 of them)");
    if (o->num_workers == 1) /* the default: the peer list says how many */
        o->num_workers = np;
    if (o->num_workers != np)
        return ps_worker_opt_error("--mode allreduce: --num-workers %d but --peers lists %d "
                                   "endpoints", o->num_workers, np);
    if (o->rank < 0 || o->rank >= np)
        return ps_worker_opt_error("--mode allreduce needs --rank in [0, %d) (there is no server "
                                   "to assign one)", np);
    if (strcmp(r->allreduce, "ring") && strcmp(r->allreduce, "nccl"))
        return ps_worker_opt_error("--allreduce: expected ring|nccl, got \"%s\"", r->allreduce);
    if (ps_allreduce_check(r->allreduce, why, sizeof why))
        return ps_worker_opt_error("--allreduce %s: %s", r->allreduce, why);
    if (o->wire.codec_id != PS_CODEC_RAW)
        return ps_worker_opt_error(
            "--mode allreduce: --codec %s is not supported in ring mode: a ring forwards partial "
            "sums, and a top-k, sign or lz4-framed partial sum is not closed under addition "
            "(each hop would have to decode, add and re-compress with its own error feedback).  "
            "Use --dtype fp16|bf16 for a smaller wire, or PS mode (--servers) for topk/sign",
            ps_codec_name(o->wire.codec_id));
    if (o->wire.ef_rounding)
        return ps_worker_opt_error("--mode allreduce: --ef-rounding is a PS-mode option (the "
                                   "residual of one push); ring partial sums are rounded at "
                                   "every hop");
    if (r->ring_conns < 1 || r->ring_conns > 16)
        return ps_worker_opt_error("--ring-conns must be in [1, 16]");
    return 0;
}

/* One ring run: the allreduce, where the EXACT tail starts, and the
 * loss-scale flag's buffer. */
typedef struct ring {
    ps_worker_t *p;
    ps_allreduce_t *ar;
    size_t nx;       /* p->grad[nx..numel) is the EXACT tail (BN statistics) */
    float *ls_tail;  /* (numel - nx + 1) the EXACT tail and the overflow flag */
    int local_update;
} ring_t;

static int ring_open(ring_t *g, ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    int n = 0, rc;
    memset(g, 0, sizeof *g);
    g->p = p;
    g->local_update = !(p->task->flags & PS_TASK_NO_LOCAL_UPDATE);
    char **peers = ps_worker_split_list(o->ring.peers, &n);
    if (!peers) return PS_ENOMEM;
    ps_allreduce_opts_t ao = {
        .timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 24 * 3600 * 1000,
        .nconn = o->ring.ring_conns,
        .device = o->device,
        .max_numel = p->numel + 1, /* + 1: the loss-scale flag after the EXACT tail */
    };
    /* --bn sync over NCCL: room for a BN layer's gather too (its own slot,
     * then W slots of at most 2 + 4C floats) */
    size_t bn = (size_t)(p->nworkers + 1) * (2 + 4 * (size_t)p->bn_cross);
    if (p->bn_cross && bn > ao.max_numel) ao.max_numel = bn;
    rc = ps_allreduce_open(&g->ar, o->ring.allreduce, p->rank, p->nworkers,
                           (const char *const *)peers, &ao);
    free(peers);
    if (rc) return rc;
    /* PS_PART_EXACT partitions (BN statistics, at the end of the table)
     * are reduced in fp32 whatever --dtype, as in PS mode; with loss
     * scaling the overflow flag rides after them (see the top of the file). */
    g->nx = p->numel;
    for (uint32_t i = p->table.nparts; i-- > 0 && (p->table.parts[i].flags & PS_PART_EXACT);)
        g->nx = p->table.parts[i].offset;
    if (o->prec.ls_on) {
        if ((rc = ps_loss_scale_init(&p->ls, &o->prec.ls_cfg))) return rc;
        if (!(g->ls_tail = malloc((p->numel - g->nx + 1) * sizeof(float)))) return PS_ENOMEM;
    }
    if (g->local_update && !p->mom && !(p->mom = calloc(p->numel, sizeof(float)))) {
        ps_error("out of memory for the momentum of %zu parameters", p->numel);
        return PS_ENOMEM;
    }
    return 0;
}

static void ring_close(ring_t *g)
{
    ps_worker_bn_close(g->p); /* its group gathers over g->ar */
    ps_allreduce_bytes(g->ar, &g->p->st.wire_sent, &g->p->st.wire_recv);
    ps_allreduce_close(&g->ar);
    free(g->ls_tail);
    g->ls_tail = NULL;
}

/* p->grad := the mean over the ranks; *nflag: whether some rank overflowed
 * (loss scaling: the flag rides after the EXACT tail). */
static int ring_reduce(ring_t *g, int ovf, int *nflag)
{
    ps_worker_t *p = g->p;
    const ps_worker_opts_t *o = p->o;
    size_t nx = g->nx, nt = p->numel - nx;
    int rc = 0;
    *nflag = 0;
    if (o->prec.ls_on) {
        memcpy(g->ls_tail, p->grad + nx, nt * sizeof(float));
        g->ls_tail[nt] = ovf ? 1.f : 0.f;
    }
    if ((nx && (rc = ps_allreduce_mean(g->ar, p->grad, nx, o->wire.dt))) ||
        (o->prec.ls_on && (rc = ps_allreduce_mean(g->ar, g->ls_tail, nt + 1, PS_DT_FP32))) ||
        (!o->prec.ls_on && nt && (rc = ps_allreduce_mean(g->ar, p->grad + nx, nt, PS_DT_FP32))))
        return rc;
    if (o->prec.ls_on) {
        memcpy(p->grad + nx, g->ls_tail, nt * sizeof(float));
        /* the mean of W flags in {0, 1}: exactly 0 when nobody overflowed */
        *nflag = g->ls_tail[nt] != 0.f;
    }
    return 0;
}

static int ring_one(ring_t *g, uint64_t s)
{
    ps_worker_t *p = g->p;
    const ps_worker_opts_t *o = p->o;
    int rc, nflag;
    double t0 = ps_worker_now();
    ps_worker_ls_begin(p);
    double loss = ps_worker_compute(p, s);
    if ((rc = ps_worker_check_loss(p, loss, s))) return rc;
    int ovf = ps_worker_ls_prepare(p, s);
    double t1 = ps_worker_now();
    if ((rc = ring_reduce(g, ovf, &nflag))) {
        ps_error("step %" PRIu64 ": allreduce of %zu gradients failed: %s", s, p->numel,
                 ps_strerror(rc));
        return rc;
    }
    double t2 = ps_worker_now();
    /* Every rank holds the same bits of the mean (and of the flag count),
     * so every rank reaches the same verdict here. */
    int nonfinite = (o->prec.ls_on || g->local_update) &&
                    ps_loss_scale_has_overflow(p->grad, p->numel);
    int apply = 1;
    if (o->prec.ls_on) {
        apply = ps_worker_ls_finish(p, s, ovf ? "on this worker" : nflag ? "on another worker"
                                    : "in the sum of the gradients", nflag || nonfinite);
    } else if (g->local_update && nonfinite) {
        /* no scaler to skip the step: all stop together, before an Inf /
         * NaN reaches the weights */
        ps_error("step %" PRIu64 ": the mean gradient is not finite (some worker's gradient "
                 "overflowed or diverged): stopping before it reaches the weights", s);
        return PS_ENONFINITE;
    }
    if (g->local_update && apply && (rc = ps_worker_apply_local(p, s))) return rc;
    double t3 = ps_worker_now();
    /* The local update is compute, like the backward; comm is the wait for
     * the neighbours only. */
    ps_worker_record_step(p, s, loss, t3 - t0, (t1 - t0) + (t3 - t2), t2 - t1);
    /* No barrier after a validation on rank 0: the next allreduce waits
     * for it (within timeout_ms, the same bound as a PS-mode PUSHPULL). */
    ps_worker_validate(p, s + 1);
    return 0;
}

int ps_worker_run_ring(ps_worker_t *p)
{
    const ps_worker_opts_t *o = p->o;
    ring_t g;
    char tag[32];
    snprintf(tag, sizeof tag, "psworker[%d]", p->rank);
    ps_log_set_prog(tag);
    int rc = ring_open(&g, p);
    if (!rc) rc = ps_worker_bn_use(p, g.ar);
    if (!rc) {
        ps_info("rank %d of %d, allreduce %s, wire %s, %zu parameters in %u partitions", p->rank,
                p->nworkers, o->ring.allreduce, ps_dtype_name(o->wire.dt), p->numel,
                p->table.nparts);
        rc = ps_worker_start(p);
    }
    p->st.t_start = ps_worker_now();
    for (uint64_t s = 0; !rc && s < o->steps; s++) rc = ring_one(&g, s);
    ring_close(&g);
    if (rc) return rc;
    if (p->st.wire_sent)
        printf("wire: rank=%d sent_bytes=%" PRIu64 " recv_bytes=%" PRIu64
               " sent_bytes_per_step=%.0f\n", p->rank, p->st.wire_sent, p->st.wire_recv,
               (double)p->st.wire_sent / (double)o->steps);
    return ps_worker_finish(p, o->steps);
}
