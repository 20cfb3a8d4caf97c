/* Detection layers, CPU reference (see det_layers.h for the contracts). */
#include "worker/det/det_layers.h"

#include <math.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

/* torch's nearest source index (UpSample.h nearest_idx) */
static int nearest_src(int dst, int in, int out)
{
    if (out == in) return dst;
    if (out == 2 * in) return dst >> 1;
    float scale = (float)in / (float)out;
    int s = (int)floorf((float)dst * scale);
    return s < in - 1 ? s : in - 1;
}

void ps_det_upsample_add_forward(float *out, const float *lateral, const float *top, int N,
                                 int C, int H, int W, int P, int Q)
{
    for (long nc = 0; nc < (long)N * C; nc++) {
        const float *t = top + nc * H * W;
        const float *l = lateral + nc * P * Q;
        float *o = out + nc * P * Q;
        for (int p = 0; p < P; p++) {
            const float *trow = t + (long)nearest_src(p, H, P) * W;
            for (int q = 0; q < Q; q++)
                o[p * Q + q] = l[p * Q + q] + trow[nearest_src(q, W, Q)];
        }
    }
}

void ps_det_upsample_add_backward(float *dlateral, float *dtop, const float *dout, int N,
                                  int C, int H, int W, int P, int Q)
{
    size_t nlat = (size_t)N * C * P * Q;
    if (dlateral && dlateral != dout) memcpy(dlateral, dout, nlat * sizeof(float));
    if (!dtop) return;
    memset(dtop, 0, (size_t)N * C * H * W * sizeof(float));
    for (long nc = 0; nc < (long)N * C; nc++) {
        float *t = dtop + nc * H * W;
        const float *g = dout + nc * P * Q;
        for (int p = 0; p < P; p++) {
            float *trow = t + (long)nearest_src(p, H, P) * W;
            for (int q = 0; q < Q; q++) trow[nearest_src(q, W, Q)] += g[p * Q + q];
        }
    }
}

int ps_det_count_pos(const int32_t *labels, int A)
{
    int n = 0;
    for (int a = 0; a < A; a++) n += labels[a] >= 1;
    return n;
}

/* softplus(x) = log(1 + e^x), stable for any x */
static double softplus(double x)
{
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static int check_labels(const int32_t *labels, int A, int K, const char *who)
{
    for (int a = 0; a < A; a++)
        if (labels[a] < -1 || labels[a] > K) {
            ps_error("%s: label %d of anchor %d outside -1..%d", who, labels[a], a, K);
            return PS_EINVAL;
        }
    return 0;
}

int ps_det_focal_forward(float *loss, const float *logits, const int32_t *labels, float alpha,
                         float gamma, float normaliser, int A, int K)
{
    if (check_labels(labels, A, K, "focal loss")) {
        *loss = NAN;
        return PS_EINVAL;
    }
    double sum = 0;
    for (int a = 0; a < A; a++) {
        if (labels[a] < 0) continue;
        const float *x = logits + (long)a * K;
        for (int k = 0; k < K; k++) {
            double v = x[k];
            /* log p = -softplus(-x), log(1-p) = -softplus(x) */
            if (labels[a] == k + 1) {
                double p = 1.0 / (1.0 + exp(-v));
                sum += alpha * pow(1.0 - p, gamma) * softplus(-v);
            } else {
                double p = 1.0 / (1.0 + exp(-v));
                sum += (1.0 - alpha) * pow(p, gamma) * softplus(v);
            }
        }
    }
    *loss = (float)(sum / normaliser);
    return 0;
}

int ps_det_focal_backward(float *dlogits, const float *logits, const int32_t *labels,
                          float dloss, float alpha, float gamma, float normaliser, int A, int K)
{
    if (check_labels(labels, A, K, "focal loss backward")) return PS_EINVAL;
    double scale = (double)dloss / normaliser;
    for (int a = 0; a < A; a++) {
        const float *x = logits + (long)a * K;
        float *dx = dlogits + (long)a * K;
        if (labels[a] < 0) {
            memset(dx, 0, (size_t)K * sizeof(float));
            continue;
        }
        for (int k = 0; k < K; k++) {
            double v = x[k], p = 1.0 / (1.0 + exp(-v)), q = 1.0 / (1.0 + exp(v)); /* q = 1-p */
            double g;
            if (labels[a] == k + 1) /* d/dx[-a (1-p)^g log p] = a (1-p)^g (g p log p - (1-p)) */
                g = alpha * pow(q, gamma) * (gamma * p * -softplus(-v) - q);
            else /* d/dx[-(1-a) p^g log(1-p)] = (1-a) p^g (p - g (1-p) log(1-p)) */
                g = (1.0 - alpha) * pow(p, gamma) * (p + gamma * q * softplus(v));
            dx[k] = (float)(g * scale);
        }
    }
    return 0;
}

void ps_det_smoothl1_forward(float *loss, const float *pred, const float *target,
                             const int32_t *labels, float beta, float normaliser, int A)
{
    double sum = 0;
    for (int a = 0; a < A; a++) {
        if (labels[a] < 1) continue;
        for (int j = 0; j < 4; j++) {
            double d = fabs((double)pred[a * 4 + j] - target[a * 4 + j]);
            sum += d < beta ? 0.5 * d * d / beta : d - 0.5 * beta;
        }
    }
    *loss = (float)(sum / normaliser);
}

void ps_det_smoothl1_backward(float *dpred, const float *pred, const float *target,
                              const int32_t *labels, float dloss, float beta, float normaliser,
                              int A)
{
    double scale = (double)dloss / normaliser;
    for (int a = 0; a < A; a++)
        for (int j = 0; j < 4; j++) {
            long i = (long)a * 4 + j;
            if (labels[a] < 1) {
                dpred[i] = 0;
                continue;
            }
            double d = (double)pred[i] - target[i];
            double g = fabs(d) < beta ? d / beta : (d > 0 ? 1.0 : -1.0);
            dpred[i] = (float)(g * scale);
        }
}

void ps_det_head_permute_forward(float *out, const float *inp, int nA, int D, int H, int W)
{
    long HW = (long)H * W;
    for (int a = 0; a < nA; a++)
        for (int d = 0; d < D; d++) {
            const float *src = inp + ((long)a * D + d) * HW;
            for (long s = 0; s < HW; s++) out[(s * nA + a) * D + d] = src[s];
        }
}

void ps_det_head_permute_backward(float *dinp, const float *dout, int nA, int D, int H, int W)
{
    long HW = (long)H * W;
    for (int a = 0; a < nA; a++)
        for (int d = 0; d < D; d++) {
            float *dst = dinp + ((long)a * D + d) * HW;
            for (long s = 0; s < HW; s++) dst[s] = dout[(s * nA + a) * D + d];
        }
}
