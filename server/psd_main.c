/* psd: one parameter-server shard (docs/protocol.md, docs/operations.md).
 * Options come from flags and an INI file (ps_config); the loop runs until
 * SHUTDOWN or SIGTERM / SIGINT (both stop updates and checkpoint first when
 * a checkpoint directory is set, then linger briefly so replies get out)
 * and then exits 0.  With --curve it does not start unless its keys load
 * and the ZAP handler runs. */
#include "config.h"
#include "psd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <malloc.h>

#include "ps_config.h"
#include "ps_error.h"
#include "ps_log.h"

static const char usage[] =
    "[options]\n\nParameter server shard: holds FP32 weights and optimizer state of its partitions,\n"
    "aggregates worker gradients and applies the optimizer.  See docs/protocol.md.";

/* Flags and config file into o.  -1: go on; else the exit status (0 after
 * --help, 2 after a usage error, reported on stderr). */
static int parse_args(psd_opts_t *o, int argc, char **argv)
{
    int npos = 0;
    const ps_opt_t opts[] = {
        {"port", PS_OPT_INT, &o->port, "TCP port of the ROUTER socket (0: pick a free one)", "9100"},
        {"bind", PS_OPT_STRING, &o->bind, "bind address (tcp://*, tcp://10.0.0.1, ipc://PATH)", "tcp://*"},
        {"port-file", PS_OPT_STRING, &o->port_file, "write the bound port to this file", ""},
        {"server-id", PS_OPT_INT, &o->server_id, "index of this shard (0 keeps membership)", "0"},
        {"num-servers", PS_OPT_INT, &o->num_servers, "number of shards", "1"},
        {"num-workers", PS_OPT_INT, &o->num_workers, "cluster size (0: from HELLO / INIT)", "0"},
        {"max-workers", PS_OPT_INT, &o->max_workers, "sync: the most workers at once; above --num-workers the job is elastic (psworker --join, psctl drain)", "0"},
        {"mode", PS_OPT_STRING, &o->mode, "sync | async | ssp (bounded staleness)", "sync"},
        {"staleness", PS_OPT_INT, &o->staleness, "ssp: refuse pushes older than version - staleness", "2"},
        {"threads", PS_OPT_INT, &o->threads, "threads for gradient summation (0: one per CPU, at most 8)", "0"},
        {"checkpoint-dir", PS_OPT_STRING, &o->checkpoint_dir, "checkpoint directory (empty: none)", ""},
        {"checkpoint-every", PS_OPT_INT, &o->checkpoint_every, "checkpoint every N shard updates (0: on demand)", "0"},
        {"checkpoint-every-steps", PS_OPT_INT, &o->checkpoint_every_steps, "sync: aligned checkpoint when every partition reaches version k*N, what MSG_ROLLBACK restores after a server restart (0: off)", "0"},
        {"metrics-port", PS_OPT_INT, &o->metrics_port, "HTTP port for /metrics (0: off)", "0"},
        {"metrics-bind", PS_OPT_STRING, &o->metrics_bind, "address of the /metrics listener", "127.0.0.1"},
        {"heartbeat-ms", PS_OPT_INT, &o->heartbeat_ms, "heartbeat interval (ZMQ and liveness checks)", "1000"},
        {"worker-timeout-ms", PS_OPT_INT, &o->worker_timeout_ms, "declare a silent worker lost (0: never)", "30000"},
        {"reject-nonfinite", PS_OPT_BOOL, &o->reject_nonfinite, "refuse gradients with NaN / Inf", "false"},
        {"max-partition-bytes", PS_OPT_UINT64, &o->max_partition_bytes,
         "largest partition an INIT may bring (>= psworker's --partition-bytes); sizes ZMQ_MAXMSGSIZE "
         "on a fresh start (a table loaded from a checkpoint sets the exact bound)", "4194304"},
        {"max-msg-mb", PS_OPT_INT, &o->max_msg_mb,
         "explicit ZMQ_MAXMSGSIZE in MiB, wins over the derived bound (0: derive it)", "0"},
        {"stats-every-s", PS_OPT_INT, &o->stats_every_s, "log a stats line every N seconds (0: off)", "60"},
        {"log-level", PS_OPT_STRING, &o->log_level, "error | warn | info | debug", "info"},
        {"on-worker-loss", PS_OPT_STRING, &o->on_worker_loss,
         "wait: a lost worker, or one that left before the end, holds up sync steps until it "
         "comes back (the wait is logged, naming it); continue: steps go on without it "
         "(averaged over those who pushed)", "wait"},
        {"max-peer-inflight", PS_OPT_INT, &o->max_peer_inflight,
         "requests one peer may have waiting for a reply (more get PS_EAGAIN; 0: no cap)", "1024"},
        {"io-threads", PS_OPT_INT, &o->io_threads,
         "ZMQ I/O threads (each worker connection is served by one; 1..16)", "2"},
        {"sock-buf-kb", PS_OPT_INT, &o->sock_buf_kb,
         "TCP send / receive buffer per connection in KiB (0: kernel autotuning; capped by "
         "net.core.[rw]mem_max)", "4096"},
        {"curve", PS_OPT_BOOL, &o->curve, "CURVE encryption + ZAP allow-list (needs the two options below)", "false"},
        {"curve-secret-key", PS_OPT_STRING, &o->curve_secret_key, "file with this server's Z85 secret key (psctl keygen PREFIX.key)", ""},
        {"curve-allow", PS_OPT_STRING, &o->curve_allow, "allowed Z85 public keys: a file (one per line) or a directory of *.pub", ""},
        {"curve-admin", PS_OPT_STRING, &o->curve_admin, "admin public keys (CHECKPOINT / SHUTDOWN allowed), file or directory", ""},
        {"debug-die-before-state-reply", PS_OPT_INT, &o->debug_die_state_v,
         "tests (sync, psworker --replicate-state): when the last partition of this server "
         "reaches version N, answer the workers that keep no state of it, then SIGKILL "
         "before the reply to the one that does (0: off)", "0"},
        {0},
    };
    /* --max-partition-bytes 4 MiB: psworker's default --partition-bytes */
    if (ps_config_defaults(opts)) return 2;
    int rc = ps_config_parse(opts, "psd", usage, argc, argv, &npos);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    if (npos > 0) {
        fprintf(stderr, "psd: unexpected argument '%s' (see --help)\n", argv[1]);
        return 2;
    }
    return -1;
}

/* The values of the options: 0, or 2 (a usage error, on stderr). */
static int check_opts(psd_t *s)
{
    psd_opts_t *o = &s->o;
    if (ps_log_set_level_str(o->log_level)) {
        fprintf(stderr, "psd: --log-level %s: want error|warn|info|debug\n", o->log_level);
        return 2;
    }
    if (psd_mode_parse(o->mode, &s->mode)) {
        fprintf(stderr, "psd: --mode %s: want sync|async|ssp\n", o->mode);
        return 2;
    }
    if (o->max_workers > o->num_workers && (o->num_workers <= 0 || strcmp(o->mode, "sync"))) {
        fprintf(stderr, "psd: --max-workers %d makes the job elastic: that needs --mode sync and "
                        "--num-workers (the workers it starts with)\n", o->max_workers);
        return 2;
    }
    if (!strcmp(o->on_worker_loss, "continue")) o->loss_continue = 1;
    else if (strcmp(o->on_worker_loss, "wait")) {
        fprintf(stderr, "psd: --on-worker-loss %s: want wait|continue\n", o->on_worker_loss);
        return 2;
    }
    if (o->port < 0 || o->max_peer_inflight < 0 || o->port > 65535 || o->num_servers < 1 || o->server_id < 0 ||
        o->server_id >= o->num_servers || o->num_workers < 0 || o->staleness < 0 ||
        o->max_msg_mb < 0 || o->max_msg_mb > 4096 || o->max_partition_bytes < 4 ||
        o->max_partition_bytes > (UINT64_C(1) << 32) || o->metrics_port < 0 ||
        o->metrics_port > 65535 || o->heartbeat_ms < 0 || o->worker_timeout_ms < 0 ||
        o->checkpoint_every < 0 || o->checkpoint_every_steps < 0 || o->threads < 0 || o->io_threads < 1 || o->io_threads > 16 ||
        o->sock_buf_kb < 0 || o->sock_buf_kb > 1048576) {
        fprintf(stderr, "psd: option out of range: need 0 <= port <= 65535, 0 <= server-id < "
                        "num-servers, num-workers >= 0, staleness >= 0, 0 <= max-msg-mb <= 4096, "
                        "4 <= max-partition-bytes <= 4 GiB, "
                        "non-negative times and counts, 1 <= io-threads <= 16, 0 <= sock-buf-kb <= 1048576\n");
        return 2;
    }
    return 0;
}

static void tune_malloc(void)
{
    /* Keep multi-MiB message buffers in the heap once freed: otherwise each
     * one is a fresh mmap that ZeroMQ's I/O threads page-fault through (and
     * the kernel zeroes) for every message.  Setting M_TRIM_THRESHOLD turns
     * glibc's dynamic threshold off, so a refused M_MMAP_THRESHOLD would
     * leave every buffer over 128 KiB mmap'd: some glibc versions cap it at
     * HEAP_MAX_SIZE / 2 = 32 MiB (2.36 accepts 64 MiB), hence the fallback. */
    if (!mallopt(M_MMAP_THRESHOLD, 64 << 20) && !mallopt(M_MMAP_THRESHOLD, 32 << 20))
        ps_warn("mallopt(M_MMAP_THRESHOLD) refused: large message buffers will be mmap'd");
    if (!mallopt(M_TRIM_THRESHOLD, 256 << 20)) ps_warn("mallopt(M_TRIM_THRESHOLD, 256 MiB) refused");
}

/* Threads, cluster size, checkpoint, socket, /metrics: 0, or 1 (logged). */
static int start(psd_t *s)
{
    psd_opts_t *o = &s->o;
    int rc;
    if ((rc = psd_pool_new(&s->pool, o->threads))) {
        ps_error("cannot start the summation threads: %s", ps_strerror(rc));
        return 1;
    }
    s->loop = uv_default_loop();
    char err[256];
    if (o->num_workers > 0 && (rc = psd_members_set_count(s, o->num_workers, err, sizeof err))) {
        ps_error("--num-workers: %s", err);
        return 1;
    }
    if ((rc = psd_checkpoint_load(s)) || (rc = psd_loop_open(s)) || (rc = psd_metrics_start(s))) {
        psd_loop_close(s);
        psd_store_free(&s->st);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static psd_t s; /* zeroed; lives for the whole run */
    psd_opts_t *o = &s.o;
    int rc;

    if ((rc = parse_args(o, argc, argv)) >= 0) return rc;
    if ((rc = check_opts(&s))) return rc;
    char prog[32];
    snprintf(prog, sizeof prog, "psd[%d]", o->server_id);
    ps_log_set_prog(prog);
    tune_malloc();
    if ((rc = start(&s))) return rc;
    ps_info("psd %s: server %d of %d, mode %s%s, on worker loss: %s, %d summation threads, pid %d",
            PACKAGE_VERSION, o->server_id, o->num_servers, o->mode,
            o->reject_nonfinite ? ", rejecting non-finite gradients" : "", o->on_worker_loss,
            psd_pool_threads(s.pool), (int)getpid());
    psd_loop_run(&s);
    psd_errors_log_flush(&s);
    psd_stats_log(&s);
    psd_loop_close(&s);
    psd_store_free(&s.st);
    psd_pool_destroy(&s.pool);
    psd_peers_free(&s.peers);
    free(s.workers);
    ps_info("exit (status %d)", s.exit_code);
    return s.exit_code;
}
