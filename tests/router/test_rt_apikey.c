/* The router's API key (router/rt_apikey.h): where the key comes from, the
 * Authorization header's parsing, the comparison (right key, wrong key, a
 * prefix or extension of it, every bit flipped) and its timing, the guarded
 * paths, the loopback test behind the start-up warning. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "rt_apikey.h"
#include "tandem_err.h"

#define KEY "sk-tandem-0123456789abcdef"

static struct rt_apikey key_of(const char *s)
{
    struct rt_apikey k = {0};
    rt_apikey_init(&k, s, strlen(s));
    return k;
}

/* Only the key's SHA-256 is kept: the comparison runs over two digests of
 * the same length whatever the key's or the token's length. */
static void test_digest_only(void)
{
    struct rt_apikey k = key_of(KEY);
    uint8_t want[AUTH_SHA256_BYTES];
    auth_sha256(KEY, strlen(KEY), want);
    CU_ASSERT_EQUAL(k.set, 1);
    CU_ASSERT_EQUAL(memcmp(k.digest, want, sizeof(want)), 0);
    CU_ASSERT_EQUAL(sizeof(k), sizeof(k.digest) + sizeof(int));
}

static void test_equal(void)
{
    struct rt_apikey k = key_of(KEY);
    size_t n = strlen(KEY);
    CU_ASSERT_EQUAL(rt_apikey_equal(&k, KEY, n), 1);
    CU_ASSERT_EQUAL(rt_apikey_equal(&k, KEY, n - 1), 0);     /* a prefix */
    CU_ASSERT_EQUAL(rt_apikey_equal(&k, KEY "x", n + 1), 0); /* an extension */
    CU_ASSERT_EQUAL(rt_apikey_equal(&k, "", 0), 0);
    char t[sizeof(KEY)];
    memcpy(t, KEY, sizeof(KEY));
    for (size_t i = 0; i < n; i++) {
        for (int bit = 0; bit < 8; bit++) {
            t[i] ^= (char)(1u << bit);
            CU_ASSERT_EQUAL(rt_apikey_equal(&k, t, n), 0);
            t[i] ^= (char)(1u << bit);
        }
    }
    CU_ASSERT_EQUAL(rt_apikey_equal(&k, t, n), 1);
    struct rt_apikey none = {0};
    CU_ASSERT_EQUAL(rt_apikey_equal(&none, "", 0), 0); /* no key: nothing is the key */
}

/* Every byte of the digest takes part: a key whose stored digest differs
 * from the token's in any one byte is not matched. */
static void test_equal_whole_digest(void)
{
    for (size_t i = 0; i < AUTH_SHA256_BYTES; i++) {
        struct rt_apikey k = key_of(KEY);
        k.digest[i] ^= 0x80;
        CU_ASSERT_EQUAL(rt_apikey_equal(&k, KEY, strlen(KEY)), 0);
    }
}

static void test_check_header(void)
{
    struct rt_apikey k = key_of(KEY);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, NULL), RT_APIKEY_MISSING);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Basic " KEY), RT_APIKEY_SCHEME);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer"), RT_APIKEY_SCHEME);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer" KEY), RT_APIKEY_SCHEME);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, KEY), RT_APIKEY_SCHEME);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, ""), RT_APIKEY_SCHEME);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer " KEY), RT_APIKEY_OK);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "bearer " KEY), RT_APIKEY_OK);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "BEARER   " KEY), RT_APIKEY_OK);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer wrong"), RT_APIKEY_WRONG);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer "), RT_APIKEY_WRONG);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer " KEY "0"), RT_APIKEY_WRONG);
    CU_ASSERT_EQUAL(rt_apikey_check(&k, "Bearer sk-tandem-0123456789abcde"), RT_APIKEY_WRONG);
    struct rt_apikey none = {0};
    CU_ASSERT_EQUAL(rt_apikey_check(&none, NULL), RT_APIKEY_OK);
    CU_ASSERT_EQUAL(rt_apikey_check(&none, "Bearer anything"), RT_APIKEY_OK);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Fastest of many batches of calls (the minimum shrugs off a loaded
 * machine), nanoseconds per call. */
static double min_ns(const struct rt_apikey *k, const char *t, size_t n)
{
    double best = 1e18;
    volatile int sink = 0;
    for (int s = 0; s < 60; s++) {
        double t0 = now_ns();
        for (int i = 0; i < 400; i++) {
            sink += rt_apikey_equal(k, t, n);
        }
        double dt = (now_ns() - t0) / 400;
        best = dt < best ? dt : best;
    }
    (void)sink;
    return best;
}

/* A token wrong in its first byte takes as long as one wrong only in its
 * last: no early exit on the first differing byte (a byte-wise comparison
 * of the raw 512-byte key would make the first several times faster). */
static void test_timing(void)
{
    char key[RT_APIKEY_MAX + 1];
    memset(key, 'k', RT_APIKEY_MAX);
    key[RT_APIKEY_MAX] = '\0';
    struct rt_apikey k = key_of(key);
    char first[RT_APIKEY_MAX + 1], last[RT_APIKEY_MAX + 1];
    memcpy(first, key, sizeof(key));
    memcpy(last, key, sizeof(key));
    first[0] = 'x';
    last[RT_APIKEY_MAX - 1] = 'x';
    double a = 0, b = 0;
    for (int round = 0; round < 3; round++) { /* interleaved, so drift hits both */
        double x = min_ns(&k, first, RT_APIKEY_MAX), y = min_ns(&k, last, RT_APIKEY_MAX);
        a = round == 0 || x < a ? x : a;
        b = round == 0 || y < b ? y : b;
    }
    double ratio = a > b ? a / b : b / a;
    printf("\n  first byte wrong %.0f ns, last byte wrong %.0f ns, ratio %.3f\n", a, b, ratio);
    CU_ASSERT(ratio < 2.0); /* an early exit measured 77; the hashed compare 1.00-1.06 */
}

static void test_guarded(void)
{
    CU_ASSERT_EQUAL(rt_apikey_guarded("/v1/completions"), 1);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/v1/chat/completions"), 1);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/v1/models"), 1);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/v1/cluster"), 1);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/v1/decisions"), 1);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/v1"), 1);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/health"), 0);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/metrics"), 0);
    CU_ASSERT_EQUAL(rt_apikey_guarded("/"), 0);
}

static void test_loopback(void)
{
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("127.0.0.1"), 1);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("127.8.9.10"), 1);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("::1"), 1);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("localhost"), 1);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("0.0.0.0"), 0);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("::"), 0);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("10.1.2.3"), 0);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("128.0.0.1"), 0);
    CU_ASSERT_EQUAL(rt_apikey_host_is_loopback("example.com"), 0);
}

static char tmp[64];

static void put(const char *content)
{
    FILE *f = fopen(tmp, "wb");
    fputs(content, f);
    fclose(f);
}

/* Runs rt_apikey_find and checks the error, if any, never shows the key. */
static int find(const char *flag, const char *file, char *out, char *src, char *err)
{
    int rc = rt_apikey_find(flag, file, out, src, 256, err, 256);
    if (rc < 0) {
        CU_ASSERT_PTR_NULL(strstr(err, "hunter2"));
    }
    return rc;
}

static void test_find(void)
{
    char out[RT_APIKEY_MAX + 1], src[256], err[256];
    snprintf(tmp, sizeof(tmp), "/tmp/test_rt_apikey.%d", (int)getpid());
    unsetenv(RT_APIKEY_ENV);
    CU_ASSERT_EQUAL(find(NULL, NULL, out, src, err), 0);
    CU_ASSERT_STRING_EQUAL(out, "");
    setenv(RT_APIKEY_ENV, "", 1);
    CU_ASSERT_EQUAL(find(NULL, NULL, out, src, err), 0); /* empty: no key */
    setenv(RT_APIKEY_ENV, "from-env", 1);
    CU_ASSERT_EQUAL(find(NULL, NULL, out, src, err), 1);
    CU_ASSERT_STRING_EQUAL(out, "from-env");
    CU_ASSERT_STRING_EQUAL(src, "$TANDEM_API_KEY");
    put("from-file\r\n");
    CU_ASSERT_EQUAL(find(NULL, tmp, out, src, err), 1); /* the file wins over the environment */
    CU_ASSERT_STRING_EQUAL(out, "from-file");
    CU_ASSERT_PTR_NOT_NULL(strstr(src, tmp));
    CU_ASSERT_EQUAL(find("from-flag", tmp, out, src, err), 1); /* the flag wins over both */
    CU_ASSERT_STRING_EQUAL(out, "from-flag");
    CU_ASSERT_STRING_EQUAL(src, "--api-key");
    unsetenv(RT_APIKEY_ENV);

    put("\n");
    CU_ASSERT_EQUAL(find(NULL, tmp, out, src, err), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "empty"));
    put("hunter2 hunter2\n");
    CU_ASSERT_EQUAL(find(NULL, tmp, out, src, err), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "byte 8 is 0x20"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, tmp)); /* names the source */
    CU_ASSERT_EQUAL(find("hunter2\t", NULL, out, src, err), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--api-key: byte 8 is 0x09"));
    char big[RT_APIKEY_MAX + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CU_ASSERT_EQUAL(find(big, NULL, out, src, err), TANDEM_EINVAL); /* 513 bytes */
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "513 bytes, at most 512"));
    put(big);
    CU_ASSERT_EQUAL(find(NULL, tmp, out, src, err), TANDEM_EINVAL);
    big[RT_APIKEY_MAX] = '\0';
    CU_ASSERT_EQUAL(find(big, NULL, out, src, err), 1); /* 512 bytes */
    CU_ASSERT_EQUAL(strlen(out), (size_t)RT_APIKEY_MAX);
    unlink(tmp);
    CU_ASSERT_EQUAL(find(NULL, tmp, out, src, err), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--api-key-file"));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("rt_apikey", NULL, NULL);
    CU_add_test(s, "digest_only", test_digest_only);
    CU_add_test(s, "equal", test_equal);
    CU_add_test(s, "equal_whole_digest", test_equal_whole_digest);
    CU_add_test(s, "check_header", test_check_header);
    CU_add_test(s, "timing", test_timing);
    CU_add_test(s, "guarded", test_guarded);
    CU_add_test(s, "loopback", test_loopback);
    CU_add_test(s, "find", test_find);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
