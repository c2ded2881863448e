/* Token sampling and log-probabilities.
 *
 * Greedy when temperature == 0 (argmax, lowest id on ties); otherwise
 * temperature, then top-k, then top-p (nucleus) over a softmax computed in
 * double in a fixed order, so the result is a pure function of (logits,
 * params, seed, index).
 *
 * Randomness is counter-based: the uniform number used for the token at
 * position `index` of a completion is sampler_uniform(seed, index), a hash of
 * the pair. There is no RNG state to carry: a sequence's random stream does
 * not depend on its batch, on preemption and recompute, or on the worker that
 * resumes it, as long as it knows how many tokens were generated so far.
 *
 * Logprobs are the log-softmax of the raw logits (before temperature, as vLLM
 * reports them by default). Logits are expected finite; NaN counts as -inf.
 *
 * Threading: the pure functions are thread-safe; a struct sampler (scratch
 * memory) is used by one thread at a time. */
#ifndef TANDEM_SAMPLER_H
#define TANDEM_SAMPLER_H

#include <stdint.h>

/* Most alternatives sampler_logprobs reports (OpenAI chat allows 20,
 * completions 5). */
#define SAMPLER_MAX_TOP 20

struct sampler_params {
    float temperature; /* 0: greedy; > 0: sample from softmax(logits / temperature) */
    int top_k;         /* <= 0 or >= vocab: off; k: keep the k highest logits */
    float top_p;       /* in (0, 1]; 1: off; keep the smallest most-likely set whose mass >= p */
    uint64_t seed;     /* per-request seed of the counter-based random stream */
};

/* One alternative of a top-N logprobs list. */
struct sampler_top {
    uint32_t token;
    float logprob;
};

/* Greedy parameters (temperature 0, top_k 0, top_p 1, seed 0). */
struct sampler_params sampler_params_greedy(void);

/* Validates params: temperature finite and >= 0, top_p in (0, 1].
 * Returns 0 or TANDEM_EINVAL. */
int sampler_params_check(const struct sampler_params *p);

/* Uniform double in [0, 1) for the token at position index of a completion:
 * a hash of (seed, index) with 53 random bits. Pure, thread-safe. */
double sampler_uniform(uint64_t seed, uint64_t index);

/* Index of the largest of logits[0..n), lowest index on ties (NaN never
 * wins unless all are NaN, then 0). n >= 1. Pure. */
uint32_t sampler_argmax(const float *logits, int n);

/* Log-softmax of the raw logits[0..n): returns the log-probability of token
 * and writes the n_top (0..SAMPLER_MAX_TOP, clamped to n) most likely tokens
 * to top[], most likely first, ties by lower id. top may be NULL when n_top
 * is 0. Sums in double, in index order. Pure, thread-safe. */
float sampler_logprobs(const float *logits, int n, uint32_t token, struct sampler_top *top,
                       int n_top);

struct sampler;

/* Creates scratch space for sampling over a vocabulary of vocab_size
 * (>= 1) tokens. Returns 0, TANDEM_EINVAL or TANDEM_ENOMEM; on success the
 * caller owns *out and frees it with sampler_destroy. */
int sampler_create(struct sampler **out, int vocab_size);
void sampler_destroy(struct sampler *s);

/* Picks the token at position index of a completion from logits[0..vocab).
 * Greedy when p->temperature == 0 (or top_k == 1); otherwise draws with
 * u = sampler_uniform(p->seed, index) from the tempered, top-k and top-p
 * filtered distribution: the first candidate whose cumulative mass exceeds
 * u x total, walking candidates in id order when no filter is on and from
 * most to least likely (ties by lower id) when one is. params must pass
 * sampler_params_check. Deterministic. */
uint32_t sampler_sample(struct sampler *s, const struct sampler_params *p, const float *logits,
                        uint64_t index);

#endif
