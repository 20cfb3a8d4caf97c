/* ps_config: flags, INI files, precedence, sections, value checking, error
 * messages naming the flag or file:line, --help, positional arguments. */
#include "ps_config.h"
#include "ps_error.h"
#include "tests/lib/tap.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static int port, workers, verbose, fp16;
static uint64_t pbytes;
static float lr;
static char *name, *mode;

static const ps_opt_t opts[] = {
    {"port", PS_OPT_INT, &port, "TCP port", NULL},
    {"workers", PS_OPT_INT, &workers, "number of workers", NULL},
    {"partition_bytes", PS_OPT_UINT64, &pbytes, "partition size", NULL},
    {"lr", PS_OPT_FLOAT, &lr, "learning rate", NULL},
    {"name", PS_OPT_STRING, &name, "job name", NULL},
    {"mode", PS_OPT_STRING, &mode, "ps or allreduce", NULL},
    {"verbose", PS_OPT_BOOL, &verbose, "chatty", NULL},
    {"fp16", PS_OPT_BOOL, &fp16, "half precision", NULL},
    {0},
};

static char dir[] = "/tmp/test_config.XXXXXX";

/* string options hold NULL or malloc'd text (the parser frees what it
 * replaces); the last values are freed here before the next defaults */
static void defaults(void)
{
    free(name);
    free(mode);
    port = 5555; workers = 2; verbose = 0; fp16 = 1; pbytes = 4 << 20; lr = 0.1f;
    name = strdup("default-job"); mode = NULL;
}

static const char *write_file(const char *base, const char *text)
{
    static char path[2][256];
    static int which;
    char *p = path[which ^= 1];
    snprintf(p, 256, "%s/%s", dir, base);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

/* parse a NULL-terminated list; argv copy kept for positional checks */
static char *av[64];
static int parse(int *npos, ...)
{
    va_list ap;
    int argc = 0;
    av[argc++] = "prog";
    va_start(ap, npos);
    for (char *a; (a = va_arg(ap, char *));) av[argc++] = a;
    va_end(ap);
    av[argc] = NULL;
    int dummy;
    return ps_config_parse(opts, "psd", "[options] FILE...", argc, av, npos ? npos : &dummy);
}
#define P(...) parse(NULL, __VA_ARGS__, (char *)NULL)

static void test_flags(void)
{
    defaults();
    is_int(P("--port", "7000", "--workers=16", "--lr", "0.025", "--name=tsm r50", "--verbose", "--no-fp16"), 0, "flags parse");
    ok(port == 7000 && workers == 16 && lr == 0.025f && !strcmp(name, "tsm r50") && verbose == 1 && fp16 == 0,
       "--x v and --x=v for int, float, string; --b and --no-b");
    is_int(P("--verbose=false", "--fp16=yes"), 0, "--b=false / --b=yes");
    ok(verbose == 0 && fp16 == 1, "bool values from =false / =yes");
    is_int(P("--fp16=off", "--verbose=1"), 0, "--b=off / --b=1");
    ok(fp16 == 0 && verbose == 1, "bool values from =off / =1");
    is_int(P("--partition-bytes", "4MiB"), 0, "dash spelling of partition_bytes with MiB");
    is_int(pbytes, 4u << 20, "4MiB = 4194304");
    P("--partition_bytes=16K");
    is_int(pbytes, 16384, "16K");
    P("--partition_bytes=2T");
    ok(pbytes == 2ull << 40, "2T");
    P("--partition_bytes=18446744073709551615");
    ok(pbytes == UINT64_MAX, "UINT64_MAX accepted");
    P("--port=-1", "--lr=-1e-5");
    ok(port == -1 && lr == -1e-5f, "negative int and float");
    P("--port", "2147483647");
    is_int(port, 2147483647, "INT_MAX accepted");
    P("--lr=1e-45");
    ok(lr > 0 && lr < 1e-44f, "subnormal float accepted");

    int npos = -1;
    defaults();
    is_int(parse(&npos, "a.bin", "--port", "1", "b.bin", "-", "--verbose", "c.bin", "--", "--port", "d", (char *)NULL), 0,
           "positional arguments around flags and after --");
    ok(npos == 6 && !strcmp(av[1], "a.bin") && !strcmp(av[2], "b.bin") && !strcmp(av[3], "-") && !strcmp(av[4], "c.bin") &&
       !strcmp(av[5], "--port") && !strcmp(av[6], "d"), "argv[1..6] = a.bin b.bin - c.bin --port d");
    is_int(port, 1, "--port after -- is positional, the earlier one counts");
    npos = -1;
    parse(&npos, (char *)NULL);
    is_int(npos, 0, "no arguments: 0 positional");
}

static void test_flag_errors(void)
{
    struct {
        const char *a, *b, *msg;
    } cases[] = {
        {"--prot", "5", "unknown flag '--prot'"},
        {"-p", "5", "unknown flag '-p'"},
        {"--port", NULL, "'--port' needs a value"},
        {"--port", "--verbose", "'--port' needs a value"},
        {"--port", "12abc", "'12abc' is not an integer"},
        {"--port", "", "'' is not an integer"},
        {"--port", "99999999999", "out of range for an int"},
        {"--port", "2147483648", "out of range for an int"},
        {"--workers=1.5", NULL, "--workers: '1.5' is not an integer"},
        {"--partition_bytes=-1", NULL, "must not be negative"},
        {"--partition_bytes=99999999999999999999", NULL, "out of range"},
        {"--partition_bytes=20000000T", NULL, "overflows 64 bits"},
        {"--partition_bytes=4MB", NULL, "is not a non-negative integer"},
        {"--lr", "1e99", "not a finite float"},
        {"--lr", "nan", "not a finite float"},
        {"--lr", "0.1x", "'0.1x' is not a number"},
        {"--verbose=maybe", NULL, "'maybe' is not a boolean"},
        {"--no-port", NULL, "'--port' is not a boolean flag"},
        {"--no-verbose=1", NULL, "takes no value"},
        {"--config", NULL, "'--config' needs a value"},
        {"--config=", NULL, "empty file name"},
        {"--config", "/nonexistent/x.ini", "/nonexistent/x.ini: cannot open config file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        defaults();
        int rc = cases[i].b ? P(cases[i].a, cases[i].b) : P(cases[i].a);
        const char *e = ps_config_last_error();
        if (!ok(rc == PS_EINVAL && strstr(e, cases[i].msg), "%s %s -> error naming it", cases[i].a, cases[i].b ? cases[i].b : ""))
            diag("rc %d, message: %s", rc, e);
    }
    defaults();
    P("--port", "99999999999");
    is_int(port, 5555, "a rejected value leaves the option as it was");
}

static void test_files(void)
{
    const char *f = write_file("a.ini",
                               "# cluster config\n"
                               "; another comment\n"
                               "port = 6000\n"
                               "  lr=0.5   # inline comment\n"
                               "name = \"job # 7 ; x \"  # quoted keeps # and spaces\n"
                               "\n"
                               "[psworker]\n"
                               "port = 1\n"
                               "unknown_to_psd = 3\n"
                               "[psd]\n"
                               "workers = 8\n"
                               "verbose = true\n"
                               "partition-bytes = 1M\n"
                               "[other]\n"
                               "whatever = x\n");
    defaults();
    is_int(P("--config", f), 0, "file with comments, sections, quotes");
    ok(port == 6000 && lr == 0.5f && workers == 8 && verbose == 1 && pbytes == 1 << 20, "global and [psd] keys applied");
    ok(!strcmp(name, "job # 7 ; x "), "quoted value kept literally (got '%s')", name);

    /* flags win over the file whatever their order on the line */
    defaults();
    is_int(P("--port=7", "--config", f, "--name", "cli"), 0, "flag before and after --config");
    ok(port == 7 && !strcmp(name, "cli") && workers == 8, "flags override the file, file fills the rest");
    defaults();
    char joined[300];
    snprintf(joined, sizeof joined, "--config=%s", f);
    is_int(P("--no-verbose", joined), 0, "--config=FILE");
    is_int(verbose, 0, "--no-verbose beats 'verbose = true' in the file");

    /* two files load in order, the later one wins */
    const char *g = write_file("b.ini", "port = 9000\r\nmode = allreduce\r\n");
    defaults();
    is_int(P("--config", f, "--config", g), 0, "two --config files (CRLF lines)");
    ok(port == 9000 && !strcmp(mode, "allreduce") && workers == 8, "later file wins, earlier file's other keys kept");

    /* direct file load for another program sees its own section */
    defaults();
    is_int(ps_config_load_file(opts + 0, "psworker", write_file("c.ini", "[psworker]\nport = 1\n[psd]\nport = 2\n")), 0,
           "load_file for psworker");
    is_int(port, 1, "[psworker] applies to psworker, [psd] skipped");

    /* a UTF-8 BOM is not part of the first key */
    defaults();
    is_int(ps_config_load_file(opts, "psd", write_file("bom.ini", "\xef\xbb\xbfport = 42\n")), 0, "BOM skipped");
    is_int(port, 42, "BOM file value");

    struct {
        const char *text, *msg;
    } bad[] = {
        {"port = 1\nlr2 = 0.1\n", "bad.ini:2: unknown key 'lr2'"},
        {"[psd]\n\n# x\nworkerz = 1\n", "bad.ini:4: unknown key 'workerz'"},
        {"port 5\n", "bad.ini:1: expected 'key = value'"},
        {"= 5\n", "bad.ini:1: missing key"},
        {"[psd\nport = 1\n", "bad.ini:1: malformed section header"},
        {"[]\n", "bad.ini:1: empty section name"},
        {"port = 5x\n", "bad.ini:1: '5x' is not an integer"},
        {"lr = \n", "bad.ini:1: '' is not a number"},
        {"verbose = 2\n", "bad.ini:1: '2' is not a boolean"},
        {"name = \"unterminated\n", "bad.ini:1: unterminated"},
        {"name = \"a\" b\n", "bad.ini:1: unterminated or trailing text"},
        {"partition_bytes = -4K\n", "bad.ini:1: '-4K' must not be negative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = write_file("bad.ini", bad[i].text);
        defaults();
        int rc = P("--config", p);
        const char *e = ps_config_last_error();
        if (!ok(rc == PS_EINVAL && strstr(e, bad[i].msg) && strstr(e, dir), "file error: %s", bad[i].msg))
            diag("rc %d, message: %s", rc, e);
    }
    /* a NUL byte inside a line */
    char path[256];
    snprintf(path, sizeof path, "%s/nul.ini", dir);
    FILE *fp = fopen(path, "wb");
    fwrite("port = 1\nlr = 0\0.5\n", 1, 20, fp);
    fclose(fp);
    is_int(P("--config", path), PS_EINVAL, "NUL byte in a line rejected");
    ok(strstr(ps_config_last_error(), "nul.ini:2"), "...naming line 2 (%s)", ps_config_last_error());
}

static void test_help(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/help.txt", dir);
    fflush(stdout);
    int saved = dup(1);
    FILE *cap = fopen(path, "w");
    dup2(fileno(cap), 1);
    defaults();
    int rc = P("--port", "1", "--help", "--bogus");
    int rc2 = P("-h");
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(cap);
    is_int(rc, 1, "--help returns 1 (before complaining about --bogus)");
    is_int(rc2, 1, "-h returns 1");
    char text[4096] = {0};
    cap = fopen(path, "r");
    size_t n = fread(text, 1, sizeof text - 1, cap);
    fclose(cap);
    ok(n > 0 && strstr(text, "Usage: psd [options] FILE...") && strstr(text, "--port N") && strstr(text, "TCP port") &&
       strstr(text, "(default: 5555)") && strstr(text, "--[no-]verbose") && strstr(text, "(default: \"default-job\")") &&
       strstr(text, "--config FILE"),
       "help lists flags, types, help text and defaults");
    defaults();
    is_int(P("--", "--help"), 0, "--help after -- is positional");
}

/* Defaults from the rows (ps_config_defaults) and ps_config_free: each
 * row's text parsed as a flag's value would be, strings strdup'd, a row
 * without a default left as the caller set it; a default that does not
 * parse is refused naming the option. */
static void test_row_defaults(void)
{
    int n = -1, b = 1, keep = 42;
    uint64_t u = 0;
    float f = 0;
    char *str = NULL, *none = NULL;
    const ps_opt_t rows[] = {
        {"n", PS_OPT_INT, &n, "int", "7"},
        {"u", PS_OPT_UINT64, &u, "size", "4M"},
        {"f", PS_OPT_FLOAT, &f, "float", "0.05"},
        {"s", PS_OPT_STRING, &str, "string", "img_%05d.jpg"},
        {"b", PS_OPT_BOOL, &b, "bool", "false"},
        {"keep", PS_OPT_INT, &keep, "no default", NULL},
        {"none", PS_OPT_STRING, &none, "no default", NULL},
        {0},
    };
    is_int(ps_config_defaults(rows), 0, "defaults from the rows parse");
    ok(n == 7 && u == (4u << 20) && f == 0.05f && b == 0 && keep == 42,
       "... int 7, uint64 4M = 4194304, float 0.05f, bool false; a row without one keeps 42");
    ok(str && !strcmp(str, "img_%05d.jpg") && !none, "... string strdup'd, NULL where none");
    char *first = str;
    is_int(ps_config_defaults(rows), 0, "defaults set twice");
    ok(str && str != first && !strcmp(str, "img_%05d.jpg"), "... the string replaced, not leaked");
    ps_config_free(rows);
    ok(!str && !none && n == 7, "ps_config_free frees the strings and sets them NULL");
    const ps_opt_t badrow[] = {{"steps", PS_OPT_INT, &n, "int", "ten"}, {0}};
    is_int(ps_config_defaults(badrow), PS_EINVAL, "a default that does not parse is refused");
    ok(strstr(ps_config_last_error(), "--steps") != NULL, "... naming the option: %s",
       ps_config_last_error());
}

int main(void)
{
    if (!mkdtemp(dir)) tap_skip_all("cannot create a temp dir");
    test_flags();
    test_flag_errors();
    test_files();
    test_help();
    test_row_defaults();
    defaults(); /* frees the last parse's strings (the sanitizer build checks leaks) */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) diag("could not remove %s", dir);
    return tap_done();
}
