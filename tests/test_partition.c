/* ps_partition: the table against a second implementation of the rules
 * (tests/golden/gen_partition.py -> partition_cases.txt), plus invariants on
 * random models: cap respected, partitions tile [0,total) in order, greedy
 * balance bound, segments sum up, determinism across processes, hash
 * sensitivity to every input, and rejection of bad input. */
#include "ps_error.h"
#include "ps_log.h"
#include "ps_partition.h"
#include "tests/lib/tap.h"

#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t rng_state = 0x13198a2e03707344ull;
static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* ---- golden cases ---------------------------------------------------------- */

static void test_golden(void)
{
    const char *top = getenv("top_srcdir");
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/tests/golden/partition_cases.txt", top ? top : ".");
    FILE *fp = fopen(path, "r");
    if (!ok(fp != NULL, "open %s", path)) return;
    int ncases = 0;
    while (fgets(line, sizeof line, fp)) {
        char cname[128];
        size_t pb;
        unsigned ns, nt;
        if (line[0] == '#' || sscanf(line, "case %127s %zu %u %u", cname, &pb, &ns, &nt) != 4) continue;
        ps_tensor_spec_t *ts = calloc(nt, sizeof *ts);
        char (*names)[128] = calloc(nt, 128);
        int parsed = 1;
        for (unsigned i = 0; i < nt; i++)
            parsed &= fgets(line, sizeof line, fp) && sscanf(line, "tensor %127s %zu %d", names[i], &ts[i].numel, &ts[i].group) == 3;
        for (unsigned i = 0; i < nt; i++) ts[i].name = names[i];
        unsigned np = 0;
        parsed &= fgets(line, sizeof line, fp) && sscanf(line, "parts %u", &np) == 1;
        ps_partition_table_t t;
        int rc = ps_partition_table_build(&t, ts, nt, pb, ns);
        int same = parsed && rc == 0 && t.nparts == np;
        for (unsigned p = 0; p < np; p++) {
            size_t off, n;
            unsigned s;
            parsed &= fgets(line, sizeof line, fp) && sscanf(line, "%zu %zu %u", &off, &n, &s) == 3;
            if (same && (t.parts[p].offset != off || t.parts[p].numel != n || t.parts[p].server != s || t.parts[p].id != p)) {
                diag("%s part %u: got (%zu %zu %u) want (%zu %zu %u)", cname, p, t.parts[p].offset, t.parts[p].numel,
                     t.parts[p].server, off, n, s);
                same = 0;
            }
        }
        unsigned long long h = 0;
        parsed &= fgets(line, sizeof line, fp) && sscanf(line, "hash %llx", &h) == 1;
        ok(parsed && same, "%s: %u partitions match the Python reference", cname, np);
        is_int(rc == 0 ? t.hash : 0, h, "%s: hash %016llx", cname, h);
        if (rc == 0) ps_partition_table_free(&t);
        free(ts);
        free(names);
        ncases++;
    }
    fclose(fp);
    ok(ncases >= 7, "read %d golden cases", ncases);
}

/* ---- invariants on random models ---------------------------------------- */

typedef struct {
    ps_tensor_spec_t ts[200];
    char names[200][32];
    uint32_t nt;
} model_t;

static void random_model(model_t *m)
{
    m->nt = 1 + rnd32() % 200;
    for (uint32_t i = 0; i < m->nt; i++) {
        snprintf(m->names[i], 32, "layer%u.w%u", i / 4, i);
        m->ts[i].name = m->names[i];
        uint32_t k = rnd32() % 10;
        m->ts[i].numel = k < 4 ? 1 + rnd32() % 64 : k < 8 ? 1 + rnd32() % 5000 : 1 + rnd32() % 300000;
        m->ts[i].group = (int)(rnd32() % 4);
    }
}

static int check_invariants(const ps_partition_table_t *t, const char **why)
{
    size_t cap = t->partition_bytes / 4, pos = 0, maxpart = 0;
    for (uint32_t p = 0; p < t->nparts; p++) {
        const ps_partition_t *q = &t->parts[p];
        if (q->id != p) return *why = "id != index", 0;
        if (q->offset != pos) return *why = "gap or overlap", 0;
        if (!q->numel || q->numel > cap) return *why = "partition empty or over cap", 0;
        if (q->server >= t->nservers) return *why = "server out of range", 0;
        pos += q->numel;
        if (q->numel > maxpart) maxpart = q->numel;
        /* segments cover the partition exactly, inside tensor bounds */
        ps_partition_segment_t seg[8];
        uint32_t ns = ps_partition_segments(t, p, seg, 8);
        ps_partition_segment_t *sg = ns > 8 ? calloc(ns, sizeof *sg) : seg;
        if (ns > 8) ps_partition_segments(t, p, sg, ns);
        size_t sum = 0;
        int segok = ns > 0;
        for (uint32_t k = 0; k < ns && segok; k++) {
            const ps_partition_segment_t *s = &sg[k];
            size_t flat = q->offset + s->part_offset;
            segok = s->part_offset == sum && s->numel > 0 && s->tensor < t->ntensors &&
                    flat >= t->tensor_offset[s->tensor] &&
                    flat + s->numel <= t->tensor_offset[s->tensor] + t->tensors[s->tensor].numel &&
                    (k == 0 || s->tensor == sg[k - 1].tensor + 1);
            sum += s->numel;
        }
        if (sg != seg) free(sg);
        if (!segok || sum != q->numel) return *why = "segments do not tile the partition", 0;
        if (ps_partition_at(t, q->offset) != p || ps_partition_at(t, q->offset + q->numel - 1) != p)
            return *why = "ps_partition_at disagrees", 0;
    }
    if (pos != t->total_numel) return *why = "partitions do not end at total_numel", 0;
    /* packing rule: a partition is closed only when the next tensor would
     * not fit (so consecutive partitions could not have been merged unless
     * a tensor boundary forbids it) */
    for (uint32_t p = 0; p + 1 < t->nparts; p++) {
        const ps_partition_t *a = &t->parts[p];
        size_t boundary = a->offset + a->numel;
        /* find the tensor starting at boundary, if any */
        int starts = 0;
        for (uint32_t i = 0; i < t->ntensors; i++)
            if (t->tensor_offset[i] == boundary) {
                starts = 1;
                if (a->numel + t->tensors[i].numel <= cap) return *why = "closed a partition the next tensor fits in", 0;
            }
        if (!starts && a->numel != cap) return *why = "cut inside a tensor short of cap", 0;
    }
    size_t mx = 0, mn = SIZE_MAX, total = 0;
    uint32_t count = 0;
    for (uint32_t s = 0; s < t->nservers; s++) {
        size_t b;
        count += ps_partition_count_for(t, s, &b);
        total += b;
        if (b > mx) mx = b;
        if (b < mn) mn = b;
    }
    if (count != t->nparts || total != t->total_numel * 4) return *why = "count_for does not add up", 0;
    if (mx - mn > maxpart * 4) return *why = "imbalance larger than the largest partition", 0;
    return 1;
}

static void test_invariants(void)
{
    static model_t m;
    int bad = 0;
    for (int iter = 0; iter < 300; iter++) {
        random_model(&m);
        size_t pb = 4 * (1 + rnd32() % (iter < 150 ? 5000 : 400000));
        if (iter % 10 == 0) pb += 1 + rnd32() % 3; /* not a multiple of 4 */
        uint32_t ns = 1 + rnd32() % 9;
        ps_partition_table_t t;
        const char *why = "build failed";
        if (ps_partition_table_build(&t, m.ts, m.nt, pb, ns) || !check_invariants(&t, &why)) {
            if (bad++ < 3) diag("model %d (nt %u, pb %zu, ns %u): %s", iter, m.nt, pb, ns, why);
        }
        ps_partition_table_free(&t);
    }
    is_int(bad, 0, "300 random models: cap, tiling, packing rule, segments, balance bound");

    /* the invariant checker itself notices a broken table */
    random_model(&m);
    ps_partition_table_t t;
    const char *why = "";
    ps_partition_table_build(&t, m.ts, m.nt, 4096, 3);
    t.parts[0].numel--;
    ok(!check_invariants(&t, &why), "checker rejects a tampered table (%s)", why);
    ps_partition_table_free(&t);
}

static void test_determinism_and_hash(void)
{
    static model_t m;
    rng_state = 42;
    random_model(&m);
    while (m.nt < 10) random_model(&m);
    ps_partition_table_t a, b;
    ps_partition_table_build(&a, m.ts, m.nt, 65536, 4);
    ps_partition_table_build(&b, m.ts, m.nt, 65536, 4);
    ok(a.hash == b.hash && a.nparts == b.nparts && !memcmp(a.parts, b.parts, a.nparts * sizeof *a.parts),
       "two builds give the same table");

    /* another process (fresh heap, different addresses) computes the same */
    int pfd[2];
    uint64_t child_hash = 0;
    if (pipe(pfd) == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            ps_partition_table_t c;
            char *junk = malloc(12345); /* perturb the heap */
            ps_partition_table_build(&c, m.ts, m.nt, 65536, 4);
            if (write(pfd[1], &c.hash, 8) != 8) _exit(1);
            free(junk);
            _exit(0);
        }
        close(pfd[1]);
        if (read(pfd[0], &child_hash, 8) != 8) child_hash = 0;
        close(pfd[0]);
        waitpid(pid, NULL, 0);
    }
    is_int(child_hash, a.hash, "a forked process computes the same hash");

    /* the table does not keep pointers into the caller's specs */
    char nm[32];
    strcpy(nm, m.names[0]);
    strcpy(m.names[0], "changed");
    ok(!strcmp(a.tensors[0].name, nm), "names are copied");
    strcpy(m.names[0], nm);

    /* every input changes the hash */
    ps_partition_table_t c;
    int changed = 0, tried = 0;
#define CHANGED(expr_setup, expr_undo, pb, ns)                              \
    do {                                                                    \
        expr_setup;                                                         \
        if (!ps_partition_table_build(&c, m.ts, m.nt, pb, ns)) {            \
            changed += c.hash != a.hash;                                    \
            ps_partition_table_free(&c);                                    \
        }                                                                   \
        tried++;                                                            \
        expr_undo;                                                          \
    } while (0)
    CHANGED((void)0, (void)0, 65540, 4);
    CHANGED((void)0, (void)0, 65536, 5);
    CHANGED(m.names[3][0] ^= 1, m.names[3][0] ^= 1, 65536, 4);
    CHANGED(m.ts[5].group++, m.ts[5].group--, 65536, 4);
    CHANGED(m.ts[m.nt - 1].numel++, m.ts[m.nt - 1].numel--, 65536, 4);
    CHANGED((m.ts[1].numel++, m.ts[2].numel--), (m.ts[1].numel--, m.ts[2].numel++), 65536, 4);
    CHANGED(m.nt--, m.nt++, 65536, 4);
    ps_tensor_spec_t tmp = m.ts[0];
    CHANGED((m.ts[0] = m.ts[1], m.ts[1] = tmp), (m.ts[1] = m.ts[0], m.ts[0] = tmp), 65536, 4);
    is_int(changed, tried, "hash changes with partition_bytes, nservers, a name, a group, sizes, count, order");
    ok(b.hash == a.hash, "...and not otherwise");
    ps_partition_table_free(&a);
    ps_partition_table_free(&b);
}

static void test_small_cases(void)
{
    /* hand-worked: cap = 10 elements */
    ps_tensor_spec_t ts[] = {{"a", 4, 0}, {"b", 5, 0}, {"c", 2, 1}, {"d", 23, 0}, {"e", 3, 2}, {"f", 10, 0}};
    ps_partition_table_t t;
    int rc = ps_partition_table_build(&t, ts, 6, 40, 2);
    is_int(rc, 0, "build hand-worked table");
    /* a+b=9 | c=2 then d (23>10): close [c]; d -> 10,10, remainder 3 opens; e
     * joins (3+3=6); f (10) does not fit -> close; f alone */
    static const size_t want_off[] = {0, 9, 11, 21, 31, 37}, want_n[] = {9, 2, 10, 10, 6, 10};
    int good = t.nparts == 6;
    for (uint32_t p = 0; good && p < 6; p++) good = t.parts[p].offset == want_off[p] && t.parts[p].numel == want_n[p];
    ok(good, "packing: [a b] [c] [d0] [d1] [d2 e] [f]");
    /* greedy: sizes 10(p2),10(p3),10(p5),9(p0),6(p4),2(p1) -> s0,s1,s0,s1,s1,s0 */
    static const uint32_t want_srv[] = {1, 0, 0, 1, 1, 0};
    good = t.nparts == 6;
    for (uint32_t p = 0; good && p < 6; p++) good = t.parts[p].server == want_srv[p];
    ok(good, "greedy assignment by descending size, ties to the lower id / server");
    ps_partition_segment_t seg[4];
    uint32_t ns = ps_partition_segments(&t, 4, seg, 4);
    ok(ns == 2 && seg[0].tensor == 3 && seg[0].part_offset == 0 && seg[0].numel == 3 && seg[1].tensor == 4 &&
       seg[1].part_offset == 3 && seg[1].numel == 3, "segments of [d2 e]");
    is_int(ps_partition_segments(&t, 0, seg, 1), 2, "segments returns the full count when max is short");
    is_int(ps_partition_segments(&t, 99, seg, 4), 0, "segments of a missing partition: 0");
    size_t bytes;
    is_int(ps_partition_count_for(&t, 0, &bytes), 3, "server 0 owns 3 partitions");
    is_int(bytes, 22 * 4, "server 0 owns 22 floats");
    is_int(ps_partition_at(&t, 36), 4, "element 36 is in partition 4");
    is_int(ps_partition_at(&t, 47), UINT32_MAX, "element past the end: none");
    is_int(ps_partition_tensor_index(&t, "e"), 4, "tensor index of 'e'");
    is_int(ps_partition_tensor_index(&t, "zz"), PS_ENOTFOUND, "unknown tensor name");
    ps_partition_table_free(&t);
    ps_partition_table_free(&t); /* safe twice */

    /* more servers than partitions: the extra servers own nothing */
    ps_partition_table_build(&t, ts, 2, 1 << 20, 5);
    ok(t.nparts == 1 && t.parts[0].server == 0 && ps_partition_count_for(&t, 4, &bytes) == 0 && bytes == 0,
       "one partition, five servers");
    ps_partition_table_free(&t);

    /* invalid input */
    ps_tensor_spec_t zero[] = {{"a", 4, 0}, {"b", 0, 0}};
    ps_tensor_spec_t dup[] = {{"a", 4, 0}, {"b", 1, 0}, {"a", 2, 0}};
    ps_tensor_spec_t noname[] = {{"a", 4, 0}, {NULL, 1, 0}};
    ps_tensor_spec_t empty[] = {{"", 4, 0}};
    ps_tensor_spec_t huge[] = {{"a", SIZE_MAX / 8, 0}, {"b", SIZE_MAX / 8, 0}, {"c", SIZE_MAX / 8, 0}};
    is_int(ps_partition_table_build(&t, ts, 0, 4096, 1), PS_EINVAL, "no tensors");
    is_int(ps_partition_table_build(&t, NULL, 3, 4096, 1), PS_EINVAL, "NULL tensors");
    is_int(ps_partition_table_build(&t, zero, 2, 4096, 1), PS_EINVAL, "zero-size tensor");
    is_int(ps_partition_table_build(&t, ts, 6, 4096, 0), PS_EINVAL, "no servers");
    is_int(ps_partition_table_build(&t, ts, 6, 3, 1), PS_EINVAL, "partition_bytes < 4");
    is_int(ps_partition_table_build(&t, dup, 3, 4096, 1), PS_EINVAL, "duplicate name");
    is_int(ps_partition_table_build(&t, noname, 2, 4096, 1), PS_EINVAL, "NULL name");
    is_int(ps_partition_table_build(&t, empty, 1, 4096, 1), PS_EINVAL, "empty name");
    is_int(ps_partition_table_build(&t, huge, 3, 4096, 1), PS_EINVAL, "total size overflows");
    ok(t.parts == NULL && t.nparts == 0, "a failed build leaves an empty table");
    ps_partition_table_free(&t);
}

/* build_ex: tensors of exact groups (BN statistics) never share a
 * partition with the others, their partitions carry PS_PART_EXACT, and
 * exact_groups 0 is the plain build, hash included. */
static void test_exact_groups(void)
{
    /* the hand-worked model above, cap = 10 elements */
    ps_tensor_spec_t ts[] = {{"a", 4, 0}, {"b", 5, 0}, {"c", 2, 1}, {"d", 23, 0}, {"e", 3, 2}, {"f", 10, 0}};
    static const struct {
        uint32_t mask;
        uint32_t n;
        size_t off[7], numel[7];
        uint32_t exact[7];
        const char *what;
    } cases[] = {
        /* c and e exact: [a b] [c]E [d0] [d1] [d2] [e]E [f] (d2 and e no longer share) */
        {(1u << 1) | (1u << 2), 7, {0, 9, 11, 21, 31, 34, 37}, {9, 2, 10, 10, 3, 3, 10},
         {0, 1, 0, 0, 0, 1, 0}, "groups 1, 2 exact: [a b] [c]E [d0] [d1] [d2] [e]E [f]"},
        /* group 0 exact: the pieces of a split tensor keep the flag */
        {1u << 0, 7, {0, 9, 11, 21, 31, 34, 37}, {9, 2, 10, 10, 3, 3, 10},
         {1, 0, 1, 1, 1, 0, 1}, "group 0 exact: [a b]E [c] [d0]E [d1]E [d2]E [e] [f]E"},
        /* nothing in an exact group: the plain packing */
        {1u << 7, 6, {0, 9, 11, 21, 31, 37}, {9, 2, 10, 10, 6, 10}, {0}, "group 7 exact (unused): plain cuts"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        ps_partition_table_t t;
        if (!ok(ps_partition_table_build_ex(&t, ts, 6, 40, 2, cases[k].mask) == 0, "build_ex %s",
                cases[k].what))
            continue;
        int good = t.nparts == cases[k].n && t.exact_groups == cases[k].mask;
        for (uint32_t p = 0; good && p < t.nparts; p++)
            good = t.parts[p].offset == cases[k].off[p] && t.parts[p].numel == cases[k].numel[p] &&
                   !!(t.parts[p].flags & PS_PART_EXACT) == (int)cases[k].exact[p];
        ok(good, "%s", cases[k].what);
        /* no partition mixes exact and other tensors */
        ps_partition_segment_t seg[8];
        for (uint32_t p = 0; good && p < t.nparts; p++) {
            uint32_t ns = ps_partition_segments(&t, p, seg, 8);
            for (uint32_t i = 0; i < ns; i++)
                good &= !!(cases[k].mask >> ts[seg[i].tensor].group & 1u) ==
                        !!(t.parts[p].flags & PS_PART_EXACT);
        }
        ok(good, "every segment's group agrees with its partition's flag");
        ps_partition_table_free(&t);
    }
    ps_partition_table_t a, b, c;
    ps_partition_table_build(&a, ts, 6, 40, 2);
    ps_partition_table_build_ex(&b, ts, 6, 40, 2, 0);
    ps_partition_table_build_ex(&c, ts, 6, 40, 2, 1u << 7);
    ok(a.hash == b.hash && a.exact_groups == 0, "exact_groups 0: the plain table's hash");
    ok(c.hash != a.hash, "an exact_groups mask is in the hash (same cuts, different wire)");
    int noflag = 1;
    for (uint32_t p = 0; p < a.nparts; p++) noflag &= a.parts[p].flags == 0;
    ok(noflag, "plain build: no partition flagged");
    ps_partition_table_free(&a);
    ps_partition_table_free(&b);
    ps_partition_table_free(&c);
}

int main(void)
{
    ps_log_level = -1; /* invalid-input checks log on purpose */
    test_small_cases();
    test_exact_groups();
    test_golden();
    test_invariants();
    test_determinism_and_hash();
    return tap_done();
}
