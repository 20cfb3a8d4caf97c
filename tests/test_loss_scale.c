/* Dynamic loss scaling policy on the CPU (worker/engine/ps_loss_scale.h):
 * overflow detection against a naive isfinite() loop, forced overflow ->
 * skipped step and halved scale, growth after N clean steps, bounds, and a
 * simulated cluster of workers where one worker's overflow skips the step
 * for all of them and every worker keeps the same scale and weights. */
#include "tests/lib/tap.h"
#include "worker/engine/ps_loss_scale.h"
#include "ps_error.h"
#include "ps_wire.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static int naive_overflow(const float *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(g[i])) return 1;
    return 0;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) /* xorshift, [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void test_detection(void)
{
    enum { N = 1031 }; /* odd: a vector tail */
    static float g[N];
    for (int i = 0; i < N; i++) g[i] = frand() * 1e4f;
    g[5] = 3.4e38f;   /* huge but finite */
    g[6] = -3.4e38f;
    g[7] = 1e-42f;    /* denormal */
    ok(!ps_loss_scale_has_overflow(g, N), "finite buffer (max/denormal values) is clean");
    is_int(ps_loss_scale_has_overflow(g, N), naive_overflow(g, N), "agrees with isfinite loop");
    ok(!ps_loss_scale_has_overflow(g, 0), "empty buffer is clean");
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    const size_t at[] = {0, 1, 511, 512, N - 2, N - 1};
    int all = 1;
    for (size_t b = 0; b < 4; b++)
        for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
            const float keep = g[at[a]];
            g[at[a]] = bad[b];
            all &= ps_loss_scale_has_overflow(g, N) == 1 && naive_overflow(g, N) == 1;
            g[at[a]] = keep;
        }
    ok(all, "Inf, -Inf, NaN at the start, middle and tail are all found");
    /* many sums of huge finite values overflow in float: must not be an overflow */
    static float big[N];
    for (int i = 0; i < N; i++) big[i] = 3e38f;
    ok(!ps_loss_scale_has_overflow(big, N), "a buffer of huge finite values is clean");
}

static void test_policy(void)
{
    ps_loss_scale_t ls;
    ok(ps_loss_scale_init(&ls, NULL) == 0, "init with defaults");
    is_close(ps_loss_scale_get(&ls), 65536.0, 0, 0, "starts at 2^16");

    ps_loss_scale_config_t c;
    ps_loss_scale_config_default(&c);
    c.init_scale = 3.0f;
    is_int(ps_loss_scale_init(&ls, &c), PS_EINVAL, "non-power-of-two scale refused");
    ps_loss_scale_config_default(&c);
    c.min_scale = 131072.0f;
    is_int(ps_loss_scale_init(&ls, &c), PS_EINVAL, "min above init refused");
    ps_loss_scale_config_default(&c);
    c.growth_interval = 0;
    is_int(ps_loss_scale_init(&ls, &c), PS_EINVAL, "growth interval 0 refused");

    ps_loss_scale_config_default(&c);
    c.growth_interval = 5;
    c.min_scale = 4096.0f;
    c.max_scale = 262144.0f;
    ok(ps_loss_scale_init(&ls, &c) == 0, "init (growth 5, min 2^12, max 2^18)");
    is_int(ps_loss_scale_update(&ls, 1), 0, "forced overflow: step skipped");
    is_close(ls.scale, 32768.0, 0, 0, "scale halved to 2^15");
    for (int i = 0; i < 4; i++) ps_loss_scale_update(&ls, 0);
    is_close(ls.scale, 32768.0, 0, 0, "4 clean steps: no growth yet");
    is_int(ps_loss_scale_update(&ls, 0), 1, "5th clean step applied");
    is_close(ls.scale, 65536.0, 0, 0, "after 5 clean steps the scale doubled");
    /* an overflow resets the clean count */
    for (int i = 0; i < 3; i++) ps_loss_scale_update(&ls, 0);
    ps_loss_scale_update(&ls, 1);
    is_close(ls.scale, 32768.0, 0, 0, "overflow after 3 clean steps halves");
    for (int i = 0; i < 4; i++) ps_loss_scale_update(&ls, 0);
    is_close(ls.scale, 32768.0, 0, 0, "clean count restarted after the overflow");
    /* bounds */
    for (int i = 0; i < 20; i++) ps_loss_scale_update(&ls, 1);
    is_close(ls.scale, 4096.0, 0, 0, "never below min_scale");
    for (int i = 0; i < 200; i++) ps_loss_scale_update(&ls, 0);
    is_close(ls.scale, 262144.0, 0, 0, "never above max_scale");
    is_int(ls.skipped, 22, "skipped steps counted");
    is_int(ls.steps, 1 + 5 + 3 + 1 + 4 + 20 + 200, "all steps counted");

    /* unscale is exact for a power of two */
    float g[4] = {1.5f * 65536.0f, -3.0f, 1e-30f, 7.0f};
    ps_loss_scale_t l2;
    ps_loss_scale_init(&l2, NULL);
    ps_loss_scale_unscale(&l2, g, 4);
    ok(g[0] == 1.5f && g[1] == -3.0f / 65536.0f && g[2] == 1e-30f / 65536.0f &&
       g[3] == 7.0f / 65536.0f, "unscale divides exactly by 2^16");
}

/* W workers, each with its own scale state and a copy of the weights; the
 * server applies the mean unscaled gradient unless the step's verdict
 * (OR of every PUSH flag) is overflow. */
static void test_cluster(void)
{
    enum { W = 4, P = 64, STEPS = 40 };
    ps_loss_scale_config_t c;
    ps_loss_scale_config_default(&c);
    c.growth_interval = 6;
    ps_loss_scale_t ls[W];
    float wts[W][P], server[P];
    for (int w = 0; w < W; w++) ps_loss_scale_init(&ls[w], &c);
    for (int i = 0; i < P; i++) server[i] = frand();
    for (int w = 0; w < W; w++) memcpy(wts[w], server, sizeof server);

    int skipped = 0, expected_skips = 0, agree = 1, all_flagged = 1;
    for (int s = 0; s < STEPS; s++) {
        float grad[W][P];
        uint32_t flags[W];
        int local[W];
        /* worker (s % W) overflows on steps 3, 10, 11 and 25 */
        const int bad_step = s == 3 || s == 10 || s == 11 || s == 25;
        expected_skips += bad_step;
        for (int w = 0; w < W; w++) {
            for (int i = 0; i < P; i++) grad[w][i] = frand() * ls[w].scale;
            if (bad_step && w == s % W) grad[w][s % P] = INFINITY;
            local[w] = ps_loss_scale_has_overflow(grad[w], P);
            flags[w] = ps_loss_scale_push_flags(local[w]);
        }
        /* server: the verdict from every PUSH flag */
        const int verdict_srv = ps_loss_scale_agree(0, flags, W);
        all_flagged &= verdict_srv == bad_step;
        if (!verdict_srv) {
            for (int i = 0; i < P; i++) {
                float sum = 0;
                for (int w = 0; w < W; w++) sum += grad[w][i] / ls[w].scale;
                server[i] -= 0.01f * sum / W;
            }
        }
        const uint32_t reply = verdict_srv ? PS_FLAG_OVERFLOW : 0u;
        /* workers: own flag OR the reply's, then the update and the pull */
        for (int w = 0; w < W; w++) {
            const int v = ps_loss_scale_agree(local[w], &reply, 1);
            const int applied = ps_loss_scale_update(&ls[w], v);
            if (w == 0) skipped += !applied;
            memcpy(wts[w], server, sizeof server);
        }
        for (int w = 1; w < W; w++)
            agree &= ls[w].scale == ls[0].scale && ls[w].clean == ls[0].clean &&
                     !memcmp(wts[w], wts[0], sizeof wts[0]);
    }
    ok(all_flagged, "the verdict is overflow exactly on the steps where one worker overflowed");
    is_int(skipped, expected_skips, "every overflow step skipped (%d)", expected_skips);
    ok(agree, "all workers keep the same scale, clean count and weights every step");
    for (int i = 0; i < P; i++) agree &= isfinite(server[i]);
    ok(agree, "server weights stay finite (no Inf ever applied)");
    /* scale trajectory: 2^16, halve at 3, ... computed by hand */
    float want = 65536.0f;
    int clean = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s == 3 || s == 10 || s == 11 || s == 25) { want *= 0.5f; clean = 0; }
        else if (++clean == 6) { want *= 2.0f; clean = 0; }
    }
    is_close(ls[0].scale, want, 0, 0, "final scale matches the hand-computed trajectory");
    is_int(ps_loss_scale_agree(0, NULL, 0), 0, "no flags, no local overflow: clean");
    is_int(ps_loss_scale_agree(1, NULL, 0), 1, "local overflow alone: overflow");
    uint32_t other = PS_FLAG_NO_REPLY;
    is_int(ps_loss_scale_agree(0, &other, 1), 0, "other flag bits are not an overflow");
}

int main(void)
{
    test_detection();
    test_policy();
    test_cluster();
    return tap_done();
}
