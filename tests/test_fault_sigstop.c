/* A worker paused (SIGSTOP) longer than --worker-timeout-ms, then resumed,
 * with --on-worker-loss=continue: 4 worker processes
 * (fault_lib.h's raw sync worker, all pushing the same gradient so the
 * expected weights do not depend on who contributed to a step) run STEPS
 * sync steps; rank 3 is stopped for 2.5 s (timeout 1 s) mid-run.
 * What must happen (docs/reliability.md):
 *  - psd declares rank 3 lost after the timeout and the others go on: the
 *    version advances while it is stopped, averaged over the 3 pushers
 *    (a mean over 4 would change the weights);
 *  - the resumed worker is not refused: its stale push (an iteration
 *    already applied without it) is answered with the current weights and
 *    version and is not applied; it catches up from that version (it sees
 *    a jump) and is live again;
 *  - the job ends with every partition at exactly STEPS and the weights
 *    bitwise equal to STEPS applied steps: nothing lost, nothing twice.
 * Second scenario, the same with SIGKILL (mid-push: the worker pushes all
 * the time) and a new process for rank 3 started from iteration 0, as a
 * restarted worker without state: its first pushes are for applied
 * iterations, answered with the current version, and it rejoins there. */
#include <signal.h>
#include <sys/wait.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* psd_testlib.h helpers not used here */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/fault_lib.h"
#include "tests/lib/tap.h"

#define NW 4
#define STEPS 1000
#define PAUSED 3

static int stats(int port, char *body, size_t cap)
{
    void *d = t_dealer(port);
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    body[0] = 0;
    int rc = t_call(d, &h, NULL, 0, NULL, 0, NULL, body, cap);
    zmq_close(d);
    return rc;
}

static uint64_t version0(int port)
{
    void *d = t_dealer(port);
    float w[FL_N];
    uint64_t v = 0;
    if (t_pull(d, 0, 0, w, FL_N, &v) != PS__MSG_TYPE__MSG_WEIGHTS) v = 0;
    zmq_close(d);
    return v;
}

static pid_t spawn(const fl_cfg_t *c, int r)
{
    pid_t pid = fork();
    if (pid == 0) {
        fl_cfg_t cr = *c;
        cr.rank = r;
        fl_result_t res;
        int rc = fl_work(&cr, &res);
        fprintf(stderr, "# rank %d: answers %llu, resends %llu, jumps %llu\n", r,
                (unsigned long long)res.steps, (unsigned long long)res.resends,
                (unsigned long long)res.jumps);
        /* exit 0: done; 3: done without catching up (rank PAUSED must jump) */
        _exit(rc ? 1 : r == PAUSED && res.jumps == 0 ? 3 : 0);
    }
    return pid;
}

/* kill_it 0: SIGSTOP rank 3 for 2.5 s, then SIGCONT.  1: SIGKILL it, and
 * 2.5 s later start a new process with the same rank (from iteration 0, as
 * a restarted worker that lost its state would). */
static void scenario(int kill_it)
{
    const char *what = kill_it ? "kill" : "stop";
    tpsd_t S;
    char nw[16];
    snprintf(nw, sizeof nw, "%d", NW);
    const char *args[] = {"--num-workers", nw, "--worker-timeout-ms", "1000", "--heartbeat-ms", "100",
                          "--on-worker-loss", "continue", "--threads", "1", "--log-level", "info", NULL};
    if (!ok(tpsd_start(&S, "sigstop", args) == 0, "%s: psd started", what)) return;
    fl_cfg_t c = {.host = "127.0.0.1", .nservers = 1, .ports = {S.port}, .nworkers = NW,
                  .steps = STEPS, .same_grad = 1, .hb_ms = 100, .retry_ms = 2000, .deadline_s = 45,
                  .pace_ms = 5};
    ok(fl_init(&c) == 0, "%s: INIT", what);
    pid_t kids[NW];
    fflush(stdout);
    for (int r = 0; r < NW; r++) kids[r] = spawn(&c, r);
    /* Let the job get going, then stop / kill rank 3 mid-step. */
    double t0 = fl_now();
    uint64_t v_start = 0;
    while (fl_now() - t0 < 20 && (v_start = version0(S.port)) < STEPS / 20) t_sleep_ms(20);
    ok(v_start >= STEPS / 20 && v_start < STEPS, "%s: job running (version %llu) before the fault",
       what, (unsigned long long)v_start);
    kill(kids[PAUSED], kill_it ? SIGKILL : SIGSTOP);
    if (kill_it) waitpid(kids[PAUSED], NULL, 0);
    t_sleep_ms(1500); /* past the 1 s timeout (+ heartbeat check) */
    uint64_t v_a = version0(S.port);
    char body[8192];
    stats(S.port, body, sizeof body);
    ok(strstr(body, "{\"rank\":3,\"state\":\"lost\"") != NULL, "%s: rank 3 declared lost", what);
    t_sleep_ms(1000);
    uint64_t v_b = version0(S.port);
    ok(v_b > v_a, "%s: the others go on without it (version %llu -> %llu)", what,
       (unsigned long long)v_a, (unsigned long long)v_b);
    if (kill_it) {
        /* The ZMQ context of the test must not be inherited by the worker. */
        zmq_ctx_term(t_ctx);
        t_ctx = NULL;
        fflush(stdout);
        kids[PAUSED] = spawn(&c, PAUSED);
    } else {
        kill(kids[PAUSED], SIGCONT);
    }
    int good = 0, caught_up = 0;
    for (int r = 0; r < NW; r++) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        good += code == 0 || code == 3;
        if (r == PAUSED) caught_up = code == 0;
    }
    is_int(good, NW, "%s: all workers finished the job", what);
    ok(caught_up, "%s: the %s worker caught up from the version psd answered", what,
       kill_it ? "restarted" : "resumed");
    stats(S.port, body, sizeof body);
    ok(strstr(body, "{\"rank\":3,\"state\":\"live\"") != NULL, "%s: rank 3 live again", what);
    int nbad = -1, vrc = fl_verify(&c, STEPS, &nbad);
    ok(vrc == 0, "%s: every partition at exactly version %d, weights bitwise exact (%d differ)", what,
       STEPS, nbad);
    is_int(tpsd_stop(&S, SIGTERM), 0, "%s: psd exits 0", what);
    if (tap_failed_) tpsd_dump_log(&S, 30);
    unlink(S.log);
    if (t_ctx) zmq_ctx_term(t_ctx);
    t_ctx = NULL;
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    scenario(0);
    scenario(1);
    return tap_done();
}
