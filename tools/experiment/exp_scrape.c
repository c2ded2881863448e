/* Step timing of a live cluster's workers: see exp_scrape.h. */
#define _GNU_SOURCE
#include "exp_scrape.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "exp_util.h"
#include "tandem_err.h"

#define SCRAPE_TIMEOUT_S 5
#define SCRAPE_MAX_BODY  (16u << 20)

static int dial(const char *host, int port, char *err, size_t errlen)
{
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0) {
        exp_sfmt(err, errlen, "%s:%d: %s", host, port, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            continue;
        }
        struct timeval tv = {.tv_sec = SCRAPE_TIMEOUT_S};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        exp_sfmt(err, errlen, "%s:%d: cannot connect", host, port);
    }
    return fd;
}

int exp_http_get(const char *host, int port, const char *path, const char *bearer, char **body,
                 char *err, size_t errlen)
{
    *body = NULL;
    int fd = dial(host, port, err, errlen);
    if (fd < 0) {
        return TANDEM_EIO;
    }
    char req[1024];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n%s%s%s\r\n", path,
                     host, port, bearer ? "Authorization: Bearer " : "", bearer ? bearer : "",
                     bearer ? "\r\n" : "");
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    int rc = buf != NULL && n > 0 && write(fd, req, (size_t)n) == n ? 0 : TANDEM_EIO;
    while (rc == 0) {
        if (len + 1 == cap) {
            char *b = cap < SCRAPE_MAX_BODY ? realloc(buf, cap * 2) : NULL;
            if (b == NULL) {
                rc = TANDEM_EIO;
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r == 0) {
            break;
        }
        if (r < 0 && errno != EINTR) {
            rc = TANDEM_EIO;
        }
        len += r > 0 ? (size_t)r : 0;
    }
    close(fd);
    char *start = rc == 0 ? (buf[len] = '\0', strstr(buf, "\r\n\r\n")) : NULL;
    if (start == NULL || strncmp(buf, "HTTP/1.1 200", 12) != 0) {
        exp_sfmt(err, errlen, "GET http://%s:%d%s: %s", host, port, path,
                 rc != 0 ? "no answer" : "not a 200 answer");
        free(buf);
        return TANDEM_EIO;
    }
    memmove(buf, start + 4, len - (size_t)(start + 4 - buf) + 1);
    *body = buf;
    return 0;
}

double exp_prom_value(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = body; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
    }
    return NAN;
}

/* Adds one worker's totals (metrics at "host:port") to out. */
static int add_worker(const char *addr, struct exp_steps *out, char *err, size_t errlen)
{
    char host[256];
    exp_sfmt(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    if (colon == NULL) {
        exp_sfmt(err, errlen, "metrics address %s: no port", addr);
        return TANDEM_EPROTO;
    }
    *colon = '\0';
    int port = atoi(colon + 1);
    char *h = host;
    if (h[0] == '[' && colon > h && colon[-1] == ']') { /* [::1]:port */
        colon[-1] = '\0';
        h++;
    }
    char *body;
    int rc = exp_http_get(h, port, "/metrics", NULL, &body, err, errlen);
    if (rc != 0) {
        return rc;
    }
    double m = exp_prom_value(body, "tandem:step_modelled_seconds_sum");
    double o = exp_prom_value(body, "tandem:step_overrun_seconds_sum");
    free(body);
    if (!isfinite(m) || !isfinite(o)) {
        exp_sfmt(err, errlen, "worker %s exports no tandem:step_modelled_seconds", addr);
        return TANDEM_EPROTO;
    }
    out->modelled_s += m;
    out->overrun_s += o;
    out->workers++;
    return 0;
}

int exp_scrape_steps(const char *host, int port, struct exp_steps *out, char *err, size_t errlen)
{
    *out = (struct exp_steps){0};
    char *body;
    int rc = exp_http_get(host, port, "/v1/cluster", NULL, &body, err, errlen);
    if (rc != 0) {
        return rc;
    }
    json_error_t je;
    json_t *root = json_loads(body, 0, &je);
    free(body);
    json_t *eps = json_object_get(root, "endpoints");
    if (!json_is_array(eps)) {
        exp_sfmt(err, errlen, "the router's /v1/cluster has no endpoints");
        json_decref(root);
        return TANDEM_EPROTO;
    }
    size_t i;
    json_t *ep;
    json_array_foreach(eps, i, ep)
    {
        const char *addr = json_string_value(json_object_get(ep, "metrics_address"));
        if (rc == 0 && addr != NULL && addr[0] != '\0') {
            rc = add_worker(addr, out, err, errlen);
        }
    }
    json_decref(root);
    return rc;
}

double exp_steps_overrun(const struct exp_steps *before, const struct exp_steps *after)
{
    double m = after->modelled_s - before->modelled_s;
    double o = after->overrun_s - before->overrun_s;
    if (!(m > 0) || after->workers != before->workers) {
        return NAN;
    }
    return o / m;
}
