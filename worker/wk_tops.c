/* Top-logprob rows for the wire (wk_tops.h). */
#include "wk_tops.h"

#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"
#include "wire.h"

int wk_tops_build(struct wk_tops *t, int n, const struct sampler_top *top, int stride,
                  const uint8_t *counts, int n_top)
{
    memset(t, 0, sizeof(*t));
    t->rows = calloc((size_t)n, sizeof(*t->rows));
    t->ptrs = calloc((size_t)n, sizeof(*t->ptrs));
    t->ids = calloc((size_t)n * WIRE_MAX_LOGPROBS, sizeof(*t->ids));
    t->lps = calloc((size_t)n * WIRE_MAX_LOGPROBS, sizeof(*t->lps));
    if (!t->rows || !t->ptrs || !t->ids || !t->lps) {
        wk_tops_free(t);
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        Tandem__TopLogprobs *row = &t->rows[i];
        uint32_t *ids = t->ids + (size_t)i * WIRE_MAX_LOGPROBS;
        float *lps = t->lps + (size_t)i * WIRE_MAX_LOGPROBS;
        int k = counts != NULL ? counts[i] : n_top;
        k = k < (int)WIRE_MAX_LOGPROBS ? k : (int)WIRE_MAX_LOGPROBS;
        tandem__top_logprobs__init(row);
        for (int j = 0; j < k; j++) {
            ids[j] = top[(size_t)i * stride + j].token;
            lps[j] = top[(size_t)i * stride + j].logprob;
        }
        row->n_token_ids = row->n_logprobs = (size_t)k;
        row->token_ids = ids;
        row->logprobs = lps;
        t->ptrs[i] = row;
    }
    return 0;
}

void wk_tops_free(struct wk_tops *t)
{
    free(t->rows);
    free(t->ptrs);
    free(t->ids);
    free(t->lps);
    memset(t, 0, sizeof(*t));
}
