/* Inside of ps_rcnn_t, shared by rcnn.c (build, forward / backward order,
 * outputs), rcnn_fpn.c (the FPN), rcnn_rpn.c (the RPN), rcnn_box.c (a box
 * head stage) and rcnn_params.c (tables, init, safetensors).  The box
 * head is one rcnn_stage_t: a cascade is an array of them, each with its
 * own layers, sampling and coder weights. */
#ifndef PS_RCNN_INTERNAL_H
#define PS_RCNN_INTERNAL_H
#include "ps_rcnn.h"
#include "resnet_internal.h"

/* A fully connected layer (weight (K, C), bias (K)) as table rows. */
typedef struct rlin {
    int C, K;
    int pw, pb;
    float *w, *b, *gw, *gb;
} rlin_t;

/* The FPN over C2..C5 and P6 (max pool): activations for max_n images. */
typedef struct rcnn_fpn {
    rconv_t inner[4], layer[4];
    int Cs[4], Hs[4], Ws[4];     /* C2..C5: channels, height, width */
    float *inner_out[4];         /* merged laterals (N,F,Hs,Ws) */
    float *P[PS_RCNN_LEVELS];    /* (N,F,lh,lw) */
    int32_t *p6_argmax;          /* max pool argmax (N,F,lh[4],lw[4]) */
    float *dP[PS_RCNN_LEVELS], *dI[4], *dC[4];
} rcnn_fpn_t;

/* The RPN head and its per-image outputs. */
typedef struct rcnn_rpn {
    rconv_t conv, cls, bbox;
    float *t[PS_RCNN_LEVELS];    /* relu(conv(P_l)) (N,F,lh,lw) */
    float *obj_o[PS_RCNN_LEVELS], *box_o[PS_RCNN_LEVELS]; /* (N,3|12,lh,lw) */
    float *obj, *box;            /* (N,A), (N,A,4) */
    float *dobj, *dbox;
    int32_t *labels;             /* (N*A) sampled: -1, 0, 1 */
    float *targets;              /* (N*A*4) */
    float norm;                  /* anchors sampled in the batch / 2 (the focal slot's
                                    alpha 0.5 halves BCE; see rcnn_rpn.c) */
    float *props;                /* host (N, post_max, 4) */
    int *nprops;                 /* host (N) */
    int post_max;
} rcnn_rpn_t;

/* One box head stage: RoI pooling, TwoMLPHead, predictor, sampling. */
typedef struct rcnn_stage {
    ps_det_roi_sample_params_t sample;
    ps_det_roi_post_params_t post;
    int k;                        /* its index in the cascade (0: sampled from the proposals) */
    int agnostic;                 /* 4 deltas per RoI (Cascade) instead of (K+1)*4 */
    float beta;                   /* its box loss's smooth-L1 beta */
    rlin_t fc6, fc7, cls, bbox;
    int R;                        /* RoIs of the last forward */
    int Rl[PS_RCNN_ROI_LEVELS];   /* per level, level-major in the arena */
    float *rois;                  /* (Rmax, 5) batch index + box, level-major (arena) */
    float *pooled, *h6, *h7;      /* (Rmax, F*S*S), (Rmax, rep) x 2 */
    float *cls_out, *box_out;     /* (Rmax, K+1), (Rmax, (K+1)*4) */
    float *probs;                 /* (Rmax, K+1) softmax of the loss */
    int32_t *labels;              /* (Rmax) 0 background, c+1 */
    int32_t *lab_x;               /* (Rmax*(K+1)) 1 on the target class's row */
    float *tgt_x;                 /* (Rmax*(K+1), 4) the target on that row */
    float *dcls, *dbox, *dh7, *dh7b, *dh6, *dpooled;
    /* host: row j of torchvision's order is arena row pos[j]; its image */
    int32_t *pos, *img;
    float *h_rois;                /* (Rmax, 4) torchvision's order */
    int32_t *h_labels;
    int32_t *h_gt;                /* training: the matched ground truth (-1 background) */
    float *h_next;                /* (Rmax, 4) its refined boxes (a cascade's next proposals) */
    ps_mgroup_t rows;             /* its parameter rows (the hooks' group) */
} rcnn_stage_t;

/* Mask R-CNN's mask branch: RoIAlign (mask_roi_size), MaskRCNNHeads (four
 * 3x3 conv + ReLU), MaskRCNNPredictor (2x2 stride-2 deconv + ReLU, 1x1
 * conv to K+1 channels), on Rmask rows: the positive RoIs (training) or
 * the detections (inference).  The arrays the head computes on hold
 * ps_rcnn_mask_bucket(Rmask) rows (rcnn_mask.c). */
typedef struct rcnn_mask {
    rconv_t head[4], logits;
    int pdw, pdb;                 /* mask_predictor.conv5_mask weight (D,D,2,2), bias */
    float *dw, *db, *gdw, *gdb;
    int R, Rl[PS_RCNN_ROI_LEVELS];
    int Rc;                       /* rows computed: ps_rcnn_mask_bucket(R) */
    float *rois;                  /* (Rmask, 5) level-major */
    float *pooled, *h[4];         /* (Rmask, F|D, S, S) */
    float *up, *out;              /* (Rmask, D, 2S, 2S), (Rmask, K+1, 2S, 2S) */
    float *targets;               /* (Rmask, 2S*2S) */
    int32_t *labels;              /* (Rmask) the channel: class + 1 */
    float *dpooled, *da, *db_, *dup, *dout;
    /* host: row j of torchvision's order is arena row pos[j] */
    int32_t *pos, *img, *h_labels;
    float *h_rois;                /* (Rmask, 4) */
} rcnn_mask_t;

struct ps_rcnn {
    ps_rcnn_config_t cfg;
    const ps_backend_t *be;
    ps_ctx_t *ctx;
    int max_n, H, W, Rmax;
    ps_model_t *body;             /* backbone (features mode, frozen BN) */

    ps_model_param_t *params;     /* backbone (prefixed), FPN, RPN, box head */
    int nparams, cap_params, nbody;
    ps_model_buffer_t *buffers;
    int nbuffers;
    ps_arena_t arena;             /* everything but the backbone */

    int lh[PS_RCNN_LEVELS], lw[PS_RCNN_LEVELS], lstride[PS_RCNN_LEVELS];
    int loff[PS_RCNN_LEVELS];     /* first anchor row of level l in an image */
    int A;
    float *anchors;               /* (A, 4) */

    rcnn_fpn_t fpn;
    rcnn_rpn_t rpn;
    rcnn_stage_t stage[PS_RCNN_MAX_STAGES]; /* stage[0]: Faster / Mask R-CNN's box head */
    int nstages;
    rcnn_mask_t mask;
    int Rmask;                    /* mask rows at most (0 without the branch) */
    /* the last inference's detections (host): per image at most max_det */
    float *det_boxes, *det_scores;
    int32_t *det_classes;
    int *det_count;
    float *s1, *s2, *s3, *s4;     /* backward scratch, N*max(F,12)*lh[0]*lw[0] */
    int32_t *hw;                  /* (max_n, 2) last forward's image sizes (host) */

    int last_n, last_training;
    /* per-layer hooks (ps_rcnn_set_hooks): the backbone fires its own;
     * the FPN, the RPN head, each box stage and the mask branch are a
     * group each */
    ps_mhooks_t hooks;
    ps_mgroup_t g_body, g_fpn, g_rpn, g_mask;
};

/* rcnn_fpn.c */
int ps_rcnn_fpn_define(ps_rcnn_t *m);
void ps_rcnn_fpn_layout(ps_rcnn_t *m, ps_arena_t *a);
void ps_rcnn_fpn_forward(ps_rcnn_t *m, int n);
void ps_rcnn_fpn_backward(ps_rcnn_t *m, int n); /* dP -> the backbone's backward */
/* rcnn_rpn.c */
int ps_rcnn_rpn_define(ps_rcnn_t *m);
void ps_rcnn_rpn_layout(ps_rcnn_t *m, ps_arena_t *a);
void ps_rcnn_rpn_forward(ps_rcnn_t *m, int n);
int ps_rcnn_rpn_proposals(ps_rcnn_t *m, const ps_rcnn_input_t *in, int training);
int ps_rcnn_rpn_loss(ps_rcnn_t *m, const ps_rcnn_input_t *in, ps_rcnn_losses_t *l);
void ps_rcnn_rpn_backward(ps_rcnn_t *m, int n); /* writes dP (overwrites) */
/* rcnn_box.c */
int ps_rcnn_box_define(ps_rcnn_t *m, rcnn_stage_t *s, const char *head, const char *predictor);
void ps_rcnn_box_layout(ps_rcnn_t *m, rcnn_stage_t *s, ps_arena_t *a);
/* The stage on proposals (n images, counts[i] boxes of image i at props +
 * i * stride * 4): the RPN's for the first stage, the previous stage's
 * refined boxes for a cascade's next.  site: its sampling site
 * (ps_det_sample_key: 1 + stage). */
int ps_rcnn_box_forward(ps_rcnn_t *m, rcnn_stage_t *s, const ps_rcnn_input_t *in,
                        const float *props, const int *counts, int stride, int training,
                        int site, ps_rcnn_losses_t *l);
/* A cascade's stage on the previous stage's refined boxes (prev->h_next;
 * training: the non-empty ones, relabelled at the stage's IoU). */
int ps_rcnn_box_forward_next(ps_rcnn_t *m, rcnn_stage_t *s, const rcnn_stage_t *prev,
                             const ps_rcnn_input_t *in, int training, ps_rcnn_losses_t *l);
/* The stage's refined boxes (its deltas decoded on its RoIs with its
 * weights, clipped to each image) into h_next (host, after a sync). */
void ps_rcnn_box_refine(ps_rcnn_t *m, rcnn_stage_t *s);
int ps_rcnn_box_host(ps_rcnn_t *m, rcnn_stage_t *s);
void ps_rcnn_box_free_host(rcnn_stage_t *s);
void ps_rcnn_box_backward(ps_rcnn_t *m, rcnn_stage_t *s); /* += into dP[0..3] */
/* The R host rows (h_rois, img) into the arena level-major (rois (R, 5):
 * batch index + box), pos[j] = row j's arena row, Rl per level. */
void ps_rcnn_level_major(const float *h_rois, const int32_t *img, int R, int32_t *pos, int *Rl,
                         float *rois);
/* rcnn_mask.c (Mask R-CNN) */
int ps_rcnn_mask_define(ps_rcnn_t *m);
void ps_rcnn_mask_layout(ps_rcnn_t *m, ps_arena_t *a);
void ps_rcnn_mask_resolve(ps_rcnn_t *m);
size_t ps_rcnn_mask_workspace(const ps_rcnn_t *m);
int ps_rcnn_mask_host(ps_rcnn_t *m);
void ps_rcnn_mask_free_host(ps_rcnn_t *m);
void ps_rcnn_mask_init(ps_rcnn_t *m, uint64_t seed, int random);
/* training: the box stage's positive RoIs with their ground truth's mask
 * targets and the loss; inference: the detections (det_*) */
int ps_rcnn_mask_forward(ps_rcnn_t *m, const ps_rcnn_input_t *in, int training,
                         ps_rcnn_losses_t *l);
int ps_rcnn_mask_backward(ps_rcnn_t *m); /* += into dP[0..3] */
/* rcnn_params.c */
int ps_rcnn_define(ps_rcnn_t *m);
void ps_rcnn_free_tables(ps_rcnn_t *m);
void ps_rlin_resolve(rlin_t *l, const ps_model_param_t *params);

#endif
