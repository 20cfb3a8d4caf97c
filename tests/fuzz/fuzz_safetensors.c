/* Fuzz target: the safetensors reader (ps_st_parse on a buffer) and, for a
 * file it accepts, every accessor: each tensor is found by name, lies inside
 * the data section, has nbytes == product(shape) * dtype size, and float
 * tensors convert with ps_st_read_f32. */
#include "tests/fuzz/fuzz.h"

#include "ps_error.h"
#include "ps_log.h"
#include "ps_safetensors.h"

#include <string.h>

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size);

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    ps_log_level = -1;
    uint8_t *buf = malloc(size ? size : 1); /* exact size for ASan */
    if (!buf) abort();
    memcpy(buf, data, size);
    ps_st_file_t f;
    char err[512];
    int rc = ps_st_parse(&f, buf, size, err, sizeof err);
    FUZZ_CHECK(rc == 0 || rc == PS_ECORRUPT || rc == PS_ENOMEM, "ps_st_parse returned %d", rc);
    if (rc == 0) {
        for (size_t i = 0; i < f.ntensors; i++) {
            const ps_st_tensor_t *t = &f.tensors[i];
            FUZZ_CHECK(t->name && ps_st_find(&f, t->name), "tensor %zu not found by name", i);
            FUZZ_CHECK(t->offset <= f.data_len && t->nbytes <= f.data_len - t->offset,
                       "tensor %s outside the data section", t->name);
            FUZZ_CHECK(t->ndim >= 0 && t->ndim <= PS_ST_MAX_DIMS, "ndim %d", t->ndim);
            size_t numel = 1;
            for (int d = 0; d < t->ndim; d++) {
                FUZZ_CHECK(t->shape[d] >= 0, "negative dim");
                numel *= (size_t)t->shape[d];
            }
            FUZZ_CHECK(numel * ps_st_dtype_size(t->dtype) == t->nbytes, "tensor %s: nbytes %zu vs shape",
                       t->name, t->nbytes);
            if ((t->dtype == PS_ST_F32 || t->dtype == PS_ST_F16 || t->dtype == PS_ST_BF16 ||
                 t->dtype == PS_ST_F64) && numel <= (1u << 16)) {
                float *dst = malloc(numel * 4 + 4);
                if (!dst) abort();
                FUZZ_CHECK(ps_st_read_f32(&f, t->name, dst, numel, err, sizeof err) == 0, "read_f32 %s: %s",
                           t->name, err);
                if (numel) /* a wrong count is refused */
                    FUZZ_CHECK(ps_st_read_f32(&f, t->name, dst, numel - 1, err, sizeof err) == PS_EMISMATCH,
                               "read_f32 with a short count");
                free(dst);
            }
        }
        for (size_t i = 0; i < f.nmeta; i++)
            FUZZ_CHECK(ps_st_meta(&f, f.meta_keys[i]) != NULL, "meta key %zu not found", i);
        ps_st_close(&f);
    }
    free(buf);
    return 0;
}
