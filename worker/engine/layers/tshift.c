/* Temporal shift (TSM, Lin et al.): view (B*T, C, HW) as (B, T, C, HW).
 * With fold = C / fold_div, channels [0, fold) take frame t+1 (shift left
 * in time), [fold, 2*fold) take frame t-1, zero past the clip ends, the
 * rest are copied - exactly ops/temporal_shift.py's shift().  Backward is
 * the opposite shift.  Zero FLOPs: it is only plane copies. */
#include "cpu_layers.h"
#include "ps_log.h"

#include <string.h>

/* dir = +1 forward, -1 backward: the frame that plane (t, c) reads. */
static void shift_planes(float *dst, const float *src, int B, int T, int C, int HW,
                         int fold_div, int dir)
{
    if (B <= 0 || T <= 0 || C <= 0 || HW <= 0 || fold_div <= 0) {
        ps_error("tshift: invalid shape B=%d T=%d C=%d HW=%d fold_div=%d", B, T, C, HW,
                 fold_div);
        return;
    }
    const int fold = C / fold_div;
    const size_t plane = (size_t)HW * sizeof(float);
#pragma omp parallel for collapse(2) schedule(static)
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            const int b = bt / T, t = bt % T;
            int ts = t;
            if (c < fold) ts = t + dir;
            else if (c < 2 * fold) ts = t - dir;
            float *o = dst + ((size_t)bt * C + c) * HW;
            if (ts < 0 || ts >= T) memset(o, 0, plane);
            else memcpy(o, src + (((size_t)b * T + ts) * C + c) * HW, plane);
        }
}

void ps_cpu_tshift_forward(ps_ctx_t *ctx, float *out, const float *inp, int B, int T, int C,
                           int HW, int fold_div)
{
    (void)ctx;
    shift_planes(out, inp, B, T, C, HW, fold_div, +1);
}

void ps_cpu_tshift_backward(ps_ctx_t *ctx, float *dinp, const float *dout, int B, int T,
                            int C, int HW, int fold_div)
{
    (void)ctx;
    if (!dinp) return;
    shift_planes(dinp, dout, B, T, C, HW, fold_div, -1);
}
