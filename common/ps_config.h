/* Configuration: flags and an INI-style file, flags winning.
 *
 * File format: "key = value" lines, '#' or ';' comments, optional
 * "[section]" headers.  Keys before any section apply to every program;
 * keys in "[psd]" / "[psworker]" / ... apply only to that program; other
 * sections are ignored.  Keys are the long flag names without "--".
 * Flags: --name value, --name=value; booleans take --name, --no-name or
 * --name=true|false.  --config FILE loads a file first; --help prints usage. */
#ifndef PS_CONFIG_H
#define PS_CONFIG_H
#include <stddef.h>
#include <stdint.h>

typedef enum { PS_OPT_INT, PS_OPT_UINT64, PS_OPT_FLOAT, PS_OPT_STRING, PS_OPT_BOOL } ps_opt_type_t;

typedef struct ps_opt {
    const char *name;     /* long flag name, e.g. "port" */
    ps_opt_type_t type;
    void *dst;            /* int*, uint64_t*, float*, char** (NULL or malloc'd), int* */
    const char *help;     /* one line; the default is printed from *dst */
    const char *def;      /* the default as text, set by ps_config_defaults
                             (NULL: *dst keeps what the caller put there) */
} ps_opt_t;

/* Parse argv (and --config FILE) into the option table (terminated by a
 * zeroed entry).  Defaults are whatever *dst holds before the call.
 * Returns 0; 1 when --help was printed (caller exits 0); PS_EINVAL on a bad
 * flag, value or file line, after printing a clear message to stderr.
 * Positional arguments are left in argv[1..*npos] (argv is reordered). */
int ps_config_parse(const ps_opt_t *opts, const char *prog, const char *usage, int argc,
                    char **argv, int *npos);
/* Set every option that has a `def` to it, parsed as a flag's value would
 * be (strings are strdup'd).  So an option's name, help and default sit in
 * one row, and a table of rows is the only list of a program's options.
 * Returns 0, or PS_EINVAL for a default that does not parse (a programming
 * error, printed like a bad flag). */
int ps_config_defaults(const ps_opt_t *opts);
/* Free every string option's value and set it NULL (the table's other
 * values are left as they are). */
void ps_config_free(const ps_opt_t *opts);
/* Load just a file (used by ps_config_parse). */
int ps_config_load_file(const ps_opt_t *opts, const char *prog, const char *path);
/* Print --help text (to stdout). */
void ps_config_usage(const ps_opt_t *opts, const char *prog, const char *usage);
/* The last error message printed by this thread (for tests), "" if none. */
const char *ps_config_last_error(void);

/* Details of the above:
 * - Names match with '-' and '_' treated alike (--partition-bytes is key
 *   partition_bytes).  -h is --help.  "--" ends the flags; "-" alone is a
 *   positional argument.  A flag's separate value may not start with "--"
 *   (write --name=--value).
 * - Values: INT is a decimal in int range; UINT64 a non-negative decimal
 *   with an optional binary suffix K, M, G, T (optionally "KiB" etc.); FLOAT
 *   a finite number; BOOL one of true/false, yes/no, on/off, 1/0.  Nothing
 *   may follow the number.
 * - File: a value may be double-quoted to keep '#', ';' or edge spaces;
 *   otherwise '#' or ';' after whitespace starts a comment.  Unknown keys in
 *   the global part or in [prog] are errors; other sections are skipped
 *   unchecked.  Several --config flags load in order.
 * - Strings: *dst must be NULL or malloc'd (strdup the default, never a
 *   literal): setting an option frees the old value and stores a strdup'd
 *   copy, which belongs to the caller.  Nothing is leaked when a flag
 *   overrides a default or a file value. */
#endif
