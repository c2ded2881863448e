/* HTTP/1.1 client on a libuv loop, for many concurrent requests to one
 * server (the load generator's only peer).
 *
 * One request at a time per connection (no pipelining); a connection whose
 * response ended cleanly with keep-alive goes to an idle pool and is reused
 * by the next request (most recently used first), else it is closed. Idle
 * connections keep reading so a server-side close is noticed at once. A
 * request that fails on a reused connection before any response byte arrived
 * (the server closed it while we were writing) is retried once on a new
 * connection. Responses are parsed with http-parser (Content-Length, chunked,
 * or until close), and the decoded body is handed over as it arrives.
 *
 * Every request ends exactly once, through on_done: success (a complete
 * response, whatever its status) or a failure with a reason (lg_fail in
 * summary.h): connect error, timeout (from lg_http_send to the end of the
 * response, retries included), connection closed early, read or write error,
 * malformed HTTP, or an error returned by on_headers/on_body.
 *
 * Threads: everything runs on the loop's thread. Callbacks are never called
 * from inside lg_http_send; lg_http_cancel and lg_http_client_close call
 * on_done before they return. */
#ifndef TANDEM_LG_HTTP_CLIENT_H
#define TANDEM_LG_HTTP_CLIENT_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "http_stats.h"
#include "summary.h"

struct lg_http_call;
struct lg_http_conn;

struct lg_http_call_ops {
    /* Status line and headers are in. content_type is "" when absent.
     * Return 0, or a negative code to fail the call with reason (set
     * *reason and msg; msg holds 256 bytes). */
    int (*on_headers)(struct lg_http_call *c, int status, const char *content_type,
                      enum lg_fail *reason, char *msg);
    /* A piece of the decoded body. Same return convention. */
    int (*on_body)(struct lg_http_call *c, const char *data, size_t len, enum lg_fail *reason,
                   char *msg);
    /* The end: err 0 (the response is complete) or a negative code with the
     * reason and a message. The call may be freed from here on. */
    void (*on_done)(struct lg_http_call *c, int err, enum lg_fail reason, const char *msg);
};

/* Embedded by its owner (get back with container_of). Fill ops and
 * timeout_ms; the rest is private. Valid from lg_http_send to on_done. */
struct lg_http_call {
    const struct lg_http_call_ops *ops;
    uint64_t timeout_ms; /* > 0 */
    /* private */
    struct lg_http_client *client;
    struct lg_http_conn *conn;
    char *wbuf; /* the request bytes, kept for a retry */
    size_t wlen;
    uint64_t deadline; /* uv_now() value */
    int retried;
};

/* Embedded by its owner. Fields are private. */
struct lg_http_client {
    uv_loop_t *loop;
    struct sockaddr_storage addr;
    char host_header[300]; /* "host:port" */
    char extra_headers[1024];
    struct lg_http_conn *idle; /* most recently used first */
    struct lg_http_conn *all;  /* every open or closing connection */
    char *rbuf;
    int closing;
    void (*close_cb)(struct lg_http_client *c);
    struct lg_http_client_stats stats;
    char last_error[256];
};

/* Resolves host (name or IPv4/IPv6 literal, blocking getaddrinfo: call before
 * the run starts) and initialises c. extra_headers is NULL or complete header
 * lines ("Authorization: Bearer x\r\n"), copied. Returns 0, TANDEM_EINVAL
 * (bad host or port, message in err), TANDEM_ENOMEM. */
int lg_http_client_init(struct lg_http_client *c, uv_loop_t *loop, const char *host, int port,
                        const char *extra_headers, char *err, size_t errlen);

/* Sends a request: method "GET" or "POST", path with its query, body (may be
 * NULL for len 0; copied) sent as application/json. Returns 0 (on_done will
 * follow), or a negative code without calling on_done: TANDEM_ENOMEM,
 * TANDEM_ECANCELLED (the client is closing), TANDEM_EIO (no socket: the
 * message is in c->last_error). */
int lg_http_send(struct lg_http_client *c, struct lg_http_call *call, const char *method,
                 const char *path, const char *body, size_t len);

/* Ends the call now with reason LG_FAIL_CANCELLED (its connection is closed);
 * on_done runs before this returns. No-op for a call not in flight. */
void lg_http_cancel(struct lg_http_call *call);

/* Cancels every call in flight (on_done runs for each before this returns),
 * closes every connection, and calls cb (may be NULL) once all are closed.
 * Later sends fail with TANDEM_ECANCELLED. */
void lg_http_client_close(struct lg_http_client *c, void (*cb)(struct lg_http_client *c));

void lg_http_client_stats(const struct lg_http_client *c, struct lg_http_client_stats *out);

/* Parses "http://host[:port][/prefix]" (IPv6 as [::1]). host gets the name
 * without brackets, prefix the path without a trailing '/' ("" if none).
 * Returns 0 or TANDEM_EINVAL (https, other schemes, bad port). */
int lg_parse_url(const char *url, char *host, size_t hostlen, int *port, char *prefix,
                 size_t prefixlen);

#endif
