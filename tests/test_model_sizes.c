/* bench/model_sizes.c against torchvision (tests/golden/model_sizes.txt,
 * from tests/golden/gen_model_sizes.py): every tensor's name and size, in
 * model order, for each model psbench --model accepts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "bench/model_sizes.h"
#include "ps_error.h"

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
    ok(psbench_model_build(&m, "vgg16") == PS_EINVAL, "an unknown model is refused");
    return tap_done();
}
