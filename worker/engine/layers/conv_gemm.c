/* The "gemm" convolution row (conv_provider.h): im2col + sgemm for 2-D
 * shapes (conv2d.c), vol2col + sgemm for 3-D ones (conv3d.c), the
 * reference every other row is measured and checked against.  fp32 only:
 * at bf16 the oneDNN row computes. */
#include "conv_provider.h"
#include "cpu_layers.h"
#include "worker/engine/ps_blas.h"

#include <stdio.h>
#include <string.h>

static int gemm_supports(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir)
{
    ps_cpu_state_t *st = ps_cpu_state(ctx);
    return (s->nsp == 2 || s->nsp == 3) && (!st || st->precision == PS_PRECISION_FP32);
}

static int gemm_forward(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *out, const float *inp,
                        const float *w, const float *b)
{
    if (s->nsp == 3) {
        ps_conv3d_desc_t d;
        ps_conv_shape_desc3d(s, &d);
        ps_conv3d_gemm_forward(ctx, out, inp, w, b, &d, s->N, s->in[0], s->in[1], s->in[2]);
    } else {
        ps_conv2d_desc_t d;
        ps_conv_shape_desc2d(s, &d);
        ps_conv2d_gemm_forward(ctx, out, inp, w, b, &d, s->N, s->in[1], s->in[2]);
    }
    return 0;
}

/* both directions in one pass: 2-D batches share the output gradient's
 * gather between them */
static int gemm_backward(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp, float *dw,
                         const float *dout, const float *inp, const float *w)
{
    if (s->nsp == 3) {
        ps_conv3d_desc_t d;
        ps_conv_shape_desc3d(s, &d);
        ps_conv3d_gemm_backward(ctx, dinp, dw, dout, inp, w, &d, s->N, s->in[0], s->in[1],
                                s->in[2]);
    } else {
        ps_conv2d_desc_t d;
        ps_conv_shape_desc2d(s, &d);
        ps_conv2d_gemm_backward(ctx, dinp, dw, dout, inp, w, &d, s->N, s->in[1], s->in[2]);
    }
    return 0;
}

static int gemm_backward_data(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dinp,
                              const float *dout, const float *w)
{
    return gemm_backward(ctx, s, dinp, NULL, dout, NULL, w);
}

static int gemm_backward_weights(ps_ctx_t *ctx, const ps_conv_shape_t *s, float *dw,
                                 const float *dout, const float *inp)
{
    return gemm_backward(ctx, s, NULL, dw, dout, inp, NULL);
}

static const char *gemm_kernel(ps_ctx_t *ctx, const ps_conv_shape_t *s, ps_conv_dir_t dir,
                               char *buf, size_t len)
{
    const char *how;
    if (s->nsp == 3) {
        ps_conv3d_desc_t d;
        ps_conv_shape_desc3d(s, &d);
        how = ps_conv3d_gemm_scheme(&d, dir == PS_CONV_BWD_DATA);
    } else {
        ps_conv2d_desc_t d;
        ps_conv_shape_desc2d(s, &d);
        how = ps_conv2d_gemm_scheme(&d, s->N, s->in[1], s->in[2], dir == PS_CONV_BWD_DATA);
    }
    if (!strcmp(ps_blas_library(), "OpenBLAS"))
        snprintf(buf, len, "%s(OpenBLAS %s)", how, ps_blas_corename());
    else
        snprintf(buf, len, "%s(%s)", how, ps_blas_library());
    return buf;
}

const ps_conv_provider_t ps_conv_gemm = {
    .name = "gemm",
    .supports = gemm_supports,
    .forward = gemm_forward,
    .backward_data = gemm_backward_data,
    .backward_weights = gemm_backward_weights,
    .backward = gemm_backward,
    .kernel = gemm_kernel,
};
