#include "openai.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
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

int lg_openai_parse_chunk_json(enum lg_api api, const char *data, size_t len, struct lg_chunk *c)
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

/* ------------------------------------------------------ the fast reader
 *
 * A strict JSON scanner for the few fields a chunk is read for. Every
 * function returns 0, or NOT_MINE when the input is anything the scanner does
 * not take for certain: lg_openai_parse_chunk then asks jansson, so the
 * scanner may refuse more than jansson but never accepts what jansson would
 * refuse, nor reads a value differently. */

#define NOT_MINE  1
#define MAX_DEPTH 64 /* nesting the scanner follows (jansson: 2048) */
#define KEY_MAX   32 /* bytes of a key it compares; longer ones are skipped */

struct scan {
    const char *p, *end;
    int depth;
};

/* What the scanner found (lg_openai_parse_chunk_json's reading). */
struct found {
    enum lg_api api;
    struct lg_chunk *c;
    unsigned seen; /* 1 << SEEN_*: keys read (a second one: NOT_MINE, jansson keeps the last) */
    int usage, choice, finished, has_role, text;
    int delta_obj, message_obj;
};

/* Keys read once (bits of struct found's seen). */
enum {
    SEEN_USAGE,
    SEEN_CHOICES,
    SEEN_PROMPT,
    SEEN_COMPLETION,
    SEEN_DETAILS,
    SEEN_CACHED,
    SEEN_TEXT,
    SEEN_PART,
    SEEN_FINISH,
    SEEN_CONTENT,
    SEEN_ROLE,
};

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) {
        s->p++;
    }
}

static int peek(const struct scan *s)
{
    return s->p < s->end ? (unsigned char)*s->p : -1;
}

/* Consumes byte ch (after white space) or refuses. */
static int expect(struct scan *s, char ch)
{
    skip_ws(s);
    if (peek(s) != (unsigned char)ch) {
        return NOT_MINE;
    }
    s->p++;
    return 0;
}

/* Length of the UTF-8 character at u[0..n) that jansson accepts (shortest
 * form, no surrogate, at most U+10FFFF), or 0. */
static size_t utf8_char(const unsigned char *u, size_t n)
{
    size_t k = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 0;
    if (k == 0 || k > n || u[0] > 0xF4) {
        return 0;
    }
    uint32_t v = u[0] & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            return 0;
        }
        v = v << 6 | (u[i] & 0x3Fu);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    return v < least[k] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) ? 0 : k;
}

static int hex4(const char *p, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int ch = (unsigned char)p[i], d;
        if (ch >= '0' && ch <= '9') {
            d = ch - '0';
        } else if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f') {
            d = (ch | 0x20) - 'a' + 10;
        } else {
            return NOT_MINE;
        }
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* The \uXXXX escape at p (after the backslash, p[0] == 'u'), with its low
 * surrogate when it is a high one, as UTF-8 into u8 (*n bytes); *used: the
 * source bytes read after the backslash. */
static int unicode_escape(const char *p, const char *end, char *u8, size_t *n, size_t *used)
{
    uint32_t v, lo;
    if (end - p < 5 || hex4(p + 1, &v) != 0 || (v >= 0xDC00 && v <= 0xDFFF)) {
        return NOT_MINE;
    }
    *used = 5;
    if (v >= 0xD800 && v <= 0xDBFF) {
        if (end - p < 11 || p[5] != '\\' || p[6] != 'u' || hex4(p + 7, &lo) != 0 || lo < 0xDC00 ||
            lo > 0xDFFF) {
            return NOT_MINE;
        }
        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        *used = 11;
    }
    unsigned char *o = (unsigned char *)u8;
    if (v < 0x80) {
        o[0] = (unsigned char)v;
        *n = 1;
    } else if (v < 0x800) {
        o[0] = (unsigned char)(0xC0 | v >> 6);
        o[1] = (unsigned char)(0x80 | (v & 0x3F));
        *n = 2;
    } else if (v < 0x10000) {
        o[0] = (unsigned char)(0xE0 | v >> 12);
        o[1] = (unsigned char)(0x80 | (v >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (v & 0x3F));
        *n = 3;
    } else {
        o[0] = (unsigned char)(0xF0 | v >> 18);
        o[1] = (unsigned char)(0x80 | (v >> 12 & 0x3F));
        o[2] = (unsigned char)(0x80 | (v >> 6 & 0x3F));
        o[3] = (unsigned char)(0x80 | (v & 0x3F));
        *n = 4;
    }
    return 0;
}

static char short_escape(char e)
{
    switch (e) {
    case '"':
    case '\\':
    case '/':
        return e;
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    default:
        return 0;
    }
}

/* The string at s->p ('"'), decoded into out[0..cap) when out is not NULL;
 * *len: its decoded length, or SIZE_MAX when it did not fit (it is still
 * read). *nul: it holds a U+0000. */
static int scan_string(struct scan *s, char *out, size_t cap, size_t *len, int *nul)
{
    size_t n = 0;
    *nul = 0;
    s->p++;
    while (s->p < s->end && *s->p != '"') {
        const char *run = s->p; /* plain ASCII, the common case: copied as a run */
        while (s->p < s->end && (unsigned char)*s->p >= 0x20 && (unsigned char)*s->p < 0x80 &&
               *s->p != '"' && *s->p != '\\') {
            s->p++;
        }
        if (s->p > run) {
            size_t k = (size_t)(s->p - run);
            if (out != NULL && n != SIZE_MAX && n + k <= cap) {
                memcpy(out + n, run, k);
            }
            n = n == SIZE_MAX || n + k > cap ? SIZE_MAX : n + k;
            continue;
        }
        const unsigned char *u = (const unsigned char *)s->p;
        char buf[4];
        const char *src = buf;
        size_t k;
        if (u[0] == '\\') {
            if (s->end - s->p < 2) {
                return NOT_MINE;
            }
            size_t used = 1;
            if (s->p[1] == 'u') {
                if (unicode_escape(s->p + 1, s->end, buf, &k, &used) != 0) {
                    return NOT_MINE;
                }
            } else if ((buf[0] = short_escape(s->p[1])) != 0) {
                k = 1;
            } else {
                return NOT_MINE;
            }
            *nul |= k == 1 && buf[0] == '\0';
            s->p += 1 + used;
        } else if (u[0] < 0x20) {
            return NOT_MINE;
        } else {
            k = u[0] < 0x80 ? 1 : utf8_char(u, (size_t)(s->end - s->p));
            if (k == 0) {
                return NOT_MINE;
            }
            src = s->p;
            s->p += k;
        }
        if (out != NULL && n != SIZE_MAX && n + k <= cap) {
            memcpy(out + n, src, k);
        }
        n = n == SIZE_MAX || n + k > cap ? SIZE_MAX : n + k;
    }
    if (s->p >= s->end) {
        return NOT_MINE;
    }
    s->p++;
    *len = n;
    return 0;
}

/* A number; *is_int and *v (when an integer of at most 18 digits). Refuses
 * what jansson might find out of range. */
static int scan_number(struct scan *s, int *is_int, int64_t *v)
{
    int neg = peek(s) == '-';
    s->p += neg;
    const char *d = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        s->p++;
    }
    size_t digits = (size_t)(s->p - d);
    if (digits == 0 || (digits > 1 && d[0] == '0')) {
        return NOT_MINE;
    }
    *is_int = peek(s) != '.' && peek(s) != 'e' && peek(s) != 'E';
    if (*is_int) {
        if (digits > 18) {
            return NOT_MINE;
        }
        int64_t x = 0;
        for (size_t i = 0; i < digits; i++) {
            x = x * 10 + (d[i] - '0');
        }
        *v = neg ? -x : x;
        return 0;
    }
    if (peek(s) == '.') {
        const char *f = ++s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
            s->p++;
        }
        if (s->p == f) {
            return NOT_MINE;
        }
    }
    long exp = 0;
    if (peek(s) == 'e' || peek(s) == 'E') {
        s->p++;
        int eneg = peek(s) == '-';
        s->p += eneg || peek(s) == '+';
        const char *e = s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9' && s->p - e < 4) {
            exp = exp * 10 + (*s->p++ - '0');
        }
        if (s->p == e || (s->p < s->end && *s->p >= '0' && *s->p <= '9')) {
            return NOT_MINE;
        }
        exp = eneg ? -exp : exp;
    }
    return (long)digits + exp > 300 ? NOT_MINE : 0; /* far from DBL_MAX: no overflow */
}

static int skip_value(struct scan *s);

typedef int (*member_fn)(struct scan *s, const char *key, size_t klen, struct found *f);

/* Enters the object or array at s->p; *more: it is not empty (else it is
 * consumed whole). */
static int open_container(struct scan *s, char close, int *more)
{
    if (++s->depth > MAX_DEPTH) {
        return NOT_MINE;
    }
    s->p++;
    skip_ws(s);
    *more = peek(s) != (unsigned char)close;
    if (!*more) {
        s->p++;
        s->depth--;
    }
    return 0;
}

/* After a member or element: a ',' (*more = 1) or the closing byte. */
static int after_item(struct scan *s, char close, int *more)
{
    skip_ws(s);
    int ch = peek(s);
    if (ch != ',' && ch != (unsigned char)close) {
        return NOT_MINE;
    }
    s->p++;
    *more = ch == ',';
    s->depth -= !*more;
    return 0;
}

/* The object at s->p ('{'): fn reads each member's value (s->p at it). */
static int scan_object(struct scan *s, member_fn fn, struct found *f)
{
    int more;
    if (open_container(s, '}', &more) != 0) {
        return NOT_MINE;
    }
    while (more) {
        char key[KEY_MAX];
        size_t klen;
        int nul;
        skip_ws(s);
        if (peek(s) != '"' || scan_string(s, key, sizeof(key), &klen, &nul) != 0 || nul ||
            expect(s, ':') != 0) {
            return NOT_MINE; /* jansson refuses a NUL in a key: it is read again there */
        }
        skip_ws(s);
        if (fn(s, key, klen, f) != 0 || after_item(s, '}', &more) != 0) {
            return NOT_MINE;
        }
    }
    return 0;
}

static int skip_member(struct scan *s, const char *key, size_t klen, struct found *f)
{
    (void)key;
    (void)klen;
    (void)f;
    return skip_value(s);
}

/* The array at s->p ('['); its first element is read by first (when not
 * NULL and it is an object), the others skipped. */
static int scan_array(struct scan *s, member_fn first, struct found *f)
{
    int more;
    if (open_container(s, ']', &more) != 0) {
        return NOT_MINE;
    }
    for (int i = 0; more; i++) {
        skip_ws(s);
        int rc;
        if (i == 0 && first != NULL && peek(s) == '{') {
            f->choice = 1;
            rc = scan_object(s, first, f);
        } else {
            rc = skip_value(s);
        }
        if (rc != 0 || after_item(s, ']', &more) != 0) {
            return NOT_MINE;
        }
    }
    return 0;
}

static int literal(struct scan *s, const char *word, size_t n)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) {
        return NOT_MINE;
    }
    s->p += n;
    return 0;
}

static int skip_value(struct scan *s)
{
    size_t len;
    int nul, is_int;
    int64_t v;
    switch (peek(s)) {
    case '"':
        return scan_string(s, NULL, 0, &len, &nul);
    case '{':
        return scan_object(s, skip_member, NULL);
    case '[':
        return scan_array(s, NULL, NULL);
    case 't':
        return literal(s, "true", 4);
    case 'f':
        return literal(s, "false", 5);
    case 'n':
        return literal(s, "null", 4);
    default:
        return scan_number(s, &is_int, &v);
    }
}

static int is_key(const char *key, size_t klen, const char *name)
{
    return klen == strlen(name) && memcmp(key, name, klen) == 0;
}

/* Marks bit seen; NOT_MINE the second time. */
static int once(struct found *f, int key)
{
    if (f->seen & 1u << key) {
        return NOT_MINE;
    }
    f->seen |= 1u << key;
    return 0;
}

/* A count: an integer, or -1 for anything but a number (int_or). */
static int scan_count(struct scan *s, int64_t *out)
{
    int c = peek(s);
    if (c != '-' && (c < '0' || c > '9')) {
        *out = -1;
        return skip_value(s);
    }
    int is_int;
    return scan_number(s, &is_int, out) != 0 || !is_int ? NOT_MINE : 0;
}

static int details_member(struct scan *s, const char *key, size_t klen, struct found *f)
{
    if (is_key(key, klen, "cached_tokens")) {
        return once(f, SEEN_CACHED) || scan_count(s, &f->c->cached_tokens);
    }
    return skip_value(s);
}

static int usage_member(struct scan *s, const char *key, size_t klen, struct found *f)
{
    if (is_key(key, klen, "prompt_tokens")) {
        return once(f, SEEN_PROMPT) || scan_count(s, &f->c->prompt_tokens);
    }
    if (is_key(key, klen, "completion_tokens")) {
        return once(f, SEEN_COMPLETION) || scan_count(s, &f->c->completion_tokens);
    }
    if (is_key(key, klen, "prompt_tokens_details")) {
        if (once(f, SEEN_DETAILS)) {
            return NOT_MINE;
        }
        return peek(s) == '{' ? scan_object(s, details_member, f) : skip_value(s);
    }
    return skip_value(s);
}

/* A generated text: a string into the chunk's buffer (f->text), else none. */
static int scan_text(struct scan *s, struct found *f)
{
    if (peek(s) != '"') {
        return skip_value(s);
    }
    int nul;
    size_t n;
    if (scan_string(s, f->c->text_buf, LG_CHUNK_TEXT_MAX, &n, &nul) != 0 || n == SIZE_MAX) {
        return NOT_MINE;
    }
    f->c->text_buf[n] = '\0';
    f->c->text_len = n;
    f->text = 1;
    return 0;
}

static int delta_member(struct scan *s, const char *key, size_t klen, struct found *f)
{
    if (is_key(key, klen, "content")) {
        return once(f, SEEN_CONTENT) || scan_text(s, f);
    }
    if (is_key(key, klen, "role")) {
        f->has_role = 1;
        return once(f, SEEN_ROLE) || skip_value(s);
    }
    return skip_value(s);
}

/* chat: "delta", or "message" in a whole response; one of them at most. */
static int chat_part(struct scan *s, struct found *f, int *is_obj)
{
    if (once(f, SEEN_PART)) {
        return NOT_MINE;
    }
    *is_obj = peek(s) == '{';
    return *is_obj ? scan_object(s, delta_member, f) : skip_value(s);
}

static int choice_member(struct scan *s, const char *key, size_t klen, struct found *f)
{
    if (is_key(key, klen, "finish_reason")) {
        f->finished = peek(s) != 'n';
        return once(f, SEEN_FINISH) || skip_value(s);
    }
    if (f->api == LG_API_CHAT && is_key(key, klen, "delta")) {
        return chat_part(s, f, &f->delta_obj);
    }
    if (f->api == LG_API_CHAT && is_key(key, klen, "message")) {
        return chat_part(s, f, &f->message_obj);
    }
    if (f->api != LG_API_CHAT && is_key(key, klen, "text")) {
        return once(f, SEEN_TEXT) || scan_text(s, f);
    }
    return skip_value(s);
}

static int top_member(struct scan *s, const char *key, size_t klen, struct found *f)
{
    if (is_key(key, klen, "error")) {
        return NOT_MINE; /* read_error's cases are jansson's */
    }
    if (is_key(key, klen, "object") && peek(s) == '"') {
        char v[8];
        size_t n;
        int nul;
        /* n is SIZE_MAX (and v untouched) for a value longer than v: not "error". */
        if (scan_string(s, v, sizeof(v), &n, &nul) != 0 || (n == 5 && memcmp(v, "error", 5) == 0)) {
            return NOT_MINE;
        }
        return 0;
    }
    if (is_key(key, klen, "usage")) {
        if (once(f, SEEN_USAGE)) {
            return NOT_MINE;
        }
        f->usage = peek(s) == '{';
        return f->usage ? scan_object(s, usage_member, f) : skip_value(s);
    }
    if (is_key(key, klen, "choices")) {
        if (once(f, SEEN_CHOICES)) {
            return NOT_MINE;
        }
        return peek(s) == '[' ? scan_array(s, choice_member, f) : skip_value(s);
    }
    return skip_value(s);
}

/* lg_openai_parse_chunk_json's result for data, or NOT_MINE. */
static int parse_fast(enum lg_api api, const char *data, size_t len, struct lg_chunk *c)
{
    struct scan s = {.p = data, .end = data + len};
    struct found f = {.api = api, .c = c};
    c->prompt_tokens = c->completion_tokens = c->cached_tokens = -1;
    skip_ws(&s);
    if (peek(&s) != '{' || scan_object(&s, top_member, &f) != 0) {
        return NOT_MINE;
    }
    skip_ws(&s);
    if (s.p != s.end || (f.delta_obj && f.message_obj)) {
        return NOT_MINE;
    }
    c->has_usage = f.usage;
    int chat_obj = f.delta_obj || f.message_obj;
    if (!f.choice || !f.text || (api == LG_API_CHAT && !chat_obj)) {
        c->text_len = 0;
        return 0;
    }
    c->text = c->text_buf;
    c->is_token = c->text_len > 0 || (!f.finished && !f.has_role);
    return 0;
}

int lg_openai_parse_chunk(enum lg_api api, const char *data, size_t len, struct lg_chunk *c)
{
    memset(c, 0, offsetof(struct lg_chunk, text_buf));
    if (parse_fast(api, data, len, c) == 0) {
        return 0;
    }
    return lg_openai_parse_chunk_json(api, data, len, c);
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
