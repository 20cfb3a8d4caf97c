/* safetensors reader (mmap, full validation) and atomic writer.
 *
 * The reader follows the rules of the reference implementation
 * (huggingface/safetensors, Rust): header length capped at PS_ST_MAX_HEADER
 * and inside the file, header is a JSON object starting with '{', every
 * entry's byte size equals numel * dtype size, and the entries sorted by
 * offset tile the data section exactly (first begins at 0, each begins where
 * the previous ended, the last ends at the end of the file).  On top of that
 * it rejects duplicate names (serde would silently keep one) and trailing
 * garbage after the JSON (only the writer's space padding is allowed).
 *
 * Data pointers returned by ps_st_tensor_data() are NOT necessarily aligned:
 * a file written by another tool may have a header length that is not a
 * multiple of 8, and the writer keeps tensors in the order they were added.
 * Read through memcpy (ps_st_read_f32 does). */
#include "ps_safetensors.h"
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"
#include "ps_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [PS_ST_F32] = {"F32", 4}, [PS_ST_F16] = {"F16", 2}, [PS_ST_BF16] = {"BF16", 2},
    [PS_ST_F64] = {"F64", 8}, [PS_ST_I64] = {"I64", 8}, [PS_ST_I32] = {"I32", 4},
    [PS_ST_I16] = {"I16", 2}, [PS_ST_I8] = {"I8", 1},   [PS_ST_U8] = {"U8", 1},
    [PS_ST_BOOL] = {"BOOL", 1},
};
#define NDTYPES ((int)(sizeof dtype_info / sizeof dtype_info[0]))

size_t ps_st_dtype_size(ps_st_dtype_t dt)
{
    return (int)dt >= 0 && (int)dt < NDTYPES ? dtype_info[dt].size : 0;
}

const char *ps_st_dtype_name(ps_st_dtype_t dt)
{
    return (int)dt >= 0 && (int)dt < NDTYPES ? dtype_info[dt].name : "?";
}

static int dtype_from_name(const char *s, ps_st_dtype_t *dt)
{
    for (int i = 0; i < NDTYPES; i++)
        if (!strcmp(s, dtype_info[i].name)) {
            *dt = (ps_st_dtype_t)i;
            return 0;
        }
    return -1;
}

/* Format into the caller's buffer (may be NULL) and log at error level, so
 * the cause is recorded where it happens even when the caller drops err. */
#define fail(code, err, errlen, ...) ps_fail((code), (err), (errlen), __VA_ARGS__)

/* ---- reader --------------------------------------------------------------- */

/* A JSON number that is an exact non-negative integer below 2^53 (beyond
 * that a double cannot say which integer was written). */
static int json_uint(const cJSON *n, uint64_t *out)
{
    if (!cJSON_IsNumber(n)) return -1;
    double d = n->valuedouble;
    if (!isfinite(d) || d < 0 || d > 9007199254740992.0 || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int cmp_offset(const void *a, const void *b)
{
    const ps_st_tensor_t *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_nameptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_parsed(ps_st_file_t *f)
{
    for (size_t i = 0; i < f->ntensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
}

static int parse_meta(ps_st_file_t *f, const cJSON *m, char *err, size_t errlen)
{
    if (cJSON_IsNull(m)) return 0; /* the reference reads it as Option<..> */
    if (!cJSON_IsObject(m))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: __metadata__ is not an object");
    size_t n = (size_t)cJSON_GetArraySize(m), i = 0;
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_vals = calloc(n ? n : 1, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory");
    for (const cJSON *kv = m->child; kv; kv = kv->next, i++) {
        if (!cJSON_IsString(kv))
            return fail(PS_ECORRUPT, err, errlen,
                        "safetensors: __metadata__ value for key \"%.64s\" is not a string",
                        kv->string);
        f->meta_keys[i] = strdup(kv->string);
        f->meta_vals[i] = strdup(kv->valuestring);
        f->nmeta = i + 1;
        if (!f->meta_keys[i] || !f->meta_vals[i])
            return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory");
        for (size_t j = 0; j < i; j++)
            if (!strcmp(f->meta_keys[j], kv->string))
                return fail(PS_ECORRUPT, err, errlen,
                            "safetensors: duplicate __metadata__ key \"%.64s\"", kv->string);
    }
    return 0;
}

static int parse_entry(ps_st_tensor_t *t, const cJSON *e, size_t data_len, char *err,
                       size_t errlen)
{
    const char *nm = e->string;
    if (!cJSON_IsObject(e))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: entry \"%.64s\" is not an object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": dtype missing or not a string", nm);
    if (dtype_from_name(dt->valuestring, &t->dtype))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": unsupported dtype \"%.16s\"",
                    nm, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": shape missing or not an array", nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > PS_ST_MAX_DIMS)
        return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": %d dims (max %d)", nm, nd,
                    PS_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        uint64_t v;
        if (json_uint(x, &v))
            return fail(PS_ECORRUPT, err, errlen,
                        "safetensors: \"%.64s\": shape[%d] is not a non-negative integer", nm, d);
        t->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel))
            return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": shape product overflows", nm);
    }
    uint64_t nbytes, b, en;
    if (__builtin_mul_overflow(numel, (uint64_t)ps_st_dtype_size(t->dtype), &nbytes))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": byte size overflows", nm);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || json_uint(off->child, &b) ||
        json_uint(off->child->next, &en))
        return fail(PS_ECORRUPT, err, errlen,
                    "safetensors: \"%.64s\": data_offsets must be [begin, end] integers", nm);
    if (b > en)
        return fail(PS_ECORRUPT, err, errlen, "safetensors: \"%.64s\": data_offsets [%llu, %llu] end before begin",
                    nm, (unsigned long long)b, (unsigned long long)en);
    if (en > data_len)
        return fail(PS_ECORRUPT, err, errlen,
                    "safetensors: \"%.64s\": data_offsets [%llu, %llu] outside data section of %zu bytes",
                    nm, (unsigned long long)b, (unsigned long long)en, data_len);
    if (en - b != nbytes)
        return fail(PS_ECORRUPT, err, errlen,
                    "safetensors: \"%.64s\": %llu bytes in data_offsets but shape x %s needs %llu",
                    nm, (unsigned long long)(en - b), ps_st_dtype_name(t->dtype),
                    (unsigned long long)nbytes);
    t->offset = (size_t)b;
    t->nbytes = (size_t)nbytes;
    t->name = strdup(nm);
    if (!t->name) return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory");
    return 0;
}

/* Validate header entries and fill f (whose map/data fields are set). */
static int parse_header(ps_st_file_t *f, const cJSON *root, char *err, size_t errlen)
{
    size_t n = 0;
    int seen_meta = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__")) n++;
        else if (seen_meta++)
            return fail(PS_ECORRUPT, err, errlen, "safetensors: duplicate __metadata__");
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory");
    for (const cJSON *e = root->child; e; e = e->next) {
        int rc;
        if (!strcmp(e->string, "__metadata__")) rc = parse_meta(f, e, err, errlen);
        else {
            rc = parse_entry(&f->tensors[f->ntensors], e, f->data_len, err, errlen);
            if (!rc) f->ntensors++;
        }
        if (rc) return rc;
    }
    /* Duplicate names: cJSON keeps both, serde would keep one silently. */
    if (n > 1) {
        char **names = malloc(n * sizeof *names);
        if (!names) return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory");
        for (size_t i = 0; i < n; i++) names[i] = f->tensors[i].name;
        qsort(names, n, sizeof *names, cmp_nameptr);
        for (size_t i = 1; i < n; i++)
            if (!strcmp(names[i - 1], names[i])) {
                int rc = fail(PS_ECORRUPT, err, errlen, "safetensors: duplicate tensor name \"%.64s\"",
                              names[i]);
                free(names);
                return rc;
            }
        free(names);
    }
    qsort(f->tensors, n, sizeof *f->tensors, cmp_offset);
    size_t end = 0;
    for (size_t i = 0; i < n; i++) {
        if (f->tensors[i].offset != end)
            return fail(PS_ECORRUPT, err, errlen,
                        "safetensors: \"%.64s\" begins at %zu but the previous tensor ends at %zu (%s)",
                        f->tensors[i].name, f->tensors[i].offset, end,
                        f->tensors[i].offset < end ? "overlap" : "gap");
        end += f->tensors[i].nbytes;
    }
    if (end != f->data_len)
        return fail(PS_ECORRUPT, err, errlen,
                    "safetensors: tensors cover %zu bytes but the data section has %zu", end,
                    f->data_len);
    return 0;
}

int ps_st_parse(ps_st_file_t *f, const void *buf, size_t len, char *err, size_t errlen)
{
    const uint8_t *p = buf;
    memset(f, 0, sizeof *f);
    if (err && errlen) err[0] = 0;
    if (!buf || len < 8)
        return fail(PS_ECORRUPT, err, errlen, "safetensors: %zu bytes, too short for a header", len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > PS_ST_MAX_HEADER)
        return fail(PS_ECORRUPT, err, errlen, "safetensors: header length %llu over the %u-byte cap",
                    (unsigned long long)hlen, PS_ST_MAX_HEADER);
    if (hlen > len - 8)
        return fail(PS_ECORRUPT, err, errlen,
                    "safetensors: header length %llu but only %zu bytes follow (truncated?)",
                    (unsigned long long)hlen, len - 8);
    if (hlen < 2 || p[8] != '{')
        return fail(PS_ECORRUPT, err, errlen, "safetensors: header does not start with '{'");
    /* cJSON wants a NUL-terminated string; an embedded NUL would silently
     * cut the header short, so refuse it. */
    if (memchr(p + 8, 0, hlen))
        return fail(PS_ECORRUPT, err, errlen, "safetensors: NUL byte inside the JSON header");
    char *js = malloc(hlen + 1);
    if (!js) return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory for a %llu-byte header",
                         (unsigned long long)hlen);
    memcpy(js, p + 8, hlen);
    js[hlen] = 0;
    const char *endp = NULL;
    cJSON *root = cJSON_ParseWithOpts(js, &endp, 1);
    if (!root) {
        size_t at = endp && endp >= js ? (size_t)(endp - js) : 0;
        free(js);
        return fail(PS_ECORRUPT, err, errlen, "safetensors: header is not valid JSON (near byte %zu)",
                    at);
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = fail(PS_ECORRUPT, err, errlen, "safetensors: header is not a JSON object");
    } else {
        f->data = p + 8 + hlen;
        f->data_len = len - 8 - (size_t)hlen;
        rc = parse_header(f, root, err, errlen);
    }
    cJSON_Delete(root);
    free(js);
    if (rc) {
        free_parsed(f);
        memset(f, 0, sizeof *f);
    }
    return rc;
}

int ps_st_open(ps_st_file_t *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(PS_EIO, err, errlen, "safetensors: open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return fail(PS_EIO, err, errlen, "safetensors: stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(PS_EIO, err, errlen, "safetensors: %s is not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    if (len < 8) {
        close(fd);
        return fail(PS_ECORRUPT, err, errlen, "safetensors: %s: %zu bytes, too short for a header",
                    path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return fail(PS_EIO, err, errlen, "safetensors: mmap %s: %s", path, strerror(e));
    int rc = ps_st_parse(f, map, len, err, errlen);
    if (rc) {
        munmap(map, len);
        /* Name the file: ps_st_parse cannot. */
        if (err && errlen) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s: %s", path, err);
            snprintf(err, errlen, "%s", tmp);
        }
        return rc;
    }
    f->map = map;
    f->map_len = len;
    return 0;
}

void ps_st_close(ps_st_file_t *f)
{
    if (!f) return;
    free_parsed(f);
    if (f->map) munmap(f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

const ps_st_tensor_t *ps_st_find(const ps_st_file_t *f, const char *name)
{
    for (size_t i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const void *ps_st_tensor_data(const ps_st_file_t *f, const ps_st_tensor_t *t)
{
    return f->data + t->offset;
}

const char *ps_st_meta(const ps_st_file_t *f, const char *key)
{
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

int ps_st_read_f32(const ps_st_file_t *f, const char *name, float *dst, size_t numel, char *err,
                   size_t errlen)
{
    const ps_st_tensor_t *t = ps_st_find(f, name);
    if (!t) return fail(PS_ENOTFOUND, err, errlen, "safetensors: no tensor \"%.64s\"", name);
    size_t es = ps_st_dtype_size(t->dtype), n = t->nbytes / es;
    if (n != numel)
        return fail(PS_EMISMATCH, err, errlen,
                    "safetensors: \"%.64s\" has %zu elements, caller expects %zu", name, n, numel);
    const uint8_t *s = ps_st_tensor_data(f, t);
    switch (t->dtype) {
    case PS_ST_F32:
        memcpy(dst, s, n * 4);
        break;
    case PS_ST_F16:
    case PS_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(s[2 * i] | s[2 * i + 1] << 8);
            dst[i] = t->dtype == PS_ST_F16 ? ps_fp16_to_fp32_1(h) : ps_bf16_to_fp32_1(h);
        }
        break;
    case PS_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, s + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    default:
        return fail(PS_EMISMATCH, err, errlen, "safetensors: \"%.64s\" is %s, not a float type", name,
                    ps_st_dtype_name(t->dtype));
    }
    return 0;
}

/* ---- writer --------------------------------------------------------------- */

typedef struct st_wentry {
    char *name;
    ps_st_dtype_t dtype;
    int ndim;
    int64_t shape[PS_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} st_wentry_t;

struct ps_st_writer {
    st_wentry_t *e;
    size_t n, cap;
    char **mk, **mv;
    size_t nmeta;
};

ps_st_writer_t *ps_st_writer_new(void)
{
    ps_st_writer_t *w = calloc(1, sizeof *w);
    if (!w) ps_error("safetensors: out of memory");
    return w;
}

void ps_st_writer_destroy(ps_st_writer_t **wp)
{
    if (!wp || !*wp) return;
    ps_st_writer_t *w = *wp;
    for (size_t i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    for (size_t i = 0; i < w->nmeta; i++) {
        free(w->mk[i]);
        free(w->mv[i]);
    }
    free(w->mk);
    free(w->mv);
    free(w);
    *wp = NULL;
}

int ps_st_writer_add(ps_st_writer_t *w, const char *name, ps_st_dtype_t dt, int ndim,
                     const int64_t *shape, const void *data)
{
    if (!w || !name || !strcmp(name, "__metadata__") || ps_st_dtype_size(dt) == 0 || ndim < 0 ||
        ndim > PS_ST_MAX_DIMS || (ndim > 0 && !shape)) {
        ps_error("safetensors: bad tensor \"%.64s\" (dtype %d, ndim %d)", name ? name : "(null)",
                 (int)dt, ndim);
        return PS_EINVAL;
    }
    size_t numel = 1, nbytes;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(numel, (size_t)shape[d], &numel)) {
            ps_error("safetensors: \"%.64s\": bad shape[%d] = %lld", name, d, (long long)shape[d]);
            return PS_EINVAL;
        }
    }
    if (__builtin_mul_overflow(numel, ps_st_dtype_size(dt), &nbytes) || (nbytes && !data)) {
        ps_error("safetensors: \"%.64s\": byte size overflows or data is NULL", name);
        return PS_EINVAL;
    }
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name)) {
            ps_error("safetensors: duplicate tensor name \"%.64s\"", name);
            return PS_EINVAL;
        }
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_wentry_t *e = realloc(w->e, cap * sizeof *e);
        if (!e) return PS_ENOMEM;
        w->e = e;
        w->cap = cap;
    }
    st_wentry_t *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return PS_ENOMEM;
    e->dtype = dt;
    e->ndim = ndim;
    if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->data = data;
    e->nbytes = nbytes;
    w->n++;
    return 0;
}

int ps_st_writer_meta(ps_st_writer_t *w, const char *key, const char *value)
{
    if (!w || !key || !value) return PS_EINVAL;
    for (size_t i = 0; i < w->nmeta; i++)
        if (!strcmp(w->mk[i], key)) { /* last value wins */
            char *v = strdup(value);
            if (!v) return PS_ENOMEM;
            free(w->mv[i]);
            w->mv[i] = v;
            return 0;
        }
    char **mk = realloc(w->mk, (w->nmeta + 1) * sizeof *mk);
    if (!mk) return PS_ENOMEM;
    w->mk = mk;
    char **mv = realloc(w->mv, (w->nmeta + 1) * sizeof *mv);
    if (!mv) return PS_ENOMEM;
    w->mv = mv;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return PS_ENOMEM;
    }
    w->mk[w->nmeta] = k;
    w->mv[w->nmeta] = v;
    w->nmeta++;
    return 0;
}

/* Growable text buffer for the header. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* JSON string: escape quote, backslash and control bytes; UTF-8 passes through. */
static void sb_json_str(sbuf_t *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* The header exactly as the reference writer lays it out: compact JSON,
 * __metadata__ first, then tensors in data order, padded with spaces so the
 * data section starts at a multiple of 8. */
static int build_header(const ps_st_writer_t *w, sbuf_t *b)
{
    size_t off = 0;
    sb_put(b, "{", 1);
    if (w->nmeta) {
        sb_put(b, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i) sb_put(b, ",", 1);
            sb_json_str(b, w->mk[i]);
            sb_put(b, ":", 1);
            sb_json_str(b, w->mv[i]);
        }
        sb_put(b, "}", 1);
    }
    for (size_t i = 0; i < w->n; i++) {
        const st_wentry_t *e = &w->e[i];
        if (i || w->nmeta) sb_put(b, ",", 1);
        sb_json_str(b, e->name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", ps_st_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) sb_printf(b, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        sb_printf(b, "],\"data_offsets\":[%zu,%zu]}", off, off + e->nbytes);
        off += e->nbytes;
    }
    sb_put(b, "}", 1);
    while (!b->oom && b->len % 8) sb_put(b, " ", 1);
    return b->oom ? PS_ENOMEM : 0;
}

int ps_st_writer_save(ps_st_writer_t *w, const char *path, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!w || !path) return fail(PS_EINVAL, err, errlen, "safetensors: save without writer or path");
    sbuf_t hb = {0};
    if (build_header(w, &hb)) {
        free(hb.p);
        return fail(PS_ENOMEM, err, errlen, "safetensors: out of memory building the header");
    }
    if (hb.len > PS_ST_MAX_HEADER) {
        free(hb.p);
        return fail(PS_EINVAL, err, errlen, "safetensors: %s: header of %zu bytes over the cap", path,
                    hb.len);
    }
    uint8_t lenle[8];
    for (int i = 0; i < 8; i++) lenle[i] = (uint8_t)((uint64_t)hb.len >> (8 * i));
    size_t n = w->n + 2;
    const void **bufs = malloc(sizeof *bufs * n);
    size_t *lens = malloc(sizeof *lens * n);
    int rc;
    if (!bufs || !lens) {
        rc = fail(PS_ENOMEM, err, errlen, "safetensors: out of memory saving %s", path);
    } else {
        bufs[0] = lenle, lens[0] = 8;
        bufs[1] = hb.p, lens[1] = hb.len;
        for (size_t i = 0; i < w->n; i++) bufs[i + 2] = w->e[i].data, lens[i + 2] = w->e[i].nbytes;
        rc = ps_write_file_atomic(path, bufs, lens, n, "safetensors", err, errlen);
    }
    free(bufs);
    free(lens);
    free(hb.p);
    return rc;
}
