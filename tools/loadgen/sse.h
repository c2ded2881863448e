/* Incremental Server-Sent Events parser (the WHATWG event-stream format), fed
 * the decoded HTTP body in pieces of any size.
 *
 * Lines end with CRLF, LF or CR (a CRLF split across two feeds counts once).
 * "data:" lines append their value (one leading space removed) plus "\n" to
 * the event's data; "event:" sets its name; lines starting with ':' are
 * comments (keep-alive pings); other fields ("id", "retry", unknown names)
 * are ignored. An empty line dispatches the event when it has data, with the
 * final "\n" removed, so `data: {...}\n\n` gives "{...}" and `data: [DONE]`
 * gives "[DONE]".
 *
 * At the end of the stream lg_sse_finish dispatches what is pending, even
 * without the blank line (a server that ends the body right after its last
 * `data:` line still delivers it), and reports a partial line as such.
 *
 * A line or an event longer than max_event bytes is refused (TANDEM_ETOOBIG)
 * so a garbled stream cannot grow memory without bound. Single-threaded. */
#ifndef TANDEM_LG_SSE_H
#define TANDEM_LG_SSE_H

#include <stddef.h>

/* Called for each event: name ("message" when the stream gave none), data
 * (NUL-terminated, valid during the call only). Return 0 to go on, or a
 * negative code to stop parsing: lg_sse_feed then returns that code. */
typedef int (*lg_sse_event_fn)(void *arg, const char *name, const char *data, size_t len);

struct lg_sse {
    char *line; /* current partial line */
    size_t line_len, line_cap;
    char *data; /* current event's data */
    size_t data_len, data_cap;
    char name[64];
    size_t max_event;
    int skip_lf;   /* the last byte was CR: an LF right after it is not a new line */
    int has_data;  /* at least one data: line in the current event */
    int failed;    /* a previous call failed: every call fails */
    size_t events; /* dispatched so far */
};

/* max_event 0 means 1 MiB. Never fails; no memory until the first feed. */
void lg_sse_init(struct lg_sse *p, size_t max_event);
void lg_sse_fini(struct lg_sse *p);
/* Forgets any partial input (for reuse on a new stream). */
void lg_sse_reset(struct lg_sse *p);

/* Parses len bytes, calling cb for every complete event. Returns 0,
 * TANDEM_ETOOBIG, TANDEM_ENOMEM or the callback's code. After an error every
 * later call returns TANDEM_EPROTO. */
int lg_sse_feed(struct lg_sse *p, const char *buf, size_t len, lg_sse_event_fn cb, void *arg);

/* End of stream: processes a pending partial line and dispatches a pending
 * event. Returns 0 or as lg_sse_feed. */
int lg_sse_finish(struct lg_sse *p, lg_sse_event_fn cb, void *arg);

#endif
