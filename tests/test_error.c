#include "ps_error.h"
#include "tests/lib/tap.h"
#include <string.h>

int main(void)
{
    ok(strcmp(ps_strerror(PS_OK), "success") == 0, "PS_OK text");
    ok(strcmp(ps_errname(PS_EINVAL), "PS_EINVAL") == 0, "PS_EINVAL name");
    ok(strcmp(ps_strerror(-9999), "unknown error") == 0, "unknown code");
    /* Every code is negative, distinct and has text. */
    int codes[] = {
#define C_(n, c, t) c,
        PS_ERRNO_MAP(C_)
#undef C_
    };
    int n = sizeof codes / sizeof codes[0], distinct = 1;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) distinct &= codes[i] != codes[j];
    ok(distinct, "%d error codes are distinct", n);
    for (int i = 0; i < n; i++) ok(codes[i] < 0 && strcmp(ps_strerror(codes[i]), "unknown error"), "code %d has text", codes[i]);
    return tap_done();
}
