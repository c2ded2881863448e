/* Mutual TLS on NNG's tls+tcp:// transport, for tandem-router and the
 * workers (docs/multi-host.md).
 *
 * One process-wide configuration, loaded once from main() by tls_init from
 * three PEM files: the cluster CA, this process's certificate and its key.
 * Every socket that dials or listens goes through tls_dial / tls_listen (or
 * tls_dialer_apply for a dialer created by hand): for a tls+tcp:// URL they
 * attach the configuration before starting the endpoint; for any other
 * scheme they are plain nng_dial / nng_listen. Both ends require and verify
 * the peer's certificate against the CA (NNG_TLS_AUTH_MODE_REQUIRED), so a
 * process whose certificate another CA signed is refused during the
 * handshake. Host names are not checked (NNG 1.5 sets no server name): the
 * cluster CA is the trust boundary.
 *
 * Thread: tls_init and tls_fini from main() only, before the first and
 * after the last socket; the rest from any thread once tls_init returned. */
#ifndef TANDEM_TLS_H
#define TANDEM_TLS_H

#include <nng/nng.h>
#include <stddef.h>

/* The flag names every binary uses for the three files. */
#define TLS_FLAG_CA   "tls-ca"
#define TLS_FLAG_CERT "tls-cert"
#define TLS_FLAG_KEY  "tls-key"

/* Loads the CA, certificate and key (PEM paths; all NULL: TLS off) into a
 * client and a server configuration. Returns 0; TANDEM_EINVAL when only
 * some of the three are given; TANDEM_ENOENT / TANDEM_EIO when a file cannot
 * be read; TANDEM_ECONFIG when TLS refuses one (not PEM, key does not match
 * the certificate); TANDEM_EUNSUPPORTED when NNG was built without TLS;
 * TANDEM_ENOMEM. On failure err names the flag and the file, and TLS stays
 * off. Calling it again replaces the configuration. */
int tls_init(const char *ca, const char *cert, const char *key, char *err, size_t errlen);

/* Drops the process's configurations (endpoints keep their own reference). */
void tls_fini(void);

/* 1 when tls_init loaded a configuration. */
int tls_enabled(void);

/* 1 when url's scheme is tls+tcp, tls+tcp4 or tls+tcp6. */
int tls_url_is_tls(const char *url);

/* nng_listen(s, url, out, 0) with the server configuration attached first
 * when url is tls+tcp://. out may be NULL. Returns 0; TANDEM_EINVAL for a
 * URL NNG cannot parse or bind (bad scheme or address) or a tls+tcp:// URL
 * without tls_init; TANDEM_EBUSY when the address is in use; otherwise
 * wire_nng_err's code. The reason goes to tls_error_detail(). */
int tls_listen(nng_socket s, const char *url, nng_listener *out);

/* nng_dial(s, url, out, flags) with the client configuration attached first
 * when url is tls+tcp://. flags: 0 or NNG_FLAG_NONBLOCK. Returns as
 * tls_listen (no TANDEM_EBUSY). */
int tls_dial(nng_socket s, const char *url, nng_dialer *out, int flags);

/* Attaches the client configuration to a dialer created (not yet started)
 * for url, when url is tls+tcp://; nothing otherwise. Returns 0,
 * TANDEM_EINVAL (tls+tcp:// without tls_init) or wire_nng_err's code. */
int tls_dialer_apply(nng_dialer d, const char *url);

/* Writes url with its host replaced by host, for addresses announced to
 * others when listening on a wildcard: ("tcp://0.0.0.0:7001", "10.0.0.5")
 * -> "tcp://10.0.0.5:7001"; an IPv6 host gets brackets. URLs without a
 * host (ipc://, inproc://) are copied unchanged. Returns 0, TANDEM_EINVAL
 * (no "://" or no ":port" after the host) or TANDEM_ETOOBIG (cap). */
int tls_url_with_host(const char *url, const char *host, char *out, size_t cap);

/* Why the last tls_* call on this thread failed, e.g. "tls+tcp:// needs
 * --tls-ca, --tls-cert and --tls-key". "" if none yet. */
const char *tls_error_detail(void);

#endif
