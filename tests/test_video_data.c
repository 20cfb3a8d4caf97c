/* Video data pipeline: JPEG and resize against PIL goldens, TSN indices
 * against TSM's formulas, DistributedSampler order, the reproducibility
 * property (thread count, ranks), packed vs folder reader, bad inputs, and
 * the generated dataset. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* test paths are short; snprintf truncation cannot happen here */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include "ps_error.h"
#include "ps_log.h"
#include "tests/lib/tap.h"
#include "worker/data/ps_image.h"
#include "worker/data/ps_video.h"
#include "worker/data/video_gen.h"

static char tmpdir[256];
static const char *srcdir;

static void writef(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(1); }
    fputs(text, f);
    fclose(f);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    uint8_t *b;
    char err[512];
    if (ps_read_file(path, &b, n, err, sizeof err) < 0) { printf("# %s\n", err); return NULL; }
    return b;
}

/* ---- JPEG / resize ---------------------------------------------------------- */
static void test_jpeg_roundtrip(void)
{
    int w = 45, h = 33;
    uint8_t *img = malloc((size_t)w * h * 3), *jpg, *dec;
    size_t n;
    char err[512];
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = img + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(x * 5);
            p[1] = (uint8_t)(y * 7);
            p[2] = (uint8_t)(128 + 60 * ((x / 4 + y / 4) & 1) - 30);
        }
    is_int(ps_jpeg_encode(img, w, h, 100, &jpg, &n, err, sizeof err), 0, "encode q100");
    int dw = 0, dh = 0;
    is_int(ps_jpeg_decode(jpg, n, &dec, &dw, &dh, err, sizeof err), 0, "decode q100");
    ok(dw == w && dh == h, "decoded size %dx%d", dw, dh);
    int maxd = 0;
    double sum = 0;
    for (size_t i = 0; dec && i < (size_t)w * h * 3; i++) {
        int d = abs((int)dec[i] - img[i]);
        if (d > maxd) maxd = d;
        sum += d;
    }
    ok(maxd <= 3 && sum / (w * h * 3) < 0.6, "q100 decode matches the source: max |d| %d, mean %.3f", maxd,
       sum / (w * h * 3));
    /* damaged streams: errors, never a crash */
    uint8_t *junk = malloc(n);
    uint8_t *o2;
    int rc = ps_jpeg_decode(jpg, n / 2, &o2, &dw, &dh, err, sizeof err);
    ok(rc == PS_ECORRUPT, "truncated JPEG rejected: %s", err);
    for (size_t i = 0; i < n; i++) junk[i] = (uint8_t)(i * 131 + 7);
    ok(ps_jpeg_decode(junk, n, &o2, &dw, &dh, err, sizeof err) < 0, "random bytes rejected: %s", err);
    memcpy(junk, jpg, n);
    for (size_t i = n / 3; i < n / 3 + 40 && i < n; i++) junk[i] ^= 0x5A;
    rc = ps_jpeg_decode(junk, n, &o2, &dw, &dh, err, sizeof err);
    if (rc == 0) free(o2);
    ok(1, "bit-flipped JPEG handled (rc %d)", rc);
    ok(ps_jpeg_decode(jpg, 3, &o2, &dw, &dh, err, sizeof err) < 0, "3-byte JPEG rejected");
    free(junk);
    free(jpg);
    free(dec);
    free(img);
}

static void test_pil_goldens(void)
{
    char path[1024], line[256];
    size_t n;
    snprintf(path, sizeof path, "%s/tests/golden/video_resize.bin", srcdir);
    uint8_t *bin = slurp(path, &n);
    snprintf(path, sizeof path, "%s/tests/golden/video_resize.txt", srcdir);
    FILE *f = fopen(path, "r");
    ok(bin && f, "resize goldens present");
    if (!bin || !f) return;
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        int x, y, w, h, ow, oh;
        long off;
        if (sscanf(line, "%d %d %d %d %d %d %ld", &x, &y, &w, &h, &ow, &oh, &off) != 7) continue;
        uint8_t *out = malloc((size_t)ow * oh * 3);
        ps_image_resize(bin + ((size_t)y * 37 + x) * 3, 37 * 3, w, h, out, ow, oh);
        int maxd = 0;
        for (size_t i = 0; i < (size_t)ow * oh * 3; i++) {
            int d = abs((int)out[i] - bin[off + i]);
            if (d > maxd) maxd = d;
        }
        ok(maxd == 0, "resize box (%d,%d %dx%d) -> %dx%d equals PIL BILINEAR (max |d| %d)", x, y, w, h, ow,
           oh, maxd);
        free(out);
        cases++;
    }
    fclose(f);
    free(bin);
    is_int(cases, 7, "resize cases read");

    snprintf(path, sizeof path, "%s/tests/golden/video_jpeg.bin", srcdir);
    uint8_t *ref = slurp(path, &n);
    const char *names[2] = { "video_q75.jpg", "video_gray.jpg" };
    for (int k = 0; k < 2 && ref; k++) {
        snprintf(path, sizeof path, "%s/tests/golden/%s", srcdir, names[k]);
        size_t jn;
        uint8_t *j = slurp(path, &jn), *px = NULL;
        int w = 0, h = 0;
        char err[256];
        int rc = j ? ps_jpeg_decode(j, jn, &px, &w, &h, err, sizeof err) : -1;
        ok(rc == 0 && w == 40 && h == 32, "%s decodes 40x32", names[k]);
        int maxd = 0;
        for (size_t i = 0; rc == 0 && i < 40 * 32 * 3; i++) {
            int d = abs((int)px[i] - ref[k * 40 * 32 * 3 + i]);
            if (d > maxd) maxd = d;
        }
        /* Same libjpeg-turbo here and under PIL gives 0; another version's
         * upsampling may differ by a unit. */
        ok(rc == 0 && maxd <= 1, "%s equals PIL's decode (max |d| %d)", names[k], maxd);
        free(j);
        free(px);
    }
    free(ref);

    /* A whole clip through the test transform vs TSM's PIL pipeline. */
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    char root[1024], err[1024];
    snprintf(root, sizeof root, "%s/tests/golden/video", srcdir);
    snprintf(path, sizeof path, "%s/list.txt", root);
    lo.root = root;
    ps_video_list_t *l;
    int rc = ps_video_list_load(path, &lo, &l, err, sizeof err);
    is_int(rc, 0, "golden clip list loads %s", rc ? err : "");
    if (rc) return;
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.train = 0;
    o.n_segment = 4;
    o.crop_h = o.crop_w = 24;
    o.scale_size = 28;
    float *got = malloc(sizeof(float) * 4 * 3 * 24 * 24);
    rc = ps_video_load_sample(l, &o, 0, 0, got, err, sizeof err);
    snprintf(path, sizeof path, "%s/tests/golden/video_val.bin", srcdir);
    float *want = (float *)slurp(path, &n);
    ok(rc == 0 && want && n == sizeof(float) * 4 * 3 * 24 * 24, "test-mode sample computed");
    if (rc == 0 && want)
        allclose(got, want, 4 * 3 * 24 * 24, 1e-6, 1e-6, "test transform == TSM's (GroupScale, CenterCrop, normalise)");
    free(got);
    free(want);
    ps_video_list_free(&l);
}

/* ---- sampling ---------------------------------------------------------------- */
static void test_tsn_indices(void)
{
    int idx[16];
    /* _get_val_indices, values from TSM's numpy formula */
    static const struct { int nf, T; int want[8]; } val[] = {
        { 16, 8, { 2, 4, 6, 8, 10, 12, 14, 16 } }, { 10, 8, { 1, 2, 4, 5, 6, 7, 9, 10 } },
        { 8, 8, { 1, 1, 1, 1, 1, 1, 1, 1 } },      { 5, 8, { 1, 1, 1, 1, 1, 1, 1, 1 } },
        { 100, 8, { 7, 19, 32, 44, 57, 69, 82, 94 } }, { 9, 4, { 2, 4, 6, 8 } },
    };
    for (size_t c = 0; c < sizeof val / sizeof val[0]; c++) {
        ps_video_tsn_test_indices(val[c].nf, val[c].T, 0, 1, idx);
        ok(!memcmp(idx, val[c].want, sizeof(int) * (size_t)val[c].T), "val indices nf=%d T=%d", val[c].nf,
           val[c].T);
    }
    /* _sample_indices: offset i*avg + randint(avg) + 1; every value of each
     * span appears over many draws, none outside. */
    int nf = 21, T = 4, avg = 5, seen[4][5] = { { 0 } }, outside = 0;
    for (int s = 0; s < 400; s++) {
        ps_vrng_t r = ps_vrng_sample(7, 0, (uint64_t)s), r2 = r;
        ps_video_tsn_train_indices(nf, T, &r, idx);
        for (int i = 0; i < T; i++) {
            int off = idx[i] - 1 - i * avg;
            if (off < 0 || off >= avg) { outside++; continue; }
            seen[i][off]++;
            /* and it is exactly the documented draw */
            if (off != (int)ps_vrng_below(&r2, (uint64_t)avg)) outside++;
        }
    }
    int all = 1;
    for (int i = 0; i < T; i++)
        for (int k = 0; k < avg; k++) all &= seen[i][k] > 40;
    ok(outside == 0 && all, "train offsets: random within each span, uniform (outside/mismatch %d)", outside);
    ps_vrng_t r = ps_vrng_sample(1, 2, 3);
    ps_video_tsn_train_indices(5, 8, &r, idx);
    int ones = 1;
    for (int i = 0; i < 8; i++) ones &= idx[i] == 1;
    ok(ones, "train: num_frames < n_segment gives frame 1 everywhere (TSM)");
    ps_video_tsn_train_indices(8, 8, &r, idx);
    int seq = 1;
    for (int i = 0; i < 8; i++) seq &= idx[i] == i + 1;
    ok(seq, "train: num_frames == n_segment gives 1..8");
    /* multi-clip test: clip c of K sits at tick*(c+.5)/K inside each span */
    ps_video_tsn_test_indices(40, 4, 1, 2, idx);
    ok(idx[0] == 8 && idx[1] == 18 && idx[2] == 28 && idx[3] == 38, "2-clip test, clip 1: %d %d %d %d",
       idx[0], idx[1], idx[2], idx[3]);
}

/* The documented permutation, written out again from the header's text. */
static uint64_t mix_ref(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void test_sampler(void)
{
    size_t N = 23;
    uint64_t seed = 99, epoch = 3;
    int64_t perm[23], got[23];
    uint64_t s = mix_ref(mix_ref(seed ^ 0x7065726Dull) ^ epoch);
    for (size_t i = 0; i < N; i++) perm[i] = (int64_t)i;
    for (size_t i = N - 1; i > 0; i--) {
        uint64_t x = mix_ref(s);
        s += 0x9E3779B97F4A7C15ull;
        size_t j = (size_t)(((unsigned __int128)x * (i + 1)) >> 64);
        int64_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    size_t k = ps_video_sampler_indices(N, seed, epoch, 0, 1, 1, 1, got);
    ok(k == N && !memcmp(got, perm, sizeof perm), "epoch permutation follows the documented PRNG");
    int W = 3, good = 1;
    size_t per = N / 3;
    int count[23] = { 0 };
    for (int r = 0; r < W; r++) {
        k = ps_video_sampler_indices(N, seed, epoch, r, W, 1, 1, got);
        good &= k == per;
        for (size_t i = 0; i < k; i++) {
            good &= got[i] == perm[r + i * (size_t)W];
            count[got[i]]++;
        }
    }
    int dup = 0;
    for (size_t i = 0; i < N; i++) dup |= count[i] > 1;
    ok(good && !dup, "drop_last: rank r of 3 takes perm[r::3][:%zu], disjoint", per);
    k = ps_video_sampler_indices(N, seed, epoch, 2, W, 1, 0, got);
    ok(k == 8 && got[7] == perm[(2 + 7 * 3) % N], "padding (drop_last off) wraps to the start");
    k = ps_video_sampler_indices(N, seed, epoch, 1, 2, 0, 1, got);
    ok(k == 11 && got[0] == 1 && got[10] == 21, "no shuffle: rank 1 of 2 takes 1, 3, ..., 21");
    int64_t e4[23];
    ps_video_sampler_indices(N, seed, 4, 0, 1, 1, 1, e4);
    ok(memcmp(e4, perm, sizeof perm) != 0, "a new epoch reshuffles");
}

/* ---- dataset-level checks --------------------------------------------------- */
static int gen_dataset(const char *dir, int videos, int frames, int size)
{
    ps_video_gen_opts_t g;
    ps_video_gen_opts_default(&g);
    g.out = dir;
    g.videos = videos;
    g.frames = frames;
    g.size = size;
    g.seed = 5;
    g.val_fraction = 0.25;
    char err[1024];
    int rc = ps_video_gen(&g, err, sizeof err);
    if (rc < 0) printf("# gen: %s\n", err);
    return rc;
}

static void test_generated(const char *dir)
{
    char path[512], err[1024];
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    lo.root = dir;
    lo.verify_jpeg = 1;
    ps_video_list_t *tr = NULL, *va = NULL;
    snprintf(path, sizeof path, "%s/train.txt", dir);
    int rc = ps_video_list_load(path, &lo, &tr, err, sizeof err);
    snprintf(path, sizeof path, "%s/val.txt", dir);
    int rc2 = ps_video_list_load(path, &lo, &va, err, sizeof err);
    ok(rc == 0 && rc2 == 0, "generated lists parse with every JPEG verified");
    if (rc || rc2) { ps_video_list_free(&tr); ps_video_list_free(&va); return; }
    ok(ps_video_list_size(tr) == 18 && ps_video_list_size(va) == 6, "split 18 train / 6 val");
    int frames_ok = 1, labels_ok = 1;
    for (size_t i = 0; i < ps_video_list_size(tr); i++) {
        frames_ok &= ps_video_list_frames(tr, i) == 10;
        labels_ok &= ps_video_list_label(tr, i) == (int)(i % 4);
        snprintf(path, sizeof path, "%s/%s/img_00011.jpg", dir, ps_video_list_name(tr, i));
        frames_ok &= access(path, F_OK) != 0; /* exactly 10 frames on disk */
    }
    ok(frames_ok && labels_ok, "10 frames per video on disk, labels 0..3 balanced");
    uint8_t *px;
    int w, h;
    rc = ps_video_read_frame(va, 0, 10, &px, &w, &h, err, sizeof err);
    ok(rc == 0 && w == 32 && h == 32, "frames decode at 32x32");
    free(px);
    is_int(ps_video_list_num_classes(tr), 4, "4 classes");

    /* The label is the direction: frame t+1 is frame t with the moving
     * layer shifted by speed*dir.  Count changed pixels explained by each
     * candidate shift; the true direction must explain the most. */
    ps_video_gen_opts_t g;
    ps_video_gen_opts_default(&g);
    g.size = 48;
    g.speed = 2;
    g.seed = 11;
    static const int D[4][2] = { { 0, -1 }, { 0, 1 }, { -1, 0 }, { 1, 0 } };
    int right = 0;
    uint8_t *f0 = malloc(48 * 48 * 3), *f1 = malloc(48 * 48 * 3);
    for (int v = 0; v < 8; v++) {
        int lab;
        ps_video_gen_frame(&g, v, 3, f0, &lab);
        ps_video_gen_frame(&g, v, 4, f1, &lab);
        int best = -1, bestc = -1;
        for (int d = 0; d < 4; d++) {
            int c = 0;
            for (int y = 2; y < 46; y++)
                for (int x = 2; x < 46; x++) {
                    const uint8_t *a = f1 + (y * 48 + x) * 3, *b = f0 + (y * 48 + x) * 3;
                    const uint8_t *s = f0 + ((y - 2 * D[d][1]) * 48 + (x - 2 * D[d][0])) * 3;
                    if (memcmp(a, b, 3) && !memcmp(a, s, 3)) c++;
                }
            if (c > bestc) { bestc = c; best = d; }
        }
        right += best == lab;
    }
    is_int(right, 8, "motion between frames matches the label in every video");
    free(f0);
    free(f1);
    ps_video_list_free(&tr);
    ps_video_list_free(&va);
}

static int load_all(const ps_video_list_t *l, const ps_video_opts_t *o, int epochs, float **out,
                    int64_t **idx_out, size_t *n_samples)
{
    ps_video_loader_t *ld;
    char err[1024];
    if (ps_video_loader_new(l, o, &ld, err, sizeof err) < 0) { printf("# %s\n", err); return -1; }
    size_t sf = (size_t)ps_video_clips_per_sample(o) * o->n_segment * 3 * o->crop_h * o->crop_w;
    size_t cap = ps_video_loader_samples(ld) * (size_t)epochs + 8, n = 0;
    float *all = malloc(sizeof(float) * sf * cap), *b = malloc(sizeof(float) * sf * (size_t)o->batch);
    int64_t *ix = malloc(sizeof(int64_t) * cap);
    int32_t lab[256];
    int rc = 0;
    for (int e = 0; e < epochs && rc >= 0; e++) {
        if (e) ps_video_loader_set_epoch(ld, (uint64_t)e);
        while ((rc = ps_video_loader_next(ld, b, lab, ix + n, NULL)) > 0) {
            memcpy(all + n * sf, b, sizeof(float) * sf * (size_t)rc);
            n += (size_t)rc;
        }
    }
    if (rc < 0) printf("# loader: %s\n", ps_video_loader_error(ld));
    ps_video_loader_destroy(&ld);
    free(b);
    *out = all;
    *idx_out = ix;
    *n_samples = n;
    return rc;
}

static void test_loader(const char *dir)
{
    char path[512], err[1024], pdir[512];
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    lo.root = dir;
    ps_video_list_t *l, *pl;
    snprintf(path, sizeof path, "%s/train.txt", dir);
    if (ps_video_list_load(path, &lo, &l, err, sizeof err) < 0) { ok(0, "%s", err); return; }
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.n_segment = 4;
    o.crop_h = o.crop_w = 24;
    o.batch = 4;
    o.seed = 1234;
    o.flip = 1;
    float *a[3];
    int64_t *ia[3];
    size_t na[3];
    int threads[3] = { 0, 1, 2 };
    for (int k = 0; k < 3; k++) {
        o.threads = threads[k];
        o.prefetch = k + 1;
        load_all(l, &o, 2, &a[k], &ia[k], &na[k]);
    }
    size_t sf = 4 * 3 * 24 * 24;
    ok(na[0] == 32 && na[1] == 32 && na[2] == 32, "2 epochs of 18 videos at batch 4: 16 samples each (drop_last)");
    ok(!memcmp(a[0], a[1], sizeof(float) * sf * na[0]) && !memcmp(a[0], a[2], sizeof(float) * sf * na[0]) &&
       !memcmp(ia[0], ia[2], sizeof(int64_t) * na[0]), "same batches with 0, 1 and 2 loader threads");
    ok(memcmp(a[0], a[0] + sf * 16, sizeof(float) * sf) != 0 || ia[0][0] != ia[0][16],
       "epoch 1 differs from epoch 0");
    /* every sample is the pure function of (seed, epoch, index) */
    float *one = malloc(sizeof(float) * sf);
    ps_video_load_sample(l, &o, 1, (size_t)ia[0][20], one, err, sizeof err);
    ok(!memcmp(one, a[0] + sf * 20, sizeof(float) * sf), "sample 20 == load_sample(epoch 1, its index)");
    /* resuming mid-run: seek to epoch 1, batch 2 gives global samples 24..27 */
    {
        ps_video_loader_t *ld;
        ps_video_opts_t os = o;
        os.threads = 2;
        float *bb = malloc(sizeof(float) * sf * 4);
        int32_t lab[4];
        int64_t ix[4];
        int rc = ps_video_loader_new(l, &os, &ld, err, sizeof err);
        if (rc == 0) {
            ps_video_loader_seek(ld, 1, 2);
            rc = ps_video_loader_next(ld, bb, lab, ix, NULL);
            ok(rc == 4 && ix[0] == ia[0][24] && ix[3] == ia[0][27] &&
               !memcmp(bb, a[0] + sf * 24, sizeof(float) * sf * 4) && ps_video_loader_position(ld) == 3,
               "seek(epoch 1, batch 2) resumes exactly at samples 24..27");
            ps_video_loader_destroy(&ld);
        } else {
            ok(0, "loader for seek: %s", err);
        }
        free(bb);
    }

    /* rank r of W: DistributedSampler's indices, identical pixels */
    int W = 2, good = 1;
    int64_t want[32];
    for (int r = 0; r < W; r++) {
        ps_video_opts_t orank = o;
        orank.rank = r;
        orank.world = W;
        orank.batch = 2;
        orank.threads = 2;
        float *ar;
        int64_t *ir;
        size_t nr;
        load_all(l, &orank, 1, &ar, &ir, &nr);
        size_t k = ps_video_sampler_indices(18, o.seed, 0, r, W, 1, 1, want);
        good &= k == 9 && nr == 8 && !memcmp(ir, want, sizeof(int64_t) * nr);
        for (size_t i = 0; i < nr; i++) {
            /* one process, batch W*B: global position p = r + W*i holds the same sample */
            size_t p = (size_t)r + (size_t)W * i;
            if (p < 16) good &= ia[0][p] == ir[i] && !memcmp(ar + sf * i, a[0] + sf * p, sizeof(float) * sf);
        }
        free(ar);
        free(ir);
    }
    ok(good, "rank r of 2 gets DistributedSampler's indices and one process's pixels at r, r+2, ...");

    /* packed shards give identical tensors */
    snprintf(pdir, sizeof pdir, "%s/packed", tmpdir);
    int rc = ps_video_pack(l, pdir, 5, err, sizeof err);
    is_int(rc, 0, "pack into shards of 5 videos %s", rc ? err : "");
    rc = ps_video_list_load_packed(pdir, NULL, &pl, err, sizeof err);
    is_int(rc, 0, "packed list loads %s", rc ? err : "");
    if (rc == 0) {
        ok(ps_video_list_size(pl) == 18 && ps_video_list_is_packed(pl), "18 videos in 4 shards");
        float *pa;
        int64_t *pi;
        size_t pn;
        o.threads = 2;
        load_all(pl, &o, 2, &pa, &pi, &pn);
        ok(pn == na[0] && !memcmp(pa, a[0], sizeof(float) * sf * pn) && !memcmp(pi, ia[0], sizeof(int64_t) * pn),
           "packed reader == folder reader, 2 epochs of training batches");
        o.train = 0;
        o.n_clips = 2;
        float *fa, *qa;
        int64_t *fi, *qi;
        size_t fn, qn;
        load_all(l, &o, 1, &fa, &fi, &fn);
        load_all(pl, &o, 1, &qa, &qi, &qn);
        ok(fn == 18 && qn == 18 && !memcmp(fa, qa, sizeof(float) * sf * 2 * 18),
           "packed == folder in 2-clip test mode (all 18, last batch short)");
        free(fa); free(qa); free(fi); free(qi); free(pa); free(pi);
        /* corrupt a shard byte: the checksum names the shard */
        snprintf(path, sizeof path, "%s/shard-00001.bin", pdir);
        FILE *f = fopen(path, "r+b");
        fseek(f, 100, SEEK_SET);
        int byte = fgetc(f);
        fseek(f, 100, SEEK_SET);
        fputc(byte ^ 0xFF, f);
        fclose(f);
        uint8_t *b;
        size_t bn;
        int bad = 0;
        for (size_t i = 5; i < 10; i++)
            for (int fr = 1; fr <= 10; fr++) {
                if (ps_video_read_frame_bytes(pl, i, fr, &b, &bn, err, sizeof err) < 0) bad++;
                else free(b);
            }
        ok(bad == 1 && strstr(err, "shard-00001.bin") && strstr(err, "checksum"),
           "a damaged shard frame is caught: %s", err);
        ps_video_list_free(&pl);
        /* truncated index */
        snprintf(path, sizeof path, "%s/shard-00002.idx", pdir);
        truncate(path, 30);
        rc = ps_video_list_load_packed(pdir, NULL, &pl, err, sizeof err);
        ok(rc == PS_ECORRUPT && strstr(err, "shard-00002.idx"), "truncated index rejected: %s", err);
        ps_video_list_free(&pl);
    }
    for (int k = 0; k < 3; k++) { free(a[k]); free(ia[k]); }
    free(one);
    ps_video_list_free(&l);
}

/* ---- bad inputs --------------------------------------------------------------- */
static int load_text(const char *text, int skip, const char *root, ps_video_list_t **l, char *err, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bad.txt", tmpdir);
    writef(path, text);
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    lo.root = root;
    lo.skip_bad = skip;
    lo.min_frames = 3;
    *l = NULL;
    return ps_video_list_load(path, &lo, l, err, n);
}

static void test_bad_lists(const char *dir)
{
    char err[2048];
    ps_video_list_t *l;
    static const struct { const char *text, *want; } cases[] = {
        { "vid_000000 10 0\nvid_000001 10\n", "bad.txt:2: expected" },
        { "vid_000000 10 0\n\n# comment\nvid_000001 ten 1\n", "bad.txt:4: num_frames 'ten'" },
        { "vid_000000 10 -1\n", "bad.txt:1: label '-1'" },
        { "vid_000000 10 0\nno_such_dir 10 1\n", "bad.txt:2: frame directory" },
        { "vid_000000 12 0\n", "bad.txt:1: video 'vid_000000' has 12 frames in the list but" },
        { "vid_000000 2 0\n", "bad.txt:1: video 'vid_000000' is too short" },
        { "vid_000000 10 0 extra\n", "bad.txt:1: label 'extra'" },
        { "\n\n", "no usable videos" },
        { "vid_000000 99999999999 0\n", "bad.txt:1: num_frames" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int rc = load_text(cases[c].text, 0, dir, &l, err, sizeof err);
        ok(rc < 0 && strstr(err, cases[c].want), "bad list %zu: %s", c, err);
        ps_video_list_free(&l);
    }
    int rc = load_text("vid_000000 10 0\nvid_000001 10\nno_such 10 1\nvid_000002 12 2\nvid_000003 10 3\n"
                       "vid_000004 2 0\n", 1, dir, &l, err, sizeof err);
    ok(rc == 0 && l && ps_video_list_size(l) == 2 && ps_video_list_skipped(l) == 4,
       "skip mode keeps 2 good videos and counts 4 skips");
    ps_video_list_free(&l);
    /* template with a second conversion is refused (never a format string) */
    ps_video_list_opts_t lo;
    ps_video_list_opts_default(&lo);
    lo.tmpl = "img_%05d_%s.jpg";
    rc = ps_video_list_load("/nonexistent", &lo, &l, err, sizeof err);
    ok(rc == PS_EINVAL && strstr(err, "template"), "bad template rejected: %s", err);
    ps_video_list_opts_default(&lo);
    rc = ps_video_list_load("/nonexistent/list.txt", &lo, &l, err, sizeof err);
    ok(rc == PS_ENOTFOUND && strstr(err, "/nonexistent/list.txt"), "missing list file: %s", err);

    /* bad JPEGs: at load with verify, and in the loader with/without skip */
    char path[512], vdir[512];
    snprintf(vdir, sizeof vdir, "%s/badvid", tmpdir);
    mkdir(vdir, 0755);
    for (int f = 1; f <= 6; f++) {
        char src[512];
        snprintf(src, sizeof src, "%s/vid_000001/img_%05d.jpg", dir, f);
        size_t n;
        uint8_t *b = slurp(src, &n);
        snprintf(path, sizeof path, "%s/img_%05d.jpg", vdir, f);
        FILE *o = fopen(path, "wb");
        if (f == 4) fwrite("this is not a jpeg at all", 1, 25, o);
        else if (f == 5) fwrite(b, 1, n / 2, o); /* truncated */
        else fwrite(b, 1, n, o);
        fclose(o);
        free(b);
    }
    char text[512];
    snprintf(text, sizeof text, "vid_000000 10 0\n%s 6 1\nvid_000002 10 2\nvid_000003 10 3\n", vdir);
    snprintf(path, sizeof path, "%s/badjpeg.txt", tmpdir);
    writef(path, text);
    ps_video_list_opts_default(&lo);
    lo.root = dir;
    lo.verify_jpeg = 1;
    rc = ps_video_list_load(path, &lo, &l, err, sizeof err);
    ok(rc == PS_ECORRUPT && strstr(err, "badjpeg.txt:2:") && strstr(err, "img_00004.jpg"),
       "verify: bad JPEG named with file and line: %s", err);
    lo.verify_jpeg = 0;
    rc = ps_video_list_load(path, &lo, &l, err, sizeof err);
    ok(rc == 0, "without verify the list loads");
    if (rc) return;
    ps_video_opts_t o;
    ps_video_opts_default(&o);
    o.n_segment = 3; /* test indices 2, 4, 6 of 6: frame 4 is the bad one */
    o.crop_h = o.crop_w = 16;
    o.batch = 4;
    o.threads = 2;
    o.train = 0;
    float *buf = malloc(sizeof(float) * 4 * 3 * 3 * 16 * 16);
    int32_t lab[4];
    int64_t ix[4];
    ps_video_loader_t *ld;
    ps_video_loader_new(l, &o, &ld, err, sizeof err);
    rc = ps_video_loader_next(ld, buf, lab, ix, NULL);
    ok(rc == PS_ECORRUPT && strstr(ps_video_loader_error(ld), "badjpeg.txt:2:") &&
       strstr(ps_video_loader_error(ld), "img_0000"), "loader: bad frame is an error naming it: %s",
       ps_video_loader_error(ld));
    ps_video_loader_destroy(&ld);
    o.skip_bad = 1;
    ps_video_loader_new(l, &o, &ld, err, sizeof err);
    rc = ps_video_loader_next(ld, buf, lab, ix, NULL);
    ok(rc == 4 && ix[1] == 2 && lab[1] == 2 && ps_video_loader_skipped(ld) == 1,
       "skip mode: the bad video is replaced by the next one and counted (rc %d, skipped %zu)", rc,
       ps_video_loader_skipped(ld));
    ps_video_loader_destroy(&ld);
    free(buf);
    ps_video_list_free(&l);
}

int main(void)
{
    srcdir = getenv("top_srcdir") ? getenv("top_srcdir") : ".";
    ps_log_level = PS_LOG_ERROR;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_video_data.XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ds", tmpdir);
    test_jpeg_roundtrip();
    test_pil_goldens();
    test_tsn_indices();
    test_sampler();
    is_int(gen_dataset(dir, 24, 10, 32), 0, "gen-video wrote a 24-video dataset");
    test_generated(dir);
    test_loader(dir);
    test_bad_lists(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) diag("could not remove %s", tmpdir);
    return tap_done();
}
