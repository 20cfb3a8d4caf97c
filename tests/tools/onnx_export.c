/* Helper of tests/check_onnx.sh (not a test by itself): builds a model from
 * the hash init with random BN statistics (so every BN term shows), writes
 * it as ONNX together with the input it evaluates and the outputs the C
 * engine computes for it, for tests/tools/check_onnx.py to run the file in
 * onnxruntime and compare.
 *
 *   onnx_export OUTDIR video DEPTH SHIFT PLACE SHIFT_DIV K CLIPS T H WIDTH
 *   onnx_export OUTDIR retina DEPTH K N H WIDTH FPN
 *
 * video: TSM (SHIFT 1, PLACE blockres|block, 1/SHIFT_DIV each way) or TSN
 * ResNet-DEPTH; retina: RetinaNet-ResNet-DEPTH-FPN (P6 on C5).
 *
 * OUTDIR/model.onnx     the export
 * OUTDIR/input.bin      float32 input: (CLIPS, T, 3, H, H) or (N, 3, H, H)
 * OUTDIR/out0.bin       video: (CLIPS, K) eval logits; retina: (N, A, K)
 * OUTDIR/out1.bin       retina: (N, A, 4) box deltas
 * OUTDIR/config.txt     "video CLIPS T H K" or "retina N H K A" */
#include "worker/models/ps_model.h"
#include "worker/models/ps_retinanet.h"

#include "ps_log.h"
#include "tests/lib/export_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED 1234
#define PROG "onnx_export"

static int config(const char *dir, const char *line)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(line, f) < 0 || fclose(f)) return 1;
    return 0;
}

static int video(const char *dir, char **a, ps_ctx_t *ctx)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = atoi(a[0]);
    c.shift = atoi(a[1]);
    c.shift_place = !strcmp(a[2], "block") ? PS_MODEL_SHIFT_BLOCK : PS_MODEL_SHIFT_BLOCKRES;
    c.shift_div = atoi(a[3]);
    c.num_classes = atoi(a[4]);
    int clips = atoi(a[5]), H = atoi(a[7]);
    c.n_segment = atoi(a[6]);
    c.width = atoi(a[8]);
    c.partial_bn = 0;
    ps_model_t *m = NULL;
    if (ps_model_create(&m, &c, &ps_backend_cpu, ctx, clips, H, H)) return 1;
    ps_model_init(m, SEED, 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if (ps_model_export_onnx(m, path)) return 1;
    size_t nx = (size_t)clips * c.n_segment * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    if (!x) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    int rc = ps_model_forward(m, x, clips, NULL, 0, NULL) ||
             export_write_raw(PROG, dir, "input.bin", x, nx) ||
             export_write_raw(PROG, dir, "out0.bin", ps_model_logits(m),
                              (size_t)clips * c.num_classes);
    char line[128];
    snprintf(line, sizeof line, "video %d %d %d %d\n", clips, c.n_segment, H, c.num_classes);
    rc = rc || config(dir, line);
    free(x);
    ps_model_destroy(&m);
    return rc;
}

static int retina(const char *dir, char **a, ps_ctx_t *ctx)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = atoi(a[0]);
    c.num_classes = atoi(a[1]);
    int n = atoi(a[2]), H = atoi(a[3]);
    c.width = atoi(a[4]);
    c.fpn_channels = atoi(a[5]);
    ps_retina_t *m = NULL;
    if (ps_retina_create(&m, &c, &ps_backend_cpu, ctx, n, H, H)) return 1;
    ps_retina_init(m, SEED, 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if (ps_retina_export_onnx(m, path)) return 1;
    size_t nx = (size_t)n * 3 * H * H;
    float *x = malloc(nx * sizeof *x);
    if (!x) return 1;
    ps_model_hash_fill(x, nx, "input", SEED, 1.0);
    int A = ps_retina_num_anchors(m), K = c.num_classes;
    int rc = ps_retina_forward(m, x, n, NULL, NULL, 0, NULL, NULL) ||
             export_write_raw(PROG, dir, "input.bin", x, nx) ||
             export_write_raw(PROG, dir, "out0.bin", ps_retina_cls_out(m), (size_t)n * A * K) ||
             export_write_raw(PROG, dir, "out1.bin", ps_retina_box_out(m), (size_t)n * A * 4);
    char line[128];
    snprintf(line, sizeof line, "retina %d %d %d %d\n", n, H, K, A);
    rc = rc || config(dir, line);
    free(x);
    ps_retina_destroy(&m);
    return rc;
}

int main(int argc, char **argv)
{
    int is_video = argc == 12 && !strcmp(argv[2], "video");
    int is_retina = argc == 9 && !strcmp(argv[2], "retina");
    if (!is_video && !is_retina) {
        fprintf(stderr, "usage: " PROG " OUTDIR video DEPTH SHIFT PLACE SHIFT_DIV K CLIPS T H "
                        "WIDTH\n       " PROG " OUTDIR retina DEPTH K N H WIDTH FPN\n");
        return 2;
    }
    if (export_mkdir(PROG, argv[1])) return 1;
    ps_log_level = PS_LOG_WARN;
    ps_ctx_t ctx;
    ps_engine_init(&ctx, 0);
    int rc = is_video ? video(argv[1], argv + 3, &ctx) : retina(argv[1], argv + 3, &ctx);
    ps_ctx_free(&ctx);
    if (rc) fprintf(stderr, PROG ": failed\n");
    return rc;
}
