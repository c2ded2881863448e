/* The sections of an experiment file that say what every cell runs with:
 * bench: (the workload, as `tandem bench` flags), extra_slos: and
 * cluster_overrides:. See exp_loader.h and exp_file.h. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "exp_file.h"
#include "exp_loader.h"
#include "exp_util.h"
#include "flags.h"
#include "log.h"
#include "settings.h"
#include "tandem_err.h"
#include "yaml_node.h"

/* `tandem bench` flags the runner sets itself. */
static const char *const bench_managed[] = {"base-url",
                                            "url",
                                            "host",
                                            "port",
                                            "request-rate",
                                            "json",
                                            "save-result",
                                            "result-dir",
                                            "result-filename",
                                            "save-requests",
                                            "label",
                                            "progress",
                                            "disable-progress",
                                            "disable-tqdm",
                                            "metric-percentiles",
                                            "help",
                                            "version",
                                            "experiment",
                                            NULL};

/* The keys of cluster_overrides: router_args, the overridable worker
 * settings in wk_settings order, log_level. */
static void override_keys(const char **keys)
{
    int n = 0;
    keys[n++] = "router_args";
    for (size_t i = 0; i < wk_n_settings; i++) {
        if (wk_settings[i].flags & SETTING_OVERRIDE) {
            keys[n++] = wk_settings[i].key;
        }
    }
    keys[n++] = "log_level";
    keys[n] = NULL;
}

/* One worker setting of cluster_overrides, checked as in a cluster file. */
static int read_override(struct exp_loader *ld, yaml_node_t *v, int i)
{
    const struct setting *s = &wk_settings[i];
    struct exp_overrides *o = &ld->e->ov;
    const char *text = yn_scalar(v);
    char why[EXP_ERR_MAX / 2];
    if (!text) {
        text = "(not a scalar)";
    }
    if (settings_parse_value(s, text, &o->cfg, why, sizeof(why)) != 0) {
        return exp_ld_fail(ld, yn_line(v), "cluster_overrides.%s: %s", s->key, why);
    }
    if (s->type == FLAG_STR) {
        char **dst = (char **)((char *)&o->cfg + s->off);
        if (!(*dst = strdup(text))) {
            return exp_ld_oom(ld);
        }
    }
    o->set |= (uint64_t)1 << i;
    return 0;
}

int exp_ld_overrides(struct exp_loader *ld, yaml_node_t *m)
{
    if (m->type != YAML_MAPPING_NODE) {
        return exp_ld_fail(ld, yn_line(m), "cluster_overrides: expected a mapping");
    }
    const char *keys[SETTINGS_MAX + 3];
    override_keys(keys);
    int rc = exp_ld_check_keys(ld, m, "cluster_overrides", keys);
    if (rc != 0) {
        return rc;
    }
    struct exp_overrides *o = &ld->e->ov;
    yaml_node_t *v;
    const char *s;
    for (size_t i = 0; i < wk_n_settings; i++) {
        if ((wk_settings[i].flags & SETTING_OVERRIDE) &&
            (v = exp_ld_get(ld, m, wk_settings[i].key)) &&
            (rc = read_override(ld, v, (int)i)) != 0) {
            return rc;
        }
    }
    if ((v = exp_ld_get(ld, m, "log_level"))) {
        enum log_level level;
        if ((rc = exp_ld_string(ld, v, "cluster_overrides.log_level", &s)) != 0) {
            return rc;
        }
        if (log_level_parse(s, &level) != 0) {
            char names[128];
            yn_name_join(names, sizeof(names), log_level_names);
            return exp_ld_fail(ld, yn_line(v),
                               "cluster_overrides.log_level: expected one of %s, got '%s'", names,
                               s);
        }
        if (!(o->log_level = strdup(s))) {
            return exp_ld_oom(ld);
        }
    }
    if ((v = exp_ld_get(ld, m, "router_args"))) {
        if (v->type != YAML_SEQUENCE_NODE) {
            return exp_ld_fail(ld, yn_line(v),
                               "cluster_overrides.router_args: expected a list of "
                               "tandem-router flags");
        }
        int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
        o->router_args = calloc((size_t)n + 1, sizeof(char *));
        if (!o->router_args) {
            return exp_ld_oom(ld);
        }
        for (int i = 0; i < n; i++) {
            yaml_node_t *a = exp_ld_node(ld, v->data.sequence.items.start[i]);
            if (!yn_scalar(a)) {
                return exp_ld_fail(ld, yn_line(a),
                                   "cluster_overrides.router_args: items must be "
                                   "strings");
            }
            if (!(o->router_args[o->n_router_args++] = strdup(yn_scalar(a)))) {
                return exp_ld_oom(ld);
            }
        }
    }
    return 0;
}

/* extra_slos: a list of SLO sets, each a list of KEY:MS ([ttft:500, tpot:50])
 * or one string ("ttft:500 tpot:50"). */
int exp_ld_extra_slos(struct exp_loader *ld, yaml_node_t *n)
{
    if (n->type != YAML_SEQUENCE_NODE) {
        return exp_ld_fail(ld, yn_line(n),
                           "extra_slos: expected a list of SLO sets ([ttft:MS, "
                           "tpot:MS, e2el:MS])");
    }
    struct exp_file *e = ld->e;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *set = exp_ld_node(ld, *it);
        if (e->n_extra_slos == EXP_MAX_SLOS) {
            return exp_ld_fail(ld, yn_line(set), "extra_slos: at most %d sets", EXP_MAX_SLOS);
        }
        char text[256] = "";
        size_t len = 0;
        if (set->type == YAML_SCALAR_NODE) {
            len = (size_t)snprintf(text, sizeof(text), "%s", yn_scalar(set));
        } else if (set->type == YAML_SEQUENCE_NODE) {
            for (yaml_node_item_t *k = set->data.sequence.items.start;
                 k < set->data.sequence.items.top && len < sizeof(text); k++) {
                const char *v = yn_scalar(exp_ld_node(ld, *k));
                len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%s", len ? "," : "",
                                        v ? v : "?");
            }
        }
        struct lg_slo *slo = &e->extra_slos[e->n_extra_slos];
        lg_slo_clear(slo);
        if (len == 0 || len >= sizeof(text) || lg_parse_goodput(text, slo) != 0) {
            return exp_ld_fail(ld, yn_line(set),
                               "extra_slos: '%s' is not KEY:MS pairs with KEY ttft, tpot or e2el",
                               text);
        }
        e->n_extra_slos++;
    }
    return 0;
}

/* Appends YAML node n as JSON text: mappings as objects, sequences as
 * arrays, plain scalars as numbers / true / false / null when they read as
 * one, everything else as strings. */
static int yaml_to_json(yaml_document_t *doc, yaml_node_t *n, json_t **out)
{
    if (n->type == YAML_MAPPING_NODE) {
        json_t *o = json_object();
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; o && p < n->data.mapping.pairs.top;
             p++) {
            const char *k = yn_scalar(yaml_document_get_node(doc, p->key));
            json_t *v = NULL;
            if (!k || yaml_to_json(doc, yaml_document_get_node(doc, p->value), &v) != 0) {
                json_decref(o);
                return TANDEM_EINVAL;
            }
            json_object_set_new(o, k, v);
        }
        *out = o;
        return o ? 0 : TANDEM_ENOMEM;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             a && it < n->data.sequence.items.top; it++) {
            json_t *v = NULL;
            if (yaml_to_json(doc, yaml_document_get_node(doc, *it), &v) != 0) {
                json_decref(a);
                return TANDEM_EINVAL;
            }
            json_array_append_new(a, v);
        }
        *out = a;
        return a ? 0 : TANDEM_ENOMEM;
    }
    const char *s = yn_scalar(n);
    if (!s) {
        return TANDEM_EINVAL;
    }
    if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        char *end;
        if (strcmp(s, "true") == 0 || strcmp(s, "false") == 0) {
            *out = json_boolean(s[0] == 't');
            return 0;
        }
        if (strcmp(s, "null") == 0 || strcmp(s, "~") == 0 || s[0] == '\0') {
            *out = json_null();
            return 0;
        }
        errno = 0;
        long long iv = strtoll(s, &end, 10);
        if (end != s && *end == '\0' && errno == 0) {
            *out = json_integer(iv);
            return 0;
        }
        double dv = strtod(s, &end);
        if (end != s && *end == '\0' && isfinite(dv)) {
            *out = json_real(dv);
            return 0;
        }
    }
    *out = json_string(s);
    return *out ? 0 : TANDEM_ENOMEM;
}

static int push_arg(struct exp_loader *ld, char *arg, int line)
{
    struct exp_file *e = ld->e;
    if (!arg) {
        return exp_ld_oom(ld);
    }
    char **a = realloc(e->bench_argv, (size_t)(e->bench_argc + 1) * sizeof(char *));
    int *l = realloc(e->bench_lines, (size_t)(e->bench_argc + 1) * sizeof(int));
    if (a) {
        e->bench_argv = a;
    }
    if (l) {
        e->bench_lines = l;
    }
    if (!a || !l) {
        free(arg);
        return exp_ld_oom(ld);
    }
    e->bench_argv[e->bench_argc] = arg;
    e->bench_lines[e->bench_argc] = line;
    e->bench_argc++;
    return 0;
}

/* bench: {flag: value} -> "--flag=value" (lists joined with commas,
 * mappings as JSON). */
int exp_ld_bench(struct exp_loader *ld, yaml_node_t *m)
{
    if (m->type != YAML_MAPPING_NODE) {
        return exp_ld_fail(ld, yn_line(m), "bench: expected a mapping of tandem bench flags");
    }
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = exp_ld_node(ld, p->key);
        yaml_node_t *v = exp_ld_node(ld, p->value);
        const char *ks = yn_scalar(k);
        if (!ks || !ks[0] || strlen(ks) > 64 || ks[0] == '-') {
            return exp_ld_fail(ld, yn_line(k),
                               "bench: keys are tandem bench flag names without "
                               "dashes (num_prompts or num-prompts)");
        }
        char flag[72];
        snprintf(flag, sizeof(flag), "%s", ks);
        for (char *c = flag; *c; c++) {
            *c = *c == '_' ? '-' : *c;
        }
        for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
            char prev[72];
            snprintf(prev, sizeof(prev), "%s", yn_scalar(exp_ld_node(ld, q->key)));
            for (char *c = prev; *c; c++) {
                *c = *c == '_' ? '-' : *c;
            }
            if (strcmp(prev, flag) == 0) {
                return exp_ld_fail(ld, yn_line(k), "bench.%s: duplicate key", ks);
            }
        }
        if (yn_name_index(flag, bench_managed) >= 0) {
            return exp_ld_fail(ld, yn_line(k),
                               "bench.%s: set by the experiment runner (rates: for the rate; the "
                               "report for results)",
                               ks);
        }
        char *arg = NULL;
        if (v->type == YAML_SCALAR_NODE) {
            if (asprintf(&arg, "--%s=%s", flag, yn_scalar(v)) < 0) {
                arg = NULL;
            }
        } else if (v->type == YAML_SEQUENCE_NODE) {
            size_t cap = strlen(flag) + 4, len = 0;
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top; it++) {
                const char *s = yn_scalar(exp_ld_node(ld, *it));
                if (!s) {
                    return exp_ld_fail(ld, yn_line(v), "bench.%s: list items must be scalars", ks);
                }
                cap += strlen(s) + 1;
            }
            arg = malloc(cap);
            if (arg) {
                len = (size_t)snprintf(arg, cap, "--%s=", flag);
                for (yaml_node_item_t *it = v->data.sequence.items.start;
                     it < v->data.sequence.items.top; it++) {
                    const char *s = yn_scalar(exp_ld_node(ld, *it));
                    len += (size_t)snprintf(arg + len, cap - len, "%s%s",
                                            it == v->data.sequence.items.start ? "" : ",", s);
                }
            }
        } else {
            json_t *j = NULL;
            if (yaml_to_json(&ld->doc, v, &j) != 0) {
                return exp_ld_fail(ld, yn_line(v), "bench.%s: cannot convert to JSON", ks);
            }
            char *txt = json_dumps(j, JSON_COMPACT);
            json_decref(j);
            if (txt && asprintf(&arg, "--%s=%s", flag, txt) < 0) {
                arg = NULL;
            }
            free(txt);
        }
        int rc = push_arg(ld, arg, yn_line(k));
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int exp_bench_options(const struct exp_file *e, struct bench_options *o, char *err, size_t errlen)
{
    char **argv = calloc((size_t)e->bench_argc + 5, sizeof(char *));
    if (!argv) {
        memset(o, 0, sizeof(*o));
        exp_sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    int argc = 0;
    argv[argc++] = (char *)"bench";
    /* The report's table needs p50/p90/p99; the lag check needs the queue. */
    argv[argc++] = (char *)"--metric-percentiles=50,90,99";
    argv[argc++] = (char *)"--percentile-metrics=ttft,tpot,itl,e2el,client_queue_time";
    argv[argc++] = (char *)"--request-rate=1"; /* a placeholder: each cell sets its rate */
    for (int i = 0; i < e->bench_argc; i++) {
        argv[argc++] = e->bench_argv[i];
    }
    int rc = bench_parse_args(o, argc, argv, 1, 0, NULL, err, errlen);
    free(argv);
    return rc == FLAGS_OK ? 0 : TANDEM_EINVAL;
}

/* Whether msg names flag ("--name") as a whole word. */
static int names_flag(const char *msg, const char *flag)
{
    size_t fl = strlen(flag);
    for (const char *hit = strstr(msg, flag); hit; hit = strstr(hit + 1, flag)) {
        char next = hit[fl];
        if (!isalnum((unsigned char)next) && next != '-') {
            return 1;
        }
    }
    return 0;
}

int exp_ld_check_bench(struct exp_loader *ld)
{
    struct exp_file *e = ld->e;
    struct bench_options o;
    char msg[768] = "";
    int rc = exp_bench_options(e, &o, msg, sizeof(msg));
    bench_options_fini(&o);
    if (rc == 0) {
        return 0;
    }
    if (rc == TANDEM_ENOMEM) {
        return exp_ld_oom(ld);
    }
    int line = e->bench_line ? e->bench_line : 1;
    for (int i = 0; i < e->bench_argc; i++) {
        char flag[80];
        const char *a = e->bench_argv[i];
        const char *eq = strchr(a, '=');
        snprintf(flag, sizeof(flag), "%.*s", (int)(eq ? (size_t)(eq - a) : strlen(a)), a);
        if (names_flag(msg, flag)) {
            line = e->bench_lines[i];
            break;
        }
    }
    return exp_ld_fail(ld, line, "bench: %s", msg);
}
