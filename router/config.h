/* EndpointPickerConfig loader: the YAML file that configures the router's
 * scheduling pipeline, in the shape of llm-d's EndpointPickerConfig
 * (docs/routing.md describes the subset we accept):
 *
 *   apiVersion: inference.networking.x-k8s.io/v1alpha1
 *   kind: EndpointPickerConfig
 *   plugins:
 *   - type: prefix-cache-scorer        # required
 *     name: prefix                     # optional, defaults to type
 *     parameters: {mode: approx}       # optional
 *   schedulingProfiles:
 *   - name: default
 *     plugins:
 *     - pluginRef: prefix
 *       weight: 2                      # scorers only, default 1
 *
 * This module checks the document's shape (keys, scalars, lists, header) and
 * keeps every value as text with its line; whether a plugin type, parameter
 * or reference exists is checked by rt_pipeline_create (pipeline.h), which
 * knows the plugin table. Nested parameter maps are flattened into dotted
 * keys ("tokenProcessorConfig.blockSize").
 *
 * Errors are TANDEM_ECONFIG with a message "<file>:<line>: <what>" naming the
 * offending key. Threading: pure functions, any thread. */
#ifndef TANDEM_RT_CONFIG_H
#define TANDEM_RT_CONFIG_H

#include <stddef.h>

#define RT_ERR_MAX 512 /* suggested size of error message buffers */

struct rt_cfg_param {
    char *key;   /* dotted path below `parameters:` */
    char *value; /* scalar text as written (quotes removed) */
    int line;    /* 1-based line of the key */
};

struct rt_cfg_plugin {
    char *type;
    char *name; /* = type when the file gives none */
    int line;   /* line of the list item */
    int type_line;
    struct rt_cfg_param *params; /* (n_params) */
    int n_params;
};

struct rt_cfg_ref {
    char *plugin_ref;
    double weight; /* 1 when absent */
    int has_weight;
    int line;
    int weight_line;
};

struct rt_cfg_profile {
    char *name;
    int line;
    struct rt_cfg_ref *refs; /* (n_refs) in file order */
    int n_refs;
};

struct rt_config {
    char *source; /* file path or the name given to rt_config_parse */
    char *api_version;
    struct rt_cfg_plugin *plugins; /* (n_plugins) in file order */
    int n_plugins;
    struct rt_cfg_profile *profiles; /* (n_profiles) in file order */
    int n_profiles;
};

/* Reads and parses a file. On success *out is owned by the caller
 * (rt_config_free). On failure returns TANDEM_ECONFIG (bad YAML or shape),
 * TANDEM_ENOENT / TANDEM_EIO (cannot read), TANDEM_ETOOBIG (over 1 MiB) or
 * TANDEM_ENOMEM, and writes a NUL-terminated message to err (errlen bytes,
 * may be 0). */
int rt_config_load(struct rt_config **out, const char *path, char *err, size_t errlen);

/* Same from text[0..len); name stands for the file in messages. */
int rt_config_parse(struct rt_config **out, const char *text, size_t len, const char *name,
                    char *err, size_t errlen);

void rt_config_free(struct rt_config *cfg);

#endif
