/* Class-name files and annotation CSVs to video lists (labels.h). */
#include "worker/data/labels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps_error.h"
#include "ps_util.h"
#include "ps_log.h"
#include "worker/data/ps_image.h"
#include "worker/data/video_list.h"

#define MAX_FIELDS 64
#define MISSING_NAMED 10   /* missing videos named one by one; the rest counted */

/* ---- class names ------------------------------------------------------------------ */

static void chomp(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
}

void ps_class_names_free(ps_class_names_t **cp)
{
    ps_class_names_t *c = *cp;
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->name[i]);
    free(c->name);
    free(c);
    *cp = NULL;
}

int ps_class_names_find(const ps_class_names_t *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->name[i], name)) return i;
    return -1;
}

static int add_name(ps_class_names_t *c, const char *name)
{
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 16;
        char **nn = realloc(c->name, sizeof *nn * (size_t)nc);
        if (!nn) return PS_ENOMEM;
        c->name = nn;
        c->cap = nc;
    }
    if (!(c->name[c->n] = strdup(name))) return PS_ENOMEM;
    c->n++;
    return 0;
}

int ps_class_names_load(const char *path, ps_class_names_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        ps_errf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    ps_class_names_t *c = calloc(1, sizeof *c);
    char *line = NULL;
    size_t cap = 0;
    int rc = c ? 0 : PS_ENOMEM, lineno = 0, blank_at = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0) {
        lineno++;
        chomp(line);
        if (!*line) { if (!blank_at) blank_at = lineno; continue; }
        if (blank_at) {
            ps_errf(err, errlen, "%s:%d: empty class name (class i is line i + 1, so no blank lines "
                    "between names)", path, blank_at);
            rc = PS_EINVAL;
        } else if (ps_class_names_find(c, line) >= 0) {
            ps_errf(err, errlen, "%s:%d: class '%s' is named twice (first on line %d)", path, lineno, line,
                    ps_class_names_find(c, line) + 1);
            rc = PS_EINVAL;
        } else if (add_name(c, line) < 0) {
            rc = PS_ENOMEM;
        }
    }
    free(line);
    fclose(f);
    if (rc == 0 && (!c || c->n == 0)) {
        ps_errf(err, errlen, "%s: no class names", path);
        rc = PS_EINVAL;
    }
    if (rc == PS_ENOMEM) ps_errf(err, errlen, "out of memory");
    if (rc < 0) { ps_class_names_free(&c); return rc; }
    *out = c;
    return 0;
}

int ps_class_names_load_n(const char *path, int n, ps_class_names_t **out, char *err, size_t errlen)
{
    int rc = ps_class_names_load(path, out, err, errlen);
    if (rc == 0 && (*out)->n != n) {
        ps_errf(err, errlen, "%s names %d classes, the model has %d", path, (*out)->n, n);
        ps_class_names_free(out);
        rc = PS_EMISMATCH;
    }
    return rc;
}

void ps_csv_put_name(FILE *f, const ps_class_names_t *c, int cls)
{
    fputs(",\"", f);
    for (const char *q = cls >= 0 && cls < c->n ? c->name[cls] : ""; *q; q++) {
        if (*q == '"') fputc('"', f);
        fputc(*q, f);
    }
    fputc('"', f);
}

/* ---- CSV ------------------------------------------------------------------------- */

/* Splits a CSV line in place (RFC 4180 quotes, "" inside quotes): the
 * field count, or -1 for an unterminated quote. */
static int csv_split(char *s, char **field, int max)
{
    int n = 0;
    for (;;) {
        char *w = s;
        if (n < max) field[n] = s;
        n++;
        if (*s == '"') {
            for (s++;; s++) {
                if (!*s) return -1;
                if (*s == '"' && s[1] == '"') { *w++ = '"'; s++; continue; }
                if (*s == '"') { s++; break; }
                *w++ = *s;
            }
        }
        while (*s && *s != ',') *w++ = *s++;
        int end = !*s;
        *w = 0;
        if (end) return n;
        s++;
    }
}

typedef struct row {
    char *id, *label, *split;
    long start, end;       /* whole seconds, -1 if the CSV has none */
    int line;
    const char *csv;
} row_t;

typedef struct rows { row_t *r; size_t n, cap; } rows_t;

static int col(char **hdr, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(hdr[i], name)) return i;
    return -1;
}

static char *dup_field(char **f, int n, int c) { return strdup(c >= 0 && c < n ? f[c] : ""); }

/* The rows of one CSV, the file's name standing in for a split column. */
static int read_csv(const char *path, rows_t *rs, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ps_errf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    char *line = NULL, *hdr_line = NULL, *field[MAX_FIELDS], *hdr[MAX_FIELDS];
    size_t cap = 0;
    int lineno = 0, rc = 0, nh = 0, c_id = -1, c_lab = -1, c_s = -1, c_e = -1, c_split = -1;
    const char *base = strrchr(path, '/');
    char fname[256];
    snprintf(fname, sizeof fname, "%s", base ? base + 1 : path);
    char *dot = strrchr(fname, '.');
    if (dot && dot != fname) *dot = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0) {
        lineno++;
        chomp(line);
        if (!*line) continue;
        if (!hdr_line) {
            hdr_line = strdup(line);
            nh = hdr_line ? csv_split(hdr_line, hdr, MAX_FIELDS) : 0;
            if (nh > MAX_FIELDS) nh = MAX_FIELDS;
            c_id = col(hdr, nh, "youtube_id"), c_lab = col(hdr, nh, "label");
            c_s = col(hdr, nh, "time_start"), c_e = col(hdr, nh, "time_end"), c_split = col(hdr, nh, "split");
            if (c_id < 0) {
                ps_errf(err, errlen, "%s:%d: the header has no youtube_id column (expected Kinetics' "
                        "label,youtube_id,time_start,time_end,split)", path, lineno);
                rc = PS_EINVAL;
            }
            continue;
        }
        int n = csv_split(line, field, MAX_FIELDS);
        if (n < 0 || n != nh) {
            ps_errf(err, errlen, "%s:%d: %s", path, lineno, n < 0 ? "unterminated quote"
                    : "the number of fields differs from the header's");
            rc = PS_EINVAL;
            break;
        }
        if (rs->n == rs->cap) {
            size_t nc = rs->cap ? rs->cap * 2 : 1024;
            row_t *nr = realloc(rs->r, sizeof *nr * nc);
            if (!nr) { rc = PS_ENOMEM; break; }
            rs->r = nr;
            rs->cap = nc;
        }
        row_t *r = &rs->r[rs->n];
        r->id = dup_field(field, n, c_id);
        r->label = dup_field(field, n, c_lab);
        r->split = c_split >= 0 ? dup_field(field, n, c_split) : strdup(fname);
        r->start = c_s >= 0 ? (long)strtod(field[c_s], NULL) : -1;
        r->end = c_e >= 0 ? (long)strtod(field[c_e], NULL) : -1;
        r->line = lineno;
        r->csv = path;
        rs->n++;
        if (!r->id || !r->label || !r->split) { rc = PS_ENOMEM; break; }
        if (!*r->id || strchr(r->id, '/') || strchr(r->split, '/') || !strcmp(r->split, "..")) {
            ps_errf(err, errlen, "%s:%d: bad youtube_id '%s' or split '%s'", path, lineno, r->id, r->split);
            rc = PS_EINVAL;
        }
    }
    if (rc == PS_ENOMEM) ps_errf(err, errlen, "out of memory");
    if (rc == 0 && !hdr_line) {
        ps_errf(err, errlen, "%s: empty (no header)", path);
        rc = PS_EINVAL;
    }
    free(line);
    free(hdr_line);
    fclose(f);
    return rc;
}

/* ---- finding the videos --------------------------------------------------------------- */

/* Expands a name template for a row into buf; 0, or -1 when it uses
 * {start}/{end} and the CSV has no times. */
static int expand(const char *t, const row_t *r, const char *ext, char *buf, size_t n)
{
    size_t k = 0;
    char v[512];
    buf[0] = 0;
    while (*t && k + 1 < n) {
        const char *val = NULL;
        if (*t == '{') {
            const char *close = strchr(t, '}');
            size_t len = close ? (size_t)(close - t - 1) : 0;
            if (close && len == 2 && !strncmp(t + 1, "id", 2)) val = r->id;
            else if (close && len == 5 && !strncmp(t + 1, "label", 5)) val = r->label;
            else if (close && len == 5 && !strncmp(t + 1, "split", 5)) val = r->split;
            else if (close && len == 3 && !strncmp(t + 1, "ext", 3)) val = ext;
            else if (close && len == 6 && !strncmp(t + 1, "label_", 6)) {
                snprintf(v, sizeof v, "%s", r->label);
                for (char *c = v; *c; c++) if (*c == ' ') *c = '_';
                val = v;
            } else if (close && ((len == 5 && !strncmp(t + 1, "start", 5)) || (len == 3 && !strncmp(t + 1, "end", 3)))) {
                long s = t[1] == 's' ? r->start : r->end;
                if (s < 0) return -1;
                snprintf(v, sizeof v, "%06ld", s);
                val = v;
            }
            if (val) {
                k += (size_t)snprintf(buf + k, n - k, "%s", val);
                t = close + 1;
                continue;
            }
        }
        buf[k++] = *t++;
        buf[k] = 0;
    }
    return k + 1 < n ? 0 : -1;
}

static const char *const NAMES[] = { "{id}_{start}_{end}.{ext}", "{id}.{ext}" };
static const char *const DIRS[] = { "", "{label}/", "{label_}/", "{split}/", "{split}/{label}/",
                                    "{split}/{label_}/" };

/* The first candidate that exists under root, relative to it, in rel. */
static int find_video(const ps_csv_lists_opts_t *o, const row_t *r, char *rel, size_t n)
{
    char exts[256], cand[2048], path[4096];
    snprintf(exts, sizeof exts, "%s", o->ext ? o->ext : "mp4,webm,mkv,avi");
    struct stat st;
    for (size_t d = 0; d < (o->name ? 1 : sizeof DIRS / sizeof DIRS[0]); d++)
        for (size_t m = 0; m < (o->name ? 1 : sizeof NAMES / sizeof NAMES[0]); m++) {
            char tmpl[256], e[256], *save = NULL;
            snprintf(tmpl, sizeof tmpl, "%s%s", o->name ? "" : DIRS[d], o->name ? o->name : NAMES[m]);
            snprintf(e, sizeof e, "%s", exts);
            for (char *x = strtok_r(e, ",", &save); x; x = strtok_r(NULL, ",", &save)) {
                if (expand(tmpl, r, x, cand, sizeof cand) < 0) continue;
                snprintf(path, sizeof path, "%s/%s", o->root, cand);
                if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                    snprintf(rel, n, "%s", cand);
                    return 0;
                }
                if (!strstr(tmpl, "{ext}")) break;
            }
        }
    return -1;
}

/* ---- the lists -------------------------------------------------------------------- */

typedef struct text { char *split, *p; size_t n, cap; } text_t;

static int append(text_t *t, const char *line)
{
    size_t len = strlen(line);
    if (t->n + len + 1 > t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 4096;
        while (nc < t->n + len + 1) nc *= 2;
        char *np = realloc(t->p, nc);
        if (!np) return PS_ENOMEM;
        t->p = np;
        t->cap = nc;
    }
    memcpy(t->p + t->n, line, len + 1);
    t->n += len;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The classes: the file's, or the rows' labels in sorted order. */
static int classes_of(const ps_csv_lists_opts_t *o, const rows_t *rs, ps_class_names_t **cn, char *err,
                      size_t errlen)
{
    if (o->classes) return ps_class_names_load(o->classes, cn, err, errlen);
    char **lab = malloc(sizeof *lab * (rs->n ? rs->n : 1));
    ps_class_names_t *c = calloc(1, sizeof *c);
    int rc = lab && c ? 0 : PS_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; rc == 0 && i < rs->n; i++)
        if (*rs->r[i].label) lab[k++] = rs->r[i].label;
    if (rc == 0) qsort(lab, k, sizeof *lab, cmp_str);
    for (size_t i = 0; rc == 0 && i < k; i++)
        if (i == 0 || strcmp(lab[i], lab[i - 1])) rc = add_name(c, lab[i]);
    free(lab);
    if (rc == 0 && c->n == 0) {
        ps_errf(err, errlen, "%s: no labelled rows", o->csv);
        rc = PS_EINVAL;
    }
    if (rc == PS_ENOMEM) ps_errf(err, errlen, "out of memory");
    if (rc < 0) { ps_class_names_free(&c); return rc; }
    *cn = c;
    char path[4096];
    text_t t = { 0 };
    for (int i = 0; rc == 0 && i < c->n; i++)
        if ((rc = append(&t, c->name[i])) == 0) rc = append(&t, "\n");
    snprintf(path, sizeof path, "%s/classes.txt", o->out);
    if (rc == 0) rc = ps_write_file_atomic1(path, t.p, t.n, "lists", err, errlen);
    else ps_errf(err, errlen, "out of memory");
    free(t.p);
    if (rc == 0) ps_info("%d classes from the labels, written to %s", c->n, path);
    return rc;
}

/* Each row's line into its split's text. */
static int fill_lists(const ps_csv_lists_opts_t *o, const rows_t *rs, const ps_class_names_t *cn,
                      text_t **texts, int *nt, ps_csv_lists_stats_t *st, char *err, size_t errlen)
{
    char rel[2048], line[2200];
    for (size_t i = 0; i < rs->n; i++) {
        const row_t *r = &rs->r[i];
        if (!*r->label) { st->unlabelled++; continue; }
        int c = ps_class_names_find(cn, r->label);
        if (c < 0) {
            ps_errf(err, errlen, "%s:%d: label '%s' is not in the class-name file %s", r->csv, r->line,
                    r->label, o->classes);
            return PS_EINVAL;
        }
        if (find_video(o, r, rel, sizeof rel) < 0) {
            if (st->missing++ < MISSING_NAMED)
                ps_warn("%s:%d: no video for '%s' (%s, %ld-%ld s) under %s", r->csv, r->line, r->id,
                        r->label, r->start, r->end, o->root);
            continue;
        }
        int k = 0;
        while (k < *nt && strcmp((*texts)[k].split, r->split)) k++;
        if (k == *nt) {
            text_t *nt2 = realloc(*texts, sizeof **texts * (size_t)(*nt + 1));
            if (!nt2) return PS_ENOMEM;
            *texts = nt2;
            nt2[k] = (text_t){ r->split, NULL, 0, 0 };
            (*nt)++;
        }
        snprintf(line, sizeof line, "%s %d\n", rel, c);
        if (append(&(*texts)[k], line) < 0) return PS_ENOMEM;
        st->listed++;
    }
    return 0;
}

int ps_csv_to_lists(const ps_csv_lists_opts_t *o, ps_csv_lists_stats_t *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    if (!o->csv || !o->root || !o->out) {
        ps_errf(err, errlen, "needs --csv FILE[,FILE], --root DIR (where the videos are) and --out DIR");
        return PS_EINVAL;
    }
    rows_t rs = { 0 };
    ps_class_names_t *cn = NULL;
    text_t *texts = NULL;
    int nt = 0, rc = 0;
    char *csvs = strdup(o->csv), *save = NULL;
    if (!csvs) rc = PS_ENOMEM;
    for (char *c = csvs ? strtok_r(csvs, ",", &save) : NULL; c && rc == 0; c = strtok_r(NULL, ",", &save))
        rc = read_csv(c, &rs, err, errlen);
    if (rc == 0 && ps_mkdir_p(o->out) < 0) {
        ps_errf(err, errlen, "%s: %s", o->out, strerror(errno));
        rc = PS_EIO;
    }
    if (rc == 0) rc = classes_of(o, &rs, &cn, err, errlen);
    if (rc == 0) st->classes = cn->n;
    if (rc == 0) rc = fill_lists(o, &rs, cn, &texts, &nt, st, err, errlen);
    if (rc == PS_ENOMEM) ps_errf(err, errlen, "out of memory");
    st->rows = rs.n;
    if (rc == 0 && st->missing > MISSING_NAMED)
        ps_warn("... and %zu more rows without a video under %s", st->missing - MISSING_NAMED, o->root);
    for (int k = 0; rc == 0 && k < nt; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.txt", o->out, texts[k].split);
        rc = ps_write_file_atomic1(path, texts[k].p, texts[k].n, "lists", err, errlen);
        if (rc == 0) ps_info("wrote %s", path);
    }
    if (rc == 0 && nt == 0) {
        ps_errf(err, errlen, "no video of %s was found under %s (%zu rows, %zu without a label)", o->csv,
                o->root, rs.n, st->unlabelled);
        rc = PS_ENOTFOUND;
    }
    for (int k = 0; k < nt; k++) free(texts[k].p);
    free(texts);
    for (size_t i = 0; i < rs.n; i++) free(rs.r[i].id), free(rs.r[i].label), free(rs.r[i].split);
    free(rs.r);
    ps_class_names_free(&cn);
    free(csvs);
    return rc;
}
