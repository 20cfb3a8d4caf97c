/* Faster R-CNN-FPN (worker/models/ps_rcnn.h) against torchvision's modules
 * (tests/golden/gen_fasterrcnn.py: BackboneWithFPN + LastLevelMaxPool,
 * RegionProposalNetwork, RoIHeads around the ResNet replica), the
 * debug-state approach of tests/test_retinanet.c: the same hash weights,
 * images and ground truth on both sides; sampling made deterministic by
 * the hash sampler both sides implement (det_rcnn.h); the box head on the
 * golden's pinned proposals (the float64 RPN's, rounded to float, the last
 * four replaced by boxes past the image that map to P3..P5).
 * Compared: the four losses, samples of the RPN outputs, the sampled RoIs
 * and their labels, samples of the box head outputs, every parameter
 * gradient (norm + a deterministic sample, tolerances as test_resnet /
 * test_retinanet derive them from PyTorch's own float32 noise); in eval
 * mode the box head outputs on the pinned test proposals and the detections
 * after post-processing; and the C RPN's own proposals, training and test,
 * against torchvision's (as sets: a box within 0.01 px).  Variants:
 * ResNet-18 width 8, FPN 16, 3 classes, 2 images of 64x64, nothing frozen,
 * random init; ResNet-50 width 8, 2 classes, 1 image, stem + layer1
 * frozen.  Then the tables (fasterrcnn_resnet50_fpn's element count and
 * names), a few SGD steps lower the loss, the safetensors round trip and
 * bad input.  The Mask R-CNN variant (ResNet-18 as above with the mask
 * branch, width 8; tests/golden/maskrcnn_r18.txt) adds loss_mask, the
 * positive RoIs and their mask logits, every gradient of the mask branch,
 * and each detection's mask probabilities after maskrcnn_inference. */
#include "tests/lib/model_check.h"
#include "tests/lib/tap.h"
#include "worker/det/det_boxes.h"
#include "worker/models/ps_rcnn.h"

#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEED 1234
#define LINE_MAX_ 1000000
#define MAXB 512 /* boxes per image in a golden list */


typedef struct variant {
    const char *name;
    int depth, width, fpn, K, n, H, freeze_at, rep, rpn_batch, box_batch;
    int pre_tr, post_tr, pre_te, post_te, random;
    double scale;
    int mask_dim; /* Mask R-CNN's mask branch width (0: Faster R-CNN) */
    int stages;   /* box head stages: 0 or 1, 3 = Cascade R-CNN */
} variant_t;

static ps_rcnn_t *make(ps_ctx_t *ctx, const variant_t *v)
{
    ps_rcnn_config_t c;
    ps_rcnn_config_default(&c);
    c.depth = v->depth;
    c.width = v->width;
    c.fpn_channels = v->fpn;
    c.num_classes = v->K;
    c.freeze_at = v->freeze_at;
    c.representation = v->rep;
    c.rpn_batch = v->rpn_batch;
    c.roi.batch = v->box_batch;
    c.rpn_train.pre_nms_top_n = v->pre_tr;
    c.rpn_train.post_nms_top_n = v->post_tr;
    c.rpn_test.pre_nms_top_n = v->pre_te;
    c.rpn_test.post_nms_top_n = v->post_te;
    c.max_gt = 8;
    c.mask = v->mask_dim > 0;
    c.mask_dim = v->mask_dim ? v->mask_dim : c.mask_dim;
    c.stages = v->stages > 1 ? v->stages : 1;
    ps_rcnn_t *m = NULL;
    is_int(ps_rcnn_create(&m, &c, &ps_backend_cpu, ctx, v->n, v->H, v->H), 0, "%s: create",
           v->name);
    return m;
}

/* Box lists of the golden, per image: "TAG i x1 y1 x2 y2 [cls]" */
typedef struct boxes {
    float b[2][MAXB * 4];
    int32_t cls[2][MAXB];
    int n[2];
} boxes_t;

static void add_box(boxes_t *bx, const char *line)
{
    int i, c = 0;
    float b[4];
    int got = sscanf(line, "%*s %d %f %f %f %f %d", &i, &b[0], &b[1], &b[2], &b[3], &c);
    if (got < 5 || i < 0 || i > 1 || bx->n[i] >= MAXB) return;
    memcpy(bx->b[i] + 4 * bx->n[i], b, sizeof b);
    bx->cls[i][bx->n[i]++] = c;
}

/* every golden box has a C box within tol px (any order), and the counts agree */
static void same_box_set(const char *vname, const char *what, int i, const float *got, int ngot,
                         const float *want, int nwant, double tol)
{
    int matched = 0;
    for (int a = 0; a < nwant; a++)
        for (int b = 0; b < ngot; b++) {
            int close = 1;
            for (int k = 0; k < 4; k++) close &= fabs(got[4 * b + k] - want[4 * a + k]) <= tol;
            if (close) {
                matched++;
                break;
            }
        }
    ok(ngot == nwant && matched == nwant, "%s: image %d: %d %s, torchvision %d, %d of them "
       "within %.2g px", vname, i, ngot, what, nwant, matched, tol);
}

static void samples(const char *line, const char *what, const float *out, size_t numel,
                    const char *vname)
{
    char *e;
    long n = strtol(line + strlen(what) + 1, &e, 10);
    is_int(n, (long)numel, "%s: %s count", vname, what);
    int cnt = 0, bad = check_sample_list(e, out, numel, vname, what, &cnt);
    ok(cnt > 0 && bad == 0, "%s: %d sampled %s match PyTorch", vname, cnt, what);
}

/* The RPN's anchor targets as the detection loader makes them. */
static void rpn_targets(ps_rcnn_t *m, const boxes_t *gt, int n, int K, int32_t *lab, float *tgt)
{
    int A = ps_rcnn_num_anchors(m);
    int32_t *matched = malloc(sizeof *matched * A);
    for (int i = 0; i < n; i++) {
        ps_det_assign(matched, ps_rcnn_anchors(m), A, gt->b[i], gt->n[i], 0.7f, 0.3f, NULL);
        ps_det_make_targets(lab + (size_t)i * A, tgt + (size_t)i * A * 4, matched,
                            ps_rcnn_anchors(m), A, gt->b[i], gt->cls[i], gt->n[i], K);
    }
    free(matched);
}

typedef struct golden {
    uint8_t *gtmask;   /* (2, MAXB, H, H): the masks of the gt boxes ("gtmask" lines) */
    int H;
    boxes_t gt, ptr, pev, rtr, rev, roi, det;
    float det_score[2][MAXB];
    int32_t roi_labels[2 * MAXB];
    int nroi_labels;
    double loss[4];
    char **lines; /* the sample and grad lines */
    int nlines;
} golden_t;

static const char *loss_names[4] = {"loss_objectness", "loss_rpn_box_reg", "loss_classifier",
                                    "loss_box_reg"};

/* "gtmask i j 0101...": gt box j's mask of image i, H*H digits */
static void add_mask(golden_t *g, const char *line)
{
    int i, j, off = 0;
    if (sscanf(line, "gtmask %d %d %n", &i, &j, &off) != 2 || i < 0 || i > 1 || j < 0 ||
        j >= MAXB || (int)strlen(line + off) < g->H * g->H)
        return;
    uint8_t *d = g->gtmask + ((size_t)i * MAXB + j) * g->H * g->H;
    for (int p = 0; p < g->H * g->H; p++) d[p] = line[off + p] == '1';
}

static int read_golden(golden_t *g, const char *path, int H)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(g, 0, sizeof *g);
    g->H = H;
    g->gtmask = calloc((size_t)2 * MAXB * H * H, 1);
    g->lines = calloc(4096, sizeof *g->lines);
    char *line = malloc(LINE_MAX_);
    while (fgets(line, LINE_MAX_, f)) {
        char tag[64];
        if (line[0] == '#' || sscanf(line, "%63s", tag) != 1) continue;
        if (!strcmp(tag, "gt")) add_box(&g->gt, line);
        else if (!strcmp(tag, "gtmask")) add_mask(g, line);
        else if (!strcmp(tag, "prop_train")) add_box(&g->ptr, line);
        else if (!strcmp(tag, "prop_eval")) add_box(&g->pev, line);
        else if (!strcmp(tag, "rpn_train")) add_box(&g->rtr, line);
        else if (!strcmp(tag, "rpn_eval")) add_box(&g->rev, line);
        else if (!strcmp(tag, "roi")) add_box(&g->roi, line);
        else if (!strcmp(tag, "det")) {
            int i, c;
            float s, b[4];
            if (sscanf(line, "det %d %f %d %f %f %f %f", &i, &s, &c, &b[0], &b[1], &b[2], &b[3]) ==
                    7 && i >= 0 && i < 2 && g->det.n[i] < MAXB) {
                memcpy(g->det.b[i] + 4 * g->det.n[i], b, sizeof b);
                g->det_score[i][g->det.n[i]] = s;
                g->det.cls[i][g->det.n[i]++] = c;
            }
        } else if (!strcmp(tag, "roi_labels")) {
            char *p = line + 10, *e;
            long v;
            while (g->nroi_labels < 2 * MAXB && (v = strtol(p, &e, 10), e != p)) {
                g->roi_labels[g->nroi_labels++] = (int32_t)v;
                p = e;
            }
        } else {
            int k;
            for (k = 0; k < 4 && strcmp(tag, loss_names[k]); k++) {}
            if (k < 4) g->loss[k] = strtod(line + strlen(tag), NULL);
            else if (g->nlines < 4096) g->lines[g->nlines++] = strdup(line);
        }
    }
    free(line);
    fclose(f);
    return 0;
}

static void free_golden(golden_t *g)
{
    for (int i = 0; i < g->nlines; i++) free(g->lines[i]);
    free(g->lines);
    free(g->gtmask);
}

static const char *find_line(const golden_t *g, const char *tag)
{
    size_t n = strlen(tag);
    for (int i = 0; i < g->nlines; i++)
        if (!strncmp(g->lines[i], tag, n) && g->lines[i][n] == ' ') return g->lines[i];
    return NULL;
}

static ps_rcnn_input_t training_input(ps_rcnn_t *m, const variant_t *v, const float *x,
                                      const golden_t *g, int32_t *lab, float *tgt, int32_t *ngt,
                                      int32_t *nprop)
{
    for (int i = 0; i < v->n; i++) {
        ngt[i] = g->gt.n[i];
        nprop[i] = g->ptr.n[i];
    }
    rpn_targets(m, &g->gt, v->n, v->K, lab, tgt);
    return (ps_rcnn_input_t){.images = x, .n = v->n, .rpn_labels = lab, .rpn_targets = tgt,
                             .gt_boxes = g->gt.b[0], .gt_classes = g->gt.cls[0], .ngt = ngt,
                             .gt_stride = MAXB, .seed = SEED, .proposals = g->ptr.b[0],
                             .nproposals = nprop, .proposal_stride = MAXB,
                             .gt_masks = v->mask_dim ? g->gtmask : NULL};
}

static void check_gradients(ps_rcnn_t *m, const golden_t *g, const char *vname)
{
    int np, ngrad = 0, bad = 0, nzero = 0;
    double worst_norm = 0, worst_elem = 0;
    const ps_model_param_t *P = ps_rcnn_params(m, &np);
    int *seen = calloc(np, sizeof *seen);
    for (int li = 0; li < g->nlines; li++) {
        char name[160];
        int off = 0;
        const char *line = g->lines[li];
        if (sscanf(line, "grad %159s %*d %*f %*f %*f %*f%n", name, &off) != 1 || off <= 0) continue;
        int pi = ps_rcnn_find_param(m, name);
        if (pi < 0) {
            bad++;
            diag("%s: %s not in the model", vname, name);
            continue;
        }
        seen[pi] = 1;
        ngrad++;
        double ref_norm;
        bad += check_grad_line(vname, name, line, off, &P[pi], &ref_norm, &worst_norm,
                               &worst_elem);
        /* a trainable tensor may get no gradient on both sides (r18: no
         * anchor sampled on P5 / P6, no RoI above P2); a frozen one never */
        nzero += ref_norm == 0 && P[pi].trainable;
        if (ref_norm > 0 && !P[pi].trainable) {
            bad++;
            diag("%s: %s is frozen but PyTorch's gradient norm is %g", vname, name, ref_norm);
        }
    }
    int unseen = 0;
    for (int i = 0; i < np; i++) unseen += !seen[i];
    is_int(ngrad, np, "%s: golden has a gradient for all %d parameters", vname, np);
    is_int(unseen, 0, "%s: every model parameter compared", vname);
    ok(bad == 0, "%s: %d gradients match PyTorch float64 (worst norm error %.2g, worst element "
       "error %.2g rms)", vname, ngrad, worst_norm, worst_elem);
    ok(nzero <= 2, "%s: %d trainable tensors without a gradient on both sides", vname, nzero);
    free(seen);
}

static void check_box_head(ps_rcnn_t *m, const golden_t *g, const char *vname, int K, int eval)
{
    int Rm = ps_rcnn_max_rois(m), nb = ps_rcnn_config(m)->stages > 1 ? 1 : K + 1;
    float *rois = malloc(sizeof(float) * 4 * Rm), *cl = malloc(sizeof(float) * (K + 1) * Rm);
    float *bd = malloc(sizeof(float) * 4 * (K + 1) * Rm);
    int32_t *img = malloc(sizeof(int32_t) * Rm), *lab = malloc(sizeof(int32_t) * Rm);
    int R = ps_rcnn_box_outputs(m, rois, img, lab, cl, bd);
    if (!eval) {
        is_int(R, g->roi.n[0] + g->roi.n[1], "%s: sampled RoIs", vname);
        int same = R == g->nroi_labels;
        for (int j = 0, k[2] = {0, 0}; same && j < R; j++) {
            int i = img[j];
            same = i >= 0 && i < 2 && k[i] < g->roi.n[i] && lab[j] == g->roi_labels[j];
            for (int c = 0; same && c < 4; c++)
                same = fabs(rois[4 * j + c] - g->roi.b[i][4 * k[i] + c]) <= 1e-4;
            k[i]++;
        }
        ok(same, "%s: the RoIs sampled and their labels are torchvision's, row for row", vname);
    }
    const char *lc = find_line(g, eval ? "eval_class_logits" : "class_logits");
    const char *lb = find_line(g, eval ? "eval_box_regression" : "box_regression");
    if (ok(lc && lb, "%s: golden has the box head outputs", vname)) {
        samples(lc, eval ? "eval_class_logits" : "class_logits", cl, (size_t)R * (K + 1), vname);
        samples(lb, eval ? "eval_box_regression" : "box_regression", bd, (size_t)R * nb * 4,
                vname);
    }
    free(rois), free(cl), free(bd), free(img), free(lab);
}

/* Mask R-CNN: the golden's sampled mask probabilities of image i's
 * detection a ("dmask i a p:v ...") against C's detection b */
static int mask_matches(const golden_t *g, int i, int a, const float *probs, int b, int *bad)
{
    char tag[32];
    snprintf(tag, sizeof tag, "dmask %d %d", i, a);
    const char *line = find_line(g, tag);
    if (!line) return 0;
    int cnt = 0;
    *bad += check_sample_list(line + strlen(tag), probs + (size_t)b * 784, 784, "mask", tag, &cnt);
    return cnt;
}

static void check_detections(ps_rcnn_t *m, const golden_t *g, const variant_t *v)
{
    float boxes[100 * 4], scores[100];
    int32_t cls[100];
    float *probs = v->mask_dim ? malloc(sizeof(float) * 100 * 784) : NULL;
    int masks = 0, mask_bad = 0, mask_px = 0;
    for (int i = 0; i < v->n; i++) {
        int nd = ps_rcnn_detect(m, i, boxes, scores, cls);
        if (probs)
            is_int(ps_rcnn_detect_masks(m, i, probs), nd, "%s: image %d: a mask per detection",
                   v->name, i);
        int matched = 0;
        for (int a = 0; a < g->det.n[i]; a++)
            for (int b = 0; b < nd; b++) {
                int close = cls[b] == g->det.cls[i][a] &&
                            fabs(scores[b] - g->det_score[i][a]) <= 1e-4 + 1e-3 * g->det_score[i][a];
                for (int k = 0; k < 4; k++)
                    close &= fabs(boxes[4 * b + k] - g->det.b[i][4 * a + k]) <= 1e-3;
                if (close) {
                    matched++;
                    if (probs) {
                        int px = mask_matches(g, i, a, probs, b, &mask_bad);
                        masks += px > 0;
                        mask_px += px;
                    }
                    break;
                }
            }
        ok(nd == g->det.n[i] && matched == nd, "%s: image %d: %d detections, torchvision %d, %d "
           "with the same class, score and box", v->name, i, nd, g->det.n[i], matched);
    }
    if (probs)
        ok(masks == g->det.n[0] + g->det.n[1] && mask_bad == 0, "%s: %d detections' masks "
           "(%d sampled probabilities) match maskrcnn_inference's", v->name, masks, mask_px);
    free(probs);
}

/* Cascade R-CNN: each stage's losses; stages 1 and 2's RoIs (the previous
 * stage's refined boxes) and labels row for row, their outputs (training),
 * their class logits (eval) */
static void check_stages(ps_rcnn_t *m, const golden_t *g, const variant_t *v,
                         const ps_rcnn_losses_t *L, int eval)
{
    char tag[64];
    for (int k = 0; k < 3 && !eval; k++) {
        const char *lc, *lb;
        snprintf(tag, sizeof tag, "loss_classifier_stage%d", k);
        lc = find_line(g, tag);
        snprintf(tag, sizeof tag, "loss_box_reg_stage%d", k);
        lb = find_line(g, tag);
        if (!ok(lc && lb, "%s: golden has stage %d's losses", v->name, k)) continue;
        is_close(L->stage_classifier[k], strtod(strchr(lc, ' '), NULL), 1e-4, 1e-3,
                 "%s: stage %d loss_classifier", v->name, k);
        is_close(L->stage_box_reg[k], strtod(strchr(lb, ' '), NULL), 1e-4, 1e-3,
                 "%s: stage %d loss_box_reg (L1)", v->name, k);
    }
    int Rm = ps_rcnn_max_rois(m), K1 = v->K + 1;
    float *rois = malloc(sizeof(float) * 4 * Rm), *cl = malloc(sizeof(float) * K1 * Rm);
    float *bd = malloc(sizeof(float) * 4 * Rm);
    int32_t *img = malloc(sizeof(int32_t) * Rm), *lab = malloc(sizeof(int32_t) * Rm);
    for (int k = 1; k < 3; k++) {
        int R = ps_rcnn_stage_outputs(m, k, rois, img, lab, cl, bd);
        if (eval) {
            snprintf(tag, sizeof tag, "s%d_eval_class_logits", k);
            const char *l = find_line(g, tag);
            if (ok(l != NULL, "%s: golden has %s", v->name, tag))
                samples(l, tag, cl, (size_t)R * K1, v->name);
            continue;
        }
        int n = 0, same = 1, cnt[2] = {0, 0};
        char lt[32];
        snprintf(lt, sizeof lt, "s%d_roi", k);
        for (int li = 0; li < g->nlines; li++) {
            int i;
            float b[4];
            if (strncmp(g->lines[li], lt, strlen(lt)) || g->lines[li][strlen(lt)] != ' ' ||
                sscanf(g->lines[li] + strlen(lt), "%d %f %f %f %f", &i, &b[0], &b[1], &b[2],
                       &b[3]) != 5)
                continue;
            same &= n < R && img[n] == i;
            for (int c = 0; same && c < 4; c++) same = fabs(rois[4 * n + c] - b[c]) <= 2e-3;
            if (i >= 0 && i < 2) cnt[i]++;
            n++;
        }
        snprintf(tag, sizeof tag, "s%d_roi_labels", k);
        const char *ll = find_line(g, tag);
        int nl = 0;
        for (const char *p = ll ? ll + strlen(tag) : ""; ll && *p;) {
            char *e;
            long c = strtol(p, &e, 10);
            if (e == p) break;
            same &= nl < R && lab[nl] == c;
            nl++;
            p = e;
        }
        ok(same && n == R && nl == R && R > 0, "%s: stage %d: %d RoIs (%d + %d), the previous "
           "stage's refined boxes and their labels row for row", v->name, k, R, cnt[0], cnt[1]);
        snprintf(tag, sizeof tag, "s%d_class_logits", k);
        const char *l1 = find_line(g, tag);
        if (ok(l1 != NULL, "%s: golden has %s", v->name, tag))
            samples(l1, tag, cl, (size_t)R * K1, v->name);
        snprintf(tag, sizeof tag, "s%d_box_regression", k);
        const char *l2 = find_line(g, tag);
        if (ok(l2 != NULL, "%s: golden has %s", v->name, tag))
            samples(l2, tag, bd, (size_t)R * 4, v->name);
    }
    free(rois), free(cl), free(bd), free(img), free(lab);
}

/* Mask R-CNN training: loss_mask, the positive RoIs' channels and logits */
static void check_mask_training(ps_rcnn_t *m, const golden_t *g, const variant_t *v, float loss)
{
    const char *ll = find_line(g, "loss_mask"), *lb = find_line(g, "loss_mask_labels");
    const char *lg = find_line(g, "mask_logits");
    if (!ok(ll && lb && lg, "%s: golden has the mask branch's outputs", v->name)) return;
    is_close(loss, strtod(ll + 9, NULL), 1e-4, 1e-3, "%s: loss_mask", v->name);
    int Rm = ps_rcnn_max_mask_rois(m), K1 = v->K + 1;
    float *x = malloc(sizeof(float) * (size_t)Rm * K1 * 784);
    int32_t *lab = malloc(sizeof(int32_t) * Rm);
    int R = ps_rcnn_mask_outputs(m, x, lab), same = 1, n = 0;
    char *p = (char *)lb + 16, *e;
    for (long c; (c = strtol(p, &e, 10)), e != p; p = e, n++) same &= n < R && lab[n] == c;
    ok(same && n == R && R > 0, "%s: %d positive RoIs with torchvision's channels (%d)", v->name,
       R, n);
    samples(lg, "mask_logits", x, (size_t)R * K1 * 784, v->name);
    free(x), free(lab);
}

/* The mask head computes on its rows rounded up to a bucket: the extra
 * rows must add nothing, whatever an earlier step left in them.  Step A
 * on fewer ground-truth boxes (the first image's three, the second's
 * first: 23 mask rows, computed as 24), step B on all of them and the
 * RPN's own proposals (29 rows: its backward writes other values into row
 * 23 than the golden step before A did), then step A again: A's
 * gradients, bit for bit. */
static void check_mask_stale_rows(ps_rcnn_t *m, ps_rcnn_input_t in, const char *vname)
{
    int np, R[3], fails = 0;
    const ps_model_param_t *P = ps_rcnn_params(m, &np);
    float **g1 = alloc_like(P, np);
    ps_rcnn_losses_t L;
    const int32_t *all = in.ngt;
    const float *pinned = in.proposals;
    int32_t fewer[2] = {all[0], all[1] < 1 ? all[1] : 1};
    for (int s = 0; s < 3; s++) {
        in.ngt = s == 1 ? all : fewer;
        in.proposals = s == 1 ? NULL : pinned;
        ps_rcnn_zero_grad(m);
        fails += ps_rcnn_forward(m, &in, &L) != 0;
        fails += ps_rcnn_backward(m) != 0;
        R[s] = ps_rcnn_mask_outputs(m, NULL, NULL);
        if (s == 0)
            for (int k = 0; k < np; k++) memcpy(g1[k], P[k].g, P[k].numel * sizeof(float));
    }
    int differ = 0;
    for (int k = 0; k < np; k++)
        differ += memcmp(g1[k], P[k].g, P[k].numel * sizeof(float)) != 0;
    const int b = ps_rcnn_mask_bucket(R[0]);
    ok(!fails && R[0] == R[2] && R[0] < b && R[1] >= b,
       "%s: the stale-rows case is set up: %d mask rows computed as %d, then a step of %d rows",
       vname, R[0], b, R[1]);
    ok(!fails && !differ, "%s: a bucket's extra rows add nothing after a bigger step (%d of %d "
       "gradients differ)", vname, differ, np);
    free_like(g1, np);
}

static void check_variant(ps_ctx_t *ctx, const variant_t *v)
{
    char path[1024];
    if (v->mask_dim)
        snprintf(path, sizeof path, "%s/tests/golden/maskrcnn_%s.txt", srcdir(), v->name + 5);
    else if (v->stages > 1)
        snprintf(path, sizeof path, "%s/tests/golden/%s.txt", srcdir(), v->name);
    else
        snprintf(path, sizeof path, "%s/tests/golden/fasterrcnn_%s.txt", srcdir(), v->name);
    golden_t g;
    if (!ok(read_golden(&g, path, v->H) == 0, "%s: read %s", v->name, path)) return;
    ps_rcnn_t *m = make(ctx, v);
    if (!m) return;
    ps_rcnn_init(m, SEED, v->random);
    int A = ps_rcnn_num_anchors(m);
    size_t nx = (size_t)v->n * 3 * v->H * v->H;
    float *x = malloc(nx * sizeof *x), *tgt = malloc(sizeof(float) * 4 * v->n * A);
    int32_t *lab = malloc(sizeof(int32_t) * v->n * A), ngt[2], nprop[2];
    ps_model_hash_fill(x, nx, "input", SEED, v->scale);
    const char *al = find_line(&g, "anchors");
    is_int(al ? atoi(al + 8) : -1, A, "%s: anchors per image", v->name);

    /* training on the pinned proposals: losses, outputs, gradients */
    ps_rcnn_input_t in = training_input(m, v, x, &g, lab, tgt, ngt, nprop);
    ps_rcnn_losses_t L;
    ps_rcnn_zero_grad(m);
    is_int(ps_rcnn_forward(m, &in, &L), 0, "%s: training forward", v->name);
    float got[4] = {L.objectness, L.rpn_box, L.classifier, L.box_reg};
    for (int k = 0; k < 4; k++)
        is_close(got[k], g.loss[k], 1e-4, 1e-3, "%s: %s", v->name, loss_names[k]);
    const char *lo = find_line(&g, "objectness"), *ld = find_line(&g, "rpn_deltas");
    if (ok(lo && ld, "%s: golden has the RPN outputs", v->name)) {
        samples(lo, "objectness", ps_rcnn_objectness(m), (size_t)v->n * A, v->name);
        samples(ld, "rpn_deltas", ps_rcnn_rpn_deltas(m), (size_t)v->n * A * 4, v->name);
    }
    check_box_head(m, &g, v->name, v->K, 0);
    if (v->mask_dim) check_mask_training(m, &g, v, L.mask);
    if (v->stages > 1) check_stages(m, &g, v, &L, 0);
    is_int(ps_rcnn_backward(m), 0, "%s: backward", v->name);
    check_gradients(m, &g, v->name);
    if (v->mask_dim) check_mask_stale_rows(m, in, v->name);

    /* the C RPN's own proposals, training values */
    in.proposals = NULL;
    is_int(ps_rcnn_forward(m, &in, &L), 0, "%s: training forward, own proposals", v->name);
    for (int i = 0; i < v->n; i++) {
        int k;
        const float *p = ps_rcnn_proposals(m, i, &k);
        same_box_set(v->name, "training proposals", i, p, k, g.rtr.b[i], g.rtr.n[i], 0.01);
    }

    /* inference: pinned test proposals, then the RPN's own */
    for (int i = 0; i < v->n; i++) nprop[i] = g.pev.n[i];
    ps_rcnn_input_t ev = {.images = x, .n = v->n, .proposals = g.pev.b[0], .nproposals = nprop,
                          .proposal_stride = MAXB};
    is_int(ps_rcnn_forward(m, &ev, NULL), 0, "%s: inference on given proposals", v->name);
    check_box_head(m, &g, v->name, v->K, 1);
    if (v->stages > 1) check_stages(m, &g, v, NULL, 1);
    check_detections(m, &g, v);
    ev.proposals = NULL;
    is_int(ps_rcnn_forward(m, &ev, NULL), 0, "%s: inference", v->name);
    for (int i = 0; i < v->n; i++) {
        int k;
        const float *p = ps_rcnn_proposals(m, i, &k);
        same_box_set(v->name, "test proposals", i, p, k, g.rev.b[i], g.rev.n[i], 0.01);
    }
    ps_log_level = -1;
    is_int(ps_rcnn_backward(m), PS_ESTATE, "%s: backward after inference refused", v->name);
    ps_log_level = PS_LOG_WARN;
    free(x), free(tgt), free(lab);
    free_golden(&g);
    ps_rcnn_destroy(&m);
}

/* The FPN level of a RoI against torchvision's LevelMapper, boundaries
 * included (gen_fasterrcnn.py's fasterrcnn_levels.txt). */
static void check_levels(void)
{
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/tests/golden/fasterrcnn_levels.txt", srcdir());
    FILE *f = fopen(path, "r");
    if (!ok(f != NULL, "open %s", path)) return;
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        float b[4];
        int want;
        if (sscanf(line, "level %f %f %f %f %d", &b[0], &b[1], &b[2], &b[3], &want) != 5) continue;
        int got = ps_det_roi_level(b, 2, 5, 4, 224.f, 1e-6f);
        n++;
        if (got != want) {
            bad++;
            diag("box %g %g %g %g: level %d, torchvision %d", b[0], b[1], b[2], b[3], got, want);
        }
    }
    fclose(f);
    ok(n >= 20 && bad == 0, "level mapper: %d boxes (boundaries 112 / 224 / 448 and their float "
       "neighbours, tiny, huge, empty) on torchvision's levels", n);
}

/* The mask head's row buckets: never fewer rows, at most 1/8 more, rows up
 * to 16 exact, monotonic, and 8 sizes per doubling above 16 (what keeps
 * the CPU's per-shape kernel choice to a few dozen shapes). */
static void check_mask_bucket(void)
{
    int bad = 0, prev = 0;
    for (int r = 0; r <= 4096; r++) {
        int b = ps_rcnn_mask_bucket(r);
        if (b < r || 8 * (b - r) > r || (r <= 16 && b != r) || b < prev) {
            if (bad++ < 5) diag("bucket(%d) = %d (previous %d)", r, b, prev);
        }
        prev = b;
    }
    ok(!bad, "mask rows bucket: >= rows, <= 9/8 rows, exact up to 16, monotonic (0..4096)");
    for (int lo = 32; lo <= 2048; lo *= 2) {
        int n = 0, last = -1;
        for (int r = lo + 1; r <= 2 * lo; r++) {
            int b = ps_rcnn_mask_bucket(r);
            if (b != last) n++, last = b;
        }
        if (n != 8) bad++, diag("rows %d..%d: %d sizes", lo + 1, 2 * lo, n);
    }
    ok(!bad, "mask rows bucket: 8 sizes for the rows in each (2^k, 2^(k+1)], 32 to 4096");
}

/* Tables: torchvision's element count and names, frozen flags, groups. */
static void check_tables(ps_ctx_t *ctx)
{
    variant_t v = {"tables", 50, 64, 256, 90, 1, 64, 2, 1024, 256, 512, 2000, 2000, 1000, 1000,
                   0, 1.0, 0, 0};
    ps_rcnn_t *m = make(ctx, &v);
    if (!m) return;
    int np, nb;
    const ps_model_param_t *P = ps_rcnn_params(m, &np);
    ps_rcnn_buffers(m, &nb);
    static const char *names[] = {
        "backbone.fpn.inner_blocks.0.0.weight", "backbone.fpn.layer_blocks.3.0.bias",
        "rpn.head.conv.0.0.weight", "rpn.head.cls_logits.bias", "rpn.head.bbox_pred.weight",
        "roi_heads.box_head.fc6.weight", "roi_heads.box_head.fc7.bias",
        "roi_heads.box_predictor.cls_score.weight"};
    /* torchvision fasterrcnn_resnet50_fpn(weights=None, num_classes=91):
     * sum(p.numel() for p in model.parameters()) = 41,808,406 */
    check_r50_detector_table(P, np, nb, 41808406, "roi_heads.box_predictor.bbox_pred.bias", names,
                             8);
    int i = ps_rcnn_find_param(m, "roi_heads.box_head.fc6.weight");
    ok(i >= 0 && P[i].shape[0] == 1024 && P[i].shape[1] == 256 * 49, "fc6 (1024, 12544)");
    i = ps_rcnn_find_param(m, "roi_heads.box_predictor.bbox_pred.weight");
    ok(i >= 0 && P[i].shape[0] == 91 * 4, "bbox_pred (364, 1024)");
    i = ps_rcnn_find_param(m, "backbone.fpn.inner_blocks.0.0.weight");
    ok(i >= 0 && P[i].shape[1] == 256, "inner_blocks.0 on C2 (256 channels)");
    is_int(P[ps_rcnn_find_param(m, "roi_heads.box_head.fc6.bias")].group, PS_MODEL_GROUP_BIAS,
           "box head bias group");
    ps_rcnn_destroy(&m);

    ps_log_level = -1;
    ps_rcnn_config_t c;
    ps_rcnn_config_default(&c);
    ok(ps_rcnn_create(&m, &c, &ps_backend_cpu, ctx, 1, 96, 96) == PS_EINVAL && !m,
       "96-pixel input refused (not a multiple of 64)");
    c.roi.fg_iou = 0.4f;
    ok(ps_rcnn_create(&m, &c, &ps_backend_cpu, ctx, 1, 64, 64) == PS_EINVAL && !m,
       "box head fg IoU below bg IoU refused");
    ps_log_level = PS_LOG_WARN;
}

/* A few SGD steps on the RPN's own proposals lower every loss; round trip;
 * bad input. */
static void check_training(ps_ctx_t *ctx)
{
    variant_t v = {"train", 18, 8, 16, 3, 2, 64, 2, 64, 64, 64, 200, 100, 100, 50, 0, 1.0, 0, 0};
    ps_rcnn_t *m = make(ctx, &v);
    if (!m) return;
    ps_rcnn_init(m, 7, 0);
    int A = ps_rcnn_num_anchors(m), np;
    size_t nx = (size_t)v.n * 3 * 64 * 64;
    float *x = malloc(nx * sizeof *x), *tgt = malloc(sizeof(float) * 4 * v.n * A);
    int32_t *lab = malloc(sizeof(int32_t) * v.n * A), ngt[2] = {2, 2};
    ps_model_hash_fill(x, nx, "images", 3, 1.0);
    boxes_t gt = {.n = {2, 2}};
    const float g[2][8] = {{8, 8, 40, 36, 30, 20, 62, 60}, {4, 30, 28, 62, 20, 2, 58, 26}};
    for (int i = 0; i < 2; i++) {
        memcpy(gt.b[i], g[i], sizeof g[i]);
        gt.cls[i][0] = i;
        gt.cls[i][1] = 2;
    }
    rpn_targets(m, &gt, v.n, v.K, lab, tgt);
    ps_rcnn_input_t in = {.images = x, .n = v.n, .rpn_labels = lab, .rpn_targets = tgt,
                          .gt_boxes = gt.b[0], .gt_classes = gt.cls[0], .ngt = ngt,
                          .gt_stride = MAXB};
    const ps_model_param_t *P = ps_rcnn_params(m, &np);
    ps_optim_config_t oc;
    ps_optim_config_default(&oc);
    oc.lr = 0.02f;
    oc.momentum = 0.9f;
    oc.weight_decay = 1e-4f;
    oc.ngroups = ps_rcnn_groups(m, oc.groups, PS_OPTIM_MAX_GROUPS);
    float **mom = alloc_like(P, np);
    ps_rcnn_losses_t L0 = {0}, L = {0};
    int fails = 0, steps = 12;
    for (int s = 0; s < steps; s++) {
        in.seed = 100 + s;
        ps_rcnn_zero_grad(m);
        fails += ps_rcnn_forward(m, &in, &L) != 0;
        fails += ps_rcnn_backward(m) != 0;
        if (s == 0) L0 = L;
        diag("step %d objectness %.4f rpn_box %.4f classifier %.4f box_reg %.4f", s,
             L.objectness, L.rpn_box, L.classifier, L.box_reg);
        sgd_step(P, np, mom, &oc, s == 0);
    }
    is_int(fails, 0, "training steps ran");
    float t0 = L0.objectness + L0.rpn_box + L0.classifier + L0.box_reg;
    float t1 = L.objectness + L.rpn_box + L.classifier + L.box_reg;
    ok(isfinite(t1) && t1 < 0.8f * t0 && L.objectness < L0.objectness &&
       L.classifier < L0.classifier, "loss falls: %.4f -> %.4f in %d SGD steps (objectness "
       "%.4f -> %.4f, classifier %.4f -> %.4f)", t0, t1, steps, L0.objectness, L.objectness,
       L0.classifier, L.classifier);
    int frozen_nonzero = 0;
    for (int i = 0; i < np; i++)
        if (!P[i].trainable) frozen_nonzero += l2(P[i].g, P[i].numel) != 0;
    is_int(frozen_nonzero, 0, "frozen tensors collected no gradient");

    /* safetensors round trip into a differently initialised model */
    char path[] = "/tmp/test_fasterrcnn_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    is_int(ps_rcnn_save(m, path), 0, "save");
    ps_rcnn_input_t ev = {.images = x, .n = v.n};
    ps_rcnn_forward(m, &ev, NULL);
    int Rm = ps_rcnn_max_rois(m), R1 = ps_rcnn_box_outputs(m, NULL, NULL, NULL, NULL, NULL);
    float *cl1 = malloc(sizeof(float) * 4 * Rm), *cl2 = malloc(sizeof(float) * 4 * Rm);
    ps_rcnn_box_outputs(m, NULL, NULL, NULL, cl1, NULL);
    ps_rcnn_t *m2 = make(ctx, &v);
    if (m2) {
        ps_rcnn_init(m2, 99, 1);
        is_int(ps_rcnn_load(m2, path), 0, "load");
        ps_rcnn_forward(m2, &ev, NULL);
        int R2 = ps_rcnn_box_outputs(m2, NULL, NULL, NULL, cl2, NULL);
        ok(R1 == R2 && R1 > 0 && !memcmp(cl1, cl2, sizeof(float) * 4 * R1),
           "round trip: the same %d RoIs and class logits", R1);
        variant_t v4 = v;
        v4.K = 4;
        ps_rcnn_t *m3 = make(ctx, &v4);
        if (m3) {
            ps_log_level = -1;
            is_int(ps_rcnn_load(m3, path), PS_EMISMATCH, "other class count refused");
            ps_log_level = PS_LOG_WARN;
            ps_rcnn_destroy(&m3);
        }
        ps_rcnn_destroy(&m2);
    }
    unlink(path);

    /* an ImageNet-style classifier checkpoint seeds the backbone: the
     * PyTorch-written ResNet-18 width 8 of test_model_io (fc.* ignored) */
    char tpath[1024];
    snprintf(tpath, sizeof tpath, "%s/tests/golden/torch_r18w8.safetensors", srcdir());
    is_int(ps_rcnn_load_backbone(m, tpath), 0, "backbone loads a PyTorch-written ResNet-18");
    int li = ps_rcnn_find_param(m, "backbone.body.layer3.1.conv2.weight");
    ok(li >= 0 && fabs(P[li].w[0]) > 0 && l2(P[li].g, P[li].numel) == 0,
       "backbone weights replaced, gradients zeroed");

    /* bad input: clear errors, never a crash */
    ps_log_level = -1;
    ps_rcnn_losses_t Lb;
    ngt[1] = 9;
    is_int(ps_rcnn_forward(m, &in, &Lb), PS_EINVAL, "more ground truth than max_gt refused");
    ngt[1] = 2;
    gt.cls[0][1] = 3;
    is_int(ps_rcnn_forward(m, &in, &Lb), PS_EINVAL, "class K refused");
    gt.cls[0][1] = 2;
    lab[7] = -5;
    is_int(ps_rcnn_forward(m, &in, &Lb), PS_EINVAL, "RPN label -5 refused");
    lab[7] = 0;
    in.n = 3;
    is_int(ps_rcnn_forward(m, &in, &Lb), PS_EINVAL, "batch over max refused");
    in.n = 2;
    in.gt_boxes = NULL;
    is_int(ps_rcnn_forward(m, &in, &Lb), PS_EINVAL, "training without ground truth refused");
    int32_t hw[4] = {64, 64, 65, 10};
    ev.image_hw = hw;
    is_int(ps_rcnn_forward(m, &ev, NULL), PS_EINVAL, "image size beyond the input refused");
    ps_log_level = PS_LOG_WARN;
    /* an image size clips the detections */
    hw[2] = 40, hw[3] = 24;
    is_int(ps_rcnn_forward(m, &ev, NULL), 0, "inference with image sizes");
    int nd, inside = 1, k;
    float boxes[400], scores[100];
    int32_t cls[100];
    const float *pr = ps_rcnn_proposals(m, 1, &k);
    for (int j = 0; j < k; j++) inside &= pr[4 * j + 2] <= 24 && pr[4 * j + 3] <= 40;
    nd = ps_rcnn_detect(m, 1, boxes, scores, cls);
    for (int j = 0; j < nd; j++) inside &= boxes[4 * j + 2] <= 24 && boxes[4 * j + 3] <= 40;
    ok(k > 0 && nd >= 0 && inside, "image 1 of 24x40: %d proposals, %d detections inside it", k,
       nd);
    free_like(mom, np);
    free(x), free(tgt), free(lab), free(cl1), free(cl2);
    ps_rcnn_destroy(&m);
}

int main(void)
{
    ps_ctx_t ctx;
    ps_log_level = PS_LOG_WARN;
    ps_engine_init(&ctx, 0);
    static const variant_t vs[] = {
        {"r18", 18, 8, 16, 3, 2, 64, 0, 32, 64, 64, 200, 100, 100, 50, 1, 0.25, 0, 0},
        {"r50", 50, 8, 16, 2, 1, 64, 2, 32, 2048, 512, 200, 100, 100, 50, 0, 0.1, 0, 0},
        {"mask_r18", 18, 8, 16, 3, 2, 64, 0, 32, 64, 64, 200, 100, 100, 50, 1, 0.25, 8, 0},
        {"cascade_r18", 18, 8, 16, 3, 2, 64, 0, 32, 64, 64, 200, 100, 100, 50, 1, 0.25, 0, 3},
    };
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) check_variant(&ctx, &vs[i]);
    check_levels();
    check_mask_bucket();
    check_tables(&ctx);
    check_training(&ctx);
    ps_ctx_free(&ctx);
    return tap_done();
}
