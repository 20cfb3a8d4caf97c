/* psd checkpoint files in the directory (psd_checkpoint_internal.h): their
 * names and listing, the temporary files interrupted writes leave, pruning
 * to the newest CKPT_KEEP, and the note a failed write leaves. */
#include "psd_checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_log.h"

#define CKPT_KEEP 2

/* Sequence numbers of this server's checkpoint files, newest first. */
static int list_ckpts(const char *dir, int sid, uint64_t **seqs, size_t *n)
{
    DIR *d = opendir(dir);
    *seqs = NULL;
    *n = 0;
    if (!d) return errno == ENOENT ? 0 : PS_EIO;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "psd-%d-", sid);
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, prefix, plen)) continue;
        char *end;
        unsigned long long q = strtoull(nm + plen, &end, 10);
        if (end == nm + plen || strcmp(end, ".safetensors")) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *t = realloc(*seqs, cap * sizeof *t);
            if (!t) break;
            *seqs = t;
        }
        (*seqs)[(*n)++] = q;
    }
    closedir(d);
    /* newest first */
    for (size_t i = 1; i < *n; i++)
        for (size_t j = i; j > 0 && (*seqs)[j] > (*seqs)[j - 1]; j--) {
            uint64_t t = (*seqs)[j];
            (*seqs)[j] = (*seqs)[j - 1];
            (*seqs)[j - 1] = t;
        }
    return 0;
}

/* A writer killed mid-write (SIGKILL, power loss) leaves its temporary file
 * (ps_st_writer_save names it FINAL.tmp.PID) and never a partial FINAL:
 * remove those of this server at start so they do not pile up.  Only one
 * psd per server id uses a directory, so none of them is being written. */
void psd_checkpoint_remove_stale(const char *dir, int sid)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "psd-%d-", sid);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen) || !strstr(e->d_name, ".safetensors.tmp.")) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) == 0) ps_warn("removed %s (an interrupted checkpoint write)", p);
        else ps_warn("cannot remove stale %s: %s", p, strerror(errno));
    }
    closedir(d);
}

static void ckpt_path(char *buf, size_t cap, const char *dir, int sid, uint64_t seq)
{
    snprintf(buf, cap, "%s/psd-%d-%012llu.safetensors", dir, sid, (unsigned long long)seq);
}

int psd_checkpoint_list(const char *dir, int sid, uint64_t **seqs, size_t *n)
{
    return list_ckpts(dir, sid, seqs, n);
}

void psd_checkpoint_path(char *buf, size_t cap, const char *dir, int sid, uint64_t seq)
{
    ckpt_path(buf, cap, dir, sid, seq);
}

void psd_checkpoint_prune(psd_t *s)
{
    uint64_t *seqs;
    size_t n;
    if (list_ckpts(s->o.checkpoint_dir, s->o.server_id, &seqs, &n)) return;
    for (size_t i = CKPT_KEEP; i < n; i++) {
        char p[4096];
        ckpt_path(p, sizeof p, s->o.checkpoint_dir, s->o.server_id, seqs[i]);
        if (unlink(p) < 0) ps_warn("cannot remove old checkpoint %s: %s", p, strerror(errno));
    }
    free(seqs);
}

/* A failed write leaves a note, DIR/psd-<server>.ckpt-failed holding
 * "<UTC time> <cause>", which the next write that succeeds removes.  A
 * server restarted after its writes failed finds no checkpoint of the job,
 * and the note is how it can tell the workers why.  Best effort: on a full
 * disk the note may stay empty (creating it needs no data block). */
void psd_checkpoint_marker_path(char *buf, size_t cap, const char *dir, int sid)
{
    snprintf(buf, cap, "%s/psd-%d.ckpt-failed", dir, sid);
}

/* Pool thread (or the loop thread for a synchronous write). */
void psd_checkpoint_marker_update(const char *path, int failed, const char *cause)
{
    if (!failed) {
        if (unlink(path) < 0 && errno != ENOENT) ps_warn("cannot remove %s: %s", path, strerror(errno));
        return;
    }
    char stamp[32], line[768];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "%s %s\n", stamp, cause);
    size_t len = (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1);
    /* Overwritten in place, then cut: a note already there keeps its data
     * block, so a full disk cannot take it away between two failures. */
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || pwrite(fd, line, len, 0) != (ssize_t)len || ftruncate(fd, (off_t)len) < 0)
        ps_debug("cannot record the failure in %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
}

/* The note a previous run left: 1 and its text in buf ("" when it could
 * not be written), or 0 when there is none. */
int psd_checkpoint_marker_read(const char *dir, int sid, char *buf, size_t cap)
{
    char path[4096];
    psd_checkpoint_marker_path(path, sizeof path, dir, sid);
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(buf, (int)cap, f)) buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return 1;
}
