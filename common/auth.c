/* The cluster secret: see auth.h. SHA-256 follows FIPS 180-4 section 6.2,
 * HMAC follows RFC 2104; tests/unit/test_auth.c checks them against the
 * FIPS 180-4 examples and the RFC 4231 vectors. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem_err.h"

/* ---- SHA-256 -------------------------------------------------------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static inline uint32_t load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* One 64-byte block (FIPS 180-4, 6.2.2). */
static void compress(uint32_t h[8], const uint8_t *block)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++) {
        w[t] = load_be32(block + 4 * t);
    }
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ror(w[t - 15], 7) ^ ror(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ror(w[t - 2], 17) ^ ror(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t S1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + K256[t] + w[t];
        uint32_t S0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

void auth_sha256_init(struct auth_sha256 *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof(iv));
    c->bytes = 0;
    c->n = 0;
}

void auth_sha256_update(struct auth_sha256 *c, const void *data, size_t len)
{
    const uint8_t *p = data;
    c->bytes += len;
    if (c->n > 0) {
        size_t take = 64 - c->n < len ? 64 - c->n : len;
        memcpy(c->buf + c->n, p, take);
        c->n += take;
        p += take;
        len -= take;
        if (c->n < 64) {
            return;
        }
        compress(c->h, c->buf);
        c->n = 0;
    }
    for (; len >= 64; p += 64, len -= 64) {
        compress(c->h, p);
    }
    if (len > 0) {
        memcpy(c->buf, p, len);
        c->n = len;
    }
}

void auth_sha256_final(struct auth_sha256 *c, uint8_t out[AUTH_SHA256_BYTES])
{
    uint64_t bits = c->bytes * 8;
    uint8_t pad[72] = {0x80};
    /* 0x80, zeros up to 56 mod 64, then the length in bits, big-endian. */
    size_t npad = (c->n < 56 ? 56 - c->n : 120 - c->n);
    for (int i = 0; i < 8; i++) {
        pad[npad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    }
    uint64_t keep = c->bytes;
    auth_sha256_update(c, pad, npad + 8);
    c->bytes = keep;
    for (int i = 0; i < 8; i++) {
        store_be32(out + 4 * i, c->h[i]);
    }
}

void auth_sha256(const void *data, size_t len, uint8_t out[AUTH_SHA256_BYTES])
{
    struct auth_sha256 c;
    auth_sha256_init(&c);
    auth_sha256_update(&c, data, len);
    auth_sha256_final(&c, out);
}

/* ---- HMAC-SHA256 ---------------------------------------------------------- */

void auth_wipe(void *p, size_t n)
{
    explicit_bzero(p, n);
}

void auth_key_init(struct auth_key *k, const void *key, size_t len)
{
    uint8_t block[64] = {0};
    if (len > 64) {
        auth_sha256(key, len, block);
    } else if (len > 0) {
        memcpy(block, key, len);
    }
    uint8_t pad[64];
    for (int i = 0; i < 64; i++) {
        pad[i] = block[i] ^ 0x36;
    }
    auth_sha256_init(&k->inner);
    auth_sha256_update(&k->inner, pad, 64);
    for (int i = 0; i < 64; i++) {
        pad[i] = block[i] ^ 0x5c;
    }
    auth_sha256_init(&k->outer);
    auth_sha256_update(&k->outer, pad, 64);
    k->set = 1;
    auth_wipe(block, sizeof(block));
    auth_wipe(pad, sizeof(pad));
}

void auth_key_wipe(struct auth_key *k)
{
    auth_wipe(k, sizeof(*k));
}

void auth_hmac_begin(struct auth_hmac *h, const struct auth_key *k)
{
    h->c = k->inner;
    h->k = k;
}

void auth_hmac_update(struct auth_hmac *h, const void *data, size_t len)
{
    auth_sha256_update(&h->c, data, len);
}

void auth_hmac_end(struct auth_hmac *h, uint8_t out[AUTH_TAG_BYTES])
{
    uint8_t inner[AUTH_SHA256_BYTES];
    auth_sha256_final(&h->c, inner);
    h->c = h->k->outer;
    auth_sha256_update(&h->c, inner, sizeof(inner));
    auth_sha256_final(&h->c, out);
    auth_wipe(&h->c, sizeof(h->c));
}

void auth_hmac_sha256(const struct auth_key *k, const void *data, size_t len,
                      uint8_t out[AUTH_TAG_BYTES])
{
    struct auth_hmac h;
    auth_hmac_begin(&h, k);
    auth_hmac_update(&h, data, len);
    auth_hmac_end(&h, out);
}

int auth_equal(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) {
        d |= (uint8_t)(x[i] ^ y[i]);
    }
    /* 1 iff d == 0, without a data-dependent branch. */
    return (int)(1 & (((unsigned)d - 1) >> 8));
}

int auth_random(void *out, size_t n)
{
    uint8_t *p = out;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return TANDEM_EINTERNAL;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* ---- The secret file -------------------------------------------------------- */

const char *auth_secret_path(const char *flag_value)
{
    if (flag_value != NULL && flag_value[0] != '\0') {
        return flag_value;
    }
    const char *env = getenv(AUTH_SECRET_ENV);
    return env != NULL && env[0] != '\0' ? env : NULL;
}

int auth_secret_load(const char *path, struct auth_key *k, int *loose, char *err, size_t errlen)
{
    memset(k, 0, sizeof(*k));
    if (loose != NULL) {
        *loose = 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "cluster secret file %s: %s", path, strerror(errno));
        return TANDEM_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(err, errlen, "cluster secret file %s: not a regular file", path);
        return TANDEM_EINVAL;
    }
    if (loose != NULL) {
        *loose = (st.st_mode & (S_IRGRP | S_IROTH)) != 0;
    }
    uint8_t buf[AUTH_SECRET_MAX + 2];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int e = errno;
            close(fd);
            auth_wipe(buf, sizeof(buf));
            snprintf(err, errlen, "cluster secret file %s: %s", path, strerror(e));
            return TANDEM_EINVAL;
        }
        if (n == 0 || (len += (size_t)n) == sizeof(buf)) {
            break;
        }
    }
    close(fd);
    if (len > 0 && buf[len - 1] == '\n') {
        len--;
        if (len > 0 && buf[len - 1] == '\r') {
            len--;
        }
    }
    int rc = 0;
    if (len > AUTH_SECRET_MAX) {
        snprintf(err, errlen, "cluster secret file %s: longer than %d bytes", path,
                 AUTH_SECRET_MAX);
        rc = TANDEM_EINVAL;
    } else if (len < AUTH_SECRET_MIN) {
        snprintf(err, errlen, "cluster secret file %s: %zu bytes, at least %d needed", path, len,
                 AUTH_SECRET_MIN);
        rc = TANDEM_EINVAL;
    } else {
        auth_key_init(k, buf, len);
    }
    auth_wipe(buf, sizeof(buf));
    return rc;
}

/* ---- Proofs and tags ---------------------------------------------------------- */

static void put_le64(struct auth_hmac *h, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
    auth_hmac_update(h, b, sizeof(b));
}

/* A string and its terminating NUL, so no two (a, b) pairs share an input. */
static void put_str(struct auth_hmac *h, const char *s)
{
    auth_hmac_update(h, s ? s : "", (s ? strlen(s) : 0) + 1);
}

void auth_hello_proof(const struct auth_key *k, const uint8_t *nonce, size_t nonce_len,
                      const char *worker_id, uint64_t incarnation, uint8_t out[AUTH_TAG_BYTES])
{
    static const char label[] = "tandem-hello-v1";
    struct auth_hmac h;
    auth_hmac_begin(&h, k);
    auth_hmac_update(&h, label, sizeof(label) - 1);
    auth_hmac_update(&h, nonce, nonce_len);
    put_str(&h, worker_id);
    put_le64(&h, incarnation);
    auth_hmac_end(&h, out);
}

void auth_router_proof(const struct auth_key *k, const uint8_t *nonce, size_t nonce_len,
                       uint8_t out[AUTH_TAG_BYTES])
{
    static const char label[] = "tandem-router-v1";
    struct auth_hmac h;
    auth_hmac_begin(&h, k);
    auth_hmac_update(&h, label, sizeof(label) - 1);
    auth_hmac_update(&h, nonce, nonce_len);
    auth_hmac_end(&h, out);
}

void auth_announce_tag(const struct auth_key *k, const char *worker_id, const char *control_address,
                       uint64_t incarnation, uint8_t out[AUTH_TAG_BYTES])
{
    static const char label[] = "tandem-announce-v1";
    struct auth_hmac h;
    auth_hmac_begin(&h, k);
    auth_hmac_update(&h, label, sizeof(label) - 1);
    put_str(&h, worker_id);
    put_str(&h, control_address);
    put_le64(&h, incarnation);
    auth_hmac_end(&h, out);
}

void auth_frame_tag(const struct auth_key *k, const void *env, size_t len,
                    uint8_t out[AUTH_TAG_BYTES])
{
    static const char label[] = "tandem-frame-v1";
    struct auth_hmac h;
    auth_hmac_begin(&h, k);
    auth_hmac_update(&h, label, sizeof(label) - 1);
    auth_hmac_update(&h, env, len);
    auth_hmac_end(&h, out);
}

int auth_frame_check(const struct auth_key *k, const void *env, size_t len)
{
    const uint8_t *p = env;
    if (len < AUTH_ENV_TAG_FIELD_BYTES) {
        return TANDEM_EPROTO;
    }
    const uint8_t *field = p + len - AUTH_ENV_TAG_FIELD_BYTES;
    if (field[0] != 0x92 || field[1] != 0x01 || field[2] != AUTH_TAG_BYTES) {
        return TANDEM_EPROTO;
    }
    uint8_t want[AUTH_TAG_BYTES];
    auth_frame_tag(k, env, len - AUTH_ENV_TAG_FIELD_BYTES, want);
    return auth_equal(want, field + 3, AUTH_TAG_BYTES) ? 0 : TANDEM_EAUTH;
}
