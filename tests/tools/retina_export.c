/* Helper of tests/check_retinanet_torch.sh (not a test by itself): builds
 * RetinaNet-ResNet-50-FPN at torchvision's widths (64 / 256, P6 on P5 as
 * retinanet_resnet50_fpn v1) from the hash init, writes its checkpoint and
 * the outputs the C engine computes for the hash input, for
 * check_retinanet_torch.py to load into torchvision with strict=True.
 *
 *   retina_export OUTDIR K H [DEPTH FPN WEIGHTS]
 *
 * With DEPTH FPN WEIGHTS: the model is RetinaNet-ResNet-DEPTH-FPN (width 64,
 * FPN channels FPN, P6 on C5 as psworker trains it) loaded strictly from
 * WEIGHTS (e.g. a psworker --model retinanet-r18 export), and model.
 * safetensors is a re-save of it.
 *
 * OUTDIR/model.safetensors  checkpoint
 * OUTDIR/cls.bin            (A, K) float32 classification logits
 * OUTDIR/box.bin            (A, 4) float32 box deltas
 * OUTDIR/config.txt         "K H SEED A [DEPTH FPN P6_FROM_P5]" */
#include "worker/models/ps_retinanet.h"

#include "ps_log.h"
#include "tests/lib/export_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234

static int write_raw(const char *dir, const char *name, const float *p, size_t n)
{
    return export_write_raw("retina_export", dir, name, p, n);
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 7) {
        fprintf(stderr, "usage: retina_export OUTDIR K H [DEPTH FPN WEIGHTS]\n");
        return 2;
    }
    const char *dir = argv[1];
    int K = atoi(argv[2]), H = atoi(argv[3]);
    if (export_mkdir("retina_export", dir)) return 1;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = 50;
    c.num_classes = K;
    c.p6_from_p5 = 1;
    if (argc == 7) {
        c.depth = atoi(argv[4]);
        c.fpn_channels = atoi(argv[5]);
        c.p6_from_p5 = 0;
    }
    ps_retina_t *m = NULL;
    if (ps_retina_create(&m, &c, &ps_backend_cpu, &ctx, 1, H, H)) return 1;
    ps_retina_init(m, SEED, 1);
    if (argc == 7 && ps_retina_load(m, argv[6])) return 1;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ps_retina_save(m, path)) return 1;
    size_t nx = (size_t)3 * H * H;
    float *x = malloc(nx * sizeof *x);
    if (!x) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    if (ps_retina_forward(m, x, 1, NULL, NULL, 0, NULL, NULL)) return 1;
    int A = ps_retina_num_anchors(m);
    if (write_raw(dir, "cls.bin", ps_retina_cls_out(m), (size_t)A * K) ||
        write_raw(dir, "box.bin", ps_retina_box_out(m), (size_t)A * 4))
        return 1;
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "%d %d %d %d %d %d %d\n", K, H, SEED, A, c.depth, c.fpn_channels, c.p6_from_p5);
    fclose(f);
    free(x);
    ps_retina_destroy(&m);
    ps_ctx_free(&ctx);
    return 0;
}
