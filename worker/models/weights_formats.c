/* The naming conventions a ResNet classifier's weights come in (ps_weights.h):
 * our own (torchvision's) and the official TSM repository's checkpoints. */
#include "worker/models/ps_weights.h"

#include "ps_error.h"

#include <ctype.h>
#include <string.h>

const ps_weights_format_t ps_weights_torchvision = {.name = "torchvision"};

/* module. (DataParallel) and base_model. (TSN's wrapper) off, TemporalShift's
 * .net. level out, new_fc (TSM's classifier with dropout) -> fc */
static const ps_weights_rule_t tsm_rules[] = {
    {PS_WEIGHTS_PREFIX, "module.", ""},
    {PS_WEIGHTS_PREFIX, "base_model.", ""},
    {PS_WEIGHTS_INFIX, ".net.", "."},
    {PS_WEIGHTS_PREFIX, "new_fc.", "fc."},
};

const ps_weights_format_t ps_weights_tsm = {
    .name = "tsm", .detect = "module.base_model.", .rules = tsm_rules, .nrules = 4};
const ps_weights_format_t ps_weights_tsm_bare = {
    .name = "tsm", .detect = "base_model.", .rules = tsm_rules, .nrules = 4};

const ps_weights_format_t *const ps_weights_resnet_formats[PS_WEIGHTS_RESNET_NFORMATS] = {
    &ps_weights_tsm, &ps_weights_tsm_bare, &ps_weights_torchvision};

static const ps_weights_rule_t tsm_backbone_rules[] = {
    {PS_WEIGHTS_DROP, "module.new_fc.", NULL},
    {PS_WEIGHTS_DROP, "module.base_model.fc.", NULL},
    {PS_WEIGHTS_PREFIX, "module.base_model.", "backbone.body."},
    {PS_WEIGHTS_INFIX, ".net.", "."},
};
static const ps_weights_rule_t tv_backbone_rules[] = {
    {PS_WEIGHTS_DROP, "fc.", NULL},
    {PS_WEIGHTS_PREFIX, "", "backbone.body."},
};
static const ps_weights_format_t tsm_backbone = {
    .name = "tsm backbone", .detect = "module.base_model.", .rules = tsm_backbone_rules,
    .nrules = 4, .covers = "backbone.body."};
static const ps_weights_format_t tv_backbone = {
    .name = "torchvision backbone", .rules = tv_backbone_rules, .nrules = 2,
    .covers = "backbone.body."};

const ps_weights_format_t *const ps_weights_det_backbone_formats[PS_WEIGHTS_DET_BACKBONE_NFORMATS] =
    {&tsm_backbone, &tv_backbone};

/* "layerN.M." at s: the length, else 0. */
static size_t block_prefix(const char *s)
{
    const char *p = s;
    if (strncmp(p, "layer", 5)) return 0;
    p += 5;
    if (!isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    if (*p++ != '.' || !isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    return *p == '.' ? (size_t)(p + 1 - s) : 0;
}

int ps_weights_tsm_place(const ps_st_file_t *f)
{
    int blockres = 0, block = 0;
    for (size_t k = 0; k < f->ntensors; k++) {
        const char *n = f->tensors[k].name;
        const char *l = strstr(n, "layer");
        size_t bl = l ? block_prefix(l) : 0;
        if (!bl) continue;
        /* blockres wraps conv1 (layerN.M.conv1.net.*), block the whole
         * block (layerN.M.net.*) */
        if (!strncmp(l + bl, "net.", 4)) block = 1;
        else if (!strncmp(l + bl, "conv1.net.", 10)) blockres = 1;
    }
    if (block && blockres) return PS_EMISMATCH;
    return block ? PS_MODEL_SHIFT_BLOCK : blockres ? PS_MODEL_SHIFT_BLOCKRES : -1;
}
