/* The router's API key: see rt_apikey.h. */
#include "rt_apikey.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "file.h"
#include "tandem_err.h"

/* Checks key[0..len) and copies it into out; err names source. */
static int take_key(const char *key, size_t len, char *out, const char *source, char *err,
                    size_t errlen)
{
    if (len == 0) {
        snprintf(err, errlen, "API key from %s: empty (unset it for no key)", source);
        return TANDEM_EINVAL;
    }
    if (len > RT_APIKEY_MAX) {
        snprintf(err, errlen, "API key from %s: %zu bytes, at most %d", source, len, RT_APIKEY_MAX);
        return TANDEM_EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)key[i];
        if (ch < 0x21 || ch > 0x7e) {
            snprintf(err, errlen,
                     "API key from %s: byte %zu is 0x%02x; a key is visible ASCII without "
                     "spaces (e.g. openssl rand -hex 32)",
                     source, i + 1, ch);
            return TANDEM_EINVAL;
        }
    }
    memcpy(out, key, len);
    out[len] = '\0';
    return 1;
}

static int key_from_file(const char *path, char *out, const char *source, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    char ferr[512];
    /* Two bytes over the limit for a trailing "\r\n". */
    int rc = file_read_all(path, RT_APIKEY_MAX + 2, &buf, &len, ferr, sizeof(ferr));
    if (rc == TANDEM_ETOOBIG) {
        snprintf(err, errlen, "API key from %s: larger than %d bytes", source, RT_APIKEY_MAX);
        return TANDEM_EINVAL;
    }
    if (rc != 0) {
        snprintf(err, errlen, "--%s: %s", RT_APIKEY_FILE_FLAG, ferr);
        return rc == TANDEM_ENOMEM ? rc : TANDEM_EINVAL;
    }
    size_t n = len;
    if (n > 0 && buf[n - 1] == '\n') {
        n--;
        if (n > 0 && buf[n - 1] == '\r') {
            n--;
        }
    }
    rc = take_key(buf, n, out, source, err, errlen);
    auth_wipe(buf, len);
    free(buf);
    return rc;
}

int rt_apikey_find(const char *key_flag, const char *key_file, char *out, char *source,
                   size_t srclen, char *err, size_t errlen)
{
    out[0] = '\0';
    if (key_flag != NULL) {
        snprintf(source, srclen, "--%s", RT_APIKEY_FLAG);
        return take_key(key_flag, strlen(key_flag), out, source, err, errlen);
    }
    if (key_file != NULL) {
        snprintf(source, srclen, "--%s %s", RT_APIKEY_FILE_FLAG, key_file);
        return key_from_file(key_file, out, source, err, errlen);
    }
    const char *env = getenv(RT_APIKEY_ENV);
    if (env != NULL && env[0] != '\0') {
        snprintf(source, srclen, "$%s", RT_APIKEY_ENV);
        return take_key(env, strlen(env), out, source, err, errlen);
    }
    snprintf(source, srclen, "none");
    return 0;
}

void rt_apikey_init(struct rt_apikey *k, const char *key, size_t len)
{
    auth_sha256(key, len, k->digest);
    k->set = 1;
}

int rt_apikey_equal(const struct rt_apikey *k, const char *token, size_t len)
{
    if (!k->set) {
        return 0;
    }
    /* Comparing digests of equal length: no early exit on the first
     * differing byte, no branch on the key's length. */
    uint8_t d[AUTH_SHA256_BYTES];
    auth_sha256(token, len, d);
    int eq = auth_equal(d, k->digest, sizeof(d));
    auth_wipe(d, sizeof(d));
    return eq;
}

enum rt_apikey_verdict rt_apikey_check(const struct rt_apikey *k, const char *authorization)
{
    if (!k->set) {
        return RT_APIKEY_OK;
    }
    if (authorization == NULL) {
        return RT_APIKEY_MISSING;
    }
    static const char scheme[] = "Bearer";
    size_t sl = sizeof(scheme) - 1;
    if (strncasecmp(authorization, scheme, sl) != 0 || authorization[sl] != ' ') {
        return RT_APIKEY_SCHEME;
    }
    const char *token = authorization + sl;
    while (*token == ' ') {
        token++;
    }
    return rt_apikey_equal(k, token, strlen(token)) ? RT_APIKEY_OK : RT_APIKEY_WRONG;
}

int rt_apikey_guarded(const char *path)
{
    return strncmp(path, "/v1", 3) == 0;
}

int rt_apikey_host_is_loopback(const char *host)
{
    if (strcmp(host, "localhost") == 0) {
        return 1;
    }
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        return (ntohl(a4.s_addr) >> 24) == 127;
    }
    struct in6_addr a6;
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        return memcmp(&a6, &in6addr_loopback, sizeof(a6)) == 0;
    }
    return 0;
}
