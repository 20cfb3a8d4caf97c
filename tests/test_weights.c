/* The weights loader (worker/models/ps_weights.h): name rules, the official
 * TSM checkpoint's names against a PyTorch golden, what the log lists
 * (re-initialised, skipped, missing tensors), partial loads, refusals that
 * leave the model unchanged, a detector's backbone from a classifier, the
 * adapt hook, two file tensors mapping to one model tensor.
 *
 * Golden: tests/golden/tsm_official_r18w8.{safetensors,txt} from
 * tests/golden/gen_tsm_official.py (a PyTorch TSM in the official
 * repository's module layout, place 'block', shift_div 4; its eval logits
 * for the hash input).  The log is read by sending stderr to a file around
 * a call. */
#include "tests/lib/model_check.h" /* srcdir() */
#include "tests/lib/tap.h"
#include "worker/models/ps_model.h"
#include "worker/models/ps_retinanet.h"
#include "worker/models/ps_weights.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED 1234

static char tmpdir[256];
static ps_ctx_t ctx;

/* ---- the log of one call ----------------------------------------------------- */

static int saved_fd = -1;
static char log_path[300];

static void log_begin(void)
{
    fflush(stderr);
    snprintf(log_path, sizeof log_path, "%s/log.txt", tmpdir);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* The text logged since log_begin (static buffer). */
static const char *log_end(void)
{
    static char buf[1 << 16];
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    FILE *f = fopen(log_path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return buf;
}

/* ---- models and files ---------------------------------------------------------- */

static ps_model_t *make(int K, int place, int div, int bn_mode)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = 18;
    c.width = 8;
    c.num_classes = K;
    c.n_segment = 4;
    c.shift_place = place;
    c.shift_div = div;
    c.partial_bn = 0;
    c.bn_mode = bn_mode;
    c.dropout = 0.f;
    ps_model_t *m = NULL;
    return ps_model_create(&m, &c, &ps_backend_cpu, &ctx, 1, 32, 32) ? NULL : m;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 0x100000001b3ull;
    return h;
}

/* Every weight and float buffer of a table in one number. */
static uint64_t tables_hash(const ps_model_param_t *P, int np, const ps_model_buffer_t *B, int nb)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < np; i++) h = fnv(h, P[i].w, P[i].numel * 4);
    for (int i = 0; i < nb; i++)
        if (B[i].f32) h = fnv(h, B[i].f32, B[i].numel * 4);
    return h;
}

static uint64_t model_hash(const ps_model_t *m)
{
    int np, nb;
    const ps_model_param_t *P = ps_model_params(m, &np);
    const ps_model_buffer_t *B = ps_model_buffers(m, &nb);
    return tables_hash(P, np, B, nb);
}

/* m's tensors to path under names rename(name) (NULL: as they are), minus
 * `skip`, with `extra` (4 floats) added; a rename returning NULL drops it. */
static int write_model(const ps_model_t *m, const char *path, const char *(*rename)(const char *),
                       const char *skip, const char *extra)
{
    static const float four[4] = {1, 2, 3, 4};
    ps_st_writer_t *w = ps_st_writer_new();
    int np, nb, r = 0;
    const ps_model_param_t *P = ps_model_params(m, &np);
    const ps_model_buffer_t *B = ps_model_buffers(m, &nb);
    for (int i = 0; i < np + nb && !r; i++) {
        const char *n = i < np ? P[i].name : B[i - np].name;
        if (skip && !strcmp(n, skip)) continue;
        if (rename && !(n = rename(n))) continue;
        if (i < np) {
            int64_t s[4];
            for (int d = 0; d < P[i].ndim; d++) s[d] = P[i].shape[d];
            r = ps_st_writer_add(w, n, PS_ST_F32, P[i].ndim, s, P[i].w);
        } else {
            const ps_model_buffer_t *b = &B[i - np];
            int64_t s[1] = {(int64_t)b->numel};
            r = b->i64 ? ps_st_writer_add(w, n, PS_ST_I64, 0, s, b->i64)
                       : ps_st_writer_add(w, n, PS_ST_F32, 1, s, b->f32);
        }
    }
    int64_t s4[1] = {4};
    if (!r && extra) r = ps_st_writer_add(w, extra, PS_ST_F32, 1, s4, four);
    char err[256];
    if (!r) r = ps_st_writer_save(w, path, err, sizeof err);
    ps_st_writer_destroy(&w);
    return r;
}

/* The official TSM checkpoint's name of one of ours, place blockres
 * (DataParallel, new_fc). */
static const char *tsm_name(const char *n)
{
    static char buf[256];
    const char *c1 = strstr(n, ".conv1.");
    if (!strncmp(n, "fc.", 3)) snprintf(buf, sizeof buf, "module.new_fc.%s", n + 3);
    else if (!strncmp(n, "layer", 5) && c1)
        snprintf(buf, sizeof buf, "module.base_model.%.*s.conv1.net.%s", (int)(c1 - n), n,
                 c1 + 7);
    else snprintf(buf, sizeof buf, "module.base_model.%s", n);
    return buf;
}

/* ---- the checks --------------------------------------------------------------- */

static void check_rules(void)
{
    char out[128];
    const ps_weights_format_t *t = &ps_weights_tsm;
    static const char *const cases[][2] = {
        {"module.base_model.layer1.0.conv1.net.weight", "layer1.0.conv1.weight"},
        {"module.base_model.layer3.1.net.conv2.weight", "layer3.1.conv2.weight"},
        {"module.new_fc.bias", "fc.bias"},
        {"module.base_model.fc.weight", "fc.weight"},
        {"module.base_model.bn1.running_var", "bn1.running_var"},
        {"module.base_model.layer4.1.conv1.net.weight", "layer4.1.conv1.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int r = ps_weights_map_name(t, cases[i][0], out, sizeof out);
        ok(r == 0 && !strcmp(out, cases[i][1]), "tsm names: %s -> %s (got %s)", cases[i][0],
           cases[i][1], r ? "an error" : out);
    }
    static const ps_weights_rule_t rules[] = {{PS_WEIGHTS_DROP, "fc.", NULL},
                                              {PS_WEIGHTS_PREFIX, "", "backbone.body."}};
    const ps_weights_format_t bb = {.name = "bb", .rules = rules, .nrules = 2};
    is_int(ps_weights_map_name(&bb, "fc.weight", out, sizeof out), 1, "DROP skips fc.weight");
    ok(!ps_weights_map_name(&bb, "layer2.0.bn1.bias", out, sizeof out) &&
       !strcmp(out, "backbone.body.layer2.0.bn1.bias"), "an empty PREFIX prepends: %s", out);
    is_int(ps_weights_map_name(&bb, "layer2.0.bn1.bias", out, 10), PS_ERANGE,
           "a name that does not fit: PS_ERANGE");
}

static int read_golden(const char *path, float *out, int max)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "logits ", 7)) continue;
        char *p = line + 7, *e;
        int k = (int)strtol(p, &e, 10);
        for (p = e; n < k && n < max; n++, p = e) out[n] = strtof(p, &e);
    }
    if (f) fclose(f);
    return n;
}

static void check_tsm_golden(void)
{
    char path[1024], txt[1024];
    snprintf(path, sizeof path, "%s/tests/golden/tsm_official_r18w8.safetensors", srcdir());
    snprintf(txt, sizeof txt, "%s/tests/golden/tsm_official_r18w8.txt", srcdir());
    float ref[8];
    is_int(read_golden(txt, ref, 8), 5, "golden logits read from %s", txt);
    ps_st_file_t f;
    char err[256];
    if (ok(!ps_st_open(&f, path, err, sizeof err), "open %s", path)) {
        is_int(ps_weights_tsm_place(&f), PS_MODEL_SHIFT_BLOCK, "its names place the shift 'block'");
        ok(ps_st_meta(&f, "tsm.shift_div") && !strcmp(ps_st_meta(&f, "tsm.shift_div"), "4"),
           "tsm.shift_div 4 in its metadata");
        ps_st_close(&f);
    }
    ps_model_t *m = make(5, PS_MODEL_SHIFT_BLOCK, 4, PS_MODEL_BN_TRAIN);
    if (!ok(m != NULL, "TSM-R18 width 8, place block, 1/4")) return;
    log_begin();
    int r = ps_model_load(m, path, PS_MODEL_LOAD_STRICT);
    const char *lg = log_end();
    is_int(r, 0, "the official-layout checkpoint loads strictly");
    ok(strstr(lg, "(tsm names): 122 tensors loaded, 0 adapted, 0 re-initialised, 0 skipped, 0 missing") != NULL,
       "the log says what was loaded: %.200s", lg);
    float *x = malloc(sizeof(float) * 4 * 3 * 32 * 32);
    ps_model_hash_fill(x, 4 * 3 * 32 * 32, "input", SEED, 1.0);
    ps_model_forward(m, x, 1, NULL, 0, NULL);
    allclose(ps_model_logits(m), ref, 5, 1e-5, 1e-4, "logits == PyTorch's official-layout TSM");

    /* the same checkpoint into models it does not fit */
    ps_model_t *res = make(5, PS_MODEL_SHIFT_BLOCKRES, 4, PS_MODEL_BN_TRAIN);
    ps_model_t *d8 = make(5, PS_MODEL_SHIFT_BLOCK, 8, PS_MODEL_BN_TRAIN);
    uint64_t h = model_hash(res);
    log_begin();
    r = ps_model_load(res, path, PS_MODEL_LOAD_STRICT);
    lg = log_end();
    ok(r == PS_EMISMATCH && strstr(lg, "placed 'block'") && model_hash(res) == h,
       "into a 'blockres' model: refused naming the placement, unchanged");
    is_int(ps_model_load(d8, path, PS_MODEL_LOAD_STRICT), 0, "into a 1/8 model: the names fit");
    ps_model_forward(d8, x, 1, NULL, 0, NULL);
    const float *l8 = ps_model_logits(d8);
    double worst = 0;
    for (int k = 0; k < 5; k++) worst = fmax(worst, fabs(l8[k] - ref[k]));
    ok(worst > 1e-3, "control: with 1/8 the logits move by %.3g (the golden tells them apart)",
       worst);
    free(x);
    ps_model_destroy(&d8);
    ps_model_destroy(&res);
    ps_model_destroy(&m);
}

/* A TSM-named copy of a 7-class model into a 4-class one: fc re-initialised
 * and listed; the rest bit for bit. */
static void check_reinit(void)
{
    ps_model_t *src = make(7, 0, 8, PS_MODEL_BN_TRAIN), *m = make(4, 0, 8, PS_MODEL_BN_TRAIN);
    if (!ok(src && m, "reinit: models")) return;
    ps_model_init(src, 11, 1);
    ps_model_init(m, 12, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/tsm7.safetensors", tmpdir);
    is_int(write_model(src, path, tsm_name, NULL, NULL), 0, "write a 7-class checkpoint in TSM's names");
    is_int(ps_model_load(m, path, PS_MODEL_LOAD_STRICT), PS_EMISMATCH, "strict: fc's shape refused");
    log_begin();
    int r = ps_model_load(m, path, PS_MODEL_LOAD_REPLACE_FC);
    const char *lg = log_end();
    is_int(r, 0, "REPLACE_FC: loads");
    ok(ps_model_fc_replaced(m), "fc reported replaced");
    ok(strstr(lg, "module.new_fc.weight is [7, 64] in the file, [4, 64] here: re-initialised") &&
       strstr(lg, "module.new_fc.bias is [7] in the file, [4] here: re-initialised"),
       "both classifier tensors listed as re-initialised");
    int np;
    const ps_model_param_t *P = ps_model_params(m, &np), *S = ps_model_params(src, NULL);
    int same = 1;
    for (int i = 0; i < np; i++)
        if (strncmp(P[i].name, "fc.", 3)) same &= !memcmp(P[i].w, S[i].w, P[i].numel * 4);
    ok(same, "every other tensor is the file's, bit for bit");
    ps_model_destroy(&src);
    ps_model_destroy(&m);
}

static void check_partial(void)
{
    ps_model_t *src = make(4, 0, 8, PS_MODEL_BN_TRAIN), *m = make(4, 0, 8, PS_MODEL_BN_TRAIN);
    if (!ok(src && m, "partial: models")) return;
    ps_model_init(src, 21, 1);
    ps_model_init(m, 22, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/part.safetensors", tmpdir);
    write_model(src, path, NULL, "layer3.0.conv1.weight", "extra.weight");
    uint64_t h = model_hash(m);
    log_begin();
    int r = ps_model_load(m, path, PS_MODEL_LOAD_STRICT);
    const char *lg = log_end();
    ok(r == PS_ENOTFOUND && strstr(lg, "tensor layer3.0.conv1.weight missing") &&
       strstr(lg, "unexpected tensor extra.weight") && model_hash(m) == h,
       "strict: missing and unknown both named (first: PS_ENOTFOUND), model unchanged");

    int np, nb;
    ps_model_param_t *P = (ps_model_param_t *)ps_model_params(m, &np);
    ps_model_buffer_t *B = (ps_model_buffer_t *)ps_model_buffers(m, &nb);
    unsigned char *kept = calloc((size_t)np, 1);
    ps_weights_target_t t = {.what = "model", .params = P, .nparams = np, .buffers = B,
                             .nbuffers = nb, .kept_init = kept};
    int ic = ps_model_find_param(m, "layer3.0.conv1.weight");
    float before = P[ic].w[0];
    ps_weights_report_t rep;
    log_begin();
    r = ps_weights_load(&t, path, ps_weights_resnet_formats, PS_WEIGHTS_RESNET_NFORMATS,
                        PS_WEIGHTS_PARTIAL, &rep);
    lg = log_end();
    ok(r == 0 && rep.missing == 1 && rep.skipped == 1 && rep.loaded == np - 1 + nb,
       "PARTIAL: loads (%d loaded, %d missing, %d skipped)", rep.loaded, rep.missing, rep.skipped);
    ok(strstr(lg, "layer3.0.conv1.weight not in the file, keeps its initialisation") &&
       strstr(lg, "skipped extra.weight [4]"), "the missing and the skipped tensor are listed");
    int nkept = 0;
    for (int i = 0; i < np; i++) nkept += kept[i];
    ok(kept[ic] && nkept == 1 && P[ic].w[0] == before, "kept_init marks it alone; its value stayed");

    /* a shape that cannot be used stays an error with PARTIAL */
    snprintf(path, sizeof path, "%s/wrong.safetensors", tmpdir);
    ps_model_t *k5 = make(5, 0, 8, PS_MODEL_BN_TRAIN);
    write_model(k5, path, NULL, NULL, NULL);
    h = model_hash(m);
    log_begin();
    r = ps_model_load(m, path, PS_MODEL_LOAD_PARTIAL);
    lg = log_end();
    ok(r == PS_EMISMATCH && strstr(lg, "fc.weight has shape [5, 64], the model needs [4, 64]") &&
       model_hash(m) == h, "PARTIAL: a wrong shape is still refused by name, model unchanged");
    free(kept);
    ps_model_destroy(&k5);
    ps_model_destroy(&src);
    ps_model_destroy(&m);
}

/* adapt: a file holding each conv weight flattened to 1-D; the hook reshapes. */
static int adapt_flat(void *ctx, int i, const float *src, int ndim, const int64_t *shape,
                      float *dst)
{
    const ps_model_param_t *P = ctx;
    if (ndim != 1 || (size_t)shape[0] != P[i].numel) return 0;
    memcpy(dst, src, P[i].numel * sizeof(float));
    return 1;
}

static void check_adapt(void)
{
    ps_model_t *src = make(4, 0, 8, PS_MODEL_BN_TRAIN), *m = make(4, 0, 8, PS_MODEL_BN_TRAIN);
    if (!ok(src && m, "adapt: models")) return;
    ps_model_init(src, 31, 1);
    ps_model_init(m, 32, 1);
    int np, nb;
    const ps_model_param_t *S = ps_model_params(src, &np);
    ps_model_param_t *P = (ps_model_param_t *)ps_model_params(m, &np);
    ps_model_buffer_t *B = (ps_model_buffer_t *)ps_model_buffers(m, &nb);
    ps_st_writer_t *w = ps_st_writer_new();
    int ic = ps_model_find_param(src, "layer1.1.conv2.weight");
    for (int i = 0; i < np; i++) {
        int64_t s[4];
        for (int d = 0; d < S[i].ndim; d++) s[d] = S[i].shape[d];
        if (i == ic) s[0] = (int64_t)S[i].numel;
        ps_st_writer_add(w, S[i].name, PS_ST_F32, i == ic ? 1 : S[i].ndim, s, S[i].w);
    }
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/adapt.safetensors", tmpdir);
    ps_st_writer_save(w, path, err, sizeof err);
    ps_st_writer_destroy(&w);
    ps_weights_target_t t = {.what = "model", .params = P, .nparams = np, .buffers = B,
                             .nbuffers = nb, .ctx = P};
    uint64_t h = model_hash(m);
    log_begin();
    int r = ps_weights_load(&t, path, ps_weights_resnet_formats, PS_WEIGHTS_RESNET_NFORMATS, 0,
                            NULL);
    log_end();
    ok(r == PS_EMISMATCH && model_hash(m) == h, "without the hook the 1-D tensor is refused");
    t.adapt = adapt_flat;
    ps_weights_report_t rep;
    log_begin();
    r = ps_weights_load(&t, path, ps_weights_resnet_formats, PS_WEIGHTS_RESNET_NFORMATS,
                        PS_WEIGHTS_PARTIAL, &rep); /* the file has no BN statistics */
    const char *lg = log_end();
    ok(r == 0 && rep.adapted == 1 && !memcmp(P[ic].w, S[ic].w, S[ic].numel * 4) &&
       strstr(lg, "layer1.1.conv2.weight adapted from [576] to [8, 8, 3, 3]"),
       "with the hook: adapted, listed, the values are the file's");
    ps_model_destroy(&src);
    ps_model_destroy(&m);
}

/* our names and TSM's of the same tensor in one file */
static const char *both_name(const char *n) { return !strcmp(n, "bn1.bias") ? "bn1.bias" : tsm_name(n); }

static void check_duplicate(void)
{
    ps_model_t *m = make(4, 0, 8, PS_MODEL_BN_TRAIN);
    char path[512];
    snprintf(path, sizeof path, "%s/dup.safetensors", tmpdir);
    write_model(m, path, both_name, NULL, "module.base_model.bn1.bias");
    uint64_t h = model_hash(m);
    log_begin();
    int r = ps_model_load(m, path, PS_MODEL_LOAD_STRICT);
    const char *lg = log_end();
    ok(r == PS_EMISMATCH && strstr(lg, "both map to bn1.bias") && model_hash(m) == h,
       "two file tensors for one model tensor: refused by name");
    ps_model_destroy(&m);
}

/* A detector's backbone from a classifier in our names and in TSM's: fc
 * skipped and listed, backbone the file's, FPN and heads untouched. */
static void check_detector(void)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = 18;
    c.width = 8;
    c.fpn_channels = 16;
    c.num_classes = 3;
    ps_retina_t *r = NULL;
    ps_model_t *cls = make(10, 0, 8, PS_MODEL_BN_TRAIN);
    if (!ok(!ps_retina_create(&r, &c, &ps_backend_cpu, &ctx, 1, 64, 64) && cls, "detector")) return;
    ps_retina_init(r, 41, 1);
    ps_model_init(cls, 42, 1);
    int np, nb;
    const ps_model_param_t *P = ps_retina_params(r, &np);
    const ps_model_buffer_t *B = ps_retina_buffers(r, &nb);
    int first_fpn = ps_retina_find_param(r, "backbone.fpn.inner_blocks.0.0.weight");
    uint64_t heads = tables_hash(P + first_fpn, np - first_fpn, NULL, 0);
    const char *(*names[2])(const char *) = {NULL, tsm_name};
    const char *fc[2] = {"skipped fc.weight [10, 64]", "skipped module.new_fc.weight [10, 64]"};
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/cls%d.safetensors", tmpdir, k);
        write_model(cls, path, names[k], NULL, NULL);
        log_begin();
        int rc = ps_retina_load_weights(r, path, 0);
        const char *lg = log_end();
        ok(rc == 0 && strstr(lg, fc[k]) && strstr(lg, "tensors outside backbone.body.* are not in "
                                                       "such a file and keep their initialisation"),
           "%s classifier -> detector: fc skipped and listed, FPN / heads keep their init",
           k ? "TSM" : "torchvision");
        int i = ps_retina_find_param(r, "backbone.body.layer4.1.conv2.weight");
        int j = ps_model_find_param(cls, "layer4.1.conv2.weight");
        ok(!memcmp(P[i].w, ps_model_params(cls, NULL)[j].w, P[i].numel * 4) &&
           tables_hash(P + first_fpn, np - first_fpn, NULL, 0) == heads,
           "backbone weights are the file's; FPN and heads unchanged");
    }
    (void)B;
    (void)nb;
    ps_model_destroy(&cls);
    ps_retina_destroy(&r);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/ps_weights.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) tap_skip_all("no temporary folder");
    ps_log_level = PS_LOG_INFO;
    ps_engine_init(&ctx, 1);
    check_rules();
    check_tsm_golden();
    check_reinit();
    check_partial();
    check_adapt();
    check_duplicate();
    check_detector();
    ps_ctx_free(&ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) diag("could not remove %s", tmpdir);
    return tap_done();
}
