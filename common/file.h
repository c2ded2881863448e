/* Whole small files: configs, cluster and experiment files.
 *
 * A config is read in one piece, with a size limit so that a wrong path
 * (a log, a device) is refused instead of filling memory.
 *
 * No state: any thread. The read blocks (stdio), so call it at start-up or
 * from a tool, never from a loop callback that must stay responsive. */
#ifndef TANDEM_FILE_H
#define TANDEM_FILE_H

#include <stddef.h>

/* Reads the file at path, at most max bytes, into a new buffer with a NUL
 * after the last byte (*out, free it with free(); *len, if not NULL, is the
 * byte count). On error *out is NULL and err says what, naming the path:
 * TANDEM_ENOENT ("<path>: cannot open: No such file or directory"),
 * TANDEM_EIO (cannot open or read), TANDEM_ETOOBIG ("<path>: larger than
 * <max> bytes"), TANDEM_ENOMEM. */
int file_read_all(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen);
/* Returns 0 or the negative code above; err (errlen bytes, truncated to fit)
 * is written only on error. The buffer may hold NUL bytes before the end. */

#endif
