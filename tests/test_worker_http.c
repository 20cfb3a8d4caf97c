/* psworker's /metrics (--metrics-port): the figures it reports against the
 * run's own CSV (loss, lr, steps, samples, step-time sums, throughput over
 * the last 10 steps), the same robustness as psd's listener (deadline,
 * connection cap, tests/lib/http_testlib.h) while training goes on, a clean
 * end with a connection open, and bad flags.  A standalone smoke run with
 * --step-sleep-ms keeps training slow enough to be watched. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* testlib helpers this test does not use */
#include "tests/lib/http_testlib.h"
#include "tests/lib/tap.h"

#define R0 "{rank=\"0\"}"

static char dir[256], logpath[300];

/* psworker --standalone (smoke) with extra flags, output to logpath; its pid. */
static pid_t start_worker(const char *const *extra)
{
    const char *b = getenv("top_builddir");
    static char exe[512];
    snprintf(exe, sizeof exe, "%s/psworker", b && *b ? b : ".");
    const char *argv[40] = {exe, "--standalone", "--out", dir, "--progress-every", "0",
                            "--no-plots", "--log-level", "info"};
    int n = 9;
    for (int i = 0; extra[i] && n < 38; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(logpath, "a", stdout) || !freopen(logpath, "a", stderr)) _exit(126);
        execv(exe, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Exit status of pid within timeout_s (-1: still running, then killed). */
static int wait_exit(pid_t pid, int timeout_s)
{
    int st;
    for (int i = 0; i < timeout_s * 20; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(50 * 1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static int log_has(const char *needle)
{
    FILE *f = fopen(logpath, "r");
    char line[1024];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
    if (f) fclose(f);
    return found;
}

/* The CSV up to iteration `last`: that row's loss and lr, the sum of
 * step_ms over rows 0..last and of the last 10 rows; rows read. */
typedef struct csv_sums {
    double loss, lr, sum_ms, last10_ms;
    int rows;
} csv_sums_t;

static int read_csv(long last, csv_sums_t *c)
{
    char path[300], line[512];
    snprintf(path, sizeof path, "%s/metrics-standalone.csv", dir);
    FILE *f = fopen(path, "r");
    double ms[10];
    memset(c, 0, sizeof *c);
    if (!f || !fgets(line, sizeof line, f)) {
        if (f) fclose(f);
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        long it;
        double loss, lr, step_ms;
        if (sscanf(line, "%ld,%lf,%lf,%lf", &it, &loss, &lr, &step_ms) != 4 || it > last) break;
        c->loss = loss, c->lr = lr, c->sum_ms += step_ms;
        ms[c->rows++ % 10] = step_ms;
    }
    fclose(f);
    for (int i = 0; i < (c->rows < 10 ? c->rows : 10); i++) c->last10_ms += ms[i];
    return c->rows;
}

static void figures_match_csv(const char *m)
{
    long step = (long)http_metric(m, "psworker_step" R0);
    double steps = http_metric(m, "psworker_steps_total" R0);
    csv_sums_t c;
    ok(step >= 0 && read_csv(step, &c) == step + 1 && steps == step + 1,
       "psworker_step %ld, psworker_steps_total %.0f: the CSV has rows 0..%ld", step, steps, step);
    is_close(http_metric(m, "psworker_loss" R0), c.loss, 1e-6, 0, "psworker_loss = the CSV's loss of step %ld", step);
    is_close(http_metric(m, "psworker_lr" R0), c.lr, 0, 1e-5, "psworker_lr = the CSV's lr");
    is_int((long long)http_metric(m, "psworker_samples_total" R0), 8 * (step + 1),
           "psworker_samples_total = batch 8 x %ld steps", step + 1);
    is_close(http_metric(m, "psworker_step_seconds_total{rank=\"0\",part=\"step\"}"), c.sum_ms / 1e3,
             1e-6 * c.rows, 0, "psworker_step_seconds_total{part=step} = sum of the CSV's step_ms");
    double rate = 8.0 * (c.rows < 10 ? c.rows : 10) / (c.last10_ms / 1e3);
    is_close(http_metric(m, "psworker_samples_per_second" R0), rate, 0, 1e-3,
             "psworker_samples_per_second = 8 samples x the CSV's last 10 steps / their time");
    double parts = 0;
    const char *names[] = {"data_wait", "compute", "comm_wait"};
    char s[128];
    for (int i = 0; i < 3; i++) {
        snprintf(s, sizeof s, "psworker_step_seconds_total{rank=\"0\",part=\"%s\"}", names[i]);
        parts += http_metric(m, s);
    }
    ok(parts > 0 && parts <= http_metric(m, "psworker_step_seconds_total{rank=\"0\",part=\"step\"}") + 1e-6,
       "the split (data wait + compute + comm wait = %.4f s) is within the steps' time", parts);
    ok(http_metric(m, "psworker_rank" R0) == 0 && http_metric(m, "psworker_workers" R0) == 1 &&
       http_metric(m, "psworker_loss_scale" R0) == 1 && http_metric(m, "psworker_arena_bytes" R0) >= 0,
       "psworker_rank 0, psworker_workers 1, psworker_loss_scale 1 (off), psworker_arena_bytes");
    ok(strstr(m, "psworker_info{rank=\"0\",model=\"smoke\",mode=\"standalone\",unit=\"samples\"} 1") != NULL,
       "psworker_info names the model, mode and unit");
}

/* While every allowed connection is held, training goes on: the CSV grows
 * (read from the file: a GET now would be one connection too many). */
static void training_goes_on(void *arg)
{
    (void)arg;
    csv_sums_t c;
    int before = read_csv(1L << 40, &c);
    usleep(500 * 1000);
    int after = read_csv(1L << 40, &c);
    ok(before > 0 && after > before, "training goes on while %d connections are held (%d -> %d "
       "steps in 0.5 s)", HTTP_HELD, before, after);
}

int main(void)
{
    char resp[65536], port[16];
    snprintf(dir, sizeof dir, "%s/ps-whttp-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    snprintf(logpath, sizeof logpath, "%s.log", dir);
    http_port = http_free_port();
    snprintf(port, sizeof port, "%d", http_port);

    const char *run[] = {"--steps", "1000000", "--batch", "8", "--step-sleep-ms", "20",
                         "--metrics-port", port, NULL};
    pid_t pid = start_worker(run);
    is_int(http_get_ready(resp, sizeof resp), 200, "psworker --metrics-port %s: GET /metrics answers", port);
    usleep(300 * 1000); /* a few steps */
    is_int(http_get("/metrics", resp, sizeof resp), 200, "GET /metrics again, some steps later");
    figures_match_csv(resp);
    http_slow_but_complete();
    http_flood_check("psworker", R0, training_goes_on, NULL, NULL);
    kill(pid, SIGTERM);
    wait_exit(pid, 30);

    /* The end of a run with a /metrics connection open: no hang, exit 0. */
    const char *shortrun[] = {"--steps", "40", "--batch", "8", "--step-sleep-ms", "20",
                              "--metrics-port", port, NULL};
    pid = start_worker(shortrun);
    int held = -1;
    for (int i = 0; i < 200 && held < 0; i++) {
        if (http_get("/metrics", resp, sizeof resp) == 200) held = http_connect();
        else usleep(50 * 1000);
    }
    ok(held >= 0, "a connection to the short run's /metrics is held open (silent)");
    is_int(wait_exit(pid, 120), 0, "the run ends with exit 0 while it is open");
    if (held >= 0) close(held);

    /* Bad flags: named, before training. */
    const char *badport[] = {"--metrics-port", "70000", NULL};
    is_int(wait_exit(start_worker(badport), 30), 2, "--metrics-port 70000: exit 2");
    ok(log_has("--metrics-port must be in [0, 65535]"), "... naming the flag");
    const char *badbind[] = {"--metrics-port", port, "--metrics-bind", "not-an-address", NULL};
    is_int(wait_exit(start_worker(badbind), 30), 1, "--metrics-bind not-an-address: exit 1");
    ok(log_has("--metrics-bind not-an-address: not an IP address"), "... naming the flag");
    int blocker = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(blocker, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* past TIME_WAIT */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(http_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int bound = bind(blocker, (struct sockaddr *)&a, sizeof a) == 0 && listen(blocker, 1) == 0;
    const char *busy[] = {"--metrics-port", port, NULL};
    is_int(bound ? wait_exit(start_worker(busy), 30) : -2, 1, "--metrics-port of a port in use: exit 1");
    ok(log_has("/metrics: cannot listen on 127.0.0.1:") && log_has("address already in use"),
       "... saying it cannot listen there");
    close(blocker);

    if (tap_failed_) {
        diag("psworker's log: %s (kept)", logpath);
    } else {
        unlink(logpath);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) diag("could not remove %s", dir);
    }
    return tap_done();
}
