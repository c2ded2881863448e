/* The router's OpenAI-compatible API layer, as pure functions: no sockets,
 * no event loop. The router's HTTP handlers call them.
 *
 *   request body --oa_parse--> struct oa_request   (types, ranges, OpenAI errors)
 *             --oa_resolve_model--> served model    (400 model_not_found)
 *             --oa_prompt_build--> token ids + prompt text (chat template, tokenizer)
 *             --oa_check_context--> effective max_tokens (400 context_length_exceeded)
 *   worker tokens --oa_output_token--> text (valid UTF-8, stop strings cut)
 *             --oa_output_chunk / oa_output_finish--> response or SSE chunk JSON
 *
 * Every failure is described by a struct oa_error (HTTP status, message,
 * type, param, code) that oa_error_json renders in OpenAI's shape
 * {"error": {"message", "type", "param", "code"}}. docs/api.md lists every
 * field, default, limit and error message.
 *
 * Memory: functions that return JSON text return a NUL-terminated string
 * from malloc() that the caller frees with free(). Structs named *_init /
 * *_fini (or oa_request_fini, oa_prompt_fini) own what they point to.
 *
 * Threading: nothing here is locked and nothing is global; every function
 * may be called from any thread on objects that thread owns (the router uses
 * them on its loop thread). */
#ifndef TANDEM_OPENAI_H
#define TANDEM_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "sampler.h"
#include "tokenizer.h"

#define OA_MAX_STOP       4   /* stop strings per request (OpenAI's limit) */
#define OA_MAX_STOP_BYTES 256 /* bytes in one stop string */
#define OA_MAX_STOP_IDS   16  /* stop_token_ids per request (the scheduler's SCHED_MAX_STOP) */
#define OA_MAX_LOGPROBS                                                                            \
    5                            /* alternatives per token the workers report (WIRE_MAX_LOGPROBS); \
                                    completions' `logprobs` is 0..5 */
#define OA_MAX_CHAT_TOP       20 /* chat `top_logprobs` accepted up to this, then capped at 5 */
#define OA_DEFAULT_MAX_TOKENS 16 /* completions' default max_tokens (OpenAI's) */
#define OA_ERR_MESSAGE_MAX    512 /* bytes of an error message, with the NUL */
#define OA_ERR_PARAM_MAX      64  /* bytes of an error's param, with the NUL */
#define OA_ID_MAX             48  /* bytes of a response id, with the NUL */
#define OA_MODEL_MAX          128 /* bytes of a model name kept by struct oa_output, with the NUL */

enum oa_kind { OA_KIND_COMPLETION = 1, OA_KIND_CHAT = 2 };

/* ------------------------------------------------------------------ errors */

struct oa_error {
    int status;                       /* HTTP status: 400, 429, 500, 503, ... */
    const char *type;                 /* static: "invalid_request_error", "server_error", ... */
    const char *code;                 /* static, e.g. "model_not_found"; NULL: the JSON code is
                                         the integer status (as common/http.c and vLLM do) */
    char param[OA_ERR_PARAM_MAX];     /* offending field ("messages[1].role"); "": null */
    char message[OA_ERR_MESSAGE_MAX]; /* valid UTF-8 */
};

/* Fills e (any previous content is overwritten). param may be NULL (null in
 * JSON); type and code must be static strings (code may be NULL). The message
 * is printf-formatted and cut at a UTF-8 character boundary if too long.
 * Returns TANDEM_EINVAL, so a parser can `return oa_error_set(...)`. */
int oa_error_set(struct oa_error *e, int status, const char *type, const char *param,
                 const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* 503, type "server_error", code "service_unavailable":
 * "No healthy <role> endpoint is available; try again later." (role e.g.
 * "decode", "prefill"). */
void oa_error_no_endpoint(struct oa_error *e, const char *role);

/* 429, type "rate_limit_error", code "rate_limit_exceeded": the router is
 * saturated. The router adds the Retry-After header (retry_after_s is only
 * quoted in the message). */
void oa_error_saturated(struct oa_error *e, int retry_after_s);

/* 500, type "server_error", code "internal_error", with msg (may be NULL). */
void oa_error_internal(struct oa_error *e, const char *msg);

/* {"error":{"message":...,"type":...,"param":...|null,"code":...}} as a new
 * string (free()), or NULL when out of memory. */
char *oa_error_json(const struct oa_error *e);

/* ----------------------------------------------------------------- request */

/* A parsed request. Strings point into the parsed JSON document, which the
 * request owns: they are valid, NUL-terminated UTF-8, until oa_request_fini. */
struct oa_request {
    enum oa_kind kind;
    const char *model; /* NULL when absent or null (oa_resolve_model then picks the first
                          served model, as vLLM does) */

    /* Completions: exactly one of prompt_text / prompt_ids is set. */
    const char *prompt_text; /* (prompt_len) bytes */
    size_t prompt_len;
    uint32_t *prompt_ids; /* (n_prompt_ids) owned; token-id prompt, used verbatim (no BOS added) */
    int n_prompt_ids;
    int echo; /* prepend the prompt to the completion */

    /* Chat. */
    struct chat_message *messages; /* (n_messages) owned; contents point into the document or
                                      into the request's joined text parts */
    int n_messages;
    int add_generation_prompt; /* vLLM extension, default 1 */

    /* Generation. */
    int max_tokens;    /* as given (chat: max_completion_tokens, else max_tokens), or -1;
                          oa_check_context replaces it by the effective value */
    float temperature; /* [0, 2], default 1 */
    float top_p;       /* (0, 1], default 1 */
    int top_k;         /* 0 = off (-1 is accepted and stored as 0), or >= 1 */
    int has_seed;      /* 1: seed was given */
    uint64_t seed;     /* any JSON int64, two's complement */
    const char *stop[OA_MAX_STOP]; /* stop strings, (stop_len[i]) bytes each, none empty */
    size_t stop_len[OA_MAX_STOP];
    int n_stop;
    uint32_t stop_ids[OA_MAX_STOP_IDS]; /* stop_token_ids (vLLM extension) */
    int n_stop_ids;
    int ignore_eos; /* vLLM extension */

    /* Output. */
    int stream;
    int include_usage; /* stream_options.include_usage */
    int logprobs;      /* 1: return logprobs (completions: `logprobs` present, 0..5;
                          chat: `logprobs` true) */
    int top_logprobs;  /* alternatives per token to ask the workers for, 0..OA_MAX_LOGPROBS
                          (chat values 6..20 are capped at 5) */
    const char *user;  /* NULL when absent */

    /* Private. */
    struct json_t *doc;
    char **owned; /* (n_owned) joined content parts */
    int n_owned;
};

/* Parses and validates a POST /v1/completions (OA_KIND_COMPLETION) or POST
 * /v1/chat/completions (OA_KIND_CHAT) body of len bytes (need not be
 * NUL-terminated). Unknown fields are ignored (as vLLM does). Fields are
 * checked in a fixed order and the first problem is reported. On success req
 * is filled (release with oa_request_fini). On failure req is left empty
 * (oa_request_fini is still safe) and err says why (400, or 500 when out of
 * memory). Returns 0, TANDEM_EINVAL or TANDEM_ENOMEM. */
int oa_parse(enum oa_kind kind, const char *body, size_t len, struct oa_request *req,
             struct oa_error *err);

/* Releases everything req owns and zeroes it. Safe on a zeroed or failed
 * request; req itself is the caller's. */
void oa_request_fini(struct oa_request *req);

/* A model the router serves (the router owns these). */
struct oa_model {
    const char *id;  /* name clients send as "model" */
    int max_context; /* tokens: prompt + completion */
    int vocab_size;  /* token ids must be below it */
    int64_t created; /* unix seconds, for /v1/models */
};

/* The model req names among models[0..n), or models[0] when req->model is
 * NULL. Returns NULL with err = 400 code "model_not_found" param "model"
 * ("The model `x` does not exist.") when none matches or n == 0. */
const struct oa_model *oa_resolve_model(const struct oa_request *req, const struct oa_model *models,
                                        int n, struct oa_error *err);

/* The prompt of a request, ready for the scheduler. */
struct oa_prompt {
    uint32_t *ids; /* (n_ids) owned */
    int n_ids;
    char *text; /* owned, NUL-terminated valid UTF-8: the prompt string, the rendered chat
                   template, or the decoded token ids (invalid bytes as U+FFFD); used for echo */
    size_t text_len;
};

/* Builds the prompt: chat messages are rendered with chat_template_render;
 * text is tokenized with tok, with BOS first when add_bos (the router passes
 * 1, as vLLM adds special tokens by default); token-id prompts are copied as
 * given. Returns 0 (release p with oa_prompt_fini), or with err filled:
 * TANDEM_EINVAL (400, a token id at or above tok's vocabulary size, param
 * "prompt"), TANDEM_ETOOBIG (400, text past TOK_MAX_TEXT) or TANDEM_ENOMEM
 * (500). p is empty on failure. */
int oa_prompt_build(const struct oa_request *req, const struct tokenizer *tok, int add_bos,
                    struct oa_prompt *p, struct oa_error *err);

void oa_prompt_fini(struct oa_prompt *p);

/* Checks the prompt against the model and resolves max_tokens, after vLLM:
 *  - a token id >= m->vocab_size in a token-id prompt: 400 param "prompt";
 *  - n_prompt == 0: 400 code "invalid_value" (the scheduler needs a token);
 *  - max_tokens given and n_prompt + max_tokens > max_context: 400 code
 *    "context_length_exceeded", "This model's maximum context length is N
 *    tokens. However, you requested M tokens (P in the messages, C in the
 *    completion). Please reduce the length of the messages or completion.";
 *  - max_tokens not given and n_prompt >= max_context: the same code, "This
 *    model's maximum context length is N tokens. However, your request has P
 *    input tokens. Please reduce the length of the input messages.";
 *  - otherwise req->max_tokens becomes the given value, or max_context -
 *    n_prompt (chat), or min(16, max_context - n_prompt) (completions).
 * param is "messages" (chat) or "prompt". Returns 0 or TANDEM_EINVAL. */
int oa_check_context(struct oa_request *req, const struct oa_model *m, int n_prompt,
                     struct oa_error *err);

/* -------------------------------------------------- text decoding, stop strings */

/* Output space that always suffices for one oa_textdec_push/flush. */
#define OA_TEXTDEC_OUT_MAX (TOK_UTF8_OUT_MAX(TOK_MAX_PIECE) + OA_MAX_STOP_BYTES)

/* Per-request detokenizer for generated tokens: decodes each token with
 * tok_decode_piece (after the previous one), repairs UTF-8 with struct
 * tok_utf8 (a character split over tokens is held back until complete), and
 * finds stop strings: text that could be the start of a stop string is held
 * back until it is known not to be one, so a stop string split over any
 * number of tokens is found, the text before it is released, and nothing
 * from its first byte on is. Every piece of released text is valid UTF-8 on
 * its own. Embed it; no heap. Not thread-safe (one per request). */
struct oa_textdec {
    /* What each token touches comes first (stop strings aside). */
    const struct tokenizer *tok;
    struct tok_utf8 utf8;
    uint32_t prev; /* last token pushed (TOK_NO_PREV at start) */
    int n_stop;
    size_t n_held;  /* released-pending text: a possible stop-string prefix */
    int stopped;    /* a stop string was found: nothing more is released */
    int stop_index; /* which one (index into the stops given), or -1 */
    size_t stop_len[OA_MAX_STOP];
    char stop[OA_MAX_STOP][OA_MAX_STOP_BYTES];
    char held[OA_MAX_STOP_BYTES];
};

/* prev: the token before the first generated one (the last prompt token), or
 * TOK_NO_PREV. stop[0..n_stop) (n_stop <= OA_MAX_STOP, each 1..OA_MAX_STOP_BYTES
 * bytes of valid UTF-8) are copied. Returns 0 or TANDEM_EINVAL. */
int oa_textdec_init(struct oa_textdec *d, const struct tokenizer *tok, uint32_t prev,
                    const char *const *stop, const size_t *stop_len, int n_stop);

/* Decodes one generated token and writes the text now known to be final to
 * out (not NUL-terminated). Returns the number of bytes written (possibly 0),
 * TANDEM_ERANGE (token outside the vocabulary; state unchanged), or
 * TANDEM_ETOOBIG when cap < OA_TEXTDEC_OUT_MAX. After a stop string was found
 * (d->stopped) it writes nothing. */
int oa_textdec_push(struct oa_textdec *d, uint32_t token, char *out, size_t cap);

/* End of generation: releases the held-back text (an incomplete UTF-8
 * character becomes U+FFFD), still cutting at a stop string it completes.
 * Returns bytes written, or TANDEM_ETOOBIG when cap < OA_TEXTDEC_OUT_MAX. */
int oa_textdec_flush(struct oa_textdec *d, char *out, size_t cap);

/* ------------------------------------------------------------ responses */

enum oa_finish {
    OA_FINISH_STOP = 1, /* "stop": EOS, a stop token id or a stop string */
    OA_FINISH_LENGTH,   /* "length": max_tokens or the context reached */
    OA_FINISH_ABORT,    /* "abort" (vLLM): the request was aborted by the server */
};

/* "stop", "length", "abort"; NULL for other values. */
const char *oa_finish_name(enum oa_finish f);

/* Formats a response id: "cmpl-" (completions) or "chatcmpl-" followed by
 * 16 hex digits of n. The caller makes n unique (for example a random
 * per-process value plus a request counter). buf holds OA_ID_MAX bytes. */
void oa_format_id(enum oa_kind kind, uint64_t n, char *buf);

/* One request's output: collects the tokens the workers send, turns them into
 * text (struct oa_textdec), and renders the OpenAI response (non-streaming)
 * or SSE chunks (streaming). Fields are private. Not thread-safe. */
struct oa_logprob {
    uint32_t token;
    float logprob; /* NaN: null (the first prompt token, or a prompt position not reported) */
    int n_top;
    struct sampler_top top[OA_MAX_LOGPROBS]; /* most likely first */
};

/* A reusable text buffer that the streamed-path renderer appends JSON to. */
struct oa_jbuf {
    char *p; /* (len) bytes, NUL-terminated when len > 0; owned */
    size_t len, cap;
    int bad; /* an append failed (memory, or a string that is not valid UTF-8) */
};

struct oa_output {
    /* What each generated token touches comes first (oa_output_token,
     * oa_output_delta), then the detokenizer's head. */
    enum oa_kind kind;
    int stream, logprobs;
    int began, finished;
    int n_tokens;        /* generated tokens accepted: usage.completion_tokens */
    int n_unsent;        /* of those, since the last chunk, EOS and stop_ids aside */
    uint32_t last_token; /* last generated token accepted */
    int n_stop_ids;
    int n_lp, lp_cap;
    char *text; /* (text_len) text not yet rendered (streaming) or all of it */
    size_t text_len, text_cap;
    const struct tokenizer *tok;
    struct oa_textdec dec;
    int include_usage, top_logprobs, echo;
    uint32_t stop_ids[OA_MAX_STOP_IDS];
    char id[OA_ID_MAX];
    char *model; /* owned copy */
    int64_t created;
    struct oa_logprob *lp; /* (n_lp) records not yet rendered (streaming) or all of them */
    int n_prompt_lp;    /* echo + logprobs: lp[0..n_prompt_lp) are the prompt's records until
                           rendered */
    uint32_t lp_prev;   /* token before lp[0], for its text */
    size_t text_offset; /* completions logprobs text_offset of lp[0] (codepoints) */
    struct oa_jbuf out;     /* the JSON being rendered (oa_output_chunk_ref's text) */
    struct oa_jbuf side[3]; /* completions logprobs: token_logprobs, top_logprobs, text_offset */
};

/* Prepares o for req (whose fields are copied: req may be released before
 * o), with prompt p (echo text and token ids are copied when needed), the
 * tokenizer that decodes generated tokens (must outlive o), the response id
 * (oa_format_id), the model name to report and the creation time (unix s).
 * Returns 0 (release with oa_output_fini), TANDEM_EINVAL or TANDEM_ENOMEM. */
int oa_output_init(struct oa_output *o, const struct oa_request *req, const struct oa_prompt *p,
                   const struct tokenizer *tok, const char *id, const char *model, int64_t created);

void oa_output_fini(struct oa_output *o);

/* Streaming chat only: the first chunk, delta {"role":"assistant","content":""}
 * (send it as soon as the stream starts). *json = a new string (free()), or
 * NULL when there is no such chunk (completions, non-streaming, or already
 * sent). Returns 0 or TANDEM_ENOMEM. */
int oa_output_begin(struct oa_output *o, char **json);

/* echo with logprobs: the worker's prompt logprobs, in sched_callbacks'
 * on_prompt_logprobs layout (logprob[j] for prompt token first + j, first >=
 * 1; top[j * n_top ..] its alternatives, at most OA_MAX_LOGPROBS used). Call
 * before the first oa_output_token. Ignored otherwise. Returns 0 or
 * TANDEM_EINVAL (positions outside the prompt). */
int oa_output_prompt_logprobs(struct oa_output *o, int first, int n, const float *logprob,
                              const struct sampler_top *top, int n_top);

#define OA_STOPPED 1 /* oa_output_token: a stop string ended the completion */

/* One generated token, in order (EOS and stop ids included, as the workers
 * report them), with its logprob and top[0..n_top) alternatives (used only
 * when logprobs were asked for). Returns 0; OA_STOPPED when this token
 * completed a stop string, or when the output already stopped or finished
 * (the token is then ignored): the router cancels the request on its worker
 * and calls oa_output_finish; TANDEM_ERANGE (token outside the vocabulary),
 * or TANDEM_ENOMEM. */
int oa_output_token(struct oa_output *o, uint32_t token, float logprob,
                    const struct sampler_top *top, int n_top);

/* Streaming: a chunk carrying the text and logprobs gathered since the last
 * one (the echoed prompt first). As vLLM, a token that adds no text (a partial
 * character, text held back as a possible stop string, or a token that
 * decodes to nothing) still gets a chunk, with empty text, so clients see
 * every token arrive; EOS and stop_token_ids alone do not (the finish chunk
 * follows them). *json = a new string (free()), or NULL when there is nothing
 * to send. Returns 0, TANDEM_ENOMEM, or TANDEM_EINVAL when not streaming or
 * already finished. */
int oa_output_chunk(struct oa_output *o, char **json);

/* oa_output_chunk without the copy: *json = the chunk in o's own buffer,
 * (*len) bytes and NUL-terminated, valid until the next call on o (NULL and 0
 * when there is nothing to send). The router's per-token path. Same returns. */
int oa_output_chunk_ref(struct oa_output *o, const char **json, size_t *len);

/* oa_output_chunk_ref's content without the JSON, for a host that takes a
 * stream as data (the offline simulator): *text ((*len) bytes, valid until
 * the next call on o) is the text of the chunk oa_output_chunk_ref would
 * render now, *role 1 when that chunk would carry the chat role. o advances
 * exactly as rendering would. Returns 1 (a chunk), 0 (nothing to send), or
 * TANDEM_EINVAL when not streaming, already finished, or logprobs were asked
 * for (their chunks are rendered). */
int oa_output_delta(struct oa_output *o, const char **text, size_t *len, int *role);

/* The end of the request. reason is what the worker reported; a stop string
 * found by oa_output_token makes it "stop" whatever reason says. usage:
 * prompt_tokens and cached_tokens as given, completion_tokens = tokens
 * accepted by oa_output_token. stop_reason (vLLM extension) is the stop
 * string, or the stop token id that ended it, or null.
 *   Non-streaming: *body = the whole text_completion / chat.completion object,
 *   *usage_chunk = NULL.
 *   Streaming: *body = the last chunk (remaining text and logprobs, and
 *   finish_reason); *usage_chunk = with include_usage, a chunk with empty
 *   choices and the usage, else NULL. The router then sends "data: [DONE]".
 * Strings are new (free()). usage_chunk may be NULL when not streaming.
 * Returns 0, TANDEM_EINVAL (already finished, bad reason) or TANDEM_ENOMEM. */
int oa_output_finish(struct oa_output *o, enum oa_finish reason, int prompt_tokens,
                     int cached_tokens, char **body, char **usage_chunk);

/* --------------------------------------------------------------- models */

/* GET /v1/models: {"object":"list","data":[{"id","object":"model","created",
 * "owned_by":"tandem","root","max_model_len"}, ...]} as a new string
 * (free()), or NULL when out of memory. */
char *oa_models_json(const struct oa_model *models, int n);

#endif
