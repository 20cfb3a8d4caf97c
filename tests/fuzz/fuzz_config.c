/* Fuzz target: the configuration parser.  Input byte 0 chooses the path:
 * even: the rest is an INI file (written to a temp file, loaded with
 * ps_config_load_file for program "psd"); odd: the rest is an argument
 * vector split at NUL bytes, parsed with ps_config_parse.  Checks: the
 * result is 0, 1 (help) or PS_EINVAL (or PS_EIO for a --config file that
 * does not exist), and every value that was set is in range for its type.
 * Errors are printed to stderr: run with -close_fd_mask=2 to quieten. */
#include "tests/fuzz/fuzz.h"

#include "ps_config.h"
#include "ps_error.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size);

static char config_fz_path[64];

int PS_FUZZ_ENTRY(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192) return 0;
    int port = 7000, verbose = 0;
    float lr = 0.1f;
    uint64_t bytes = 4u << 20;
    char *name = strdup("default"); /* the parser frees a replaced value */
    if (!name) abort();
    const ps_opt_t opts[] = {
        {"port", PS_OPT_INT, &port, "port", NULL},
        {"lr", PS_OPT_FLOAT, &lr, "learning rate", NULL},
        {"partition-bytes", PS_OPT_UINT64, &bytes, "bytes", NULL},
        {"name", PS_OPT_STRING, &name, "a name", NULL},
        {"verbose", PS_OPT_BOOL, &verbose, "more output", NULL},
        {0},
    };
    int rc;
    if (!(data[0] & 1)) {
        if (!config_fz_path[0]) {
            snprintf(config_fz_path, sizeof config_fz_path, "/tmp/ps_fuzz_config_%d.ini", (int)getpid());
        }
        FILE *fp = fopen(config_fz_path, "wb");
        if (!fp) abort();
        fwrite(data + 1, 1, size - 1, fp);
        fclose(fp);
        rc = ps_config_load_file(opts, "psd", config_fz_path);
        unlink(config_fz_path);
        FUZZ_CHECK(rc == 0 || rc == PS_EINVAL || rc == PS_EIO, "load_file returned %d", rc);
    } else {
        char *copy = malloc(size), *argv[66];
        if (!copy) abort();
        memcpy(copy, data + 1, size - 1);
        copy[size - 1] = 0;
        int argc = 0;
        argv[argc++] = (char *)"psd";
        for (char *p = copy; p < copy + size - 1 && argc < 64; p += strlen(p) + 1) {
            /* a --config file named by the fuzzer could be anything on disk */
            if (!strncmp(p, "--config", 8)) continue;
            argv[argc++] = p;
        }
        argv[argc] = NULL;
        int npos = 0;
        rc = ps_config_parse(opts, "psd", "[options]", argc, argv, &npos);
        FUZZ_CHECK(rc == 0 || rc == 1 || rc == PS_EINVAL, "parse returned %d", rc);
        FUZZ_CHECK(npos >= 0 && npos < argc, "npos %d of argc %d", npos, argc);
        free(copy);
    }
    FUZZ_CHECK(isfinite(lr), "lr set to a non-finite value");
    FUZZ_CHECK(verbose == 0 || verbose == 1, "bool set to %d", verbose);
    FUZZ_CHECK(name != NULL, "string set to NULL");
    free(name); /* the default or the parser's copy: ours either way */
    return 0;
}
