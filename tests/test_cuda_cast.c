/* CUDA cast kernels against the CPU conversion (common/ps_half.c): every
 * fp16/bf16 bit pattern decoded, and a spread of floats (edge cases included)
 * encoded, must agree bit for bit.  Exits 77 where no GPU is present. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ps_half.h"
#include "tests/lib/tap.h"
#include "worker/engine/cuda/ps_cuda.h"

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

int main(void)
{
    if (ps_cuda_device_count() == 0) tap_skip_all("no CUDA device");
    char info[256];
    ok(ps_cuda_open(0, info, sizeof info) == 0, "open device: %s", info);

    const size_t nh = 65536, nf = 1 << 20;
    uint16_t *h = malloc(nh * 2), *h_out = malloc(nf * 2), *h_ref = malloc(nf * 2);
    float *f = malloc(nf * 4), *f_out = malloc(nh * 4);
    for (size_t i = 0; i < nh; i++) h[i] = (uint16_t)i;
    /* floats: every exponent with random mantissas, plus edge cases */
    srand(1);
    for (size_t i = 0; i < nf; i++) {
        uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
        memcpy(&f[i], &u, 4);
    }
    float edge[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.99f, 6.1035156e-05f, 5.9604645e-08f,
                    2.9802322e-08f, 1e-40f, INFINITY, -INFINITY, NAN, 3.4028235e38f};
    memcpy(f, edge, sizeof edge);

    void *d_h, *d_f, *d_o;
    ok(ps_cuda_malloc(&d_h, nf * 2) == 0 && ps_cuda_malloc(&d_f, nf * 4) == 0 &&
       ps_cuda_malloc(&d_o, nf * 4) == 0, "device buffers");
    for (int bf = 0; bf < 2; bf++) {
        const char *name = bf ? "bf16" : "fp16";
        /* decode every 16-bit pattern */
        ps_cuda_memcpy_h2d(d_h, h, nh * 2);
        ok((bf ? ps_cuda_bf16_to_f32 : ps_cuda_f16_to_f32)(d_o, d_h, nh, NULL) == 0, "%s decode launch", name);
        ps_cuda_memcpy_d2h(f_out, d_o, nh * 4);
        size_t bad = 0;
        for (size_t i = 0; i < nh; i++) {
            float ref = bf ? ps_bf16_to_fp32_1(h[i]) : ps_fp16_to_fp32_1(h[i]);
            if (bits(ref) != bits(f_out[i]) && !(isnan(ref) && isnan(f_out[i]))) bad++;
        }
        is_int(bad, 0, "%s decode of all 65536 patterns matches the CPU", name);
        /* encode */
        ps_cuda_memcpy_h2d(d_f, f, nf * 4);
        ok((bf ? ps_cuda_f32_to_bf16 : ps_cuda_f32_to_f16)(d_o, d_f, nf, NULL) == 0, "%s encode launch", name);
        ps_cuda_memcpy_d2h(h_out, d_o, nf * 2);
        (bf ? ps_fp32_to_bf16 : ps_fp32_to_fp16)(h_ref, f, nf);
        bad = 0;
        for (size_t i = 0; i < nf; i++) {
            float a = bf ? ps_bf16_to_fp32_1(h_out[i]) : ps_fp16_to_fp32_1(h_out[i]);
            float b = bf ? ps_bf16_to_fp32_1(h_ref[i]) : ps_fp16_to_fp32_1(h_ref[i]);
            if (h_out[i] != h_ref[i] && !(isnan(a) && isnan(b))) bad++;
        }
        is_int(bad, 0, "%s encode of %zu floats matches the CPU", name, nf);
    }
    ps_cuda_free(d_h); ps_cuda_free(d_f); ps_cuda_free(d_o);
    free(h); free(h_out); free(h_ref); free(f); free(f_out);
    return tap_done();
}
