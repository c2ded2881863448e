/* The experiment file loader's internals, shared by exp_file.c (the file's
 * top level, configurations, rates) and exp_file_run.c (what every cell runs
 * with: bench:, extra_slos:, cluster_overrides:). Not a public API: use
 * exp_file.h. The libyaml document API keeps every node's line, so every
 * message names it. */
#ifndef TANDEM_EXP_LOADER_H
#define TANDEM_EXP_LOADER_H

#include <stddef.h>
#include <yaml.h>

struct exp_file;

struct exp_loader {
    yaml_document_t doc;
    const char *source; /* the file's name in messages */
    char *err;          /* (errlen) the caller's message buffer */
    size_t errlen;
    struct exp_file *e; /* what is being filled */
    int cap_configs;    /* allocated entries of e->configs */
};

/* Writes "<source>:<line>: <message>" to ld->err; returns TANDEM_ECONFIG. */
__attribute__((format(printf, 3, 4))) int exp_ld_fail(struct exp_loader *ld, int line,
                                                      const char *fmt, ...);
/* Writes "out of memory"; returns TANDEM_ENOMEM. */
int exp_ld_oom(struct exp_loader *ld);
/* The node of id in ld's document (NULL when there is none). */
yaml_node_t *exp_ld_node(struct exp_loader *ld, int id);
/* Checks that mapping m has only keys from valid (NULL-terminated) and no
 * duplicates; where names the mapping in messages ("" at the top level).
 * 0 or TANDEM_ECONFIG. */
int exp_ld_check_keys(struct exp_loader *ld, yaml_node_t *m, const char *where,
                      const char *const *valid);
/* The value of key in mapping m, or NULL. */
yaml_node_t *exp_ld_get(struct exp_loader *ld, yaml_node_t *m, const char *key);
/* n as a non-empty string into *out (pointing into the document), or
 * TANDEM_ECONFIG naming key. */
int exp_ld_string(struct exp_loader *ld, yaml_node_t *n, const char *key, const char **out);

/* exp_file_run.c: the sections of what every cell runs with. Each returns 0,
 * TANDEM_ECONFIG or TANDEM_ENOMEM (message in ld->err). */
int exp_ld_overrides(struct exp_loader *ld, yaml_node_t *m);  /* cluster_overrides: */
int exp_ld_extra_slos(struct exp_loader *ld, yaml_node_t *n); /* extra_slos: */
int exp_ld_bench(struct exp_loader *ld, yaml_node_t *m);      /* bench: */
/* Runs bench_parse_args over the bench flags read so far, so that a bad
 * flag is reported at load time with the line of its key. */
int exp_ld_check_bench(struct exp_loader *ld);

#endif
