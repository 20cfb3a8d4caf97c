/* fault_worker: command-line front of fault_lib.h for the shell fault tests
 * (tests/test_fault_netns.sh runs it inside a network namespace).
 *   fault_worker init   --host H --ports P0[,P1..] --workers W
 *   fault_worker work   --host H --ports .. --workers W --rank R --steps K [--src IP]
 *                       [--same-grad] [--retry-ms MS] [--hb-ms MS] [--deadline-s S] [--pace-ms MS]
 *   fault_worker verify --host H --ports .. --workers W --steps K [--same-grad]
 * Exit 0 on success; work prints "rank R: answers A, resends X, jumps J". */
#include "tests/lib/fault_lib.h"

static int usage(void)
{
    fprintf(stderr, "usage: fault_worker init|work|verify --host H --ports P0[,P1] --workers W "
                    "[--rank R] [--steps K] [--src IP] [--same-grad] [--retry-ms MS] [--hb-ms MS] "
                    "[--deadline-s S] [--pace-ms MS]\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage();
    fl_cfg_t c = {.host = "127.0.0.1", .hb_ms = 200, .retry_ms = 1000, .deadline_s = 60};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--same-grad")) {
            c.same_grad = 1;
            continue;
        }
        if (!v) return usage();
        i++;
        if (!strcmp(a, "--host")) c.host = v;
        else if (!strcmp(a, "--src")) c.src = v;
        else if (!strcmp(a, "--workers")) c.nworkers = atoi(v);
        else if (!strcmp(a, "--rank")) c.rank = atoi(v);
        else if (!strcmp(a, "--steps")) c.steps = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--retry-ms")) c.retry_ms = atoi(v);
        else if (!strcmp(a, "--hb-ms")) c.hb_ms = atoi(v);
        else if (!strcmp(a, "--deadline-s")) c.deadline_s = atoi(v);
        else if (!strcmp(a, "--pace-ms")) c.pace_ms = atoi(v);
        else if (!strcmp(a, "--ports")) {
            char *e;
            const char *p = v;
            c.nservers = 0;
            while (*p && c.nservers < FL_MAXS) {
                c.ports[c.nservers++] = (int)strtol(p, &e, 10);
                p = *e == ',' ? e + 1 : e;
                if (e == p && *p) return usage();
            }
        } else return usage();
    }
    if (c.nservers < 1 || c.nworkers < 1) return usage();
    if (!strcmp(argv[1], "init")) return fl_init(&c) ? 1 : 0;
    if (!strcmp(argv[1], "verify")) {
        int nbad = -1, rc = fl_verify(&c, c.steps, &nbad);
        printf("verify: %s (%d weights differ)\n", rc ? "FAILED" : "ok", nbad);
        return rc ? 1 : 0;
    }
    if (!strcmp(argv[1], "work")) {
        fl_result_t r;
        int rc = fl_work(&c, &r);
        printf("rank %d: answers %llu, resends %llu, jumps %llu%s\n", c.rank,
               (unsigned long long)r.steps, (unsigned long long)r.resends,
               (unsigned long long)r.jumps, rc ? " FAILED" : "");
        return rc ? 1 : 0;
    }
    return usage();
}
