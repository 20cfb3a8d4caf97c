/* worker/models/model_sizes.c against torchvision (tests/golden/model_sizes.txt,
 * from tests/golden/gen_model_sizes.py): every tensor's name and size, in
 * model order, for each model psbench --model accepts; then the per-layer
 * MACs behind psbench's compute schedule against closed forms and the
 * published totals, and the schedule itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/tap.h"
#include "worker/models/model_sizes.h"
#include "ps_error.h"

static double rel(double a, double b)
{
    return fabs(a - b) / fabs(b);
}

static double tensor_flops(const psbench_model_t *m, const char *name)
{
    for (unsigned i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return m->flops[i];
    return -1;
}

/* Conv and fc MACs, i.e. without BN's per-element ops. */
static double conv_fc_flops(const psbench_model_t *m)
{
    double s = 0;
    for (unsigned i = 0; i < m->ntensors; i++)
        if (!strstr(m->tensors[i].name, "bn") && !strstr(m->tensors[i].name, "downsample.1"))
            s += m->flops[i];
    return s;
}

static void check_flops(void)
{
    psbench_model_t m;
    ps_partition_table_t t;
    if (psbench_model_build(&m, "tsm-r50") < 0) {
        ok(0, "tsm-r50 built for the flops checks");
        return;
    }
    /* closed forms at 224x224: conv1 64x3x7x7 on 112^2 outputs; layer2.0's
     * 1x1 conv1 still sees 56^2 and its 3x3 conv2 (stride 2) gives 28^2 */
    ok(tensor_flops(&m, "conv1.weight") == 64.0 * 3 * 49 * 112 * 112, "conv1: 64*3*7*7*112^2 MACs");
    ok(tensor_flops(&m, "layer2.0.conv1.weight") == 128.0 * 256 * 56 * 56,
       "layer2.0.conv1: 128*256 on 56^2");
    ok(tensor_flops(&m, "layer2.0.conv2.weight") == 128.0 * 128 * 9 * 28 * 28,
       "layer2.0.conv2: 128*128*9 on 28^2");
    ok(tensor_flops(&m, "layer4.2.conv3.weight") == 2048.0 * 512 * 7 * 7, "layer4.2.conv3 on 7^2");
    ok(tensor_flops(&m, "fc.weight") == 400.0 * 2048, "fc: 2048 x 400 once");
    /* torchvision's model table: ResNet-50 4.09 GFLOPS (MACs), ResNet-18
     * 1.81, with a 1000-class fc (ours has 400: 1.2 M / 0.3 M fewer) */
    double c50 = conv_fc_flops(&m) + 600.0 * 2048;
    ok(rel(c50, 4.09e9) < 0.005, "ResNet-50 conv+fc MACs %.4g vs torchvision 4.09e9", c50);
    ok(rel(m.total_flops, c50 - 600.0 * 2048) < 0.01 && m.total_flops > c50 - 600.0 * 2048,
       "BN adds under 1%% (%.4g total)", m.total_flops);

    /* partitions: flops split by elements, the sum kept; 16 KiB partitions
     * cut conv1 (9408 floats) into 4096 + 4096 + 1216 */
    size_t pbs[2] = {(size_t)4 << 20, 16 << 10};
    for (int k = 0; k < 2; k++) {
        if (ps_partition_table_build(&t, m.tensors, m.ntensors, pbs[k], 4) < 0) {
            ok(0, "partition table %zu", pbs[k]);
            continue;
        }
        double *f = calloc(t.nparts, sizeof *f), *fwd = calloc(t.nparts, sizeof *fwd), s = 0;
        int okp = psbench_model_part_flops(&m, &t, f) == 0, neg = 0;
        for (uint32_t p = 0; p < t.nparts; p++) {
            s += f[p];
            neg |= !(f[p] >= 0);
        }
        ok(okp && !neg && rel(s, m.total_flops) < 1e-12,
           "%zu-byte partitions (%u): flops sum to the model's", pbs[k], t.nparts);
        if (k == 1)
            ok(t.parts[0].numel == 4096 && t.parts[1].numel == 4096 &&
                   rel(f[0], tensor_flops(&m, "conv1.weight") * 4096 / 9408) < 1e-12 &&
                   f[1] == f[0],
               "conv1 cut into 4096-float pieces: its MACs split by elements");
        /* the schedule: forward shares sum to a third of the step, in
         * proportion to the flops; by_params splits by size */
        double sf = 0, sp = 0;
        double worst = 0;
        okp = psbench_model_schedule("tsm-r50", 0, 3.0, &t, fwd) == 0;
        for (uint32_t p = 0; p < t.nparts; p++) {
            sf += fwd[p];
            double e = fabs(fwd[p] - f[p] / m.total_flops);
            if (!(e <= worst)) worst = e;
        }
        ok(okp && rel(sf, 1.0) < 1e-12 && worst < 1e-12,
           "schedule (flops): forward = compute / 3, shares ~ MACs (worst %.2g)", worst);
        okp = psbench_model_schedule("tsm-r50", 1, 3.0, &t, fwd) == 0;
        for (uint32_t p = 0; p < t.nparts; p++) sp += fwd[p];
        ok(okp && rel(sp, 1.0) < 1e-12 &&
               rel(fwd[0], (double)t.parts[0].numel / (double)t.total_numel) < 1e-12,
           "schedule (params): forward = compute / 3, shares ~ sizes");
        if (k == 0) {
            /* layer4 + fc hold 65% of the weights and 20% of the compute:
             * what makes the schedule matter */
            int l4 = ps_partition_tensor_index(&t, "layer4.0.conv1.weight");
            uint32_t q0 = l4 < 0 ? 0 : ps_partition_at(&t, t.tensor_offset[l4]);
            double fl = 0, pl = 0;
            psbench_model_schedule("tsm-r50", 0, 3.0, &t, fwd);
            for (uint32_t q = q0; q < t.nparts; q++) {
                fl += fwd[q];
                pl += (double)t.parts[q].numel / (double)t.total_numel;
            }
            ok(l4 >= 0 && fl > 0.15 && fl < 0.25 && pl > 0.6,
               "partitions %u.. (layer4, fc): %.3f of the forward by MACs, %.3f by size", q0, fl, pl);
        }
        free(f);
        free(fwd);
        ps_partition_table_free(&t);
    }
    psbench_model_free(&m);
    if (psbench_model_build(&m, "tsm-r18") == 0) {
        double c18 = conv_fc_flops(&m) + 600.0 * 512;
        ok(rel(c18, 1.81e9) < 0.005, "ResNet-18 conv+fc MACs %.4g vs torchvision 1.81e9", c18);
        psbench_model_free(&m);
    }
}

int main(void)
{
    const char *top = getenv("top_srcdir");
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/tests/golden/model_sizes.txt", top ? top : ".");
    FILE *f = fopen(path, "r");
    if (!f) {
        tap_skip_all("cannot open %s", path);
        return 77;
    }
    psbench_model_t m = {0};
    unsigned idx = 0, bad = 0, nmodels = 0, lineno = 0;
    char cur[256] = "";
    int have = 0;
    while (fgets(line, sizeof line, f)) {
        char name[256];
        unsigned long long v, n;
        lineno++;
        if (sscanf(line, "model %63s %llu %llu", name, &n, &v) == 3) {
            if (have) {
                is_int(idx, m.ntensors, "%s: every tensor listed", cur);
                ok(bad == 0, "%s: names and sizes match torchvision (%u mismatches)", cur, bad);
                psbench_model_free(&m);
            }
            snprintf(cur, sizeof cur, "%s", name);
            have = psbench_model_build(&m, name) == 0;
            ok(have, "%s: built", name);
            if (!have) continue;
            nmodels++;
            is_int(m.ntensors, (long long)n, "%s: tensor count", name);
            ok(m.total_numel == (size_t)v, "%s: %zu parameters (torchvision %llu)", name,
               m.total_numel, v);
            idx = bad = 0;
        } else if (have && sscanf(line, "%255s %llu", name, &v) == 2) {
            if (idx >= m.ntensors || strcmp(m.tensors[idx].name, name) ||
                m.tensors[idx].numel != (size_t)v) {
                if (bad++ < 5)
                    diag("%s line %u: torchvision %s %llu, ours %s %zu", path, lineno, name, v,
                         idx < m.ntensors ? m.tensors[idx].name : "(none)",
                         idx < m.ntensors ? m.tensors[idx].numel : (size_t)0);
            }
            idx++;
        }
    }
    fclose(f);
    if (have) {
        is_int(idx, m.ntensors, "%s: every tensor listed", cur);
        ok(bad == 0, "%s: names and sizes match torchvision (%u mismatches)", cur, bad);
        psbench_model_free(&m);
    }
    is_int(nmodels, 4, "four models in the golden file");
    check_flops();
    ok(psbench_model_build(&m, "vgg16") == PS_EINVAL, "an unknown model is refused");
    return tap_done();
}
