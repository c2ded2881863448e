#include "tandem_err.h"

const char *tandem_strerror(int err)
{
    switch (err) {
    case TANDEM_OK:
        return "success";
#define TANDEM_X(name, msg)                                                                        \
    case TANDEM_E##name:                                                                           \
        return msg;
        TANDEM_ERRNO_MAP(TANDEM_X)
#undef TANDEM_X
    default:
        return "unknown error";
    }
}

const char *tandem_errname(int err)
{
    switch (err) {
    case TANDEM_OK:
        return "OK";
#define TANDEM_X(name, msg)                                                                        \
    case TANDEM_E##name:                                                                           \
        return "E" #name;
        TANDEM_ERRNO_MAP(TANDEM_X)
#undef TANDEM_X
    default:
        return "EUNKNOWN";
    }
}
