/* The prefill worker's role (tandem-prefill): takes PrefillJobs from decode
 * workers on its data link, prefills them in chunks (reusing its own prefix
 * cache), ships every finished block the decode worker does not already hold
 * as a KV frame as soon as the chunk that produced it is done, then sends
 * PrefillDone with the first token. See docs/protocol.md ("## Worker flows").
 * The core's thread only (wk_core.h). */
#ifndef TANDEM_PREFILL_H
#define TANDEM_PREFILL_H

#include "wk_core.h"

extern const struct worker_role prefill_role;

#endif
