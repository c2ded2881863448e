/* Derived files of an experiment: for each configuration, the cluster file
 * that is actually run (the configuration's cluster with the experiment's
 * cluster_overrides applied, and its routing file, or a copy of it with one
 * parameter set). Any runner starts a configuration from its derived file,
 * so the report names exactly what ran.
 *
 * Pure apart from the files read and written (any thread). */
#ifndef TANDEM_EXP_DERIVE_H
#define TANDEM_EXP_DERIVE_H

#include <stddef.h>
#include <stdio.h>

#include "exp_file.h"

/* Writes the routing file `path` (an EndpointPickerConfig) with the
 * parameter key = "PLUGIN.PARAM" set to value (a YAML scalar) to out: the
 * plugin is the entry of `plugins` whose name, or else type, is PLUGIN; its
 * `parameters` mapping is created when absent. src_text/src_len may give the
 * document instead of path (then path only names it in messages). Returns 0,
 * TANDEM_ECONFIG (no such plugin, not a mapping; message in err),
 * TANDEM_EIO, TANDEM_ENOMEM. */
int exp_routing_set(const char *path, const char *src_text, size_t src_len, const char *key,
                    const char *value, FILE *out, char *err, size_t errlen);

/* Writes configs/<label>.cluster.yaml (and configs/<label>.routing.yaml when
 * a parameter is set) under dir for configuration i, with the overrides
 * applied, and validates the result with cluster_load (routing included).
 * cluster_file receives the derived file's path; time_scale receives the
 * configuration's time scale (the sim pools' common time_scale, 1 for tiny).
 * Returns 0, TANDEM_ECONFIG / TANDEM_EIO / TANDEM_ENOMEM with a message. */
int exp_prepare(const struct exp_file *e, int i, const char *dir, char *cluster_file,
                size_t cluster_len, double *time_scale, char *err, size_t errlen);

#endif
