/* The streamed-path renderer as it was before direct appends: a jansson DOM
 * per chunk (json_pack, json_array_append_new, ...) dumped with DUMP_FLAGS.
 * Kept, verbatim but for its names, as the reference the new renderer must
 * equal byte for byte (tests/router/test_oa_stream.c) and as the "old" side
 * of bench/router/bench_sse.c.
 *
 * It includes router/openai.c itself, so it reaches the module's private
 * helpers (token_text, utf8_count, finish_text, chunk_due, object_name) and its
 * objects define every oa_ function: link this file, not tandem_router_core's
 * openai.o (a target that lists oa_ref.c among its sources gets that: the
 * archive member is then never pulled). */
#include "openai.c"

#include "oa_ref.h"
/* ----------------------------------------------------------- JSON pieces */

static int ref_put(json_t *obj, const char *key, json_t *v)
{
    return v == NULL ? -1 : json_object_set_new(obj, key, v);
}

/* A logprob as JSON: -inf (impossible in JSON) becomes -9999.0 as vLLM. */
static json_t *ref_lp_real(float lp)
{
    return json_real(isinf(lp) || lp < -9999.0f ? -9999.0 : (double)lp);
}

/* Completions logprobs of records r[0..n), tokens named after *prev, offsets
 * from *offset; both advance. */
static json_t *ref_completion_logprobs(const struct tokenizer *tok, const struct oa_logprob *r,
                                       int n, uint32_t *prev, size_t *offset)
{
    json_t *tokens = json_array(), *tlp = json_array(), *top = json_array(), *off = json_array();
    json_t *doc = json_object();
    int bad = !tokens || !tlp || !top || !off || !doc;
    char s[TOKEN_TEXT_MAX], a[TOKEN_TEXT_MAX];
    for (int i = 0; !bad && i < n; i++) {
        size_t sl = token_text(tok, *prev, r[i].token, s, NULL, NULL);
        bad |= push(tokens, json_stringn(s, sl));
        bad |= push(off, json_integer((json_int_t)*offset));
        if (isnan(r[i].logprob)) {
            bad |= push(tlp, json_null());
            bad |= push(top, json_null());
        } else {
            /* The sampled token first, then the alternatives not already
             * named: up to logprobs + 1 entries, as OpenAI documents. */
            json_t *d = json_object();
            bad |= push(tlp, ref_lp_real(r[i].logprob));
            bad |= json_object_setn_new(d, s, sl, ref_lp_real(r[i].logprob)) != 0;
            for (int k = 0; !bad && k < r[i].n_top; k++) {
                size_t al = token_text(tok, *prev, r[i].top[k].token, a, NULL, NULL);
                if (json_object_getn(d, a, al) == NULL)
                    bad |= json_object_setn_new(d, a, al, ref_lp_real(r[i].top[k].logprob)) != 0;
            }
            bad |= push(top, d);
        }
        *offset += utf8_count(s, sl);
        *prev = r[i].token;
    }
    if (!bad) {
        bad |= ref_put(doc, "tokens", tokens);
        bad |= ref_put(doc, "token_logprobs", tlp);
        bad |= ref_put(doc, "top_logprobs", top);
        bad |= ref_put(doc, "text_offset", off);
        tokens = tlp = top = off = NULL;
    }
    json_decref(tokens);
    json_decref(tlp);
    json_decref(top);
    json_decref(off);
    if (bad) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

/* {"token", "logprob", "bytes"} of token after prev (chat shape). */
static json_t *ref_chat_token(const struct tokenizer *tok, uint32_t prev, uint32_t token, float lp)
{
    char s[TOKEN_TEXT_MAX];
    const char *raw;
    size_t raw_len;
    size_t sl = token_text(tok, prev, token, s, &raw, &raw_len);
    json_t *bytes = json_array();
    int bad = bytes == NULL;
    for (size_t i = 0; !bad && i < raw_len; i++)
        bad |= push(bytes, json_integer((unsigned char)raw[i]));
    if (bad) {
        json_decref(bytes);
        return NULL;
    }
    return json_pack("{s:s%,s:o,s:o}", "token", s, sl, "logprob", ref_lp_real(lp), "bytes", bytes);
}

static json_t *ref_chat_logprobs(const struct tokenizer *tok, const struct oa_logprob *r, int n,
                                 uint32_t *prev)
{
    json_t *content = json_array();
    int bad = content == NULL;
    for (int i = 0; !bad && i < n; i++) {
        json_t *e = ref_chat_token(tok, *prev, r[i].token, r[i].logprob);
        json_t *alts = json_array();
        bad |= e == NULL || alts == NULL;
        for (int k = 0; !bad && k < r[i].n_top; k++)
            bad |= push(alts, ref_chat_token(tok, *prev, r[i].top[k].token, r[i].top[k].logprob));
        if (!bad) {
            bad |= ref_put(e, "top_logprobs", alts);
            alts = NULL;
            bad |= push(content, e);
            e = NULL;
        }
        json_decref(e);
        json_decref(alts);
        *prev = r[i].token;
    }
    if (bad) {
        json_decref(content);
        return NULL;
    }
    return json_pack("{s:o}", "content", content);
}

/* The pending logprob records as JSON (null when logprobs are off), then
 * forgets them. */
static json_t *ref_take_logprobs(struct oa_output *o)
{
    if (!o->logprobs)
        return json_null();
    json_t *j = o->kind == OA_KIND_CHAT
                    ? ref_chat_logprobs(o->tok, o->lp, o->n_lp, &o->lp_prev)
                    : ref_completion_logprobs(o->tok, o->lp, o->n_lp, &o->lp_prev, &o->text_offset);
    o->n_lp = 0;
    o->n_prompt_lp = 0;
    return j;
}

/* {"id","object","created","model"} with an empty "choices" array. */
static json_t *ref_response_base(const struct oa_output *o, const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:[]}", "id", o->id, "object", object, "created",
                     (json_int_t)o->created, "model", o->model, "choices");
}

/* A choice with the pending text and logprobs (then forgotten), and the
 * finish fields (finish_reason and stop_reason null when finish is NULL). */
static json_t *ref_make_choice(struct oa_output *o, int chunk, const char *finish,
                               json_t *stop_reason)
{
    json_t *c = json_object();
    json_t *text = json_stringn(o->text ? o->text : "", o->text_len);
    int bad = c == NULL || text == NULL;
    o->text_len = 0;
    bad |= ref_put(c, "index", json_integer(0));
    if (o->kind == OA_KIND_COMPLETION) {
        bad |= ref_put(c, "text", text);
    } else if (!chunk) {
        bad |= ref_put(c, "message", json_pack("{s:s,s:o}", "role", "assistant", "content", text));
    } else {
        json_t *delta = json_object();
        bad |= delta == NULL;
        if (!o->began)
            bad |= ref_put(delta, "role", json_string("assistant"));
        /* The last chunk of OpenAI's streams carries an empty delta. */
        if (finish == NULL || json_string_length(text) > 0 || !o->began)
            bad |= ref_put(delta, "content", text);
        else
            json_decref(text);
        bad |= ref_put(c, "delta", delta);
        o->began = 1;
    }
    bad |= ref_put(c, "logprobs", ref_take_logprobs(o));
    bad |= ref_put(c, "finish_reason", finish ? json_string(finish) : json_null());
    bad |= ref_put(c, "stop_reason", stop_reason ? stop_reason : json_null());
    if (bad) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* A chunk with choice c (consumed), "usage": null when include_usage. */
static int ref_chunk_with(struct oa_output *o, json_t *c, char **json)
{
    json_t *doc = ref_response_base(o, object_name(o, 1));
    int bad = doc == NULL || c == NULL;
    if (!bad) {
        bad |= push(json_object_get(doc, "choices"), c);
        c = NULL;
        if (o->include_usage)
            bad |= ref_put(doc, "usage", json_null());
    }
    json_decref(c);
    if (bad) {
        json_decref(doc);
        *json = NULL;
        return TANDEM_ENOMEM;
    }
    return dump(doc, json);
}

int oa_ref_begin(struct oa_output *o, char **json)
{
    if (o == NULL || json == NULL)
        return TANDEM_EINVAL;
    *json = NULL;
    if (o->kind != OA_KIND_CHAT || !o->stream || o->began || o->finished)
        return 0;
    return ref_chunk_with(o, ref_make_choice(o, 1, NULL, NULL), json);
}

int oa_ref_chunk(struct oa_output *o, char **json)
{
    if (o == NULL || json == NULL)
        return TANDEM_EINVAL;
    *json = NULL;
    int due = chunk_due(o);
    if (due <= 0)
        return due;
    return ref_chunk_with(o, ref_make_choice(o, 1, NULL, NULL), json);
}

static json_t *ref_usage_json(const struct oa_output *o, int prompt_tokens, int cached_tokens)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens",
                     o->n_tokens, "total_tokens", prompt_tokens + o->n_tokens,
                     "prompt_tokens_details", "cached_tokens", cached_tokens);
}

/* The stop string or stop token id that ended the output, or JSON null. */
static json_t *ref_stop_reason(const struct oa_output *o, enum oa_finish reason)
{
    if (o->dec.stopped)
        return json_stringn(o->dec.stop[o->dec.stop_index], o->dec.stop_len[o->dec.stop_index]);
    if (reason == OA_FINISH_STOP && o->n_tokens > 0) {
        for (int i = 0; i < o->n_stop_ids; i++) {
            if (o->stop_ids[i] == o->last_token)
                return json_integer(o->last_token);
        }
    }
    return json_null();
}

int oa_ref_finish(struct oa_output *o, enum oa_finish reason, int prompt_tokens, int cached_tokens,
                  char **body, char **usage_chunk)
{
    int frc = finish_text(o, &reason, body, usage_chunk);
    if (frc != 0)
        return frc;
    json_t *c = ref_make_choice(o, o->stream, oa_finish_name(reason), ref_stop_reason(o, reason));
    if (o->stream) {
        int rc = ref_chunk_with(o, c, body);
        if (rc != 0 || !o->include_usage)
            return rc;
        json_t *doc = ref_response_base(o, object_name(o, 1));
        if (doc == NULL ||
            ref_put(doc, "usage", ref_usage_json(o, prompt_tokens, cached_tokens)) != 0) {
            json_decref(doc);
            free(*body);
            *body = NULL;
            return TANDEM_ENOMEM;
        }
        rc = dump(doc, usage_chunk);
        if (rc != 0) {
            free(*body);
            *body = NULL;
        }
        return rc;
    }
    json_t *doc = ref_response_base(o, object_name(o, 0));
    int bad = doc == NULL || c == NULL;
    if (!bad) {
        bad |= push(json_object_get(doc, "choices"), c);
        c = NULL;
        bad |= ref_put(doc, "usage", ref_usage_json(o, prompt_tokens, cached_tokens));
    }
    json_decref(c);
    if (bad) {
        json_decref(doc);
        return TANDEM_ENOMEM;
    }
    return dump(doc, body);
}
