#include "openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

/* json_object_set_new that remembers a failure (the value is consumed). */
static void put(json_t *o, const char *k, json_t *v, int *bad)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0) {
        *bad = 1;
    }
}

static json_t *messages_json(const struct lg_prompt *p)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < p->n_msgs; i++) {
        json_t *m = json_object();
        int bad = m == NULL;
        if (!bad) {
            put(m, "role", json_string(p->msgs[i].role), &bad);
            put(m, "content", json_stringn(p->msgs[i].content, p->msgs[i].len), &bad);
        }
        if (bad || json_array_append_new(a, m) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++) {
        if (json_array_append_new(a, json_integer(ids[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

char *lg_openai_body(const struct lg_openai_opts *o, const struct lg_prompt *p, size_t *len)
{
    json_t *b = json_object();
    if (b == NULL) {
        return NULL;
    }
    int bad = 0;
    put(b, "model", json_string(o->model ? o->model : ""), &bad);
    if (o->api == LG_API_CHAT) {
        put(b, "messages", messages_json(p), &bad);
    } else if (p->ids != NULL) {
        put(b, "prompt", ids_json(p->ids, p->n_ids), &bad);
    } else {
        put(b, "prompt", json_stringn(p->text ? p->text : "", p->text_len), &bad);
    }
    put(b, "max_tokens", json_integer(p->output_len), &bad);
    put(b, "stream", json_true(), &bad);
    json_t *so = json_object();
    put(b, "stream_options", so, &bad);
    if (so != NULL) {
        put(so, "include_usage", json_true(), &bad);
    }
    if (o->ignore_eos) {
        put(b, "ignore_eos", json_true(), &bad);
    }
    if (!isnan(o->temperature)) {
        put(b, "temperature", json_real(o->temperature), &bad);
    }
    if (o->extra_body != NULL && json_object_update(b, (json_t *)o->extra_body) != 0) {
        bad = 1;
    }
    char *s = bad ? NULL : json_dumps(b, JSON_COMPACT);
    json_decref(b);
    if (s != NULL && len != NULL) {
        *len = strlen(s);
    }
    return s;
}

static int64_t int_or(const json_t *v, int64_t dflt)
{
    if (json_is_integer(v)) {
        return (int64_t)json_integer_value(v);
    }
    if (json_is_real(v) && json_real_value(v) >= 0 && json_real_value(v) < 9e15) {
        return (int64_t)json_real_value(v);
    }
    return dflt;
}

static void read_error(const json_t *root, struct lg_chunk *c)
{
    const json_t *e = json_object_get(root, "error");
    const char *msg = NULL;
    if (json_is_object(e)) {
        msg = json_string_value(json_object_get(e, "message"));
        c->is_error = 1;
    } else if (json_is_string(e)) {
        msg = json_string_value(e);
        c->is_error = 1;
    }
    const char *obj = json_string_value(json_object_get(root, "object"));
    if (obj != NULL && strcmp(obj, "error") == 0) {
        c->is_error = 1;
        if (msg == NULL) {
            msg = json_string_value(json_object_get(root, "message"));
        }
    }
    if (c->is_error) {
        snprintf(c->error, sizeof(c->error), "%s", msg ? msg : "error object without message");
    }
}

/* jansson refuses a NUL in an object key even with JSON_ALLOW_NUL, and a
 * logprobs map keyed by the text of a byte-0 token has one ({"\u0000": -1.5}).
 * Such a chunk is read again with every \u0000 escape taken as \u0001: the
 * same length, only that byte of the text differs. */
static json_t *load_nul_keys(const char *data, size_t len, json_error_t *jerr)
{
    char *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        return NULL;
    }
    memcpy(copy, data, len);
    for (size_t i = 0; i + 1 < len; i++) {
        if (copy[i] != '\\') {
            continue;
        }
        if (i + 5 < len && copy[i + 1] == 'u' && memcmp(copy + i + 2, "0000", 4) == 0) {
            copy[i + 5] = '1';
            i += 5;
        } else {
            i++; /* the escaped character, so "\\u0000" stays text */
        }
    }
    json_t *root = json_loadb(copy, len, JSON_ALLOW_NUL, jerr);
    free(copy);
    return root;
}

int lg_openai_parse_chunk(enum lg_api api, const char *data, size_t len, struct lg_chunk *c)
{
    memset(c, 0, sizeof(*c));
    c->prompt_tokens = c->completion_tokens = c->cached_tokens = -1;
    json_error_t jerr;
    json_t *root = json_loadb(data, len, JSON_ALLOW_NUL, &jerr);
    if (root == NULL && strstr(jerr.text, "NUL byte in object key") != NULL) {
        root = load_nul_keys(data, len, &jerr);
    }
    if (root == NULL || !json_is_object(root)) {
        snprintf(c->error, sizeof(c->error), "bad chunk JSON: %s",
                 root ? "not an object" : jerr.text);
        json_decref(root);
        return TANDEM_EPROTO;
    }
    c->root = root;
    read_error(root, c);
    const json_t *usage = json_object_get(root, "usage");
    if (json_is_object(usage)) {
        c->has_usage = 1;
        c->prompt_tokens = int_or(json_object_get(usage, "prompt_tokens"), -1);
        c->completion_tokens = int_or(json_object_get(usage, "completion_tokens"), -1);
        const json_t *d = json_object_get(usage, "prompt_tokens_details");
        if (json_is_object(d)) {
            c->cached_tokens = int_or(json_object_get(d, "cached_tokens"), -1);
        }
    }
    const json_t *choices = json_object_get(root, "choices");
    const json_t *ch = json_is_array(choices) ? json_array_get(choices, 0) : NULL;
    if (!json_is_object(ch)) {
        return 0;
    }
    const json_t *text = NULL;
    int has_role = 0;
    if (api == LG_API_CHAT) {
        const json_t *d = json_object_get(ch, "delta");
        if (!json_is_object(d)) {
            d = json_object_get(ch, "message"); /* a whole, non-streamed response */
        }
        if (json_is_object(d)) {
            text = json_object_get(d, "content");
            has_role = json_object_get(d, "role") != NULL;
        }
    } else {
        text = json_object_get(ch, "text");
    }
    if (!json_is_string(text)) {
        return 0;
    }
    c->text = json_string_value(text);
    c->text_len = json_string_length(text);
    const json_t *fin = json_object_get(ch, "finish_reason");
    int finished = fin != NULL && !json_is_null(fin);
    c->is_token = c->text_len > 0 || (!finished && !has_role);
    return 0;
}

void lg_chunk_clear(struct lg_chunk *c)
{
    json_decref(c->root);
    c->root = NULL;
    c->text = NULL;
}

void lg_openai_error_message(const char *body, size_t len, char *out, size_t outlen)
{
    if (outlen == 0) {
        return;
    }
    out[0] = '\0';
    json_t *root = len > 0 ? json_loadb(body, len, JSON_ALLOW_NUL, NULL) : NULL;
    if (json_is_object(root)) {
        struct lg_chunk c;
        memset(&c, 0, sizeof(c));
        read_error(root, &c);
        const char *m = json_string_value(json_object_get(root, "message"));
        const char *d = json_string_value(json_object_get(root, "detail"));
        if (c.is_error) {
            snprintf(out, outlen, "%s", c.error);
        } else if (m != NULL || d != NULL) {
            snprintf(out, outlen, "%s", m ? m : d);
        }
    }
    json_decref(root);
    if (out[0] == '\0') {
        /* Not JSON: the start of the body, on one line. */
        size_t n = len < outlen - 1 ? len : outlen - 1;
        for (size_t i = 0; i < n; i++) {
            char ch = body[i];
            out[i] = (ch == '\n' || ch == '\r' || ch == '\t') ? ' ' : ch;
        }
        out[n] = '\0';
    }
}

int lg_openai_first_model(const char *body, size_t len, char *out, size_t outlen)
{
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    const json_t *data = json_object_get(root, "data");
    const json_t *first = json_is_array(data) ? json_array_get(data, 0) : NULL;
    const char *id = json_string_value(json_object_get(first, "id"));
    int rc = TANDEM_EPROTO;
    if (id != NULL && strlen(id) < outlen) {
        snprintf(out, outlen, "%s", id);
        rc = 0;
    }
    json_decref(root);
    return rc;
}
