/* COCO-style box evaluation with pycocotools' semantics (see coco_eval.h).
 * Structure follows COCOeval: prepare (GTs and detections per image and
 * category), evaluate (eval_img = evaluateImg: compute_iou, then per area
 * range sort_gts_by_ignore and match_dets), accumulate (per category, area
 * and maxDets), summarize (_summarize = summarize_one). */
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

/* One evaluation: Params (iouThrs, recThrs, catIds), _prepare's GTs and
 * detections per (image, category), and eval's precision and recall. */
typedef struct iou_kind iou_kind_t;
typedef struct coco_eval {
    const iou_kind_t *kind;
    const ps_coco_t *gt;
    const ps_coco_det_t *dets;
    const ps_rle_t *dmask;      /* segm: the detections' masks */
    ps_rle_t *gmask;            /* segm: each annotation's mask (prepared here) */
    double *darea;              /* each detection's area (its box's, or its mask's) */
    int ndets, I, K;
    double iou_thr[NT], rec_thr[NR];
    int64_t *cats;              /* K category ids, ascending (owned by the result) */
    /* bucket b = sorted image position * K + category position: its GTs are
     * gidx[goff[b] .. goff[b+1]), its detections didx[doff[b] .. doff[b+1]) */
    size_t nb;
    int *goff, *gidx, *doff, *didx;
    int maxg, maxd;             /* the largest bucket's GTs, detections (at least 1) */
    double *prec;               /* [NM][NA][K][NT][NR], -1 where undefined */
    double *rec;                /* [NM][NA][K][NT], -1 where undefined */
} coco_eval_t;

/* pycocotools' iouType: how a detection meets a GT and what its area is */
struct iou_kind {
    const char *name;
    /* fills ev->darea (and what iou reads); 0 or PS_E* (logged) */
    int (*prepare)(coco_eval_t *ev);
    /* IoU of detection d and annotation a (crowd rule included) */
    double (*iou)(const coco_eval_t *ev, int d, int a);
};

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

static double iou_bbox(const coco_eval_t *ev, int d, int a)
{
    const ps_coco_ann_t *g = &ev->gt->anns[a];
    return bb_iou(ev->dets[d].bbox, g->bbox, g->iscrowd);
}

static double iou_segm(const coco_eval_t *ev, int d, int a)
{
    return ps_rle_iou(&ev->dmask[d], &ev->gmask[a], ev->gt->anns[a].iscrowd);
}

/* bbox: a detection's area is its box's (loadRes: w * h) */
static int prepare_bbox(coco_eval_t *ev)
{
    for (int d = 0; d < ev->ndets; d++) ev->darea[d] = ev->dets[d].bbox[2] * ev->dets[d].bbox[3];
    return 0;
}

/* segm: every GT's mask at its image's size (annToRLE), each detection's
 * mask of its image's size, its area the mask's (loadRes of results
 * without bbox, as Detectron2 and torchvision's references write them) */
static int prepare_segm(coco_eval_t *ev)
{
    const ps_coco_t *gt = ev->gt;
    ev->gmask = calloc((size_t)gt->nanns + 1, sizeof *ev->gmask);
    if (!ev->gmask) return PS_ENOMEM;
    for (int a = 0; a < gt->nanns; a++) {
        const ps_coco_ann_t *g = &gt->anns[a];
        int im = ps_coco_find_image(gt, g->image_id);
        if (im < 0) continue; /* not evaluated */
        if (g->segm.kind == PS_COCO_SEGM_NONE) {
            ps_error("coco eval (segm): annotation %lld of image %lld has no segmentation",
                     (long long)g->id, (long long)g->image_id);
            return PS_EINVAL;
        }
        int rc = ps_coco_segm_rle(&g->segm, gt->images[im].height, gt->images[im].width,
                                  &ev->gmask[a]);
        if (rc) return rc;
    }
    for (int d = 0; d < ev->ndets; d++) {
        int im = ps_coco_find_image(gt, ev->dets[d].image_id);
        const ps_rle_t *m = &ev->dmask[d];
        if (im >= 0 && (m->h != gt->images[im].height || m->w != gt->images[im].width)) {
            ps_error("coco eval (segm): detection %d's mask is %dx%d, its image %lld is %dx%d", d,
                     m->w, m->h, (long long)ev->dets[d].image_id, gt->images[im].width,
                     gt->images[im].height);
            return PS_EINVAL;
        }
        ev->darea[d] = (double)ps_rle_area(m);
    }
    return 0;
}

static const iou_kind_t IOU_BBOX = {"bbox", prepare_bbox, iou_bbox};
static const iou_kind_t IOU_SEGM = {"segm", prepare_segm, iou_segm};

/* Scratch of one evaluateImg call, sized for the largest (image, category)
 * bucket; rc and pr are accumulate's curves, one entry per detection. */
typedef struct {
    sd_t *sd;               /* the bucket's detections by descending score */
    double *ious;           /* [detection by score][GT in file order] */
    int *gorder;            /* GTs, non-ignored first */
    uint8_t *gig, *gtm;     /* in gorder's order: ignored, matched at this threshold */
    double *rc, *pr;
} work_t;

/* computeIoU: sorts the detections by score (stable), keeps maxDets of them
 * and fills the IoU matrix; returns how many were kept */
static int compute_iou(work_t *w, const coco_eval_t *ev, const int *gi, int ng, const int *di,
                       int nd)
{
    for (int d = 0; d < nd; d++) w->sd[d].score = ev->dets[di[d]].score, w->sd[d].idx = d;
    qsort(w->sd, (size_t)nd, sizeof *w->sd, cmp_sd); /* index tie-break == mergesort's stability */
    if (nd > MAXDET) nd = MAXDET;
    for (int d = 0; d < nd; d++)
        for (int g = 0; g < ng; g++) w->ious[d * ng + g] = ev->kind->iou(ev, di[w->sd[d].idx], gi[g]);
    return nd;
}

/* evaluateImg's gtIgnore and its stable sort: GTs that are crowd or outside
 * area range ar are ignored and go after the others */
static void sort_gts_by_ignore(work_t *w, const ps_coco_t *gt, const int *gi, int ng, int ar)
{
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int g = 0; g < ng; g++) {
            const ps_coco_ann_t *a = &gt->anns[gi[g]];
            int ign = a->iscrowd || a->area < area_lo[ar] || a->area > area_hi[ar];
            if (ign == pass) {
                w->gorder[k] = g;
                w->gig[k] = (uint8_t)ign;
                k++;
            }
        }
}

/* evaluateImg's greedy matching at each IoU threshold: a detection (in score
 * order) takes the best-IoU GT not yet matched (crowds can be matched again),
 * never leaving a regular GT for an ignored one, a later GT winning an IoU
 * tie; sets ent's tp and ig */
static void match_dets(entry_t *ent, const work_t *w, const ps_coco_t *gt, const int *gi, int ng,
                       int nd, const double *thr)
{
    for (int t = 0; t < NT; t++) {
        memset(w->gtm, 0, (size_t)(ng ? ng : 1));
        for (int d = 0; d < nd; d++) {
            double iou = fmin(thr[t], 1 - 1e-10);
            int m = -1;
            for (int j = 0; j < ng; j++) {
                int g = w->gorder[j];
                int crowd = gt->anns[gi[g]].iscrowd;
                if (w->gtm[j] && !crowd) continue;
                if (m > -1 && w->gig[m] == 0 && w->gig[j] == 1) break;
                if (w->ious[d * ng + g] < iou) continue;
                iou = w->ious[d * ng + g];
                m = j;
            }
            if (m == -1) continue;
            ent[d].ig[t] = w->gig[m];
            ent[d].tp[t] = 1;
            w->gtm[m] = 1;
        }
    }
}

/* evaluateImg for one image and category, all four area ranges: each
 * range's detections (with their matches) go onto lists[ar] */
static int eval_img(elist_t *lists /* [NA] */, work_t *w, const coco_eval_t *ev, const int *gi,
                    int ng, const int *di, int nd)
{
    const ps_coco_t *gt = ev->gt;
    if (ng == 0 && nd == 0) return 0;
    nd = compute_iou(w, ev, gi, ng, di, nd);
    for (int ar = 0; ar < NA; ar++) {
        elist_t *L = &lists[ar];
        sort_gts_by_ignore(w, gt, gi, ng, ar);
        for (int g = 0; g < ng; g++) L->npig += !w->gig[g];
        entry_t *ent = malloc((size_t)(nd ? nd : 1) * sizeof *ent);
        if (!ent) return PS_ENOMEM;
        memset(ent, 0, (size_t)(nd ? nd : 1) * sizeof *ent);
        match_dets(ent, w, gt, gi, ng, nd, ev->iou_thr);
        /* an unmatched detection outside the area range is ignored */
        for (int d = 0; d < nd; d++) {
            int k = di[w->sd[d].idx];
            double area = ev->darea[k];
            int out = area < area_lo[ar] || area > area_hi[ar];
            for (int t = 0; t < NT; t++)
                if (!ent[d].tp[t] && out) ent[d].ig[t] = 1;
            ent[d].score = ev->dets[k].score;
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

/* The bucket of an (image id, category id); -1 when either is not evaluated */
static int bucket_of(const coco_eval_t *ev, const int *img_pos, int64_t image_id,
                     int64_t category_id)
{
    int im = ps_coco_find_image(ev->gt, image_id);
    int64_t *c = bsearch(&category_id, ev->cats, (size_t)ev->K, sizeof *ev->cats, cmp_i64);
    return im < 0 || !c ? -1 : img_pos[im] * ev->K + (int)(c - ev->cats);
}

/* Counting sort of items 0..n-1 by bkt[] (-1: left out), keeping file order:
 * off[nb + 1] (zeroed) gets each bucket's start, idx the items.  Returns the
 * largest bucket's size (at least 1), or PS_ENOMEM. */
static int bucket_sort(const int *bkt, int n, size_t nb, int *off, int *idx)
{
    int maxn = 1;
    for (int i = 0; i < n; i++)
        if (bkt[i] >= 0) off[bkt[i] + 1]++;
    for (size_t b = 0; b < nb; b++) {
        if (off[b + 1] > maxn) maxn = off[b + 1];
        off[b + 1] += off[b];
    }
    int *cur = malloc(nb * sizeof(int));
    if (!cur) return PS_ENOMEM;
    memcpy(cur, off, nb * sizeof(int));
    for (int i = 0; i < n; i++)
        if (bkt[i] >= 0) idx[cur[bkt[i]]++] = i;
    free(cur);
    return maxn;
}

/* _prepare: the GTs and the detections of each (image, category) */
static int prepare(coco_eval_t *ev)
{
    const ps_coco_t *gt = ev->gt;
    int rc = PS_ENOMEM;
    int *img_pos = malloc((size_t)(ev->I ? ev->I : 1) * sizeof(int)); /* images[] -> sorted pos */
    int *gb = malloc((size_t)(gt->nanns + 1) * sizeof(int));
    int *db = malloc((size_t)(ev->ndets + 1) * sizeof(int));
    ev->nb = (size_t)ev->I * ev->K + 1;
    ev->goff = calloc(ev->nb + 1, sizeof(int));
    ev->doff = calloc(ev->nb + 1, sizeof(int));
    ev->gidx = malloc((size_t)(gt->nanns + 1) * sizeof(int));
    ev->didx = malloc((size_t)(ev->ndets + 1) * sizeof(int));
    if (!img_pos || !gb || !db || !ev->goff || !ev->doff || !ev->gidx || !ev->didx) goto out;
    for (int p = 0; p < ev->I; p++) img_pos[gt->img_sorted_idx[p]] = p;
    for (int a = 0; a < gt->nanns; a++)
        gb[a] = bucket_of(ev, img_pos, gt->anns[a].image_id, gt->anns[a].category_id);
    for (int d = 0; d < ev->ndets; d++)
        db[d] = bucket_of(ev, img_pos, ev->dets[d].image_id, ev->dets[d].category_id);
    ev->maxg = bucket_sort(gb, gt->nanns, ev->nb, ev->goff, ev->gidx);
    ev->maxd = bucket_sort(db, ev->ndets, ev->nb, ev->doff, ev->didx);
    if (ev->maxg > 0 && ev->maxd > 0) rc = 0;
out:
    free(img_pos);
    free(gb);
    free(db);
    return rc;
}

static void work_free(work_t *w)
{
    free(w->sd), free(w->ious), free(w->gorder), free(w->gig), free(w->gtm);
    free(w->rc), free(w->pr);
}

static int work_alloc(work_t *w, const coco_eval_t *ev)
{
    int maxd100 = ev->maxd < MAXDET ? ev->maxd : MAXDET;
    w->ious = malloc((size_t)maxd100 * ev->maxg * sizeof(double));
    w->sd = malloc((size_t)ev->maxd * sizeof *w->sd);
    w->gorder = malloc((size_t)ev->maxg * sizeof(int));
    w->gig = malloc((size_t)ev->maxg);
    w->gtm = malloc((size_t)ev->maxg);
    w->rc = malloc((size_t)(ev->ndets + 1) * sizeof(double));
    w->pr = malloc((size_t)(ev->ndets + 1) * sizeof(double));
    if (!w->ious || !w->sd || !w->gorder || !w->gig || !w->gtm || !w->rc || !w->pr)
        return PS_ENOMEM;
    return 0;
}

/* evaluate for category k: evaluateImg over the images in id order, into
 * one list per area range */
static int evaluate_category(const coco_eval_t *ev, int k, elist_t *lists /* [NA] */,
                             work_t *w)
{
    for (int a = 0; a < NA; a++) lists[a].n = lists[a].npig = 0;
    for (int i = 0; i < ev->I; i++) {
        int b = i * ev->K + k;
        int e = eval_img(lists, w, ev, ev->gidx + ev->goff[b], ev->goff[b + 1] - ev->goff[b],
                         ev->didx + ev->doff[b], ev->doff[b + 1] - ev->doff[b]);
        if (e) return e;
    }
    return 0;
}

/* accumulate for category k: each area range's precision and recall, stored
 * at their places in ev->prec and ev->rec */
static void accumulate_category(coco_eval_t *ev, int k, elist_t *lists /* [NA] */,
                                work_t *w)
{
    double q[NM * NT * NR], r[NM * NT];
    for (int a = 0; a < NA; a++) {
        for (int x = 0; x < NM * NT * NR; x++) q[x] = -1;
        for (int x = 0; x < NM * NT; x++) r[x] = -1;
        accumulate(&lists[a], ev->rec_thr, q, r, w->rc, w->pr);
        for (int m = 0; m < NM; m++)
            for (int t = 0; t < NT; t++) {
                size_t base = ((((size_t)m * NA + a) * ev->K + k) * NT + t);
                memcpy(ev->prec + base * NR, q + (m * NT + t) * NR, NR * sizeof(double));
                ev->rec[base] = r[m * NT + t];
            }
    }
}

/* evaluate and accumulate, one category at a time (so only one category's
 * matches are held): fills ev->prec and ev->rec */
static int evaluate(coco_eval_t *ev)
{
    size_t np = (size_t)NM * NA * ev->K * NT * NR, nrc = (size_t)NM * NA * ev->K * NT;
    elist_t lists[NA];
    work_t w;
    int rc = PS_ENOMEM;
    memset(lists, 0, sizeof lists);
    memset(&w, 0, sizeof w);
    ev->prec = malloc((np ? np : 1) * sizeof(double));
    ev->rec = malloc((nrc ? nrc : 1) * sizeof(double));
    if (!ev->prec || !ev->rec || work_alloc(&w, ev)) goto out;
    for (size_t i = 0; i < np; i++) ev->prec[i] = -1;
    for (size_t i = 0; i < nrc; i++) ev->rec[i] = -1;
    for (int k = 0; k < ev->K; k++) {
        if (evaluate_category(ev, k, lists, &w)) goto out;
        accumulate_category(ev, k, lists, &w);
    }
    rc = 0;
out:
    for (int a = 0; a < NA; a++) free(lists[a].e);
    work_free(&w);
    return rc;
}

/* _summarize: the mean of the precisions (ap) or recalls above -1 at area
 * range `area` and maxDets index m, over all IoU thresholds or only the one
 * equal to thr (thr >= 0); -1 when there are none */
static double summarize_one(const coco_eval_t *ev, int ap, double thr, int area, int m)
{
    double sum = 0;
    long cnt = 0;
    for (int k = 0; k < ev->K; k++)
        for (int t = 0; t < NT; t++) {
            if (thr >= 0 && ev->iou_thr[t] != thr) continue;
            size_t base = (((size_t)m * NA + area) * ev->K + k) * NT + t;
            if (ap) {
                for (int x = 0; x < NR; x++)
                    if (ev->prec[base * NR + x] > -1) sum += ev->prec[base * NR + x], cnt++;
            } else if (ev->rec[base] > -1) {
                sum += ev->rec[base], cnt++;
            }
        }
    return cnt ? sum / cnt : -1;
}

/* summarize: the 12 stats of COCOeval.stats */
static void summarize(const coco_eval_t *ev, double *stats)
{
    static const struct {
        int ap, area, m;
        double thr;
    } spec[PS_COCO_NSTATS] = {{1, 0, 2, -1}, {1, 0, 2, .5},  {1, 0, 2, .75}, {1, 1, 2, -1},
                              {1, 2, 2, -1}, {1, 3, 2, -1},  {0, 0, 0, -1},  {0, 0, 1, -1},
                              {0, 0, 2, -1}, {0, 1, 2, -1},  {0, 2, 2, -1},  {0, 3, 2, -1}};
    for (int s = 0; s < PS_COCO_NSTATS; s++)
        stats[s] = summarize_one(ev, spec[s].ap, spec[s].thr, spec[s].area, spec[s].m);
}

/* Per category, AP @[.50:.95] and AP @.50 (area all, maxDets 100), as the
 * stats' means restricted to that category */
static void summarize_categories(const coco_eval_t *ev, ps_coco_eval_result_t *res)
{
    for (int k = 0; k < ev->K; k++) {
        double sum = 0, sum50 = 0;
        long cnt = 0, cnt50 = 0;
        for (int t = 0; t < NT; t++) {
            size_t base = (((size_t)2 * NA + 0) * ev->K + k) * NT + t;
            for (int x = 0; x < NR; x++)
                if (ev->prec[base * NR + x] > -1) {
                    sum += ev->prec[base * NR + x], cnt++;
                    if (t == 0) sum50 += ev->prec[base * NR + x], cnt50++;
                }
        }
        res->cat_ap[k] = cnt ? sum / cnt : -1;
        res->cat_ap50[k] = cnt50 ? sum50 / cnt50 : -1;
    }
}

static int evaluate_kind(ps_coco_eval_result_t *res, const iou_kind_t *kind, const ps_coco_t *gt,
                         const ps_coco_det_t *dets, const ps_rle_t *masks, int ndets)
{
    memset(res, 0, sizeof *res);
    if (!gt->img_sorted_ids && gt->nimages) {
        ps_error("coco eval: ground truth not indexed (ps_coco_index)");
        return PS_EINVAL;
    }
    coco_eval_t ev = {.kind = kind, .gt = gt, .dets = dets, .dmask = masks, .ndets = ndets,
                      .I = gt->nimages, .K = gt->ncats};
    int K = ev.K, rc = PS_ENOMEM;
    linspace(ev.iou_thr, 0.5, 0.95, NT);
    linspace(ev.rec_thr, 0.0, 1.0, NR);
    res->ncats = K;
    res->cat_ids = ev.cats = malloc((size_t)(K ? K : 1) * sizeof *ev.cats);
    res->cat_ap = malloc((size_t)(K ? K : 1) * sizeof(double));
    res->cat_ap50 = malloc((size_t)(K ? K : 1) * sizeof(double));
    ev.darea = malloc((size_t)(ndets + 1) * sizeof(double));
    if (!ev.cats || !res->cat_ap || !res->cat_ap50 || !ev.darea) goto out;
    for (int k = 0; k < K; k++) ev.cats[k] = gt->cats[k].id;
    qsort(ev.cats, (size_t)K, sizeof *ev.cats, cmp_i64);
    if ((rc = kind->prepare(&ev)) || (rc = prepare(&ev)) || (rc = evaluate(&ev))) goto out;
    summarize(&ev, res->stats);
    summarize_categories(&ev, res);
out:
    if (rc) {
        if (rc == PS_ENOMEM)
            ps_error("coco eval (%s): out of memory (%d images, %d categories, %d detections)",
                     kind->name, ev.I, K, ndets);
        ps_coco_eval_free(res);
    }
    for (int a = 0; ev.gmask && a < gt->nanns; a++) ps_rle_free(&ev.gmask[a]);
    free(ev.gmask), free(ev.darea);
    free(ev.goff), free(ev.doff), free(ev.gidx), free(ev.didx), free(ev.prec), free(ev.rec);
    return rc;
}

int ps_coco_evaluate(ps_coco_eval_result_t *res, const ps_coco_t *gt, const ps_coco_det_t *dets,
                     int ndets)
{
    return evaluate_kind(res, &IOU_BBOX, gt, dets, NULL, ndets);
}

int ps_coco_evaluate_segm(ps_coco_eval_result_t *res, const ps_coco_t *gt,
                          const ps_coco_det_t *dets, const ps_rle_t *masks, int ndets)
{
    if (ndets > 0 && !masks) {
        memset(res, 0, sizeof *res);
        ps_error("coco eval (segm): %d detections without masks", ndets);
        return PS_EINVAL;
    }
    return evaluate_kind(res, &IOU_SEGM, gt, dets, masks, ndets);
}

int ps_coco_eval_keys(const ps_coco_eval_result_t *res, const char *prefix, char *buf, size_t len)
{
    if (!prefix) prefix = "";
    return snprintf(buf, len, "%smap=%.4f %sap50=%.4f %sap75=%.4f", prefix,
                    res->stats[PS_COCO_AP], prefix, res->stats[PS_COCO_AP50], prefix,
                    res->stats[PS_COCO_AP75]);
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
