/* --dataset-name trace: replay of a JSONL trace (--dataset-path), one request
 * per line:
 *
 *   {"timestamp": 0.25, "input_length": 812, "output_length": 64}
 *   {"timestamp": 0.31, "prompt": "literal text", "output_length": 16}
 *   {"timestamp": 1.02, "input_length": 1300, "output_length": 8, "hash_ids": [0, 1, 7]}
 *
 * timestamp (alias arrival_time): arrival in seconds from the start, times
 * --trace-time-scale (0.001 for traces in milliseconds, such as Mooncake's;
 * 0.5 replays twice as fast); without it the arrival process is used.
 * input_length (alias prompt_len, input_tokens) or prompt: the prompt, as a
 * token count (synthetic text or ids) or literal text. output_length (alias
 * output_len, max_tokens): max_tokens. hash_ids (Mooncake's format): the
 * prompt's blocks of --trace-block-size tokens; equal ids get equal contents
 * across requests, so the trace's prefix sharing is reproduced; a prompt longer
 * than its blocks is completed with request-specific text.
 *
 * Lines are replayed in timestamp order (a stable sort, so equal times keep
 * the file's order); either every line has a timestamp or none has.
 *
 * Warm-ups replay the first lines with different contents (a literal prompt
 * is replaced by synthetic text of the same length). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"
#include "workload.h"

#define TRACE_MAX_LEN 100000000 /* tokens per prompt */

struct trace_entry {
    double t; /* seconds, scaled; negative: none */
    char *prompt;
    int32_t input_len;
    int32_t output_len;
    int64_t *hash_ids;
    int n_hash;
    int64_t line; /* position in the file, for a stable sort */
};

struct trace_state {
    struct trace_entry *e;
    int64_t n, cap;
};

static const json_t *get_any(const json_t *o, const char *a, const char *b, const char *c)
{
    const json_t *v = json_object_get(o, a);
    if (v == NULL && b != NULL) {
        v = json_object_get(o, b);
    }
    if (v == NULL && c != NULL) {
        v = json_object_get(o, c);
    }
    return v;
}

static int get_len(const json_t *v, int32_t *out)
{
    if (json_is_integer(v) && json_integer_value(v) >= 0 &&
        json_integer_value(v) <= TRACE_MAX_LEN) {
        *out = (int32_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v) && json_real_value(v) >= 0 && json_real_value(v) <= TRACE_MAX_LEN &&
        json_real_value(v) == floor(json_real_value(v))) {
        *out = (int32_t)json_real_value(v);
        return 0;
    }
    return TANDEM_EINVAL;
}

static int parse_line(struct lg_workload *w, const json_t *o, struct trace_entry *e, char *why,
                      size_t whylen)
{
    memset(e, 0, sizeof(*e));
    e->t = -1;
    if (!json_is_object(o)) {
        snprintf(why, whylen, "not a JSON object");
        return TANDEM_EFORMAT;
    }
    const json_t *t = get_any(o, "timestamp", "arrival_time", NULL);
    if (t != NULL) {
        if (!json_is_number(t) || !(json_number_value(t) >= 0) || !isfinite(json_number_value(t))) {
            snprintf(why, whylen, "timestamp must be a number >= 0");
            return TANDEM_EFORMAT;
        }
        e->t = json_number_value(t) * w->cfg.trace_time_scale;
    }
    const json_t *p = json_object_get(o, "prompt");
    const json_t *il = get_any(o, "input_length", "prompt_len", "input_tokens");
    if (json_is_string(p)) {
        size_t len = json_string_length(p);
        if (len == 0 || len > TRACE_MAX_LEN) {
            snprintf(why, whylen, "prompt must not be empty");
            return TANDEM_EFORMAT;
        }
        e->prompt = malloc(len + 1);
        if (e->prompt == NULL) {
            return TANDEM_ENOMEM;
        }
        memcpy(e->prompt, json_string_value(p), len + 1);
        e->input_len = (int32_t)len;
    } else if (il != NULL) {
        if (get_len(il, &e->input_len) != 0 || e->input_len < 1) {
            snprintf(why, whylen, "input_length must be an integer >= 1");
            return TANDEM_EFORMAT;
        }
    } else {
        snprintf(why, whylen, "needs prompt (string) or input_length");
        return TANDEM_EFORMAT;
    }
    const json_t *ol = get_any(o, "output_length", "output_len", "max_tokens");
    if (ol == NULL || get_len(ol, &e->output_len) != 0 || e->output_len < 1) {
        snprintf(why, whylen, "output_length must be an integer >= 1");
        return TANDEM_EFORMAT;
    }
    const json_t *h = json_object_get(o, "hash_ids");
    if (h != NULL && e->prompt == NULL) {
        if (!json_is_array(h) || json_array_size(h) > (size_t)TRACE_MAX_LEN) {
            snprintf(why, whylen, "hash_ids must be an array of integers");
            return TANDEM_EFORMAT;
        }
        size_t n = json_array_size(h);
        e->hash_ids = malloc((n + 1) * sizeof(int64_t));
        if (e->hash_ids == NULL) {
            return TANDEM_ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(h, i);
            if (!json_is_integer(x)) {
                snprintf(why, whylen, "hash_ids must be an array of integers");
                return TANDEM_EFORMAT;
            }
            e->hash_ids[i] = (int64_t)json_integer_value(x);
        }
        e->n_hash = (int)n;
    }
    return 0;
}

static void free_entry(struct trace_entry *e)
{
    free(e->prompt);
    free(e->hash_ids);
}

static int cmp_time(const void *a, const void *b)
{
    const struct trace_entry *x = a, *y = b;
    if (x->t != y->t) {
        return (x->t > y->t) - (x->t < y->t);
    }
    return (x->line > y->line) - (x->line < y->line); /* stable: file order */
}

static int trace_init(struct lg_workload *w, char *err, size_t errlen)
{
    const struct lg_workload_config *c = &w->cfg;
    if (c->trace_path == NULL || c->trace_path[0] == '\0') {
        snprintf(err, errlen, "--dataset-name trace needs --dataset-path FILE.jsonl");
        return TANDEM_EINVAL;
    }
    if (!(c->trace_time_scale > 0) || c->trace_block_size < 1) {
        snprintf(err, errlen, "--trace-time-scale must be > 0 and --trace-block-size >= 1");
        return TANDEM_EINVAL;
    }
    struct trace_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TANDEM_ENOMEM;
    }
    w->state = s;
    FILE *f = fopen(c->trace_path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "--dataset-path: cannot open %s", c->trace_path);
        return TANDEM_EIO;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int64_t lineno = 0;
    int rc = 0;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                           line[len - 1] == '\t')) {
            len--;
        }
        if (len == 0) {
            continue;
        }
        json_error_t jerr;
        json_t *o = json_loadb(line, len, 0, &jerr);
        if (o == NULL) {
            snprintf(err, errlen, "%s:%lld: bad JSON: %s", c->trace_path, (long long)lineno,
                     jerr.text);
            rc = TANDEM_EFORMAT;
            break;
        }
        if (s->n == s->cap) {
            int64_t ncap = s->cap ? s->cap * 2 : 256;
            struct trace_entry *e = realloc(s->e, (size_t)ncap * sizeof(*e));
            if (e == NULL) {
                json_decref(o);
                rc = TANDEM_ENOMEM;
                break;
            }
            s->e = e;
            s->cap = ncap;
        }
        char why[128];
        rc = parse_line(w, o, &s->e[s->n], why, sizeof(why));
        json_decref(o);
        if (rc != 0) {
            free_entry(&s->e[s->n]);
            if (rc == TANDEM_EFORMAT) {
                snprintf(err, errlen, "%s:%lld: %s", c->trace_path, (long long)lineno, why);
            }
            break;
        }
        s->e[s->n].line = s->n;
        s->n++;
    }
    free(line);
    fclose(f);
    if (rc == 0 && s->n == 0) {
        snprintf(err, errlen, "%s: no requests in the trace", c->trace_path);
        rc = TANDEM_EFORMAT;
    }
    if (rc == TANDEM_ENOMEM) {
        snprintf(err, errlen, "out of memory reading %s", c->trace_path);
    }
    int64_t timed = 0;
    for (int64_t i = 0; rc == 0 && i < s->n; i++) {
        timed += s->e[i].t >= 0;
    }
    if (rc == 0 && timed != 0 && timed != s->n) {
        snprintf(err, errlen, "%s: %lld of %lld lines have a timestamp: all or none must",
                 c->trace_path, (long long)timed, (long long)s->n);
        rc = TANDEM_EFORMAT;
    }
    if (rc == 0 && timed > 0) {
        qsort(s->e, (size_t)s->n, sizeof(*s->e), cmp_time);
    }
    w->count = s->n;
    return rc;
}

static double trace_arrival(const struct lg_workload *w, int64_t index)
{
    const struct trace_state *s = w->state;
    return s->e[index % s->n].t;
}

/* Appends n tokens of block hash_id (contents from the seed and the id only). */
static void block_fill(const struct lg_workload_config *c, uint64_t seed, int64_t hash_id,
                       char *text, int32_t *ids, size_t n)
{
    struct lg_rng rng;
    lg_rng_derive(&rng, seed, LG_STREAM_GROUP, (uint64_t)hash_id);
    if (ids != NULL) {
        lg_ids_fill(&rng, ids, n, c->id_lo, c->id_hi);
    } else {
        lg_text_fill(&rng, text, n);
    }
}

static int trace_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    struct trace_state *s = w->state;
    const struct lg_workload_config *c = &w->cfg;
    const struct trace_entry *e = &s->e[index % s->n];
    uint64_t seed = lg_workload_seed(w, warmup);
    struct lg_rng rng;
    lg_rng_derive(&rng, seed, LG_STREAM_REQUEST, (uint64_t)index);
    out->output_len = e->output_len;
    out->arrival_s = e->t;
    if (e->prompt != NULL && !warmup) {
        struct lg_workload_config text_cfg = *c;
        text_cfg.token_ids = 0; /* literal text goes as text */
        /* The literal text as a prefix with an empty body. */
        return lg_prompt_build(&text_cfg, e->prompt, NULL, (size_t)e->input_len, &rng, 0, out);
    }
    size_t len = (size_t)e->input_len;
    size_t bs = (size_t)c->trace_block_size;
    size_t covered = (size_t)e->n_hash * bs < len ? (size_t)e->n_hash * bs : len;
    if (covered == 0) {
        return lg_prompt_build(c, NULL, NULL, 0, &rng, len, out);
    }
    /* The blocks form the prefix; the rest (if any) is the body. */
    char *text = NULL;
    int32_t *ids = NULL;
    int use_ids = c->token_ids && c->api == LG_API_COMPLETIONS;
    if (use_ids) {
        ids = malloc(covered * sizeof(int32_t));
    } else {
        text = malloc(covered);
    }
    if (ids == NULL && text == NULL) {
        return TANDEM_ENOMEM;
    }
    for (size_t off = 0, b = 0; off < covered; off += bs, b++) {
        size_t n = covered - off < bs ? covered - off : bs;
        block_fill(c, seed, e->hash_ids[b], text ? text + off : NULL, ids ? ids + off : NULL, n);
    }
    int rc = lg_prompt_build(c, text, ids, covered, &rng, len - covered, out);
    free(text);
    free(ids);
    return rc;
}

static void trace_fini(struct lg_workload *w)
{
    struct trace_state *s = w->state;
    if (s != NULL) {
        for (int64_t i = 0; i < s->n; i++) {
            free_entry(&s->e[i]);
        }
        free(s->e);
        free(s);
    }
}

const struct lg_dataset_ops lg_dataset_trace = {
    .name = "trace",
    .init = trace_init,
    .make = trace_make,
    .arrival = trace_arrival,
    .fini = trace_fini,
};
