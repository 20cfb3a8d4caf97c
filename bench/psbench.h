/* psbench internals: one configuration (servers x workers x bytes x wire
 * format), the worker process body, and the loopback TCP ceiling. */
#ifndef PSBENCH_H
#define PSBENCH_H
#include <stddef.h>
#include <stdint.h>

#include "ps_codec.h"

typedef struct psbench_cfg {
    int servers, workers;
    size_t bytes;            /* FP32 gradient bytes per worker per iteration */
    size_t partition_bytes;
    ps_dtype_t dtype;
    ps_codec_t codec;
    float topk_ratio;        /* topk: fraction of elements pushed (0 = codec default) */
    int pull_codec;          /* weights: PS_CODEC_RAW / _LZ4, -1 = client default */
    int iters, warmup;
    int max_inflight;
    int timeout_ms;
    int check;               /* verify the final weights against closed form */
    const char *model;       /* --model: real layout (worker/models/model_sizes.h), NULL: one tensor */
    double compute_ms;       /* emulated forward+backward per step (sleep), 0 = none */
    int overlap;             /* PSBENCH_OVERLAP_*: 0 off, 1 on (push each partition as
                                its backward ends), 2 fwd (and the next forward waits
                                per partition, not for the whole pull) */
    int sched_params;        /* --schedule params: compute split by parameters, not
                                by the layers' FLOPs (the old, unrealistic rule) */
    int colocate;            /* --colocate: server s in host s beside worker s */
    size_t send_queue_bytes; /* client send_queue_bytes (0 = client default) */
    int pull_credit;         /* > 0: PUSH + PULL with at most this many pulls per
                                server outstanding, lowest partition first (worker-
                                side priority, psbench_worker.c); 0: PUSHPULL */
    const char *netns;       /* --netns PREFIX: run in PREFIX-h<i> namespaces, NULL = here */
    const char *netns_net;   /* first three octets of the hosts' addresses */
    int ring;                /* --mode ring: no servers, workers allreduce (ps_ring) */
} psbench_cfg_t;

enum { PSBENCH_OVERLAP_OFF = 0, PSBENCH_OVERLAP_ON = 1, PSBENCH_OVERLAP_FWD = 2 };

/* What a worker sends back after its iters step times. */
typedef struct psbench_result {
    double wire_out, wire_in;  /* client bytes per timed iteration */
    double check_err;          /* --check: worst |err| / tolerance (<= 1: pass), else 0 */
    int check_skipped;         /* --check not possible (lossy codec with several workers) */
    /* CPU over the timed iterations (user + system seconds, context
     * switches voluntary + involuntary): this worker process (all its
     * threads: training, client I/O, ZeroMQ I/O), and, from rank 0 alone,
     * every psd process (read from /proc/PID/stat and status) */
    double cpu_self, csw_self, cpu_psd, csw_psd;
} psbench_result_t;

/* CPU seconds (user + system, every thread) and context switches of the
 * calling process so far, from /proc. */
void psbench_self_cpu(double *cpu, double *csw);

/* psd processes of the configuration being run (rank 0 reads their CPU). */
extern int psbench_npsd;
extern int psbench_psd_pid[64];

/* Worker process body: connects to `endpoints`, rank 0 initialises the
 * model, everybody barriers, then warmup + iters steps of (emulated compute
 * and) pushpull over every partition.  Writes iters doubles (seconds per
 * step), iters doubles (seconds of compute in that step: the rest is
 * communication wait) and a psbench_result_t to fd.
 * Returns the process exit status. */
int psbench_worker(const psbench_cfg_t *cfg, int rank, char **endpoints, int fd);
/* What either worker sends its parent: iters step times, iters compute
 * times, then the result record (partial writes and EINTR retried).
 * 0, or -1 with errno set. */
int psbench_send_result(int fd, const double *times, const double *ctimes, int iters,
                        const psbench_result_t *res);

/* The same for --mode ring (psbench_ring.c): endpoints are the W ring
 * endpoints (rank r binds the r-th); a step is the emulated compute and the
 * mean gradient over the ring (bucketed and overlapped with --overlap on). */
int psbench_ring_worker(const psbench_cfg_t *cfg, int rank, char **endpoints, int fd);

/* Loopback TCP ceiling: one connection over 127.0.0.1, a writer thread
 * pushing chunk-byte writes for `seconds`, a reader draining.  Returns bytes
 * per second (0 on failure, logged). */
double psbench_loopback_bps(double seconds, size_t chunk);

/* What one link of the emulated cluster carries: `streams` TCP connections
 * from host `from` to host `to` (namespaces PREFIX-h<i>, addresses
 * NET.<i+1>) for `seconds`, counted by the receiver from its first byte to
 * the end.  Returns bytes per second (0 on failure, logged).  Needs root. */
double psbench_link_bps(const char *prefix, const char *net, int from, int to, int streams,
                        double seconds);

double psbench_now(void);
#endif
