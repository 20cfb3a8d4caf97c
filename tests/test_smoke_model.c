/* Smoke model and its generated data: analytic backward against central
 * finite differences in double, closed-form loss at zero weights, data is a
 * pure function of (seed, index), and plain SGD on it lowers the loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/tap.h"
#include "worker/psworker/smoke_data.h"
#include "worker/psworker/smoke_model.h"

static double rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xFFFF) / 65536.0 * 2.0 - 1.0;
}

static void test_gradcheck(void)
{
    ps_smoke_dims_t d = {5, 7, 3};
    const int n = 6;
    size_t np = ps_smoke_numel(&d);
    double *w = malloc(np * sizeof *w), *g = malloc(np * sizeof *g);
    float x[6 * 5];
    int y[6] = {0, 2, 1, 1, 0, 2};
    unsigned s = 7;
    ps_smoke_work_t ws;

    is_int(np, 5 * 7 + 7 + 7 * 3 + 3, "numel = D*H + H + H*K + K");
    ok(ps_smoke_work_init(&ws, n, &d) == 0, "work init");
    for (size_t i = 0; i < np; i++) w[i] = rnd(&s);
    for (int i = 0; i < n * 5; i++) x[i] = (float)(2 * rnd(&s));
    double loss = ps_smoke_loss_grad_d(&d, w, x, y, n, g, &ws, NULL);
    ok(isfinite(loss) && loss > 0, "loss finite and positive (%g)", loss);

    /* Central differences: error O(h^2) ~ 1e-10 relative to O(1) values. */
    double worst = 0;
    size_t worst_i = 0;
    const double h = 1e-5;
    for (size_t i = 0; i < np; i++) {
        double keep = w[i];
        w[i] = keep + h;
        double lp = ps_smoke_loss_grad_d(&d, w, x, y, n, NULL, &ws, NULL);
        w[i] = keep - h;
        double lm = ps_smoke_loss_grad_d(&d, w, x, y, n, NULL, &ws, NULL);
        w[i] = keep;
        double fd = (lp - lm) / (2 * h);
        double err = fabs(fd - g[i]) / fmax(1e-3, fabs(fd) + fabs(g[i]));
        if (err > worst) worst = err, worst_i = i;
    }
    ok(worst < 1e-6, "analytic gradient = finite differences (worst rel err %.3g at %zu)",
       worst, worst_i);

    /* Zero weights: every class gets probability 1/K, loss = ln K exactly;
     * only the output bias gets a gradient: mean(1/K - onehot). */
    memset(w, 0, np * sizeof *w);
    loss = ps_smoke_loss_grad_d(&d, w, x, y, n, g, &ws, NULL);
    is_close(loss, log(3.0), 1e-12, 0, "zero weights: loss = ln K");
    size_t b2 = np - 3;
    int cnt[3] = {0};
    for (int i = 0; i < n; i++) cnt[y[i]]++;
    for (int k = 0; k < 3; k++)
        is_close(g[b2 + k], 1.0 / 3 - (double)cnt[k] / n, 1e-12, 0, "zero weights: dL/db2[%d]", k);

    /* Bad labels are rejected, not read out of bounds. */
    int bad[6] = {0, 3, 1, 1, 0, 2};
    ok(isnan(ps_smoke_loss_grad_d(&d, w, x, bad, n, g, &ws, NULL)), "label >= K -> NaN");
    ok(isnan(ps_smoke_loss_grad_d(&d, w, x, y, n + 1, g, &ws, NULL)), "n > capacity -> NaN");
    ps_smoke_work_free(&ws);
    free(w);
    free(g);
}

static void test_data(void)
{
    ps_smoke_data_t a, b, c;
    float x1[32], x2[32], xb[4 * 32];
    int yb[4], hist[4] = {0};

    ok(ps_smoke_data_init(&a, 42, 32, 4) == 0, "data init");
    ps_smoke_data_init(&b, 42, 32, 4);
    ps_smoke_data_init(&c, 43, 32, 4);
    int y1 = ps_smoke_data_sample(&a, 1000, x1);
    int y2 = ps_smoke_data_sample(&b, 1000, x2);
    ok(y1 == y2 && !memcmp(x1, x2, sizeof x1), "sample is a pure function of (seed, index)");
    ps_smoke_data_sample(&c, 1000, x2);
    ok(memcmp(x1, x2, sizeof x1) != 0, "another seed gives another sample");
    ps_smoke_data_batch(&a, 998, 4, xb, yb);
    ok(yb[2] == y1 && !memcmp(xb + 2 * 32, x1, sizeof x1),
       "batch position 2 from 998 == sample 1000");
    for (int i = 0; i < 4000; i++) hist[ps_smoke_data_sample(&a, (uint64_t)i, x1)]++;
    ok(hist[0] > 850 && hist[1] > 850 && hist[2] > 850 && hist[3] > 850,
       "labels balanced (%d %d %d %d of 4000)", hist[0], hist[1], hist[2], hist[3]);
    ps_smoke_data_free(&c);
    ps_smoke_data_t bad;
    memset(&bad, 0, sizeof bad);
    ok(ps_smoke_data_init(&bad, 1, 1, 4) != 0, "in < 2 rejected");
    ps_smoke_data_free(&bad);
    ps_smoke_data_free(&a);
    ps_smoke_data_free(&b);
}

/* Mean eval loss of a model over 512 held-out samples. */
static double eval(const ps_smoke_dims_t *d, const ps_smoke_data_t *ds, const float *w,
                   double *wd, ps_smoke_work_t *ws, int *correct)
{
    static float x[512 * 32];
    static int y[512];
    ps_smoke_data_batch(ds, PS_SMOKE_EVAL_BASE, 512, x, y);
    return ps_smoke_loss_grad(d, w, x, y, 512, NULL, wd, NULL, ws, correct);
}

static void test_training(void)
{
    ps_smoke_dims_t d;
    ps_smoke_data_t ds;
    ps_smoke_work_t ws;
    ps_smoke_dims_default(&d);
    size_t np = ps_smoke_numel(&d);
    float *w = malloc(np * 4), *g = malloc(np * 4), *v = calloc(np, 4), *w2 = malloc(np * 4);
    double *wd = malloc(np * 8), *gd = malloc(np * 8);
    float x[32 * 32];
    int y[32], c0, c1;

    ps_smoke_data_init(&ds, 1, d.in, d.classes);
    ps_smoke_work_init(&ws, 512, &d);
    ps_smoke_init(&d, 5, w);
    ps_smoke_init(&d, 5, w2);
    ok(!memcmp(w, w2, np * 4), "init is deterministic");
    double amax = 0;
    for (size_t i = 0; i < np; i++) amax = fmax(amax, fabs(w[i]));
    ok(amax <= 1 / sqrt(32.0) && amax > 0.1, "init within nn.Linear bound (max |w| %.3f)", amax);

    double l0 = eval(&d, &ds, w, wd, &ws, &c0);
    ok(fabs(l0 - log(4.0)) < 0.3, "initial eval loss near ln 4 (%.4f)", l0);
    /* Plain momentum SGD written out here, independent of ps_optim. */
    for (int step = 0; step < 300; step++) {
        ps_smoke_data_batch(&ds, (uint64_t)step * 32, 32, x, y);
        ps_smoke_loss_grad(&d, w, x, y, 32, g, wd, gd, &ws, NULL);
        for (size_t i = 0; i < np; i++) {
            v[i] = 0.9f * v[i] + g[i];
            w[i] -= 0.05f * v[i];
        }
    }
    double l1 = eval(&d, &ds, w, wd, &ws, &c1);
    ok(l1 < 0.5 * l0, "300 SGD steps: eval loss %.4f -> %.4f (< half)", l0, l1);
    ok(c1 > 384, "eval accuracy %d/512 > 75%%", c1);
    diag("accuracy %d/512 -> %d/512", c0, c1);
    ps_smoke_work_free(&ws);
    ps_smoke_data_free(&ds);
    free(w), free(g), free(v), free(w2), free(wd), free(gd);
}

/* The task must need the hidden layer: softmax regression (linear) trained
 * the same way stays near chance, because each class owns two opposite
 * cluster centres and a linear score cannot prefer both x and -x. */
static void test_not_linear(void)
{
    enum { D = 32, K = 4 };
    ps_smoke_data_t ds;
    float W[K * D] = {0}, b[K] = {0}, x[32 * D];
    int y[32], correct = 0;
    ps_smoke_data_init(&ds, 1, D, K);
    for (int step = 0; step < 300; step++) {
        ps_smoke_data_batch(&ds, (uint64_t)step * 32, 32, x, y);
        float gW[K * D] = {0}, gb[K] = {0};
        for (int s = 0; s < 32; s++) {
            double z[K], m = -1e300, sum = 0;
            for (int k = 0; k < K; k++) {
                z[k] = b[k];
                for (int i = 0; i < D; i++) z[k] += W[k * D + i] * x[s * D + i];
                m = fmax(m, z[k]);
            }
            for (int k = 0; k < K; k++) sum += (z[k] = exp(z[k] - m));
            for (int k = 0; k < K; k++) {
                double dz = (z[k] / sum - (k == y[s])) / 32;
                gb[k] += dz;
                for (int i = 0; i < D; i++) gW[k * D + i] += dz * x[s * D + i];
            }
        }
        for (int i = 0; i < K * D; i++) W[i] -= 0.1f * gW[i];
        for (int k = 0; k < K; k++) b[k] -= 0.1f * gb[k];
    }
    for (int s = 0; s < 512; s++) {
        float xs[D];
        int label = ps_smoke_data_sample(&ds, PS_SMOKE_EVAL_BASE + s, xs), arg = 0;
        double best = -1e300;
        for (int k = 0; k < K; k++) {
            double z = b[k];
            for (int i = 0; i < D; i++) z += W[k * D + i] * xs[i];
            if (z > best) best = z, arg = k;
        }
        correct += arg == label;
    }
    ok(correct < 200, "a linear model stays near chance (%d/512 correct)", correct);
    ps_smoke_data_free(&ds);
}

int main(void)
{
    test_gradcheck();
    test_data();
    test_training();
    test_not_linear();
    return tap_done();
}
