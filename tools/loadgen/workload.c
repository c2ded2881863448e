/* Workload registry and the helpers shared by the datasets. */
#include "workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

static const struct lg_dataset_ops *const datasets[LG_DATASET_COUNT] = {
    [LG_DATASET_RANDOM] = &lg_dataset_random,
    [LG_DATASET_SHARED_PREFIX] = &lg_dataset_shared_prefix,
    [LG_DATASET_MULTI_TURN] = &lg_dataset_multi_turn,
    [LG_DATASET_LONG_SHORT] = &lg_dataset_long_short,
    [LG_DATASET_SHAREGPT_SYNTH] = &lg_dataset_sharegpt,
    [LG_DATASET_TRACE] = &lg_dataset_trace,
};

void lg_workload_config_default(struct lg_workload_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->dataset = LG_DATASET_RANDOM;
    cfg->api = LG_API_COMPLETIONS;
    /* Printable ASCII (bytes 32..126) on Tandem's byte-level tokenizer, where
     * byte b is id b + 3. */
    cfg->id_lo = 35;
    cfg->id_hi = 130;
    cfg->random_input_len = 1024;
    cfg->random_output_len = 128;
    cfg->gsp_num_groups = 64;
    cfg->gsp_prompts_per_group = 16;
    cfg->gsp_system_prompt_len = 2048;
    cfg->gsp_question_len = 128;
    cfg->gsp_output_len = 256;
    cfg->long_fraction = 0.1;
    cfg->sharegpt_input_mean = 161.31; /* vLLM paper, Fig. 11 (dataset_sharegpt.c) */
    cfg->sharegpt_output_mean = 337.99;
    cfg->sharegpt_max_input = 1024; /* vLLM's is_valid_sequence */
    cfg->sharegpt_max_total = 2048;
    cfg->long_input_len = 8192;
    cfg->short_input_len = 256;
    cfg->long_output_len = 128;
    cfg->short_output_len = 128;
    cfg->mt_turns = 5;
    cfg->mt_system_len = 0;
    cfg->mt_input_len = 128;
    cfg->mt_output_len = 128;
    cfg->mt_history = LG_HISTORY_RESPONSE;
    cfg->trace_time_scale = 1.0;
    cfg->trace_block_size = 512; /* Mooncake traces: one hash id per 512 tokens */
}

const char *lg_dataset_name(enum lg_dataset d)
{
    if ((int)d < 0 || d >= LG_DATASET_COUNT) {
        return "unknown";
    }
    return datasets[d]->name;
}

char *lg_dataset_names(char *out, size_t cap)
{
    size_t len = 0;
    if (cap > 0) {
        out[0] = '\0';
    }
    for (int d = 0; d < LG_DATASET_COUNT && len + 1 < cap; d++) {
        int w = snprintf(out + len, cap - len, "%s%s", d > 0 ? ", " : "", datasets[d]->name);
        len += w > 0 ? (size_t)w : 0;
    }
    return out;
}

int lg_dataset_parse(const char *name, enum lg_dataset *out)
{
    for (int d = 0; d < LG_DATASET_COUNT; d++) {
        if (strcmp(name, datasets[d]->name) == 0) {
            *out = (enum lg_dataset)d;
            return 0;
        }
    }
    if (strcmp(name, "generated-shared-prefix") == 0) {
        *out = LG_DATASET_SHARED_PREFIX;
        return 0;
    }
    if (strcmp(name, "sharegpt") == 0) {
        *out = LG_DATASET_SHAREGPT_SYNTH;
        return 0;
    }
    return TANDEM_EINVAL;
}

int lg_workload_init(struct lg_workload *w, const struct lg_workload_config *cfg, char *err,
                     size_t errlen)
{
    memset(w, 0, sizeof(*w));
    if ((int)cfg->dataset < 0 || cfg->dataset >= LG_DATASET_COUNT) {
        snprintf(err, errlen, "--dataset-name: unknown dataset");
        return TANDEM_EINVAL;
    }
    w->cfg = *cfg;
    w->ops = datasets[cfg->dataset];
    w->count = -1;
    w->turns = 1;
    if (cfg->token_ids && cfg->api == LG_API_CHAT) {
        snprintf(err, errlen,
                 "--prompt-token-ids needs the completions endpoint (chat messages are text)");
        return TANDEM_EINVAL;
    }
    if (cfg->token_ids && !(cfg->id_lo >= 0 && cfg->id_lo < cfg->id_hi)) {
        snprintf(err, errlen, "--token-id-range: need 0 <= LO < HI");
        return TANDEM_EINVAL;
    }
    int rc = w->ops->init(w, err, errlen);
    if (rc != 0) {
        lg_workload_fini(w);
    }
    return rc;
}

void lg_workload_fini(struct lg_workload *w)
{
    if (w->ops != NULL && w->ops->fini != NULL) {
        w->ops->fini(w);
    }
    w->state = NULL;
    w->ops = NULL;
}

int lg_workload_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    memset(out, 0, sizeof(*out));
    out->index = index;
    out->session = -1;
    out->arrival_s = -1;
    int rc = w->ops->make(w, index, warmup, out);
    if (rc != 0) {
        lg_prompt_free(out);
    }
    return rc;
}

void lg_workload_turn_done(struct lg_workload *w, const struct lg_prompt *p, const char *text,
                           size_t len)
{
    if (w->ops->turn_done != NULL) {
        w->ops->turn_done(w, p, text, len);
    }
}

double lg_workload_arrival(const struct lg_workload *w, int64_t index)
{
    return w->ops->arrival != NULL ? w->ops->arrival(w, index) : -1;
}

void lg_prompt_free(struct lg_prompt *p)
{
    free(p->text);
    free(p->ids);
    for (int i = 0; i < p->n_msgs; i++) {
        free(p->msgs[i].content);
    }
    free(p->msgs);
    p->text = NULL;
    p->ids = NULL;
    p->msgs = NULL;
    p->n_msgs = 0;
    p->text_len = p->n_ids = 0;
}

uint64_t lg_workload_seed(const struct lg_workload *w, int warmup)
{
    return warmup ? w->cfg.seed ^ 0x5741524d55505f5fULL : w->cfg.seed;
}

/* Common short English words: BPE tokenizers see about one token per word. */
static const char *const words[] = {
    "the",   "of",    "and",   "to",     "in",    "is",    "you",     "that",   "it",    "he",
    "was",   "for",   "on",    "are",    "as",    "with",  "his",     "they",   "at",    "be",
    "this",  "have",  "from",  "or",     "one",   "had",   "by",      "word",   "but",   "not",
    "what",  "all",   "were",  "we",     "when",  "your",  "can",     "said",   "there", "use",
    "an",    "each",  "which", "she",    "do",    "how",   "their",   "if",     "will",  "up",
    "other", "about", "out",   "many",   "then",  "them",  "these",   "so",     "some",  "her",
    "would", "make",  "like",  "him",    "into",  "time",  "has",     "look",   "two",   "more",
    "write", "go",    "see",   "number", "no",    "way",   "could",   "people", "my",    "than",
    "first", "water", "been",  "call",   "who",   "oil",   "its",     "now",    "find",  "long",
    "down",  "day",   "did",   "get",    "come",  "made",  "may",     "part",   "over",  "new",
    "sound", "take",  "only",  "little", "work",  "know",  "place",   "year",   "live",  "me",
    "back",  "give",  "most",  "very",   "after", "thing", "our",     "just",   "name",  "good",
    "model", "cache", "token", "block",  "serve", "batch", "prefill", "decode",
};

void lg_text_fill(struct lg_rng *r, char *dst, size_t n)
{
    const size_t nw = sizeof(words) / sizeof(words[0]);
    size_t pos = 0;
    while (pos < n) {
        if (pos > 0) {
            /* Never end on a separator: a last single byte is a letter. */
            char sep = n - pos == 1 ? 'a' : ' ';
            dst[pos++] = sep;
            if (pos >= n) {
                break;
            }
        }
        const char *w = words[lg_rng_range(r, 0, (int64_t)nw - 1)];
        size_t len = strlen(w);
        if (len > n - pos) {
            len = n - pos;
        }
        memcpy(dst + pos, w, len);
        pos += len;
    }
}

void lg_ids_fill(struct lg_rng *r, int32_t *ids, size_t n, int32_t lo, int32_t hi)
{
    for (size_t i = 0; i < n; i++) {
        ids[i] = (int32_t)lg_rng_range(r, lo, (int64_t)hi - 1);
    }
}

static int add_message(struct lg_prompt *p, const char *role, char *content, size_t len)
{
    struct lg_message *m = realloc(p->msgs, (size_t)(p->n_msgs + 1) * sizeof(*m));
    if (m == NULL) {
        return TANDEM_ENOMEM;
    }
    p->msgs = m;
    m[p->n_msgs].role = role;
    m[p->n_msgs].content = content;
    m[p->n_msgs].len = len;
    p->n_msgs++;
    return 0;
}

int lg_prompt_build(const struct lg_workload_config *cfg, const char *prefix,
                    const int32_t *prefix_ids, size_t prefix_len, struct lg_rng *r, size_t body_len,
                    struct lg_prompt *out)
{
    out->prompt_len = (int32_t)(prefix_len + body_len);
    if (cfg->api == LG_API_COMPLETIONS && cfg->token_ids) {
        out->ids = malloc((prefix_len + body_len + 1) * sizeof(int32_t));
        if (out->ids == NULL) {
            return TANDEM_ENOMEM;
        }
        if (prefix_len > 0) {
            memcpy(out->ids, prefix_ids, prefix_len * sizeof(int32_t));
        }
        lg_ids_fill(r, out->ids + prefix_len, body_len, cfg->id_lo, cfg->id_hi);
        out->n_ids = prefix_len + body_len;
        return 0;
    }
    if (cfg->api == LG_API_COMPLETIONS) {
        out->text = malloc(prefix_len + body_len + 1);
        if (out->text == NULL) {
            return TANDEM_ENOMEM;
        }
        if (prefix_len > 0) {
            memcpy(out->text, prefix, prefix_len);
        }
        lg_text_fill(r, out->text + prefix_len, body_len);
        out->text_len = prefix_len + body_len;
        out->text[out->text_len] = '\0';
        return 0;
    }
    if (prefix_len > 0) {
        char *sys = malloc(prefix_len + 1);
        if (sys == NULL) {
            return TANDEM_ENOMEM;
        }
        memcpy(sys, prefix, prefix_len);
        sys[prefix_len] = '\0';
        /* A prefix with no body is the whole user message. */
        if (add_message(out, body_len > 0 ? "system" : "user", sys, prefix_len) != 0) {
            free(sys);
            return TANDEM_ENOMEM;
        }
        if (body_len == 0) {
            return 0;
        }
    }
    char *user = malloc(body_len + 1);
    if (user == NULL) {
        return TANDEM_ENOMEM;
    }
    lg_text_fill(r, user, body_len);
    user[body_len] = '\0';
    if (add_message(out, "user", user, body_len) != 0) {
        free(user);
        return TANDEM_ENOMEM;
    }
    return 0;
}
