/* Top-logprob rows for the wire: the TopLogprobs messages of a TokenChunk
 * or PromptLogprobs (proto/tandem.proto), built from the sampler's
 * alternatives.
 *
 * Row i holds min(count, WIRE_MAX_LOGPROBS) alternatives, count being
 * counts[i] (or n_top when counts is NULL), read from top + i * stride.
 * Ownership: the rows, the pointer array handed to the message and the ids
 * and logprobs they point into all belong to the wk_tops until
 * wk_tops_free; the message must be packed or sent before then. */
#ifndef TANDEM_WK_TOPS_H
#define TANDEM_WK_TOPS_H

#include <stdint.h>

#include "sampler.h"
#include "tandem.pb-c.h"

struct wk_tops {
    Tandem__TopLogprobs *rows;
    Tandem__TopLogprobs **ptrs; /* what the message's top_logprobs points at */
    uint32_t *ids;
    float *lps;
};

/* Builds n rows into t (zeroed first). Returns 0, or TANDEM_ENOMEM with t
 * empty (the message then goes without its top logprobs). */
int wk_tops_build(struct wk_tops *t, int n, const struct sampler_top *top, int stride,
                  const uint8_t *counts, int n_top);
void wk_tops_free(struct wk_tops *t);

#endif
