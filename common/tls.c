#include "tls.h"

#include <errno.h>
#include <nng/protocol/pair0/pair.h>
#include <nng/supplemental/tls/tls.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"
#include "wire.h"

#define TLS_MAX_FILE (1u << 20) /* a PEM bundle larger than this is not one */

static nng_tls_config *client_cfg, *server_cfg;
static _Thread_local char tls_detail[256];

const char *tls_error_detail(void)
{
    return tls_detail;
}

static int fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_detail, sizeof(tls_detail), fmt, ap);
    va_end(ap);
    return rc;
}

int tls_url_is_tls(const char *url)
{
    return url != NULL && strncmp(url, "tls+tcp", 7) == 0 &&
           (strncmp(url + 7, "://", 3) == 0 || strncmp(url + 7, "4://", 4) == 0 ||
            strncmp(url + 7, "6://", 4) == 0);
}

int tls_enabled(void)
{
    return client_cfg != NULL;
}

/* Reads a whole PEM file into a NUL-terminated buffer (caller frees). */
static int read_pem(const char *flag, const char *path, char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        snprintf(err, errlen, "--%s %s: %s", flag, path, strerror(e));
        return e == ENOENT ? TANDEM_ENOENT : TANDEM_EIO;
    }
    char *buf = malloc(TLS_MAX_FILE + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, errlen, "--%s %s: out of memory", flag, path);
        return TANDEM_ENOMEM;
    }
    size_t n = fread(buf, 1, TLS_MAX_FILE + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > TLS_MAX_FILE || n == 0) {
        free(buf);
        snprintf(err, errlen, "--%s %s: %s", flag, path,
                 bad ? "read error" : (n == 0 ? "empty file" : "larger than 1 MiB"));
        return n == 0 && !bad ? TANDEM_ECONFIG : TANDEM_EIO;
    }
    buf[n] = '\0';
    if (strstr(buf, "-----BEGIN ") == NULL) {
        free(buf);
        snprintf(err, errlen, "--%s %s: not a PEM file", flag, path);
        return TANDEM_ECONFIG;
    }
    *out = buf;
    return 0;
}

/* One configuration (client or server) from the files already read. */
static int make_config(nng_tls_mode mode, const char *ca, const char *ca_pem, const char *cert_pem,
                       const char *key_pem, nng_tls_config **out, char *err, size_t errlen)
{
    nng_tls_config *c;
    int rv = nng_tls_config_alloc(&c, mode);
    if (rv != 0) {
        snprintf(err, errlen, "TLS: %s (is NNG built with TLS?)", nng_strerror(rv));
        return rv == NNG_ENOMEM ? TANDEM_ENOMEM : TANDEM_EUNSUPPORTED;
    }
    rv = nng_tls_config_ca_chain(c, ca_pem, NULL);
    if (rv != 0) {
        snprintf(err, errlen, "--%s %s: not a usable CA certificate (%s)", TLS_FLAG_CA, ca,
                 nng_strerror(rv));
        goto fail;
    }
    rv = nng_tls_config_own_cert(c, cert_pem, key_pem, NULL);
    if (rv != 0) {
        snprintf(err, errlen,
                 "--%s / --%s: not a usable certificate and private key, or the key does not "
                 "match the certificate (%s)",
                 TLS_FLAG_CERT, TLS_FLAG_KEY, nng_strerror(rv));
        goto fail;
    }
    rv = nng_tls_config_auth_mode(c, NNG_TLS_AUTH_MODE_REQUIRED);
    if (rv != 0) {
        snprintf(err, errlen, "TLS: %s", nng_strerror(rv));
        goto fail;
    }
    *out = c;
    return 0;

fail:
    nng_tls_config_free(c);
    return TANDEM_ECONFIG;
}

/* A handshake of the two configurations with each other over loopback: TLS
 * accepts a key that is not the certificate's, or a certificate another CA
 * signed, until the first peer meets it; this finds out at start instead. */
static int self_check(const char *ca, const char *cert, const char *key, char *err, size_t errlen)
{
    nng_socket srv, cli;
    int rv = nng_pair0_open(&srv);
    if (rv != 0) {
        snprintf(err, errlen, "TLS self-check: %s", nng_strerror(rv));
        return wire_nng_err(rv);
    }
    rv = nng_pair0_open(&cli);
    if (rv != 0) {
        nng_close(srv);
        snprintf(err, errlen, "TLS self-check: %s", nng_strerror(rv));
        return wire_nng_err(rv);
    }
    nng_listener l;
    nng_dialer d;
    int port = 0;
    char url[64];
    rv = nng_listener_create(&l, srv, "tls+tcp://127.0.0.1:0");
    if (rv == 0) {
        rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, server_cfg);
    }
    if (rv == 0) {
        rv = nng_listener_start(l, 0);
    }
    if (rv == 0) {
        rv = nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port);
    }
    if (rv == 0) {
        snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
        rv = nng_dialer_create(&d, cli, url);
    }
    if (rv == 0) {
        rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, client_cfg);
    }
    if (rv == 0) {
        rv = nng_dialer_start(d, 0);
    }
    /* One message across, so both ends have finished their handshake before
     * the close: NNG 1.5.2 can leak a TLS connection closed while the
     * listener's side of the handshake is still running (seen under ASan). */
    if (rv == 0) {
        rv = nng_socket_set_ms(srv, NNG_OPT_RECVTIMEO, 2000);
    }
    if (rv == 0) {
        rv = nng_send(cli, "tandem", 6, 0);
    }
    if (rv == 0) {
        char buf[8];
        size_t n = sizeof(buf);
        rv = nng_recv(srv, buf, &n, 0);
    }
    nng_close(cli);
    nng_close(srv);
    if (rv == NNG_ECRYPTO || rv == NNG_EPEERAUTH || rv == NNG_ECLOSED || rv == NNG_ECONNSHUT) {
        snprintf(err, errlen,
                 "--%s %s / --%s %s / --%s %s: a TLS handshake with itself failed (%s): the key "
                 "is not the certificate's, or the CA did not sign the certificate",
                 TLS_FLAG_CA, ca, TLS_FLAG_CERT, cert, TLS_FLAG_KEY, key, nng_strerror(rv));
        return TANDEM_ECONFIG;
    }
    /* Any other failure (no loopback TCP here) says nothing about the files:
     * the real links will tell. */
    return 0;
}

void tls_fini(void)
{
    if (client_cfg != NULL) {
        nng_tls_config_free(client_cfg);
        client_cfg = NULL;
    }
    if (server_cfg != NULL) {
        nng_tls_config_free(server_cfg);
        server_cfg = NULL;
    }
}

int tls_init(const char *ca, const char *cert, const char *key, char *err, size_t errlen)
{
    tls_fini();
    int given = (ca != NULL) + (cert != NULL) + (key != NULL);
    if (given == 0) {
        return 0;
    }
    if (given < 3) {
        snprintf(err, errlen, "mutual TLS needs --%s, --%s and --%s together (missing:%s%s%s)",
                 TLS_FLAG_CA, TLS_FLAG_CERT, TLS_FLAG_KEY, ca ? "" : " --" TLS_FLAG_CA,
                 cert ? "" : " --" TLS_FLAG_CERT, key ? "" : " --" TLS_FLAG_KEY);
        return TANDEM_EINVAL;
    }
    char *ca_pem = NULL, *cert_pem = NULL, *key_pem = NULL;
    int rc = read_pem(TLS_FLAG_CA, ca, &ca_pem, err, errlen);
    if (rc == 0) {
        rc = read_pem(TLS_FLAG_CERT, cert, &cert_pem, err, errlen);
    }
    if (rc == 0) {
        rc = read_pem(TLS_FLAG_KEY, key, &key_pem, err, errlen);
    }
    if (rc == 0) {
        rc = make_config(NNG_TLS_MODE_CLIENT, ca, ca_pem, cert_pem, key_pem, &client_cfg, err,
                         errlen);
    }
    if (rc == 0) {
        rc = make_config(NNG_TLS_MODE_SERVER, ca, ca_pem, cert_pem, key_pem, &server_cfg, err,
                         errlen);
    }
    free(key_pem);
    free(cert_pem);
    free(ca_pem);
    if (rc == 0) {
        rc = self_check(ca, cert, key, err, errlen);
    }
    if (rc != 0) {
        tls_fini();
    }
    return rc;
}

/* NNG's answer to a bad URL or address, as a project code. */
static int endpoint_err(int rv)
{
    if (rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP || rv == NNG_EINVAL) {
        return fail(TANDEM_EINVAL,
                    "not a usable NNG address: %s (e.g. tcp://127.0.0.1:7000, "
                    "tls+tcp://10.0.0.2:7000, ipc:///tmp/x.ipc)",
                    nng_strerror(rv));
    }
    if (rv == NNG_EADDRINUSE) {
        return fail(TANDEM_EBUSY, "%s", nng_strerror(rv));
    }
    int rc = wire_nng_err(rv);
    fail(rc, "%s", nng_strerror(rv));
    return rc;
}

static int need_config(void)
{
    return fail(TANDEM_EINVAL, "tls+tcp:// needs --%s, --%s and --%s", TLS_FLAG_CA, TLS_FLAG_CERT,
                TLS_FLAG_KEY);
}

int tls_dialer_apply(nng_dialer d, const char *url)
{
    if (!tls_url_is_tls(url)) {
        return 0;
    }
    if (client_cfg == NULL) {
        return need_config();
    }
    int rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, client_cfg);
    return rv == 0 ? 0 : endpoint_err(rv);
}

int tls_listen(nng_socket s, const char *url, nng_listener *out)
{
    tls_detail[0] = '\0';
    if (url == NULL) {
        return fail(TANDEM_EINVAL, "no address");
    }
    if (tls_url_is_tls(url) && server_cfg == NULL) {
        return need_config();
    }
    nng_listener l;
    int rv = nng_listener_create(&l, s, url);
    if (rv != 0) {
        return endpoint_err(rv);
    }
    if (tls_url_is_tls(url)) {
        rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, server_cfg);
    }
    if (rv == 0) {
        rv = nng_listener_start(l, 0);
    }
    if (rv != 0) {
        nng_listener_close(l);
        return endpoint_err(rv);
    }
    if (out != NULL) {
        *out = l;
    }
    return 0;
}

int tls_dial(nng_socket s, const char *url, nng_dialer *out, int flags)
{
    tls_detail[0] = '\0';
    if (url == NULL) {
        return fail(TANDEM_EINVAL, "no address");
    }
    nng_dialer d;
    int rv = nng_dialer_create(&d, s, url);
    if (rv != 0) {
        return endpoint_err(rv);
    }
    int rc = tls_dialer_apply(d, url);
    if (rc != 0) {
        nng_dialer_close(d);
        return rc;
    }
    rv = nng_dialer_start(d, flags & NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        nng_dialer_close(d);
        return endpoint_err(rv);
    }
    if (out != NULL) {
        *out = d;
    }
    return 0;
}

int tls_url_with_host(const char *url, const char *host, char *out, size_t cap)
{
    const char *sep = strstr(url, "://");
    if (sep == NULL) {
        return TANDEM_EINVAL;
    }
    size_t scheme_len = (size_t)(sep - url);
    int n;
    if ((scheme_len == 3 && strncmp(url, "ipc", 3) == 0) ||
        (scheme_len == 6 && strncmp(url, "inproc", 6) == 0)) {
        n = snprintf(out, cap, "%s", url);
        return n >= 0 && (size_t)n < cap ? 0 : TANDEM_ETOOBIG;
    }
    const char *h = sep + 3;
    const char *port = h[0] == '[' ? strstr(h, "]:") : strrchr(h, ':');
    if (port == NULL || port < h) {
        return TANDEM_EINVAL;
    }
    if (h[0] == '[') {
        port++; /* past the ']' */
    }
    int v6 = strchr(host, ':') != NULL && host[0] != '[';
    n = snprintf(out, cap, "%.*s%s%s%s%s", (int)(scheme_len + 3), url, v6 ? "[" : "", host,
                 v6 ? "]" : "", port);
    return n >= 0 && (size_t)n < cap ? 0 : TANDEM_ETOOBIG;
}
