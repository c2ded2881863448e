/* Writing a cluster back (cluster_write, cluster_write_routing): a complete
 * file that cluster_parse reads back to the same structure. */
#include "cluster.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "tandem_err.h"
#include "wk_config.h"

#include "cluster_int.h"

/* The code point of the UTF-8 sequence at s (*len its bytes), or -1 when s
 * does not start a valid 2- or 3-byte sequence. */
static long utf8_at(const unsigned char *s, int *len)
{
    if (s[0] >= 0xc2 && s[0] <= 0xdf && (s[1] & 0xc0) == 0x80) {
        *len = 2;
        return ((long)(s[0] & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if ((s[0] & 0xf0) == 0xe0 && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80) {
        *len = 3;
        return ((long)(s[0] & 0x0f) << 12) | ((long)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    return -1;
}

/* s as a YAML double-quoted scalar that reads back as the same bytes. Besides
 * quotes, backslashes and C0 controls, YAML escapes what a reader would not
 * keep as is: DEL and the C1 controls (not printable), U+2028 and U+2029
 * (line breaks inside a quoted scalar, folded into a space on reading: found
 * by fuzz_cluster_yaml), the byte order mark and U+FFFE/U+FFFF. */
static void put_str(FILE *f, const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    while (*s) {
        unsigned char ch = *s;
        int len = 1;
        long cp = ch >= 0x80 ? utf8_at(s, &len) : -1;
        if (ch == '"' || ch == '\\') {
            fprintf(f, "\\%c", ch);
        } else if (ch < 0x20 || ch == 0x7f) {
            fprintf(f, "\\x%02x", ch);
        } else if ((cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff ||
                   cp == 0xfffe || cp == 0xffff) {
            fprintf(f, "\\u%04lx", cp);
        } else {
            fwrite(s, 1, (size_t)len, f);
        }
        s += len;
    }
    fputc('"', f);
}

static void put_kv(FILE *f, const char *indent, const char *key, const char *s)
{
    if (s) {
        fprintf(f, "%s%s: ", indent, key);
        put_str(f, s);
        fputc('\n', f);
    }
}

static void put_args(FILE *f, const char *indent, char **args, int n)
{
    if (n > 0) {
        fprintf(f, "%sargs: [", indent);
        for (int i = 0; i < n; i++) {
            if (i) {
                fputs(", ", f);
            }
            put_str(f, args[i]);
        }
        fputs("]\n", f);
    }
}

static void put_indented(FILE *f, const char *text, const char *indent)
{
    const char *s = text;
    while (*s) {
        const char *eol = strchr(s, '\n');
        size_t n = eol ? (size_t)(eol - s) : strlen(s);
        if (n) {
            fprintf(f, "%s%.*s\n", indent, (int)n, s);
        } else {
            fputc('\n', f);
        }
        s += n + (eol ? 1 : 0);
    }
}

/* A pool setting the pool gives, as "    key: value" (strings and choices
 * quoted). */
static void put_setting(FILE *f, const struct cluster_pool *p, int i)
{
    const struct setting *s = &wk_settings[i];
    char buf[PATH_MAX + 64];
    if (!(s->flags & SETTING_POOL) || !(p->set & cluster_bit(i)) ||
        settings_format(s, &p->cfg, buf, sizeof(buf)) < 0) {
        return;
    }
    if (s->type == FLAG_STR || s->type == FLAG_CHOICE) {
        put_kv(f, "    ", s->key, buf);
    } else {
        fprintf(f, "    %s: %s\n", s->key, buf);
    }
}

int cluster_write(const struct cluster *c, FILE *f)
{
    fprintf(f, "# tandem up cluster, resolved from %s (defaults filled in).\n", c->source);
    put_kv(f, "", "name", c->name);
    put_kv(f, "", "model", c->model);
    put_kv(f, "", "backend", c->backend);
    put_kv(f, "", "tokenizer", c->tokenizer);
    fprintf(f, "block_size: %d\n", c->block_size);
    put_kv(f, "", "log_level", c->log_level);
    fprintf(f, "router:\n");
    put_kv(f, "  ", "host", c->router_host);
    put_args(f, "  ", c->router_args, c->n_router_args);
    put_kv(f, "  ", "api_key_file", c->router_api_key_file);
    fprintf(f, "ports:\n  router: %d\n", c->router_port);
    if (c->transport == CLUSTER_TCP && c->announce_port >= 0) {
        fprintf(f, "  announce: %d\n", c->announce_port);
    }
    fprintf(f, "  metrics_base: %d\n", c->metrics_base);
    fprintf(f, "transport:\n  kind: %s\n", cluster_transport_names[c->transport]);
    if (c->transport == CLUSTER_TCP) {
        put_kv(f, "  ", "host", c->tcp_host);
        fprintf(f, "  base_port: %d\n", c->base_port);
    } else {
        put_kv(f, "  ", "dir", c->ipc_dir);
    }
    if (cluster_tls(c)) {
        fprintf(f, "tls:\n");
        put_kv(f, "  ", "ca", c->tls_ca);
        put_kv(f, "  ", "cert", c->tls_cert);
        put_kv(f, "  ", "key", c->tls_key);
    }
    if (c->routing_path) {
        put_kv(f, "", "routing", c->routing_path);
    } else if (c->routing_text && c->routing_flow) {
        fprintf(f, "routing: %s", c->routing_text);
    } else if (c->routing_text) {
        fprintf(f, "routing:\n");
        put_indented(f, c->routing_text, "  ");
    }
    fprintf(f, "pools:\n");
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        const struct cluster_pool *p = &c->pools[r];
        if (p->count == 0) {
            continue;
        }
        fprintf(f, "  %s:\n    count: %d\n", cluster_role_names[r], p->count);
        for (size_t i = 0; i < wk_n_settings; i++) {
            put_setting(f, p, (int)i);
        }
        put_args(f, "    ", p->args, p->n_args);
        if (p->addrs) {
            fprintf(f, "    addresses:\n");
            for (int i = 0; i < p->n_addrs; i++) {
                fprintf(f, "    - control: ");
                put_str(f, p->addrs[i].control);
                fprintf(f, "\n      kv: ");
                put_str(f, p->addrs[i].kv);
                fputc('\n', f);
            }
        }
    }
    return ferror(f) ? TANDEM_EIO : 0;
}

int cluster_write_routing(const struct cluster *c, FILE *f)
{
    if (!c->routing_text) {
        return TANDEM_EINVAL;
    }
    fprintf(f, "# The inline routing of %s (line %d), as the router reads it.\n", c->source,
            c->routing_line);
    fputs(c->routing_text, f);
    return ferror(f) ? TANDEM_EIO : 0;
}
