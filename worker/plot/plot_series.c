/* The plots, one row each: what a plot needs from the run, the data it
 * draws (gnuplot datablocks, computed here: moving averages, the sum over
 * the ranks) and the gnuplot commands that draw it. */
#include "worker/plot/plot_int.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

#define RAW_POINTS_MAX 20000 /* longer runs draw every k-th step's raw value */

/* Colours: raw per-step values light and thin, averages dark and thick. */
#define C_RAW "#b0c4de"
#define C_AVG "#08519c"
#define C_VAL "#d62728"

static const char *const val_cols[][2] = {
    {"top1", "top-1"}, {"top5", "top-5"}, {"map", "mAP"}, {"ap50", "AP50"}, {"ap75", "AP75"},
};
#define NVAL ((int)(sizeof val_cols / sizeof val_cols[0]))

/* ---- helpers ---- */

static void put(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, " %.9g", v);
    else fputs(" NaN", f);
}

static size_t window(size_t n)
{
    size_t w = n / 25;
    return w < 1 ? 1 : w > 100 ? 100 : w;
}

static size_t stride(size_t n)
{
    return n / RAW_POINTS_MAX + 1;
}

/* out[i] = mean of the finite x[j], |j - i| <= w/2 (NaN when none). */
static void moving_mean(const double *x, size_t n, size_t w, double *out)
{
    size_t h = w / 2;
    for (size_t i = 0; i < n; i++) {
        size_t a = i > h ? i - h : 0, b = i + h + 1 < n ? i + h + 1 : n, k = 0;
        double s = 0;
        for (size_t j = a; j < b; j++)
            if (isfinite(x[j])) s += x[j], k++;
        out[i] = k ? s / (double)k : NAN;
    }
}

static const char *rank_name(const plot_run_t *r, int i, char *buf, size_t cap)
{
    if (r->ranks[i] < 0) snprintf(buf, cap, "standalone");
    else snprintf(buf, cap, "rank %d", r->ranks[i]);
    return buf;
}

/* The steps of every rank lined up by iteration: per iteration (ascending)
 * the sum of f over the ranks that recorded it (a rank's last row of that
 * iteration: a rollback repeats steps) and how many did. */
typedef struct aligned {
    size_t n;
    double *iter, *sum;
    int *count;
} aligned_t;

typedef struct entry {
    double iter;
    int rank;
    size_t row;
} entry_t;

static int cmp_entry(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->iter != y->iter) return x->iter < y->iter ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

typedef double row_fn(const plot_table_t *t, size_t row);

static int align(const plot_run_t *r, row_fn *f, aligned_t *a)
{
    memset(a, 0, sizeof *a);
    size_t total = 0, k = 0;
    for (int i = 0; i < r->nranks; i++) total += r->steps[i].nrows;
    entry_t *e = malloc(total * sizeof *e);
    a->iter = malloc(total * sizeof *a->iter);
    a->sum = malloc(total * sizeof *a->sum);
    a->count = malloc(total * sizeof *a->count);
    if (!e || !a->iter || !a->sum || !a->count) {
        free(e);
        return PS_ENOMEM;
    }
    for (int i = 0; i < r->nranks; i++) {
        const plot_table_t *t = &r->steps[i];
        int it = plot_table_col(t, "iteration");
        for (size_t j = 0; j < t->nrows; j++) e[k++] = (entry_t){plot_at(t, j, it), i, j};
    }
    qsort(e, total, sizeof *e, cmp_entry);
    for (size_t j = 0; j < total; j++) {
        int last_of_rank = j + 1 == total || e[j + 1].iter != e[j].iter || e[j + 1].rank != e[j].rank;
        if (!last_of_rank) continue;
        if (!a->n || a->iter[a->n - 1] != e[j].iter) {
            a->iter[a->n] = e[j].iter;
            a->sum[a->n] = 0;
            a->count[a->n++] = 0;
        }
        double v = f(&r->steps[e[j].rank], e[j].row);
        if (isfinite(v)) a->sum[a->n - 1] += v, a->count[a->n - 1]++;
    }
    free(e);
    return 0;
}

static void aligned_free(aligned_t *a)
{
    free(a->iter), free(a->sum), free(a->count);
    memset(a, 0, sizeof *a);
}

static double col_of(const plot_table_t *t, size_t row, const char *name)
{
    return plot_at(t, row, plot_table_col(t, name));
}

static double row_loss(const plot_table_t *t, size_t row)
{
    return col_of(t, row, "loss");
}

/* samples per second of one rank's step */
static double row_rate(const plot_table_t *t, size_t row)
{
    double ms = col_of(t, row, "step_ms");
    int u = plot_table_col(t, "clips");
    if (u < 0) u = plot_table_col(t, "images");
    if (u < 0) u = plot_table_col(t, "samples");
    return ms > 0 ? plot_at(t, row, u) * 1e3 / ms : NAN;
}

/* One aligned series as a datablock "iteration raw average"; `all`: only
 * the iterations every rank recorded; `mean`: sum / count, else sum. */
static int emit_aligned(const plot_run_t *r, FILE *f, const char *name, row_fn *fn, int all,
                        int mean)
{
    aligned_t a;
    if (align(r, fn, &a)) return PS_ENOMEM;
    double *x = calloc(a.n + 1, sizeof *x), *m = calloc(a.n + 1, sizeof *m);
    double *it = malloc((a.n + 1) * sizeof *it);
    if (!x || !m || !it) {
        free(x), free(m), free(it), aligned_free(&a);
        return PS_ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < a.n; i++) {
        if (all && a.count[i] != r->nranks) continue;
        it[n] = a.iter[i];
        x[n++] = !a.count[i] ? NAN : mean ? a.sum[i] / a.count[i] : a.sum[i];
    }
    moving_mean(x, n, window(n), m);
    fprintf(f, "$%s << EOD\n", name);
    size_t k = stride(n);
    for (size_t i = 0; i < n; i += k) {
        fprintf(f, "%.0f", it[i]);
        put(f, x[i]);
        put(f, m[i]);
        fputc('\n', f);
    }
    fputs("EOD\n", f);
    free(x), free(m), free(it), aligned_free(&a);
    return 0;
}

/* The largest iteration of the run (training and validation), at least 1. */
static double last_iteration(const plot_run_t *r)
{
    double hi = 1;
    for (int i = 0; i < r->nranks; i++) {
        const plot_table_t *t = &r->steps[i];
        int c = plot_table_col(t, "iteration");
        for (size_t j = 0; j < t->nrows; j++)
            if (plot_at(t, j, c) > hi) hi = plot_at(t, j, c);
    }
    if (r->have_val) {
        int c = plot_table_col(&r->val, "iteration");
        for (size_t j = 0; j < r->val.nrows; j++)
            if (plot_at(&r->val, j, c) > hi) hi = plot_at(&r->val, j, c);
    }
    return hi;
}

static void common_x(const plot_run_t *r, FILE *f)
{
    fprintf(f, "set xlabel \"step\"\nset xrange [0:%.0f]\n", last_iteration(r));
}

/* ---- what a plot needs: gnuplot fails on a plot without a finite point ---- */

static int col_finite(const plot_table_t *t, const char *name)
{
    int c = plot_table_col(t, name);
    for (size_t j = 0; c >= 0 && j < t->nrows; j++)
        if (isfinite(plot_at(t, j, c))) return 1;
    return 0;
}

static int nothing(const char *what, const char *png, char *note, size_t cap)
{
    snprintf(note, cap, "no finite %s in the CSV files: no %s", what, png);
    return 0;
}

static int loss_wanted(const plot_run_t *r, char *note, size_t cap)
{
    for (int i = 0; i < r->nranks; i++)
        if (col_finite(&r->steps[i], "loss")) return 1;
    return nothing("loss", "loss.png", note, cap);
}

static int lr_wanted(const plot_run_t *r, char *note, size_t cap)
{
    return col_finite(&r->steps[0], "lr") || nothing("lr", "lr.png", note, cap);
}

static int split_wanted(const plot_run_t *r, char *note, size_t cap)
{
    return col_finite(&r->steps[0], "step_ms") || nothing("step_ms", "step_split.png", note, cap);
}

/* ---- loss.png ---- */

/* val.csv has a finite value in this column */
static int val_has(const plot_run_t *r, const char *col)
{
    return r->have_val && col_finite(&r->val, col);
}

static int emit_loss(const plot_run_t *r, FILE *f)
{
    for (int i = 0; i < r->nranks; i++) {
        const plot_table_t *t = &r->steps[i];
        int it = plot_table_col(t, "iteration"), l = plot_table_col(t, "loss");
        size_t k = stride(t->nrows);
        fprintf(f, "$loss%d << EOD\n", i);
        for (size_t j = 0; j < t->nrows; j += k) {
            fprintf(f, "%.0f", plot_at(t, j, it));
            put(f, plot_at(t, j, l));
            fputc('\n', f);
        }
        fputs("EOD\n", f);
    }
    if (val_has(r, "loss")) {
        const plot_table_t *t = &r->val;
        fputs("$val_loss << EOD\n", f);
        for (size_t j = 0; j < t->nrows; j++) {
            fprintf(f, "%.0f", col_of(t, j, "iteration"));
            put(f, col_of(t, j, "loss"));
            fputc('\n', f);
        }
        fputs("EOD\n", f);
    }
    return emit_aligned(r, f, "loss_mean", row_loss, 0, 1);
}

/* log scale when every value drawn is positive (cross-entropy spans decades) */
static int loss_positive(const plot_run_t *r)
{
    for (int i = 0; i < r->nranks; i++)
        for (size_t j = 0; j < r->steps[i].nrows; j++) {
            double v = col_of(&r->steps[i], j, "loss");
            if (isfinite(v) && v <= 0) return 0;
        }
    if (val_has(r, "loss"))
        for (size_t j = 0; j < r->val.nrows; j++) {
            double v = col_of(&r->val, j, "loss");
            if (isfinite(v) && v <= 0) return 0;
        }
    return 1;
}

static void draw_loss(const plot_run_t *r, FILE *f)
{
    common_x(r, f);
    fprintf(f, "set title \"training loss (thin: per step%s; thick: %s%zu-step average)\"\n"
            "set ylabel \"loss\"\n%s\nplot ", r->nranks > 1 ? ", each rank" : "",
            r->nranks > 1 ? "mean of the ranks, " : "", window(r->steps[0].nrows),
            loss_positive(r) ? "set logscale y" : "unset logscale y");
    /* one legend entry for the raw lines of every rank */
    for (int i = 0; i < r->nranks; i++)
        fprintf(f, "$loss%d using 1:2 with lines lc rgb \"%s\" lw 1 %s, \\\n     ", i, C_RAW,
                i ? "notitle" : "title \"per step\"");
    fprintf(f, "$loss_mean using 1:3 with lines lc rgb \"%s\" lw 2.5 title \"average\"", C_AVG);
    if (val_has(r, "loss"))
        fprintf(f, ", \\\n     $val_loss using 1:2 with linespoints pt 7 ps 1.2 lc rgb \"%s\" lw 2 "
                "title \"validation\"", C_VAL);
    fputs("\nunset logscale y\n", f);
}

/* ---- lr.png ---- */

static int emit_lr(const plot_run_t *r, FILE *f)
{
    const plot_table_t *t = &r->steps[0];
    int it = plot_table_col(t, "iteration"), lr = plot_table_col(t, "lr");
    size_t k = stride(t->nrows);
    fputs("$lr << EOD\n", f);
    for (size_t j = 0; j < t->nrows; j += k) {
        fprintf(f, "%.0f", plot_at(t, j, it));
        put(f, plot_at(t, j, lr));
        fputc('\n', f);
    }
    fputs("EOD\n", f);
    return 0;
}

static void draw_lr(const plot_run_t *r, FILE *f)
{
    char rn[32];
    common_x(r, f);
    fprintf(f, "set title \"learning rate (%s)\"\nset ylabel \"learning rate\"\n"
            "plot $lr using 1:2 with lines lc rgb \"%s\" lw 2 notitle\n",
            rank_name(r, 0, rn, sizeof rn), C_AVG);
}

/* ---- val.png ---- */

static int val_wanted(const plot_run_t *r, char *note, size_t cap)
{
    if (!r->have_val) return 0; /* plot_run_load said so */
    for (int k = 0; k < NVAL; k++)
        if (val_has(r, val_cols[k][0])) return 1;
    snprintf(note, cap, "%s has no finite top1/top5 or map/ap50/ap75 yet: no validation plot",
             r->val.path);
    return 0;
}

static int emit_val(const plot_run_t *r, FILE *f)
{
    const plot_table_t *t = &r->val;
    fputs("$val << EOD\n", f);
    for (size_t j = 0; j < t->nrows; j++) {
        for (int c = 0; c < t->ncols; c++) put(f, plot_at(t, j, c));
        fputc('\n', f);
    }
    fputs("EOD\n", f);
    return 0;
}

static void draw_val(const plot_run_t *r, FILE *f)
{
    static const char *const colours[] = {C_VAL, "#ff7f0e", "#2ca02c"};
    int det = val_has(r, "map"), k = 0;
    common_x(r, f);
    fprintf(f, "set title \"validation (%s)\"\nset ylabel \"%s\"\nset yrange [0:1.05]\n"
            "plot ", r->ranks[0] < 0 ? "standalone" : "rank 0",
            det ? "average precision (COCO)" : "accuracy");
    for (int v = 0; v < NVAL; v++) {
        if (!val_has(r, val_cols[v][0])) continue;
        fprintf(f, "%s$val using %d:%d with linespoints pt 7 ps 1.2 lw 2 lc rgb \"%s\" title \"%s\"",
                k ? ", \\\n     " : "", plot_table_col(&r->val, "iteration") + 1,
                plot_table_col(&r->val, val_cols[v][0]) + 1,
                colours[k % 3], val_cols[v][1]);
        k++;
    }
    fputs("\nset yrange [*:*]\n", f);
}

/* ---- throughput.png ---- */

static int rate_wanted(const plot_run_t *r, char *note, size_t cap)
{
    aligned_t a;
    int any = 0;
    if (align(r, row_rate, &a)) return 0;
    for (size_t i = 0; i < a.n && !any; i++) any = a.count[i] == r->nranks;
    aligned_free(&a);
    if (!any)
        snprintf(note, cap, "no step that every rank recorded with a positive step_ms: no "
                 "throughput.png");
    return any;
}

static int emit_rate(const plot_run_t *r, FILE *f)
{
    return emit_aligned(r, f, "rate", row_rate, 1, 0);
}

static void draw_rate(const plot_run_t *r, FILE *f)
{
    size_t n = r->steps[0].nrows;
    common_x(r, f);
    fprintf(f, "set title \"throughput, %s%d worker%s (thick: %zu-step average)\"\n"
            "set ylabel \"%s/s\"\nset yrange [0:*]\n"
            "plot $rate using 1:2 with lines lc rgb \"%s\" lw 1 title \"per step\", \\\n"
            "     $rate using 1:3 with lines lc rgb \"%s\" lw 2.5 title \"average\"\n"
            "set yrange [*:*]\n",
            r->nranks > 1 ? "sum of the " : "", r->nranks, r->nranks > 1 ? "s" : "", window(n), r->unit,
            C_RAW, C_AVG);
}

/* ---- step_split.png ---- */

/* The lowest rank's steps in file order, the first left out when there is
 * more than one (it pays for connections and page faults, as in the final
 * line's means): moving averages of data wait, + compute, + comm wait,
 * and of the whole step (the rest is the step's own bookkeeping). */
static int emit_split(const plot_run_t *r, FILE *f)
{
    static const char *const cols[] = {"data_wait_ms", "compute_ms", "comm_wait_ms", "step_ms"};
    const plot_table_t *t = &r->steps[0];
    size_t skip = t->nrows > 1, n = t->nrows - skip;
    double *x = malloc((n + 1) * 4 * sizeof *x), *m = malloc((n + 1) * 4 * sizeof *m);
    if (!x || !m) {
        free(x), free(m);
        return PS_ENOMEM;
    }
    for (int c = 0; c < 4; c++) {
        int col = plot_table_col(t, cols[c]);
        for (size_t j = 0; j < n; j++) x[c * n + j] = plot_at(t, j + skip, col);
        moving_mean(x + c * n, n, window(n), m + c * n);
    }
    int it = plot_table_col(t, "iteration");
    fputs("$split << EOD\n", f);
    for (size_t j = 0; j < n; j++) {
        fprintf(f, "%.0f", plot_at(t, j + skip, it));
        put(f, m[j]);
        put(f, m[j] + m[n + j]);
        put(f, m[j] + m[n + j] + m[2 * n + j]);
        put(f, m[3 * n + j]);
        fputc('\n', f);
    }
    fputs("EOD\n", f);
    free(x), free(m);
    return 0;
}

static void draw_split(const plot_run_t *r, FILE *f)
{
    char rn[32];
    const plot_table_t *t = &r->steps[0];
    size_t n = t->nrows - (t->nrows > 1);
    common_x(r, f);
    fprintf(f, "set title \"step time split, %s (%zu-step averages%s)\"\nset ylabel \"ms per step\"\n"
            "set yrange [0:*]\n"
            "plot $split using 1:4 with filledcurves x1 fs solid 0.85 lc rgb \"#fdae6b\" "
            "title \"comm wait\", \\\n"
            "     $split using 1:3 with filledcurves x1 fs solid 0.85 lc rgb \"#6baed6\" "
            "title \"compute\", \\\n"
            "     $split using 1:2 with filledcurves x1 fs solid 0.85 lc rgb \"#74c476\" "
            "title \"data wait\", \\\n"
            "     $split using 1:5 with lines lc rgb \"black\" lw 1.5 title \"whole step\"\n"
            "set yrange [*:*]\n",
            rank_name(r, 0, rn, sizeof rn), window(n), t->nrows > 1 ? "; step 0 left out" : "");
}

const plot_kind_t plot_kinds[] = {
    {.png = "loss.png", .wanted = loss_wanted, .emit = emit_loss, .draw = draw_loss},
    {.png = "lr.png", .wanted = lr_wanted, .emit = emit_lr, .draw = draw_lr},
    {.png = "val.png", .wanted = val_wanted, .emit = emit_val, .draw = draw_val},
    {.png = "throughput.png", .wanted = rate_wanted, .emit = emit_rate, .draw = draw_rate},
    {.png = "step_split.png", .wanted = split_wanted, .emit = emit_split, .draw = draw_split},
};
const int plot_nkinds = (int)(sizeof plot_kinds / sizeof plot_kinds[0]);
