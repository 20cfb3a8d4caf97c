/* The devices --device strings name: one row per kind (ps_device_t), the
 * CPU's always first; the program adds the rows it links (the CUDA one
 * lives in libps_cuda.a, which depends on this library, never the other
 * way round).  Opening checks that the table a row hands out fills every
 * slot, so callers never test one for NULL. */
#include "ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 8
#define MAX_INDEX 1023

static int cpu_open(ps_ctx_t *ctx, int index, const ps_backend_t **be)
{
    if (index != 0) {
        ps_error("cpu:%d: the CPU is one device (cpu or cpu:0)", index);
        return PS_EINVAL;
    }
    *be = &ps_backend_cpu;
    return 0;
}

static const ps_device_t cpu_row = {"cpu", "CPU reference backend", cpu_open};

static const ps_device_t *rows[MAX_DEVICES] = {&cpu_row};
static int nrows = 1;

/* The 3-D video layers' slots (a block of their own in ps_backend_t). */
#define VIDEO3D_SLOTS(X)                                                                     \
    X(conv3d_forward) X(conv3d_backward) X(maxpool3d_forward) X(maxpool3d_backward)        \
    X(avgpool3d_forward) X(avgpool3d_backward)

/* Every slot a table must fill (the optional ones at the end of
 * ps_backend_t are not here). */
#define REQUIRED_SLOTS(X)                                                                    \
    X(sync) X(set_precision) X(set_loss_scale) X(events) X(event_record) X(event_query)      \
    X(event_wait) X(mem_stats) X(act_elsize) X(release) X(conv2d_forward) X(conv2d_backward) \
    X(bn_forward_train) X(bn_backward_train) X(bn_forward_saved) X(bn_forward_eval)        \
    X(bn_backward_eval)                                                                    \
    X(relu_forward) X(relu_backward) X(maxpool_forward) X(maxpool_backward)                \
    X(avgpool_forward) X(avgpool_backward) X(linear_forward) X(linear_backward)            \
    X(dropout_forward) X(dropout_backward) X(xent_forward) X(xent_backward)                \
    X(tshift_forward) X(tshift_backward) X(consensus_forward) X(consensus_backward) X(add) \
    X(accumulate) X(upsample_add_forward) X(upsample_add_backward) X(count_pos)            \
    X(focal_forward) X(focal_backward) X(smoothl1_forward) X(smoothl1_backward)            \
    X(head_permute_forward) X(head_permute_backward) X(roi_align_forward)                  \
    X(roi_align_backward) X(deconv_forward) X(deconv_backward) X(mask_bce_forward)          \
    X(mask_bce_backward) X(scale) VIDEO3D_SLOTS(X)

int ps_engine_check_backend(const ps_backend_t *be)
{
    if (!be) return PS_EINVAL;
    int empty = 0;
#define CHECK_SLOT(slot)                                                                     \
    if (!be->slot) {                                                                         \
        ps_error("backend %s: slot " #slot " is empty", be->name ? be->name : "(unnamed)"); \
        empty++;                                                                             \
    }
    REQUIRED_SLOTS(CHECK_SLOT)
#undef CHECK_SLOT
    return empty ? PS_EINVAL : 0;
}

static const ps_device_t *lookup(const char *kind, size_t len)
{
    for (int i = 0; i < nrows; i++)
        if (strlen(rows[i]->name) == len && !strncmp(rows[i]->name, kind, len)) return rows[i];
    return NULL;
}

int ps_engine_add_device(const ps_device_t *d)
{
    if (!d || !d->name || !*d->name || strchr(d->name, ':') || !d->open) {
        ps_error("device table: a row needs a name (without ':') and an open function");
        return PS_EINVAL;
    }
    const ps_device_t *have = lookup(d->name, strlen(d->name));
    if (have == d) return 0;
    if (have) {
        ps_error("device table: a row named %s is there already", d->name);
        return PS_EINVAL;
    }
    if (nrows == MAX_DEVICES) {
        ps_error("device table: full (%d rows), cannot add %s", MAX_DEVICES, d->name);
        return PS_ENOMEM;
    }
    rows[nrows++] = d;
    return 0;
}

/* "cpu, cuda" into buf */
static const char *known_kinds(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < nrows && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", rows[i]->name);
    return buf;
}

/* index of "KIND:N" (digits only, <= MAX_INDEX), or -1 */
static int parse_index(const char *s)
{
    if (!*s || strlen(s) > 4) return -1;
    for (const char *c = s; *c; c++)
        if (*c < '0' || *c > '9') return -1;
    int v = atoi(s);
    return v <= MAX_INDEX ? v : -1;
}

int ps_engine_find_device(const char *spec, const ps_device_t **d, int *index)
{
    char kinds[128];
    const char *colon = spec ? strchr(spec, ':') : NULL;
    const size_t klen = spec ? (colon ? (size_t)(colon - spec) : strlen(spec)) : 0;
    const int idx = colon ? parse_index(colon + 1) : 0;
    if (!klen || idx < 0) {
        ps_error("device %s: expected KIND or KIND:N (N a device number up to %d; kinds: %s)",
                 spec ? spec : "(none)", MAX_INDEX, known_kinds(kinds, sizeof kinds));
        return PS_EINVAL;
    }
    const ps_device_t *row = lookup(spec, klen);
    if (!row && klen == 4 && !strncmp(spec, "cuda", 4)) {
        ps_error("device %s: this build has no CUDA backend (it was built without CUDA); "
                 "devices: %s", spec, known_kinds(kinds, sizeof kinds));
        return PS_EINVAL;
    }
    if (!row) {
        ps_error("device %s: unknown kind %.*s (devices: %s)", spec, (int)klen, spec,
                 known_kinds(kinds, sizeof kinds));
        return PS_EINVAL;
    }
    if (d) *d = row;
    if (index) *index = idx;
    return 0;
}

int ps_engine_open_device(const char *spec, ps_ctx_t *ctx, const ps_backend_t **be)
{
    const ps_device_t *row = NULL;
    const ps_backend_t *got = NULL;
    int index = 0;
    if (!ctx || !be) return PS_EINVAL;
    int rc = ps_engine_find_device(spec, &row, &index);
    if (rc) return rc;
    if ((rc = row->open(ctx, index, &got))) {
        ps_error("device %s: cannot open it: %s", spec, ps_strerror(rc));
        return rc;
    }
    if (!got || ps_engine_check_backend(got)) {
        ps_error("device %s: its backend table is missing or incomplete", spec);
        if (got && got->release) got->release(ctx);
        return PS_EINVAL;
    }
    ps_info("device %s: %s", spec, row->what ? row->what : got->name);
    *be = got;
    return 0;
}
