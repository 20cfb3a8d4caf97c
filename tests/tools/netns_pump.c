/* A TCP pump for tests/test_netns.sh: measures what one connection carries
 * between two emulated hosts.
 *   netns_pump recv ADDR PORT    accept one connection, read to EOF, print
 *                                "bytes=B seconds=S mbit_per_s=R" (from the
 *                                first byte to EOF)
 *   netns_pump send ADDR PORT SECONDS   write 256 KiB chunks for SECONDS */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int addr_of(const char *a, const char *p, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((unsigned short)atoi(p));
    return inet_pton(AF_INET, a, &sa->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    static char buf[256 * 1024];
    struct sockaddr_in sa;
    if (argc < 4 || addr_of(argv[2], argv[3], &sa) < 0 ||
        (strcmp(argv[1], "recv") && (strcmp(argv[1], "send") || argc < 5))) {
        fprintf(stderr, "usage: netns_pump recv ADDR PORT | send ADDR PORT SECONDS\n");
        return 2;
    }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) {
        perror("netns_pump: socket");
        return 1;
    }
    if (!strcmp(argv[1], "recv")) {
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(s, 1) < 0) {
            fprintf(stderr, "netns_pump: bind/listen %s:%s: %s\n", argv[2], argv[3], strerror(errno));
            return 1;
        }
        printf("listening\n");
        fflush(stdout);
        int c = accept(s, NULL, NULL);
        if (c < 0) {
            perror("netns_pump: accept");
            return 1;
        }
        double t0 = 0, t1 = 0;
        long long total = 0;
        for (;;) {
            ssize_t n = read(c, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            if (!total) t0 = now();
            total += n;
            t1 = now();
        }
        double secs = t1 - t0;
        printf("bytes=%lld seconds=%.3f mbit_per_s=%.1f\n", total, secs,
               secs > 0 ? (double)total * 8 / secs / 1e6 : 0.0);
        return total > 0 ? 0 : 1;
    }
    double secs = atof(argv[4]), end;
    for (int i = 0; connect(s, (struct sockaddr *)&sa, sizeof sa) < 0; i++) {
        if (i == 100) {
            fprintf(stderr, "netns_pump: connect %s:%s: %s\n", argv[2], argv[3], strerror(errno));
            return 1;
        }
        close(s);
        s = socket(AF_INET, SOCK_STREAM, 0);
        usleep(50 * 1000);
    }
    memset(buf, 0x5a, sizeof buf);
    end = now() + secs;
    while (now() < end) {
        ssize_t n = write(s, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            perror("netns_pump: write");
            return 1;
        }
    }
    close(s);
    return 0;
}
