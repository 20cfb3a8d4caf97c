/* safetensors: golden files written from torch values (gen_safetensors.py),
 * exact bytes of a writer output against a hand-written expectation, round
 * trip of every dtype, rejection of malformed headers, truncation at every
 * byte and byte-mutation fuzzing (must fail cleanly, never crash), crash-safe
 * save, and interop with torch through tests/tools/check_safetensors_torch.py.
 *
 * `test_safetensors --write-interop PATH` only writes the interop file. */
#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"
#include "tests/lib/tap.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s && *s ? s : ".";
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static int same_float(float a, float b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, 4) == 0; /* distinguishes -0.0 */
}

/* Integer element i of tensor t, sign-extended. */
static long long int_elem(const ps_st_file_t *f, const ps_st_tensor_t *t, size_t i)
{
    const uint8_t *p = (const uint8_t *)ps_st_tensor_data(f, t) + i * ps_st_dtype_size(t->dtype);
    int64_t i64; int32_t i32; int16_t i16;
    switch (t->dtype) {
    case PS_ST_I64: memcpy(&i64, p, 8); return i64;
    case PS_ST_I32: memcpy(&i32, p, 4); return i32;
    case PS_ST_I16: memcpy(&i16, p, 2); return i16;
    case PS_ST_I8: return (int8_t)*p;
    default: return *p; /* U8, BOOL */
    }
}

/* Check file `name` against its _expected.txt. */
static void check_golden(const char *name)
{
    char path[1024], exp[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/golden/%s.safetensors", srcdir(), name);
    snprintf(exp, sizeof exp, "%s/tests/golden/%s_expected.txt", srcdir(), name);
    ps_st_file_t f;
    int rc = ps_st_open(&f, path, err, sizeof err);
    is_int(rc, 0, "%s opens (%s)", name, err);
    FILE *e = fopen(exp, "r");
    ok(e != NULL, "%s readable", exp);
    if (rc || !e) {
        if (e) fclose(e);
        return;
    }
    char line[4096];
    size_t ntens = 0, nmeta = 0;
    while (fgets(line, sizeof line, e)) {
        if (line[0] == '#') continue;
        if (!strncmp(line, "meta ", 5)) {
            cJSON *kv = cJSON_Parse(line + 5);
            const char *k = cJSON_GetArrayItem(kv, 0)->valuestring, *v = cJSON_GetArrayItem(kv, 1)->valuestring;
            const char *got = ps_st_meta(&f, k);
            ok(got && !strcmp(got, v), "%s: metadata %s = \"%s\"", name, k, got ? got : "(null)");
            cJSON_Delete(kv);
            nmeta++;
            continue;
        }
        char tname[256], dt[16];
        int ndim, pos;
        if (sscanf(line, "%255s %15s %d%n", tname, dt, &ndim, &pos) != 3) continue;
        long long dims[PS_ST_MAX_DIMS], numel;
        char *p = line + pos;
        for (int d = 0; d < ndim; d++) dims[d] = strtoll(p, &p, 10);
        numel = strtoll(p, &p, 10);
        ntens++;
        const ps_st_tensor_t *t = ps_st_find(&f, tname);
        ok(t != NULL, "%s: tensor %s present", name, tname);
        if (!t) continue;
        int shape_ok = !strcmp(ps_st_dtype_name(t->dtype), dt) && t->ndim == ndim &&
                       t->nbytes == (size_t)numel * ps_st_dtype_size(t->dtype);
        for (int d = 0; d < ndim && shape_ok; d++) shape_ok = t->shape[d] == dims[d];
        ok(shape_ok, "%s: %s is %s, %d dims, %lld elements", name, tname, dt, ndim, numel);
        int isf = t->dtype == PS_ST_F32 || t->dtype == PS_ST_F16 || t->dtype == PS_ST_BF16 ||
                  t->dtype == PS_ST_F64;
        float *got = calloc((size_t)numel + 1, sizeof *got);
        if (isf) is_int(ps_st_read_f32(&f, tname, got, (size_t)numel, err, sizeof err), 0,
                        "%s: read_f32 %s", name, tname);
        long bad = 0;
        for (long long i = 0; i < numel && fgets(line, sizeof line, e); i++) {
            if (isf) {
                float want = (float)strtod(line, NULL);
                if (!same_float(got[i], want)) {
                    if (!bad) diag("%s[%lld]: got %.9g want %.9g", tname, i, got[i], want);
                    bad++;
                }
            } else if (int_elem(&f, t, (size_t)i) != strtoll(line, NULL, 10)) {
                if (!bad) diag("%s[%lld]: got %lld want %s", tname, i, int_elem(&f, t, (size_t)i), line);
                bad++;
            }
        }
        ok(bad == 0, "%s: %s values match torch (%ld bad)", name, tname, bad);
        free(got);
    }
    fclose(e);
    is_int(f.ntensors, ntens, "%s: tensor count", name);
    is_int(f.nmeta, nmeta, "%s: metadata count", name);
    for (size_t i = 1; i < f.ntensors; i++)
        if (f.tensors[i].offset < f.tensors[i - 1].offset) {
            ok(0, "%s: tensors listed in data order", name);
            break;
        }
    ps_st_close(&f);
}

/* Build "[len][header][data_len zero bytes]" in an exact-size buffer. */
static uint8_t *mkbuf(const char *hdr, size_t data_len, size_t *len)
{
    size_t h = strlen(hdr);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    return b;
}

static void expect_reject(const char *what, const char *hdr, size_t data_len)
{
    size_t len;
    uint8_t *b = mkbuf(hdr, data_len, &len);
    ps_st_file_t f;
    char err[256] = "";
    int rc = ps_st_parse(&f, b, len, err, sizeof err);
    if (!ok(rc == PS_ECORRUPT && err[0] && f.ntensors == 0 && f.tensors == NULL, "reject %s", what))
        diag("rc %d err \"%s\"", rc, err);
    else
        diag("  -> %s", err);
    if (!rc) ps_st_close(&f);
    free(b);
}

static void expect_accept(const char *what, const char *hdr, size_t data_len)
{
    size_t len;
    uint8_t *b = mkbuf(hdr, data_len, &len);
    ps_st_file_t f;
    char err[256] = "";
    int rc = ps_st_parse(&f, b, len, err, sizeof err);
    if (!ok(rc == 0, "accept %s", what)) diag("rc %d err \"%s\"", rc, err);
    if (!rc) ps_st_close(&f);
    free(b);
}

static void test_reject(void)
{
    int lvl = ps_log_level;
    ps_log_level = -1; /* the parser logs every rejection; keep TAP output readable */
    expect_accept("minimal valid", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_accept("empty header {}", "{}", 0);
    expect_accept("trailing spaces", "{}      ", 0);
    expect_accept("null __metadata__", "{\"__metadata__\":null}", 0);
    {
        size_t len;
        uint8_t *b = mkbuf("{}", 0, &len);
        ps_st_file_t f;
        char err[256];
        b[0] = 3; /* claims 3 bytes, only 2 follow */
        ok(ps_st_parse(&f, b, len, err, sizeof err) == PS_ECORRUPT, "reject header length > file");
        b[0] = 0; b[3] = 0x10; /* 256 MiB, over the cap */
        ok(ps_st_parse(&f, b, len, err, sizeof err) == PS_ECORRUPT && strstr(err, "cap"),
           "reject header length > PS_ST_MAX_HEADER (%s)", err);
        memset(b, 0xff, 8);
        ok(ps_st_parse(&f, b, len, err, sizeof err) == PS_ECORRUPT, "reject header length 2^64-1");
        free(b);
        ok(ps_st_parse(&f, "", 0, err, sizeof err) == PS_ECORRUPT, "reject empty buffer");
        ok(ps_st_parse(&f, NULL, 0, err, sizeof err) == PS_ECORRUPT, "reject NULL buffer");
    }
    expect_reject("non-object JSON (array)", "[1,2]", 0);
    expect_reject("non-object JSON (string)", "\"x\"", 0);
    expect_reject("invalid JSON", "{\"a\":", 0);
    expect_reject("trailing garbage", "{} x", 0);
    expect_reject("two objects", "{}{}", 0);
    {
        size_t len;
        uint8_t *b = mkbuf("{}  ", 0, &len);
        ps_st_file_t f;
        char err[256];
        b[10] = 0; /* "{}\0 ": cJSON would stop at the NUL */
        ok(ps_st_parse(&f, b, len, err, sizeof err) == PS_ECORRUPT, "reject NUL inside header");
        free(b);
    }
    expect_reject("entry not an object", "{\"a\":3}", 0);
    expect_reject("bad dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject("dtype not string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject("missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject("missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4);
    expect_reject("missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4);
    expect_reject("negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0);
    expect_reject("fractional shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", 6);
    expect_reject("string in shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4);
    expect_reject("shape product overflow",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", 0);
    expect_reject("byte size overflow",
                  "{\"a\":{\"dtype\":\"F64\",\"shape\":[4503599627370496,4096],\"data_offsets\":[0,0]}}", 0);
    expect_reject("9 dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    expect_reject("nbytes mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_reject("begin > end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8);
    expect_reject("offset past end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4);
    expect_reject("offsets past end (huge)",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9007199254740990,9007199254740991]}}", 4);
    expect_reject("negative offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1);
    expect_reject("data_offsets with 3 items", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1);
    expect_reject("overlapping offsets",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
    expect_reject("same offsets twice",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_reject("gap between tensors",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12);
    expect_reject("gap at start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_reject("unused bytes at end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5);
    expect_reject("data but no tensors", "{}", 4);
    expect_reject("duplicate names",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_reject("__metadata__ not object", "{\"__metadata__\":\"x\"}", 0);
    expect_reject("__metadata__ number value", "{\"__metadata__\":{\"k\":1}}", 0);
    expect_reject("__metadata__ object value", "{\"__metadata__\":{\"k\":{}}}", 0);
    expect_reject("duplicate __metadata__ key", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0);
    expect_reject("two __metadata__", "{\"__metadata__\":{},\"__metadata__\":{}}", 0);
    ps_log_level = lvl;
}

/* Truncate a valid file at every length and flip bytes: every parse must
 * either fail with an error message or succeed, and never crash (each run
 * uses an exact-size heap buffer so ASan/valgrind would see an over-read). */
static void test_truncate_fuzz(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/golden/st_torch.safetensors", srcdir());
    size_t len;
    uint8_t *full = slurp(path, &len);
    ok(full && len > 64, "read %s (%zu bytes)", path, len);
    if (!full) return;
    int lvl = ps_log_level;
    ps_log_level = -1;
    size_t accepted = 0, silent = 0;
    for (size_t n = 0; n < len; n++) {
        uint8_t *b = malloc(n ? n : 1);
        memcpy(b, full, n);
        ps_st_file_t f;
        err[0] = 0;
        int rc = ps_st_parse(&f, b, n, err, sizeof err);
        if (rc == 0) {
            accepted++;
            ps_st_close(&f);
        } else if (!err[0]) silent++;
        free(b);
    }
    ok(accepted == 0 && silent == 0, "truncation at each of %zu lengths rejected with a message "
       "(%zu accepted, %zu without message)", len, accepted, silent);
    /* also through the file path (mmap) at a few lengths */
    char tp[64];
    snprintf(tp, sizeof tp, "/tmp/test_st_trunc.%ld", (long)getpid());
    size_t file_fail = 0, file_n = 0;
    for (size_t n = 0; n < len; n += 37, file_n++) {
        FILE *o = fopen(tp, "wb");
        fwrite(full, 1, n, o);
        fclose(o);
        ps_st_file_t f;
        if (ps_st_open(&f, tp, err, sizeof err) == PS_ECORRUPT && strstr(err, tp)) file_fail++;
        else ps_st_close(&f);
    }
    unlink(tp);
    is_int(file_fail, file_n, "ps_st_open rejects truncated files naming the path");
    static const uint8_t vals[] = {0x00, 0xff, '"', '}', '9', ' '};
    size_t parses = 0;
    for (size_t i = 0; i < len; i++)
        for (size_t v = 0; v < sizeof vals; v++) {
            uint8_t *b = malloc(len);
            memcpy(b, full, len);
            b[i] = vals[v];
            ps_st_file_t f;
            err[0] = 0;
            int rc = ps_st_parse(&f, b, len, err, sizeof err);
            if (rc == 0) {
                /* a mutated file that still validates must be self-consistent */
                for (size_t t = 0; t < f.ntensors; t++)
                    if (f.tensors[t].offset + f.tensors[t].nbytes > f.data_len) rc = -100;
                ps_st_close(&f);
            } else if (!err[0]) rc = -101;
            free(b);
            if (rc == -100 || rc == -101) {
                diag("byte %zu = 0x%02x: rc %d", i, vals[v], rc);
                break;
            }
            parses++;
        }
    ok(parses == len * sizeof vals, "%zu byte-mutated parses stayed consistent", parses);
    ps_log_level = lvl;
    free(full);
}

/* Exact bytes of a tiny file against a hand-written expectation. */
static void test_exact_bytes(const char *dir)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/exact.safetensors", dir);
    ps_st_writer_t *w = ps_st_writer_new();
    const float a[2] = {1.0f, -2.0f};
    const uint8_t m[3] = {1, 0, 1};
    int64_t s2 = 2, s3 = 3;
    is_int(ps_st_writer_add(w, "a", PS_ST_F32, 1, &s2, a), 0, "add a");
    is_int(ps_st_writer_add(w, "m\"x", PS_ST_BOOL, 1, &s3, m), 0, "add m\"x (needs escaping)");
    is_int(ps_st_writer_meta(w, "format", "pt"), 0, "meta");
    is_int(ps_st_writer_save(w, path, err, sizeof err), 0, "save %s", err);
    ps_st_writer_destroy(&w);
    ok(w == NULL, "destroy NULLs the pointer");
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"m\\\"x\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[8,11]}}";
    size_t h = strlen(hdr), hp = (h + 7) / 8 * 8, len;
    uint8_t *want = calloc(1, 8 + hp + 11);
    want[0] = (uint8_t)hp;
    want[1] = (uint8_t)(hp >> 8);
    memcpy(want + 8, hdr, h);
    memset(want + 8 + h, ' ', hp - h);
    memcpy(want + 8 + hp, a, 8);
    memcpy(want + 8 + hp + 8, m, 3);
    uint8_t *got = slurp(path, &len);
    ok(got && len == 8 + hp + 11 && !memcmp(got, want, len),
       "file bytes equal the reference layout (%zu bytes, header %zu padded to %zu)", len, h, hp);
    free(got);
    free(want);
    unlink(path);
}

/* Known contents shared with check_safetensors_torch.py. */
static float a_f32[6], k_empty[1];
static uint16_t b_f16[5], c_bf16[4];
static double d_f64[4];
static int64_t e_i64 = -42;
static int32_t f_i32[3];
static int16_t g_i16[2] = {-300, 300};
static int8_t h_i8[3];
static uint8_t i_u8[4], j_bool[3];

static ps_st_writer_t *interop_writer(void)
{
    static const uint16_t f16[5] = {0xbc00, 0xb800, 0x0000, 0x3800, 0x3c00}; /* -1 -.5 0 .5 1 */
    static const uint16_t bf[4] = {0x3fc0, 0x4040, 0x4090, 0x40c0};       /* 1.5 3 4.5 6 */
    for (int i = 0; i < 6; i++) a_f32[i] = i * 0.25f - 1;
    memcpy(b_f16, f16, sizeof f16);
    memcpy(c_bf16, bf, sizeof bf);
    for (int i = 0; i < 4; i++) d_f64[i] = i / 3.0;
    for (int i = 0; i < 3; i++) f_i32[i] = i * 1000 - 7, h_i8[i] = (int8_t)-i, j_bool[i] = i % 2;
    for (int i = 0; i < 4; i++) i_u8[i] = (uint8_t)(250 + i);
    int64_t s23[2] = {2, 3}, s5 = 5, s4 = 4, s22[2] = {2, 2}, s3 = 3, s2 = 2, s0 = 0;
    ps_st_writer_t *w = ps_st_writer_new();
    int rc = 0;
    rc |= ps_st_writer_add(w, "a.f32", PS_ST_F32, 2, s23, a_f32);
    rc |= ps_st_writer_add(w, "b.f16", PS_ST_F16, 1, &s5, b_f16);
    rc |= ps_st_writer_add(w, "c.bf16", PS_ST_BF16, 1, &s4, c_bf16);
    rc |= ps_st_writer_add(w, "d.f64", PS_ST_F64, 2, s22, d_f64);
    rc |= ps_st_writer_add(w, "e.i64", PS_ST_I64, 0, NULL, &e_i64);
    rc |= ps_st_writer_add(w, "f.i32", PS_ST_I32, 1, &s3, f_i32);
    rc |= ps_st_writer_add(w, "g.i16", PS_ST_I16, 1, &s2, g_i16);
    rc |= ps_st_writer_add(w, "h.i8", PS_ST_I8, 1, &s3, h_i8);
    rc |= ps_st_writer_add(w, "i.u8", PS_ST_U8, 1, &s4, i_u8);
    rc |= ps_st_writer_add(w, "j.bool", PS_ST_BOOL, 1, &s3, j_bool);
    rc |= ps_st_writer_add(w, "k.empty", PS_ST_F32, 1, &s0, k_empty);
    rc |= ps_st_writer_meta(w, "format", "pt");
    rc |= ps_st_writer_meta(w, "producer", "psd test \"q\" \xc3\xbc");
    if (rc) ps_st_writer_destroy(&w);
    return w;
}

static void test_roundtrip(const char *dir)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    ps_st_writer_t *w = interop_writer();
    ok(w != NULL, "writer with every dtype, 0-d and empty tensors");
    if (!w) return;
    is_int(ps_st_writer_save(w, path, err, sizeof err), 0, "save %s", err);
    ps_st_file_t f;
    is_int(ps_st_open(&f, path, err, sizeof err), 0, "reopen %s", err);
    is_int(f.ntensors, 11, "11 tensors back");
    ok((f.data - f.map) % 8 == 0,
       "data section starts at a multiple of 8 (%td)", f.data - f.map);
    static const struct { const char *n; ps_st_dtype_t dt; const void *p; size_t nb; int nd; } ex[] = {
        {"a.f32", PS_ST_F32, a_f32, 24, 2},   {"b.f16", PS_ST_F16, b_f16, 10, 1},
        {"c.bf16", PS_ST_BF16, c_bf16, 8, 1}, {"d.f64", PS_ST_F64, d_f64, 32, 2},
        {"e.i64", PS_ST_I64, &e_i64, 8, 0},   {"f.i32", PS_ST_I32, f_i32, 12, 1},
        {"g.i16", PS_ST_I16, g_i16, 4, 1},    {"h.i8", PS_ST_I8, h_i8, 3, 1},
        {"i.u8", PS_ST_U8, i_u8, 4, 1},       {"j.bool", PS_ST_BOOL, j_bool, 3, 1},
        {"k.empty", PS_ST_F32, k_empty, 0, 1},
    };
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        const ps_st_tensor_t *t = ps_st_find(&f, ex[i].n);
        ok(t && t->dtype == ex[i].dt && t->nbytes == ex[i].nb && t->ndim == ex[i].nd &&
           !memcmp(ps_st_tensor_data(&f, t), ex[i].p, ex[i].nb),
           "round trip %s (%s, %zu bytes)", ex[i].n, ps_st_dtype_name(ex[i].dt), ex[i].nb);
    }
    ok(ps_st_meta(&f, "producer") && !strcmp(ps_st_meta(&f, "producer"), "psd test \"q\" \xc3\xbc"),
       "metadata with quotes and UTF-8 round trips");
    ok(ps_st_meta(&f, "missing") == NULL, "absent metadata key gives NULL");
    float v[6];
    is_int(ps_st_read_f32(&f, "b.f16", v, 5, err, sizeof err), 0, "read_f32 F16");
    ok(v[0] == -1 && v[1] == -0.5f && v[2] == 0 && v[3] == 0.5f && v[4] == 1, "F16 decoded");
    is_int(ps_st_read_f32(&f, "c.bf16", v, 4, err, sizeof err), 0, "read_f32 BF16");
    ok(v[0] == 1.5f && v[1] == 3 && v[2] == 4.5f && v[3] == 6, "BF16 decoded");
    is_int(ps_st_read_f32(&f, "d.f64", v, 4, err, sizeof err), 0, "read_f32 F64");
    ok(v[1] == (float)(1 / 3.0) && v[3] == 1.0f, "F64 decoded");
    is_int(ps_st_read_f32(&f, "k.empty", v, 0, err, sizeof err), 0, "read_f32 of an empty tensor");
    int lvl = ps_log_level;
    ps_log_level = -1;
    is_int(ps_st_read_f32(&f, "nope", v, 1, err, sizeof err), PS_ENOTFOUND, "read_f32 missing name");
    ok(strstr(err, "nope") != NULL, "message names the tensor: %s", err);
    is_int(ps_st_read_f32(&f, "a.f32", v, 5, err, sizeof err), PS_EMISMATCH, "read_f32 wrong numel");
    is_int(ps_st_read_f32(&f, "f.i32", v, 3, err, sizeof err), PS_EMISMATCH, "read_f32 of an int tensor");
    ps_log_level = lvl;
    ps_st_close(&f);
    ok(f.map == NULL && f.ntensors == 0, "close zeroes the handle");
    ps_st_close(&f); /* twice is harmless */
    ps_st_writer_destroy(&w);
    unlink(path);
}

static void test_writer_errors(void)
{
    int lvl = ps_log_level;
    ps_log_level = -1;
    ps_st_writer_t *w = ps_st_writer_new();
    float x[2] = {0};
    int64_t s2 = 2, neg = -1, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    is_int(ps_st_writer_add(w, "x", PS_ST_F32, 1, &s2, x), 0, "add x");
    is_int(ps_st_writer_add(w, "x", PS_ST_F32, 1, &s2, x), PS_EINVAL, "duplicate name refused");
    is_int(ps_st_writer_add(w, "y", PS_ST_F32, 1, &neg, x), PS_EINVAL, "negative dim refused");
    is_int(ps_st_writer_add(w, "y", PS_ST_F32, 9, s9, x), PS_EINVAL, "9 dims refused");
    is_int(ps_st_writer_add(w, "y", (ps_st_dtype_t)99, 1, &s2, x), PS_EINVAL, "unknown dtype refused");
    is_int(ps_st_writer_add(w, "__metadata__", PS_ST_F32, 1, &s2, x), PS_EINVAL, "reserved name refused");
    is_int(ps_st_writer_add(w, "z", PS_ST_F32, 1, &s2, NULL), PS_EINVAL, "NULL data refused");
    char err[256];
    is_int(ps_st_writer_save(w, "/nonexistent-dir/x.safetensors", err, sizeof err), PS_EIO,
           "save into a missing directory: PS_EIO");
    ok(strstr(err, "nonexistent-dir") != NULL, "message names the path: %s", err);
    ps_st_file_t f;
    is_int(ps_st_open(&f, "/nonexistent-dir/x.safetensors", err, sizeof err), PS_EIO, "open missing: PS_EIO");
    is_int(ps_st_open(&f, "/", err, sizeof err), PS_EIO, "open a directory: PS_EIO");
    ps_st_writer_destroy(&w);
    ps_st_writer_destroy(&w); /* NULL after the first */
    ps_log_level = lvl;
}

static void test_crash_safe(const char *dir)
{
    char path[1024], tmp[1100], err[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    float v1[4] = {1, 2, 3, 4}, v2[4] = {5, 6, 7, 8};
    int64_t s4 = 4;
    ps_st_writer_t *w = ps_st_writer_new();
    ps_st_writer_add(w, "w", PS_ST_F32, 1, &s4, v1);
    is_int(ps_st_writer_save(w, path, err, sizeof err), 0, "first save");
    ps_st_writer_destroy(&w);
    ps_st_file_t old;
    is_int(ps_st_open(&old, path, err, sizeof err), 0, "saved file opens");
    /* a stale, read-only, garbage tmp file left by a crashed save */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0444);
    ok(fd >= 0 && write(fd, "garbage-garbage-garbage", 23) == 23, "stale tmp planted");
    if (fd >= 0) close(fd);
    w = ps_st_writer_new();
    ps_st_writer_add(w, "w", PS_ST_F32, 1, &s4, v2);
    is_int(ps_st_writer_save(w, path, err, sizeof err), 0, "save over a stale tmp: %s", err);
    ps_st_writer_destroy(&w);
    ok(access(tmp, F_OK) != 0, "no tmp file left behind");
    ps_st_file_t nf;
    float got[4];
    is_int(ps_st_open(&nf, path, err, sizeof err), 0, "new file opens");
    ok(ps_st_read_f32(&nf, "w", got, 4, err, sizeof err) == 0 && !memcmp(got, v2, 16), "new contents");
    ok(ps_st_read_f32(&old, "w", got, 4, err, sizeof err) == 0 && !memcmp(got, v1, 16),
       "a reader of the old file still sees the old contents (rename, not overwrite)");
    ps_st_close(&nf);
    ps_st_close(&old);
    unlink(path);
}

static void test_torch_interop(const char *dir)
{
    const char *py = getenv("PS_PYTHON");
    char path[1024], script[1024], cmd[3200], err[256];
    snprintf(script, sizeof script, "%s/tests/tools/check_safetensors_torch.py", srcdir());
    if (!py || !*py || access(script, R_OK)) {
        ok(1, "# SKIP torch interop: PS_PYTHON unset or %s missing", script);
        return;
    }
    snprintf(path, sizeof path, "%s/interop.safetensors", dir);
    ps_st_writer_t *w = interop_writer();
    is_int(ps_st_writer_save(w, path, err, sizeof err), 0, "interop file saved");
    ps_st_writer_destroy(&w);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' 2>&1", py, script, path);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    int rc = 255;
    if (p) {
        char line[512];
        while (fgets(line, sizeof line, p)) printf("#   %s", line); /* keep TAP valid */
        int st = pclose(p);
        rc = WIFEXITED(st) ? WEXITSTATUS(st) : 255;
    }
    if (rc == 77 || rc == 127) ok(1, "# SKIP torch/numpy not importable by %s (exit %d)", py, rc);
    else is_int(rc, 0, "torch reads our file back (check_safetensors_torch.py)");
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-interop")) {
        char err[256];
        ps_st_writer_t *w = interop_writer();
        int rc = w ? ps_st_writer_save(w, argv[2], err, sizeof err) : PS_ENOMEM;
        ps_st_writer_destroy(&w);
        return rc ? 1 : 0;
    }
    char dir[] = "/tmp/test_st.XXXXXX";
    if (!mkdtemp(dir)) tap_skip_all("mkdtemp: %s", strerror(errno));
    ok(ps_st_dtype_size(PS_ST_BF16) == 2 && ps_st_dtype_size(PS_ST_F64) == 8 &&
       ps_st_dtype_size((ps_st_dtype_t)42) == 0, "dtype sizes");
    check_golden("st_torch");
    check_golden("st_spaced");
    test_reject();
    test_truncate_fuzz();
    test_exact_bytes(dir);
    test_roundtrip(dir);
    test_writer_errors();
    test_crash_safe(dir);
    test_torch_interop(dir);
    rmdir(dir);
    return tap_done();
}
