/* Load: 32 worker processes (fork, each with its own ZMQ context
 * and sockets, fault_lib.h's raw sync worker) against 2 psd in sync mode
 * for a fixed number of steps with rank-dependent integer gradients.  The
 * final weights must equal the exact expected values bitwise (every fp32
 * sum and mean is exact, see fault_lib.h), every partition must be at
 * version STEPS (nothing lost or doubled), and each psd's resident memory
 * (VmRSS) must stay flat: the largest sample of the last quarter of the run
 * is within 10% of the largest of the first quarter. */
#include <signal.h>
#include <sys/wait.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* psd_testlib.h helpers this test does not use */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/fault_lib.h"
#include "tests/lib/tap.h"

#define NW 32
#define STEPS 600
#define NSAMP 4096

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    long kb = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

static long max_of(const long *v, int lo, int hi)
{
    long m = 0;
    for (int i = lo; i < hi; i++) m = v[i] > m ? v[i] : m;
    return m;
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    tpsd_t S[2];
    char nw[16];
    snprintf(nw, sizeof nw, "%d", NW);
    const char *a0[] = {"--server-id", "0", "--num-servers", "2", "--num-workers", nw,
                        "--worker-timeout-ms", "0", "--threads", "1", NULL};
    const char *a1[] = {"--server-id", "1", "--num-servers", "2", "--num-workers", nw,
                        "--worker-timeout-ms", "0", "--threads", "1", NULL};
    if (!ok(tpsd_start(&S[0], "load0", a0) == 0 && tpsd_start(&S[1], "load1", a1) == 0,
            "two psd started")) {
        tpsd_stop(&S[0], SIGKILL);
        return tap_done();
    }
    fl_cfg_t c = {.host = "127.0.0.1", .nservers = 2, .ports = {S[0].port, S[1].port},
                  .nworkers = NW, .steps = STEPS, .hb_ms = 200, .retry_ms = 5000, .deadline_s = 40};
    ok(fl_init(&c) == 0, "INIT through rank 0 on both servers");
    double t0 = fl_now();
    pid_t kids[NW];
    fflush(stdout);
    for (int r = 0; r < NW; r++) {
        kids[r] = fork();
        if (kids[r] == 0) {
            fl_cfg_t cr = c;
            cr.rank = r;
            fl_result_t res;
            int rc = fl_work(&cr, &res);
            if (rc == 0 && (res.jumps || res.steps < 4 * STEPS))
                fprintf(stderr, "rank %d: %llu jumps, %llu answers\n", r,
                        (unsigned long long)res.jumps, (unsigned long long)res.steps);
            _exit(rc == 0 && res.jumps == 0 ? 0 : 1);
        }
    }
    static long rss[2][NSAMP];
    int ns = 0, done = 0, good = 0;
    while (done < NW) {
        if (ns < NSAMP) {
            rss[0][ns] = rss_kb(S[0].pid);
            rss[1][ns] = rss_kb(S[1].pid);
            ns++;
        }
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int r = 0; r < NW; r++)
                if (kids[r] == p) {
                    done++;
                    good += WIFEXITED(st) && WEXITSTATUS(st) == 0;
                }
        }
        if (fl_now() - t0 > 44) break;
        t_sleep_ms(20);
    }
    double secs = fl_now() - t0;
    for (int r = 0; r < NW; r++) /* after the 44 s bound: stop the stragglers */
        if (kids[r] > 0 && kill(kids[r], 0) == 0 && done < NW) kill(kids[r], SIGKILL);
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    is_int(good, NW, "all %d workers finished %d steps without skipping one (%.1f s)", NW, STEPS, secs);
    int nbad = -1, vrc = fl_verify(&c, STEPS, &nbad);
    ok(vrc == 0, "every partition at version %d, weights bitwise exact (%d differ)",
       STEPS, nbad);
    ok(ns >= 8, "enough RSS samples (%d)", ns);
    for (int s = 0; s < 2 && ns >= 8; s++) {
        long first = max_of(rss[s], 0, ns / 4), last = max_of(rss[s], ns - ns / 4, ns);
        ok(first > 0 && last <= first + first / 10, "psd %d RSS flat: first quarter max %ld kB, last %ld kB",
           s, first, last);
    }
    is_int(tpsd_stop(&S[0], SIGTERM), 0, "psd 0 exits 0");
    is_int(tpsd_stop(&S[1], SIGTERM), 0, "psd 1 exits 0");
    if (tap_failed_) tpsd_dump_log(&S[0], 20), tpsd_dump_log(&S[1], 20);
    unlink(S[0].log);
    unlink(S[1].log);
    return tap_done();
}
