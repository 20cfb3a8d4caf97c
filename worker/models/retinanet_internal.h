/* Inside of ps_retina_t, shared by retinanet.c (build, forward, backward)
 * and retinanet_params.c (tables, init, groups, safetensors). */
#ifndef PS_RETINANET_INTERNAL_H
#define PS_RETINANET_INTERNAL_H
#include "ps_retinanet.h"
#include "resnet_internal.h"

struct ps_retina {
    ps_retina_config_t cfg;
    const ps_backend_t *be;
    ps_ctx_t *ctx;
    int max_n, H, W;
    ps_model_t *body;         /* backbone (features mode, frozen BN) */

    ps_model_param_t *params; /* backbone first (names prefixed), then FPN, heads */
    int nparams, cap_params, nbody;
    ps_model_buffer_t *buffers; /* the backbone's, names prefixed */
    int nbuffers;
    ps_arena_t arena;         /* FPN + heads: params, grads, activations */

    int Cs[3], Hs[3], Ws[3];  /* C3..C5: channels, height, width */
    int lh[PS_RETINA_LEVELS], lw[PS_RETINA_LEVELS], lstride[PS_RETINA_LEVELS];
    int loff[PS_RETINA_LEVELS]; /* first row of the level within an image */
    int A;                    /* anchors per image */

    rconv_t inner[3], layer[3], p6, p7;
    rconv_t cls[4], cls_logits, box[4], bbox_reg;

    /* activations (max_n images) */
    float *inner_out[3];      /* merged laterals (N,F,Hs,Ws) */
    float *P[PS_RETINA_LEVELS]; /* (N,F,lh,lw) */
    float *p6r;               /* relu(P6) */
    float *cls_a[PS_RETINA_LEVELS][4], *box_a[PS_RETINA_LEVELS][4]; /* relu'd subnet convs */
    float *cls_o[PS_RETINA_LEVELS], *box_o[PS_RETINA_LEVELS]; /* (N, nA*K | nA*4, lh, lw) */
    float *cls_flat, *box_flat;   /* (N, A, K), (N, A, 4) */
    float *dcls_flat, *dbox_flat;
    int32_t *labels;          /* (N*A) copy */
    float *targets;           /* (N*A*4) copy */
    float *anchors;           /* (A, 4) */
    /* backward scratch */
    float *dP[PS_RETINA_LEVELS], *dI[3], *dC[3], *dp6x, *s1, *s2, *s3;

    int last_n, last_training, last_targets;
    float last_norm;
    /* per-layer hooks (ps_retina_set_hooks): the backbone fires its own */
    ps_mhooks_t hooks;
    ps_mgroup_t g_fpn, g_cls, g_box;
};

/* retinanet_params.c */
int ps_retina_define(ps_retina_t *m); /* tables (backbone copied in), descs */
void ps_retina_free_tables(ps_retina_t *m);

#endif
