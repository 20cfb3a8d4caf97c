/* A kill during checkpoint writing: psd runs with
 * --checkpoint-every 1 on a shard large enough (16 MiB of weights+momentum
 * per file) that a write is nearly always in flight while one raw worker
 * pushes; the test SIGKILLs psd, restarts it on the same directory, and
 * repeats.  Half of the kills are aimed at the write itself (as soon as the
 * writer's temporary file appears, plus a random 0-1 ms), the rest land at
 * a random moment.  After every restart:
 *  - a checkpoint loads (INIT gets PS_FLAG_FROM_CKPT), never none once one
 *    had been written, and stale temporary files are gone;
 *  - every partition's weights equal the closed form for its loaded
 *    version v: SGD lr 0.5 momentum 0.5 with gradient 2 at iteration 0 and
 *    1 afterwards keeps the momentum buffer at exactly 2, so w = w0 - v;
 *    a momentum buffer not restored (or a torn file) shows up bitwise;
 *  - versions never go backwards from one restart to the next (the newest
 *    complete file was loaded; a rename is atomic).
 * No test hook in psd is needed: the temporary file is the writer's. */
#include <dirent.h>
#include <poll.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* psd_testlib.h helpers not used here */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define N (2u << 20) /* 8 MiB of fp32 weights */
#define PBYTES (2u << 20)
#define NP 4
#define ROUNDS 16

static const ps_tensor_spec_t TS[1] = {{"w", N, 0}};
static const char *OPTIM = "{\"lr\":0.5,\"momentum\":0.5,\"weight_decay\":0,\"sched\":\"const\","
                           "\"warmup_steps\":0,\"ref_batch\":0}";
static ps_partition_table_t T;
static char DIRP[256];
static float *G0, *G1, *BUF;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float w0(size_t i) { return (float)(i % 13); }

/* Files in DIRP: complete checkpoints and writer temporaries. */
static void scan(int *ncomplete, int *ntmp)
{
    *ncomplete = *ntmp = 0;
    DIR *d = opendir(DIRP);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strstr(e->d_name, ".safetensors.tmp.")) (*ntmp)++;
        else if (strstr(e->d_name, ".safetensors") && !strstr(e->d_name, ".corrupt")) (*ncomplete)++;
    }
    closedir(d);
}

static void push(void *d, uint32_t p, uint64_t it)
{
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 0, p);
    h.has_iteration = 1, h.iteration = it;
    h.has_numel = 1, h.numel = T.parts[p].numel;
    h.has_request_id = 1, h.request_id = ((uint64_t)p << 40) | it;
    ps_wire_send(d, NULL, 0, &h, it ? G1 : G0, T.parts[p].numel * 4, NULL, NULL, 0);
}

/* Verify the loaded state; fills ver[]. */
static int check_loaded(void *d, uint64_t *ver, int round)
{
    int bad = 0;
    for (uint32_t p = 0; p < NP; p++) {
        size_t n = T.parts[p].numel, off = T.parts[p].offset;
        if (t_pull(d, p, 0, BUF, n, &ver[p]) != PS__MSG_TYPE__MSG_WEIGHTS) {
            diag("round %d: PULL of partition %u failed", round, p);
            return 0;
        }
        for (size_t i = 0; i < n; i++) {
            float want = w0(off + i) - (float)ver[p];
            if (memcmp(&BUF[i], &want, 4)) {
                if (bad++ < 3)
                    diag("round %d part %u v%llu: w[%zu] = %.9g, want %.9g", round, p,
                         (unsigned long long)ver[p], off + i, BUF[i], want);
            }
        }
    }
    return bad == 0;
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, 1, PBYTES, 1) || T.nparts != NP)
        tap_skip_all("partition table unavailable");
    G0 = malloc(PBYTES), G1 = malloc(PBYTES), BUF = malloc(PBYTES);
    for (size_t i = 0; i < PBYTES / 4; i++) G0[i] = 2.0f, G1[i] = 1.0f;
    snprintf(DIRP, sizeof DIRP, "/tmp/psd-ckkill-%d", (int)getpid());
    srand((unsigned)getpid());
    char spec[1024];
    t_spec_json(spec, sizeof spec, TS, 1, PBYTES, 1, 1, OPTIM);
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--threads", "1",
                          "--checkpoint-dir", DIRP, "--checkpoint-every", "1", "--log-level", "info",
                          NULL};
    uint64_t prev[NP] = {0}, ver[NP] = {0};
    int loads_ok = 0, states_ok = 0, monotone = 0, aimed = 0, mid_write = 0, tmp_gone = 0;
    tpsd_t S = {0};
    for (int round = 0; round < ROUNDS; round++) {
        if (tpsd_start(&S, "ckkill", args)) {
            ok(0, "round %d: psd started", round);
            break;
        }
        void *d = t_dealer(S.port);
        uint32_t flags = 0;
        int ncomp, ntmp;
        int rc = t_init_spec(d, spec, T.hash, &flags);
        scan(&ncomp, &ntmp);
        tmp_gone += ntmp == 0;
        if (round == 0) {
            ok(rc == PS__MSG_TYPE__MSG_ACK && !(flags & PS_FLAG_FROM_CKPT), "round 0: fresh start");
            for (uint32_t p = 0; p < NP; p++) {
                size_t n = T.parts[p].numel, off = T.parts[p].offset;
                for (size_t i = 0; i < n; i++) BUF[i] = w0(off + i);
                if (t_init_part(d, p, BUF, n) != PS__MSG_TYPE__MSG_ACK) diag("INIT part %u failed", p);
            }
        } else {
            int from = rc == PS__MSG_TYPE__MSG_ACK && (flags & PS_FLAG_FROM_CKPT);
            loads_ok += from;
            if (!from) diag("round %d: no checkpoint loaded (INIT %d, flags %u)", round, rc, flags);
            int good = check_loaded(d, ver, round);
            states_ok += good;
            int mono = 1;
            for (int p = 0; p < NP; p++) mono &= ver[p] >= prev[p];
            monotone += mono;
            if (!mono) diag("round %d: versions went backwards", round);
            memcpy(prev, ver, sizeof prev);
        }
        /* Push until the kill: aimed rounds kill once a write is in progress
         * (and, in round 0, once a complete file exists). */
        int aim = round % 2 == 1;
        double t0 = now_s(), kill_at = t0 + 0.2 + (rand() % 600) / 1000.0;
        uint64_t it[NP];
        for (uint32_t p = 0; p < NP; p++) it[p] = ver[p], push(d, p, it[p]);
        int killed = 0;
        while (!killed && now_s() - t0 < 15) {
            zmq_pollitem_t pi = {d, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&pi, 1, 1) > 0) {
                ps_wire_msg_t m;
                if (t_recv(d, &m) == 0 && m.hdr->type == PS__MSG_TYPE__MSG_WEIGHTS &&
                    m.hdr->partition < NP && m.hdr->request_id == (((uint64_t)m.hdr->partition << 40) |
                                                                    it[m.hdr->partition])) {
                    uint32_t p = m.hdr->partition;
                    it[p] = m.hdr->iteration;
                    push(d, p, it[p]);
                }
                ps_wire_msg_close(&m);
            }
            scan(&ncomp, &ntmp);
            int ready = round > 0 || ncomp > 0;
            if (ready && ((aim && ntmp > 0) || (!aim && now_s() >= kill_at))) {
                if (aim) t_sleep_ms(rand() % 2);
                kill(S.pid, SIGKILL);
                killed = 1;
            }
        }
        if (!killed) diag("round %d: no checkpoint write seen within 15 s", round);
        tpsd_stop(&S, SIGKILL);
        scan(&ncomp, &ntmp);
        aimed += aim && killed;
        mid_write += ntmp > 0;
        zmq_close(d);
    }
    is_int(loads_ok, ROUNDS - 1, "every restart loaded a checkpoint (never neither)");
    is_int(states_ok, ROUNDS - 1, "every loaded state is exactly the closed form for its versions");
    is_int(monotone, ROUNDS - 1, "versions never went backwards across restarts");
    is_int(tmp_gone, ROUNDS, "interrupted writes' temporary files removed at start");
    ok(mid_write >= 2, "%d of %d kills hit a write in progress (%d aimed)", mid_write, ROUNDS,
       aimed);
    diag("final versions %llu %llu %llu %llu", (unsigned long long)ver[0], (unsigned long long)ver[1],
         (unsigned long long)ver[2], (unsigned long long)ver[3]);
    ok(ver[0] > 0, "progress was made and kept");
    if (tap_failed_) tpsd_dump_log(&S, 40);
    unlink(S.log);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIRP);
    if (system(cmd)) diag("cleanup of %s failed", DIRP);
    if (t_ctx) zmq_ctx_term(t_ctx);
    free(G0), free(G1), free(BUF);
    ps_partition_table_free(&T);
    return tap_done();
}
