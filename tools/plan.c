/* `tandem plan`: see plan.h for the arithmetic, docs/engine.md for the presets. */
#include "plan.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "tandem_err.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

/* Same order as enum kv_dtype, so the choice index is the dtype. */
static const char *const dtype_choices[] = {"f32", "f16", "bf16", "fp8", NULL};

void plan_input_init(struct plan_input *in)
{
    memset(in, 0, sizeof(*in));
    in->kv_dtype = KV_DTYPE_BF16;
    in->tp = 1;
    in->hbm_utilisation = 0.9;
}

uint64_t plan_kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, enum kv_dtype dt)
{
    return 2u * (uint64_t)n_layers * (uint64_t)n_kv_heads * (uint64_t)head_dim *
           (uint64_t)kv_dtype_size(dt);
}

/* A token count: decimal digits, optionally followed by k or K (x 1024). */
static int parse_count(const char *s, size_t len, int64_t min, int64_t max, int64_t *out)
{
    if (len == 0 || len > 20) {
        return TANDEM_EINVAL;
    }
    int64_t mult = 1;
    if (s[len - 1] == 'k' || s[len - 1] == 'K') {
        mult = 1024;
        len--;
    }
    if (len == 0) {
        return TANDEM_EINVAL;
    }
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return TANDEM_EINVAL;
        }
        v = v * 10 + (s[i] - '0');
        if (v > max) {
            return TANDEM_EINVAL;
        }
    }
    if (v > max / mult) {
        return TANDEM_EINVAL;
    }
    v *= mult;
    if (v < min || v > max) {
        return TANDEM_EINVAL;
    }
    *out = v;
    return 0;
}

/* Calls item(s, len, i, arg) for every comma-separated item of s. */
static int for_items(const char *s, int max, int *n,
                     int (*item)(const char *s, size_t len, int i, void *arg), void *arg)
{
    if (s == NULL || *s == '\0') {
        return TANDEM_EINVAL;
    }
    int count = 0;
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (count >= max || item(p, len, count, arg) != 0) {
            return TANDEM_EINVAL;
        }
        count++;
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    *n = count;
    return 0;
}

static int context_item(const char *s, size_t len, int i, void *arg)
{
    return parse_count(s, len, 1, PLAN_MAX_CONTEXT, (int64_t *)arg + i);
}

static int read_item(const char *s, size_t len, int i, void *arg)
{
    struct plan_read *r = (struct plan_read *)arg + i;
    const char *colon = memchr(s, ':', len);
    if (colon == NULL) {
        return TANDEM_EINVAL;
    }
    size_t blen = (size_t)(colon - s);
    int rc = parse_count(s, blen, 1, PLAN_MAX_BATCH, &r->batch);
    if (rc == 0) {
        rc = parse_count(colon + 1, len - blen - 1, 1, PLAN_MAX_CONTEXT, &r->context);
    }
    return rc;
}

int plan_parse_contexts(const char *s, int64_t *out, int max, int *n)
{
    return for_items(s, max, n, context_item, out);
}

int plan_parse_reads(const char *s, struct plan_read *out, int max, int *n)
{
    return for_items(s, max, n, read_item, out);
}

/* A positive int flag given as a string (so --help can show "(none)"). */
static int parse_dim(const char *flag, const char *s, int max, int *out, char *err, size_t errlen)
{
    int64_t v;
    if (parse_count(s, strlen(s), 1, max, &v) != 0 || s[strlen(s) - 1] == 'k' ||
        s[strlen(s) - 1] == 'K') {
        snprintf(err, errlen, "--%s: '%s' is not an integer in [1, %d]", flag, s, max);
        return TANDEM_EINVAL;
    }
    *out = (int)v;
    return 0;
}

static void usage(FILE *f, const struct flag *flags, size_t n)
{
    char names[512];
    flags_usage(f,
                "tandem plan (--model PRESET | --layers N --kv-heads N --head-dim N) [flags]\n\n"
                "KV-cache arithmetic: KV bytes per token, GB per sequence and how many fit\n"
                "in a budget, bytes read per generated token, and with --gpu the decode step\n"
                "lower bound. 1 KiB = 1024 B, 1 GB = 10^9 B. Byte counts accept 140e9, 140GB,\n"
                "130GiB; token counts accept 8192 or 8k (= 8192).",
                flags, n);
    preset_model_names(names, sizeof(names));
    fprintf(f, "\nmodels: %s\n", names);
    preset_gpu_names(names, sizeof(names));
    fprintf(f, "gpus:   %s\n", names);
}

/* Parses into in; on FLAGS_HELP prints usage to help_out when not NULL. */
static int parse_args(struct plan_input *in, int argc, char **argv, int first, char *err,
                      size_t errlen, FILE *help_out)
{
    const char *model = NULL, *layers = NULL, *kv_heads = NULL, *head_dim = NULL;
    const char *gpu = NULL, *contexts = NULL, *reads = NULL;
    int dtype = (int)in->kv_dtype;
    const struct flag flags[] = {
        {"model", FLAG_STR, &model, "model preset (sets the shape and weights = 2 B x params)", 0,
         0, NULL},
        {"layers", FLAG_STR, &layers, "layers (without --model)", 0, 0, NULL},
        {"kv-heads", FLAG_STR, &kv_heads, "KV heads (without --model)", 0, 0, NULL},
        {"head-dim", FLAG_STR, &head_dim, "head dimension (without --model)", 0, 0, NULL},
        {"kv-dtype", FLAG_CHOICE, &dtype, "KV storage type: 4, 2, 2, 1 bytes", 0, 0, dtype_choices},
        {"weights-bytes", FLAG_BYTES, &in->weights_bytes,
         "weight bytes (0: 2 B x params of --model, else unknown)", 0, 0, NULL},
        {"kv-budget", FLAG_BYTES, &in->kv_budget,
         "bytes for KV (0: tp x HBM x hbm-util - weights with --gpu, else none)", 0, 0, NULL},
        {"contexts", FLAG_STR, &contexts, "comma list of context lengths in tokens", 0, 0, NULL},
        {"reads", FLAG_STR, &reads, "comma list of batch:context decode shapes", 0, 0, NULL},
        {"gpu", FLAG_STR, &gpu, "GPU preset for time bounds and the derived budget", 0, 0, NULL},
        {"tp", FLAG_INT, &in->tp, "GPUs in the tensor-parallel group", 1, 1024, NULL},
        {"hbm-util", FLAG_DOUBLE, &in->hbm_utilisation,
         "share of HBM for weights + KV (derived budget)", 0.01, 1, NULL},
        {"json", FLAG_BOOL, &in->json, "print JSON instead of text", 0, 0, NULL},
    };
    int rc = flags_parse(flags, FLAGS_COUNT(flags), argc, argv, first, NULL, err, errlen);
    if (rc == FLAGS_HELP && help_out != NULL) {
        usage(help_out, flags, FLAGS_COUNT(flags));
    }
    if (rc != FLAGS_OK) {
        return rc;
    }
    in->kv_dtype = (enum kv_dtype)dtype;
    char names[512];
    if (model != NULL) {
        in->model = preset_model_find(model);
        if (in->model == NULL) {
            preset_model_names(names, sizeof(names));
            snprintf(err, errlen, "--model: unknown preset '%s' (one of: %s)", model, names);
            return TANDEM_EINVAL;
        }
        const char *clash = layers     ? "layers"
                            : kv_heads ? "kv-heads"
                            : head_dim ? "head-dim"
                                       : NULL;
        if (clash != NULL) {
            snprintf(err, errlen, "--%s conflicts with --model (the preset sets it)", clash);
            return TANDEM_EINVAL;
        }
        in->n_layers = in->model->n_layers;
        in->n_kv_heads = in->model->n_kv_heads;
        in->head_dim = in->model->head_dim;
    } else {
        const char *missing = !layers     ? "layers"
                              : !kv_heads ? "kv-heads"
                              : !head_dim ? "head-dim"
                                          : NULL;
        if (missing != NULL) {
            snprintf(err, errlen, "--%s is required without --model", missing);
            return TANDEM_EINVAL;
        }
        if (parse_dim("layers", layers, 4096, &in->n_layers, err, errlen) != 0 ||
            parse_dim("kv-heads", kv_heads, 4096, &in->n_kv_heads, err, errlen) != 0 ||
            parse_dim("head-dim", head_dim, 4096, &in->head_dim, err, errlen) != 0) {
            return TANDEM_EINVAL;
        }
    }
    if (gpu != NULL) {
        in->gpu = preset_gpu_find(gpu);
        if (in->gpu == NULL) {
            preset_gpu_names(names, sizeof(names));
            snprintf(err, errlen, "--gpu: unknown preset '%s' (one of: %s)", gpu, names);
            return TANDEM_EINVAL;
        }
    }
    if (contexts != NULL &&
        plan_parse_contexts(contexts, in->contexts, PLAN_MAX_ITEMS, &in->n_contexts) != 0) {
        snprintf(err, errlen,
                 "--contexts: '%s' is not a comma list of at most %d token counts in [1, %lld] "
                 "(e.g. 8192,128k)",
                 contexts, PLAN_MAX_ITEMS, (long long)PLAN_MAX_CONTEXT);
        return TANDEM_EINVAL;
    }
    if (reads != NULL && plan_parse_reads(reads, in->reads, PLAN_MAX_ITEMS, &in->n_reads) != 0) {
        snprintf(err, errlen,
                 "--reads: '%s' is not a comma list of at most %d batch:context pairs "
                 "(e.g. 1:8192,64:8k)",
                 reads, PLAN_MAX_ITEMS);
        return TANDEM_EINVAL;
    }
    return FLAGS_OK;
}

int plan_parse_args(struct plan_input *in, int argc, char **argv, int first, char *err,
                    size_t errlen)
{
    return parse_args(in, argc, argv, first, err, errlen, NULL);
}

int plan_compute(const struct plan_input *in, struct plan_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (in->n_layers < 1 || in->n_kv_heads < 1 || in->head_dim < 1 || in->tp < 1 ||
        (int)in->kv_dtype < 0 || in->kv_dtype >= KV_DTYPE_COUNT || in->n_contexts < 0 ||
        in->n_contexts > PLAN_MAX_ITEMS || in->n_reads < 0 || in->n_reads > PLAN_MAX_ITEMS) {
        snprintf(err, errlen, "the model shape needs --model or --layers, --kv-heads, --head-dim");
        return TANDEM_EINVAL;
    }
    uint64_t weights = in->weights_bytes;
    if (weights == 0 && in->model != NULL) {
        weights = preset_model_weight_bytes(in->model);
    }
    if (in->n_reads > 0 && weights == 0) {
        snprintf(err, errlen, "--reads needs the weight bytes: give --weights-bytes or --model");
        return TANDEM_EINVAL;
    }
    uint64_t kvbpt =
        plan_kv_bytes_per_token(in->n_layers, in->n_kv_heads, in->head_dim, in->kv_dtype);
    out->kv_bytes_per_token = kvbpt;
    out->weights_fit = -1;
    double hbm = 0;
    if (in->gpu != NULL) {
        hbm = in->gpu->hbm_bytes * in->tp * in->hbm_utilisation;
        out->weights_fit = weights > 0 ? (double)weights <= hbm : 1;
    }
    if (in->kv_budget > 0) {
        out->kv_budget = in->kv_budget;
        out->budget_source = PLAN_BUDGET_FLAG;
    } else if (in->gpu != NULL && weights > 0 && (double)weights < hbm) {
        out->kv_budget = (uint64_t)floor(hbm - (double)weights);
        out->budget_source = out->kv_budget > 0 ? PLAN_BUDGET_GPU : PLAN_BUDGET_NONE;
    }
    out->n_contexts = in->n_contexts;
    for (int i = 0; i < in->n_contexts; i++) {
        struct plan_context_row *c = &out->contexts[i];
        c->tokens = in->contexts[i];
        c->bytes_per_sequence = (uint64_t)c->tokens * kvbpt;
        c->sequences_fit = out->budget_source != PLAN_BUDGET_NONE
                               ? (int64_t)(out->kv_budget / c->bytes_per_sequence)
                               : -1;
    }
    out->n_reads = in->n_reads;
    for (int i = 0; i < in->n_reads; i++) {
        struct plan_read_row *r = &out->reads[i];
        r->batch = in->reads[i].batch;
        r->context = in->reads[i].context;
        r->bytes_per_token =
            (double)weights / (double)r->batch + (double)r->context * (double)kvbpt;
        r->bytes_per_step = (double)weights + (double)r->batch * (double)r->context * (double)kvbpt;
        r->step_seconds = -1;
        r->tokens_per_s = -1;
        if (in->gpu != NULL) {
            r->step_seconds = r->bytes_per_step / (in->gpu->hbm_bw * in->tp);
            r->tokens_per_s = (double)r->batch / r->step_seconds;
        }
    }
    return 0;
}

static uint64_t weights_of(const struct plan_input *in)
{
    if (in->weights_bytes == 0 && in->model != NULL) {
        return preset_model_weight_bytes(in->model);
    }
    return in->weights_bytes;
}

void plan_print_text(FILE *f, const struct plan_input *in, const struct plan_result *r)
{
    uint64_t weights = weights_of(in);
    fprintf(f, "model:         %s, %d layers, %d KV heads x %d, KV %s\n",
            in->model ? in->model->name : "custom", in->n_layers, in->n_kv_heads, in->head_dim,
            kv_dtype_name(in->kv_dtype));
    fprintf(f, "KV per token:  %llu B (%.1f KiB)\n", (unsigned long long)r->kv_bytes_per_token,
            (double)r->kv_bytes_per_token / 1024.0);
    if (weights > 0) {
        fprintf(f, "weights:       %llu B (%.1f GB)%s\n", (unsigned long long)weights,
                (double)weights / 1e9,
                in->weights_bytes == 0 ? ", BF16 from the preset's parameter count" : "");
    }
    if (in->gpu != NULL) {
        fprintf(f, "GPU:           %d x %s: %.0f GB HBM at %.2f TB/s in all; %s\n", in->tp,
                in->gpu->name, in->gpu->hbm_bytes * in->tp / 1e9, in->gpu->hbm_bw * in->tp / 1e12,
                r->weights_fit ? "weights fit" : "WEIGHTS DO NOT FIT");
    }
    if (r->budget_source != PLAN_BUDGET_NONE) {
        fprintf(f, "KV budget:     %llu B (%.1f GB)%s\n", (unsigned long long)r->kv_budget,
                (double)r->kv_budget / 1e9,
                r->budget_source == PLAN_BUDGET_GPU ? ", tp x HBM x hbm-util - weights" : "");
    }
    if (r->n_contexts > 0) {
        fprintf(f, "\n%10s %14s %12s\n", "context", "GB/sequence", "sequences");
        for (int i = 0; i < r->n_contexts; i++) {
            const struct plan_context_row *c = &r->contexts[i];
            char fit[32];
            if (c->sequences_fit >= 0) {
                snprintf(fit, sizeof(fit), "%lld", (long long)c->sequences_fit);
            } else {
                snprintf(fit, sizeof(fit), "-");
            }
            fprintf(f, "%10lld %14.1f %12s\n", (long long)c->tokens,
                    (double)c->bytes_per_sequence / 1e9, fit);
        }
    }
    if (r->n_reads > 0) {
        fprintf(f, "\n%8s %10s %18s %10s", "batch", "context", "bytes read/token", "GB/token");
        if (in->gpu != NULL) {
            fprintf(f, " %14s %12s", "step >= (ms)", "tokens/s <=");
        }
        fprintf(f, "\n");
        for (int i = 0; i < r->n_reads; i++) {
            const struct plan_read_row *d = &r->reads[i];
            fprintf(f, "%8lld %10lld %18.0f %10.2f", (long long)d->batch, (long long)d->context,
                    d->bytes_per_token, d->bytes_per_token / 1e9);
            if (in->gpu != NULL) {
                fprintf(f, " %14.3f %12.1f", d->step_seconds * 1e3, d->tokens_per_s);
            }
            fprintf(f, "\n");
        }
    }
}

/* json_object_set_new that remembers a failure. */
static void put(json_t *obj, const char *key, json_t *v, int *bad)
{
    if (v == NULL || json_object_set_new(obj, key, v) != 0) {
        *bad = 1;
    }
}

static void append(json_t *arr, json_t *v, int *bad)
{
    if (v == NULL || json_array_append_new(arr, v) != 0) {
        *bad = 1;
    }
}

int plan_print_json(FILE *f, const struct plan_input *in, const struct plan_result *r)
{
    int bad = 0;
    uint64_t weights = weights_of(in);
    json_t *root = json_object();
    if (root == NULL) {
        return TANDEM_ENOMEM;
    }
    put(root, "model", in->model ? json_string(in->model->name) : json_null(), &bad);
    put(root, "layers", json_integer(in->n_layers), &bad);
    put(root, "kv_heads", json_integer(in->n_kv_heads), &bad);
    put(root, "head_dim", json_integer(in->head_dim), &bad);
    put(root, "kv_dtype", json_string(kv_dtype_name(in->kv_dtype)), &bad);
    put(root, "kv_bytes_per_token", json_integer((json_int_t)r->kv_bytes_per_token), &bad);
    put(root, "kv_kib_per_token", json_real((double)r->kv_bytes_per_token / 1024.0), &bad);
    put(root, "weights_bytes", weights ? json_integer((json_int_t)weights) : json_null(), &bad);
    put(root, "kv_budget_bytes",
        r->budget_source != PLAN_BUDGET_NONE ? json_integer((json_int_t)r->kv_budget) : json_null(),
        &bad);
    static const char *const sources[] = {"none", "flag", "gpu"};
    put(root, "kv_budget_source", json_string(sources[r->budget_source]), &bad);
    if (in->gpu != NULL) {
        json_t *g = json_object();
        put(root, "gpu", g, &bad);
        if (g != NULL) {
            put(g, "name", json_string(in->gpu->name), &bad);
            put(g, "tp", json_integer(in->tp), &bad);
            put(g, "hbm_bytes", json_real(in->gpu->hbm_bytes * in->tp), &bad);
            put(g, "hbm_bytes_per_s", json_real(in->gpu->hbm_bw * in->tp), &bad);
            put(g, "hbm_utilisation", json_real(in->hbm_utilisation), &bad);
            put(g, "weights_fit", json_boolean(r->weights_fit), &bad);
        }
    } else {
        put(root, "gpu", json_null(), &bad);
    }
    json_t *cs = json_array();
    put(root, "contexts", cs, &bad);
    for (int i = 0; cs != NULL && i < r->n_contexts; i++) {
        const struct plan_context_row *c = &r->contexts[i];
        json_t *o = json_object();
        append(cs, o, &bad);
        if (o == NULL) {
            break;
        }
        put(o, "tokens", json_integer(c->tokens), &bad);
        put(o, "bytes_per_sequence", json_integer((json_int_t)c->bytes_per_sequence), &bad);
        put(o, "gb_per_sequence", json_real((double)c->bytes_per_sequence / 1e9), &bad);
        put(o, "sequences_fit",
            c->sequences_fit >= 0 ? json_integer(c->sequences_fit) : json_null(), &bad);
    }
    json_t *rs = json_array();
    put(root, "reads", rs, &bad);
    for (int i = 0; rs != NULL && i < r->n_reads; i++) {
        const struct plan_read_row *d = &r->reads[i];
        json_t *o = json_object();
        append(rs, o, &bad);
        if (o == NULL) {
            break;
        }
        put(o, "batch", json_integer(d->batch), &bad);
        put(o, "context", json_integer(d->context), &bad);
        put(o, "bytes_per_token", json_real(d->bytes_per_token), &bad);
        put(o, "bytes_per_step", json_real(d->bytes_per_step), &bad);
        put(o, "step_seconds_min", d->step_seconds >= 0 ? json_real(d->step_seconds) : json_null(),
            &bad);
        put(o, "tokens_per_s_max", d->tokens_per_s >= 0 ? json_real(d->tokens_per_s) : json_null(),
            &bad);
    }
    int rc = 0;
    if (bad) {
        rc = TANDEM_ENOMEM;
    } else if (json_dumpf(root, f, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) != 0 ||
               fputc('\n', f) == EOF) {
        rc = TANDEM_EIO;
    }
    json_decref(root);
    return rc;
}

int plan_main(int argc, char **argv)
{
    struct plan_input in;
    struct plan_result res;
    char err[512] = "";
    plan_input_init(&in);
    int rc = parse_args(&in, argc, argv, 1, err, sizeof(err), stdout);
    if (rc == FLAGS_HELP) {
        return 0;
    }
    if (rc == FLAGS_VERSION) {
        printf("tandem %s\n", TANDEM_VERSION);
        return 0;
    }
    if (rc == FLAGS_OK) {
        rc = plan_compute(&in, &res, err, sizeof(err));
    }
    if (rc != 0) {
        fprintf(stderr, "tandem plan: %s\n", err);
        return 2;
    }
    if (in.json) {
        rc = plan_print_json(stdout, &in, &res);
    } else {
        plan_print_text(stdout, &in, &res);
    }
    if (rc != 0 || fflush(stdout) != 0) {
        fprintf(stderr, "tandem plan: cannot write the output: %s\n",
                tandem_strerror(rc ? rc : TANDEM_EIO));
        return 1;
    }
    return 0;
}
