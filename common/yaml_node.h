/* Small helpers shared by the YAML loaders (router/config.c, tools/cluster.c,
 * tools/experiment/): a node's line for error messages, a scalar's text,
 * and lookups in NULL-terminated lists of names. Header-only, prefix yn_ (libyaml owns yaml_): each
 * loader keeps its own loader state and error style. */
#ifndef TANDEM_YAML_NODE_H
#define TANDEM_YAML_NODE_H

#include <stdio.h>
#include <string.h>
#include <yaml.h>

/* The 1-based line n starts on. */
static inline int yn_line(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

/* n's text when n is a scalar, else NULL (n may be NULL). */
static inline const char *yn_scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The index of s in the NULL-terminated list, or -1. */
static inline int yn_name_index(const char *s, const char *const *list)
{
    for (int i = 0; list[i]; i++) {
        if (strcmp(s, list[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* "a, b, c" from the NULL-terminated list into out (cap bytes, truncated). */
static inline void yn_name_join(char *out, size_t cap, const char *const *list)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; list[i] && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s%s", i ? ", " : "", list[i]);
        if (w < 0) {
            break;
        }
        n += (size_t)w;
    }
}

#endif
