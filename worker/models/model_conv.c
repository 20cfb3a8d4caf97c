/* A convolution with bias in a detector's neck or heads, as rows of a
 * parameter table (contract in resnet_internal.h): RetinaNet and the R-CNN
 * detectors build their FPNs and heads from it. */
#include "resnet_internal.h"

#include "ps_error.h"

#include <stdio.h>
#include <string.h>

int ps_rconv_define(rconv_t *c, ps_model_param_t **params, int *np, int *cap, const char *name,
                    int C, int K, int R, int stride)
{
    memset(c, 0, sizeof *c);
    c->d = (ps_conv2d_desc_t){.C = C, .K = K, .R = R, .S = R, .stride_h = stride,
                              .stride_w = stride, .pad_h = R / 2, .pad_w = R / 2, .dil_h = 1,
                              .dil_w = 1, .groups = 1};
    int shape[4] = {K, C, R, R};
    char full[160];
    snprintf(full, sizeof full, "%s.weight", name);
    c->pw = ps_mtab_add_param(params, np, cap, full, 4, shape, PS_MODEL_GROUP_WEIGHT, 1);
    if (c->pw < 0) return c->pw;
    snprintf(full, sizeof full, "%s.bias", name);
    c->pb = ps_mtab_add_param(params, np, cap, full, 1, &K, PS_MODEL_GROUP_BIAS, 1);
    return c->pb < 0 ? c->pb : 0;
}

void ps_rconv_resolve(rconv_t *c, const ps_model_param_t *params)
{
    c->w = params[c->pw].w;
    c->gw = params[c->pw].g;
    c->b = params[c->pb].w;
    c->gb = params[c->pb].g;
}

void ps_rconv_forward(const ps_backend_t *be, ps_ctx_t *ctx, const rconv_t *c, float *out,
                      const float *in, int N, int H, int W)
{
    be->conv2d_forward(ctx, out, in, c->w, c->b, &c->d, N, H, W);
}

void ps_rconv_backward(const ps_backend_t *be, ps_ctx_t *ctx, const rconv_t *c, float *din,
                       const float *dout, const float *in, int N, int H, int W)
{
    be->conv2d_backward(ctx, din, c->gw, c->gb, dout, in, c->w, &c->d, N, H, W);
}

double ps_rconv_flops(const rconv_t *c, int N, int H, int W)
{
    int P = ps_conv_out(H, c->d.R, c->d.stride_h, c->d.pad_h, 1);
    int Q = ps_conv_out(W, c->d.S, c->d.stride_w, c->d.pad_w, 1);
    return 2.0 * N * c->d.K * (double)c->d.C * c->d.R * c->d.S * P * Q;
}

size_t ps_rconv_workspace(const rconv_t *c, int N, int H, int W)
{
    return ps_conv2d_workspace(&c->d, N, H, W);
}

double ps_rconv_fan_in(const rconv_t *c) { return (double)c->d.C * c->d.R * c->d.S; }

void ps_rconv_init(const rconv_t *c, ps_model_param_t *params, uint64_t seed, double bound,
                   int random, float bias0)
{
    ps_model_param_t *w = &params[c->pw], *b = &params[c->pb];
    ps_model_hash_fill(w->w, w->numel, w->name, seed, bound);
    if (random) ps_model_hash_fill(b->w, b->numel, b->name, seed, 0.1);
    else memset(b->w, 0, b->numel * sizeof(float));
    for (size_t i = 0; i < b->numel; i++) b->w[i] += bias0;
}
