/* The ONNX writer without Python (worker/models/onnx_graph.h): the files
 * read back with protobuf-c from proto/onnx.proto.  Checked: IR version,
 * opset, the inputs and outputs with their symbolic batch; every
 * initializer named after a model tensor holds that tensor bit for bit;
 * the graph is in topological order (every node input defined before it)
 * with unique value names; the temporal shift appears as 3 Slice + 2 Pad +
 * 1 Concat per shifted block, for both placements, and not at all in TSN;
 * RetinaNet's graph has its two outputs and its heads' weights once.  The
 * builder's errors are sticky and a refused save writes nothing.  The
 * numbers themselves are compared in onnxruntime by tests/check_onnx.sh. */
#include "tests/lib/tap.h"
#include "worker/models/onnx_graph.h"
#include "worker/models/ps_model.h"
#include "worker/models/ps_retinanet.h"

#include "onnx.pb-c.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];
static ps_ctx_t ctx;

static Onnx__ModelProto *read_model(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    Onnx__ModelProto *m = NULL;
    if (b && fread(b, 1, (size_t)n, f) == (size_t)n) m = onnx__model_proto__unpack(NULL, (size_t)n, b);
    free(b);
    fclose(f);
    return m;
}

static int count_op(const Onnx__GraphProto *g, const char *op)
{
    int n = 0;
    for (size_t i = 0; i < g->n_node; i++) n += !strcmp(g->node[i]->op_type, op);
    return n;
}

/* Topological order and unique names: every input is a graph input, an
 * initializer or an earlier node's output. */
static int well_formed(const Onnx__GraphProto *g, char *why, size_t len)
{
    size_t cap = g->n_input + g->n_initializer + g->n_node, n = 0;
    const char **seen = malloc(sizeof *seen * cap);
    int good = seen != NULL;
    for (size_t i = 0; good && i < g->n_input; i++) seen[n++] = g->input[i]->name;
    for (size_t i = 0; good && i < g->n_initializer; i++) seen[n++] = g->initializer[i]->name;
    for (size_t i = 0; good && i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        for (size_t k = 0; good && k < nd->n_input; k++) {
            int found = !*nd->input[k];
            for (size_t j = 0; !found && j < n; j++) found = !strcmp(seen[j], nd->input[k]);
            if (!found) snprintf(why, len, "%s reads %s before it exists", nd->name, nd->input[k]);
            good = found;
        }
        for (size_t j = 0; good && j < n; j++)
            if (!strcmp(seen[j], nd->output[0])) {
                snprintf(why, len, "%s defined twice", nd->output[0]);
                good = 0;
            }
        if (good) seen[n++] = nd->output[0];
    }
    free(seen);
    return good;
}

static const Onnx__TensorProto *init_of(const Onnx__GraphProto *g, const char *name)
{
    for (size_t i = 0; i < g->n_initializer; i++)
        if (!strcmp(g->initializer[i]->name, name)) return g->initializer[i];
    return NULL;
}

/* Every parameter and float buffer is an initializer of that name, same
 * dims, same bytes. */
static int tables_in(const Onnx__GraphProto *g, const ps_model_param_t *P, int np,
                     const ps_model_buffer_t *B, int nb, char *why, size_t len)
{
    for (int i = 0; i < np + nb; i++) {
        const char *name = i < np ? P[i].name : B[i - np].name;
        const float *v = i < np ? P[i].w : B[i - np].f32;
        size_t numel = i < np ? P[i].numel : B[i - np].numel;
        if (!v) continue;
        const Onnx__TensorProto *t = init_of(g, name);
        if (!t || t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
            t->raw_data.len != numel * 4 || memcmp(t->raw_data.data, v, numel * 4) ||
            (i < np && t->n_dims != (size_t)P[i].ndim)) {
            snprintf(why, len, "%s: %s", name, t ? "differs" : "no initializer");
            return 0;
        }
        for (int d = 0; i < np && d < P[i].ndim; d++)
            if (t->dims[d] != P[i].shape[d]) {
                snprintf(why, len, "%s: dim %d is %lld", name, d, (long long)t->dims[d]);
                return 0;
            }
    }
    return 1;
}

static int batch_dim(const Onnx__ValueInfoProto *v, int ndim)
{
    const Onnx__TensorShapeProto *s = v->type->tensor_type->shape;
    return s->n_dim == (size_t)ndim &&
           s->dim[0]->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
           !strcmp(s->dim[0]->dim_param, "batch");
}

static void check_video(const char *tag, int shift, int place, int depth)
{
    ps_model_config_t c;
    ps_model_config_default(&c);
    c.depth = depth;
    c.width = 8;
    c.num_classes = 6;
    c.n_segment = 4;
    c.shift = shift;
    c.shift_place = place;
    c.partial_bn = 0;
    ps_model_t *m = NULL;
    if (!ok(!ps_model_create(&m, &c, &ps_backend_cpu, &ctx, 1, 32, 32), "%s: model", tag)) return;
    ps_model_init(m, 7, 1);
    char path[512], why[256] = "";
    snprintf(path, sizeof path, "%s/%s.onnx", tmpdir, tag);
    is_int(ps_model_export_onnx(m, path), 0, "%s: exported", tag);
    Onnx__ModelProto *mp = read_model(path);
    if (!ok(mp && mp->graph, "%s: protobuf-c reads it back as a ModelProto", tag)) return;
    const Onnx__GraphProto *g = mp->graph;
    ok(mp->ir_version == PS_ONNX_IR_VERSION && mp->n_opset_import == 1 &&
       !*mp->opset_import[0]->domain && mp->opset_import[0]->version == PS_ONNX_OPSET,
       "%s: IR %lld, default domain opset %lld", tag, (long long)mp->ir_version,
       mp->n_opset_import ? (long long)mp->opset_import[0]->version : -1LL);
    ok(g->n_input == 1 && !strcmp(g->input[0]->name, "clips") && batch_dim(g->input[0], 5) &&
       g->n_output == 1 && !strcmp(g->output[0]->name, "logits") && batch_dim(g->output[0], 2),
       "%s: clips (batch, T, 3, H, W) -> logits (batch, K)", tag);
    ok(well_formed(g, why, sizeof why), "%s: topological, unique names %s", tag, why);
    int np, nb;
    const ps_model_param_t *P = ps_model_params(m, &np);
    const ps_model_buffer_t *B = ps_model_buffers(m, &nb);
    ok(tables_in(g, P, np, B, nb, why, sizeof why),
       "%s: every weight and BN statistic an initializer under its name, bit for bit %s", tag, why);
    int blocks = depth == 18 ? 8 : 16, k = shift ? blocks : 0;
    int sl = count_op(g, "Slice"), pad = count_op(g, "Pad"), cat = count_op(g, "Concat");
    ok(sl == 3 * k && pad == 2 * k && cat == k,
       "%s: %d shifted blocks as %d Slice, %d Pad, %d Concat", tag, k, sl, pad, cat);
    /* 'block' shifts the identity too: a shifted value feeds a downsample */
    int ds_on_shift = 0;
    for (size_t i = 0; i < g->n_node; i++)
        if (strstr(g->node[i]->name, "downsample.0") && strstr(g->node[i]->input[0], ".shift"))
            ds_on_shift++;
    ok(ds_on_shift == (shift && place == PS_MODEL_SHIFT_BLOCK ? 3 : 0),
       "%s: %d downsample convs read the shifted input", tag, ds_on_shift);
    onnx__model_proto__free_unpacked(mp, NULL);
    ps_model_destroy(&m);
}

static void check_retina(void)
{
    ps_retina_config_t c;
    ps_retina_config_default(&c);
    c.depth = 18;
    c.width = 8;
    c.fpn_channels = 16;
    c.num_classes = 3;
    ps_retina_t *m = NULL;
    if (!ok(!ps_retina_create(&m, &c, &ps_backend_cpu, &ctx, 1, 64, 64), "retina: model")) return;
    ps_retina_init(m, 9, 1);
    char path[512], why[256] = "";
    snprintf(path, sizeof path, "%s/retina.onnx", tmpdir);
    is_int(ps_retina_export_onnx(m, path), 0, "retina: exported");
    Onnx__ModelProto *mp = read_model(path);
    if (!ok(mp && mp->graph, "retina: read back")) return;
    const Onnx__GraphProto *g = mp->graph;
    ok(g->n_output == 2 && !strcmp(g->output[0]->name, "cls_logits") &&
       !strcmp(g->output[1]->name, "bbox_regression") && batch_dim(g->output[0], 3) &&
       g->output[0]->type->tensor_type->shape->dim[1]->dim_value == ps_retina_num_anchors(m),
       "retina: cls_logits (batch, A, K), bbox_regression (batch, A, 4)");
    ok(well_formed(g, why, sizeof why), "retina: topological, unique names %s", why);
    int np, nb;
    const ps_model_param_t *P = ps_retina_params(m, &np);
    const ps_model_buffer_t *B = ps_retina_buffers(m, &nb);
    ok(tables_in(g, P, np, B, nb, why, sizeof why) && g->n_initializer > (size_t)np,
       "retina: every tensor once under its torchvision name (heads shared by 5 levels) %s", why);
    is_int(count_op(g, "Resize"), 2, "retina: the two top-down merges resize");
    is_int(count_op(g, "Conv"), 20 + 3 + 3 + 2 + 5 * 10, "retina: backbone 20, FPN 8, heads 5 x 10 convs");
    onnx__model_proto__free_unpacked(mp, NULL);
    ps_retina_destroy(&m);
}

static void check_errors(void)
{
    ps_onnx_t *g = NULL;
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/keep.onnx", tmpdir);
    FILE *f = fopen(path, "w");
    fputs("an older file", f);
    fclose(f);
    is_int(ps_onnx_new(&g, "t"), 0, "builder");
    int64_t d[2] = {0, 4};
    const char *x = ps_onnx_input(g, "x", 2, d, NULL);
    ok(x && ps_onnx_relu(g, "r", x) && !ps_onnx_error(g), "input and a node");
    ps_log_level = -1;
    ok(!ps_onnx_relu(g, "r", x) && ps_onnx_error(g) == PS_EINVAL, "a duplicate name is an error");
    ok(!ps_onnx_relu(g, "s", x), "the error is sticky: later calls return NULL");
    is_int(ps_onnx_save(g, path), PS_EINVAL, "save refuses a graph with an error");
    ps_log_level = PS_LOG_WARN;
    f = fopen(path, "r");
    char buf[32] = "";
    ok(f && fgets(buf, sizeof buf, f) && !strcmp(buf, "an older file"), "the file at the path is untouched");
    if (f) fclose(f);
    ps_onnx_destroy(&g);

    ps_onnx_new(&g, "t");
    x = ps_onnx_input(g, "x", 2, d, NULL);
    ps_log_level = -1;
    ok(!ps_onnx_add(g, "a", x, "nowhere") && ps_onnx_error(g), "an input that is no value: error");
    ps_onnx_destroy(&g);
    ps_onnx_new(&g, "t");
    x = ps_onnx_relu(g, "r", ps_onnx_input(g, "x", 2, d, NULL));
    ps_onnx_output(g, x, 2, d, NULL);
    snprintf(tmp, sizeof tmp, "%s/missing/x.onnx", tmpdir);
    is_int(ps_onnx_save(g, tmp), PS_EIO, "save into a missing folder: PS_EIO");
    struct stat st;
    snprintf(tmp, sizeof tmp, "%s/missing", tmpdir);
    ok(stat(tmp, &st) != 0, "nothing created");
    ps_log_level = PS_LOG_WARN;
    is_int(ps_onnx_save(g, path), 0, "a good graph saves over the old file");
    Onnx__ModelProto *mp = read_model(path);
    ok(mp && mp->graph->n_node == 1 && !strcmp(mp->graph->node[0]->op_type, "Relu"),
       "and reads back");
    if (mp) onnx__model_proto__free_unpacked(mp, NULL);
    ps_onnx_destroy(&g);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/ps_onnx.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) tap_skip_all("no temporary folder");
    ps_log_level = PS_LOG_WARN;
    ps_engine_init(&ctx, 1);
    check_video("tsm_blockres", 1, PS_MODEL_SHIFT_BLOCKRES, 18);
    check_video("tsm_block", 1, PS_MODEL_SHIFT_BLOCK, 18);
    check_video("tsn_r50", 0, PS_MODEL_SHIFT_BLOCKRES, 50);
    check_retina();
    check_errors();
    ps_ctx_free(&ctx);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) diag("could not remove %s", tmpdir);
    return tap_done();
}
