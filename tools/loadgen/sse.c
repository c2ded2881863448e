#include "sse.h"

#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

#define SSE_DEFAULT_MAX (1u << 20)

void lg_sse_init(struct lg_sse *p, size_t max_event)
{
    memset(p, 0, sizeof(*p));
    p->max_event = max_event ? max_event : SSE_DEFAULT_MAX;
}

void lg_sse_fini(struct lg_sse *p)
{
    free(p->line);
    free(p->data);
    p->line = p->data = NULL;
    p->line_cap = p->data_cap = 0;
}

void lg_sse_reset(struct lg_sse *p)
{
    p->line_len = p->data_len = 0;
    p->name[0] = '\0';
    p->skip_lf = p->has_data = p->failed = 0;
    p->events = 0;
}

/* Grows *buf to hold need bytes plus a NUL. */
static int reserve(char **buf, size_t *cap, size_t need)
{
    if (need + 1 <= *cap) {
        return 0;
    }
    size_t n = *cap ? *cap : 256;
    while (n < need + 1) {
        n *= 2;
    }
    char *b = realloc(*buf, n);
    if (b == NULL) {
        return TANDEM_ENOMEM;
    }
    *buf = b;
    *cap = n;
    return 0;
}

static int dispatch(struct lg_sse *p, lg_sse_event_fn cb, void *arg)
{
    int rc = 0;
    if (p->has_data) {
        size_t len = p->data_len;
        if (len > 0 && p->data[len - 1] == '\n') {
            len--;
        }
        if (reserve(&p->data, &p->data_cap, len) != 0) {
            return TANDEM_ENOMEM;
        }
        p->data[len] = '\0';
        p->events++;
        rc = cb(arg, p->name[0] ? p->name : "message", p->data, len);
    }
    p->data_len = 0;
    p->has_data = 0;
    p->name[0] = '\0';
    return rc;
}

/* One complete line (without its terminator). */
static int process_line(struct lg_sse *p, const char *line, size_t len, lg_sse_event_fn cb,
                        void *arg)
{
    if (len == 0) {
        return dispatch(p, cb, arg);
    }
    if (line[0] == ':') {
        return 0;
    }
    const char *colon = memchr(line, ':', len);
    size_t flen = colon ? (size_t)(colon - line) : len;
    const char *val = colon ? colon + 1 : line + len;
    size_t vlen = colon ? len - flen - 1 : 0;
    if (vlen > 0 && val[0] == ' ') {
        val++;
        vlen--;
    }
    if (flen == 4 && memcmp(line, "data", 4) == 0) {
        if (p->data_len + vlen + 1 > p->max_event) {
            return TANDEM_ETOOBIG;
        }
        if (reserve(&p->data, &p->data_cap, p->data_len + vlen + 1) != 0) {
            return TANDEM_ENOMEM;
        }
        memcpy(p->data + p->data_len, val, vlen);
        p->data_len += vlen;
        p->data[p->data_len++] = '\n';
        p->has_data = 1;
    } else if (flen == 5 && memcmp(line, "event", 5) == 0) {
        size_t n = vlen < sizeof(p->name) - 1 ? vlen : sizeof(p->name) - 1;
        memcpy(p->name, val, n);
        p->name[n] = '\0';
    }
    return 0;
}

static int fail(struct lg_sse *p, int rc)
{
    p->failed = 1;
    return rc;
}

int lg_sse_feed(struct lg_sse *p, const char *buf, size_t len, lg_sse_event_fn cb, void *arg)
{
    if (p->failed) {
        return TANDEM_EPROTO;
    }
    size_t i = 0;
    while (i < len) {
        if (p->skip_lf) {
            p->skip_lf = 0;
            if (buf[i] == '\n') {
                i++;
                continue;
            }
        }
        /* Find the end of the line in this piece. */
        size_t j = i;
        while (j < len && buf[j] != '\n' && buf[j] != '\r') {
            j++;
        }
        if (j == len) { /* partial line: keep it */
            if (p->line_len + (j - i) > p->max_event) {
                return fail(p, TANDEM_ETOOBIG);
            }
            if (reserve(&p->line, &p->line_cap, p->line_len + (j - i)) != 0) {
                return fail(p, TANDEM_ENOMEM);
            }
            memcpy(p->line + p->line_len, buf + i, j - i);
            p->line_len += j - i;
            break;
        }
        int rc;
        if (p->line_len > 0) { /* completes a line started in an earlier piece */
            if (p->line_len + (j - i) > p->max_event) {
                return fail(p, TANDEM_ETOOBIG);
            }
            if (reserve(&p->line, &p->line_cap, p->line_len + (j - i)) != 0) {
                return fail(p, TANDEM_ENOMEM);
            }
            memcpy(p->line + p->line_len, buf + i, j - i);
            size_t n = p->line_len + (j - i);
            p->line_len = 0;
            rc = process_line(p, p->line, n, cb, arg);
        } else {
            rc = process_line(p, buf + i, j - i, cb, arg);
        }
        if (rc != 0) {
            return fail(p, rc);
        }
        p->skip_lf = buf[j] == '\r';
        i = j + 1;
    }
    return 0;
}

int lg_sse_finish(struct lg_sse *p, lg_sse_event_fn cb, void *arg)
{
    if (p->failed) {
        return TANDEM_EPROTO;
    }
    int rc = 0;
    if (p->line_len > 0) {
        size_t n = p->line_len;
        p->line_len = 0;
        rc = process_line(p, p->line, n, cb, arg);
    }
    if (rc == 0) {
        rc = dispatch(p, cb, arg);
    }
    p->skip_lf = 0;
    return rc != 0 ? fail(p, rc) : 0;
}
