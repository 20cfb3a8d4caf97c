/* COCO-style box evaluation with pycocotools' semantics (see coco_eval.h).
 * Structure follows COCOeval: evaluateImg per (image, category, area range)
 * feeding accumulate's per (category, area, maxDets) lists, then summarize. */
#include "worker/det/coco_eval.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

enum { NT = 10, NR = 101, NA = 4, NM = 3, MAXDET = 100 };
static const double area_lo[NA] = {0, 0, 32 * 32, 96 * 96};
static const double area_hi[NA] = {1e10, 32 * 32, 96 * 96, 1e10};
static const int max_dets[NM] = {1, 10, 100};

/* np.linspace(start, stop, num): arange * ((stop-start)/(num-1)) + start, last = stop */
static void linspace(double *y, double start, double stop, int num)
{
    double step = (stop - start) / (num - 1);
    for (int i = 0; i < num; i++) {
        volatile double p = (double)i * step; /* no fused multiply-add: numpy rounds twice */
        y[i] = p + start;
    }
    y[num - 1] = stop;
}

typedef struct {
    double score;
    int seq;              /* position in the concatenation (stable ties) */
    int rank;             /* rank within its image (for maxDets 1/10) */
    uint8_t tp[NT], ig[NT];
} entry_t;

typedef struct {
    entry_t *e;
    int n, cap;
    int npig;             /* non-ignored GTs */
} elist_t;

static int push(elist_t *l, const entry_t *e)
{
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 256;
        entry_t *ne = realloc(l->e, (size_t)nc * sizeof *ne);
        if (!ne) return PS_ENOMEM;
        l->e = ne;
        l->cap = nc;
    }
    l->e[l->n] = *e;
    l->e[l->n].seq = l->n;
    l->n++;
    return 0;
}

static int cmp_entry(const void *pa, const void *pb)
{
    const entry_t *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

typedef struct {
    double score;
    int idx;
} sd_t;

static int cmp_sd(const void *pa, const void *pb)
{
    const sd_t *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* maskApi.c bbIou for one pair (xywh) */
static double bb_iou(const double *d, const double *g, int crowd)
{
    double w = fmin(d[2] + d[0], g[2] + g[0]) - fmax(d[0], g[0]);
    if (w <= 0) return 0;
    double h = fmin(d[3] + d[1], g[3] + g[1]) - fmax(d[1], g[1]);
    if (h <= 0) return 0;
    double i = w * h, da = d[2] * d[3], ga = g[2] * g[3];
    return i / (crowd ? da : da + ga - i);
}

/* evaluateImg for one image and category, all four area ranges */
static int eval_img(elist_t *lists /* [NA] */, const ps_coco_t *gt, const int *gi, int ng,
                    const ps_coco_det_t *dets, const int *di, int nd, const double *thr,
                    sd_t *sd, double *ious, int *gorder, uint8_t *gig, uint8_t *gtm)
{
    if (ng == 0 && nd == 0) return 0;
    for (int d = 0; d < nd; d++) sd[d].score = dets[di[d]].score, sd[d].idx = d;
    qsort(sd, (size_t)nd, sizeof *sd, cmp_sd); /* index tie-break == mergesort's stability */
    if (nd > MAXDET) nd = MAXDET;
    for (int d = 0; d < nd; d++)
        for (int g = 0; g < ng; g++) {
            const ps_coco_ann_t *a = &gt->anns[gi[g]];
            ious[d * ng + g] = bb_iou(dets[di[sd[d].idx]].bbox, a->bbox, a->iscrowd);
        }
    for (int ar = 0; ar < NA; ar++) {
        elist_t *L = &lists[ar];
        int k = 0;
        for (int pass = 0; pass < 2; pass++) /* non-ignored first, stable */
            for (int g = 0; g < ng; g++) {
                const ps_coco_ann_t *a = &gt->anns[gi[g]];
                int ign = a->iscrowd || a->area < area_lo[ar] || a->area > area_hi[ar];
                if (ign == pass) {
                    gorder[k] = g;
                    gig[k] = (uint8_t)ign;
                    k++;
                }
            }
        for (int g = 0; g < ng; g++) L->npig += !gig[g];
        entry_t *ent = malloc((size_t)(nd ? nd : 1) * sizeof *ent);
        if (!ent) return PS_ENOMEM;
        memset(ent, 0, (size_t)(nd ? nd : 1) * sizeof *ent);
        for (int t = 0; t < NT; t++) {
            memset(gtm, 0, (size_t)(ng ? ng : 1));
            for (int d = 0; d < nd; d++) {
                double iou = fmin(thr[t], 1 - 1e-10);
                int m = -1;
                for (int j = 0; j < ng; j++) {
                    int g = gorder[j];
                    int crowd = gt->anns[gi[g]].iscrowd;
                    if (gtm[j] && !crowd) continue;
                    if (m > -1 && gig[m] == 0 && gig[j] == 1) break;
                    if (ious[d * ng + g] < iou) continue;
                    iou = ious[d * ng + g];
                    m = j;
                }
                if (m == -1) continue;
                ent[d].ig[t] = gig[m];
                ent[d].tp[t] = 1;
                gtm[m] = 1;
            }
        }
        for (int d = 0; d < nd; d++) {
            const double *b = dets[di[sd[d].idx]].bbox;
            double area = b[2] * b[3];
            int out = area < area_lo[ar] || area > area_hi[ar];
            for (int t = 0; t < NT; t++)
                if (!ent[d].tp[t] && out) ent[d].ig[t] = 1;
            ent[d].score = dets[di[sd[d].idx]].score;
            ent[d].rank = d;
            if (push(L, &ent[d])) {
                free(ent);
                return PS_ENOMEM;
            }
        }
        free(ent);
    }
    return 0;
}

/* accumulate for one (category, area): precision [NM][NT][NR], recall [NM][NT] */
static void accumulate(elist_t *L, const double *rec_thr, double *prec, double *rec,
                       double *rc, double *pr)
{
    if (L->npig == 0) return; /* stays -1 */
    if (L->n > 1) qsort(L->e, (size_t)L->n, sizeof *L->e, cmp_entry);
    for (int m = 0; m < NM; m++)
        for (int t = 0; t < NT; t++) {
            double tp = 0, fp = 0;
            int nd = 0;
            for (int i = 0; i < L->n; i++) {
                const entry_t *e = &L->e[i];
                if (e->rank >= max_dets[m]) continue;
                if (!e->ig[t]) {
                    if (e->tp[t]) tp += 1;
                    else fp += 1;
                }
                rc[nd] = tp / L->npig;
                pr[nd] = tp / (fp + tp + DBL_EPSILON);
                nd++;
            }
            rec[m * NT + t] = nd ? rc[nd - 1] : 0;
            for (int i = nd - 1; i > 0; i--)
                if (pr[i] > pr[i - 1]) pr[i - 1] = pr[i];
            double *q = prec + (m * NT + t) * NR;
            int i = 0;
            for (int r = 0; r < NR; r++) {
                while (i < nd && rc[i] < rec_thr[r]) i++; /* searchsorted(side="left") */
                q[r] = i < nd ? pr[i] : 0;
            }
        }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void ps_coco_eval_free(ps_coco_eval_result_t *res)
{
    free(res->cat_ids);
    free(res->cat_ap);
    free(res->cat_ap50);
    memset(res, 0, sizeof *res);
}

int ps_coco_evaluate(ps_coco_eval_result_t *res, const ps_coco_t *gt, const ps_coco_det_t *dets,
                     int ndets)
{
    memset(res, 0, sizeof *res);
    if (!gt->img_sorted_ids && gt->nimages) {
        ps_error("coco eval: ground truth not indexed (ps_coco_index)");
        return PS_EINVAL;
    }
    int I = gt->nimages, K = gt->ncats, rc = PS_ENOMEM;
    double iou_thr[NT], rec_thr[NR];
    linspace(iou_thr, 0.5, 0.95, NT);
    linspace(rec_thr, 0.0, 1.0, NR);

    int64_t *cats = malloc((size_t)(K ? K : 1) * sizeof *cats);
    int *img_pos = malloc((size_t)(I ? I : 1) * sizeof(int)); /* images[] index -> sorted pos */
    size_t nb = (size_t)I * K + 1;
    int *goff = calloc(nb + 1, sizeof(int)), *doff = calloc(nb + 1, sizeof(int));
    int *gidx = malloc((size_t)(gt->nanns + 1) * sizeof(int));
    int *didx = malloc((size_t)(ndets + 1) * sizeof(int));
    int *gcur = NULL, *dcur = NULL, maxg = 1, maxd = 1;
    double *prec = NULL, *rec = NULL, *ious = NULL, *rcb = NULL, *prb = NULL;
    sd_t *sd = NULL;
    int *gorder = NULL;
    uint8_t *gig = NULL, *gtm = NULL;
    elist_t lists[NA];
    memset(lists, 0, sizeof lists);
    res->cat_ids = cats;
    res->ncats = K;
    res->cat_ap = malloc((size_t)(K ? K : 1) * sizeof(double));
    res->cat_ap50 = malloc((size_t)(K ? K : 1) * sizeof(double));
    if (!cats || !img_pos || !goff || !doff || !gidx || !didx || !res->cat_ap || !res->cat_ap50)
        goto out;
    for (int k = 0; k < K; k++) cats[k] = gt->cats[k].id;
    qsort(cats, (size_t)K, sizeof *cats, cmp_i64);
    for (int p = 0; p < I; p++) img_pos[gt->img_sorted_idx[p]] = p;

    /* bucket (image pos, category pos) in file order; -1 = not evaluated */
    int *gb = malloc((size_t)(gt->nanns + 1) * sizeof(int));
    int *db = malloc((size_t)(ndets + 1) * sizeof(int));
    if (!gb || !db) {
        free(gb);
        free(db);
        goto out;
    }
    for (int a = 0; a < gt->nanns; a++) {
        int im = ps_coco_find_image(gt, gt->anns[a].image_id);
        int64_t *c = bsearch(&gt->anns[a].category_id, cats, (size_t)K, sizeof *cats, cmp_i64);
        gb[a] = im < 0 || !c ? -1 : img_pos[im] * K + (int)(c - cats);
        if (gb[a] >= 0) goff[gb[a] + 1]++;
    }
    for (int d = 0; d < ndets; d++) {
        int im = ps_coco_find_image(gt, dets[d].image_id);
        int64_t *c = bsearch(&dets[d].category_id, cats, (size_t)K, sizeof *cats, cmp_i64);
        db[d] = im < 0 || !c ? -1 : img_pos[im] * K + (int)(c - cats);
        if (db[d] >= 0) doff[db[d] + 1]++;
    }
    for (size_t b = 0; b < nb; b++) {
        if (goff[b + 1] > maxg) maxg = goff[b + 1];
        if (doff[b + 1] > maxd) maxd = doff[b + 1];
        goff[b + 1] += goff[b];
        doff[b + 1] += doff[b];
    }
    gcur = malloc(nb * sizeof(int));
    dcur = malloc(nb * sizeof(int));
    if (!gcur || !dcur) {
        free(gb);
        free(db);
        goto out;
    }
    memcpy(gcur, goff, nb * sizeof(int));
    memcpy(dcur, doff, nb * sizeof(int));
    for (int a = 0; a < gt->nanns; a++)
        if (gb[a] >= 0) gidx[gcur[gb[a]]++] = a;
    for (int d = 0; d < ndets; d++)
        if (db[d] >= 0) didx[dcur[db[d]]++] = d;
    free(gb);
    free(db);

    size_t np = (size_t)NM * NA * K * NT * NR, nrc = (size_t)NM * NA * K * NT;
    prec = malloc((np ? np : 1) * sizeof(double));
    rec = malloc((nrc ? nrc : 1) * sizeof(double));
    int maxd100 = maxd < MAXDET ? maxd : MAXDET;
    ious = malloc((size_t)maxd100 * maxg * sizeof(double));
    sd = malloc((size_t)maxd * sizeof *sd);
    gorder = malloc((size_t)maxg * sizeof(int));
    gig = malloc((size_t)maxg);
    gtm = malloc((size_t)maxg);
    rcb = malloc((size_t)(ndets + 1) * sizeof(double));
    prb = malloc((size_t)(ndets + 1) * sizeof(double));
    if (!prec || !rec || !ious || !sd || !gorder || !gig || !gtm || !rcb || !prb) goto out;
    for (size_t i = 0; i < np; i++) prec[i] = -1;
    for (size_t i = 0; i < nrc; i++) rec[i] = -1;

    double q[NM * NT * NR], r[NM * NT];
    for (int k = 0; k < K; k++) {
        for (int a = 0; a < NA; a++) lists[a].n = lists[a].npig = 0;
        for (int i = 0; i < I; i++) {
            int b = i * K + k;
            int e = eval_img(lists, gt, gidx + goff[b], goff[b + 1] - goff[b], dets,
                             didx + doff[b], doff[b + 1] - doff[b], iou_thr, sd, ious, gorder,
                             gig, gtm);
            if (e) goto out;
        }
        for (int a = 0; a < NA; a++) {
            for (int x = 0; x < NM * NT * NR; x++) q[x] = -1;
            for (int x = 0; x < NM * NT; x++) r[x] = -1;
            accumulate(&lists[a], rec_thr, q, r, rcb, prb);
            for (int m = 0; m < NM; m++)
                for (int t = 0; t < NT; t++) {
                    size_t base = ((((size_t)m * NA + a) * K + k) * NT + t);
                    memcpy(prec + base * NR, q + (m * NT + t) * NR, NR * sizeof(double));
                    rec[base] = r[m * NT + t];
                }
        }
    }

    /* summarize: mean over entries > -1; iouThr selects the t with thr == value */
    struct {
        int ap, area, m;
        double thr;
    } spec[PS_COCO_NSTATS] = {{1, 0, 2, -1}, {1, 0, 2, .5},  {1, 0, 2, .75}, {1, 1, 2, -1},
                              {1, 2, 2, -1}, {1, 3, 2, -1},  {0, 0, 0, -1},  {0, 0, 1, -1},
                              {0, 0, 2, -1}, {0, 1, 2, -1},  {0, 2, 2, -1},  {0, 3, 2, -1}};
    for (int s = 0; s < PS_COCO_NSTATS; s++) {
        double sum = 0;
        long cnt = 0;
        for (int k = 0; k < K; k++)
            for (int t = 0; t < NT; t++) {
                if (spec[s].thr >= 0 && iou_thr[t] != spec[s].thr) continue;
                size_t base = (((size_t)spec[s].m * NA + spec[s].area) * K + k) * NT + t;
                if (spec[s].ap) {
                    for (int x = 0; x < NR; x++)
                        if (prec[base * NR + x] > -1) sum += prec[base * NR + x], cnt++;
                } else if (rec[base] > -1) {
                    sum += rec[base], cnt++;
                }
            }
        res->stats[s] = cnt ? sum / cnt : -1;
    }
    for (int k = 0; k < K; k++) {
        double sum = 0, sum50 = 0;
        long cnt = 0, cnt50 = 0;
        for (int t = 0; t < NT; t++) {
            size_t base = (((size_t)2 * NA + 0) * K + k) * NT + t;
            for (int x = 0; x < NR; x++)
                if (prec[base * NR + x] > -1) {
                    sum += prec[base * NR + x], cnt++;
                    if (t == 0) sum50 += prec[base * NR + x], cnt50++;
                }
        }
        res->cat_ap[k] = cnt ? sum / cnt : -1;
        res->cat_ap50[k] = cnt50 ? sum50 / cnt50 : -1;
    }
    rc = 0;
out:
    if (rc) {
        ps_error("coco eval: out of memory (%d images, %d categories, %d detections)", I, K, ndets);
        ps_coco_eval_free(res);
    }
    for (int a = 0; a < NA; a++) free(lists[a].e);
    free(img_pos), free(goff), free(doff), free(gidx), free(didx), free(gcur), free(dcur);
    free(prec), free(rec), free(ious), free(sd), free(gorder), free(gig), free(gtm);
    free(rcb), free(prb);
    return rc;
}

void ps_coco_eval_format(const ps_coco_eval_result_t *res, char *buf, size_t len)
{
    static const char *rows[PS_COCO_NSTATS] = {
        "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]",
        "Average Precision  (AP) @[ IoU=0.50      | area=   all | maxDets=100 ]",
        "Average Precision  (AP) @[ IoU=0.75      | area=   all | maxDets=100 ]",
        "Average Precision  (AP) @[ IoU=0.50:0.95 | area= small | maxDets=100 ]",
        "Average Precision  (AP) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ]",
        "Average Precision  (AP) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]",
        "Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=  1 ]",
        "Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets= 10 ]",
        "Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]",
        "Average Recall     (AR) @[ IoU=0.50:0.95 | area= small | maxDets=100 ]",
        "Average Recall     (AR) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ]",
        "Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ]"};
    size_t off = 0;
    if (len) buf[0] = 0;
    for (int s = 0; s < PS_COCO_NSTATS && off < len; s++) {
        int w = snprintf(buf + off, len - off, " %s = %0.3f\n", rows[s], res->stats[s]);
        if (w < 0) break;
        off += (size_t)w;
    }
}
