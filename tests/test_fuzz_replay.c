/* Replays the fuzz seed corpus (tests/fuzz/corpus/<target>/) through the
 * libFuzzer harnesses in a normal build, plus a fixed number of
 * deterministic mutations of every seed (bit flips, byte overwrites,
 * truncation, extension), so the harnesses' invariants are checked in every
 * `make check` without clang or libFuzzer.  A broken invariant aborts (as it
 * would under the fuzzer), which fails this test.
 *
 * The harnesses are #included, each with its own entry-point name; their
 * static names carry per-harness prefixes so they can share one program. */
#define PS_FUZZ_ENTRY ps_fuzz_codec
#include "tests/fuzz/fuzz_codec.c"
#undef PS_FUZZ_ENTRY
#define PS_FUZZ_ENTRY ps_fuzz_wire
#include "tests/fuzz/fuzz_wire.c"
#undef PS_FUZZ_ENTRY
#define PS_FUZZ_ENTRY ps_fuzz_safetensors
#include "tests/fuzz/fuzz_safetensors.c"
#undef PS_FUZZ_ENTRY
#define PS_FUZZ_ENTRY ps_fuzz_config
#include "tests/fuzz/fuzz_config.c"
#undef PS_FUZZ_ENTRY
/* The dataset list reader lives in libps_data (built only with libjpeg):
 * Makefile.am defines PS_FUZZ_VIDEO_LIST and links it then. */
#ifdef PS_FUZZ_VIDEO_LIST
#define PS_FUZZ_ENTRY ps_fuzz_video_list
#include "tests/fuzz/fuzz_video_list.c"
#undef PS_FUZZ_ENTRY
/* the COCO readers live in libps_det, above libps_data */
#define PS_FUZZ_ENTRY ps_fuzz_coco
#include "tests/fuzz/fuzz_coco.c"
#undef PS_FUZZ_ENTRY
#endif

#include "tests/lib/tap.h"

#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define MUTATIONS 150 /* per seed file; ~30 seeds -> a few thousand runs, well under a second */

typedef struct {
    const char *name;
    int (*entry)(const uint8_t *, size_t);
} target_t;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 20);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got);
    fclose(f);
    *len = n;
    return buf;
}

/* Runs every seed of one target and its mutations; returns the seed count. */
static int replay(const target_t *t, const char *root, long *runs)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", root, t->name);
    DIR *d = opendir(dir);
    if (!d) {
        diag("cannot open %s", dir);
        return 0;
    }
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str); /* same order every run */
    for (int i = 0; i < n; i++) {
        char path[8192];
        size_t len = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        uint8_t *seed = slurp(path, &len);
        if (!seed) {
            fprintf(fuzz_report_file, "cannot read %s\n", path);
            n = -1000;
            break;
        }
        t->entry(seed, len);
        (*runs)++;
        uint8_t *m = malloc(len + 64);
        for (int k = 0; k < MUTATIONS; k++) {
            size_t ml = len;
            memcpy(m, seed, len);
            for (int e2 = 1 + rnd() % 3; e2 > 0; e2--) {
                switch (rnd() % 5) {
                case 0: if (ml) m[rnd() % ml] ^= (uint8_t)(1u << rnd() % 8); break;
                case 1: if (ml) m[rnd() % ml] = (uint8_t)rnd(); break;
                case 2: if (ml) ml = rnd() % ml; break;
                case 3: if (ml < len + 56) m[ml] = (uint8_t)rnd(), ml++; break;
                default: if (ml > 8) m[6 + rnd() % 3] = (uint8_t)(rnd() % 4); break; /* small header fields */
                }
            }
            t->entry(m, ml);
            (*runs)++;
        }
        free(m);
        free(seed);
        free(names[i]);
    }
    return n;
}

int main(void)
{
    const char *root = getenv("top_srcdir");
    if (!root || !*root) root = ".";
    static const target_t targets[] = {{"codec", ps_fuzz_codec},
                                       {"wire", ps_fuzz_wire},
                                       {"safetensors", ps_fuzz_safetensors},
                                       {"config", ps_fuzz_config},
#ifdef PS_FUZZ_VIDEO_LIST
                                       {"video_list", ps_fuzz_video_list},
                                       {"coco", ps_fuzz_coco},
#endif
    };
    fuzz_report_file = fdopen(dup(2), "w"); /* invariant failures stay visible */
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        long runs = 0;
        /* the config harness prints --help to stdout and errors to stderr:
         * keep the TAP stream clean by parking fd 1 and 2 while it runs */
        fflush(stdout);
        int out = dup(1), err = dup(2), null = open("/dev/null", O_WRONLY);
        dup2(null, 1), dup2(null, 2);
        int seeds = replay(&targets[i], root, &runs);
        fflush(stdout);
        dup2(out, 1), dup2(err, 2);
        close(out), close(err), close(null);
        ok(seeds >= 5, "%s: %d seeds and %ld runs in all replayed without a broken invariant", targets[i].name,
           seeds, runs);
    }
    wire_fz_teardown();
    return tap_done();
}
