/* Helper of tests/check_video3d_torch.sh (not a test by itself): a 3-D
 * video model from the hash init (or a 2-D file inflated into it), its
 * checkpoint and the logits the C engine computes on the hash clip, for
 * the Python side to compare with torchvision / its own I3D.
 *
 *   video3d_export OUTDIR ARCH K CLIPS T H
 *   video3d_export --inflate mean|centre FILE OUTDIR ARCH K CLIPS T H
 *
 * OUTDIR/model.safetensors   the weights (after the inflation, if any)
 * OUTDIR/logits_eval.bin     (CLIPS, K) float32, eval mode
 * OUTDIR/logits_train.bin    (CLIPS, K) float32, training-mode BN
 * OUTDIR/model_after.safetensors  after that training forward (BN stats)
 * OUTDIR/config.txt          "ARCH K CLIPS T H SEED" */
#include "worker/models/ps_model.h"

#include "ps_log.h"
#include "tests/lib/export_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234
#define PROG "video3d_export"

int main(int argc, char **argv)
{
    const char *load = NULL;
    int centre = 0;
    if (argc == 10 && !strcmp(argv[1], "--inflate")) {
        centre = !strcmp(argv[2], "centre");
        load = argv[3];
        argv += 3;
        argc -= 3;
    }
    if (argc != 7) {
        fprintf(stderr, "usage: " PROG " [--inflate mean|centre FILE] OUTDIR ARCH K CLIPS T H\n");
        return 2;
    }
    const char *dir = argv[1];
    const int K = atoi(argv[3]), clips = atoi(argv[4]), T = atoi(argv[5]), H = atoi(argv[6]);
    if (export_mkdir(PROG, dir)) return 1;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    ps_model_config_t c;
    ps_model_config_default(&c);
    snprintf(c.arch, sizeof c.arch, "%s", argv[2]);
    c.num_classes = K;
    c.n_segment = T;
    c.partial_bn = 0;
    c.dropout = 0.f;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &c, &ps_backend_cpu, &ctx, clips, H, H)) return 1;
    ps_model_init(m, SEED, 1);
    if (load && ps_model_load(m, load, PS_MODEL_LOAD_STRICT |
                                           (centre ? PS_MODEL_LOAD_INFLATE_CENTRE : 0)))
        return 1;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ps_model_save(m, path)) return 1;
    const size_t nx = (size_t)clips * T * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    int32_t *labels = malloc(clips * sizeof *labels);
    if (!x || !labels) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    for (int b = 0; b < clips; b++) labels[b] = (b * 7 + 3) % K;
    float loss;
    if (ps_model_forward(m, x, clips, NULL, 0, NULL) ||
        export_write_raw(PROG, dir, "logits_eval.bin", ps_model_logits(m), (size_t)clips * K) ||
        ps_model_forward(m, x, clips, labels, 1, &loss) ||
        export_write_raw(PROG, dir, "logits_train.bin", ps_model_logits(m), (size_t)clips * K))
        return 1;
    snprintf(path, sizeof path, "%s/model_after.safetensors", dir);
    if (ps_model_save(m, path)) return 1;
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "%s %d %d %d %d %d\n", argv[2], K, clips, T, H, SEED);
    fclose(f);
    free(x);
    free(labels);
    ps_model_destroy(&m);
    ps_ctx_free(&ctx);
    return 0;
}
