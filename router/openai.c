/* OpenAI-compatible API layer: request parsing and validation, prompt
 * building, output decoding with stop strings, response and chunk JSON
 * (see openai.h and docs/api.md). Requests parsed with jansson; responses and
 * chunks appended as JSON text (oa_jbuf), the bytes json_dumps gave. */
#include "openai.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

#define INVALID_REQUEST "invalid_request_error"

/* Responses carry float32 logprobs: 9 significant digits read back exactly. */
#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))
/* Values quoted in error messages: short, and 0.1 prints as 0.1. */
#define QUOTE_FLAGS (JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15))
#define QUOTE_MAX   48 /* bytes of a quoted value before "..." */

/* Display text of one token: its piece with invalid UTF-8 as U+FFFD. */
#define TOKEN_TEXT_MAX TOK_UTF8_OUT_MAX(TOK_MAX_PIECE)

/* ------------------------------------------------------------------ UTF-8 */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one
 * (the rules jansson enforces: no overlongs, no surrogates, <= U+10FFFF). */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t need;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 3;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 4;
    else
        return 0;
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    }
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0) || (c == 0xF0 && s[1] < 0x90) ||
        (c == 0xF4 && s[1] >= 0x90))
        return 0;
    return need;
}

/* Replaces every byte that is not part of a valid UTF-8 sequence with '?',
 * so a message quoting raw input (jansson's "near '...'") or cut by
 * snprintf can always be sent as a JSON string. */
static void utf8_scrub(char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len((const unsigned char *)s + i, n - i);
        if (k == 0) {
            s[i++] = '?';
        } else {
            i += k;
        }
    }
}

/* Unicode code points in s[0..n) (valid UTF-8). */
static size_t utf8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* ----------------------------------------------------------------- errors */

int oa_error_set(struct oa_error *e, int status, const char *type, const char *param,
                 const char *code, const char *fmt, ...)
{
    if (e == NULL)
        return TANDEM_EINVAL;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    utf8_scrub(e->param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    utf8_scrub(e->message);
    return TANDEM_EINVAL;
}

void oa_error_no_endpoint(struct oa_error *e, const char *role)
{
    oa_error_set(e, 503, "server_error", NULL, "service_unavailable",
                 "No healthy %s endpoint is available; try again later.", role ? role : "worker");
}

void oa_error_saturated(struct oa_error *e, int retry_after_s)
{
    oa_error_set(e, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
                 "The server is saturated: too many requests are pending. Retry after %d s.",
                 retry_after_s);
}

void oa_error_internal(struct oa_error *e, const char *msg)
{
    oa_error_set(e, 500, "server_error", NULL, "internal_error", "Internal server error%s%s",
                 msg ? ": " : ".", msg ? msg : "");
}

char *oa_error_json(const struct oa_error *e)
{
    if (e == NULL)
        return NULL;
    json_t *param = e->param[0] ? json_string(e->param) : json_null();
    json_t *code = e->code ? json_string(e->code) : json_integer(e->status);
    json_t *doc = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type",
                            e->type ? e->type : INVALID_REQUEST, "param", param, "code", code);
    if (doc == NULL)
        return NULL; /* json_pack released param and code */
    char *s = json_dumps(doc, DUMP_FLAGS);
    json_decref(doc);
    return s;
}

/* "an integer", "a string", ... as OpenAI's messages name JSON types. */
static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "a value";
}

/* v as compact JSON, at most QUOTE_MAX bytes then "...". */
static void quote(const json_t *v, char *buf, size_t cap)
{
    char *s = json_dumps(v, QUOTE_FLAGS);
    if (s == NULL) {
        snprintf(buf, cap, "%s", json_kind(v));
        return;
    }
    if (strlen(s) > QUOTE_MAX) {
        size_t cut = QUOTE_MAX - 3;
        while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80)
            cut--;
        snprintf(buf, cap, "%.*s...", (int)cut, s);
    } else {
        snprintf(buf, cap, "%s", s);
    }
    free(s);
}

static int err_type(struct oa_error *e, const char *param, const char *expected, const json_t *got)
{
    return oa_error_set(e, 400, INVALID_REQUEST, param, "invalid_type",
                        "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                        json_kind(got));
}

static int err_value(struct oa_error *e, const char *param, const char *expected, const json_t *got)
{
    char q[QUOTE_MAX + 8];
    quote(got, q, sizeof(q));
    return oa_error_set(e, 400, INVALID_REQUEST, param, "invalid_value",
                        "Invalid value for '%s': expected %s, but got %s.", param, expected, q);
}

static int err_unsupported(struct oa_error *e, const char *param, const char *supported,
                           const json_t *got)
{
    char q[QUOTE_MAX + 8];
    quote(got, q, sizeof(q));
    return oa_error_set(e, 400, INVALID_REQUEST, param, "unsupported_value",
                        "Unsupported value for '%s': this server supports only %s, but got %s.",
                        param, supported, q);
}

static int err_missing(struct oa_error *e, const char *param)
{
    return oa_error_set(e, 400, INVALID_REQUEST, param, "missing_required_parameter",
                        "Missing required parameter: '%s'.", param);
}

static int err_nomem(struct oa_error *e)
{
    oa_error_internal(e, "out of memory");
    return TANDEM_ENOMEM;
}

/* ----------------------------------------------------------- field access */

/* The value of key, or NULL when absent or JSON null (OpenAI treats an
 * explicit null as "not given"). */
static json_t *field(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* An integer, or a real with an integral value (pydantic, behind vLLM,
 * accepts 16.0 for an int field). Returns 1 and sets *out, else 0. */
static int as_int(const json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && d >= -9.0e18 && d <= 9.0e18) {
            *out = (long long)d;
            return 1;
        }
    }
    return 0;
}

static int get_bool(const json_t *doc, const char *key, int *out, struct oa_error *e)
{
    json_t *v = field(doc, key);
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return err_type(e, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

/* *v = the field when given; type-checked as a number. */
static int get_number(const json_t *doc, const char *key, json_t **v, double *out,
                      struct oa_error *e)
{
    *v = field(doc, key);
    if (*v == NULL)
        return 0;
    if (!json_is_number(*v))
        return err_type(e, key, "a number", *v);
    *out = json_number_value(*v);
    return 0;
}

static int get_int(const json_t *doc, const char *key, json_t **v, long long *out,
                   struct oa_error *e)
{
    *v = field(doc, key);
    if (*v == NULL)
        return 0;
    if (!as_int(*v, out))
        return err_type(e, key, "an integer", *v);
    return 0;
}

/* ------------------------------------------------------------ the request */

static int parse_ids(struct oa_request *r, const json_t *arr, const char *name, struct oa_error *e)
{
    size_t n = json_array_size(arr);
    if (n == 0)
        return err_value(e, name, "a non-empty array of token ids", arr);
    if (n > INT_MAX)
        return err_value(e, name, "fewer token ids", arr);
    r->prompt_ids = malloc(n * sizeof(uint32_t));
    if (r->prompt_ids == NULL)
        return err_nomem(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        char pn[OA_ERR_PARAM_MAX];
        long long x = 0;
        snprintf(pn, sizeof(pn), "%s[%zu]", name, i);
        if (!as_int(v, &x))
            return err_type(e, pn, "an integer token id", v);
        if (x < 0 || x > (long long)UINT32_MAX)
            return err_value(e, pn, "a token id between 0 and 4294967295", v);
        r->prompt_ids[i] = (uint32_t)x;
    }
    r->n_prompt_ids = (int)n;
    return 0;
}

static int parse_prompt(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    const json_t *p = field(doc, "prompt");
    if (p == NULL)
        return err_missing(e, "prompt");
    if (json_is_string(p)) {
        r->prompt_text = json_string_value(p);
        r->prompt_len = json_string_length(p);
        return 0;
    }
    if (!json_is_array(p))
        return err_type(e, "prompt", "a string or an array of token ids", p);
    size_t n = json_array_size(p);
    if (n == 0)
        return err_value(e, "prompt", "a string or a non-empty array of token ids", p);
    const json_t *first = json_array_get(p, 0);
    if (json_is_string(first) || json_is_array(first)) {
        /* A list of prompts: a batch, unless it holds exactly one. */
        if (n > 1)
            return oa_error_set(e, 400, INVALID_REQUEST, "prompt", "unsupported_value",
                                "batched prompts are not supported: 'prompt' must be a string "
                                "or one array of token ids, but got an array of %zu prompts.",
                                n);
        if (json_is_string(first)) {
            r->prompt_text = json_string_value(first);
            r->prompt_len = json_string_length(first);
            return 0;
        }
        return parse_ids(r, first, "prompt[0]", e);
    }
    return parse_ids(r, p, "prompt", e);
}

/* Keeps a string the request owns (joined content parts). */
static int own(struct oa_request *r, char *s)
{
    char **o = realloc(r->owned, (size_t)(r->n_owned + 1) * sizeof(*o));
    if (o == NULL)
        return TANDEM_ENOMEM;
    r->owned = o;
    r->owned[r->n_owned++] = s;
    return 0;
}

/* content: a string, or content parts of type "text" joined with "\n" (as
 * vLLM joins them). */
static int parse_content(struct oa_request *r, struct chat_message *m, const json_t *c, size_t idx,
                         struct oa_error *e)
{
    char pn[OA_ERR_PARAM_MAX];
    if (json_is_string(c)) {
        m->content = json_string_value(c);
        m->content_len = json_string_length(c);
        return 0;
    }
    snprintf(pn, sizeof(pn), "messages[%zu].content", idx);
    if (!json_is_array(c))
        return err_type(e, pn, "a string or an array of content parts", c);
    size_t n = json_array_size(c), total = 0;
    for (size_t j = 0; j < n; j++) {
        const json_t *part = json_array_get(c, j);
        snprintf(pn, sizeof(pn), "messages[%zu].content[%zu]", idx, j);
        if (!json_is_object(part))
            return err_type(e, pn, "an object", part);
        const json_t *type = field(part, "type");
        snprintf(pn, sizeof(pn), "messages[%zu].content[%zu].type", idx, j);
        if (type == NULL)
            return err_missing(e, pn);
        if (!json_is_string(type))
            return err_type(e, pn, "a string", type);
        if (strcmp(json_string_value(type), "text") != 0)
            return err_unsupported(e, pn, "\"text\"", type);
        const json_t *text = field(part, "text");
        snprintf(pn, sizeof(pn), "messages[%zu].content[%zu].text", idx, j);
        if (text == NULL)
            return err_missing(e, pn);
        if (!json_is_string(text))
            return err_type(e, pn, "a string", text);
        total += json_string_length(text) + (j > 0);
    }
    if (n == 0) {
        m->content = "";
        m->content_len = 0;
        return 0;
    }
    if (n == 1) {
        const json_t *text = json_object_get(json_array_get(c, 0), "text");
        m->content = json_string_value(text);
        m->content_len = json_string_length(text);
        return 0;
    }
    char *s = malloc(total + 1);
    if (s == NULL || own(r, s) != 0) {
        free(s);
        return err_nomem(e);
    }
    char *p = s;
    for (size_t j = 0; j < n; j++) {
        const json_t *text = json_object_get(json_array_get(c, j), "text");
        if (j > 0)
            *p++ = '\n';
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    *p = '\0';
    m->content = s;
    m->content_len = total;
    return 0;
}

static int parse_messages(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    const json_t *msgs = field(doc, "messages");
    if (msgs == NULL)
        return err_missing(e, "messages");
    if (!json_is_array(msgs))
        return err_type(e, "messages", "an array", msgs);
    size_t n = json_array_size(msgs);
    if (n == 0)
        return err_value(e, "messages", "a non-empty array", msgs);
    if (n > INT_MAX)
        return err_value(e, "messages", "fewer messages", msgs);
    r->messages = calloc(n, sizeof(*r->messages));
    if (r->messages == NULL)
        return err_nomem(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        char pn[OA_ERR_PARAM_MAX];
        snprintf(pn, sizeof(pn), "messages[%zu]", i);
        if (!json_is_object(m))
            return err_type(e, pn, "an object", m);
        const json_t *role = field(m, "role");
        snprintf(pn, sizeof(pn), "messages[%zu].role", i);
        if (role == NULL)
            return err_missing(e, pn);
        if (!json_is_string(role))
            return err_type(e, pn, "a string", role);
        struct chat_message *cm = &r->messages[i];
        if (chat_role_parse(json_string_value(role), &cm->role) != 0)
            return err_value(e, pn, "one of 'system', 'developer', 'user', 'assistant' or 'tool'",
                             role);
        const json_t *content = field(m, "content");
        if (content == NULL) {
            /* An assistant turn may carry only tool calls. */
            snprintf(pn, sizeof(pn), "messages[%zu].content", i);
            if (cm->role != CHAT_ROLE_ASSISTANT)
                return err_missing(e, pn);
            cm->content = "";
            cm->content_len = 0;
        } else {
            int rc = parse_content(r, cm, content, i, e);
            if (rc != 0)
                return rc;
        }
        r->n_messages = (int)i + 1;
    }
    return 0;
}

static int add_stop(struct oa_request *r, const json_t *s, const char *pn, struct oa_error *e)
{
    size_t len = json_string_length(s);
    if (len == 0)
        return 0; /* an empty stop string matches nothing useful: ignored */
    if (len > OA_MAX_STOP_BYTES)
        return oa_error_set(e, 400, INVALID_REQUEST, pn, "invalid_value",
                            "Invalid value for '%s': expected a string of at most %d bytes, but "
                            "got %zu bytes.",
                            pn, OA_MAX_STOP_BYTES, len);
    r->stop[r->n_stop] = json_string_value(s);
    r->stop_len[r->n_stop] = len;
    r->n_stop++;
    return 0;
}

static int parse_stop(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    const json_t *s = field(doc, "stop");
    if (s == NULL)
        return 0;
    if (json_is_string(s))
        return add_stop(r, s, "stop", e);
    if (!json_is_array(s))
        return err_type(e, "stop", "a string or an array of strings", s);
    size_t n = json_array_size(s);
    if (n > OA_MAX_STOP)
        return oa_error_set(e, 400, INVALID_REQUEST, "stop", "invalid_value",
                            "Invalid value for 'stop': expected at most %d stop sequences, but "
                            "got %zu.",
                            OA_MAX_STOP, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(s, i);
        char pn[OA_ERR_PARAM_MAX];
        snprintf(pn, sizeof(pn), "stop[%zu]", i);
        if (!json_is_string(v))
            return err_type(e, pn, "a string", v);
        int rc = add_stop(r, v, pn, e);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int parse_stop_ids(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    const json_t *s = field(doc, "stop_token_ids");
    if (s == NULL)
        return 0;
    if (!json_is_array(s))
        return err_type(e, "stop_token_ids", "an array of token ids", s);
    size_t n = json_array_size(s);
    if (n > OA_MAX_STOP_IDS)
        return oa_error_set(e, 400, INVALID_REQUEST, "stop_token_ids", "invalid_value",
                            "Invalid value for 'stop_token_ids': expected at most %d token ids, "
                            "but got %zu.",
                            OA_MAX_STOP_IDS, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(s, i);
        char pn[OA_ERR_PARAM_MAX];
        long long x = 0;
        snprintf(pn, sizeof(pn), "stop_token_ids[%zu]", i);
        if (!as_int(v, &x))
            return err_type(e, pn, "an integer token id", v);
        if (x < 0 || x > (long long)UINT32_MAX)
            return err_value(e, pn, "a token id between 0 and 4294967295", v);
        r->stop_ids[r->n_stop_ids++] = (uint32_t)x;
    }
    return 0;
}

static int parse_max_tokens(struct oa_request *r, const json_t *doc, const char *key,
                            struct oa_error *e)
{
    json_t *v;
    long long x = 0;
    int rc = get_int(doc, key, &v, &x, e);
    if (rc != 0 || v == NULL)
        return rc;
    if (x < 1 || x > INT_MAX)
        return err_value(e, key, "an integer between 1 and 2147483647", v);
    r->max_tokens = (int)x;
    return 0;
}

static int parse_sampling(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    json_t *v;
    double d = 0.0;
    long long x = 0;
    int rc;

    if ((rc = get_number(doc, "temperature", &v, &d, e)) != 0)
        return rc;
    if (v != NULL) {
        if (!(d >= 0.0 && d <= 2.0))
            return err_value(e, "temperature", "a number between 0 and 2", v);
        r->temperature = (float)d;
    }
    if ((rc = get_number(doc, "top_p", &v, &d, e)) != 0)
        return rc;
    if (v != NULL) {
        if (!(d > 0.0 && d <= 1.0))
            return err_value(e, "top_p", "a number greater than 0 and at most 1", v);
        r->top_p = (float)d;
    }
    if ((rc = get_int(doc, "top_k", &v, &x, e)) != 0)
        return rc;
    if (v != NULL) {
        if (x < -1)
            return err_value(e, "top_k", "-1 or 0 (off) or an integer >= 1", v);
        r->top_k = x <= 0 ? 0 : x > INT_MAX ? INT_MAX : (int)x;
    }
    if ((rc = get_int(doc, "seed", &v, &x, e)) != 0)
        return rc;
    if (v != NULL) {
        r->has_seed = 1;
        r->seed = (uint64_t)x;
    }
    if ((rc = parse_stop(r, doc, e)) != 0)
        return rc;
    if ((rc = parse_stop_ids(r, doc, e)) != 0)
        return rc;
    return get_bool(doc, "ignore_eos", &r->ignore_eos, e);
}

static int parse_stream(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    int rc = get_bool(doc, "stream", &r->stream, e);
    if (rc != 0)
        return rc;
    const json_t *so = field(doc, "stream_options");
    if (so == NULL)
        return 0;
    if (!json_is_object(so))
        return err_type(e, "stream_options", "an object", so);
    if (!r->stream)
        return oa_error_set(e, 400, INVALID_REQUEST, "stream_options", "invalid_value",
                            "Invalid value for 'stream_options': it is only allowed when "
                            "'stream' is true.");
    const json_t *iu = field(so, "include_usage");
    if (iu != NULL && !json_is_boolean(iu))
        return err_type(e, "stream_options.include_usage", "a boolean", iu);
    r->include_usage = iu != NULL && json_is_true(iu);
    return 0;
}

static int parse_logprobs(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    json_t *v;
    long long x = 0;
    int rc;
    if (r->kind == OA_KIND_COMPLETION) {
        if ((rc = get_int(doc, "logprobs", &v, &x, e)) != 0)
            return rc;
        if (v != NULL) {
            if (x < 0 || x > OA_MAX_LOGPROBS)
                return err_value(e, "logprobs", "an integer between 0 and 5", v);
            r->logprobs = 1;
            r->top_logprobs = (int)x;
        }
        return get_bool(doc, "echo", &r->echo, e);
    }
    if ((rc = get_bool(doc, "logprobs", &r->logprobs, e)) != 0)
        return rc;
    if ((rc = get_int(doc, "top_logprobs", &v, &x, e)) != 0)
        return rc;
    if (v != NULL) {
        if (x < 0 || x > OA_MAX_CHAT_TOP)
            return err_value(e, "top_logprobs", "an integer between 0 and 20", v);
        if (x > 0 && !r->logprobs)
            return oa_error_set(e, 400, INVALID_REQUEST, "top_logprobs", "invalid_value",
                                "Invalid value for 'top_logprobs': it requires 'logprobs' to be "
                                "true.");
        r->top_logprobs = x > OA_MAX_LOGPROBS ? OA_MAX_LOGPROBS : (int)x;
    }
    return 0;
}

/* Parameters we accept only at their neutral value. */
static int parse_unsupported(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    static const struct {
        const char *key;
        double neutral;
    } numbers[] = {{"presence_penalty", 0.0},
                   {"frequency_penalty", 0.0},
                   {"repetition_penalty", 1.0},
                   {"best_of", 1.0}};
    static const char *const numbers_text[] = {"0", "0", "1", "1"};
    for (size_t i = 0; i < sizeof(numbers) / sizeof(numbers[0]); i++) {
        json_t *v;
        double d = 0.0;
        int rc = get_number(doc, numbers[i].key, &v, &d, e);
        if (rc != 0)
            return rc;
        if (v != NULL && d != numbers[i].neutral)
            return err_unsupported(e, numbers[i].key, numbers_text[i], v);
    }
    const json_t *v = field(doc, "logit_bias");
    if (v != NULL && !(json_is_object(v) && json_object_size(v) == 0))
        return err_unsupported(e, "logit_bias", "null or {}", v);
    if (r->kind == OA_KIND_COMPLETION) {
        v = field(doc, "suffix");
        if (v != NULL && !(json_is_string(v) && json_string_length(v) == 0))
            return err_unsupported(e, "suffix", "null or \"\"", v);
    } else {
        v = field(doc, "tools");
        if (v != NULL && !(json_is_array(v) && json_array_size(v) == 0))
            return err_unsupported(e, "tools", "null or []", v);
    }
    v = field(doc, "response_format");
    if (v != NULL) {
        const json_t *t = json_is_object(v) ? field(v, "type") : NULL;
        if (!(json_is_string(t) && strcmp(json_string_value(t), "text") == 0))
            return err_unsupported(e, "response_format", "{\"type\": \"text\"}", v);
    }
    return 0;
}

static int parse_doc(struct oa_request *r, const json_t *doc, struct oa_error *e)
{
    json_t *v;
    long long x = 0;
    int rc;

    v = field(doc, "model");
    if (v != NULL) {
        if (!json_is_string(v))
            return err_type(e, "model", "a string", v);
        r->model = json_string_value(v);
    }
    rc = r->kind == OA_KIND_CHAT ? parse_messages(r, doc, e) : parse_prompt(r, doc, e);
    if (rc != 0)
        return rc;
    if (r->kind == OA_KIND_CHAT &&
        (rc = get_bool(doc, "add_generation_prompt", &r->add_generation_prompt, e)) != 0)
        return rc;
    if ((rc = get_int(doc, "n", &v, &x, e)) != 0)
        return rc;
    if (v != NULL && x != 1) {
        char q[QUOTE_MAX + 8];
        quote(v, q, sizeof(q));
        return oa_error_set(e, 400, INVALID_REQUEST, "n", "unsupported_value",
                            "n must be 1 (this server generates one choice per request), but "
                            "got %s.",
                            q);
    }
    if (r->kind == OA_KIND_CHAT) {
        /* max_completion_tokens replaces the deprecated max_tokens. */
        if ((rc = parse_max_tokens(r, doc, "max_tokens", e)) != 0)
            return rc;
        if ((rc = parse_max_tokens(r, doc, "max_completion_tokens", e)) != 0)
            return rc;
    } else if ((rc = parse_max_tokens(r, doc, "max_tokens", e)) != 0) {
        return rc;
    }
    if ((rc = parse_sampling(r, doc, e)) != 0)
        return rc;
    if ((rc = parse_stream(r, doc, e)) != 0)
        return rc;
    if ((rc = parse_logprobs(r, doc, e)) != 0)
        return rc;
    v = field(doc, "user");
    if (v != NULL) {
        if (!json_is_string(v))
            return err_type(e, "user", "a string", v);
        r->user = json_string_value(v);
    }
    return parse_unsupported(r, doc, e);
}

int oa_parse(enum oa_kind kind, const char *body, size_t len, struct oa_request *req,
             struct oa_error *err)
{
    if (req == NULL || err == NULL || (body == NULL && len > 0) ||
        (kind != OA_KIND_COMPLETION && kind != OA_KIND_CHAT))
        return TANDEM_EINVAL;
    memset(req, 0, sizeof(*req));
    json_error_t je;
    json_t *doc = json_loadb(body ? body : "", len, 0, &je);
    if (doc == NULL) {
        if (json_error_code(&je) == json_error_out_of_memory)
            return err_nomem(err);
        return oa_error_set(err, 400, INVALID_REQUEST, NULL, "invalid_json",
                            "We could not parse the JSON body of your request: %s (line %d, "
                            "column %d).",
                            je.text, je.line, je.column);
    }
    if (!json_is_object(doc)) {
        oa_error_set(err, 400, INVALID_REQUEST, NULL, "invalid_type",
                     "Invalid type for the request body: expected an object, but got %s instead.",
                     json_kind(doc));
        json_decref(doc);
        return TANDEM_EINVAL;
    }
    req->doc = doc;
    req->kind = kind;
    req->max_tokens = -1;
    req->temperature = 1.0f;
    req->top_p = 1.0f;
    req->add_generation_prompt = kind == OA_KIND_CHAT;
    int rc = parse_doc(req, doc, err);
    if (rc != 0)
        oa_request_fini(req);
    return rc;
}

void oa_request_fini(struct oa_request *req)
{
    if (req == NULL)
        return;
    free(req->prompt_ids);
    free(req->messages);
    for (int i = 0; i < req->n_owned; i++)
        free(req->owned[i]);
    free(req->owned);
    json_decref(req->doc);
    memset(req, 0, sizeof(*req));
}

const struct oa_model *oa_resolve_model(const struct oa_request *req, const struct oa_model *models,
                                        int n, struct oa_error *err)
{
    if (req == NULL)
        return NULL;
    if (req->model == NULL && n > 0 && models != NULL)
        return &models[0];
    for (int i = 0; models != NULL && i < n; i++) {
        if (models[i].id != NULL && strcmp(models[i].id, req->model) == 0)
            return &models[i];
    }
    oa_error_set(err, 400, INVALID_REQUEST, "model", "model_not_found",
                 "The model `%s` does not exist.", req->model ? req->model : "");
    return NULL;
}

/* ---------------------------------------------------------------- prompt */

/* Grows *buf (capacity *cap) to hold need bytes. */
static int reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    char *b = realloc(*buf, c);
    if (b == NULL)
        return TANDEM_ENOMEM;
    *buf = b;
    *cap = c;
    return 0;
}

/* ids[0..n) decoded as text, invalid UTF-8 as U+FFFD, into a new string. */
static int decode_text(const struct tokenizer *tok, const uint32_t *ids, int n, char **out,
                       size_t *out_len)
{
    struct tok_utf8 u;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    uint32_t prev = TOK_NO_PREV;
    tok_utf8_init(&u);
    for (int i = 0; i < n; i++) {
        const char *piece;
        size_t pl;
        int rc = tok_decode_piece(tok, prev, ids[i], &piece, &pl);
        if (rc != 0)
            goto fail;
        if (reserve(&buf, &cap, len + TOK_UTF8_OUT_MAX(pl) + 1) != 0)
            goto fail;
        rc = tok_utf8_push(&u, piece, pl, buf + len, cap - len);
        if (rc < 0)
            goto fail;
        len += (size_t)rc;
        prev = ids[i];
    }
    if (reserve(&buf, &cap, len + 4) != 0)
        goto fail;
    len += (size_t)tok_utf8_flush(&u, buf + len, cap - len);
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return 0;
fail:
    free(buf);
    return TANDEM_ENOMEM;
}

static int vocab_check(const uint32_t *ids, int n, int vocab, const char *name, struct oa_error *e)
{
    for (int i = 0; vocab > 0 && i < n; i++) {
        if (ids[i] >= (uint32_t)vocab)
            return oa_error_set(e, 400, INVALID_REQUEST, name, "invalid_value",
                                "Invalid value for '%s[%d]': expected a token id below the "
                                "vocabulary size %d, but got %" PRIu32 ".",
                                name, i, vocab, ids[i]);
    }
    return 0;
}

int oa_prompt_build(const struct oa_request *req, const struct tokenizer *tok, int add_bos,
                    struct oa_prompt *p, struct oa_error *err)
{
    if (req == NULL || tok == NULL || p == NULL || err == NULL)
        return TANDEM_EINVAL;
    memset(p, 0, sizeof(*p));
    int rc;
    if (req->prompt_ids != NULL) {
        if ((rc = vocab_check(req->prompt_ids, req->n_prompt_ids, tok_vocab_size(tok), "prompt",
                              err)) != 0)
            return rc;
        p->ids = malloc((size_t)req->n_prompt_ids * sizeof(uint32_t));
        if (p->ids == NULL)
            return err_nomem(err);
        memcpy(p->ids, req->prompt_ids, (size_t)req->n_prompt_ids * sizeof(uint32_t));
        p->n_ids = req->n_prompt_ids;
        if (decode_text(tok, p->ids, p->n_ids, &p->text, &p->text_len) != 0) {
            oa_prompt_fini(p);
            return err_nomem(err);
        }
        return 0;
    }
    if (req->kind == OA_KIND_CHAT) {
        rc = chat_template_render(req->messages, req->n_messages, req->add_generation_prompt,
                                  &p->text, &p->text_len);
        if (rc == TANDEM_ENOMEM)
            return err_nomem(err);
        if (rc != 0) {
            oa_error_internal(err, "chat template");
            return rc;
        }
    } else {
        p->text = malloc(req->prompt_len + 1);
        if (p->text == NULL)
            return err_nomem(err);
        if (req->prompt_len)
            memcpy(p->text, req->prompt_text, req->prompt_len);
        p->text[req->prompt_len] = '\0';
        p->text_len = req->prompt_len;
    }
    const char *param = req->kind == OA_KIND_CHAT ? "messages" : "prompt";
    if (p->text_len > TOK_MAX_TEXT || TOK_ENCODE_BOUND(p->text_len) > INT_MAX) {
        oa_prompt_fini(p);
        oa_error_set(err, 400, INVALID_REQUEST, param, "invalid_value",
                     "Invalid value for '%s': the prompt is too long to tokenize.", param);
        return TANDEM_ETOOBIG;
    }
    size_t cap = TOK_ENCODE_BOUND(p->text_len);
    p->ids = malloc(cap * sizeof(uint32_t));
    if (p->ids == NULL) {
        oa_prompt_fini(p);
        return err_nomem(err);
    }
    rc = tok_encode(tok, p->text, p->text_len, add_bos, p->ids, (int)cap);
    if (rc < 0) {
        oa_prompt_fini(p);
        if (rc == TANDEM_ENOMEM)
            return err_nomem(err);
        oa_error_internal(err, "tokenizer failed");
        return rc;
    }
    p->n_ids = rc;
    return 0;
}

void oa_prompt_fini(struct oa_prompt *p)
{
    if (p == NULL)
        return;
    free(p->ids);
    free(p->text);
    memset(p, 0, sizeof(*p));
}

int oa_check_context(struct oa_request *req, const struct oa_model *m, int n_prompt,
                     struct oa_error *err)
{
    if (req == NULL || m == NULL || err == NULL || n_prompt < 0)
        return TANDEM_EINVAL;
    const char *param = req->kind == OA_KIND_CHAT ? "messages" : "prompt";
    int rc;
    if (req->prompt_ids != NULL &&
        (rc = vocab_check(req->prompt_ids, req->n_prompt_ids, m->vocab_size, "prompt", err)) != 0)
        return rc;
    if (n_prompt == 0)
        return oa_error_set(err, 400, INVALID_REQUEST, param, "invalid_value",
                            "Invalid value for '%s': the prompt is empty; it must have at least "
                            "one token.",
                            param);
    long long ctx = m->max_context, p = n_prompt;
    if (req->max_tokens >= 1) {
        if (p + req->max_tokens > ctx)
            return oa_error_set(err, 400, INVALID_REQUEST, param, "context_length_exceeded",
                                "This model's maximum context length is %lld tokens. However, "
                                "you requested %lld tokens (%lld in the messages, %d in the "
                                "completion). Please reduce the length of the messages or "
                                "completion.",
                                ctx, p + req->max_tokens, p, req->max_tokens);
        return 0;
    }
    if (p >= ctx)
        return oa_error_set(err, 400, INVALID_REQUEST, param, "context_length_exceeded",
                            "This model's maximum context length is %lld tokens. However, your "
                            "request has %lld input tokens. Please reduce the length of the input "
                            "messages.",
                            ctx, p);
    long long room = ctx - p;
    if (req->kind == OA_KIND_COMPLETION && room > OA_DEFAULT_MAX_TOKENS)
        room = OA_DEFAULT_MAX_TOKENS;
    req->max_tokens = (int)room;
    return 0;
}

/* ---------------------------------------------------- text decoder, stops */

int oa_textdec_init(struct oa_textdec *d, const struct tokenizer *tok, uint32_t prev,
                    const char *const *stop, const size_t *stop_len, int n_stop)
{
    if (d == NULL || tok == NULL || n_stop < 0 || n_stop > OA_MAX_STOP ||
        (n_stop > 0 && (stop == NULL || stop_len == NULL)))
        return TANDEM_EINVAL;
    for (int i = 0; i < n_stop; i++) {
        if (stop[i] == NULL || stop_len[i] == 0 || stop_len[i] > OA_MAX_STOP_BYTES)
            return TANDEM_EINVAL;
    }
    memset(d, 0, sizeof(*d));
    d->tok = tok;
    tok_utf8_init(&d->utf8);
    d->prev = prev;
    d->stop_index = -1;
    d->n_stop = n_stop;
    for (int i = 0; i < n_stop; i++) {
        memcpy(d->stop[i], stop[i], stop_len[i]);
        d->stop_len[i] = stop_len[i];
    }
    return 0;
}

/* First index of needle[0..m) in hay[0..n), or n when absent (m >= 1). */
static size_t find(const char *hay, size_t n, const char *needle, size_t m)
{
    for (size_t i = 0; i + m <= n; i++) {
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0)
            return i;
    }
    return n;
}

/* buf[0..n) is the held text followed by newly decoded text. Cuts at the
 * earliest stop string (the held part had none: it was checked before), or
 * holds back the longest tail that is a proper prefix of a stop string
 * (none when final). Stop strings are valid UTF-8 and buf is a run of whole
 * characters, so the tail held back starts on a character boundary. Returns
 * the number of leading bytes of buf to release. */
static size_t settle(struct oa_textdec *d, const char *buf, size_t n, int final)
{
    size_t cut = n;
    int which = -1;
    for (int i = 0; i < d->n_stop; i++) {
        size_t at = find(buf, n, d->stop[i], d->stop_len[i]);
        if (at < cut) {
            cut = at;
            which = i;
        }
    }
    if (which >= 0) {
        d->stopped = 1;
        d->stop_index = which;
        d->n_held = 0;
        return cut;
    }
    size_t keep = 0;
    for (int i = 0; !final && i < d->n_stop; i++) {
        size_t k = d->stop_len[i] - 1;
        if (k > n)
            k = n;
        for (; k > keep; k--) {
            if (memcmp(buf + n - k, d->stop[i], k) == 0) {
                keep = k;
                break;
            }
        }
    }
    memmove(d->held, buf + n - keep, keep);
    d->n_held = keep;
    return n - keep;
}

int oa_textdec_push(struct oa_textdec *d, uint32_t token, char *out, size_t cap)
{
    if (cap < OA_TEXTDEC_OUT_MAX)
        return TANDEM_ETOOBIG;
    if (d->stopped)
        return 0;
    memcpy(out, d->held, d->n_held);
    int w = tok_stream_token(d->tok, &d->utf8, d->prev, token, out + d->n_held, cap - d->n_held);
    if (w < 0)
        return w;
    d->prev = token;
    return (int)settle(d, out, d->n_held + (size_t)w, 0);
}

int oa_textdec_flush(struct oa_textdec *d, char *out, size_t cap)
{
    if (cap < OA_TEXTDEC_OUT_MAX)
        return TANDEM_ETOOBIG;
    if (d->stopped)
        return 0;
    memcpy(out, d->held, d->n_held);
    int w = tok_utf8_flush(&d->utf8, out + d->n_held, cap - d->n_held);
    if (w < 0)
        return w;
    return (int)settle(d, out, d->n_held + (size_t)w, 1);
}

/* -------------------------------------------------------------- responses */

const char *oa_finish_name(enum oa_finish f)
{
    switch (f) {
    case OA_FINISH_STOP:
        return "stop";
    case OA_FINISH_LENGTH:
        return "length";
    case OA_FINISH_ABORT:
        return "abort";
    }
    return NULL;
}

void oa_format_id(enum oa_kind kind, uint64_t n, char *buf)
{
    snprintf(buf, OA_ID_MAX, "%s-%016" PRIx64, kind == OA_KIND_CHAT ? "chatcmpl" : "cmpl", n);
}

static int append_text(struct oa_output *o, const char *s, size_t n)
{
    if (reserve(&o->text, &o->text_cap, o->text_len + n + 1) != 0)
        return TANDEM_ENOMEM;
    if (n)
        memcpy(o->text + o->text_len, s, n);
    o->text_len += n;
    return 0;
}

static struct oa_logprob *append_lp(struct oa_output *o)
{
    if (o->n_lp == o->lp_cap) {
        int c = o->lp_cap ? 2 * o->lp_cap : 16;
        struct oa_logprob *l = realloc(o->lp, (size_t)c * sizeof(*l));
        if (l == NULL)
            return NULL;
        o->lp = l;
        o->lp_cap = c;
    }
    return &o->lp[o->n_lp++];
}

static void set_top(struct oa_logprob *r, const struct sampler_top *top, int n_top, int limit)
{
    if (n_top > limit)
        n_top = limit;
    if (n_top < 0 || top == NULL)
        n_top = 0;
    r->n_top = n_top;
    for (int k = 0; k < n_top; k++)
        r->top[k] = top[k];
}

int oa_output_init(struct oa_output *o, const struct oa_request *req, const struct oa_prompt *p,
                   const struct tokenizer *tok, const char *id, const char *model, int64_t created)
{
    if (o == NULL || req == NULL || p == NULL || tok == NULL || id == NULL || model == NULL)
        return TANDEM_EINVAL;
    memset(o, 0, sizeof(*o));
    uint32_t last = p->n_ids > 0 ? p->ids[p->n_ids - 1] : TOK_NO_PREV;
    int rc = oa_textdec_init(&o->dec, tok, last, req->stop, req->stop_len, req->n_stop);
    if (rc != 0)
        return rc;
    o->kind = req->kind;
    o->stream = req->stream;
    o->include_usage = req->stream && req->include_usage;
    o->logprobs = req->logprobs;
    o->top_logprobs = req->top_logprobs < OA_MAX_LOGPROBS ? req->top_logprobs : OA_MAX_LOGPROBS;
    o->echo = req->kind == OA_KIND_COMPLETION && req->echo;
    memcpy(o->stop_ids, req->stop_ids, sizeof(o->stop_ids));
    o->n_stop_ids = req->n_stop_ids;
    snprintf(o->id, sizeof(o->id), "%s", id);
    o->created = created;
    o->tok = tok;
    o->lp_prev = last;
    o->model = strdup(model);
    if (o->model == NULL)
        goto nomem;
    if (o->echo) {
        if (append_text(o, p->text, p->text_len) != 0)
            goto nomem;
        if (o->logprobs) {
            o->lp_prev = TOK_NO_PREV;
            for (int i = 0; i < p->n_ids; i++) {
                struct oa_logprob *r = append_lp(o);
                if (r == NULL)
                    goto nomem;
                r->token = p->ids[i];
                r->logprob = NAN;
                r->n_top = 0;
            }
            o->n_prompt_lp = p->n_ids;
        }
    }
    return 0;
nomem:
    oa_output_fini(o);
    return TANDEM_ENOMEM;
}

void oa_output_fini(struct oa_output *o)
{
    if (o == NULL)
        return;
    free(o->model);
    free(o->text);
    free(o->lp);
    free(o->out.p);
    for (int i = 0; i < 3; i++)
        free(o->side[i].p);
    memset(o, 0, sizeof(*o));
}

int oa_output_prompt_logprobs(struct oa_output *o, int first, int n, const float *logprob,
                              const struct sampler_top *top, int n_top)
{
    if (o == NULL)
        return TANDEM_EINVAL;
    if (o->n_prompt_lp == 0)
        return 0;
    if (first < 1 || n < 0 || first + n > o->n_prompt_lp || (n > 0 && logprob == NULL))
        return TANDEM_EINVAL;
    for (int j = 0; j < n; j++) {
        struct oa_logprob *r = &o->lp[first + j];
        r->logprob = logprob[j];
        set_top(r, top ? top + (size_t)j * (size_t)n_top : NULL, n_top, o->top_logprobs);
    }
    return 0;
}

static int is_stop_id(const struct oa_output *o, uint32_t token)
{
    for (int i = 0; i < o->n_stop_ids; i++) {
        if (o->stop_ids[i] == token)
            return 1;
    }
    return 0;
}

int oa_output_token(struct oa_output *o, uint32_t token, float logprob,
                    const struct sampler_top *top, int n_top)
{
    if (o == NULL)
        return TANDEM_EINVAL;
    if (o->finished || o->dec.stopped)
        return OA_STOPPED;
    char buf[OA_TEXTDEC_OUT_MAX];
    int w = oa_textdec_push(&o->dec, token, buf, sizeof(buf));
    if (w < 0)
        return w;
    if (append_text(o, buf, (size_t)w) != 0)
        return TANDEM_ENOMEM;
    o->n_tokens++;
    o->last_token = token;
    if (token != (uint32_t)tok_eos(o->tok) && !is_stop_id(o, token))
        o->n_unsent++;
    if (o->logprobs) {
        struct oa_logprob *r = append_lp(o);
        if (r == NULL)
            return TANDEM_ENOMEM;
        r->token = token;
        r->logprob = logprob;
        set_top(r, top, n_top, o->top_logprobs);
    }
    return o->dec.stopped ? OA_STOPPED : 0;
}

/* ----------------------------------------------------------- JSON pieces */

/* Appends v to arr; 0, or -1 (v released) when v is NULL or on failure. */
static int push(json_t *arr, json_t *v)
{
    return v == NULL ? -1 : json_array_append_new(arr, v);
}

/* Renders doc (consumed) to *json. */
static int dump(json_t *doc, char **json)
{
    *json = doc ? json_dumps(doc, DUMP_FLAGS) : NULL;
    json_decref(doc);
    return *json ? 0 : TANDEM_ENOMEM;
}

/* The display text of token after prev into buf (TOKEN_TEXT_MAX bytes): its
 * piece, with invalid UTF-8 as U+FFFD. *raw, *raw_len: the piece's bytes. */
static size_t token_text(const struct tokenizer *tok, uint32_t prev, uint32_t token, char *buf,
                         const char **raw, size_t *raw_len)
{
    const char *piece;
    size_t len;
    if (tok_decode_piece(tok, prev, token, &piece, &len) != 0) {
        piece = "";
        len = 0;
    }
    if (len > TOK_MAX_PIECE)
        len = TOK_MAX_PIECE;
    struct tok_utf8 u;
    tok_utf8_init(&u);
    int w = tok_utf8_push(&u, piece, len, buf, TOKEN_TEXT_MAX);
    if (w < 0)
        w = 0;
    int f = tok_utf8_flush(&u, buf + w, TOKEN_TEXT_MAX - (size_t)w);
    if (raw) {
        *raw = piece;
        *raw_len = len;
    }
    return (size_t)w + (size_t)(f > 0 ? f : 0);
}

/* ------------------------------------------------ JSON text, appended
 *
 * The streamed path renders its JSON by appending to a reusable buffer
 * (struct oa_jbuf), not through a jansson DOM: one chunk per token made that
 * the router's largest cost. The text is byte for byte what json_dumps gave
 * with DUMP_FLAGS (tests/router/test_oa_stream.c renders both ways):
 *   - objects keep insertion order, compact separators;
 *   - strings escape '"', '\\' and bytes below 0x20 (\b \f \n \r \t, else
 *     \u00XX in upper-case hex), nothing else, and must be valid UTF-8 (as
 *     json_stringn requires; otherwise the render fails, as it did);
 *   - integers as "%lld"; reals as jansson's jsonp_dtostr (no dtoa build, as
 *     Debian's 2.14): "%.9g", ".0" added when it has no '.' or 'e', and the
 *     exponent without '+' or leading zeros. */

static int jb_reserve(struct oa_jbuf *b, size_t extra)
{
    if (b->bad)
        return -1;
    if (b->len + extra + 1 <= b->cap)
        return 0;
    if (reserve(&b->p, &b->cap, b->len + extra + 1) != 0) {
        b->bad = 1;
        return -1;
    }
    return 0;
}

static void jb_raw(struct oa_jbuf *b, const char *s, size_t n)
{
    if (jb_reserve(b, n) != 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

#define JB_LIT(b, lit) jb_raw((b), (lit), sizeof(lit) - 1)

static const char hex_digit[] = "0123456789ABCDEF";

/* s[0..n) as a JSON string; b->bad when it is not valid UTF-8. */
static void jb_str(struct oa_jbuf *b, const char *s, size_t n)
{
    if (jb_reserve(b, 6 * n + 2) != 0)
        return;
    const unsigned char *u = (const unsigned char *)s;
    char *w = b->p + b->len;
    *w++ = '"';
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x80) {
            size_t k = utf8_seq_len(u + i, n - i);
            if (k == 0) {
                b->bad = 1;
                return;
            }
            memcpy(w, u + i, k);
            w += k;
            i += k;
            continue;
        }
        i++;
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"':
            *w++ = '"';
            break;
        case '\\':
            *w++ = '\\';
            break;
        case '\b':
            *w++ = 'b';
            break;
        case '\f':
            *w++ = 'f';
            break;
        case '\n':
            *w++ = 'n';
            break;
        case '\r':
            *w++ = 'r';
            break;
        case '\t':
            *w++ = 't';
            break;
        default:
            memcpy(w, "u00", 3);
            w[3] = hex_digit[c >> 4];
            w[4] = hex_digit[c & 15];
            w += 5;
        }
    }
    *w++ = '"';
    *w = '\0';
    b->len = (size_t)(w - b->p);
}

static void jb_cstr(struct oa_jbuf *b, const char *s)
{
    jb_str(b, s, strlen(s));
}

static void jb_int(struct oa_jbuf *b, long long v)
{
    char t[24], *e = t + sizeof(t), *p = e;
    unsigned long long m = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + m % 10);
        m /= 10;
    } while (m);
    if (v < 0)
        *--p = '-';
    jb_raw(b, p, (size_t)(e - p));
}

/* A logprob as JSON: -inf (impossible in JSON) and anything below -9999
 * become -9999.0, as vLLM; NaN cannot be rendered (json_real refused it). */
static void jb_lp(struct oa_jbuf *b, float lp)
{
    if (isnan(lp)) {
        b->bad = 1;
        return;
    }
    double v = isinf(lp) || lp < -9999.0f ? -9999.0 : (double)lp;
    char t[40];
    int n = snprintf(t, sizeof(t) - 2, "%.9g", v);
    if (strchr(t, '.') == NULL && strchr(t, 'e') == NULL) {
        memcpy(t + n, ".0", 3);
        n += 2;
    }
    char *e = strchr(t, 'e');
    if (e != NULL) {
        char *start = e + 1, *end = start + 1;
        if (*start == '-')
            start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, (size_t)(t + n - end) + 1);
            n -= (int)(end - start);
        }
    }
    jb_raw(b, t, (size_t)n);
}

/* Completions logprobs of records r[0..n) into o->out, tokens named after
 * *prev, offsets from *offset; both advance. The four arrays are built side
 * by side: "tokens" in o->out, the others in o->side[]. */
static void put_completion_logprobs(struct oa_output *o, const struct oa_logprob *r, int n)
{
    struct oa_jbuf *b = &o->out, *tlp = &o->side[0], *top = &o->side[1], *off = &o->side[2];
    tlp->len = top->len = off->len = 0;
    tlp->bad = top->bad = off->bad = 0;
    char s[TOKEN_TEXT_MAX], a[TOKEN_TEXT_MAX];
    JB_LIT(b, "{\"tokens\":[");
    /* After a failure nothing more advances, as when the DOM build stopped. */
    for (int i = 0; i < n && !(b->bad | tlp->bad | top->bad | off->bad); i++) {
        const char *sep = i ? "," : "";
        size_t sl = token_text(o->tok, o->lp_prev, r[i].token, s, NULL, NULL);
        jb_raw(b, sep, i ? 1 : 0);
        jb_str(b, s, sl);
        jb_raw(off, sep, i ? 1 : 0);
        jb_int(off, (long long)o->text_offset);
        jb_raw(tlp, sep, i ? 1 : 0);
        jb_raw(top, sep, i ? 1 : 0);
        if (isnan(r[i].logprob)) {
            JB_LIT(tlp, "null");
            JB_LIT(top, "null");
        } else {
            /* The sampled token first, then the alternatives not already
             * named (compared by their escaped text, which is one-to-one):
             * up to logprobs + 1 entries, as OpenAI documents. */
            size_t keys[OA_MAX_LOGPROBS + 1][2];
            int n_keys = 0;
            jb_lp(tlp, r[i].logprob);
            JB_LIT(top, "{");
            keys[n_keys][0] = top->len;
            jb_str(top, s, sl);
            keys[n_keys][1] = top->len - keys[n_keys][0];
            n_keys++;
            JB_LIT(top, ":");
            jb_lp(top, r[i].logprob);
            for (int k = 0; k < r[i].n_top && !top->bad; k++) {
                size_t al = token_text(o->tok, o->lp_prev, r[i].top[k].token, a, NULL, NULL);
                size_t at = top->len;
                JB_LIT(top, ",");
                size_t ks = top->len;
                jb_str(top, a, al);
                size_t kl = top->len - ks;
                int dup = 0;
                for (int j = 0; j < n_keys && !dup && !top->bad; j++)
                    dup = keys[j][1] == kl && memcmp(top->p + keys[j][0], top->p + ks, kl) == 0;
                if (dup) {
                    top->len = at;
                    continue;
                }
                keys[n_keys][0] = ks;
                keys[n_keys][1] = kl;
                n_keys++;
                JB_LIT(top, ":");
                jb_lp(top, r[i].top[k].logprob);
            }
            JB_LIT(top, "}");
        }
        o->text_offset += utf8_count(s, sl);
        o->lp_prev = r[i].token;
    }
    JB_LIT(b, "],\"token_logprobs\":[");
    jb_raw(b, tlp->p, tlp->len);
    JB_LIT(b, "],\"top_logprobs\":[");
    jb_raw(b, top->p, top->len);
    JB_LIT(b, "],\"text_offset\":[");
    jb_raw(b, off->p, off->len);
    JB_LIT(b, "]}");
    b->bad |= tlp->bad | top->bad | off->bad;
}

/* {"token", "logprob", "bytes"} of token after prev (chat shape), without
 * the closing brace. */
static void put_chat_token(struct oa_jbuf *b, const struct tokenizer *tok, uint32_t prev,
                           uint32_t token, float lp)
{
    char s[TOKEN_TEXT_MAX];
    const char *raw;
    size_t raw_len;
    size_t sl = token_text(tok, prev, token, s, &raw, &raw_len);
    JB_LIT(b, "{\"token\":");
    jb_str(b, s, sl);
    JB_LIT(b, ",\"logprob\":");
    jb_lp(b, lp);
    JB_LIT(b, ",\"bytes\":[");
    for (size_t i = 0; i < raw_len; i++) {
        if (i)
            JB_LIT(b, ",");
        jb_int(b, (unsigned char)raw[i]);
    }
    JB_LIT(b, "]");
}

static void put_chat_logprobs(struct oa_output *o, const struct oa_logprob *r, int n)
{
    struct oa_jbuf *b = &o->out;
    JB_LIT(b, "{\"content\":[");
    for (int i = 0; i < n && !b->bad; i++) {
        if (i)
            JB_LIT(b, ",");
        put_chat_token(b, o->tok, o->lp_prev, r[i].token, r[i].logprob);
        JB_LIT(b, ",\"top_logprobs\":[");
        for (int k = 0; k < r[i].n_top; k++) {
            if (k)
                JB_LIT(b, ",");
            put_chat_token(b, o->tok, o->lp_prev, r[i].top[k].token, r[i].top[k].logprob);
            JB_LIT(b, "}");
        }
        JB_LIT(b, "]}");
        o->lp_prev = r[i].token;
    }
    JB_LIT(b, "]}");
}

/* The pending logprob records (null when logprobs are off), then forgets
 * them. */
static void put_logprobs(struct oa_output *o)
{
    if (!o->logprobs) {
        JB_LIT(&o->out, "null");
        return;
    }
    if (o->kind == OA_KIND_CHAT)
        put_chat_logprobs(o, o->lp, o->n_lp);
    else
        put_completion_logprobs(o, o->lp, o->n_lp);
    o->n_lp = 0;
    o->n_prompt_lp = 0;
}

static const char *object_name(const struct oa_output *o, int chunk)
{
    if (o->kind == OA_KIND_COMPLETION)
        return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
}

/* Starts o->out afresh with {"id","object","created","model","choices":[ */
static void put_head(struct oa_output *o, const char *object)
{
    struct oa_jbuf *b = &o->out;
    b->len = 0;
    b->bad = 0;
    JB_LIT(b, "{\"id\":");
    jb_cstr(b, o->id);
    JB_LIT(b, ",\"object\":");
    jb_cstr(b, object);
    JB_LIT(b, ",\"created\":");
    jb_int(b, o->created);
    JB_LIT(b, ",\"model\":");
    jb_cstr(b, o->model);
    JB_LIT(b, ",\"choices\":[");
}

/* The stop string or stop token id that ended the output, or null. */
static void put_stop_reason(struct oa_output *o, enum oa_finish reason)
{
    struct oa_jbuf *b = &o->out;
    if (o->dec.stopped) {
        jb_str(b, o->dec.stop[o->dec.stop_index], o->dec.stop_len[o->dec.stop_index]);
        return;
    }
    if (reason == OA_FINISH_STOP && o->n_tokens > 0) {
        for (int i = 0; i < o->n_stop_ids; i++) {
            if (o->stop_ids[i] == o->last_token) {
                jb_int(b, o->last_token);
                return;
            }
        }
    }
    JB_LIT(b, "null");
}

/* A choice with the pending text and logprobs (then forgotten), and the
 * finish fields (finish_reason and stop_reason null when finish is 0). */
static void put_choice(struct oa_output *o, int chunk, enum oa_finish finish)
{
    struct oa_jbuf *b = &o->out;
    const char *text = o->text ? o->text : "";
    size_t text_len = o->text_len;
    o->text_len = 0;
    JB_LIT(b, "{\"index\":0,");
    if (o->kind == OA_KIND_COMPLETION) {
        JB_LIT(b, "\"text\":");
        jb_str(b, text, text_len);
    } else if (!chunk) {
        JB_LIT(b, "\"message\":{\"role\":\"assistant\",\"content\":");
        jb_str(b, text, text_len);
        JB_LIT(b, "}");
    } else {
        JB_LIT(b, "\"delta\":{");
        /* The role comes first, with content; the last chunk of OpenAI's
         * streams carries an empty delta. */
        if (!o->began)
            JB_LIT(b, "\"role\":\"assistant\",");
        if (finish == 0 || text_len > 0 || !o->began) {
            JB_LIT(b, "\"content\":");
            jb_str(b, text, text_len);
        }
        JB_LIT(b, "}");
        o->began = 1;
    }
    JB_LIT(b, ",\"logprobs\":");
    put_logprobs(o);
    JB_LIT(b, ",\"finish_reason\":");
    if (finish == 0) {
        JB_LIT(b, "null,\"stop_reason\":null}");
        return;
    }
    jb_cstr(b, oa_finish_name(finish));
    JB_LIT(b, ",\"stop_reason\":");
    put_stop_reason(o, finish);
    JB_LIT(b, "}");
}

/* A chunk with a choice (finish 0: none yet), "usage": null when
 * include_usage, in o->out. */
static int render_chunk(struct oa_output *o, enum oa_finish finish)
{
    put_head(o, object_name(o, 1));
    put_choice(o, 1, finish);
    JB_LIT(&o->out, "]");
    if (o->include_usage)
        JB_LIT(&o->out, ",\"usage\":null");
    JB_LIT(&o->out, "}");
    return o->out.bad ? TANDEM_ENOMEM : 0;
}

/* A copy of o->out's text into *json. */
static int take_copy(const struct oa_output *o, char **json)
{
    *json = malloc(o->out.len + 1);
    if (*json == NULL)
        return TANDEM_ENOMEM;
    memcpy(*json, o->out.p, o->out.len + 1);
    return 0;
}

int oa_output_begin(struct oa_output *o, char **json)
{
    if (o == NULL || json == NULL)
        return TANDEM_EINVAL;
    *json = NULL;
    if (o->kind != OA_KIND_CHAT || !o->stream || o->began || o->finished)
        return 0;
    int rc = render_chunk(o, 0);
    return rc != 0 ? rc : take_copy(o, json);
}

/* 1 when a streamed chunk is due (it then counts as sent), 0 when there is
 * nothing to send, TANDEM_EINVAL when not streaming or finished. */
static int chunk_due(struct oa_output *o)
{
    if (!o->stream || o->finished)
        return TANDEM_EINVAL;
    if (o->text_len == 0 && o->n_lp == 0 && o->n_unsent == 0)
        return 0;
    o->n_unsent = 0;
    return 1;
}

int oa_output_chunk_ref(struct oa_output *o, const char **json, size_t *len)
{
    if (o == NULL || json == NULL || len == NULL)
        return TANDEM_EINVAL;
    *json = NULL;
    *len = 0;
    int due = chunk_due(o);
    if (due <= 0)
        return due;
    int rc = render_chunk(o, 0);
    if (rc == 0) {
        *json = o->out.p;
        *len = o->out.len;
    }
    return rc;
}

int oa_output_delta(struct oa_output *o, const char **text, size_t *len, int *role)
{
    if (o == NULL || text == NULL || len == NULL || role == NULL || o->logprobs || o->n_lp > 0)
        return TANDEM_EINVAL;
    int due = chunk_due(o);
    if (due <= 0)
        return due;
    *text = o->text ? o->text : "";
    *len = o->text_len;
    o->text_len = 0; /* as put_choice */
    *role = o->kind == OA_KIND_CHAT && !o->began;
    if (o->kind == OA_KIND_CHAT)
        o->began = 1;
    return 1;
}

int oa_output_chunk(struct oa_output *o, char **json)
{
    if (json == NULL)
        return TANDEM_EINVAL;
    *json = NULL;
    const char *ref;
    size_t len;
    int rc = oa_output_chunk_ref(o, &ref, &len);
    return rc != 0 || ref == NULL ? rc : take_copy(o, json);
}

/* {"prompt_tokens",...} of the finished output. */
static void put_usage(struct oa_output *o, int prompt_tokens, int cached_tokens)
{
    struct oa_jbuf *b = &o->out;
    JB_LIT(b, "{\"prompt_tokens\":");
    jb_int(b, prompt_tokens);
    JB_LIT(b, ",\"completion_tokens\":");
    jb_int(b, o->n_tokens);
    JB_LIT(b, ",\"total_tokens\":");
    jb_int(b, prompt_tokens + o->n_tokens);
    JB_LIT(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    jb_int(b, cached_tokens);
    JB_LIT(b, "}}");
}

/* oa_output_finish's checks, then releases the held-back text and marks o
 * finished; *reason becomes "stop" when a stop string ended the output. */
static int finish_text(struct oa_output *o, enum oa_finish *reason, char **body, char **usage_chunk)
{
    if (o == NULL || body == NULL || (o->stream && usage_chunk == NULL) ||
        oa_finish_name(*reason) == NULL || o->finished)
        return TANDEM_EINVAL;
    *body = NULL;
    if (usage_chunk)
        *usage_chunk = NULL;
    char buf[OA_TEXTDEC_OUT_MAX];
    int w = oa_textdec_flush(&o->dec, buf, sizeof(buf));
    if (w < 0)
        return w;
    if (append_text(o, buf, (size_t)w) != 0)
        return TANDEM_ENOMEM;
    o->finished = 1;
    if (o->dec.stopped)
        *reason = OA_FINISH_STOP;
    return 0;
}

int oa_output_finish(struct oa_output *o, enum oa_finish reason, int prompt_tokens,
                     int cached_tokens, char **body, char **usage_chunk)
{
    int rc = finish_text(o, &reason, body, usage_chunk);
    if (rc != 0)
        return rc;
    if (o->stream) {
        rc = render_chunk(o, reason);
        if (rc == 0)
            rc = take_copy(o, body);
        if (rc != 0 || !o->include_usage)
            return rc;
        put_head(o, object_name(o, 1));
        JB_LIT(&o->out, "],\"usage\":");
    } else {
        put_head(o, object_name(o, 0));
        put_choice(o, 0, reason);
        JB_LIT(&o->out, "],\"usage\":");
    }
    put_usage(o, prompt_tokens, cached_tokens);
    JB_LIT(&o->out, "}");
    char **dst = o->stream ? usage_chunk : body;
    rc = o->out.bad ? TANDEM_ENOMEM : take_copy(o, dst);
    if (rc != 0 && o->stream) {
        free(*body);
        *body = NULL;
    }
    return rc;
}

/* ---------------------------------------------------------------- models */

char *oa_models_json(const struct oa_model *models, int n)
{
    json_t *data = json_array();
    int bad = data == NULL;
    for (int i = 0; !bad && models != NULL && i < n; i++) {
        const struct oa_model *m = &models[i];
        bad |= push(data, json_pack("{s:s,s:s,s:I,s:s,s:s,s:i}", "id", m->id, "object", "model",
                                    "created", (json_int_t)m->created, "owned_by", "tandem", "root",
                                    m->id, "max_model_len", m->max_context));
    }
    if (bad) {
        json_decref(data);
        return NULL;
    }
    json_t *doc = json_pack("{s:s,s:o}", "object", "list", "data", data);
    char *s;
    return dump(doc, &s) == 0 ? s : NULL;
}
