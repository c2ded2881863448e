/* The OpenAI-compatible wire format as the load generator speaks it: request
 * bodies for /v1/completions and /v1/chat/completions, and the reading of
 * streamed chunks, whole responses and error bodies. Works with Tandem's
 * router, vLLM and SGLang.
 *
 * Request: {"model", "prompt" (text or ids) | "messages", "max_tokens",
 * "stream": true, "stream_options": {"include_usage": true}, "ignore_eos"
 * (a vLLM extension that Tandem and SGLang accept), "temperature" when set},
 * then the keys of --extra-body (which win).
 *
 * A chunk is a token chunk when it carries generated text (choices[0].text,
 * or choices[0].delta.content for chat) that is non-empty, or empty with no
 * finish_reason (a special token). The role-only first chunk of a chat stream
 * and finish-only or usage-only chunks are not tokens. (vLLM's benchmark
 * counts the role chunk as the first token, which can make its chat TTFT look
 * smaller.)
 *
 * Pure functions; any thread. */
#ifndef TANDEM_LG_OPENAI_H
#define TANDEM_LG_OPENAI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "workload.h"

struct lg_openai_opts {
    enum lg_api api;
    const char *model;
    int ignore_eos;
    double temperature;       /* NaN: not sent */
    const json_t *extra_body; /* object merged last, or NULL; borrowed */
};

/* Returns the JSON body for p (malloc'd, NUL-terminated; *len its length),
 * or NULL when out of memory. */
char *lg_openai_body(const struct lg_openai_opts *o, const struct lg_prompt *p, size_t *len);

#define LG_CHUNK_TEXT_MAX 512 /* text bytes the fast reader keeps in the chunk itself */

/* What one chunk (or a whole non-streamed response) says. */
struct lg_chunk {
    int is_token;
    const char *text; /* generated text; points into the chunk (text_buf or the parsed
                       * JSON), valid until lg_chunk_clear; NULL when none */
    size_t text_len;
    int has_usage;
    int64_t prompt_tokens;     /* -1 when absent */
    int64_t completion_tokens; /* -1 when absent */
    int64_t cached_tokens;     /* prompt_tokens_details.cached_tokens, -1 when absent */
    int is_error;              /* an {"error": ...} object or "object": "error" */
    char error[256];
    json_t *root; /* owned; released by lg_chunk_clear; NULL when read by the fast path */
    char text_buf[LG_CHUNK_TEXT_MAX + 1];
};

/* Parses one SSE data payload (not "[DONE]"). Returns 0, or TANDEM_EPROTO
 * when it is not a JSON object (out->error says why). Call lg_chunk_clear
 * after each successful parse.
 *
 * The chunks Tandem's router and vLLM stream are read by a small scanner
 * without a DOM (one per token made jansson the load generator's largest
 * cost): strict JSON, choices[0] text / delta / message, finish_reason,
 * usage. Anything it does not take for certain (an error object, a
 * duplicate key it reads, a non-integer count, a number jansson could
 * refuse, text over LG_CHUNK_TEXT_MAX bytes, a NUL in a key, invalid JSON or
 * UTF-8) is read by lg_openai_parse_chunk_json instead, so the result is
 * always that function's (tests/router/test_oa_stream.c compares them). */
int lg_openai_parse_chunk(enum lg_api api, const char *data, size_t len, struct lg_chunk *out);

/* The same, always through jansson: the reference for the fast path. */
int lg_openai_parse_chunk_json(enum lg_api api, const char *data, size_t len, struct lg_chunk *out);
void lg_chunk_clear(struct lg_chunk *c);

/* The message of an error body: error.message, or message, or the start of
 * the body itself; always NUL-terminated in out. */
void lg_openai_error_message(const char *body, size_t len, char *out, size_t outlen);

/* The first model id of a GET /v1/models body into out. 0 or TANDEM_EPROTO. */
int lg_openai_first_model(const char *body, size_t len, char *out, size_t outlen);

#endif
