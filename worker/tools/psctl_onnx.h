/* psctl export --onnx (psctl_onnx.c): the weights pulled from the servers,
 * in the partition table's flat layout, written as the ONNX graph of the
 * model they belong to. */
#ifndef PSCTL_ONNX_H
#define PSCTL_ONNX_H
#include "ps_partition.h"

typedef struct psctl_onnx_opts {
    const char *model;       /* tsm-r18|34|50, tsn-r18|34|50, retinanet-r18|34|50 */
    int frames, size;        /* T segments (video), input H = W */
    const char *shift_place; /* blockres | block */
    int shift_div;
    const char *like;        /* a full model file for what the servers lack ("" = none) */
} psctl_onnx_opts_t;

/* w: t->total_numel floats as pulled.  0, or PS_E* after a message on
 * stderr naming the tensor or option. */
int psctl_onnx_export(const psctl_onnx_opts_t *o, const ps_partition_table_t *t, const float *w,
                      const char *path);
#endif
