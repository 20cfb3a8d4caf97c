/* Optimizer: hand-derived SGD / schedule values, config validation and JSON,
 * then torch.optim.SGD + LR-scheduler golden runs (gen_optim.py) replayed
 * partition by partition through ps_optim_apply_partition, and the clip
 * factor against torch.nn.utils.clip_grad_norm_. */
#include "ps_error.h"
#include "ps_log.h"
#include "ps_optim.h"
#include "ps_partition.h"
#include "tests/lib/tap.h"

#include <stdint.h>
#include <string.h>

static const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s && *s ? s : ".";
}

/* ---- closed form ------------------------------------------------------------ */

static void run_steps(ps_optim_config_t *c, float *w, float *buf, float g, int steps, float lr, float wd)
{
    for (int s = 0; s < steps; s++) ps_optim_sgd(w, buf, &g, 1, lr, wd, c, s == 0);
}

static void test_closed_form(void)
{
    ps_optim_config_t c;
    ps_optim_config_default(&c);
    float w, buf;
    /* momentum 0.9, g = 1, lr 0.1: buf 1, 1.9, 2.71; w -0.1, -0.29, -0.561 */
    c.momentum = 0.9f;
    w = 0; run_steps(&c, &w, &buf, 1, 1, 0.1f, 0);
    is_close(w, -0.1, 1e-7, 0, "momentum step 1: w = -lr*g (buffer starts at g)");
    is_close(buf, 1.0, 0, 0, "momentum step 1: buf = g");
    w = 0; run_steps(&c, &w, &buf, 1, 3, 0.1f, 0);
    is_close(w, -0.561, 1e-6, 0, "momentum step 3: w = -0.1*(1 + 1.9 + 2.71)");
    is_close(buf, 2.71, 1e-6, 0, "momentum step 3: buf = 1 + 0.9 + 0.81");
    /* nesterov: d = g + m*buf: 1.9, 2.71 */
    c.nesterov = 1;
    w = 0; run_steps(&c, &w, &buf, 1, 2, 0.1f, 0);
    is_close(w, -0.461, 1e-6, 0, "nesterov step 2: w = -0.1*(1.9 + 2.71)");
    c.nesterov = 0;
    /* dampening 0.5: first step undampened, then buf = 0.9*1 + 0.5*1 */
    c.dampening = 0.5f;
    w = 0; run_steps(&c, &w, &buf, 1, 2, 0.1f, 0);
    is_close(buf, 1.4, 1e-6, 0, "dampening: buf after 2 steps = 0.9 + 0.5");
    is_close(w, -0.24, 1e-6, 0, "dampening: w = -0.1*(1 + 1.4)");
    c.dampening = 0;
    /* weight decay alone: w_k = (1 - lr*wd)^k */
    c.momentum = 0;
    w = 1; run_steps(&c, &w, NULL, 0, 10, 0.5f, 0.1f);
    is_close(w, pow(0.95, 10), 1e-6, 1e-6, "weight decay: (1 - lr*wd)^10 with buf NULL");
    /* weight decay with momentum, g = 0, w0 = 1, lr 1, wd 0.5, m 0.5:
     * step1 d=0.5 buf=0.5 w=0.5; step2 d=0.25 buf=0.5 w=0 */
    c.momentum = 0.5f;
    w = 1; run_steps(&c, &w, &buf, 0, 2, 1.0f, 0.5f);
    is_close(w, 0.0, 1e-7, 0, "weight decay + momentum, 2 steps (hand-derived)");
    is_close(buf, 0.5, 1e-7, 0, "  buffer");
    /* vector path agrees with the scalar one on a long array (n not a
     * multiple of any vector width) */
    enum { N = 1027 };
    static float wv[N], bv[N], gv[N], ws[N], bs[N];
    for (int i = 0; i < N; i++) wv[i] = ws[i] = sinf(i), gv[i] = cosf(3 * i);
    c.momentum = 0.9f;
    c.nesterov = 1;
    for (int s = 0; s < 3; s++) {
        ps_optim_sgd(wv, bv, gv, N, 0.01f, 0.001f, &c, s == 0);
        for (int i = 0; i < N; i++) ps_optim_sgd(ws + i, bs + i, gv + i, 1, 0.01f, 0.001f, &c, s == 0);
    }
    ok(!memcmp(wv, ws, sizeof wv) && !memcmp(bv, bs, sizeof bv), "array update == element-wise update");
}

static void test_schedule(void)
{
    ps_optim_config_t c;
    ps_optim_config_default(&c);
    c.lr = 0.1f;
    is_close(ps_optim_lr(&c, 12345), 0.1f, 0, 0, "constant schedule");
    c.ref_batch = 256;
    c.global_batch = 2048;
    is_close(ps_optim_lr(&c, 0), 0.8, 1e-7, 0, "linear scaling rule: 0.1 * 2048 / 256");
    c.warmup_steps = 10;
    c.warmup_factor = 0.1f;
    is_close(ps_optim_lr(&c, 0), 0.08, 1e-7, 1e-6, "warmup start: factor * base");
    is_close(ps_optim_lr(&c, 5), 0.8 * (0.1 + 0.9 * 0.5), 1e-7, 1e-6, "warmup midpoint");
    is_close(ps_optim_lr(&c, 10), 0.8, 1e-7, 1e-6, "warmup done at warmup_steps");
    c.sched = PS_SCHED_STEP;
    c.milestones[0] = 30;
    c.milestones[1] = 60;
    c.nmilestones = 2;
    c.gamma = 0.1f;
    is_close(ps_optim_lr(&c, 29), 0.8, 1e-7, 1e-6, "step: before milestone 30");
    is_close(ps_optim_lr(&c, 30), 0.08, 1e-8, 1e-6, "step: at milestone 30");
    is_close(ps_optim_lr(&c, 60), 0.008, 1e-9, 1e-6, "step: at milestone 60");
    is_close(ps_optim_lr_group(&c, 60, 5), 0.04, 1e-9, 1e-6, "step: group lr_mult 5");
    c.sched = PS_SCHED_COSINE;
    c.total_steps = 110;
    c.min_lr = 0.001f;
    is_close(ps_optim_lr(&c, 10), 0.8, 1e-7, 1e-6, "cosine starts at base after warmup");
    is_close(ps_optim_lr(&c, 60), (0.8 + 0.001) / 2, 1e-7, 1e-6, "cosine midpoint = (base+min)/2");
    is_close(ps_optim_lr(&c, 110), 0.001, 1e-9, 1e-6, "cosine reaches min_lr at total_steps");
    is_close(ps_optim_lr(&c, 500), 0.001, 1e-9, 1e-6, "cosine stays at min_lr after");
    is_close(ps_optim_lr_group(&c, 60, 2), (1.6 + 0.001) / 2, 1e-7, 1e-6,
             "cosine group: decays lr*mult to the unscaled min_lr (torch eta_min)");
    is_close(ps_optim_lr_group(&c, 5, 2), 1.6 * 0.55, 1e-7, 1e-6, "warmup scales the group lr");
}

/* ---- validation and JSON --------------------------------------------------- */

typedef void (*mut_fn)(ps_optim_config_t *);
#define MUT(name, body) static void name(ps_optim_config_t *c) { body; }
MUT(m_neg_lr, c->lr = -0.1f)
MUT(m_nan_lr, c->lr = NAN)
MUT(m_inf_lr, c->lr = INFINITY)
MUT(m_mom1, c->momentum = 1.0f)
MUT(m_mom_neg, c->momentum = -0.1f)
MUT(m_mom_nan, c->momentum = NAN)
MUT(m_damp, c->dampening = 1.5f)
MUT(m_nest_m0, c->nesterov = 1; c->momentum = 0)
MUT(m_nest_damp, c->nesterov = 1; c->dampening = 0.1f)
MUT(m_wd_neg, c->weight_decay = -1e-4f)
MUT(m_wd_nan, c->weight_decay = NAN)
MUT(m_ref_nogb, c->ref_batch = 256; c->global_batch = 0)
MUT(m_sched, c->sched = (ps_sched_kind_t)7)
MUT(m_wf0, c->warmup_steps = 5; c->warmup_factor = 0)
MUT(m_wf2, c->warmup_steps = 5; c->warmup_factor = 2)
MUT(m_ms_order, c->sched = PS_SCHED_STEP; c->nmilestones = 2; c->milestones[0] = 20; c->milestones[1] = 10)
MUT(m_ms_warm, c->warmup_steps = 10; c->nmilestones = 1; c->milestones[0] = 5)
MUT(m_ms_n, c->nmilestones = PS_OPTIM_MAX_MILESTONES + 1)
MUT(m_gamma, c->gamma = 0)
MUT(m_cos, c->sched = PS_SCHED_COSINE; c->warmup_steps = 10; c->total_steps = 10)
MUT(m_minlr, c->min_lr = NAN)
MUT(m_ng0, c->ngroups = 0)
MUT(m_ng17, c->ngroups = PS_OPTIM_MAX_GROUPS + 1)
MUT(m_lrmult, c->ngroups = 2; c->groups[1].lr_mult = -1)
MUT(m_wdmult, c->groups[0].wd_mult = NAN)

static void test_validate(void)
{
    static const struct { mut_fn f; const char *what, *word; } cases[] = {
        {m_neg_lr, "negative lr", "lr"},           {m_nan_lr, "NaN lr", "lr"},
        {m_inf_lr, "Inf lr", "lr"},                {m_mom1, "momentum 1", "momentum"},
        {m_mom_neg, "negative momentum", "momentum"}, {m_mom_nan, "NaN momentum", "momentum"},
        {m_damp, "dampening 1.5", "dampening"},    {m_nest_m0, "nesterov with momentum 0", "nesterov"},
        {m_nest_damp, "nesterov with dampening", "nesterov"}, {m_wd_neg, "negative weight decay", "weight_decay"},
        {m_wd_nan, "NaN weight decay", "weight_decay"}, {m_ref_nogb, "ref_batch without global_batch", "global_batch"},
        {m_sched, "unknown schedule", "sched"},    {m_wf0, "warmup factor 0", "warmup_factor"},
        {m_wf2, "warmup factor 2", "warmup_factor"}, {m_ms_order, "decreasing milestones", "milestones"},
        {m_ms_warm, "milestone inside warmup", "milestones"}, {m_ms_n, "17 milestones", "nmilestones"},
        {m_gamma, "gamma 0", "gamma"},             {m_cos, "cosine total <= warmup", "total_steps"},
        {m_minlr, "NaN min_lr", "min_lr"},         {m_ng0, "0 groups", "ngroups"},
        {m_ng17, "17 groups", "ngroups"},          {m_lrmult, "negative lr_mult", "lr_mult"},
        {m_wdmult, "NaN wd_mult", "wd_mult"},
    };
    ps_optim_config_t c;
    char err[256];
    ps_optim_config_default(&c);
    is_int(ps_optim_config_validate(&c, err, sizeof err), 0, "defaults are valid");
    ok(c.lr == 0.01f && c.momentum == 0.9f && c.ngroups == 1 && c.groups[0].lr_mult == 1 &&
       c.groups[0].wd_mult == 1 && c.sched == PS_SCHED_CONST, "defaults as documented");
    int lvl = ps_log_level;
    ps_log_level = -1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_optim_config_default(&c);
        cases[i].f(&c);
        err[0] = 0;
        int rc = ps_optim_config_validate(&c, err, sizeof err);
        ok(rc == PS_EINVAL && strstr(err, cases[i].word), "reject %s: %s", cases[i].what, err);
    }
    ps_log_level = lvl;
}

/* Field by field: memcmp would also compare padding bytes. */
static int same_config(const ps_optim_config_t *a, const ps_optim_config_t *b)
{
    int same = a->lr == b->lr && a->momentum == b->momentum && a->dampening == b->dampening &&
               a->nesterov == b->nesterov && a->weight_decay == b->weight_decay &&
               a->ref_batch == b->ref_batch && a->global_batch == b->global_batch &&
               a->sched == b->sched && a->warmup_steps == b->warmup_steps &&
               a->warmup_factor == b->warmup_factor && a->nmilestones == b->nmilestones &&
               a->gamma == b->gamma && a->total_steps == b->total_steps && a->min_lr == b->min_lr &&
               a->ngroups == b->ngroups;
    for (int i = 0; same && i < a->nmilestones; i++) same = a->milestones[i] == b->milestones[i];
    for (int i = 0; same && i < a->ngroups; i++)
        same = a->groups[i].lr_mult == b->groups[i].lr_mult && a->groups[i].wd_mult == b->groups[i].wd_mult;
    return same;
}

static void test_json(void)
{
    ps_optim_config_t c, d;
    char err[256];
    ps_optim_config_default(&c);
    c.lr = 0.1f; c.momentum = 0.875f; c.nesterov = 1; c.weight_decay = 1e-4f;
    c.ref_batch = 256; c.global_batch = 1536; c.sched = PS_SCHED_STEP;
    c.warmup_steps = 500; c.warmup_factor = 0.01f;
    c.nmilestones = 3; c.milestones[0] = 1000; c.milestones[1] = 2000; c.milestones[2] = 9007199254740992ull;
    c.gamma = 0.5f; c.total_steps = 3000; c.min_lr = 1e-5f;
    c.ngroups = 3; c.groups[1].lr_mult = 2; c.groups[1].wd_mult = 0; c.groups[2].lr_mult = 5; c.groups[2].wd_mult = 1;
    char *js = ps_optim_config_to_json(&c);
    ok(js != NULL, "to_json: %s", js ? js : "(null)");
    ok(js && strstr(js, "\"lr\":0.1,") && strstr(js, "\"sched\":\"step\""), "floats printed shortest, sched by name");
    memset(&d, 0x5a, sizeof d);
    is_int(ps_optim_config_from_json(&d, js, err, sizeof err), 0, "from_json of to_json %s", err);
    ok(same_config(&c, &d), "JSON round trip is exact (every field)");
    free(js);

    ps_optim_config_default(&c);
    is_int(ps_optim_config_from_json(&d, "{}", err, sizeof err), 0, "empty object gives defaults");
    ok(same_config(&c, &d), "  equal to ps_optim_config_default");
    is_int(ps_optim_config_from_json(&d, " {\"lr\": 0.5, \"sched\": \"cosine\", \"total_steps\": 100} ", err, sizeof err),
           0, "partial object with spaces");
    ok(d.lr == 0.5f && d.sched == PS_SCHED_COSINE && d.total_steps == 100 && d.momentum == 0.9f, "  values taken, rest default");

    static const struct { const char *js, *word, *what; } badj[] = {
        {"{\"lr\":0.1,\"lrr\":1}", "lrr", "unknown key"},
        {"{\"lr\":\"0.1\"}", "lr", "string for a number"},
        {"{\"momentum\":null}", "momentum", "null for a number"},
        {"{\"nesterov\":1}", "nesterov", "number for a bool"},
        {"{\"warmup_steps\":-1}", "warmup_steps", "negative step count"},
        {"{\"warmup_steps\":1.5}", "warmup_steps", "fractional step count"},
        {"{\"total_steps\":1e300}", "total_steps", "huge step count"},
        {"{\"ref_batch\":3e9}", "ref_batch", "int overflow"},
        {"{\"sched\":\"linear\"}", "sched", "unknown schedule name"},
        {"{\"sched\":2}", "sched", "schedule as a number"},
        {"{\"milestones\":5}", "milestones", "milestones not an array"},
        {"{\"milestones\":[10,\"x\"]}", "milestones[1]", "bad milestone"},
        {"{\"milestones\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "milestones", "17 milestones"},
        {"{\"groups\":[]}", "groups", "no groups"},
        {"{\"groups\":[1]}", "groups[0]", "group not an object"},
        {"{\"groups\":[{\"lr_mult\":1,\"decay\":0}]}", "decay", "unknown group key"},
        {"{\"groups\":[{\"lr_mult\":true}]}", "groups[0].lr_mult", "bool multiplier"},
        {"{\"lr\":1e39}", "lr", "lr beyond float range"},
        {"{\"lr\":0.1,\"lr\":0.2}", "lr", "duplicate key"},
        {"{\"momentum\":1.5}", "momentum", "valid JSON, invalid value"},
        {"{\"nesterov\":true,\"momentum\":0}", "nesterov", "nesterov without momentum"},
        {"[1,2]", "object", "not an object"},
        {"{\"lr\":0.1", "JSON", "truncated JSON"},
        {"{\"lr\":0.1} x", "JSON", "trailing garbage"},
    };
    int lvl = ps_log_level;
    ps_log_level = -1;
    for (size_t i = 0; i < sizeof badj / sizeof badj[0]; i++) {
        ps_optim_config_default(&d);
        d.lr = 0.125f; /* sentinel: must survive a failed parse */
        err[0] = 0;
        int rc = ps_optim_config_from_json(&d, badj[i].js, err, sizeof err);
        ok(rc == PS_EINVAL && strstr(err, badj[i].word) && d.lr == 0.125f, "reject %s: %s", badj[i].what, err);
    }
    ps_log_level = lvl;
}

/* ---- golden (torch) ----------------------------------------------------------- */

static int read_floats(FILE *f, float *dst, size_t n)
{
    return fread(dst, sizeof *dst, n, f) == n ? 0 : -1;
}

static void golden_case(const char *name)
{
    char path[1024], line[8192], err[256];
    snprintf(path, sizeof path, "%s/tests/golden/optim_%s.txt", srcdir(), name);
    FILE *tf = fopen(path, "r");
    if (!ok(tf != NULL, "open %s", path)) return;
    ps_optim_config_t c;
    ps_tensor_spec_t specs[32];
    char names[32][64];
    uint32_t nt = 0;
    size_t pbytes = 0, total = 0;
    unsigned nservers = 0, steps = 0, has_buf = 0;
    int cfg_rc = -1;
    static double lrs[64][PS_OPTIM_MAX_GROUPS];
    while (fgets(line, sizeof line, tf)) {
        if (!strncmp(line, "config ", 7)) cfg_rc = ps_optim_config_from_json(&c, line + 7, err, sizeof err);
        else if (sscanf(line, "partition_bytes %zu", &pbytes) == 1) continue;
        else if (sscanf(line, "nservers %u", &nservers) == 1) continue;
        else if (sscanf(line, "steps %u", &steps) == 1) continue;
        else if (sscanf(line, "has_buf %u", &has_buf) == 1) continue;
        else if (!strncmp(line, "tensor ", 7) && nt < 32) {
            sscanf(line + 7, "%63s %zu %d", names[nt], &specs[nt].numel, &specs[nt].group);
            specs[nt].name = names[nt];
            total += specs[nt].numel;
            nt++;
        } else if (!strncmp(line, "lr ", 3)) {
            char *p = line + 3;
            long s = strtol(p, &p, 10);
            for (int g = 0; s >= 0 && s < 64 && g < PS_OPTIM_MAX_GROUPS; g++) lrs[s][g] = strtod(p, &p);
        }
    }
    fclose(tf);
    is_int(cfg_rc, 0, "%s: config parses (%s)", name, err);
    if (cfg_rc || steps > 64 || !nt) return;

    /* schedule: every group's lr at every step */
    double worst = 0;
    for (unsigned s = 0; s < steps; s++)
        for (int g = 0; g < c.ngroups; g++) {
            double got = ps_optim_lr_group(&c, s, c.groups[g].lr_mult), want = lrs[s][g];
            double rel = fabs(got - want) / fabs(want);
            if (rel > worst) worst = rel;
        }
    ok(worst < 1e-6, "%s: lr of %d groups x %u steps match torch schedulers (worst rel %.2g)", name,
       c.ngroups, steps, worst);

    ps_partition_table_t t;
    int rc = ps_partition_table_build(&t, specs, nt, pbytes, nservers);
    is_int(rc, 0, "%s: partition table (%u tensors, %zu bytes/part, %u servers)", name, nt, pbytes, nservers);
    if (rc) return;
    ok(t.nparts > nt / 2, "%s: %u partitions (tensors split and shared)", name, t.nparts);

    snprintf(path, sizeof path, "%s/tests/golden/optim_%s.bin", srcdir(), name);
    FILE *bf = fopen(path, "rb");
    ok(bf != NULL, "open %s", path);
    float *w = malloc(total * sizeof *w), *buf = calloc(total, sizeof *buf);
    float *g = malloc(total * sizeof *g), *want = malloc(total * sizeof *want);
    rc = bf ? read_floats(bf, w, total) : -1;
    for (unsigned s = 0; s < steps && !rc; s++) {
        rc = read_floats(bf, g, total);
        for (uint32_t p = 0; p < t.nparts && !rc; p++) {
            size_t o = t.parts[p].offset;
            rc = ps_optim_apply_partition(&c, &t, p, w + o, has_buf ? buf + o : NULL, g + o, s);
        }
    }
    is_int(rc, 0, "%s: %u steps applied partition by partition", name, steps);
    if (!rc && !read_floats(bf, want, total))
        allclose(w, want, (long)total, 1e-6, 1e-6, "final weights vs torch.optim.SGD");
    if (!rc && has_buf && !read_floats(bf, want, total))
        allclose(buf, want, (long)total, 1e-6, 1e-6, "final momentum buffers vs torch");
    if (bf) {
        char extra;
        ok(fread(&extra, 1, 1, bf) == 0, "%s: golden file fully consumed", name);
        fclose(bf);
    }
    free(w); free(buf); free(g); free(want);
    ps_partition_table_free(&t);
}

static void test_apply_errors(void)
{
    ps_tensor_spec_t specs[2] = {{"a.weight", 6, 0}, {"a.bias", 2, 3}};
    ps_partition_table_t t;
    if (ps_partition_table_build(&t, specs, 2, 64, 1)) {
        ok(0, "build small table");
        return;
    }
    ps_optim_config_t c;
    ps_optim_config_default(&c);
    c.ngroups = 2;
    c.groups[1] = c.groups[0];
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, buf[8] = {0}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, w0[8];
    memcpy(w0, w, sizeof w);
    int lvl = ps_log_level;
    ps_log_level = -1;
    is_int(ps_optim_apply_partition(&c, &t, 0, w, buf, g, 0), PS_EINVAL, "tensor group 3 >= ngroups 2: PS_EINVAL");
    ok(!memcmp(w, w0, sizeof w), "  and nothing was updated");
    c.ngroups = 4;
    c.groups[2] = c.groups[3] = c.groups[0];
    is_int(ps_optim_apply_partition(&c, &t, t.nparts, w, buf, g, 0), PS_EINVAL, "partition out of range");
    is_int(ps_optim_apply_partition(&c, &t, 0, w, NULL, g, 0), PS_EINVAL, "momentum without a buffer");
    ps_log_level = lvl;
    c.groups[3].lr_mult = 2;
    c.groups[3].wd_mult = 0;
    c.weight_decay = 0.5f;
    c.momentum = 0;
    is_int(ps_optim_apply_partition(&c, &t, 0, w, NULL, g, 0), 0, "apply with 4 groups");
    /* a.weight: w - 0.01*(1 + 0.5*w); a.bias: lr x2, no decay: w - 0.02 */
    ok(fabsf(w[0] - (1 - 0.01f * 1.5f)) < 1e-6f && fabsf(w[5] - (6 - 0.01f * 4)) < 1e-6f &&
       fabsf(w[6] - (7 - 0.02f)) < 1e-6f && fabsf(w[7] - (8 - 0.02f)) < 1e-6f,
       "per-segment multipliers: %g %g %g %g", w[0], w[5], w[6], w[7]);
    ps_partition_table_free(&t);
}

static void test_clip(void)
{
    is_close(ps_optim_clip_factor(100.0, 1.0f), 1.0 / (10 + 1e-6), 1e-9, 1e-7, "clip: norm 10, max 1");
    is_close(ps_optim_clip_factor(100.0, 50.0f), 1.0, 0, 0, "clip: under max gives 1");
    is_close(ps_optim_clip_factor(0.0, 1.0f), 1.0, 0, 0, "clip: zero gradient gives 1");
    is_close(ps_optim_clip_factor(1e12, 0.0f), 1.0, 0, 0, "clip: max_norm 0 disables");
    is_close(ps_optim_clip_factor(1e12, -1.0f), 1.0, 0, 0, "clip: negative max_norm disables");
    is_close(ps_optim_clip_factor(INFINITY, 1.0f), 0.0, 0, 0, "clip: Inf norm gives 0 (as torch)");
    ok(isnan(ps_optim_clip_factor(NAN, 1.0f)), "clip: NaN norm gives NaN");

    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/tests/golden/optim_clip.txt", srcdir());
    FILE *tf = fopen(path, "r");
    snprintf(path, sizeof path, "%s/tests/golden/optim_clip.bin", srcdir());
    FILE *bf = fopen(path, "rb");
    if (!ok(tf && bf, "open optim_clip golden files")) {
        if (tf) fclose(tf);
        if (bf) fclose(bf);
        return;
    }
    size_t total = 0;
    float *g = NULL, *want = NULL, *got = NULL;
    double sq = 0;
    while (fgets(line, sizeof line, tf)) {
        double maxn, tnorm;
        if (!strncmp(line, "sizes ", 6)) {
            char *p = line + 6, *q;
            for (long v; (v = strtol(p, &q, 10)), q != p; p = q) total += (size_t)v;
            g = malloc(total * 4); want = malloc(total * 4); got = malloc(total * 4);
            if (read_floats(bf, g, total)) break;
            for (size_t i = 0; i < total; i++) sq += (double)g[i] * g[i];
        } else if (g && sscanf(line, "clip %lf %lf", &maxn, &tnorm) == 2) {
            is_close(sqrt(sq), tnorm, 0, 1e-6, "total norm vs clip_grad_norm_ return");
            float f = ps_optim_clip_factor(sq, (float)maxn);
            for (size_t i = 0; i < total; i++) got[i] = g[i] * f;
            if (!read_floats(bf, want, total)) {
                char what[64];
                snprintf(what, sizeof what, "clipped gradient, max_norm %g", maxn);
                allclose(got, want, (long)total, 1e-7, 1e-6, what);
            }
        }
    }
    fclose(tf);
    fclose(bf);
    free(g); free(want); free(got);
}

int main(void)
{
    test_closed_form();
    test_schedule();
    test_validate();
    test_json();
    golden_case("momentum");
    golden_case("nesterov_step");
    golden_case("dampening_cosine");
    golden_case("plain_cosine");
    test_apply_errors();
    test_clip();
    return tap_done();
}
