/* Inside worker/plot/: the run's CSV tables (plot_csv.c), the series drawn
 * (plot_series.c) and the script and gnuplot (plot_run.c). */
#ifndef PS_PLOT_INT_H
#define PS_PLOT_INT_H
#include <stddef.h>
#include <stdio.h>

#include "worker/plot/ps_plot.h"

/* A CSV file: a header line of column names, then rows of numbers. */
typedef struct plot_table {
    char path[PS_PLOT_PATH];
    int ncols;
    char **names;   /* (ncols) */
    size_t nrows;
    double *v;      /* (nrows, ncols) row-major */
} plot_table_t;

/* Read path; every name in required[] (NULL-terminated) must be a column.
 * Values are numbers (nan / inf allowed: a diverged validation).  A last
 * line without its newline that does not parse is a run still writing it:
 * left out (*torn = 1).  0, or PS_ENOTFOUND (no such file) / PS_ECORRUPT /
 * PS_ENOMEM, logged with the path and line. */
int plot_table_read(plot_table_t *t, const char *path, const char *const *required, int *torn);
void plot_table_free(plot_table_t *t);
/* Column index of name, or -1. */
int plot_table_col(const plot_table_t *t, const char *name);
static inline double plot_at(const plot_table_t *t, size_t row, int col)
{
    return t->v[row * (size_t)t->ncols + (size_t)col];
}

/* The run: its per-step tables (ascending rank) and the validation one. */
#define PLOT_MAX_RANKS 4096
typedef struct plot_run {
    char dir[PS_PLOT_PATH];
    int nranks;
    int ranks[PLOT_MAX_RANKS];  /* rank of each table (-1: standalone) */
    plot_table_t *steps;        /* (nranks) */
    int have_val;
    plot_table_t val;
    const char *unit;           /* "clips", "images", "samples" */
    char note[512];
} plot_run_t;

/* Find and read DIR's tables.  0, or PS_E* logged. */
int plot_run_load(plot_run_t *r, const char *dir);
void plot_run_free(plot_run_t *r);

/* One plot: a PNG drawn from the datablocks its `emit` writes and the
 * gnuplot commands its `draw` writes (plot_series.c: the table of plots). */
typedef struct plot_kind {
    const char *png;
    /* 1 when the run has what this plot shows, else 0 and why in note */
    int (*wanted)(const plot_run_t *r, char *note, size_t cap);
    /* the datablocks; 0 or PS_ENOMEM */
    int (*emit)(const plot_run_t *r, FILE *f);
    /* set ... / plot ... (the output is set by the caller) */
    void (*draw)(const plot_run_t *r, FILE *f);
} plot_kind_t;
extern const plot_kind_t plot_kinds[];
extern const int plot_nkinds;

#endif
