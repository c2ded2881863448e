/* The `routing:` key of a cluster file: the path of an EndpointPickerConfig
 * file, or an inline mapping cut out of the cluster file's text as written
 * (so the router reads what the user wrote, with the same line numbers in its
 * messages). Either is validated with the router's own loader and plugin
 * table. */
#include "cluster.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "pipeline.h"
#include "tandem_err.h"
#include "yaml_node.h"

#include "cluster_int.h"

/* The length of the YAML line break at s (before to), or 0: "\r\n", "\r",
 * "\n", and, for libyaml, NEL, U+2028 and U+2029 too. */
static size_t yaml_break(const char *s, const char *to)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t left = (size_t)(to - s);
    if (left >= 2 && u[0] == '\r' && u[1] == '\n') {
        return 2;
    }
    if (left >= 1 && (u[0] == '\r' || u[0] == '\n')) {
        return 1;
    }
    if (left >= 2 && u[0] == 0xc2 && u[1] == 0x85) {
        return 2;
    }
    if (left >= 3 && u[0] == 0xe2 && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9)) {
        return 3;
    }
    return 0;
}

/* Copies [from, to) of the source and drops `col` columns of indentation from
 * every line (comment or blank lines with less are trimmed to their text). */
static char *dedent(const char *from, const char *to, int col)
{
    char *out = malloc((size_t)(to - from) + 2);
    if (!out) {
        return NULL;
    }
    size_t n = 0;
    const char *s = from;
    while (s < to) {
        /* Every YAML line break becomes "\n" (a lone "\r" ends a line for
         * libyaml too: found by fuzz_cluster_yaml), and the next line loses
         * its indentation. */
        const char *end = s;
        size_t brk = 0;
        while (end < to && (brk = yaml_break(end, to)) == 0) {
            end++;
        }
        int skip = 0;
        while (skip < col && s + skip < end && s[skip] == ' ') {
            skip++;
        }
        memcpy(out + n, s + skip, (size_t)(end - s - skip));
        n += (size_t)(end - s - skip);
        out[n++] = '\n';
        s = end + brk;
        if (brk == 0) {
            break;
        }
    }
    /* Trailing blank lines (up to the next key) go. */
    while (n >= 2 && out[n - 1] == '\n' && out[n - 2] == '\n') {
        n--;
    }
    while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\n')) {
        n--;
    }
    out[n++] = '\n';
    out[n] = '\0';
    return out;
}

/* Validates an EndpointPickerConfig (text, named name, or the file at path)
 * with the router's loader and plugin table, and notes the block size its
 * prefix scorers hash with. */
static int check_routing(struct loader *ld, int line, const char *text, const char *name,
                         const char *path)
{
    char rerr[RT_ERR_MAX];
    struct rt_config *cfg = NULL;
    struct rt_pipeline *pl = NULL;
    struct rt_pipeline_opts opts = {.max_endpoints = 4, .seed = 1};
    int rc = text ? rt_config_parse(&cfg, text, strlen(text), name, rerr, sizeof(rerr))
                  : rt_config_load(&cfg, path, rerr, sizeof(rerr));
    if (rc == 0) {
        rc = rt_pipeline_create(&pl, cfg, &opts, rerr, sizeof(rerr));
    }
    if (rc == TANDEM_ENOMEM) {
        rt_config_free(cfg);
        return rc;
    }
    if (rc < 0) {
        rt_config_free(cfg);
        return cluster_fail(ld, line, "routing: %s", rerr);
    }
    ld->routing_bs = 0;
    for (int i = 0; i < cfg->n_plugins; i++) {
        if (strstr(cfg->plugins[i].type, "prefix-cache-scorer")) {
            ld->routing_bs = rt_pipeline_block_size(pl);
        }
    }
    rt_pipeline_destroy(pl);
    rt_config_free(cfg);
    return 0;
}

/* The byte offset of character n of text (len bytes, UTF-8, as libyaml reads
 * it: a leading byte order mark is not a character), or len past the end.
 * libyaml's marks (index, column) count characters, not bytes: an offset
 * taken from them is wrong after the first multi-byte character (found by
 * fuzz_cluster_yaml). */
static size_t char_to_byte(const char *text, size_t len, size_t n)
{
    const unsigned char *t = (const unsigned char *)text;
    size_t i = len >= 3 && t[0] == 0xef && t[1] == 0xbb && t[2] == 0xbf ? 3 : 0;
    for (; i < len; i++) {
        if ((t[i] & 0xc0) != 0x80 && n-- == 0) {
            return i;
        }
    }
    return len;
}
int cluster_load_routing(struct loader *ld, const char *path, yaml_node_t *k, yaml_node_t *v,
                         void *base)
{
    struct cluster *c = base;
    c->routing_line = yn_line(k);
    if (v->type == YAML_SCALAR_NODE) {
        const char *s = yn_scalar(v);
        if (!*s) {
            return cluster_fail(
                ld, yn_line(v),
                "%s: expected the path of an EndpointPickerConfig file or an inline "
                "mapping",
                path);
        }
        int rc = cluster_resolve_path(ld, s, &c->routing_path);
        if (rc < 0) {
            return rc == TANDEM_ETOOBIG ? cluster_fail(ld, yn_line(v), "%s: path too long", path)
                                        : rc;
        }
        if (access(c->routing_path, R_OK) != 0) {
            return cluster_fail(ld, yn_line(v), "%s: cannot read '%s': %s", path, c->routing_path,
                                strerror(errno));
        }
        return check_routing(ld, c->routing_line, NULL, NULL, c->routing_path);
    }
    if (v->type != YAML_MAPPING_NODE) {
        return cluster_fail(
            ld, yn_line(v),
            "%s: expected the path of an EndpointPickerConfig file or an inline mapping", path);
    }
    /* libyaml's marks count characters; the text is bytes. */
    size_t start = v->start_mark.index, end_char = v->end_mark.index;
    size_t col = v->start_mark.column;
    if (start > end_char || col > start) {
        return cluster_fail(ld, yn_line(v), "%s: cannot locate the mapping in the file", path);
    }
    c->routing_flow = v->data.mapping.style == YAML_FLOW_MAPPING_STYLE;
    size_t from = char_to_byte(ld->text, ld->len, c->routing_flow ? start : start - col);
    size_t end = char_to_byte(ld->text, ld->len, end_char);
    if (end > ld->len || from > end) {
        return cluster_fail(ld, yn_line(v), "%s: cannot locate the mapping in the file", path);
    }
    /* The text handed to the router's loader keeps the cluster file's line
     * numbers: the mapping's own text, after as many newlines. */
    size_t pad = v->start_mark.line + (c->routing_flow ? col : 0);
    char *padded = malloc(pad + (end - from) + 1);
    if (!padded) {
        return TANDEM_ENOMEM;
    }
    memset(padded, '\n', v->start_mark.line);
    memset(padded + v->start_mark.line, ' ', pad - v->start_mark.line);
    memcpy(padded + pad, ld->text + from, end - from);
    padded[pad + end - from] = '\0';
    c->routing_text = dedent(ld->text + from, ld->text + end, c->routing_flow ? 0 : (int)col);
    if (!c->routing_text) {
        free(padded);
        return TANDEM_ENOMEM;
    }
    int rc = check_routing(ld, c->routing_line, padded, ld->source, NULL);
    free(padded);
    return rc;
}
