/* common/tls: URL helpers, tls_init's errors, and mutual TLS over
 * tls+tcp://127.0.0.1 with certificates made at test time by
 * deploy/make-cluster-ca.sh (the openssl command): a peer with the cluster's
 * certificate gets through, one whose certificate another CA signed is
 * refused. */
#include <CUnit/Basic.h>
#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem_err.h"
#include "tls.h"

static char dir[256]; /* temporary directory with ca/ and other/ */
static int have_certs;

static void path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static int make_certs(void)
{
    const char *src = getenv("TANDEM_SOURCE_DIR");
    snprintf(dir, sizeof(dir), "/tmp/tandem-test-tls-XXXXXX");
    if (src == NULL || mkdtemp(dir) == NULL) {
        fprintf(stderr, "test_tls: needs TANDEM_SOURCE_DIR and a writable /tmp\n");
        return -1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "%s/deploy/make-cluster-ca.sh %s/ca node >/dev/null && "
             "TANDEM_CA_SUBJECT=/CN=other-ca %s/deploy/make-cluster-ca.sh %s/other rogue "
             ">/dev/null && printf 'not a certificate\\n' > %s/junk.pem",
             src, dir, src, dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_tls: %s failed\n", cmd);
        return -1;
    }
    return 0;
}

static int suite_init(void)
{
    have_certs = make_certs() == 0;
    return 0;
}

static int suite_fini(void)
{
    tls_fini();
    if (dir[0] != '\0') {
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "test_tls: cannot remove %s\n", dir);
        }
    }
    return 0;
}

static void test_url_is_tls(void)
{
    CU_ASSERT_EQUAL(tls_url_is_tls("tls+tcp://127.0.0.1:7000"), 1);
    CU_ASSERT_EQUAL(tls_url_is_tls("tls+tcp4://h:1"), 1);
    CU_ASSERT_EQUAL(tls_url_is_tls("tls+tcp6://[::1]:1"), 1);
    CU_ASSERT_EQUAL(tls_url_is_tls("tcp://127.0.0.1:7000"), 0);
    CU_ASSERT_EQUAL(tls_url_is_tls("tls+tcpx://h:1"), 0);
    CU_ASSERT_EQUAL(tls_url_is_tls("ipc:///tmp/x"), 0);
    CU_ASSERT_EQUAL(tls_url_is_tls(""), 0);
    CU_ASSERT_EQUAL(tls_url_is_tls(NULL), 0);
}

static void test_url_with_host(void)
{
    char out[128];
    CU_ASSERT_EQUAL(tls_url_with_host("tcp://0.0.0.0:7001", "10.0.0.5", out, sizeof(out)), 0);
    CU_ASSERT_STRING_EQUAL(out, "tcp://10.0.0.5:7001");
    CU_ASSERT_EQUAL(tls_url_with_host("tls+tcp://0.0.0.0:9", "host-b", out, sizeof(out)), 0);
    CU_ASSERT_STRING_EQUAL(out, "tls+tcp://host-b:9");
    CU_ASSERT_EQUAL(tls_url_with_host("tcp://[::]:7001", "10.0.0.5", out, sizeof(out)), 0);
    CU_ASSERT_STRING_EQUAL(out, "tcp://10.0.0.5:7001");
    CU_ASSERT_EQUAL(tls_url_with_host("tcp://0.0.0.0:7001", "fd00::5", out, sizeof(out)), 0);
    CU_ASSERT_STRING_EQUAL(out, "tcp://[fd00::5]:7001");
    CU_ASSERT_EQUAL(tls_url_with_host("ipc:///tmp/a.ipc", "10.0.0.5", out, sizeof(out)), 0);
    CU_ASSERT_STRING_EQUAL(out, "ipc:///tmp/a.ipc");
    CU_ASSERT_EQUAL(tls_url_with_host("tcp://nohostport", "h", out, sizeof(out)), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(tls_url_with_host("no-scheme", "h", out, sizeof(out)), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(tls_url_with_host("tcp://0.0.0.0:7001", "10.0.0.5", out, 10), TANDEM_ETOOBIG);
}

static void test_init_errors(void)
{
    char err[512] = "";
    CU_ASSERT_EQUAL(tls_init(NULL, NULL, NULL, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tls_enabled(), 0);
    CU_ASSERT_EQUAL(tls_init("/a", NULL, "/c", err, sizeof(err)), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "missing: --tls-cert)"));
    CU_ASSERT_EQUAL(tls_init("/nonexistent/ca.crt", "/x", "/y", err, sizeof(err)), TANDEM_ENOENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--tls-ca /nonexistent/ca.crt"));
    CU_ASSERT_EQUAL(tls_enabled(), 0);
    if (!have_certs) {
        CU_FAIL("no certificates (openssl)");
        return;
    }
    char ca[300], cert[300], key[300], junk[300], rogue_key[300];
    path(ca, sizeof(ca), "ca/ca.crt");
    path(cert, sizeof(cert), "ca/node.crt");
    path(key, sizeof(key), "ca/node.key");
    path(junk, sizeof(junk), "junk.pem");
    path(rogue_key, sizeof(rogue_key), "other/rogue.key");
    CU_ASSERT_EQUAL(tls_init(junk, cert, key, err, sizeof(err)), TANDEM_ECONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "--tls-ca"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "not a PEM file"));
    /* A key that is not the certificate's, found by the self-check. */
    CU_ASSERT_EQUAL(tls_init(ca, cert, rogue_key, err, sizeof(err)), TANDEM_ECONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "handshake with itself failed"));
    CU_ASSERT_EQUAL(tls_enabled(), 0);
    /* A certificate and key another CA signed. */
    char rogue_cert[300];
    path(rogue_cert, sizeof(rogue_cert), "other/rogue.crt");
    CU_ASSERT_EQUAL(tls_init(ca, rogue_cert, rogue_key, err, sizeof(err)), TANDEM_ECONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "the CA did not sign the certificate"));
    CU_ASSERT_EQUAL(tls_enabled(), 0);
    CU_ASSERT_EQUAL(tls_init(ca, cert, key, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tls_enabled(), 1);
    tls_fini();
    CU_ASSERT_EQUAL(tls_enabled(), 0);
}

static void test_needs_config(void)
{
    nng_socket s;
    CU_ASSERT_EQUAL_FATAL(nng_pair0_open(&s), 0);
    CU_ASSERT_EQUAL(tls_listen(s, "tls+tcp://127.0.0.1:0", NULL), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(tls_error_detail(), "--tls-ca, --tls-cert and --tls-key"));
    CU_ASSERT_EQUAL(tls_dial(s, "tls+tcp://127.0.0.1:1", NULL, NNG_FLAG_NONBLOCK), TANDEM_EINVAL);
    CU_ASSERT_EQUAL(tls_listen(s, "foo://bar", NULL), TANDEM_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(tls_error_detail(), "not a usable NNG address"));
    /* Plain tcp is untouched. */
    nng_listener l;
    CU_ASSERT_EQUAL(tls_listen(s, "tcp://127.0.0.1:0", &l), 0);
    int port = 0;
    CU_ASSERT_EQUAL(nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    nng_socket s2;
    CU_ASSERT_EQUAL_FATAL(nng_pair0_open(&s2), 0);
    CU_ASSERT_EQUAL(tls_listen(s2, url, NULL), TANDEM_EBUSY);
    nng_close(s2);
    nng_close(s);
}

/* Sends "ping" from c to s and returns 0 when it arrives. */
static int ping(nng_socket c, nng_socket s)
{
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
    if (nng_send(c, "ping", 5, 0) != 0) {
        return -1;
    }
    char *buf = NULL;
    size_t n = 0;
    int rv = nng_recv(s, &buf, &n, NNG_FLAG_ALLOC);
    int ok = rv == 0 && n == 5 && strcmp(buf, "ping") == 0;
    if (rv == 0) {
        nng_free(buf, n);
    }
    return ok ? 0 : -1;
}

static void test_mutual(void)
{
    if (!have_certs) {
        CU_FAIL("no certificates (openssl)");
        return;
    }
    char ca[300], cert[300], key[300], err[512] = "";
    path(ca, sizeof(ca), "ca/ca.crt");
    path(cert, sizeof(cert), "ca/node.crt");
    path(key, sizeof(key), "ca/node.key");
    CU_ASSERT_EQUAL_FATAL(tls_init(ca, cert, key, err, sizeof(err)), 0);

    nng_socket srv, cli, rogue;
    CU_ASSERT_EQUAL_FATAL(nng_pair0_open(&srv), 0);
    CU_ASSERT_EQUAL_FATAL(nng_pair0_open(&cli), 0);
    CU_ASSERT_EQUAL_FATAL(nng_pair0_open(&rogue), 0);
    nng_listener l;
    CU_ASSERT_EQUAL_FATAL(tls_listen(srv, "tls+tcp://127.0.0.1:0", &l), 0);
    int port = 0;
    CU_ASSERT_EQUAL(nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port), 0);
    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);

    /* A certificate from another CA (trusting ours) is refused. */
    char rogue_pem[300];
    path(rogue_pem, sizeof(rogue_pem), "rogue.pem");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "cat %s/other/rogue.crt %s/other/rogue.key > %s", dir, dir,
             rogue_pem);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    nng_tls_config *rc;
    CU_ASSERT_EQUAL_FATAL(nng_tls_config_alloc(&rc, NNG_TLS_MODE_CLIENT), 0);
    CU_ASSERT_EQUAL(nng_tls_config_ca_file(rc, ca), 0);
    CU_ASSERT_EQUAL(nng_tls_config_cert_key_file(rc, rogue_pem, NULL), 0);
    CU_ASSERT_EQUAL(nng_tls_config_auth_mode(rc, NNG_TLS_AUTH_MODE_REQUIRED), 0);
    nng_dialer d;
    CU_ASSERT_EQUAL_FATAL(nng_dialer_create(&d, rogue, url), 0);
    CU_ASSERT_EQUAL(nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, rc), 0);
    int rv = nng_dialer_start(d, 0);
    CU_ASSERT_NOT_EQUAL(rv, 0);
    nng_tls_config_free(rc);

    /* Plain tcp to a TLS listener gets nowhere either. */
    nng_socket plain;
    CU_ASSERT_EQUAL_FATAL(nng_pair0_open(&plain), 0);
    char purl[64];
    snprintf(purl, sizeof(purl), "tcp://127.0.0.1:%d", port);
    CU_ASSERT_EQUAL(tls_dial(plain, purl, NULL, NNG_FLAG_NONBLOCK), 0);
    nng_socket_set_ms(srv, NNG_OPT_RECVTIMEO, 300);
    nng_send(plain, "x", 2, NNG_FLAG_NONBLOCK);
    char *buf = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL(nng_recv(srv, &buf, &n, NNG_FLAG_ALLOC), NNG_ETIMEDOUT);
    nng_close(plain);

    /* The cluster's own certificate gets through, both ways. */
    CU_ASSERT_EQUAL_FATAL(tls_dial(cli, url, NULL, 0), 0);
    CU_ASSERT_EQUAL(ping(cli, srv), 0);
    CU_ASSERT_EQUAL(ping(srv, cli), 0);

    nng_close(rogue);
    nng_close(cli);
    nng_close(srv);
    tls_fini();
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tls", suite_init, suite_fini);
    CU_add_test(s, "url_is_tls", test_url_is_tls);
    CU_add_test(s, "url_with_host", test_url_with_host);
    CU_add_test(s, "init_errors", test_init_errors);
    CU_add_test(s, "needs_config", test_needs_config);
    CU_add_test(s, "mutual", test_mutual);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    nng_fini();
    return failed ? 1 : 0;
}
