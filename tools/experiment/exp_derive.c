/* Derived files: a routing file with one parameter set (exp_routing_set)
 * and a configuration's cluster file with the experiment's overrides
 * (exp_prepare). See exp_derive.h. */
#define _GNU_SOURCE
#include "exp_derive.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "backend.h"
#include "cluster.h"
#include "exp_util.h"
#include "tandem_err.h"
#include "yaml_node.h"

static yaml_node_t *map_get(yaml_document_t *doc, yaml_node_t *m, const char *key,
                            yaml_node_pair_t **pair)
{
    if (!m || m->type != YAML_MAPPING_NODE) {
        return NULL;
    }
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *ks = yn_scalar(yaml_document_get_node(doc, p->key));
        if (ks && strcmp(ks, key) == 0) {
            if (pair) {
                *pair = p;
            }
            return yaml_document_get_node(doc, p->value);
        }
    }
    return NULL;
}

static int emit_write(void *data, unsigned char *buf, size_t size)
{
    return fwrite(buf, 1, size, (FILE *)data) == size;
}

int exp_routing_set(const char *path, const char *src_text, size_t src_len, const char *key,
                    const char *value, FILE *out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = src_len;
    if (!src_text) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            exp_sfmt(err, errlen, "%s: %s", path, strerror(errno));
            return TANDEM_EIO;
        }
        text = malloc(EXP_MAX_FILE + 1);
        len = text ? fread(text, 1, EXP_MAX_FILE, f) : 0;
        fclose(f);
        if (!text) {
            exp_sfmt(err, errlen, "out of memory");
            return TANDEM_ENOMEM;
        }
        src_text = text;
    }
    const char *dot = strchr(key, '.');
    char plugin[128];
    snprintf(plugin, sizeof(plugin), "%.*s", dot ? (int)(dot - key) : 0, key);
    const char *param = dot ? dot + 1 : "";
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = 0;
    if (!yaml_parser_initialize(&parser)) {
        free(text);
        exp_sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)src_text, len);
    int loaded = yaml_parser_load(&parser, &doc);
    if (!loaded) {
        exp_sfmt(err, errlen, "%s:%d: YAML: %s", path, (int)parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "syntax error");
    }
    yaml_parser_delete(&parser);
    free(text);
    if (!loaded) {
        return TANDEM_ECONFIG;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *plugins = map_get(&doc, root, "plugins", NULL);
    int target = 0;
    if (plugins && plugins->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = plugins->data.sequence.items.start;
             !target && it < plugins->data.sequence.items.top; it++) {
            yaml_node_t *pl = yaml_document_get_node(&doc, *it);
            const char *nm = yn_scalar(map_get(&doc, pl, "name", NULL));
            const char *ty = yn_scalar(map_get(&doc, pl, "type", NULL));
            if ((nm && strcmp(nm, plugin) == 0) || (!nm && ty && strcmp(ty, plugin) == 0)) {
                target = *it;
            }
        }
    }
    if (!target) {
        exp_sfmt(err, errlen, "%s: set %s: no plugin named '%s' under plugins", path, key, plugin);
        yaml_document_delete(&doc);
        return TANDEM_ECONFIG;
    }
    /* Node pointers move when nodes are added: look them up by id again. */
    yaml_node_t *pl = yaml_document_get_node(&doc, target);
    yaml_node_t *params = map_get(&doc, pl, "parameters", NULL);
    int params_id = 0;
    if (params && params->type != YAML_MAPPING_NODE) {
        exp_sfmt(err, errlen, "%s:%d: plugin '%s': parameters is not a mapping", path,
                 yn_line(params), plugin);
        yaml_document_delete(&doc);
        return TANDEM_ECONFIG;
    }
    if (params) {
        params_id = (int)(params - doc.nodes.start) + 1;
    } else {
        int k = yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)"parameters", -1,
                                         YAML_PLAIN_SCALAR_STYLE);
        params_id = yaml_document_add_mapping(&doc, NULL, YAML_BLOCK_MAPPING_STYLE);
        if (!k || !params_id || !yaml_document_append_mapping_pair(&doc, target, k, params_id)) {
            rc = TANDEM_ENOMEM;
        }
    }
    int v = rc ? 0
               : yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)value, -1,
                                          YAML_PLAIN_SCALAR_STYLE);
    if (!rc && !v) {
        rc = TANDEM_ENOMEM;
    }
    if (!rc) {
        yaml_node_pair_t *pair = NULL;
        if (map_get(&doc, yaml_document_get_node(&doc, params_id), param, &pair)) {
            pair->value = v;
        } else {
            int k = yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)param, -1,
                                             YAML_PLAIN_SCALAR_STYLE);
            if (!k || !yaml_document_append_mapping_pair(&doc, params_id, k, v)) {
                rc = TANDEM_ENOMEM;
            }
        }
    }
    if (rc) {
        exp_sfmt(err, errlen, "out of memory");
        yaml_document_delete(&doc);
        return rc;
    }
    fprintf(out, "# %s with %s = %s (written by tandem bench --experiment)\n", path, key, value);
    yaml_emitter_t em;
    if (!yaml_emitter_initialize(&em)) {
        yaml_document_delete(&doc);
        exp_sfmt(err, errlen, "out of memory");
        return TANDEM_ENOMEM;
    }
    yaml_emitter_set_output(&em, emit_write, out);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, 100);
    /* yaml_emitter_dump destroys the document, whether it succeeds or not. */
    int ok = 0;
    if (!yaml_emitter_open(&em)) {
        yaml_document_delete(&doc);
    } else {
        ok = yaml_emitter_dump(&em, &doc) && yaml_emitter_close(&em) && yaml_emitter_flush(&em);
    }
    yaml_emitter_delete(&em);
    if (!ok || ferror(out)) {
        exp_sfmt(err, errlen, "%s: cannot write the derived routing", path);
        return TANDEM_EIO;
    }
    return 0;
}

static int replace_str(char **dst, const char *s)
{
    char *d = strdup(s);
    if (!d) {
        return TANDEM_ENOMEM;
    }
    free(*dst);
    *dst = d;
    return 0;
}

int exp_prepare(const struct exp_file *e, int i, const char *dir, char *cluster_file,
                size_t cluster_len, double *time_scale, char *err, size_t errlen)
{
    const struct exp_config *cfg = &e->configs[i];
    char cdir[PATH_MAX], routing_file[PATH_MAX] = "", msg[CLUSTER_ERR_MAX];
    exp_sfmt(cdir, sizeof(cdir), "%s/configs", dir);
    if (exp_mkdir_p(cdir) != 0) {
        exp_sfmt(err, errlen, "cannot create %s: %s", cdir, strerror(errno));
        return TANDEM_EIO;
    }
    struct cluster *c = NULL;
    int rc = cluster_load(&c, cfg->cluster_path, msg, sizeof(msg));
    if (rc != 0) {
        exp_sfmt(err, errlen, "%s:%d: config %s: %s", e->source, cfg->line, cfg->label, msg);
        return rc;
    }
    const struct exp_overrides *ov = &e->ov;
    for (int r = 0; r < CLUSTER_N_ROLES && rc == 0; r++) {
        struct cluster_pool *p = &c->pools[r];
        if (p->count == 0) {
            continue;
        }
        for (size_t k = 0; k < wk_n_settings && rc == 0; k++) {
            const struct setting *ws = &wk_settings[k];
            unsigned reads = backend_at((size_t)p->cfg.backend)->reads;
            if ((ov->set & ((uint64_t)1 << k)) && (!ws->reads || (reads & ws->reads)) &&
                (!ws->override_reads || (reads & ws->override_reads))) {
                rc = cluster_pool_set(p, (int)k, &ov->cfg);
            }
        }
    }
    if (rc == 0 && ov->log_level) {
        rc = replace_str(&c->log_level, ov->log_level);
    }
    if (rc == 0 && ov->n_router_args > 0) {
        /* Appended to the cluster's own router.args; tandem up's loader
         * refuses flags it sets itself. */
        char **args = realloc(c->router_args,
                              (size_t)(c->n_router_args + ov->n_router_args + 1) * sizeof(char *));
        if (!args) {
            rc = TANDEM_ENOMEM;
        } else {
            c->router_args = args;
            for (int k = 0; k < ov->n_router_args && rc == 0; k++) {
                if (!(args[c->n_router_args] = strdup(ov->router_args[k]))) {
                    rc = TANDEM_ENOMEM;
                } else {
                    c->n_router_args++;
                }
            }
            args[c->n_router_args] = NULL;
        }
    }
    if (rc == 0 && cfg->set_key) {
        const char *src = cfg->routing_path ? cfg->routing_path : c->routing_path;
        if (!src && !c->routing_text) {
            exp_sfmt(err, errlen,
                     "%s:%d: config %s: set %s: the cluster has no routing file to change "
                     "(name one with routing:)",
                     e->source, cfg->line, cfg->label, cfg->set_key);
            cluster_free(c);
            return TANDEM_ECONFIG;
        }
        exp_sfmt(routing_file, sizeof(routing_file), "%s/%s.routing.yaml", cdir, cfg->label);
        FILE *f = fopen(routing_file, "w");
        if (!f) {
            exp_sfmt(err, errlen, "cannot write %s: %s", routing_file, strerror(errno));
            cluster_free(c);
            return TANDEM_EIO;
        }
        rc = exp_routing_set(src ? src : cfg->cluster_path, src ? NULL : c->routing_text,
                             src ? 0 : strlen(c->routing_text), cfg->set_key, cfg->set_value, f,
                             msg, sizeof(msg));
        if (fclose(f) != 0 && rc == 0) {
            rc = TANDEM_EIO;
            exp_sfmt(msg, sizeof(msg), "cannot write %s", routing_file);
        }
        if (rc != 0) {
            exp_sfmt(err, errlen, "%s:%d: config %s: %s", e->source, cfg->line, cfg->label, msg);
            cluster_free(c);
            return rc;
        }
    } else if (rc == 0 && cfg->routing_path) {
        exp_sfmt(routing_file, sizeof(routing_file), "%s", cfg->routing_path);
    }
    if (rc == 0 && routing_file[0]) {
        rc = replace_str(&c->routing_path, routing_file);
        free(c->routing_text);
        c->routing_text = NULL;
        c->routing_flow = 0;
    }
    if (rc != 0) {
        exp_sfmt(err, errlen, "out of memory");
        cluster_free(c);
        return rc;
    }
    /* The conversion factor between wall and modelled seconds. */
    double ts = -1;
    for (int r = 0; r < CLUSTER_N_ROLES; r++) {
        const struct cluster_pool *p = &c->pools[r];
        if (p->count == 0) {
            continue;
        }
        int timed = backend_at((size_t)p->cfg.backend)->reads & BACKEND_READS_HARDWARE;
        double t = timed ? p->cfg.time_scale : 1.0;
        if (ts >= 0 && t != ts) {
            exp_sfmt(err, errlen,
                     "%s:%d: config %s: pools run at different time scales (%g and %g): the "
                     "report could not convert to modelled seconds",
                     e->source, cfg->line, cfg->label, ts, t);
            cluster_free(c);
            return TANDEM_ECONFIG;
        }
        ts = t;
    }
    if (!(ts > 0)) {
        exp_sfmt(err, errlen,
                 "%s:%d: config %s: time_scale 0 (never sleep) has no modelled time to report; "
                 "use a positive time_scale",
                 e->source, cfg->line, cfg->label);
        cluster_free(c);
        return TANDEM_ECONFIG;
    }
    *time_scale = ts;
    int w = exp_sfmt(cluster_file, cluster_len, "%s/%s.cluster.yaml", cdir, cfg->label);
    if (w < 0 || (size_t)w >= cluster_len) {
        exp_sfmt(err, errlen, "path too long: %s", cdir);
        cluster_free(c);
        return TANDEM_EIO;
    }
    FILE *f = fopen(cluster_file, "w");
    if (!f) {
        exp_sfmt(err, errlen, "cannot write %s: %s", cluster_file, strerror(errno));
        cluster_free(c);
        return TANDEM_EIO;
    }
    fprintf(f,
            "# Configuration '%s' of experiment %s (%s), written by tandem bench "
            "--experiment.\n",
            cfg->label, e->name, e->source);
    rc = cluster_write(c, f);
    cluster_free(c);
    if (fclose(f) != 0 || rc != 0) {
        exp_sfmt(err, errlen, "cannot write %s", cluster_file);
        return TANDEM_EIO;
    }
    /* Validate what tandem up will read, routing included. */
    rc = cluster_load(&c, cluster_file, msg, sizeof(msg));
    cluster_free(c);
    if (rc != 0) {
        exp_sfmt(err, errlen, "%s:%d: config %s: the derived cluster is not valid: %s", e->source,
                 cfg->line, cfg->label, msg);
        return TANDEM_ECONFIG;
    }
    return 0;
}
