/* Flags and INI-style config files (see ps_config.h for the format).
 *
 * Messages go to stderr as "prog: what" (or "file:line: what") because they
 * are for the person who typed the command, not for the log; the last one is
 * also kept for tests (ps_config_last_error). */
#include "ps_config.h"

#include "ps_error.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static __thread char last_error[512];

const char *ps_config_last_error(void)
{
    return last_error;
}

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", last_error);
    return PS_EINVAL;
}

typedef struct cfg_ctx {
    const ps_opt_t *opts;
} cfg_ctx_t;

/* '-' and '_' are the same in names: --partition-bytes == partition_bytes */
static int name_eq(const char *a, const char *b, size_t blen)
{
    size_t i = 0;
    for (; i < blen && a[i]; i++) {
        char x = a[i] == '-' ? '_' : a[i], y = b[i] == '-' ? '_' : b[i];
        if (x != y) return 0;
    }
    return i == blen && !a[i];
}

static int find_opt(const ps_opt_t *opts, const char *name, size_t len)
{
    for (int i = 0; opts[i].name; i++)
        if (name_eq(opts[i].name, name, len)) return i;
    return -1;
}

static int parse_bool(const char *v, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i])) return *out = 1, 0;
        if (!strcasecmp(v, no[i])) return *out = 0, 0;
    }
    return -1;
}

/* Set option i from text v; where says who asked ("--port" or "f.ini:3"). */
static int set_value(cfg_ctx_t *cx, int i, const char *v, const char *where)
{
    const ps_opt_t *o = &cx->opts[i];
    char *end;
    errno = 0;
    switch (o->type) {
    case PS_OPT_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end) return fail("%s: '%s' is not an integer", where, v);
        if (errno == ERANGE || x < INT_MIN || x > INT_MAX)
            return fail("%s: %s is out of range for an int (%d..%d)", where, v, INT_MIN, INT_MAX);
        *(int *)o->dst = (int)x;
        return 0;
    }
    case PS_OPT_UINT64: {
        const char *p = v;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '-') return fail("%s: '%s' must not be negative", where, v);
        unsigned long long x = strtoull(p, &end, 10);
        if (end == p) return fail("%s: '%s' is not a non-negative integer", where, v);
        if (errno == ERANGE) return fail("%s: %s is out of range for a 64-bit count", where, v);
        /* binary size suffix: K, M, G, T, optionally followed by "iB" */
        static const char sfx[] = "KMGT";
        const char *s = *end ? strchr(sfx, *end) : NULL;
        if (s) {
            int shift = 10 * (int)(s - sfx + 1);
            if (x > (UINT64_MAX >> shift)) return fail("%s: %s overflows 64 bits", where, v);
            x <<= shift;
            end++;
            if (!strcmp(end, "iB")) end += 2;
        }
        if (*end) return fail("%s: '%s' is not a non-negative integer (suffixes: K M G T, KiB MiB GiB TiB)", where, v);
        *(uint64_t *)o->dst = x;
        return 0;
    }
    case PS_OPT_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end) return fail("%s: '%s' is not a number", where, v);
        /* overflow gives Inf; underflow to a tiny or zero value is accepted */
        if (!isfinite(x)) return fail("%s: %s is not a finite float", where, v);
        *(float *)o->dst = x;
        return 0;
    }
    case PS_OPT_STRING: {
        char *s = strdup(v);
        if (!s) return fail("%s: out of memory", where), PS_ENOMEM;
        /* the old value is the caller's strdup'd default or an earlier
         * setting (file, then flag): replacing it must not leak it */
        free(*(char **)o->dst);
        *(char **)o->dst = s;
        return 0;
    }
    case PS_OPT_BOOL: {
        int b;
        if (parse_bool(v, &b)) return fail("%s: '%s' is not a boolean (true/false, yes/no, on/off, 1/0)", where, v);
        *(int *)o->dst = b;
        return 0;
    }
    }
    return fail("%s: option '%s' has an unknown type %d", where, o->name, (int)o->type);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) *--e = 0;
    return s;
}

/* Value part of "key = value": a double-quoted value is taken literally;
 * otherwise a '#' or ';' preceded by whitespace starts a comment. */
static int file_value(char *v, char **out)
{
    v = trim(v);
    if (*v == '"') {
        char *q = strchr(v + 1, '"');
        if (!q) return -1;
        char *after = trim(q + 1);
        if (*after && *after != '#' && *after != ';') return -1;
        *q = 0;
        *out = v + 1;
        return 0;
    }
    for (char *p = v; *p; p++)
        if ((*p == '#' || *p == ';') && p > v && (p[-1] == ' ' || p[-1] == '\t')) {
            *p = 0;
            break;
        }
    *out = trim(v);
    return 0;
}

static int load_file(cfg_ctx_t *cx, const char *prog, const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp) return fail("%s: cannot open config file: %s", path, strerror(errno));
    char *line = NULL, where[600];
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0, active = 1; /* keys before any section apply */
    while (!rc && (n = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if ((size_t)n != strlen(line)) {
            rc = fail("%s: line contains a NUL byte", where);
            break;
        }
        char *s = line;
        if (lineno == 1 && !strncmp(s, "\xef\xbb\xbf", 3)) s += 3; /* UTF-8 BOM */
        s = trim(s);
        if (!*s || *s == '#' || *s == ';') continue;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (!e || *trim(e + 1)) {
                rc = fail("%s: malformed section header '%s'", where, s);
                break;
            }
            *e = 0;
            char *sec = trim(s + 1);
            if (!*sec) {
                rc = fail("%s: empty section name", where);
                break;
            }
            active = prog && !strcmp(sec, prog);
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = fail("%s: expected 'key = value', got '%s'", where, s);
            break;
        }
        *eq = 0;
        char *key = trim(s), *val;
        if (!*key) {
            rc = fail("%s: missing key before '='", where);
            break;
        }
        if (file_value(eq + 1, &val)) {
            rc = fail("%s: unterminated or trailing text after quoted value of '%s'", where, key);
            break;
        }
        if (!active) continue; /* another program's section */
        int i = find_opt(cx->opts, key, strlen(key));
        if (i < 0) {
            rc = fail("%s: unknown key '%s'", where, key);
            break;
        }
        rc = set_value(cx, i, val, where);
    }
    if (!rc && ferror(fp)) rc = fail("%s: read error: %s", path, strerror(errno));
    free(line);
    fclose(fp);
    return rc;
}

static int ctx_init(cfg_ctx_t *cx, const ps_opt_t *opts)
{
    cx->opts = opts;
    return 0;
}

int ps_config_load_file(const ps_opt_t *opts, const char *prog, const char *path)
{
    cfg_ctx_t cx;
    if (ctx_init(&cx, opts)) return PS_ENOMEM;
    return load_file(&cx, prog, path);
}

int ps_config_defaults(const ps_opt_t *opts)
{
    cfg_ctx_t cx;
    char where[160];
    if (ctx_init(&cx, opts)) return PS_ENOMEM;
    for (int i = 0; opts[i].name; i++) {
        if (!opts[i].def) continue;
        snprintf(where, sizeof where, "default of --%s", opts[i].name);
        int rc = set_value(&cx, i, opts[i].def, where);
        if (rc) return rc;
    }
    return 0;
}

void ps_config_free(const ps_opt_t *opts)
{
    for (int i = 0; opts[i].name; i++)
        if (opts[i].type == PS_OPT_STRING) {
            free(*(char **)opts[i].dst);
            *(char **)opts[i].dst = NULL;
        }
}

static void print_default(FILE *fp, const ps_opt_t *o)
{
    switch (o->type) {
    case PS_OPT_INT: fprintf(fp, "%d", *(int *)o->dst); break;
    case PS_OPT_UINT64: fprintf(fp, "%llu", (unsigned long long)*(uint64_t *)o->dst); break;
    case PS_OPT_FLOAT: fprintf(fp, "%g", (double)*(float *)o->dst); break;
    case PS_OPT_STRING: {
        const char *s = *(char **)o->dst;
        fprintf(fp, s ? "\"%s\"" : "none", s);
        break;
    }
    case PS_OPT_BOOL: fputs(*(int *)o->dst ? "true" : "false", fp); break;
    }
}

void ps_config_usage(const ps_opt_t *opts, const char *prog, const char *usage)
{
    static const char *meta[] = {"N", "N", "X", "STR", ""};
    FILE *fp = stdout;
    fprintf(fp, "Usage: %s %s\n\nOptions:\n", prog, usage ? usage : "[options]");
    for (int i = 0; opts[i].name; i++) {
        char flag[128];
        const ps_opt_t *o = &opts[i];
        if (o->type == PS_OPT_BOOL) snprintf(flag, sizeof flag, "--[no-]%s", o->name);
        else snprintf(flag, sizeof flag, "--%s %s", o->name, meta[o->type <= PS_OPT_BOOL ? o->type : 0]);
        fprintf(fp, "  %-28s %s (default: ", flag, o->help ? o->help : "");
        print_default(fp, o);
        fputs(")\n", fp);
    }
    fprintf(fp, "  %-28s %s\n  %-28s %s\n", "--config FILE",
            "read 'key = value' lines first ([" "section" "] per program); flags win", "--help",
            "print this help");
    fflush(fp);
}

/* 1 if arg is "--name" (no '=') for a known non-boolean option */
static int takes_separate_value(const ps_opt_t *opts, const char *arg)
{
    if (arg[0] != '-' || arg[1] != '-' || strchr(arg, '=')) return 0;
    int i = find_opt(opts, arg + 2, strlen(arg + 2));
    return i >= 0 && opts[i].type != PS_OPT_BOOL;
}

/* Value of --name: inline after '=' or the next argument. */
static const char *flag_value(int argc, char **argv, int *k, const char *eq, const char *prog,
                              const char *flag, int *rc)
{
    if (eq) return eq + 1;
    if (*k + 1 >= argc || (argv[*k + 1][0] == '-' && argv[*k + 1][1] == '-')) {
        *rc = fail("%s: flag '%s' needs a value", prog, flag);
        return NULL;
    }
    return argv[++*k];
}

int ps_config_parse(const ps_opt_t *opts, const char *prog, const char *usage, int argc,
                    char **argv, int *npos)
{
    int rc = 0, n = 0;
    char where[400], flag[200];
    if (npos) *npos = 0;
    if (!prog) prog = "ps";
    /* --help first (it wins over errors elsewhere), then config files, so
     * flags given anywhere on the line override them */
    for (int k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "--")) break;
        if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h")) {
            ps_config_usage(opts, prog, usage);
            return 1;
        }
    }
    cfg_ctx_t cx;
    if (ctx_init(&cx, opts)) return PS_ENOMEM;
    for (int k = 1; k < argc && !rc; k++) {
        if (!strcmp(argv[k], "--")) break;
        if (!strcmp(argv[k], "--config") || !strncmp(argv[k], "--config=", 9)) {
            const char *path = flag_value(argc, argv, &k, argv[k][8] ? argv[k] + 8 : NULL, prog, "--config", &rc);
            if (path && !*path) rc = fail("%s: --config: empty file name", prog);
            else if (path) rc = load_file(&cx, prog, path);
        } else if (takes_separate_value(opts, argv[k])) {
            k++; /* a flag's value is never a --config (e.g. --name --config) */
        }
    }

    char **pos = calloc(argc + 1, sizeof *pos), **rest = calloc(argc + 1, sizeof *rest);
    int nrest = 0;
    if (!pos || !rest) rc = rc ? rc : PS_ENOMEM;
    for (int k = 1; k < argc && !rc; k++) {
        char *a = argv[k];
        if (!strcmp(a, "--")) {
            rest[nrest++] = a;
            while (++k < argc) pos[n++] = argv[k];
            break;
        }
        if (a[0] != '-' || !strcmp(a, "-")) {
            pos[n++] = a;
            continue;
        }
        rest[nrest++] = a;
        if (a[1] != '-' || !a[2]) {
            rc = fail("%s: unknown flag '%s' (flags are --name; see --help)", prog, a);
            break;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (len == 6 && !strncmp(name, "config", 6)) {
            if (!eq) k++; /* loaded above */
            if (!eq && k < argc) rest[nrest++] = argv[k];
            continue;
        }
        int i = find_opt(opts, name, len), neg = 0;
        if (i < 0 && len > 3 && !strncmp(name, "no-", 3)) {
            i = find_opt(opts, name + 3, len - 3);
            neg = 1;
            if (i >= 0 && opts[i].type != PS_OPT_BOOL) {
                rc = fail("%s: '--%.*s' is not a boolean flag", prog, (int)(len - 3), name + 3);
                break;
            }
            if (i >= 0 && eq) {
                rc = fail("%s: '%s' takes no value", prog, a);
                break;
            }
        }
        if (i < 0) {
            rc = fail("%s: unknown flag '--%.*s' (see --help)", prog, (int)len, name);
            break;
        }
        snprintf(flag, sizeof flag, "--%s", opts[i].name);
        snprintf(where, sizeof where, "%s: %s", prog, flag);
        if (opts[i].type == PS_OPT_BOOL && !eq) {
            *(int *)opts[i].dst = !neg;
            continue;
        }
        const char *v = flag_value(argc, argv, &k, eq, prog, flag, &rc);
        if (!v) break;
        if (!eq) rest[nrest++] = argv[k];
        rc = set_value(&cx, i, v, where);
    }
    if (!rc) {
        /* positional arguments to argv[1..n], flags after them */
        for (int k = 0; k < n; k++) argv[1 + k] = pos[k];
        for (int k = 0; k < nrest; k++) argv[1 + n + k] = rest[k];
        if (npos) *npos = n;
    }
    free(pos);
    free(rest);
    return rc;
}
