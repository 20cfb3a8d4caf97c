/* SGD in torch.optim.SGD's semantics, its learning-rate schedule, and the
 * config's JSON form.  The schedule is defined in ps_optim.h in terms of the
 * torch schedulers it reproduces; tests/golden/gen_optim.py checks it. */
#include "ps_optim.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GCC -O2 only vectorises loops whose trip count it knows; `omp simd` asks
 * for it on the update loops (no reductions, so results are bit-identical
 * to the scalar order).  Without OpenMP the pragma is simply left out. */
#ifdef _OPENMP
#define PS_SIMD _Pragma("omp simd")
#else
#define PS_SIMD
#endif

/* Steps travel through JSON as doubles: keep them exactly representable. */
#define MAX_STEP 9007199254740992.0 /* 2^53 */

uint32_t ps_optim_exact_groups(const ps_optim_config_t *c)
{
    uint32_t m = 0;
    for (int i = 0; c && i < c->ngroups && i < PS_OPTIM_MAX_GROUPS; i++)
        if (c->group_kind[i] == PS_GROUP_AVERAGE) m |= 1u << i;
    return m;
}

void ps_optim_config_default(ps_optim_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->lr = 0.01f;
    c->momentum = 0.9f;
    c->sched = PS_SCHED_CONST;
    c->warmup_factor = 1.0f;
    c->gamma = 0.1f;
    c->groups[0].lr_mult = 1.0f;
    c->groups[0].wd_mult = 1.0f;
    c->ngroups = 1;
}

#define bad(err, errlen, ...) \
    ps_fail_at(__FILE__, __LINE__, PS_EINVAL, (err), (errlen), "optim config: ", __VA_ARGS__)

/* finite and >= lo (NaN fails every comparison, so test it explicitly) */
static int fge(float v, float lo) { return isfinite(v) && v >= lo; }

int ps_optim_config_validate(const ps_optim_config_t *c, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!c) return bad(err, errlen, "NULL config");
    if (!fge(c->lr, 0)) return bad(err, errlen, "lr %g must be finite and >= 0", c->lr);
    if (!fge(c->momentum, 0) || c->momentum >= 1)
        return bad(err, errlen, "momentum %g must be in [0, 1)", c->momentum);
    if (!fge(c->dampening, 0) || c->dampening > 1)
        return bad(err, errlen, "dampening %g must be in [0, 1]", c->dampening);
    if (c->nesterov != 0 && c->nesterov != 1)
        return bad(err, errlen, "nesterov %d must be 0 or 1", c->nesterov);
    /* torch.optim.SGD: "Nesterov momentum requires a momentum and zero dampening" */
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return bad(err, errlen, "nesterov requires momentum > 0 and dampening 0 (momentum %g, dampening %g)",
                   c->momentum, c->dampening);
    if (!fge(c->weight_decay, 0))
        return bad(err, errlen, "weight_decay %g must be finite and >= 0", c->weight_decay);
    if (c->ref_batch < 0) return bad(err, errlen, "ref_batch %d must be >= 0", c->ref_batch);
    if (c->ref_batch > 0 && c->global_batch <= 0)
        return bad(err, errlen, "global_batch %d must be > 0 when ref_batch is set", c->global_batch);
    if (c->global_batch < 0) return bad(err, errlen, "global_batch %d must be >= 0", c->global_batch);
    if (c->sched != PS_SCHED_CONST && c->sched != PS_SCHED_STEP && c->sched != PS_SCHED_COSINE)
        return bad(err, errlen, "sched %d is not const, step or cosine", (int)c->sched);
    if ((double)c->warmup_steps > MAX_STEP || (double)c->total_steps > MAX_STEP)
        return bad(err, errlen, "warmup_steps / total_steps above 2^53");
    /* torch.optim.lr_scheduler.LinearLR: 0 < start_factor <= 1 */
    if (c->warmup_steps > 0 && (!fge(c->warmup_factor, 0) || c->warmup_factor <= 0 ||
                                c->warmup_factor > 1))
        return bad(err, errlen, "warmup_factor %g must be in (0, 1]", c->warmup_factor);
    if (c->nmilestones < 0 || c->nmilestones > PS_OPTIM_MAX_MILESTONES)
        return bad(err, errlen, "nmilestones %d must be in [0, %d]", c->nmilestones,
                   PS_OPTIM_MAX_MILESTONES);
    for (int i = 0; i < c->nmilestones; i++) {
        if (c->milestones[i] < c->warmup_steps || (double)c->milestones[i] > MAX_STEP)
            return bad(err, errlen, "milestones[%d] = %llu must be >= warmup_steps (%llu) and <= 2^53", i,
                       (unsigned long long)c->milestones[i], (unsigned long long)c->warmup_steps);
        if (i && c->milestones[i] <= c->milestones[i - 1])
            return bad(err, errlen, "milestones must be strictly increasing (milestones[%d] = %llu)", i,
                       (unsigned long long)c->milestones[i]);
    }
    if (!isfinite(c->gamma) || c->gamma <= 0)
        return bad(err, errlen, "gamma %g must be finite and > 0", c->gamma);
    if (c->sched == PS_SCHED_COSINE && c->total_steps <= c->warmup_steps)
        return bad(err, errlen, "cosine needs total_steps (%llu) > warmup_steps (%llu)",
                   (unsigned long long)c->total_steps, (unsigned long long)c->warmup_steps);
    if (!fge(c->min_lr, 0)) return bad(err, errlen, "min_lr %g must be finite and >= 0", c->min_lr);
    if (c->ngroups < 1 || c->ngroups > PS_OPTIM_MAX_GROUPS)
        return bad(err, errlen, "ngroups %d must be in [1, %d]", c->ngroups, PS_OPTIM_MAX_GROUPS);
    for (int i = 0; i < c->ngroups; i++)
        if (!fge(c->groups[i].lr_mult, 0) || !fge(c->groups[i].wd_mult, 0))
            return bad(err, errlen, "groups[%d]: lr_mult %g / wd_mult %g must be finite and >= 0", i,
                       c->groups[i].lr_mult, c->groups[i].wd_mult);
    for (int i = 0; i < c->ngroups; i++)
        if (c->group_kind[i] != PS_GROUP_SGD && c->group_kind[i] != PS_GROUP_AVERAGE)
            return bad(err, errlen, "groups[%d]: kind %d is not sgd (0) or average (1)", i,
                       c->group_kind[i]);
    return 0;
}

/* ---- schedule -------------------------------------------------------------- */

static double lr_group(const ps_optim_config_t *c, uint64_t step, double lr_mult)
{
    double base = c->lr;
    if (c->ref_batch > 0) base = base * c->global_batch / c->ref_batch;
    base *= lr_mult;
    uint64_t W = c->warmup_steps;
    if (step < W) {
        double f = c->warmup_factor;
        return base * (f + (1.0 - f) * (double)step / (double)W);
    }
    switch (c->sched) {
    case PS_SCHED_STEP: {
        double lr = base;
        for (int i = 0; i < c->nmilestones; i++)
            if (c->milestones[i] <= step) lr *= c->gamma;
        return lr;
    }
    case PS_SCHED_COSINE: {
        if (step >= c->total_steps || c->total_steps <= W) return c->min_lr;
        double T = (double)(c->total_steps - W), t = (double)(step - W);
        return c->min_lr + (base - c->min_lr) * (1.0 + cos(M_PI * t / T)) / 2.0;
    }
    default:
        return base;
    }
}

float ps_optim_lr_group(const ps_optim_config_t *c, uint64_t step, float lr_mult)
{
    return (float)lr_group(c, step, lr_mult);
}

float ps_optim_lr(const ps_optim_config_t *c, uint64_t step)
{
    return (float)lr_group(c, step, 1.0);
}

/* ---- update ---------------------------------------------------------------- */

/* The arithmetic order is torch's _single_tensor_sgd:
 *   d = g + wd*w;  buf = m*buf + (1-damp)*d;  d = d + m*buf;  w = w + (-lr)*d
 * The loop body is instantiated once per combination of the flags (always
 * inlined with constant flags) so each variant is a branch-free line the
 * compiler vectorises. */
static inline __attribute__((always_inline)) void
sgd_loop(float *restrict w, float *restrict buf, const float *restrict g, size_t n, float nlr,
         float wd, float m, float damp1, int use_wd, int use_mom, int first, int nesterov)
{
    PS_SIMD
    for (size_t i = 0; i < n; i++) {
        float d = use_wd ? g[i] + wd * w[i] : g[i];
        if (use_mom) {
            /* torch: buf = clone(d) on the first step, no dampening */
            float b = first ? d : m * buf[i] + damp1 * d;
            buf[i] = b;
            d = nesterov ? d + m * b : b;
        }
        w[i] += nlr * d;
    }
}

void ps_optim_sgd(float *restrict w, float *restrict buf, const float *restrict g, size_t n,
                  float lr, float wd, const ps_optim_config_t *c, int first)
{
    const float m = c->momentum, nlr = -lr;
    const float damp1 = (float)(1.0 - (double)c->dampening);
    const int use_wd = wd != 0; /* torch skips the decay term when it is 0 */
#define SGD_(uw, um, f, nv) sgd_loop(w, buf, g, n, nlr, wd, m, damp1, uw, um, f, nv)
    if (m == 0 || !buf) {
        if (use_wd) SGD_(1, 0, 0, 0);
        else SGD_(0, 0, 0, 0);
    } else if (first) {
        if (c->nesterov) {
            if (use_wd) SGD_(1, 1, 1, 1);
            else SGD_(0, 1, 1, 1);
        } else {
            if (use_wd) SGD_(1, 1, 1, 0);
            else SGD_(0, 1, 1, 0);
        }
    } else if (c->nesterov) {
        if (use_wd) SGD_(1, 1, 0, 1);
        else SGD_(0, 1, 0, 1);
    } else {
        if (use_wd) SGD_(1, 1, 0, 0);
        else SGD_(0, 1, 0, 0);
    }
#undef SGD_
}

int ps_optim_apply_partition(const ps_optim_config_t *c, const ps_partition_table_t *t,
                             uint32_t part, float *w, float *buf, const float *grad, uint64_t step)
{
    if (!c || !t || !w || !grad) {
        ps_error("optim: NULL argument");
        return PS_EINVAL;
    }
    if (part >= t->nparts) {
        ps_error("optim: partition %u out of range (table has %u)", part, t->nparts);
        return PS_EINVAL;
    }
    if (c->momentum != 0 && !buf) {
        ps_error("optim: partition %u: momentum %g needs a momentum buffer", part, c->momentum);
        return PS_EINVAL;
    }
    ps_partition_segment_t stack_seg[32], *seg = stack_seg;
    uint32_t nseg = ps_partition_segments(t, part, seg, 32);
    if (nseg > 32) {
        if (!(seg = malloc(nseg * sizeof *seg))) {
            ps_error("optim: out of memory for %u segments", nseg);
            return PS_ENOMEM;
        }
        uint32_t again = ps_partition_segments(t, part, seg, nseg);
        if (again != nseg) {
            ps_error("optim: partition %u: segment count changed (%u then %u)", part, nseg, again);
            free(seg);
            return PS_EINVAL;
        }
    }
    /* Check everything before touching w so a bad table never leaves a
     * partially updated partition. */
    int rc = 0;
    size_t covered = 0;
    for (uint32_t i = 0; i < nseg && !rc; i++) {
        const ps_partition_segment_t *s = &seg[i];
        int grp = s->tensor < t->ntensors ? t->tensors[s->tensor].group : -1;
        if (grp >= 0 && grp < c->ngroups && c->group_kind[grp] != PS_GROUP_SGD &&
            c->group_kind[grp] != PS_GROUP_AVERAGE) {
            ps_error("optim: partition %u: group %d has unknown kind %d", part, grp, c->group_kind[grp]);
            rc = PS_EINVAL;
        } else if (s->tensor >= t->ntensors || grp < 0 || grp >= c->ngroups) {
            ps_error("optim: partition %u: tensor %u (%s) has group %d, config has %d groups", part,
                     s->tensor, s->tensor < t->ntensors ? t->tensors[s->tensor].name : "?", grp,
                     c->ngroups);
            rc = PS_EINVAL;
        } else if (s->part_offset != covered || s->numel > t->parts[part].numel - covered) {
            ps_error("optim: partition %u: segment %u [%zu, +%zu) does not tile the partition", part,
                     i, s->part_offset, s->numel);
            rc = PS_EINVAL;
        }
        covered += s->numel;
    }
    if (!rc && covered != t->parts[part].numel) {
        ps_error("optim: partition %u: segments cover %zu of %zu elements", part, covered,
                 t->parts[part].numel);
        rc = PS_EINVAL;
    }
    for (uint32_t i = 0; i < nseg && !rc; i++) {
        const ps_partition_segment_t *s = &seg[i];
        const ps_param_group_t *g = &c->groups[t->tensors[s->tensor].group];
        if (c->group_kind[t->tensors[s->tensor].group] == PS_GROUP_AVERAGE) {
            float *ws = w + s->part_offset;
            const float *gs = grad + s->part_offset;
            PS_SIMD
            for (size_t k = 0; k < s->numel; k++) ws[k] -= gs[k];
            continue;
        }
        float lr = ps_optim_lr_group(c, step, g->lr_mult);
        float wd = (float)((double)c->weight_decay * g->wd_mult);
        ps_optim_sgd(w + s->part_offset, buf ? buf + s->part_offset : NULL, grad + s->part_offset,
                     s->numel, lr, wd, c, step == 0);
    }
    if (seg != stack_seg) free(seg);
    return rc;
}

float ps_optim_clip_factor(double sqnorm, float max_norm)
{
    if (!(max_norm > 0)) return 1.0f;
    if (isnan(sqnorm) || sqnorm < 0) return NAN; /* poisoned gradient: let the caller see it */
    double f = (double)max_norm / (sqrt(sqnorm) + 1e-6);
    return f < 1.0 ? (float)f : 1.0f;
}

/* ---- JSON -------------------------------------------------------------------- */

/* Shortest decimal that reads back as the same float, so the JSON says 0.1
 * rather than 0.100000001490116. */
static cJSON *num_f(float v)
{
    char buf[32];
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    return isfinite(v) ? cJSON_CreateNumber(strtod(buf, NULL)) : cJSON_CreateNull();
}

/* cJSON prints numbers with 15 significant digits when they are "close
 * enough", which loses large step counts; print integers ourselves. */
static cJSON *num_u64(uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

static const char *sched_names[] = {"const", "step", "cosine"};

char *ps_optim_config_to_json(const ps_optim_config_t *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddItemToObject(o, "lr", num_f(c->lr));
    cJSON_AddItemToObject(o, "momentum", num_f(c->momentum));
    cJSON_AddItemToObject(o, "dampening", num_f(c->dampening));
    cJSON_AddBoolToObject(o, "nesterov", c->nesterov != 0);
    cJSON_AddItemToObject(o, "weight_decay", num_f(c->weight_decay));
    cJSON_AddNumberToObject(o, "ref_batch", c->ref_batch);
    cJSON_AddNumberToObject(o, "global_batch", c->global_batch);
    int s = (int)c->sched;
    cJSON_AddStringToObject(o, "sched", s >= 0 && s < 3 ? sched_names[s] : "?");
    cJSON_AddItemToObject(o, "warmup_steps", num_u64(c->warmup_steps));
    cJSON_AddItemToObject(o, "warmup_factor", num_f(c->warmup_factor));
    cJSON *ms = cJSON_AddArrayToObject(o, "milestones");
    for (int i = 0; ms && i < c->nmilestones && i < PS_OPTIM_MAX_MILESTONES; i++)
        cJSON_AddItemToArray(ms, num_u64(c->milestones[i]));
    cJSON_AddItemToObject(o, "gamma", num_f(c->gamma));
    cJSON_AddItemToObject(o, "total_steps", num_u64(c->total_steps));
    cJSON_AddItemToObject(o, "min_lr", num_f(c->min_lr));
    cJSON *gs = cJSON_AddArrayToObject(o, "groups");
    for (int i = 0; gs && i < c->ngroups && i < PS_OPTIM_MAX_GROUPS; i++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddItemToObject(g, "lr_mult", num_f(c->groups[i].lr_mult));
        cJSON_AddItemToObject(g, "wd_mult", num_f(c->groups[i].wd_mult));
        if (c->group_kind[i] == PS_GROUP_AVERAGE) cJSON_AddStringToObject(g, "kind", "average");
        cJSON_AddItemToArray(gs, g);
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return txt;
}

static int get_float(const cJSON *v, const char *key, float *out, char *err, size_t errlen)
{
    if (!cJSON_IsNumber(v)) return bad(err, errlen, "key \"%s\": expected a number", key);
    double d = v->valuedouble;
    if (!isfinite(d) || fabs(d) > 3.4e38)
        return bad(err, errlen, "key \"%s\": %g does not fit a float", key, d);
    *out = (float)d;
    return 0;
}

static int get_u64(const cJSON *v, const char *key, uint64_t *out, char *err, size_t errlen)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > MAX_STEP)
        return bad(err, errlen, "key \"%s\": expected an integer in [0, 2^53]", key);
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static int get_int(const cJSON *v, const char *key, int *out, char *err, size_t errlen)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < -2147483648.0 ||
        v->valuedouble > 2147483647.0)
        return bad(err, errlen, "key \"%s\": expected an integer", key);
    *out = (int)v->valuedouble;
    return 0;
}

/* Reject keys seen twice: cJSON keeps both and a lookup would pick one. */
static int check_keys(const cJSON *o, const char *what, const char *const *known, char *err,
                      size_t errlen)
{
    for (const cJSON *a = o->child; a; a = a->next) {
        int k = 0;
        while (known[k] && strcmp(known[k], a->string)) k++;
        if (!known[k]) return bad(err, errlen, "%sunknown key \"%.64s\"", what, a->string);
        for (const cJSON *b = o->child; b != a; b = b->next)
            if (!strcmp(a->string, b->string))
                return bad(err, errlen, "%sduplicate key \"%.64s\"", what, a->string);
    }
    return 0;
}

static int parse_groups(ps_optim_config_t *c, const cJSON *v, char *err, size_t errlen)
{
    static const char *const gkeys[] = {"lr_mult", "wd_mult", "kind", NULL};
    if (!cJSON_IsArray(v)) return bad(err, errlen, "key \"groups\": expected an array");
    int n = cJSON_GetArraySize(v);
    if (n < 1 || n > PS_OPTIM_MAX_GROUPS)
        return bad(err, errlen, "key \"groups\": %d groups, must be 1..%d", n, PS_OPTIM_MAX_GROUPS);
    int i = 0;
    for (const cJSON *g = v->child; g; g = g->next, i++) {
        char what[48], key[64];
        snprintf(what, sizeof what, "groups[%d]: ", i);
        if (!cJSON_IsObject(g)) return bad(err, errlen, "key \"groups[%d]\": expected an object", i);
        int rc = check_keys(g, what, gkeys, err, errlen);
        if (rc) return rc;
        c->groups[i].lr_mult = c->groups[i].wd_mult = 1.0f;
        c->group_kind[i] = PS_GROUP_SGD;
        for (const cJSON *kv = g->child; kv; kv = kv->next) {
            snprintf(key, sizeof key, "groups[%d].%s", i, kv->string);
            if (!strcmp(kv->string, "kind")) {
                if (cJSON_IsString(kv) && !strcmp(kv->valuestring, "sgd")) continue;
                if (cJSON_IsString(kv) && !strcmp(kv->valuestring, "average")) {
                    c->group_kind[i] = PS_GROUP_AVERAGE;
                    continue;
                }
                return bad(err, errlen, "key \"%s\": expected \"sgd\" or \"average\"", key);
            }
            rc = get_float(kv, key, !strcmp(kv->string, "lr_mult") ? &c->groups[i].lr_mult
                                                                    : &c->groups[i].wd_mult,
                           err, errlen);
            if (rc) return rc;
        }
    }
    c->ngroups = n;
    return 0;
}

static int parse_key(ps_optim_config_t *c, const cJSON *v, char *err, size_t errlen)
{
    const char *k = v->string;
    if (!strcmp(k, "lr")) return get_float(v, k, &c->lr, err, errlen);
    if (!strcmp(k, "momentum")) return get_float(v, k, &c->momentum, err, errlen);
    if (!strcmp(k, "dampening")) return get_float(v, k, &c->dampening, err, errlen);
    if (!strcmp(k, "weight_decay")) return get_float(v, k, &c->weight_decay, err, errlen);
    if (!strcmp(k, "warmup_factor")) return get_float(v, k, &c->warmup_factor, err, errlen);
    if (!strcmp(k, "gamma")) return get_float(v, k, &c->gamma, err, errlen);
    if (!strcmp(k, "min_lr")) return get_float(v, k, &c->min_lr, err, errlen);
    if (!strcmp(k, "ref_batch")) return get_int(v, k, &c->ref_batch, err, errlen);
    if (!strcmp(k, "global_batch")) return get_int(v, k, &c->global_batch, err, errlen);
    if (!strcmp(k, "warmup_steps")) return get_u64(v, k, &c->warmup_steps, err, errlen);
    if (!strcmp(k, "total_steps")) return get_u64(v, k, &c->total_steps, err, errlen);
    if (!strcmp(k, "nesterov")) {
        if (!cJSON_IsBool(v)) return bad(err, errlen, "key \"nesterov\": expected true or false");
        c->nesterov = cJSON_IsTrue(v);
        return 0;
    }
    if (!strcmp(k, "sched")) {
        for (int i = 0; i < 3; i++)
            if (cJSON_IsString(v) && !strcmp(v->valuestring, sched_names[i])) {
                c->sched = (ps_sched_kind_t)i;
                return 0;
            }
        return bad(err, errlen, "key \"sched\": expected \"const\", \"step\" or \"cosine\"");
    }
    if (!strcmp(k, "milestones")) {
        if (!cJSON_IsArray(v)) return bad(err, errlen, "key \"milestones\": expected an array");
        int n = cJSON_GetArraySize(v), i = 0;
        if (n > PS_OPTIM_MAX_MILESTONES)
            return bad(err, errlen, "key \"milestones\": %d entries, at most %d", n, PS_OPTIM_MAX_MILESTONES);
        for (const cJSON *m = v->child; m; m = m->next, i++) {
            char key[32];
            snprintf(key, sizeof key, "milestones[%d]", i);
            int rc = get_u64(m, key, &c->milestones[i], err, errlen);
            if (rc) return rc;
        }
        c->nmilestones = n;
        return 0;
    }
    return parse_groups(c, v, err, errlen); /* only "groups" is left after check_keys */
}

int ps_optim_config_from_json(ps_optim_config_t *out, const char *json, char *err, size_t errlen)
{
    static const char *const keys[] = {"lr", "momentum", "dampening", "nesterov", "weight_decay",
                                       "ref_batch", "global_batch", "sched", "warmup_steps",
                                       "warmup_factor", "milestones", "gamma", "total_steps",
                                       "min_lr", "groups", NULL};
    if (err && errlen) err[0] = 0;
    if (!out || !json) return bad(err, errlen, "NULL argument");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) return bad(err, errlen, "not valid JSON (near \"%.20s\")", end ? end : "");
    ps_optim_config_t c;
    ps_optim_config_default(&c);
    int rc = cJSON_IsObject(root) ? 0 : bad(err, errlen, "not a JSON object");
    if (!rc) rc = check_keys(root, "", keys, err, errlen);
    for (const cJSON *v = root->child; v && !rc; v = v->next) rc = parse_key(&c, v, err, errlen);
    cJSON_Delete(root);
    if (!rc) rc = ps_optim_config_validate(&c, err, errlen);
    if (!rc) *out = c;
    return rc;
}
