/* The PNG plots of a run directory, drawn by gnuplot from the run's CSV
 * files (psworker's rank 0 at the end of a run, and `psctl plot DIR`).
 *
 * Reads (by column name, so columns may be added):
 *   DIR/metrics-rank<R>.csv, every rank present (or metrics-standalone.csv):
 *     iteration, loss, lr, step_ms, compute_ms, comm_wait_ms, data_wait_ms,
 *     and the samples of the step in a column named by what a sample is
 *     (clips, images or samples);
 *   DIR/val.csv (or val-standalone.csv), when there is one: iteration and
 *     top1 / top5 (video models) or map / ap50 / ap75 (detectors), loss.
 * Writes DIR/plots/:
 *   loss.png        training loss per step (each rank) and its moving
 *                   average (mean over the ranks), validation loss
 *   lr.png          learning rate per step
 *   val.png         validation top-1 / top-5 or mAP / AP50 / AP75 (when
 *                   there is a validation CSV)
 *   throughput.png  clips/s (images/s, samples/s) of all workers per step
 *   step_split.png  the lowest rank's step time split: data wait, compute,
 *                   communication wait (moving averages, stacked)
 *   plots.gp        the gnuplot script with its data inline:
 *                   `cd DIR/plots && gnuplot plots.gp` draws them again.
 * A plot without data (no validation yet, a column all NaN) is left out,
 * and *rep's note says why; a rank whose CSV has no row is left out too.
 * Every file is written under a temporary name and renamed into place when
 * gnuplot succeeded, so a failure leaves the previous plots (or none); on
 * success a PNG of an earlier drawing that was not drawn again is removed. */
#ifndef PS_PLOT_H
#define PS_PLOT_H
#include <stdio.h>

#define PS_PLOT_MAX 8
#define PS_PLOT_PATH 4200

/* One PNG and the extent of the data gnuplot drew in it (gnuplot's own
 * GPVAL_DATA_* after the plot). */
typedef struct ps_plot_file {
    char path[PS_PLOT_PATH];
    double xmin, xmax, ymin, ymax;
} ps_plot_file_t;

typedef struct ps_plot_report {
    int n;
    ps_plot_file_t files[PS_PLOT_MAX];
    char note[512]; /* what was left out and why ("" : nothing) */
} ps_plot_report_t;

/* Draw DIR's plots with gnuplot (looked up in PATH); *rep says what was
 * drawn.  0, or, with the cause logged naming the file (and line):
 *   PS_ENOTFOUND     DIR or its per-step CSV missing, or no step recorded
 *   PS_ECORRUPT      a CSV is malformed (missing column, bad number, ...)
 *   PS_EUNSUPPORTED  gnuplot is not installed (the message says how to get it)
 *   PS_EIO           a file cannot be written, or gnuplot failed
 *   PS_ETIMEOUT      gnuplot did not finish in 120 s (killed) */
int ps_plot_run(const char *dir, ps_plot_report_t *rep);
/* One line per PNG, "plot: PATH steps=X0..X1 y=Y0..Y1", then "note: ..."
 * when something was left out. */
void ps_plot_report_print(const ps_plot_report_t *rep, FILE *out);

#endif
