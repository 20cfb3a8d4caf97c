/* psd's connection log under a flood: 200 TCP connections to the ZeroMQ
 * port, opened and dropped at once, give the first few "connection from ...
 * closed (" lines of the interval as before and then one summary line with
 * the exact count of the others, so a flood cannot fill the disk; STATS
 * peer_disconnects still counts every one.  No timing bound but generous
 * upper ones. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* psd_testlib.h helpers this test does not use */
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define DROPS 200

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

/* The log's one-by-one close lines (the format tests/test_psd_maxmsg.c
 * reads) and its summary lines: how many, and the closes they sum up. */
static void log_counts(const tpsd_t *S, int *lines, int *summaries, long *summed)
{
    char line[2048];
    *lines = *summaries = 0;
    *summed = 0;
    FILE *f = fopen(S->log, "r");
    while (f && fgets(line, sizeof line, f)) {
        const char *c = strstr(line, "connection from ");
        if (c && strstr(c, " closed (")) {
            c += strlen("connection from ");
            *lines += !strncmp(c, "127.0.0.1:", 10) ||
                      (!strncmp(c, "fd ", 3) && strstr(c, "(closed before psd read its address) closed"));
            continue;
        }
        const char *m = strstr(line, "... and ");
        long k;
        if (m && strstr(m, " more connections closed in the last ") &&
            sscanf(m, "... and %ld more", &k) == 1) {
            (*summaries)++;
            *summed += k;
        }
    }
    if (f) fclose(f);
}

static int drop_one(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    tpsd_t S;
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--log-level", "info", NULL};
    if (!ok(tpsd_start(&S, "connlog", args) == 0, "psd started")) return tap_done();
    void *d = t_dealer(S.port);
    double disc0 = stats_num(d, "peer_disconnects");
    ok(disc0 == 0, "STATS answers: peer_disconnects %.0f", disc0);

    int dropped = 0;
    for (int i = 0; i < DROPS; i++) dropped += drop_one(S.port);
    is_int(dropped, DROPS, "%d TCP connections to the ZeroMQ port opened and dropped", DROPS);
    double disc = disc0;
    for (int i = 0; i < 600 && disc < disc0 + DROPS; i++, t_sleep_ms(50))
        disc = stats_num(d, "peer_disconnects");
    ok(disc == disc0 + DROPS, "STATS peer_disconnects counts every one: %.0f -> %.0f", disc0, disc);

    /* The summary comes at the end of the interval (10 s); wait for the
     * lines and summaries to account for every close. */
    int lines = 0, summaries = 0;
    long summed = 0;
    for (int i = 0; i < 600 && lines + summed < DROPS; i++, t_sleep_ms(50))
        log_counts(&S, &lines, &summaries, &summed);
    ok(lines >= 1 && lines <= 20, "%d one-by-one close lines, far fewer than %d", lines, DROPS);
    ok(summaries >= 1, "%d summary line(s) \"... and N more connections closed in the last ...\"",
       summaries);
    is_int((int)(lines + summed), DROPS, "lines + the summaries' counts = every close (%d + %ld)",
           lines, summed);

    /* A later close, in a new interval, is logged one by one again (or,
     * should a loaded machine have stretched the flood over two intervals
     * and filled the last one's burst, summed up at its end). */
    int before = lines;
    ok(drop_one(S.port), "one more connection dropped after the interval");
    for (int i = 0; i < 600 && lines + summed < DROPS + 1; i++, t_sleep_ms(50))
        log_counts(&S, &lines, &summaries, &summed);
    is_int((int)(lines + summed), DROPS + 1, "... and it is in the log too (%s)",
           lines > before ? "its own line" : "a summary");
    is_int((int)stats_num(d, "peer_disconnects"), (int)disc0 + DROPS + 1, "peer_disconnects + 1");

    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "psd exits 0 on SIGTERM");
    if (tap_failed_) tpsd_dump_log(&S, 30);
    unlink(S.log);
    zmq_ctx_term(t_ctx);
    return tap_done();
}
