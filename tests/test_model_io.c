/* Model weights in safetensors: round trip, a PyTorch-written state dict
 * (tests/golden/torch_r18w8.safetensors from gen_resnet.py: torch's own
 * init, BN statistics from 3 training batches) giving PyTorch's logits,
 * fc replacement when the class count differs (TSM fine-tuning), and
 * refusal of bad files without touching the model.  The other direction
 * (C-written file into torchvision) is tests/check_model_torch.sh. */
#include "tests/lib/model_check.h" /* srcdir() */
#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED 1234

static char tmpdir[256];

static ps_model_t *make(ps_ctx_t *ctx, int depth, int width, int K, int clips, int H)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = depth;
    c.width = width;
    c.num_classes = K;
    c.partial_bn = 1;
    c.dropout = 0.5f;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &c, &ps_backend_cpu, ctx, clips, H, H)) return NULL;
    return m;
}

/* FNV of every weight and buffer: "model unchanged" in one number. */
static uint64_t model_hash(const ps_model_t *m)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int np, nb;
    const ps_model_param_t *P = ps_model_params(m, &np);
    const ps_model_buffer_t *B = ps_model_buffers(m, &nb);
    for (int i = 0; i < np + nb; i++) {
        const uint8_t *p = i < np ? (const uint8_t *)P[i].w
                                  : (B[i - np].f32 ? (const uint8_t *)B[i - np].f32
                                                   : (const uint8_t *)B[i - np].i64);
        size_t n = i < np ? P[i].numel * 4 : (B[i - np].f32 ? B[i - np].numel * 4 : 8);
        for (size_t k = 0; k < n; k++) h = (h ^ p[k]) * 0x100000001b3ull;
    }
    return h;
}

static void check_round_trip(ps_ctx_t *ctx)
{
    ps_model_t *a = make(ctx, 18, 16, 6, 1, 32), *b = make(ctx, 18, 16, 6, 1, 32);
    if (!ok(a && b, "round trip: models created")) return;
    ps_model_init(a, SEED, 1);
    ps_model_init(b, 77, 0);
    float *x = malloc(sizeof(float) * 8 * 3 * 32 * 32);
    ps_model_hash_fill(x, 8 * 3 * 32 * 32, "input", SEED, 1.0);
    int32_t lab = 2;
    float loss;
    ps_model_forward(a, x, 1, &lab, 1, &loss); /* moves bn1's statistics and count */
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    is_int(ps_model_save(a, path), 0, "save %s", path);
    ok(model_hash(a) != model_hash(b), "round trip: models differ before load");
    is_int(ps_model_load(b, path, PS_MODEL_LOAD_STRICT), 0, "load it back");
    ok(model_hash(a) == model_hash(b), "round trip: every weight, statistic and count equal");
    int nb;
    const ps_model_buffer_t *B = ps_model_buffers(b, &nb);
    is_int(*B[2].i64, 1, "bn1.num_batches_tracked survives as int64 (%s)", B[2].name);
    ps_model_forward(a, x, 1, NULL, 0, NULL);
    float la[6];
    memcpy(la, ps_model_logits(a), sizeof la);
    ps_model_forward(b, x, 1, NULL, 0, NULL);
    allclose(ps_model_logits(b), la, 6, 0, 0, "round trip: identical eval logits");

    /* the file itself: names, dtypes and shapes as torchvision has them */
    ps_st_file_t f;
    char err[256];
    if (ok(ps_st_open(&f, path, err, sizeof err) == 0, "reopen with ps_st_open")) {
        const ps_st_tensor_t *t = ps_st_find(&f, "bn1.num_batches_tracked");
        ok(t && t->dtype == PS_ST_I64 && t->ndim == 0, "num_batches_tracked: I64, 0-dim");
        t = ps_st_find(&f, "layer2.0.downsample.0.weight");
        ok(t && t->dtype == PS_ST_F32 && t->ndim == 4 && t->shape[0] == 32 && t->shape[1] == 16 &&
           t->shape[2] == 1, "layer2.0.downsample.0.weight: F32 [32,16,1,1]");
        ok(ps_st_find(&f, "layer4.1.bn2.running_var") && ps_st_find(&f, "fc.bias"),
           "deep names present");
        const char *fmt = ps_st_meta(&f, "format");
        ok(fmt && !strcmp(fmt, "pt"), "metadata format=pt");
        int np;
        ps_model_params(a, &np);
        is_int(f.ntensors, np + nb, "file holds params + buffers");
        ps_st_close(&f);
    }
    unlink(path);
    free(x);
    ps_model_destroy(&a);
    ps_model_destroy(&b);
}

static int read_logits(const char *path, float *out, int max)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192];
    int n = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "logits ", 7)) continue;
        char *e;
        n = (int)strtol(line + 7, &e, 10);
        if (n > max) n = max;
        for (int i = 0; i < n; i++) out[i] = strtof(e, &e);
    }
    fclose(f);
    return n;
}

static void check_torch_file(ps_ctx_t *ctx)
{
    char path[1024], txt[1024];
    snprintf(path, sizeof path, "%s/tests/golden/torch_r18w8.safetensors", srcdir());
    snprintf(txt, sizeof txt, "%s/tests/golden/torch_r18w8.txt", srcdir());
    float ref[16];
    int n = read_logits(txt, ref, 16);
    is_int(n, 7, "PyTorch logits read from %s", txt);

    ps_model_t *m = make(ctx, 18, 8, 7, 1, 32);
    if (!ok(m != NULL, "width-8 ResNet-18 created")) return;
    is_int(ps_model_load(m, path, PS_MODEL_LOAD_STRICT), 0, "PyTorch-written file loads");
    ok(!ps_model_fc_replaced(m), "same class count: fc kept");
    int nb;
    const ps_model_buffer_t *B = ps_model_buffers(m, &nb);
    is_int(*B[2].i64, 3, "num_batches_tracked from PyTorch (3 batches)");
    float *x = malloc(sizeof(float) * 8 * 3 * 32 * 32);
    ps_model_hash_fill(x, 8 * 3 * 32 * 32, "input", SEED, 1.0);
    ps_model_forward(m, x, 1, NULL, 0, NULL);
    /* eval mode, float32 both sides: rounding only */
    allclose(ps_model_logits(m), ref, 7, 1e-5, 1e-4, "logits of the PyTorch weights match PyTorch");

    /* fine-tuning: 5 classes from a 7-class checkpoint */
    ps_model_t *k5 = make(ctx, 18, 8, 5, 1, 32);
    ps_model_init(k5, 5, 0);
    uint64_t h = model_hash(k5);
    is_int(ps_model_load(k5, path, PS_MODEL_LOAD_STRICT), PS_EMISMATCH,
           "class count differs: strict load refused");
    ok(model_hash(k5) == h, "refused load left the model unchanged");
    is_int(ps_model_load(k5, path, PS_MODEL_LOAD_REPLACE_FC), 0, "load with fc replacement");
    ok(ps_model_fc_replaced(k5), "fc reported replaced");
    int np;
    const ps_model_param_t *P = ps_model_params(k5, &np);
    int iw = ps_model_find_param(k5, "fc.weight"), ib = ps_model_find_param(k5, "fc.bias");
    is_int(P[iw].group, PS_MODEL_GROUP_NEWFC_WEIGHT, "new fc.weight in the lr x5 group");
    is_int(P[ib].group, PS_MODEL_GROUP_NEWFC_BIAS, "new fc.bias in the lr x10 group");
    ok(P[iw].shape[0] == 5 && P[iw].shape[1] == 64, "fc.weight is [5, 64]");
    ps_st_file_t f;
    char err[256];
    if (ps_st_open(&f, path, err, sizeof err) == 0) {
        int ic = ps_model_find_param(k5, "layer3.1.conv2.weight");
        float *w = malloc(P[ic].numel * sizeof *w);
        ps_st_read_f32(&f, "layer3.1.conv2.weight", w, P[ic].numel, err, sizeof err);
        ok(!memcmp(w, P[ic].w, P[ic].numel * 4), "backbone weights are the file's");
        free(w);
        ps_st_close(&f);
    }
    ps_model_forward(k5, x, 1, NULL, 0, NULL);
    const float *l = ps_model_logits(k5);
    ok(isfinite(l[0]) && isfinite(l[4]), "replaced model runs");

    /* class count equal but depth differs: refused, and no fc magic */
    ps_model_t *r34 = make(ctx, 34, 8, 7, 1, 32);
    h = model_hash(r34);
    is_int(ps_model_load(r34, path, PS_MODEL_LOAD_REPLACE_FC), PS_ENOTFOUND,
           "ResNet-18 file into ResNet-34: missing tensors");
    ok(model_hash(r34) == h, "ResNet-34 unchanged");
    ps_model_destroy(&r34);
    ps_model_destroy(&k5);
    free(x);
    ps_model_destroy(&m);
}

/* Write the model's tensors except `skip`, with `bad` reshaped, plus
 * `extra` if given. */
static int write_variant(const ps_model_t *m, const char *path, const char *skip,
                         const char *bad, const char *extra)
{
    ps_st_writer_t *w = ps_st_writer_new();
    int np, nb, r = 0;
    const ps_model_param_t *P = ps_model_params(m, &np);
    const ps_model_buffer_t *B = ps_model_buffers(m, &nb);
    for (int i = 0; i < np && !r; i++) {
        if (skip && !strcmp(P[i].name, skip)) continue;
        int64_t s[4];
        for (int d = 0; d < P[i].ndim; d++) s[d] = P[i].shape[d];
        if (bad && !strcmp(P[i].name, bad)) {
            s[0] = 1;
            for (int d = 1; d < P[i].ndim; d++) s[0] *= s[d];
            s[1] = P[i].shape[0];
            for (int d = 2; d < P[i].ndim; d++) s[d] = 1;
        }
        r = ps_st_writer_add(w, P[i].name, PS_ST_F32, P[i].ndim, s, P[i].w);
    }
    for (int i = 0; i < nb && !r; i++) {
        if (skip && !strcmp(B[i].name, skip)) continue;
        int64_t s[1] = {(int64_t)B[i].numel};
        r = B[i].i64 ? ps_st_writer_add(w, B[i].name, PS_ST_I64, 0, s, B[i].i64)
                     : ps_st_writer_add(w, B[i].name, PS_ST_F32, 1, s, B[i].f32);
    }
    if (!r && extra) {
        int64_t s[1] = {1};
        r = ps_st_writer_add(w, extra, PS_ST_F32, 1, s, P[0].w);
    }
    char err[256];
    if (!r) r = ps_st_writer_save(w, path, err, sizeof err);
    ps_st_writer_destroy(&w);
    return r;
}

static void check_bad_files(ps_ctx_t *ctx)
{
    ps_model_t *src = make(ctx, 18, 8, 4, 1, 32), *m = make(ctx, 18, 8, 4, 1, 32);
    if (!ok(src && m, "bad files: models created")) return;
    ps_model_init(src, 1, 1);
    ps_model_init(m, 2, 1);
    uint64_t h = model_hash(m);
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);

    is_int(write_variant(src, path, "layer2.1.bn1.running_var", NULL, NULL), 0, "write (missing)");
    is_int(ps_model_load(m, path, 0), PS_ENOTFOUND, "missing running_var refused");
    is_int(write_variant(src, path, "layer3.0.conv1.weight", NULL, NULL), 0, "write (missing)");
    is_int(ps_model_load(m, path, PS_MODEL_LOAD_REPLACE_FC), PS_ENOTFOUND,
           "missing conv weight refused");
    is_int(write_variant(src, path, NULL, "layer1.0.conv2.weight", NULL), 0, "write (reshaped)");
    is_int(ps_model_load(m, path, PS_MODEL_LOAD_REPLACE_FC), PS_EMISMATCH,
           "same element count, wrong shape refused");
    is_int(write_variant(src, path, NULL, NULL, "module.extra"), 0, "write (extra)");
    is_int(ps_model_load(m, path, 0), PS_EMISMATCH, "unknown tensor refused (strict)");
    is_int(write_variant(src, path, "bn1.num_batches_tracked", NULL, NULL), 0, "write (old)");
    ok(model_hash(m) == h, "failed loads changed nothing");
    is_int(ps_model_load(m, path, 0), 0, "num_batches_tracked may be missing (old state dicts)");

    FILE *f = fopen(path, "wb");
    fputs("this is not a safetensors file at all", f);
    fclose(f);
    is_int(ps_model_load(m, path, 0), PS_ECORRUPT, "garbage refused as corrupt");
    snprintf(path, sizeof path, "%s/does-not-exist.safetensors", tmpdir);
    is_int(ps_model_load(m, path, 0), PS_EIO, "missing file: PS_EIO");
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    unlink(path);
    ps_model_destroy(&src);
    ps_model_destroy(&m);
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = getenv("PS_TEST_VERBOSE") ? PS_LOG_DEBUG : -1; /* refusals are expected */
    ps_engine_init(&ctx, 0);
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ps_model_io.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) tap_skip_all("cannot create a temporary directory");
    check_round_trip(&ctx);
    check_torch_file(&ctx);
    check_bad_files(&ctx);
    rmdir(tmpdir);
    ps_ctx_free(&ctx);
    return tap_done();
}
