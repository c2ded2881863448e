/* HTTP/1.1 server on a libuv loop, shared by the router's OpenAI front end and
 * the workers' /metrics port.
 *
 * Parsing is Debian's http-parser 2.9 (callback API, fed straight from libuv's
 * reads, safe at any byte boundary). Every resource a client can make us hold
 * is bounded: header bytes (431, 414 for the URL), body bytes (413),
 * connections (503), parsed-but-unanswered requests per connection (reading
 * stops until responses drain), unsent response bytes per connection (the
 * connection is closed), and time: a request must arrive whole within
 * request_timeout_ms of its first byte (408, then close) and a keep-alive
 * connection with nothing in flight is closed silently after idle_timeout_ms.
 *
 * Pipelining: requests are parsed ahead and handed to the handler as soon as
 * each is complete, but responses go out strictly in request order; a response
 * produced early (or a stream started early) is buffered until every earlier
 * response on the connection has ended.
 *
 * Request lifetime: a struct http_req is reference counted. The connection
 * holds one reference until the response has ended (or the client went away).
 * The handler borrows the request during its callback; to answer later
 * (asynchronously, or streaming) it takes its own reference with
 * http_req_ref() and drops it with http_req_unref() when done, typically
 * after http_req_end()/http_req_respond(). If the client goes away first, the
 * abort callback set with http_req_on_abort() runs (from the loop, never from
 * inside an http_req_* call), every later write returns TANDEM_ECLOSED and
 * does nothing, and the memory stays valid until the last reference is
 * dropped. Memory is freed from the loop, never inside the call that dropped
 * the last reference. If a handler returns without answering and without
 * taking a reference, the server answers 500 (or ends the started stream).
 *
 * Threads: everything here runs on the loop's thread (handler, abort and
 * close callbacks included), and every function must be called from it. */
#ifndef TANDEM_HTTP_H
#define TANDEM_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

#define HTTP_DEFAULT_HOST "127.0.0.1"
#define HTTP_DEFAULT_PORT 8000

struct http_config {
    size_t max_header_bytes;     /* request line + header fields; 431 beyond (414 when the URL
                                  * alone is too long). http-parser caps it at 80 KiB. */
    size_t max_body_bytes;       /* decoded request body; 413 beyond */
    unsigned max_connections;    /* open connections; beyond, 503 then close */
    unsigned max_pipelined;      /* parsed requests waiting on one connection before reading
                                  * pauses (>= 1) */
    size_t max_output_bytes;     /* unsent response bytes on one connection (a client that
                                  * does not read) before it is closed */
    uint64_t request_timeout_ms; /* first byte of a request to its last: 408 then close */
    uint64_t idle_timeout_ms;    /* keep-alive connection with nothing in flight: close */
    uint64_t linger_ms;          /* after a final response (Connection: close, errors), how
                                  * long unread input is drained so the client sees the
                                  * response rather than a reset */
    int date_header;             /* send Date: on every response (1 by default) */
};

struct http_req;
struct http_server;
struct http_conn;

/* Called once per complete request, on the loop thread. req is borrowed for the
 * duration of the call (see the lifetime rules above). */
typedef void (*http_handler_fn)(struct http_req *req, void *user);
/* Called at most once, on the loop thread, when the client goes away (or the
 * server closes) before the response ended. The request is still valid; the
 * callee typically cancels its work and drops its reference. */
typedef void (*http_abort_fn)(struct http_req *req, void *arg);
/* Called once the server and every connection and request are gone; the
 * memory holding the server may then be freed. */
typedef void (*http_close_fn)(struct http_server *srv);

struct http_server_stats {
    uint64_t connections_accepted; /* total, rejected ones included */
    uint64_t connections_rejected; /* over max_connections (503) */
    uint64_t requests;             /* handed to the handler */
    uint64_t errors;               /* answered by the server itself: 400, 408, 413, 414, 431 */
    uint64_t aborted;              /* handed to the handler, client gone before the end */
    unsigned connections_open;     /* including rejected ones still closing */
    unsigned requests_live;        /* request objects not yet freed */
};

/* Embedded by its owner (get back with container_of). All fields are private. */
struct http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_idle_t deferred; /* runs abort callbacks, resumes and frees outside callers */
    struct http_config cfg;
    http_handler_fn handler;
    void *user;
    http_close_fn close_cb;
    struct http_conn *conns; /* doubly linked, every open or closing connection */
    struct http_req *abort_head, *abort_tail;
    struct http_req *free_head;
    struct http_conn *resume_head;
    char *rbuf; /* (HTTP_READ_BUF) shared read buffer: input is parsed inside read_cb */
    int rbuf_busy;
    int listening, closing, graceful, finished, listener_open, deferred_active;
    unsigned n_conns, n_rejecting;
    struct http_server_stats stats;
    time_t date_sec;
    char date[64]; /* "Date: ...\r\n" for date_sec */
};

/* Fills cfg with the defaults: 16 KiB headers, 4 MiB body, 1024 connections,
 * 16 pipelined requests, 8 MiB unsent output, 30 s request timeout, 60 s idle
 * timeout, 2 s linger, Date header on. */
void http_config_default(struct http_config *cfg);

/* Initialises srv on loop. cfg NULL means the defaults; it is copied. handler
 * is required. Returns 0, TANDEM_EINVAL (bad config or NULL handler) or
 * TANDEM_ENOMEM. After success, srv must be closed with http_server_close()
 * even if it never listened. Loop thread. */
int http_server_init(struct http_server *srv, uv_loop_t *loop, const struct http_config *cfg,
                     http_handler_fn handler, void *user);

/* Binds host (NULL: 127.0.0.1; IPv4 or IPv6 literal) and port (0: ephemeral,
 * see http_server_port) and starts accepting. Returns 0, TANDEM_EINVAL (bad
 * address or already listening), TANDEM_EBUSY (address in use) or TANDEM_EUV. */
int http_server_listen(struct http_server *srv, const char *host, int port);

/* Returns the bound port (> 0), or TANDEM_EINVAL if not listening. */
int http_server_port(const struct http_server *srv);

/* Graceful stop: stops listening; every connection reads no more requests
 * (a half-received one is dropped) and, once its responses in flight have
 * ended (at once when none is), sends every queued byte, half-closes (the
 * client reads EOF after its whole response) and closes; a response that
 * starts from now on says Connection: close. cb (may be NULL) runs as for
 * http_server_close. Nothing here ends a response: the caller ends what it
 * still answers by its own deadline, and may then call http_server_close to
 * cut what is left (a client that does not read). Each flush is bounded by
 * request_timeout_ms, as for any closing response. Loop thread; later calls
 * are ignored. */
void http_server_shutdown(struct http_server *srv, http_close_fn cb);

/* Stops listening, closes every connection at once (pending requests get
 * their abort callback, unsent bytes are dropped) and calls cb (may be NULL)
 * once every handle is closed and every request freed, i.e. after handlers
 * have dropped their references. After http_server_shutdown it cuts what is
 * left (cb NULL keeps shutdown's). Safe to call from a handler or abort
 * callback; later calls are ignored. */
void http_server_close(struct http_server *srv, http_close_fn cb);

/* Copies the counters. */
void http_server_get_stats(const struct http_server *srv, struct http_server_stats *out);

/* ---- Request: valid from the handler call until the last reference is dropped. ---- */

/* "GET", "POST", ... Static string. */
const char *http_req_method(const struct http_req *req);
/* Request path without query or fragment, not percent-decoded ("/v1/models").
 * For absolute-form targets ("http://host/x") the path part. Owned by req. */
const char *http_req_path(const struct http_req *req);
/* Query string without the '?', "" if none. Owned by req. */
const char *http_req_query(const struct http_req *req);
/* Value of the first header named name (case-insensitive), trailing
 * whitespace removed; NULL if absent. Owned by req. */
const char *http_req_header(const struct http_req *req, const char *name);
/* Number of header fields, and the i-th (0-based, in arrival order). Returns 0
 * or TANDEM_ERANGE. Strings owned by req. */
size_t http_req_header_count(const struct http_req *req);
int http_req_header_at(const struct http_req *req, size_t i, const char **name, const char **value);
/* Decoded body (Content-Length or chunked), NUL-terminated for convenience;
 * *len (if not NULL) gets its length. "" when empty. Owned by req. */
const char *http_req_body(const struct http_req *req, size_t *len);
/* HTTP version of the request: 10 for HTTP/1.0, 11 for HTTP/1.1. */
int http_req_version(const struct http_req *req);
struct http_server *http_req_server(const struct http_req *req);

/* Takes / drops a reference. The last unref frees the request later from the
 * loop. Loop thread. */
void http_req_ref(struct http_req *req);
void http_req_unref(struct http_req *req);

/* Sets (or with fn NULL clears) the callback run if the client goes away
 * before the response ended. */
void http_req_on_abort(struct http_req *req, http_abort_fn fn, void *arg);
/* 1 once the client went away before the response ended, else 0. */
int http_req_is_aborted(const struct http_req *req);

/* Response headers are passed as a NULL-terminated array of name, value
 * pairs: (const char *[]){"Content-Type", "application/json", NULL}. NULL is
 * an empty list. Content-Length, Transfer-Encoding and Date are the server's;
 * passing them (or any header with CR, LF or a bad name) is TANDEM_EINVAL.
 * "Connection", "close" closes the connection after this response.
 *
 * Every response call returns 0, TANDEM_EINVAL (bad status 200..599, bad
 * headers, or wrong order: respond or start twice, write before start or after
 * end), TANDEM_ECLOSED (the client went away: nothing was sent) or
 * TANDEM_ENOMEM (the connection is closed). A response that cannot be sent yet
 * because an earlier pipelined one is still going is buffered (and counts
 * towards max_output_bytes). */

/* Whole response with Content-Length. body may be NULL when len is 0. */
int http_req_respond(struct http_req *req, int status, const char *const *headers, const void *body,
                     size_t len);
/* Starts a streamed response: Transfer-Encoding: chunked (for an HTTP/1.0
 * client, raw bytes and the connection closes at the end). */
int http_req_start(struct http_req *req, int status, const char *const *headers);
/* Starts a Server-Sent Events stream: 200, Content-Type: text/event-stream,
 * Cache-Control: no-cache, chunked, plus headers. */
int http_req_start_sse(struct http_req *req, const char *const *headers);
/* Writes one chunk (len 0 is a no-op: the empty chunk is the terminator). */
int http_req_write(struct http_req *req, const void *data, size_t len);
/* Writes one SSE event as one chunk: "event: <event>\n" if event is not NULL,
 * then "data: <line>\n" for each line of data (split at CR, LF or CRLF), then
 * "\n". The OpenAI stream is http_req_write_sse(req, NULL, json, len) and
 * finally "[DONE]". */
int http_req_write_sse(struct http_req *req, const char *event, const char *data, size_t len);
/* Holds req's response bytes in memory from now on, until http_req_uncork
 * sends them in one write (http_req_end sends them too). The bytes are the
 * same; only fewer, larger writes reach the socket. */
void http_req_cork(struct http_req *req);
/* Sends what http_req_cork held. Returns 0 or what a write returns. */
int http_req_uncork(struct http_req *req);
/* Ends a streamed response (the terminating chunk). */
int http_req_end(struct http_req *req);
/* Bytes accepted for this request's connection but not yet handed to the
 * kernel; 0 once the client is gone. For producers that want backpressure. */
size_t http_req_unsent_bytes(const struct http_req *req);

#endif
