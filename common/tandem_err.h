/* Error codes shared by every Tandem module.
 *
 * Functions return int: 0 on success, a negative TANDEM_E* code otherwise.
 * One X-macro table drives both the enum and tandem_strerror(), after libuv's
 * UV_ERRNO_MAP. Wrap NNG and libuv errors into these; never return bare -1. */
#ifndef TANDEM_ERR_H
#define TANDEM_ERR_H

#define TANDEM_ERRNO_MAP(X)                                                                        \
    X(NOMEM, "out of memory")                                                                      \
    X(INVAL, "invalid argument")                                                                   \
    X(RANGE, "value out of range")                                                                 \
    X(PROTO, "malformed message")                                                                  \
    X(VERSION, "unsupported protocol version")                                                     \
    X(TOOBIG, "size limit exceeded")                                                               \
    X(TRUNCATED, "truncated input")                                                                \
    X(CHECKSUM, "checksum mismatch")                                                               \
    X(HASH, "block hash mismatch")                                                                 \
    X(NOENT, "not found")                                                                          \
    X(EXIST, "already exists")                                                                     \
    X(NOSPACE, "no free KV blocks")                                                                \
    X(BUSY, "busy")                                                                                \
    X(CANCELLED, "cancelled")                                                                      \
    X(TIMEOUT, "timed out")                                                                        \
    X(CLOSED, "connection closed")                                                                 \
    X(IO, "input/output error")                                                                    \
    X(FORMAT, "bad file format")                                                                   \
    X(CONFIG, "bad configuration")                                                                 \
    X(UNSUPPORTED, "not supported")                                                                \
    X(NNG, "transport error")                                                                      \
    X(UV, "event loop error")                                                                      \
    X(INTERNAL, "internal error")                                                                  \
    X(AUTH, "authentication failed")

enum tandem_err_index {
    TANDEM_ERR_INDEX_ZERO = 0,
#define TANDEM_X(name, msg) TANDEM_ERR_INDEX_##name,
    TANDEM_ERRNO_MAP(TANDEM_X)
#undef TANDEM_X
        TANDEM_ERR_INDEX_COUNT
};

enum tandem_err {
    TANDEM_OK = 0,
#define TANDEM_X(name, msg) TANDEM_E##name = -TANDEM_ERR_INDEX_##name,
    TANDEM_ERRNO_MAP(TANDEM_X)
#undef TANDEM_X
};

/* Returns a static, human-readable description of err (0 or a TANDEM_E*
 * code). Unknown codes give "unknown error". Thread-safe. */
const char *tandem_strerror(int err);

/* Returns the short symbolic name ("ENOMEM", ...) of err, for logs and
 * metrics labels. Thread-safe. */
const char *tandem_errname(int err);

#endif
