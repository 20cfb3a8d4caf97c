/* Helper of tests/check_tsm_import.sh (not a test by itself): loads a
 * weights file into a TSM / TSN ResNet (ps_model_load, strict) and writes
 * what the engine computes with it for the hash input, for the Python side
 * to compare with PyTorch.
 *
 *   weights_eval FILE OUTDIR DEPTH SHIFT PLACE SHIFT_DIV K CLIPS T H WIDTH
 *
 * PLACE blockres|block.  BN is FROZEN (running statistics in training too,
 * as PyTorch's eval mode), dropout 0, so the gradient is PyTorch's eval-
 * mode gradient of the same loss.
 *
 * OUTDIR/logits.bin   (CLIPS, K) float32 eval logits
 * OUTDIR/grads.bin    every conv / fc weight's and bias's gradient, model
 *                     order, float32, after a forward with labels
 *                     (b*7+3) % K (mean cross-entropy) and one backward
 * OUTDIR/grads.txt    "name numel" per tensor in grads.bin
 * Exit 1 with the loader's message when the file is refused. */
#include "worker/models/ps_model.h"

#include "ps_log.h"
#include "tests/lib/export_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234
#define PROG "weights_eval"

int main(int argc, char **argv)
{
    if (argc != 12) {
        fprintf(stderr, "usage: " PROG " FILE OUTDIR DEPTH SHIFT PLACE SHIFT_DIV K CLIPS T H "
                        "WIDTH\n");
        return 2;
    }
    const char *file = argv[1], *dir = argv[2];
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = atoi(argv[3]);
    c.shift = atoi(argv[4]);
    c.shift_place = !strcmp(argv[5], "block") ? PS_MODEL_SHIFT_BLOCK : PS_MODEL_SHIFT_BLOCKRES;
    c.shift_div = atoi(argv[6]);
    c.num_classes = atoi(argv[7]);
    int clips = atoi(argv[8]), H = atoi(argv[10]);
    c.n_segment = atoi(argv[9]);
    c.width = atoi(argv[11]);
    c.partial_bn = 0;
    c.bn_mode = PS_MODEL_BN_FROZEN;
    c.dropout = 0.f;
    if (export_mkdir(PROG, dir)) return 1;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &c, &ps_backend_cpu, &ctx, clips, H, H)) return 1;
    if (ps_model_load(m, file, PS_MODEL_LOAD_STRICT)) return 1;
    size_t nx = (size_t)clips * c.n_segment * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    int32_t *y = malloc(sizeof *y * (size_t)clips);
    if (!x || !y) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    for (int b = 0; b < clips; b++) y[b] = (b * 7 + 3) % c.num_classes;
    float loss;
    if (ps_model_forward(m, x, clips, NULL, 0, NULL) ||
        export_write_raw(PROG, dir, "logits.bin", ps_model_logits(m), (size_t)clips * c.num_classes))
        return 1;
    ps_model_zero_grad(m);
    if (ps_model_forward(m, x, clips, y, 1, &loss) || ps_model_backward(m)) return 1;
    char path[1024];
    snprintf(path, sizeof path, "%s/grads.bin", dir);
    FILE *g = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/grads.txt", dir);
    FILE *t = fopen(path, "w");
    if (!g || !t) return 1;
    int np;
    const ps_model_param_t *P = ps_model_params(m, &np);
    for (int i = 0; i < np; i++) {
        if (P[i].ndim == 1 && strncmp(P[i].name, "fc.", 3)) continue; /* BN: frozen */
        fwrite(P[i].g, sizeof(float), P[i].numel, g);
        fprintf(t, "%s %zu\n", P[i].name, P[i].numel);
    }
    if (fclose(g) | fclose(t)) return 1;
    free(x);
    free(y);
    ps_model_destroy(&m);
    ps_ctx_free(&ctx);
    return 0;
}
