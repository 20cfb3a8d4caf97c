/* psd's /metrics listener against clients that do not finish: raw TCP
 * connections that send nothing or half a request line are closed at their
 * deadline (PS_HTTP_DEADLINE_MS, counted in http_timeouts), at most
 * PS_HTTP_MAX_CONNS are open at once (more are closed at accept, counted in
 * http_rejected), and a well-behaved GET is answered during and after.  The
 * only timing bounds are upper bounds several times the deadline.  (The
 * same listener in psworker: tests/test_worker_http.c.) */
#include <sys/socket.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* testlib helpers this test does not use */
#include "tests/lib/http_testlib.h"
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

static double stats_num(void *d, const char *key)
{
    Ps__Header h;
    char body[16384], pat[64];
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_STATS);
    if (t_call(d, &h, NULL, 0, NULL, 0, NULL, body, sizeof body) != PS__MSG_TYPE__MSG_ACK) return -1;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(body, pat);
    return p ? atof(p + strlen(pat)) : -1;
}

/* STATS agrees with /metrics: the open count at the peak, the totals after. */
static void stats_at_full(void *d)
{
    double open_now = -1;
    for (int i = 0; i < 100 && open_now != HTTP_HELD; i++, t_sleep_ms(50))
        open_now = stats_num(d, "http_connections");
    ok(open_now == HTTP_HELD, "STATS http_connections = %.0f (want %d)", open_now, HTTP_HELD);
}

static void stats_after(void *d)
{
    is_int((int)stats_num(d, "http_rejected"), HTTP_EXTRA, "STATS http_rejected = %d", HTTP_EXTRA);
    is_int((int)stats_num(d, "http_timeouts"), HTTP_HELD, "STATS http_timeouts = %d", HTTP_HELD);
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    http_port = http_free_port();
    char mport[16], resp[65536];
    snprintf(mport, sizeof mport, "%d", http_port);
    tpsd_t S;
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--metrics-port", mport,
                          "--log-level", "info", NULL};
    if (!ok(tpsd_start(&S, "http", args) == 0, "psd started with --metrics-port %s", mport))
        return tap_done();
    void *d = t_dealer(S.port);
    is_int(http_get_ready(resp, sizeof resp), 200, "GET /metrics answers");
    ok(http_metric(resp, "psd_http_timeouts_total") == 0 &&
       http_metric(resp, "psd_http_rejected_total") == 0,
       "... with psd_http_timeouts_total 0 and psd_http_rejected_total 0");
    http_slow_but_complete();
    http_flood_check("psd", "", stats_at_full, stats_after, d);

    /* Shutdown with connections still open frees them (no hang, clean exit). */
    int last = http_connect();
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0 on SIGTERM with a /metrics connection open");
    if (last >= 0) close(last);
    if (tap_failed_) tpsd_dump_log(&S, 30);
    unlink(S.log);
    zmq_ctx_term(t_ctx);
    return tap_done();
}
