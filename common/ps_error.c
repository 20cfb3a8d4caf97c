#include "ps_error.h"

const char *ps_strerror(int err)
{
    switch (err) {
    case PS_OK: return "success";
#define PS_ERR_STR_(name, code, text) case code: return text;
    PS_ERRNO_MAP(PS_ERR_STR_)
#undef PS_ERR_STR_
    }
    return "unknown error";
}

const char *ps_errname(int err)
{
    switch (err) {
    case PS_OK: return "PS_OK";
#define PS_ERR_NAME_(name, code, text) case code: return "PS_E" #name;
    PS_ERRNO_MAP(PS_ERR_NAME_)
#undef PS_ERR_NAME_
    }
    return "PS_E?";
}
