/* What `psctl check` asks of a server before a job (STATS with
 * PS_FLAG_PREFLIGHT): the flags that must agree across the cluster, its
 * wall clock, and whether its checkpoint directory takes a file -- tried
 * for real (the directory made as the first checkpoint would make it, a
 * file created, written, synced and removed), since permissions, a
 * read-only mount or a full disk only show when one writes.  Only this
 * request does that I/O; plain STATS stay cheap. */
#include "psd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define PROBE_BYTES 65536

/* Make the directory and write a probe file in it: "" or the cause. */
static void probe_dir(const char *dir, int sid, char *err, size_t len)
{
    char path[4200];
    static char buf[PROBE_BYTES];
    err[0] = 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, len, "mkdir %s: %s", dir, strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%s/psd-%d.preflight.%d", dir, sid, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, len, "cannot create %s: %s", path, strerror(errno));
        return;
    }
    ssize_t n = write(fd, buf, sizeof buf);
    if (n != (ssize_t)sizeof buf)
        snprintf(err, len, "cannot write %s: %s", path, n < 0 ? strerror(errno) : "short write");
    else if (fsync(fd) < 0)
        snprintf(err, len, "cannot fsync %s: %s", path, strerror(errno));
    close(fd);
    unlink(path);
}

/* Bytes of one checkpoint file of the shard: weights and momentum of every
 * owned partition (pending gradients add up to W - 1 more copies at most). */
static double ckpt_bytes(const psd_t *s)
{
    double b = 0;
    for (uint32_t i = 0; s->st.have_table && i < s->st.table.nparts; i++)
        if (s->st.parts[i].owned) b += 2.0 * (double)s->st.parts[i].numel * sizeof(float);
    return b;
}

void psd_preflight_add(const psd_t *s, cJSON *o)
{
    cJSON *p = cJSON_AddObjectToObject(o, "preflight");
    if (!p) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    cJSON_AddNumberToObject(p, "time_unix", ts.tv_sec + ts.tv_nsec * 1e-9);
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    cJSON_AddStringToObject(p, "host", host);
    cJSON_AddNumberToObject(p, "num_servers", s->o.num_servers);
    cJSON_AddNumberToObject(p, "num_workers", s->o.num_workers);
    cJSON_AddNumberToObject(p, "checkpoint_every_steps", s->o.checkpoint_every_steps);
    const char *dir = s->o.checkpoint_dir ? s->o.checkpoint_dir : "";
    cJSON_AddStringToObject(p, "checkpoint_dir", dir);
    if (!*dir) return;
    char err[4400];
    probe_dir(dir, s->o.server_id, err, sizeof err);
    cJSON_AddStringToObject(p, "checkpoint_dir_error", err);
    struct statvfs v;
    if (statvfs(dir, &v) == 0)
        cJSON_AddNumberToObject(p, "checkpoint_free_bytes", (double)v.f_bavail * (double)v.f_frsize);
    cJSON_AddNumberToObject(p, "checkpoint_bytes", ckpt_bytes(s));
}
