/* The router's API key (docs/api.md, "API key"): with a key set, every
 * request whose path starts with /v1 must carry `Authorization: Bearer KEY`,
 * else it gets 401 in the OpenAI error shape; /health and /metrics stay
 * open, as vLLM's --api-key leaves them.
 *
 * Where the key comes from, first found wins:
 *   --api-key KEY        (vLLM's flag; the key is on the command line, so the
 *                         router wipes it from argv once read)
 *   --api-key-file FILE  (the file's bytes without one trailing newline;
 *                         what `tandem up` passes for router.api_key_file)
 *   $TANDEM_API_KEY      (vLLM reads VLLM_API_KEY the same way)
 * A key is 1 to RT_APIKEY_MAX bytes of visible ASCII (0x21-0x7e: what a
 * header value carries without quoting).
 *
 * The router keeps only the key's SHA-256: a presented token is hashed and
 * the two digests are compared with auth_equal, so the time taken depends
 * on the presented token's length only, never on how many bytes of it are
 * right nor on the key's length (vLLM compares SHA-256 digests with
 * secrets.compare_digest the same way). The key is never logged, exported
 * as a metric or shown in /v1/cluster; errors name its source, never it.
 *
 * Threading: pure functions of their arguments, any thread. */
#ifndef TANDEM_RT_APIKEY_H
#define TANDEM_RT_APIKEY_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"

#define RT_APIKEY_ENV       "TANDEM_API_KEY"
#define RT_APIKEY_FLAG      "api-key"
#define RT_APIKEY_FILE_FLAG "api-key-file"
#define RT_APIKEY_MAX       512 /* bytes; a longer key is refused */

struct rt_apikey {
    uint8_t digest[AUTH_SHA256_BYTES]; /* SHA-256 of the key */
    int set;                           /* 0: no key, every request passes */
};

/* The outcome of rt_apikey_check. */
enum rt_apikey_verdict {
    RT_APIKEY_OK = 0,  /* no key set, or the right key */
    RT_APIKEY_MISSING, /* no Authorization header */
    RT_APIKEY_SCHEME,  /* a header, but not "Bearer <token>" */
    RT_APIKEY_WRONG,   /* a bearer token that is not the key */
};

/* Finds the key: key_flag (--api-key) if not NULL, else key_file
 * (--api-key-file) if not NULL, else $TANDEM_API_KEY if set and non-empty.
 * On success copies it, NUL-terminated, into out (RT_APIKEY_MAX + 1 bytes)
 * and a description of where it came from into source ("--api-key",
 * "--api-key-file /path", "$TANDEM_API_KEY"; never the key), and returns 1;
 * returns 0 when no key is configured (out is ""). Returns TANDEM_EINVAL
 * with a message in err naming the source (never the key) for an empty,
 * overlong or unreadable key or one with a byte outside 0x21-0x7e, or
 * TANDEM_ENOMEM. The caller wipes out (auth_wipe) once done with it.
 * Blocks on the file read: call at start-up. */
int rt_apikey_find(const char *key_flag, const char *key_file, char *out, char *source,
                   size_t srclen, char *err, size_t errlen);

/* Keeps the SHA-256 of key[0..len) in k (k->set = 1). */
void rt_apikey_init(struct rt_apikey *k, const char *key, size_t len);

/* 1 when token[0..len) is the key of k, else 0; constant-time as said
 * above. 0 when k has no key. */
int rt_apikey_equal(const struct rt_apikey *k, const char *token, size_t len);

/* Checks an Authorization header value (NULL: no header) against k, as vLLM
 * does: the scheme "Bearer" in any case, one or more spaces, then the token
 * to the end of the value. Always RT_APIKEY_OK when k has no key. */
enum rt_apikey_verdict rt_apikey_check(const struct rt_apikey *k, const char *authorization);

/* 1 when a request for path needs the key (it starts with "/v1", vLLM's
 * rule), 0 for /health, /metrics and the rest. */
int rt_apikey_guarded(const char *path);

/* 1 when host (an HTTP listen address) is loopback only: "localhost",
 * 127.0.0.0/8 or ::1. 0 for anything else, 0.0.0.0 and :: included. */
int rt_apikey_host_is_loopback(const char *host);

#endif
