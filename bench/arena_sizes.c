/* Peak arena bytes of a training step in fp32 and with half storage (fp16 /
 * bf16 activations: the CUDA backend's act_elsize 2), each without and
 * with --recompute, from the models' sizing pass alone (no memory, nothing
 * run, so the GPU's figures come out on any machine: the arena is a
 * model's whole static memory -- parameters, gradients, BN statistics,
 * activations and their gradients -- allocated once, so its size is its
 * peak).  Printed as a Markdown table for docs/detection.md.
 *
 *   bench/arena_sizes [--clips B] [--frames T] [--size S] [--images N] [--det-h H] [--det-w W]
 *
 * Rows: TSM-ResNet-50 (B clips of T frames of S x S, 400 classes; the GPU
 * bench's 8 x 8 x 224^2), and the ResNet-50 body of a two-stage detector
 * (N images of H x W, SimpleDet's / torchvision's 800 x 1333 padded to a
 * multiple of 32: 800 x 1344).  A detector's FPN, RPN and RoI heads keep
 * their own arena; their activations are not recomputed and not half yet
 * (the detectors train in fp32 on CUDA), so they are not in these rows. */
#include "worker/models/ps_model.h"

#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*sizer_t)(const ps_model_config_t *cfg, int n, int H, int W, size_t act,
                       size_t *bytes);

static int row(const char *name, const char *batch, sizer_t f, ps_model_config_t cfg, int n,
               int H, int W)
{
    size_t b[4];
    int rc = 0;
    for (int i = 0; i < 4; i++) { /* fp32, fp32 + recompute, fp16, fp16 + recompute */
        cfg.recompute = i & 1;
        rc |= f(&cfg, n, H, W, i < 2 ? 4 : 2, &b[i]);
    }
    if (rc) {
        fprintf(stderr, "arena_sizes: %s: sizing failed\n", name);
        return 1;
    }
    const double M = 1048576.0;
    printf("| %s | %s | %.0f MiB", name, batch, b[0] / M);
    for (int i = 1; i < 4; i++)
        printf(" | %.0f MiB (%+.0f%%)", b[i] / M, 100.0 * ((double)b[i] / b[0] - 1));
    printf(" |\n");
    return 0;
}

int main(int argc, char **argv)
{
    int clips = 8, frames = 8, size = 224, images = 2, dh = 800, dw = 1344;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--clips")    ? &clips
                   : !strcmp(argv[i], "--frames") ? &frames
                   : !strcmp(argv[i], "--size")   ? &size
                   : !strcmp(argv[i], "--images") ? &images
                   : !strcmp(argv[i], "--det-h")  ? &dh
                   : !strcmp(argv[i], "--det-w")  ? &dw
                                                  : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, "usage: arena_sizes [--clips B] [--frames T] [--size S] [--images N] "
                            "[--det-h H] [--det-w W]\n");
            return 2;
        }
    }
    ps_log_set_level_str("warn");
    printf("| model | batch | fp32 | fp32 + recompute | fp16 | fp16 + recompute |\n"
           "|---|---|---|---|---|---|\n");
    char batch[64];
    ps_model_config_t c;
    ps_model_config_default(&c); /* TSM-R50, 400 classes, width 64 */
    c.partial_bn = 0;
    c.bn_mode = PS_MODEL_BN_TRAIN;
    snprintf(batch, sizeof batch, "%d x %d x %d^2", clips, frames, size);
    int rc = row("TSM-ResNet-50 (BN train)", batch, ps_model_arena_size, c, clips, size, size);
    ps_model_config_default(&c);
    c.partial_bn = 0;
    c.bn_mode = PS_MODEL_BN_FROZEN; /* the detectors' default */
    snprintf(batch, sizeof batch, "%d x %d x %d", images, dh, dw);
    rc |= row("Mask / Faster R-CNN-R50-FPN: ResNet-50 body (frozen BN)", batch,
              ps_model_features_arena_size, c, images, dh, dw);
    c.bn_mode = PS_MODEL_BN_TRAIN;
    rc |= row("... the same body with BN train / sync", batch, ps_model_features_arena_size, c,
              images, dh, dw);
    return rc;
}
