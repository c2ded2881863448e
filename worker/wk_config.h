/* Worker command line and engine construction (tandem_worker).
 *
 * The flags are one table (common/flags) shared by tandem-prefill and
 * tandem-decode; --help prints every flag with its default. The engine is
 * the backend (tiny or sim), its KV pool and the scheduler, built from the
 * flags with the defaults documented in docs/architecture.md ("## Workers"). */
#ifndef TANDEM_WK_CONFIG_H
#define TANDEM_WK_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "worker.h"

/* Fills cfg with the defaults shown by --help. */
void wk_config_defaults(struct worker_config *cfg);

/* Parses argv[1..argc) into cfg (defaults first). has_colocated adds the
 * --colocated flag. Returns FLAGS_OK, FLAGS_HELP (usage printed to help_out),
 * FLAGS_VERSION, or TANDEM_EINVAL with a message naming the flag in err. */
int wk_config_parse(struct worker_config *cfg, int argc, char **argv, const char *binary,
                    int has_colocated, FILE *help_out, char *err, size_t errlen);

/* Builds w->be, w->tok, w->pool and w->sched (callbacks from w->role, arg w)
 * from w->cfg, and fills root, block_size, dtype, block_bytes, max_context.
 * Returns 0; TANDEM_EINVAL / TANDEM_ECONFIG for a bad combination of flags
 * (message in err, naming the flag); or the engine's error (message in err).
 * On failure nothing is left allocated. */
int wk_engine_create(struct worker *w, char *err, size_t errlen);

/* Frees what wk_engine_create built (sched, pool, tokenizer, backend). */
void wk_engine_destroy(struct worker *w);

#endif
