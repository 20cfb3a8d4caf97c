/* The AVERAGE parameter group (ps_optim.h) that carries BN running
 * statistics through the servers: closed-form checks of w -= mean(g) with
 * g_r = w - local_r giving w = mean(local_r), untouched by lr, schedule,
 * warmup, weight decay and momentum, beside an ordinary SGD segment of the
 * same partition; fp16 / bf16 wire rounding of the differences within the
 * stated bound; the JSON form ("kind": "average") and its errors. */
#include "ps_error.h"
#include "ps_half.h"
#include "ps_log.h"
#include "ps_optim.h"
#include "ps_partition.h"
#include "tests/lib/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NW 16 /* conv weight elements */
#define NS 8  /* running_mean elements */
#define N (NW + NS)
#define NWORK 3

/* Deterministic "workers' local statistics": mean and spread of a BN. */
static float local_stat(int r, int i) { return 0.3f * sinf(1.7f * i + r) + (float)r * 0.05f - 0.1f; }

static void build(ps_partition_table_t *t, ps_optim_config_t *c)
{
    ps_tensor_spec_t specs[2] = {{"conv.weight", NW, 0}, {"bn.running_mean", NS, 1}};
    if (ps_partition_table_build(t, specs, 2, 1 << 20, 1)) abort();
    ps_optim_config_default(c);
    c->lr = 0.1f;
    c->momentum = 0.9f;
    c->weight_decay = 1e-2f;
    c->sched = PS_SCHED_COSINE;
    c->warmup_steps = 5;
    c->warmup_factor = 0.1f;
    c->total_steps = 100;
    c->ngroups = 2;
    c->groups[1] = (ps_param_group_t){3.0f, 1.0f}; /* multipliers an AVERAGE group ignores */
    c->group_kind[1] = PS_GROUP_AVERAGE;
}

/* One server step: mean over the workers of g_r (optionally rounded as the
 * wire would), applied to w; returns the worst |w_stat - mean(local)|. */
static double step(const ps_optim_config_t *c, const ps_partition_table_t *t, float *w,
                   float *buf, uint64_t s, int wire, double *want_w0)
{
    float g[N] = {0}, gw[NW];
    for (int i = 0; i < NW; i++) g[i] = gw[i] = 0.01f * (float)(i - 7);
    double mean[NS] = {0};
    for (int r = 0; r < NWORK; r++)
        for (int i = 0; i < NS; i++) {
            float loc = local_stat(r, i) + 0.01f * (float)s, d = w[NW + i] - loc;
            if (wire == 1) d = ps_fp16_to_fp32_1(ps_fp32_to_fp16_1(d));
            if (wire == 2) d = ps_bf16_to_fp32_1(ps_fp32_to_bf16_1(d));
            g[NW + i] += d / NWORK; /* the server's mean */
            mean[i] += (double)loc / NWORK;
        }
    /* the SGD segment alone through ps_optim_sgd, as the reference */
    float wref[NW], bref[NW];
    memcpy(wref, w, sizeof wref);
    memcpy(bref, buf, sizeof bref);
    ps_optim_sgd(wref, bref, gw, NW, ps_optim_lr_group(c, s, 1.0f), c->weight_decay, c, s == 0);
    float sbuf[NS];
    memcpy(sbuf, buf + NW, sizeof sbuf);
    if (ps_optim_apply_partition(c, t, 0, w, buf, g, s)) return INFINITY;
    *want_w0 = fabs((double)w[0] - wref[0]) + fabs((double)w[NW - 1] - wref[NW - 1]) +
               fabs((double)buf[3] - bref[3]) + (memcmp(sbuf, buf + NW, sizeof sbuf) ? 1.0 : 0.0);
    double worst = 0;
    for (int i = 0; i < NS; i++) worst = fmax(worst, fabs(w[NW + i] - mean[i]));
    return worst;
}

static void test_average(void)
{
    ps_partition_table_t t;
    ps_optim_config_t c;
    build(&t, &c);
    char err[256];
    is_int(ps_optim_config_validate(&c, err, sizeof err), 0, "config with an AVERAGE group validates");
    float w[N], buf[N];
    for (int i = 0; i < N; i++) w[i] = i < NW ? 0.05f * (float)i : 1.0f, buf[i] = 0;
    double sgd_diff = 0, worst = 0;
    /* steps 0 (first: momentum clone), in warmup, and late in the cosine */
    const uint64_t steps[] = {0, 1, 3, 6, 50, 99, 150};
    for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
        double d;
        worst = fmax(worst, step(&c, &t, w, buf, steps[k], 0, &d));
        sgd_diff += d;
    }
    /* w - (w - mean) rounds once at |w| ~ 0.3: a few float ulps */
    ok(worst < 1e-7, "fp32: w -= mean(w - local_r) gives mean(local_r) at every step (worst %.3g)", worst);
    ok(sgd_diff == 0, "the SGD segment of the same partition is exactly ps_optim_sgd's update and "
       "the AVERAGE segment's momentum buffer is untouched (diff %.3g)", sgd_diff);
    /* lr 0 (a frozen model) still averages: the group ignores the schedule */
    c.lr = 0;
    double d;
    worst = step(&c, &t, w, buf, 7, 0, &d);
    ok(worst < 1e-7, "lr 0: statistics still averaged (worst %.3g)", worst);
    c.lr = 0.1f;
    /* fp16 / bf16 wire: only the difference is rounded: |err| <= |w - local| * 2^-11 (2^-8);
     * here |w - local| < 0.5 */
    worst = step(&c, &t, w, buf, 8, 1, &d);
    ok(worst <= 0.5 * ldexp(1, -11) + 1e-7, "fp16 wire: within |diff|*2^-11 (worst %.3g)", worst);
    worst = step(&c, &t, w, buf, 9, 2, &d);
    ok(worst <= 0.5 * ldexp(1, -8) + 1e-7, "bf16 wire: within |diff|*2^-8 (worst %.3g)", worst);
    /* control: the same push through an SGD group does not average */
    c.group_kind[1] = PS_GROUP_SGD;
    worst = step(&c, &t, w, buf, 10, 0, &d);
    ok(worst > 1e-3, "control: as an SGD group the same pushes do not give the mean (off by %.3g)", worst);
    /* a bad kind is refused before anything changes */
    c.group_kind[1] = 7;
    float w0[N];
    memcpy(w0, w, sizeof w0);
    float g[N] = {0};
    int lvl = ps_log_level;
    ps_log_level = -1;
    is_int(ps_optim_apply_partition(&c, &t, 0, w, buf, g, 0), PS_EINVAL, "unknown group kind: PS_EINVAL");
    ok(!memcmp(w, w0, sizeof w0), "  and nothing was updated");
    is_int(ps_optim_config_validate(&c, err, sizeof err), PS_EINVAL, "validate refuses kind 7: %s", err);
    ps_log_level = lvl;
    ps_partition_table_free(&t);
}

static void test_json(void)
{
    ps_partition_table_t t;
    ps_optim_config_t c, back;
    char err[256];
    build(&t, &c);
    ps_partition_table_free(&t);
    char *js = ps_optim_config_to_json(&c);
    const char *k1 = js ? strstr(js, "\"kind\":\"average\"") : NULL;
    ok(k1 && !strstr(k1 + 1, "\"kind\"") && strstr(js, "\"kind\"") == k1,
       "to_json writes kind only for the AVERAGE group: %s", js ? js : "(null)");
    is_int(ps_optim_config_from_json(&back, js, err, sizeof err), 0, "from_json reads it back %s", err);
    ok(back.ngroups == 2 && back.group_kind[0] == PS_GROUP_SGD && back.group_kind[1] == PS_GROUP_AVERAGE,
       "round trip keeps the kinds");
    free(js);
    c.group_kind[1] = PS_GROUP_SGD;
    js = ps_optim_config_to_json(&c);
    ok(js && !strstr(js, "kind"), "an SGD-only config prints as before (no kind key)");
    free(js);
    const struct { const char *json, *needle, *what; } bad[] = {
        {"{\"groups\":[{\"kind\":\"avg\"}]}", "groups[0].kind", "unknown kind name"},
        {"{\"groups\":[{\"kind\":1}]}", "groups[0].kind", "kind as a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ps_optim_config_from_json(&back, bad[i].json, err, sizeof err);
        ok(rc == PS_EINVAL && strstr(err, bad[i].needle), "from_json refuses %s: %s", bad[i].what, err);
    }
    is_int(ps_optim_config_from_json(&back, "{\"groups\":[{\"lr_mult\":1,\"kind\":\"sgd\"}]}", err,
                                     sizeof err), 0, "kind \"sgd\" accepted");
}

int main(void)
{
    test_average();
    test_json();
    return tap_done();
}
