/* Whole small files (file.h). */
#include "file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

int file_read_all(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? TANDEM_ENOENT : TANDEM_EIO;
    }
    char *buf = malloc(max + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return TANDEM_ENOMEM;
    }
    size_t n = fread(buf, 1, max + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > max) {
        free(buf);
        if (bad) {
            snprintf(err, errlen, "%s: read error", path);
        } else {
            snprintf(err, errlen, "%s: larger than %zu bytes", path, max);
        }
        return bad ? TANDEM_EIO : TANDEM_ETOOBIG;
    }
    buf[n] = '\0';
    *out = buf;
    if (len != NULL) {
        *len = n;
    }
    return 0;
}
