/* common/auth: SHA-256 against the FIPS 180-4 examples (and every split of
 * the input across updates), HMAC-SHA256 against the seven RFC 4231 test
 * cases, the constant-time comparison, the secret file rules, and the
 * proofs and frame tags (distinct per input, refused when anything
 * changes). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "tandem_err.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        sprintf(out + 2 * i, "%02x", b[i]);
    }
}

static size_t unhex(const char *s, uint8_t *out)
{
    size_t n = strlen(s) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(s + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return n;
}

#define EXPECT_HEX(bytes, n, want)                                                                 \
    do {                                                                                           \
        char got_[2 * 64 + 1];                                                                     \
        hex((bytes), (n), got_);                                                                   \
        if (strcmp(got_, (want)) != 0)                                                             \
            fprintf(stderr, "\n%s:%d:\n  got  %s\n  want %s\n", __FILE__, __LINE__, got_, (want)); \
        CU_ASSERT_STRING_EQUAL(got_, (want));                                                      \
    } while (0)

static void test_sha256_fips(void)
{
    static const struct {
        const char *msg, *digest;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrl"
         "mnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint8_t d[32];
        auth_sha256(v[i].msg, strlen(v[i].msg), d);
        EXPECT_HEX(d, 32, v[i].digest);
        /* Every split point into two updates gives the same digest. */
        size_t len = strlen(v[i].msg);
        for (size_t cut = 0; cut <= len; cut++) {
            struct auth_sha256 c;
            auth_sha256_init(&c);
            auth_sha256_update(&c, v[i].msg, cut);
            auth_sha256_update(&c, v[i].msg + cut, len - cut);
            uint8_t e[32];
            auth_sha256_final(&c, e);
            CU_ASSERT(memcmp(d, e, 32) == 0);
        }
    }
    /* One million 'a' (FIPS 180-2 appendix B.3), in uneven pieces. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    struct auth_sha256 c;
    auth_sha256_init(&c);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step % 997 + 13) {
        auth_sha256_update(&c, a + off, off + step > 1000000 ? 1000000 - off : step);
    }
    uint8_t d[32];
    auth_sha256_final(&c, d);
    EXPECT_HEX(d, 32, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
    /* Lengths around the padding boundary (55, 56, 63, 64 bytes) agree with
     * byte-at-a-time hashing. */
    for (size_t n = 50; n <= 130; n++) {
        uint8_t buf[130], x[32], y[32];
        for (size_t i = 0; i < n; i++) {
            buf[i] = (uint8_t)(i * 7 + n);
        }
        auth_sha256(buf, n, x);
        auth_sha256_init(&c);
        for (size_t i = 0; i < n; i++) {
            auth_sha256_update(&c, buf + i, 1);
        }
        auth_sha256_final(&c, y);
        CU_ASSERT(memcmp(x, y, 32) == 0);
    }
}

static void test_hmac_rfc4231(void)
{
    static const struct {
        const char *key, *data, *mac; /* hex; data "" = see below */
        size_t trunc;
    } v[] = {
        /* 1 */
        {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32},
        /* 2: "Jefe", "what do ya want for nothing?" */
        {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32},
        /* 3 */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32},
        /* 4 */
        {"0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32},
        /* 5: truncated to 128 bits */
        {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "546573742057697468205472756e636174696f6e",
         "a3b6167473100ee06e0c796c2955552b", 16},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint8_t key[200], data[200], mac[32];
        size_t kl = unhex(v[i].key, key), dl = unhex(v[i].data, data);
        struct auth_key k;
        auth_key_init(&k, key, kl);
        auth_hmac_sha256(&k, data, dl, mac);
        EXPECT_HEX(mac, v[i].trunc, v[i].mac);
    }
    /* 6 and 7: a 131-byte key (longer than a block, hashed first). */
    uint8_t key[131];
    memset(key, 0xaa, sizeof(key));
    struct auth_key k;
    auth_key_init(&k, key, sizeof(key));
    const char *d6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    uint8_t mac[32];
    auth_hmac_sha256(&k, d6, strlen(d6), mac);
    EXPECT_HEX(mac, 32, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *d7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the HMAC "
                     "algorithm.";
    auth_hmac_sha256(&k, d7, strlen(d7), mac);
    EXPECT_HEX(mac, 32, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
    /* Incremental, one byte at a time, and the key reused. */
    struct auth_hmac h;
    auth_hmac_begin(&h, &k);
    for (size_t i = 0; i < strlen(d7); i++) {
        auth_hmac_update(&h, d7 + i, 1);
    }
    auth_hmac_end(&h, mac);
    EXPECT_HEX(mac, 32, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
    auth_key_wipe(&k);
    CU_ASSERT_EQUAL(k.set, 0);
}

static void test_equal(void)
{
    uint8_t a[64], b[64];
    for (int i = 0; i < 64; i++) {
        a[i] = b[i] = (uint8_t)(i * 37);
    }
    CU_ASSERT_EQUAL(auth_equal(a, b, 64), 1);
    CU_ASSERT_EQUAL(auth_equal(a, b, 0), 1);
    for (int i = 0; i < 64; i++) {
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            CU_ASSERT_EQUAL(auth_equal(a, b, 64), 0);
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    uint8_t n1[32], n2[32];
    CU_ASSERT_EQUAL(auth_random(n1, sizeof(n1)), 0);
    CU_ASSERT_EQUAL(auth_random(n2, sizeof(n2)), 0);
    CU_ASSERT(memcmp(n1, n2, 32) != 0);
}

static char tmp_path[64];

static void write_file(const char *content, size_t len, mode_t mode)
{
    FILE *f = fopen(tmp_path, "wb");
    fwrite(content, 1, len, f);
    fclose(f);
    chmod(tmp_path, mode);
}

static void test_secret_file(void)
{
    snprintf(tmp_path, sizeof(tmp_path), "/tmp/tandem-auth-test-%d", (int)getpid());
    struct auth_key k, k2;
    char err[256];
    int loose = -1;
    /* A trailing newline is not part of the secret; \r\n neither. */
    write_file("0123456789abcdef\n", 17, 0600);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, &loose, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(loose, 0);
    CU_ASSERT_EQUAL(k.set, 1);
    auth_key_init(&k2, "0123456789abcdef", 16);
    uint8_t m1[32], m2[32];
    auth_hmac_sha256(&k, "x", 1, m1);
    auth_hmac_sha256(&k2, "x", 1, m2);
    CU_ASSERT(memcmp(m1, m2, 32) == 0);
    write_file("0123456789abcdef\r\n", 18, 0644);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, &loose, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(loose, 1);
    auth_hmac_sha256(&k, "x", 1, m1);
    CU_ASSERT(memcmp(m1, m2, 32) == 0);
    /* Too short (15 bytes), too long, missing: refused, the message names
     * the file and never the content. */
    write_file("0123456789abcde\n", 16, 0600);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, NULL, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT(strstr(err, tmp_path) != NULL);
    CU_ASSERT(strstr(err, "0123456789") == NULL);
    CU_ASSERT_EQUAL(k.set, 0);
    char *big = malloc(AUTH_SECRET_MAX + 10);
    memset(big, 'z', AUTH_SECRET_MAX + 10);
    write_file(big, AUTH_SECRET_MAX, 0600);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, NULL, err, sizeof(err)), 0);
    write_file(big, AUTH_SECRET_MAX + 1, 0600);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, NULL, err, sizeof(err)), TANDEM_EINVAL);
    write_file(big, AUTH_SECRET_MAX + 10, 0600);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, NULL, err, sizeof(err)), TANDEM_EINVAL);
    free(big);
    unlink(tmp_path);
    CU_ASSERT_EQUAL(auth_secret_load(tmp_path, &k, NULL, err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(auth_secret_load("/tmp", &k, NULL, err, sizeof(err)), TANDEM_EINVAL);
    /* The flag wins over the environment. */
    setenv(AUTH_SECRET_ENV, "/env/path", 1);
    CU_ASSERT_STRING_EQUAL(auth_secret_path("/flag/path"), "/flag/path");
    CU_ASSERT_STRING_EQUAL(auth_secret_path(NULL), "/env/path");
    CU_ASSERT_STRING_EQUAL(auth_secret_path(""), "/env/path");
    unsetenv(AUTH_SECRET_ENV);
    CU_ASSERT_PTR_NULL(auth_secret_path(NULL));
}

static void test_proofs(void)
{
    struct auth_key k, other;
    auth_key_init(&k, "the cluster secret", 18);
    auth_key_init(&other, "the cluster secreT", 18);
    uint8_t nonce[AUTH_NONCE_BYTES], a[32], b[32];
    memset(nonce, 7, sizeof(nonce));
    auth_hello_proof(&k, nonce, sizeof(nonce), "decode-0", 1234, a);
    auth_hello_proof(&k, nonce, sizeof(nonce), "decode-0", 1234, b);
    CU_ASSERT(memcmp(a, b, 32) == 0);
    /* Any change of input, or of the key, changes the proof. */
    auth_hello_proof(&k, nonce, sizeof(nonce), "decode-1", 1234, b);
    CU_ASSERT(memcmp(a, b, 32) != 0);
    auth_hello_proof(&k, nonce, sizeof(nonce), "decode-0", 1235, b);
    CU_ASSERT(memcmp(a, b, 32) != 0);
    nonce[31] ^= 1;
    auth_hello_proof(&k, nonce, sizeof(nonce), "decode-0", 1234, b);
    CU_ASSERT(memcmp(a, b, 32) != 0);
    nonce[31] ^= 1;
    auth_hello_proof(&other, nonce, sizeof(nonce), "decode-0", 1234, b);
    CU_ASSERT(memcmp(a, b, 32) != 0);
    /* Domain separation: the router's proof of the same nonce differs. */
    auth_router_proof(&k, nonce, sizeof(nonce), b);
    CU_ASSERT(memcmp(a, b, 32) != 0);
    /* Announcements: the id/address boundary is part of the input. */
    auth_announce_tag(&k, "ab", "c", 1, a);
    auth_announce_tag(&k, "a", "bc", 1, b);
    CU_ASSERT(memcmp(a, b, 32) != 0);

    /* Frame tags: an envelope followed by its tag field is accepted; a flip
     * of any bit anywhere, a wrong key, or no tag is refused. */
    uint8_t env[64 + AUTH_ENV_TAG_FIELD_BYTES];
    for (int i = 0; i < 64; i++) {
        env[i] = (uint8_t)(i * 11 + 1);
    }
    env[64] = 0x92;
    env[65] = 0x01;
    env[66] = 32;
    auth_frame_tag(&k, env, 64, env + 67);
    CU_ASSERT_EQUAL(auth_frame_check(&k, env, sizeof(env)), 0);
    for (size_t i = 0; i < sizeof(env); i++) {
        for (int bit = 0; bit < 8; bit++) {
            env[i] ^= (uint8_t)(1u << bit);
            int rc = auth_frame_check(&k, env, sizeof(env));
            CU_ASSERT(rc == TANDEM_EAUTH || (i >= 64 && i < 67 && rc == TANDEM_EPROTO));
            env[i] ^= (uint8_t)(1u << bit);
        }
    }
    CU_ASSERT_EQUAL(auth_frame_check(&other, env, sizeof(env)), TANDEM_EAUTH);
    CU_ASSERT_EQUAL(auth_frame_check(&k, env, 64), TANDEM_EPROTO);
    CU_ASSERT_EQUAL(auth_frame_check(&k, env, 10), TANDEM_EPROTO);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        return 1;
    }
    CU_pSuite s = CU_add_suite("auth", NULL, NULL);
    CU_add_test(s, "sha256_fips", test_sha256_fips);
    CU_add_test(s, "hmac_rfc4231", test_hmac_rfc4231);
    CU_add_test(s, "equal_random", test_equal);
    CU_add_test(s, "secret_file", test_secret_file);
    CU_add_test(s, "proofs_and_tags", test_proofs);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed != 0;
}
