/* safetensors read/write (https://github.com/huggingface/safetensors format):
 * 8-byte little-endian header length, a JSON header mapping tensor names to
 * {dtype, shape, data_offsets} plus an optional "__metadata__" string map,
 * then the data.  Used for model weights (torchvision names) and for psd's
 * checkpoints.  The reader checks everything a hostile file could get wrong:
 * header length vs file size, JSON validity, offsets inside the data, no
 * overlaps or gaps, byte size == product(shape) * dtype size. */
#ifndef PS_SAFETENSORS_H
#define PS_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PS_ST_F32, PS_ST_F16, PS_ST_BF16, PS_ST_F64, PS_ST_I64, PS_ST_I32,
    PS_ST_I16, PS_ST_I8, PS_ST_U8, PS_ST_BOOL
} ps_st_dtype_t;

#define PS_ST_MAX_DIMS 8
#define PS_ST_MAX_HEADER (100u << 20) /* same cap as the reference implementation */

typedef struct ps_st_tensor {
    char *name;
    ps_st_dtype_t dtype;
    int ndim;
    int64_t shape[PS_ST_MAX_DIMS];
    size_t offset;   /* into the data section */
    size_t nbytes;
} ps_st_tensor_t;

typedef struct ps_st_file {
    ps_st_tensor_t *tensors;  /* in file order of data offsets */
    size_t ntensors;
    char **meta_keys, **meta_vals;
    size_t nmeta;
    uint8_t *map;             /* whole file (mmap) */
    size_t map_len;
    const uint8_t *data;      /* start of the data section */
    size_t data_len;
} ps_st_file_t;

size_t ps_st_dtype_size(ps_st_dtype_t dt);
const char *ps_st_dtype_name(ps_st_dtype_t dt); /* "F32", ... */

/* Open and validate.  Returns 0, PS_EIO (cannot open/read; err has errno
 * text), PS_ECORRUPT (bad format; err says what).  On error *f is zeroed. */
int ps_st_open(ps_st_file_t *f, const char *path, char *err, size_t errlen);
/* Same checks on a buffer already in memory (the buffer must outlive f). */
int ps_st_parse(ps_st_file_t *f, const void *buf, size_t len, char *err, size_t errlen);
void ps_st_close(ps_st_file_t *f);
const ps_st_tensor_t *ps_st_find(const ps_st_file_t *f, const char *name);
/* Not necessarily aligned (another writer's header length need not be a
 * multiple of 8; tensors of mixed dtypes pack back to back): memcpy from it. */
const void *ps_st_tensor_data(const ps_st_file_t *f, const ps_st_tensor_t *t);
const char *ps_st_meta(const ps_st_file_t *f, const char *key); /* NULL if absent */
/* Copy tensor `name` into dst[0..numel) as fp32 (from F32/F16/BF16/F64);
 * PS_ENOTFOUND or PS_EMISMATCH (element count differs) with a message. */
int ps_st_read_f32(const ps_st_file_t *f, const char *name, float *dst, size_t numel,
                   char *err, size_t errlen);

typedef struct ps_st_writer ps_st_writer_t;
ps_st_writer_t *ps_st_writer_new(void);
/* Add a tensor; data is NOT copied and must stay valid until save. */
/* Returns 0, PS_EINVAL (duplicate or reserved name, bad dtype/shape, NULL
 * data with a non-zero size) or PS_ENOMEM. */
int ps_st_writer_add(ps_st_writer_t *w, const char *name, ps_st_dtype_t dt, int ndim,
                     const int64_t *shape, const void *data);
/* Copied; setting a key again replaces its value. */
int ps_st_writer_meta(ps_st_writer_t *w, const char *key, const char *value);
/* Write atomically: path.tmp.PID (a stale one is removed first), fsync,
 * rename over path, fsync the directory.  Header as the reference writer:
 * compact JSON, __metadata__ first, tensors in the order added, padded with
 * spaces to a multiple of 8.  Returns 0, PS_EINVAL or PS_EIO (err says
 * which file and why); a failure before the rename leaves path untouched
 * and no tmp behind. */
int ps_st_writer_save(ps_st_writer_t *w, const char *path, char *err, size_t errlen);
void ps_st_writer_destroy(ps_st_writer_t **w);
#endif
