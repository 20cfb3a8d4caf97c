/* Helper of tests/check_model_torch.sh (not a test by itself): builds a
 * model from the hash init, writes its checkpoint and the logits the C
 * engine computes, for the Python side to load into torchvision.
 *
 *   model_export OUTDIR DEPTH SHIFT K CLIPS H
 *   model_export --load FILE OUTDIR DEPTH SHIFT K CLIPS H
 *
 * With --load the weights come from FILE (ps_model_load, fc replaced if
 * the class count differs) and only logits_eval.bin and config.txt are
 * written.
 *
 * OUTDIR/model.safetensors   checkpoint before any step
 * OUTDIR/logits_eval.bin     (CLIPS, K) float32, eval mode
 * OUTDIR/logits_train.bin    (CLIPS, K) float32, training-mode BN
 * OUTDIR/model_after.safetensors  after that training forward (BN stats)
 * OUTDIR/config.txt          "DEPTH SHIFT K CLIPS H SEED" */
#include "worker/models/ps_model.h"

#include "ps_log.h"
#include "tests/lib/export_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234

static int write_raw(const char *dir, const char *name, const float *p, size_t n)
{
    return export_write_raw("model_export", dir, name, p, n);
}

int main(int argc, char **argv)
{
    const char *load = NULL;
    if (argc == 9 && !strcmp(argv[1], "--load")) {
        load = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc != 7) {
        fprintf(stderr, "usage: model_export [--load FILE] OUTDIR DEPTH SHIFT K CLIPS H\n");
        return 2;
    }
    const char *dir = argv[1];
    int depth = atoi(argv[2]), shift = atoi(argv[3]), K = atoi(argv[4]);
    int clips = atoi(argv[5]), H = atoi(argv[6]);
    if (export_mkdir("model_export", dir)) return 1;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = depth;
    c.shift = shift;
    c.num_classes = K;
    c.partial_bn = 0;
    c.dropout = 0.f;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &c, &ps_backend_cpu, &ctx, clips, H, H)) return 1;
    ps_model_init(m, SEED, 1);
    char path[1024];
    if (load) {
        if (ps_model_load(m, load, PS_MODEL_LOAD_REPLACE_FC)) return 1;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (ps_model_save(m, path)) return 1;
    }

    size_t nx = (size_t)clips * c.n_segment * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    int32_t *labels = malloc(clips * sizeof *labels);
    if (!x || !labels) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    for (int b = 0; b < clips; b++) labels[b] = (b * 7 + 3) % K;
    float loss;
    if (ps_model_forward(m, x, clips, NULL, 0, NULL)) return 1;
    if (write_raw(dir, "logits_eval.bin", ps_model_logits(m), (size_t)clips * K)) return 1;
    if (load) goto done;
    if (ps_model_forward(m, x, clips, labels, 1, &loss)) return 1;
    if (write_raw(dir, "logits_train.bin", ps_model_logits(m), (size_t)clips * K)) return 1;
    snprintf(path, sizeof path, "%s/model_after.safetensors", dir);
    if (ps_model_save(m, path)) return 1;
done:
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "%d %d %d %d %d %d\n", depth, shift, K, clips, H, SEED);
    fclose(f);
    free(x);
    free(labels);
    ps_model_destroy(&m);
    ps_ctx_free(&ctx);
    return 0;
}
