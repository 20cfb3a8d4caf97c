/* ps_plot_run: the script (every plot's datablocks and commands), gnuplot
 * run on it in DIR/plots under a deadline, and the files renamed into
 * place only when it succeeded. */
#include "worker/plot/plot_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"

#define GNUPLOT_DEADLINE_S 120
#define GNUPLOT_SAY_S 5 /* a wait longer than this is logged */
#define PART ".part"    /* gnuplot's outputs until they are complete */

static const char install_hint[] =
    "install it (Debian: apt-get install gnuplot-nox) and run: psctl plot";

static void path_in(char *buf, size_t cap, const char *dir, const char *name)
{
    snprintf(buf, cap, "%s/plots/%s", dir, name);
}

static void remove_in(const char *dir, const char *name)
{
    char p[PS_PLOT_PATH + 64];
    path_in(p, sizeof p, dir, name);
    unlink(p);
}

/* The whole script: terminal, datablocks, then one plot per wanted kind
 * (wanted[k]), each followed by the line that reports its data extent. */
static int write_script(const plot_run_t *r, const int *wanted, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        ps_error("cannot create %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    fprintf(f, "# The plots of a psworker run, drawn from its CSV files (data inline).\n"
               "# Draw them again with: cd <run>/plots && gnuplot plots.gp\n"
               "if (!exists(\"sfx\")) sfx = \"\"\n"
               "set terminal pngcairo size 1100,540 font \"sans,12\" noenhanced\n"
               "set print \"-\"\nset grid lc rgb \"#dddddd\"\nset key outside right top vertical Left reverse\n"
               "set border lc rgb \"#444444\"\nset format y \"%%g\"\n");
    int rc = 0;
    for (int k = 0; k < plot_nkinds && !rc; k++)
        if (wanted[k]) rc = plot_kinds[k].emit(r, f);
    for (int k = 0; k < plot_nkinds && !rc; k++) {
        if (!wanted[k]) continue;
        const char *png = plot_kinds[k].png;
        fprintf(f, "\nset output \"%s\".sfx\n", png);
        plot_kinds[k].draw(r, f);
        fprintf(f, "print sprintf(\"range %s %%.17g %%.17g %%.17g %%.17g\", GPVAL_DATA_X_MIN, "
                   "GPVAL_DATA_X_MAX, GPVAL_DATA_Y_MIN, GPVAL_DATA_Y_MAX)\nset output\n", png);
    }
    if (rc) ps_error("%s: out of memory writing the plot script", path);
    if (fclose(f) && !rc) {
        ps_error("cannot write %s: %s", path, strerror(errno));
        rc = PS_EIO;
    }
    return rc;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* gnuplot -e 'sfx=".part"' plots.gp.tmp in DIR/plots, output and errors
 * to files there; waits up to GNUPLOT_DEADLINE_S. */
static int run_gnuplot(const char *dir)
{
    char cwd[PS_PLOT_PATH + 16];
    snprintf(cwd, sizeof cwd, "%s/plots", dir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, cwd);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, ".gnuplot.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, ".gnuplot.err", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *argv[] = {"gnuplot", "-e", "sfx=\"" PART "\"", "plots.gp.tmp", NULL};
    extern char **environ;
    pid_t pid;
    int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e == ENOENT) {
        ps_warn("gnuplot not found: no plots drawn in %s; %s %s", cwd, install_hint, dir);
        return PS_EUNSUPPORTED;
    }
    if (e) {
        ps_error("cannot start gnuplot in %s: %s", cwd, strerror(e));
        return PS_EIO;
    }
    double t0 = now_s();
    int said = 0, status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            ps_error("waiting for gnuplot: %s", strerror(errno));
            return PS_EIO;
        }
        double t = now_s() - t0;
        if (t > GNUPLOT_DEADLINE_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            ps_error("gnuplot (pid %d) did not finish the plots in %s within %d s: killed", (int)pid,
                     cwd, GNUPLOT_DEADLINE_S);
            return PS_ETIMEOUT;
        }
        if (!said && t > GNUPLOT_SAY_S) {
            ps_info("waiting for gnuplot (pid %d) to draw the plots in %s", (int)pid, cwd);
            said = 1;
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    char errpath[PS_PLOT_PATH + 64], line[512];
    path_in(errpath, sizeof errpath, dir, ".gnuplot.err");
    ps_error("gnuplot failed in %s (%s %d); its messages:", cwd,
             WIFEXITED(status) ? "exit status" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    FILE *f = fopen(errpath, "r");
    for (int n = 0; f && n < 20 && fgets(line, sizeof line, f); n++) {
        line[strcspn(line, "\n")] = 0;
        if (*line) ps_error("  gnuplot: %s", line);
    }
    if (f) fclose(f);
    return PS_EIO;
}

/* The "range PNG x0 x1 y0 y1" lines gnuplot printed, into rep. */
static int read_ranges(const char *dir, const int *wanted, ps_plot_report_t *rep)
{
    char path[PS_PLOT_PATH + 64], line[512], name[64];
    path_in(path, sizeof path, dir, ".gnuplot.out");
    FILE *f = fopen(path, "r");
    if (!f) {
        ps_error("%s: %s", path, strerror(errno));
        return PS_EIO;
    }
    rep->n = 0;
    for (int k = 0; k < plot_nkinds; k++) {
        if (!wanted[k]) continue;
        ps_plot_file_t *pf = &rep->files[rep->n++];
        snprintf(pf->path, sizeof pf->path, "%s/plots/%s", dir, plot_kinds[k].png);
        pf->xmin = pf->xmax = pf->ymin = pf->ymax = 0;
    }
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        double v[4];
        if (sscanf(line, "range %63s %lf %lf %lf %lf", name, &v[0], &v[1], &v[2], &v[3]) != 5)
            continue;
        for (int i = 0; i < rep->n; i++) {
            const char *base = strrchr(rep->files[i].path, '/') + 1;
            if (strcmp(base, name)) continue;
            rep->files[i].xmin = v[0], rep->files[i].xmax = v[1];
            rep->files[i].ymin = v[2], rep->files[i].ymax = v[3];
            found++;
        }
    }
    fclose(f);
    if (found != rep->n) {
        ps_error("gnuplot drew %d of the %d plots in %s/plots", found, rep->n, dir);
        return PS_EIO;
    }
    return 0;
}

/* NAME.part -> NAME for every PNG, then the script; a PNG of a plot not
 * drawn this time (an earlier drawing's) is removed. */
static int commit(const char *dir, const int *wanted)
{
    char a[PS_PLOT_PATH + 128], b[PS_PLOT_PATH + 64];
    for (int k = 0; k < plot_nkinds; k++) {
        if (!wanted[k]) continue;
        struct stat st;
        path_in(b, sizeof b, dir, plot_kinds[k].png);
        snprintf(a, sizeof a, "%s" PART, b);
        if (stat(a, &st) || st.st_size == 0) {
            ps_error("gnuplot left no %s", a);
            return PS_EIO;
        }
    }
    for (int k = 0; k < plot_nkinds; k++) {
        if (!wanted[k]) continue;
        path_in(b, sizeof b, dir, plot_kinds[k].png);
        snprintf(a, sizeof a, "%s" PART, b);
        if (rename(a, b)) {
            ps_error("cannot rename %s to %s: %s", a, b, strerror(errno));
            return PS_EIO;
        }
    }
    for (int k = 0; k < plot_nkinds; k++)
        if (!wanted[k]) remove_in(dir, plot_kinds[k].png);
    path_in(a, sizeof a, dir, "plots.gp.tmp");
    path_in(b, sizeof b, dir, "plots.gp");
    if (rename(a, b)) {
        ps_error("cannot rename %s to %s: %s", a, b, strerror(errno));
        return PS_EIO;
    }
    return 0;
}

static void clean(const char *dir, int rc)
{
    char name[96];
    remove_in(dir, ".gnuplot.out");
    remove_in(dir, ".gnuplot.err");
    if (!rc) return;
    remove_in(dir, "plots.gp.tmp");
    for (int k = 0; k < plot_nkinds; k++) {
        snprintf(name, sizeof name, "%s" PART, plot_kinds[k].png);
        remove_in(dir, name);
    }
}

int ps_plot_run(const char *dir, ps_plot_report_t *rep)
{
    memset(rep, 0, sizeof *rep);
    plot_run_t r;
    int rc = plot_run_load(&r, dir);
    if (rc) {
        plot_run_free(&r);
        return rc;
    }
    int wanted[PS_PLOT_MAX] = {0};
    char note[256] = "";
    snprintf(rep->note, sizeof rep->note, "%s", r.note);
    for (int k = 0; k < plot_nkinds; k++) {
        note[0] = 0;
        wanted[k] = plot_kinds[k].wanted(&r, note, sizeof note);
        size_t len = strlen(rep->note);
        if (*note)
            snprintf(rep->note + len, sizeof rep->note - len, "%s%s", len ? "; " : "", note);
    }
    char pdir[PS_PLOT_PATH + 16], script[PS_PLOT_PATH + 64];
    snprintf(pdir, sizeof pdir, "%s/plots", dir);
    if (mkdir(pdir, 0777) && errno != EEXIST) {
        ps_error("cannot create %s: %s", pdir, strerror(errno));
        plot_run_free(&r);
        return PS_EIO;
    }
    path_in(script, sizeof script, dir, "plots.gp.tmp");
    rc = write_script(&r, wanted, script);
    plot_run_free(&r);
    if (!rc) rc = run_gnuplot(dir);
    if (!rc) rc = read_ranges(dir, wanted, rep);
    if (!rc) rc = commit(dir, wanted);
    clean(dir, rc);
    if (rc) rep->n = 0;
    return rc;
}

void ps_plot_report_print(const ps_plot_report_t *rep, FILE *out)
{
    for (int i = 0; i < rep->n; i++) {
        const ps_plot_file_t *pf = &rep->files[i];
        fprintf(out, "plot: %s steps=%.17g..%.17g y=%.9g..%.9g\n", pf->path, pf->xmin, pf->xmax,
                pf->ymin, pf->ymax);
    }
    if (*rep->note) fprintf(out, "note: %s\n", rep->note);
}
