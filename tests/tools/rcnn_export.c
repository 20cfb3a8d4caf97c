/* Helper of tests/check_fasterrcnn_torch.sh (not a test by itself): builds a
 * Faster R-CNN-FPN from the default init, writes its checkpoint and what the
 * C engine computes for the hash input in eval mode, for
 * check_fasterrcnn_torch.py to load into torchvision with strict=True and
 * compare.
 *
 *   rcnn_export OUTDIR K H DEPTH WIDTH FPN REP MASK STAGES MAXDET [WEIGHTS]
 *
 * K foreground classes, H x H input, ResNet-DEPTH of stem width WIDTH, FPN
 * channels FPN, box head REP, Mask R-CNN's mask head MASK channels (0: a
 * Faster R-CNN), STAGES box head stages (3: Cascade R-CNN), at most MAXDET
 * detections (1..100; torchvision's detections_per_img, 100 by default);
 * WEIGHTS (e.g. a psworker --model fasterrcnn-r18 export) loaded strictly
 * and re-saved.  RPN test values torchvision's (1000 / 1000).
 *
 * OUTDIR/model.safetensors  checkpoint
 * OUTDIR/objectness.bin     (A) float32 RPN logits
 * OUTDIR/rpn_deltas.bin     (A, 4)
 * OUTDIR/proposals.bin      (P, 4) the RPN's proposals
 * OUTDIR/class_logits.bin   (P, K+1) the box head on them
 * OUTDIR/box_deltas.bin     (P, (K+1)*4) (Cascade: stage 0's, (P, 4))
 * OUTDIR/detections.bin     (D, 6) x1 y1 x2 y2 score class
 * OUTDIR/mask_probs.bin     (D, 28*28) Mask R-CNN: each detection's mask
 * OUTDIR/config.txt         "K H SEED A P D DEPTH WIDTH FPN REP MASK STAGES MAXDET" */
#include "worker/models/ps_rcnn.h"

#include "ps_log.h"
#include "tests/lib/export_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234

static int write_raw(const char *dir, const char *name, const float *p, size_t n)
{
    return export_write_raw("rcnn_export", dir, name, p, n);
}

int main(int argc, char **argv)
{
    if (argc != 11 && argc != 12) {
        fprintf(stderr, "usage: rcnn_export OUTDIR K H DEPTH WIDTH FPN REP MASK STAGES MAXDET "
                        "[WEIGHTS]\n");
        return 2;
    }
    int maxdet = atoi(argv[10]);
    if (maxdet < 1 || maxdet > 100) {
        fprintf(stderr, "rcnn_export: MAXDET %s: not in 1..100\n", argv[10]);
        return 2;
    }
    const char *dir = argv[1];
    int K = atoi(argv[2]), H = atoi(argv[3]);
    if (export_mkdir("rcnn_export", dir)) return 1;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    ps_rcnn_config_t c;
    ps_rcnn_config_default(&c);
    c.num_classes = K;
    c.depth = atoi(argv[4]);
    c.width = atoi(argv[5]);
    c.fpn_channels = atoi(argv[6]);
    c.representation = atoi(argv[7]);
    c.mask_dim = atoi(argv[8]);
    c.mask = c.mask_dim > 0;
    if (!c.mask) c.mask_dim = 256;
    c.stages = atoi(argv[9]);
    c.post.max_det = maxdet;
    ps_rcnn_t *m = NULL;
    if (ps_rcnn_create(&m, &c, &ps_backend_cpu, &ctx, 1, H, H)) return 1;
    ps_rcnn_init(m, SEED, 0);
    if (argc == 12 && ps_rcnn_load(m, argv[11])) return 1;
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ps_rcnn_save(m, path)) return 1;
    size_t nx = (size_t)3 * H * H;
    float *x = malloc(nx * sizeof *x);
    if (!x) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    ps_rcnn_input_t in = {.images = x, .n = 1};
    if (ps_rcnn_forward(m, &in, NULL)) return 1;
    int A = ps_rcnn_num_anchors(m), P, R = ps_rcnn_max_rois(m);
    const float *props = ps_rcnn_proposals(m, 0, &P);
    float *cl = malloc(sizeof(float) * (K + 1) * R), *bd = malloc(sizeof(float) * 4 * (K + 1) * R);
    float *det = malloc(sizeof(float) * 6 * 100), boxes[400], scores[100];
    int32_t cls[100];
    if (!cl || !bd || !det || ps_rcnn_box_outputs(m, NULL, NULL, NULL, cl, bd) != P) return 1;
    int D = ps_rcnn_detect(m, 0, boxes, scores, cls);
    if (D < 0) return 1;
    for (int i = 0; i < D; i++) {
        memcpy(det + 6 * i, boxes + 4 * i, 4 * sizeof(float));
        det[6 * i + 4] = scores[i];
        det[6 * i + 5] = (float)cls[i];
    }
    if (write_raw(dir, "objectness.bin", ps_rcnn_objectness(m), (size_t)A) ||
        write_raw(dir, "rpn_deltas.bin", ps_rcnn_rpn_deltas(m), (size_t)A * 4) ||
        write_raw(dir, "proposals.bin", props, (size_t)P * 4) ||
        write_raw(dir, "class_logits.bin", cl, (size_t)P * (K + 1)) ||
        write_raw(dir, "box_deltas.bin", bd, (size_t)P * (c.stages > 1 ? 1 : K + 1) * 4) ||
        write_raw(dir, "detections.bin", det, (size_t)D * 6))
        return 1;
    if (c.mask) {
        float *mp = malloc(sizeof(float) * 784 * (size_t)(D ? D : 1));
        if (!mp || ps_rcnn_detect_masks(m, 0, mp) != D ||
            write_raw(dir, "mask_probs.bin", mp, (size_t)D * 784))
            return 1;
        free(mp);
    }
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "%d %d %d %d %d %d %d %d %d %d %d %d %d\n", K, H, SEED, A, P, D, c.depth, c.width,
            c.fpn_channels, c.representation, c.mask ? c.mask_dim : 0, c.stages, maxdet);
    fclose(f);
    free(x), free(cl), free(bd), free(det);
    ps_rcnn_destroy(&m);
    ps_ctx_free(&ctx);
    return 0;
}
