/* The cluster secret (docs/reliability.md, "## Security"; the messages in
 * docs/protocol.md, "Cluster secret"): SHA-256 (FIPS 180-4), HMAC-SHA256
 * (RFC 2104, checked against RFC 4231), a constant-time comparison, nonces,
 * loading the secret from a file, and the proofs and tags the router and
 * the workers exchange.
 *
 * With --cluster-secret-file FILE (or TANDEM_CLUSTER_SECRET_FILE=FILE) on
 * the router and every worker:
 *   - control link: each side sends an AUTH challenge (a random nonce) on a
 *     new pipe; the worker answers with its WorkerHello carrying
 *     auth_hello_proof(nonce), the router with an AUTH proof
 *     (auth_router_proof). The router registers a worker only after a valid
 *     proof; a worker runs jobs only from a router that proved itself.
 *   - announcements carry auth_announce_tag, so nobody without the secret
 *     can make the router dial an address;
 *   - data link: every frame's envelope ends with auth_tag =
 *     auth_frame_tag(the envelope bytes before it), checked before anything
 *     is decoded (PrefillJob, KV frames, PrefillDone, Cancel, ...).
 * The secret itself never leaves auth_key: it is not logged, not exported
 * as a metric, and wiped from memory once the key is derived.
 *
 * Threading: every function is pure or works on caller-owned state, so it is
 * thread-safe on distinct arguments. */
#ifndef TANDEM_AUTH_H
#define TANDEM_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define AUTH_SHA256_BYTES 32
#define AUTH_TAG_BYTES    32   /* HMAC-SHA256 output, every proof and tag */
#define AUTH_NONCE_BYTES  32   /* challenge nonces sent */
#define AUTH_NONCE_MIN    16   /* shortest nonce accepted */
#define AUTH_NONCE_MAX    64   /* longest nonce accepted */
#define AUTH_SECRET_MIN   16   /* bytes in the secret file (after a trailing newline) */
#define AUTH_SECRET_MAX   4096 /* larger files are refused */

/* Environment variable naming the secret file when the flag is not given. */
#define AUTH_SECRET_ENV  "TANDEM_CLUSTER_SECRET_FILE"
#define AUTH_SECRET_FLAG "cluster-secret-file"

/* SHA-256, incremental. */
struct auth_sha256 {
    uint32_t h[8];
    uint64_t bytes; /* total length so far */
    uint8_t buf[64];
    size_t n; /* bytes in buf */
};

void auth_sha256_init(struct auth_sha256 *c);
void auth_sha256_update(struct auth_sha256 *c, const void *data, size_t len);
/* Writes the digest; c must be initialised again before reuse. */
void auth_sha256_final(struct auth_sha256 *c, uint8_t out[AUTH_SHA256_BYTES]);
void auth_sha256(const void *data, size_t len, uint8_t out[AUTH_SHA256_BYTES]);

/* An HMAC-SHA256 key, prepared once: the states after the inner (key ^ ipad)
 * and outer (key ^ opad) blocks, so each MAC costs two compressions plus the
 * data. Holds no copy of the key itself. */
struct auth_key {
    struct auth_sha256 inner, outer;
    int set; /* 0: no secret configured */
};

/* Prepares k from key[0..len) (any length; longer than a block is hashed
 * first, as RFC 2104 says). */
void auth_key_init(struct auth_key *k, const void *key, size_t len);
/* Wipes k. */
void auth_key_wipe(struct auth_key *k);

/* An HMAC in progress: auth_hmac_begin, any number of auth_hmac_update,
 * auth_hmac_end. */
struct auth_hmac {
    struct auth_sha256 c;
    const struct auth_key *k;
};

void auth_hmac_begin(struct auth_hmac *h, const struct auth_key *k);
void auth_hmac_update(struct auth_hmac *h, const void *data, size_t len);
void auth_hmac_end(struct auth_hmac *h, uint8_t out[AUTH_TAG_BYTES]);
/* HMAC-SHA256(k, data) in one call. */
void auth_hmac_sha256(const struct auth_key *k, const void *data, size_t len,
                      uint8_t out[AUTH_TAG_BYTES]);

/* 1 when a[0..n) == b[0..n), else 0, in time that depends only on n. */
int auth_equal(const void *a, const void *b, size_t n);

/* Fills out[0..n) from the kernel's random source (getrandom). Returns 0,
 * or TANDEM_EINTERNAL when it is unavailable. */
int auth_random(void *out, size_t n);

/* Zeroes p[0..n) in a way the compiler may not remove. */
void auth_wipe(void *p, size_t n);

/* The secret file to use: flag_value if not NULL or empty, else the
 * TANDEM_CLUSTER_SECRET_FILE environment variable if set and non-empty,
 * else NULL (no secret). */
const char *auth_secret_path(const char *flag_value);

/* Reads the secret from path into k: the file's bytes, without one trailing
 * "\n" or "\r\n"; AUTH_SECRET_MIN to AUTH_SECRET_MAX bytes. The bytes read
 * are wiped once k is prepared. *loose (if not NULL) is set to 1 when the
 * file is readable by group or others (the caller warns). Returns 0, or
 * TANDEM_EINVAL with a message in err naming the file (never its
 * content): unreadable, not a regular file, too short or too long. */
int auth_secret_load(const char *path, struct auth_key *k, int *loose, char *err, size_t errlen);

/* ---- What the processes exchange (domain-separated inputs) -------------- */

/* Worker -> router: HMAC(secret, "tandem-hello-v1" || nonce || worker_id ||
 * 0x00 || incarnation as u64 little-endian). */
void auth_hello_proof(const struct auth_key *k, const uint8_t *nonce, size_t nonce_len,
                      const char *worker_id, uint64_t incarnation, uint8_t out[AUTH_TAG_BYTES]);

/* Router -> worker: HMAC(secret, "tandem-router-v1" || nonce). */
void auth_router_proof(const struct auth_key *k, const uint8_t *nonce, size_t nonce_len,
                       uint8_t out[AUTH_TAG_BYTES]);

/* Announcement: HMAC(secret, "tandem-announce-v1" || worker_id || 0x00 ||
 * control_address || 0x00 || incarnation as u64 little-endian). */
void auth_announce_tag(const struct auth_key *k, const char *worker_id, const char *control_address,
                       uint64_t incarnation, uint8_t out[AUTH_TAG_BYTES]);

/* Data-link frame: HMAC(secret, "tandem-frame-v1" || env[0..len)), len the
 * bytes of the packed envelope before its auth_tag field. */
void auth_frame_tag(const struct auth_key *k, const void *env, size_t len,
                    uint8_t out[AUTH_TAG_BYTES]);

/* The auth_tag field as protobuf packs it at the end of an Envelope: key
 * (field 18, length-delimited: 0x92 0x01), length 0x20, then the 32 bytes. */
#define AUTH_ENV_TAG_FIELD_BYTES (3 + AUTH_TAG_BYTES)

/* Checks a packed envelope env[0..len) that must end with its auth_tag
 * field and whose tag must be auth_frame_tag of the bytes before it.
 * Returns 0 (authentic), TANDEM_EPROTO (no tag field at the end) or
 * TANDEM_EAUTH (wrong tag). */
int auth_frame_check(const struct auth_key *k, const void *env, size_t len);

#endif
