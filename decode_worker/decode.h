/* The decode worker's role (tandem-decode): takes DecodeJobs from the router
 * and either pulls the prompt's KV from the prefill worker the job names
 * (disaggregated: reserve blocks, PrefillJob to P, verify and install KV
 * frames, then decode from P's first token), or prefills locally (colocated
 * mode, a job without a prefill address, and every recovery job). Tokens
 * stream up in one TokenChunk per request per step. See docs/protocol.md
 * ("## Worker flows"). The core's thread only (wk_core.h). */
#ifndef TANDEM_DECODE_H
#define TANDEM_DECODE_H

#include "wk_core.h"

/* Announces DECODE; disaggregated when the job names a prefill worker. */
extern const struct worker_role decode_role;
/* tandem-decode --colocated: announces COLOCATED; always prefills locally. */
extern const struct worker_role colocated_role;

#endif
