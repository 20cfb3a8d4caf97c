/* The run's CSV files: read by column name, checked cell by cell, every
 * error naming the file and line. */
#include "worker/plot/plot_int.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps_error.h"
#include "ps_log.h"

#define MAX_COLS 64
#define MAX_LINE 4096

void plot_table_free(plot_table_t *t)
{
    for (int i = 0; i < t->ncols; i++) free(t->names[i]);
    free(t->names);
    free(t->v);
    memset(t, 0, sizeof *t);
}

int plot_table_col(const plot_table_t *t, const char *name)
{
    for (int i = 0; i < t->ncols; i++)
        if (!strcmp(t->names[i], name)) return i;
    return -1;
}

static void chomp(char *s, int *had_newline)
{
    size_t n = strlen(s);
    *had_newline = n && s[n - 1] == '\n';
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
}

static int read_header(plot_table_t *t, char *line, const char *const *required)
{
    size_t len = strlen(line);
    if (!len || line[0] == ',' || line[len - 1] == ',' || strstr(line, ",,")) {
        ps_error("%s:1: an empty column name in the header '%.80s'", t->path, line);
        return PS_ECORRUPT;
    }
    t->names = calloc(MAX_COLS, sizeof *t->names);
    if (!t->names) return PS_ENOMEM;
    char *save = NULL;
    for (char *tok = strtok_r(line, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (t->ncols == MAX_COLS) {
            ps_error("%s:1: more than %d columns", t->path, MAX_COLS);
            return PS_ECORRUPT;
        }
        for (const char *c = tok; *c; c++)
            if (!(islower((unsigned char)*c) || isdigit((unsigned char)*c) || *c == '_')) {
                ps_error("%s:1: '%s' is not a column name (want the header line, e.g. "
                         "iteration,loss,...)", t->path, tok);
                return PS_ECORRUPT;
            }
        if (!(t->names[t->ncols++] = strdup(tok))) return PS_ENOMEM;
    }
    for (const char *const *r = required; r && *r; r++)
        if (plot_table_col(t, *r) < 0) {
            ps_error("%s:1: no column '%s' in the header", t->path, *r);
            return PS_ECORRUPT;
        }
    return 0;
}

/* One data line into row; 0 or PS_ECORRUPT with the cause in why. */
static int parse_row(const plot_table_t *t, char *line, double *row, char *why, size_t cap)
{
    int k = 0;
    char *p = line;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (k == t->ncols) {
            snprintf(why, cap, "more than the header's %d fields", t->ncols);
            return PS_ECORRUPT;
        }
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || *end || errno == ERANGE) {
            snprintf(why, cap, "%s '%.40s' is not a number", t->names[k], p);
            return PS_ECORRUPT;
        }
        row[k++] = v;
        if (!comma) break;
        p = comma + 1;
    }
    if (k != t->ncols) {
        snprintf(why, cap, "%d fields, the header has %d", k, t->ncols);
        return PS_ECORRUPT;
    }
    int it = plot_table_col(t, "iteration");
    if (it >= 0 && !(row[it] >= 0 && row[it] < 1e15 && row[it] == floor(row[it]))) {
        snprintf(why, cap, "iteration '%g' is not a step number", row[it]);
        return PS_ECORRUPT;
    }
    return 0;
}

int plot_table_read(plot_table_t *t, const char *path, const char *const *required, int *torn)
{
    memset(t, 0, sizeof *t);
    *torn = 0;
    snprintf(t->path, sizeof t->path, "%s", path);
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        ps_error("%s: %s", path, strerror(e));
        return e == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    char line[MAX_LINE + 2];
    int nl, rc = 0;
    size_t cap = 0, lineno = 1;
    if (!fgets(line, sizeof line, f)) {
        ps_error("%s: empty (no header line)", path);
        rc = PS_ECORRUPT;
        goto out;
    }
    chomp(line, &nl);
    if ((rc = read_header(t, line, required))) goto out;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        chomp(line, &nl);
        if (!nl && !feof(f)) {
            ps_error("%s:%zu: line longer than %d characters", path, lineno, MAX_LINE);
            rc = PS_ECORRUPT;
            goto out;
        }
        if (t->nrows == cap) {
            size_t nc = cap ? 2 * cap : 256;
            double *v = realloc(t->v, nc * (size_t)t->ncols * sizeof *v);
            if (!v) {
                rc = PS_ENOMEM;
                goto out;
            }
            t->v = v;
            cap = nc;
        }
        char why[160];
        if (parse_row(t, line, t->v + t->nrows * (size_t)t->ncols, why, sizeof why)) {
            if (!nl) { /* the last line, still being written */
                *torn = 1;
                break;
            }
            ps_error("%s:%zu: %s", path, lineno, why);
            rc = PS_ECORRUPT;
            goto out;
        }
        t->nrows++;
    }
    if (ferror(f)) {
        ps_error("%s: read error", path);
        rc = PS_EIO;
    }
out:
    fclose(f);
    if (rc == PS_ENOMEM) ps_error("%s: out of memory", path);
    if (rc) plot_table_free(t);
    return rc;
}

/* ---- the run directory ---- */

static const char *const step_cols[] = {"iteration", "loss", "lr", "step_ms", "compute_ms",
                                        "comm_wait_ms", "data_wait_ms", NULL};
/* The samples column is named by what a sample is (task.h: unit). */
static const char *const unit_cols[] = {"clips", "images", "samples", NULL};

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The ranks R of dir's metrics-rank<R>.csv, ascending (none: nranks 0). */
static int find_ranks(plot_run_t *r)
{
    DIR *d = opendir(r->dir);
    if (!d) {
        int e = errno;
        ps_error("%s: %s", r->dir, strerror(e));
        return e == ENOENT || e == ENOTDIR ? PS_ENOTFOUND : PS_EIO;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        int rank, len = 0;
        if (sscanf(de->d_name, "metrics-rank%d.csv%n", &rank, &len) == 1 &&
            len == (int)strlen(de->d_name) && rank >= 0 && r->nranks < PLOT_MAX_RANKS)
            r->ranks[r->nranks++] = rank;
    }
    closedir(d);
    qsort(r->ranks, (size_t)r->nranks, sizeof r->ranks[0], cmp_int);
    return 0;
}

static int load_steps(plot_run_t *r, int i)
{
    char path[PS_PLOT_PATH + 64];
    if (r->ranks[i] < 0) snprintf(path, sizeof path, "%s/metrics-standalone.csv", r->dir);
    else snprintf(path, sizeof path, "%s/metrics-rank%d.csv", r->dir, r->ranks[i]);
    int torn, rc = plot_table_read(&r->steps[i], path, step_cols, &torn);
    if (rc) return rc;
    const plot_table_t *t = &r->steps[i];
    const char *unit = NULL;
    for (const char *const *u = unit_cols; *u && !unit; u++)
        if (plot_table_col(t, *u) >= 0) unit = *u;
    if (!unit) {
        ps_error("%s:1: no samples column (clips, images or samples) in the header", path);
        return PS_ECORRUPT;
    }
    if (r->unit && strcmp(r->unit, unit)) {
        ps_error("%s:1: its samples are %s, rank %d's are %s: CSV files of two runs?", path,
                 unit, r->ranks[0], r->unit);
        return PS_ECORRUPT;
    }
    r->unit = unit;
    if (!t->nrows)
        snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note),
                 "%s%s: no step recorded (left out)", *r->note ? "; " : "", path);
    if (torn)
        snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note),
                 "%s%s: its last line is still being written (left out)", *r->note ? "; " : "",
                 path);
    return 0;
}

int plot_run_load(plot_run_t *r, const char *dir)
{
    memset(r, 0, sizeof *r);
    if (snprintf(r->dir, sizeof r->dir, "%s", dir) >= (int)sizeof r->dir) {
        ps_error("%.64s...: path too long", dir);
        return PS_EINVAL;
    }
    int rc = find_ranks(r);
    if (rc) return rc;
    const char *valname = "val.csv";
    if (!r->nranks) { /* a --standalone run */
        r->ranks[r->nranks++] = -1;
        valname = "val-standalone.csv";
    }
    if (!(r->steps = calloc((size_t)r->nranks, sizeof *r->steps))) return PS_ENOMEM;
    for (int i = 0; i < r->nranks; i++)
        if ((rc = load_steps(r, i))) {
            if (rc == PS_ENOTFOUND && r->ranks[i] < 0)
                ps_error("%s: no metrics-rank<R>.csv or metrics-standalone.csv: not a psworker "
                         "run directory (--out)?", dir);
            return rc;
        }
    /* a rank that recorded no step (it failed at the start) is left out */
    int kept = 0;
    for (int i = 0; i < r->nranks; i++) {
        if (!r->steps[i].nrows) {
            plot_table_free(&r->steps[i]);
            continue;
        }
        r->ranks[kept] = r->ranks[i];
        r->steps[kept++] = r->steps[i];
    }
    r->nranks = kept;
    if (!kept) {
        ps_error("%s: no step recorded yet in its metrics CSV files", dir);
        return PS_ENOTFOUND;
    }
    char path[PS_PLOT_PATH + 64];
    snprintf(path, sizeof path, "%s/%s", dir, valname);
    struct stat st;
    if (stat(path, &st)) {
        snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note),
                 "%sno %s: no validation plot", *r->note ? "; " : "", valname);
        return 0;
    }
    static const char *const val_cols[] = {"iteration", NULL};
    int torn;
    if ((rc = plot_table_read(&r->val, path, val_cols, &torn))) return rc;
    r->have_val = 1;
    if (torn)
        snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note),
                 "%s%s: its last line is still being written (left out)", *r->note ? "; " : "",
                 path);
    return 0;
}

void plot_run_free(plot_run_t *r)
{
    for (int i = 0; r->steps && i < r->nranks; i++) plot_table_free(&r->steps[i]);
    free(r->steps);
    if (r->have_val) plot_table_free(&r->val);
    memset(r, 0, sizeof *r);
}
