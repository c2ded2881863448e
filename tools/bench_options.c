/* `tandem bench`'s flags: parsing into struct bench_options. See
 * bench_options.h. */
#include "bench_options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "tandem_err.h"
#include "timeline.h"

static const char *const history_choices[] = {"response", "synthetic", NULL};

/* A positive number or "inf". */
static int parse_rate(const char *flag, const char *s, double *out, char *err, size_t errlen)
{
    if (strcmp(s, "inf") == 0 || strcmp(s, "Infinity") == 0 || strcmp(s, "infinity") == 0) {
        *out = INFINITY;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !(v > 0) || !isfinite(v)) {
        snprintf(err, errlen, "--%s: '%s' is not a positive number or inf", flag, s);
        return TANDEM_EINVAL;
    }
    *out = v;
    return 0;
}

/* Moves every value of --goodput (vLLM takes several, space-separated) into
 * o->goodput (comma-separated) and builds the argv flags_parse sees: the
 * --goodput flags and their values removed. Also notes an explicit
 * --num-prompts. */
static int prescan(struct bench_options *o, int argc, char **argv, int first, char **out, int *outc,
                   int *num_prompts_set, int *goodput_seen, char *err, size_t errlen)
{
    int n = 0;
    size_t glen = 0;
    int i = first;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            break;
        }
        if (strcmp(a, "--num-prompts") == 0 || strncmp(a, "--num-prompts=", 14) == 0) {
            *num_prompts_set = 1;
        }
        int is_goodput = strcmp(a, "--goodput") == 0;
        if (is_goodput || strncmp(a, "--goodput=", 10) == 0) {
            *goodput_seen = 1;
            int got = 0;
            if (!is_goodput) {
                const char *v = a + 10;
                size_t l = strlen(v);
                if (glen + l + 2 > sizeof(o->goodput)) {
                    snprintf(err, errlen, "--goodput: too long");
                    return TANDEM_EINVAL;
                }
                o->goodput[glen++] = ',';
                memcpy(o->goodput + glen, v, l + 1);
                glen += l;
                got = 1;
            }
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 && strchr(argv[i + 1], ':')) {
                const char *v = argv[++i];
                size_t l = strlen(v);
                if (glen + l + 2 > sizeof(o->goodput)) {
                    snprintf(err, errlen, "--goodput: too long");
                    return TANDEM_EINVAL;
                }
                o->goodput[glen++] = ',';
                memcpy(o->goodput + glen, v, l + 1);
                glen += l;
                got = 1;
            }
            if (!got) {
                snprintf(err, errlen, "--goodput needs KEY:MS values (ttft, tpot, e2el)");
                return TANDEM_EINVAL;
            }
            continue;
        }
        out[n++] = argv[i];
    }
    for (; i < argc; i++) {
        out[n++] = argv[i];
    }
    *outc = n;
    return 0;
}

/* Writes the paragraph text into out (cap bytes) with its spaces turned into
 * line breaks where a line would pass width columns. */
static void wrap(char *out, size_t cap, const char *text, size_t width)
{
    size_t len = 0, col = 0;
    out[0] = '\0';
    while (*text != '\0' && len + 1 < cap) {
        size_t n = strcspn(text, " ");
        const char *sep = col == 0 ? "" : col + 1 + n > width ? "\n" : " ";
        col = col == 0 || *sep == '\n' ? n : col + 1 + n;
        int w = snprintf(out + len, cap - len, "%s%.*s", sep, (int)n, text);
        len += w > 0 ? (size_t)w : 0;
        text += n + (text[n] == ' ');
    }
}

static void usage(FILE *f, const struct flag *flags, size_t n)
{
    char names[256], para[1024], lines[1024], text[2048];
    snprintf(para, sizeof(para),
             "Load generator for Tandem's router or any OpenAI-compatible server (vLLM, SGLang). "
             "Sends --num-prompts requests (or for --duration seconds) at --request-rate "
             "(Poisson, or gamma with --burstiness; inf = all at once), at most "
             "--max-concurrency at a time, streams every response, and prints the result in the "
             "layout of `vllm bench serve`. Datasets: %s. See docs/bench.md.",
             lg_dataset_names(names, sizeof(names)));
    wrap(lines, sizeof(lines), para, 78);
    snprintf(text, sizeof(text),
             "tandem bench [flags]\n\n%s\n"
             "--goodput takes several KEY:MS values: --goodput ttft:500 tpot:50 e2el:10000.\n"
             "tandem bench --experiment FILE [--out DIR] runs a matrix of clusters x routings\n"
             "x rates from an experiment file instead (docs/experiments.md; --experiment\n"
             "FILE --help lists its flags).\n"
             "Environment: OPENAI_API_KEY (sent as a bearer token when set).",
             lines);
    flags_usage(f, text, flags, n);
}

int bench_parse_args(struct bench_options *o, int argc, char **argv, int first, int progress_tty,
                     FILE *help_out, char *err, size_t errlen)
{
    memset(o, 0, sizeof(*o));
    lg_run_config_default(&o->run);
    o->timeline_ms = TL_DEFAULT_MS;
    struct lg_run_config *rc_ = &o->run;
    struct lg_workload_config *w = &rc_->workload;
    const char *base_url = NULL, *url = NULL, *host = "127.0.0.1", *endpoint = NULL;
    const char *endpoint_type = NULL, *backend = NULL, *model = NULL;
    const char *dataset = "random", *dataset_path = NULL, *rate = "inf", *burstiness = "1";
    const char *goodput_flag = NULL, *pmetrics = "ttft,tpot,itl,e2el", *pcts = "50,90,99";
    const char *temperature = NULL, *extra_body = NULL, *id_range = "35:130";
    int port = 8000, num_prompts = 1000, seed = 0, history = 0;
    int progress = 0, disable_progress = 0, disable_tqdm = 0;
    double duration = 0;
    char names[256]; /* the dataset names, for --dataset-name's help and errors */
    const struct flag flags[] = {
        /* target */
        {"base-url", FLAG_STR, &base_url, "server base URL, http://host:port[/prefix]", 0, 0, NULL},
        {"url", FLAG_STR, &url, "same as --base-url", 0, 0, NULL},
        {"host", FLAG_STR, &host, "server host (without --base-url)", 0, 0, NULL},
        {"port", FLAG_INT, &port, "server port (without --base-url)", 1, 65535, NULL},
        {"endpoint", FLAG_STR, &endpoint,
         "request path (none: /v1/completions, or /v1/chat/completions for chat)", 0, 0, NULL},
        {"endpoint-type", FLAG_STR, &endpoint_type,
         "completions or chat (default: from --endpoint; chat for multi-turn)", 0, 0, NULL},
        {"backend", FLAG_STR, &backend,
         "vLLM's name for it: openai, vllm (completions), "
         "openai-chat (chat)",
         0, 0, NULL},
        {"model", FLAG_STR, &model, "model name to send (default: first of GET /v1/models)", 0, 0,
         NULL},
        /* load */
        {"num-prompts", FLAG_INT, &num_prompts,
         "measured requests (with --duration: a cap only when given)", 1, 1e9, NULL},
        {"duration", FLAG_DOUBLE, &duration,
         "seconds to send requests for, then let those in flight finish (0: off)", 0, 1e7, NULL},
        {"request-rate", FLAG_STR, &rate,
         "requests per second (multi-turn: sessions), or inf for all at once", 0, 0, NULL},
        {"burstiness", FLAG_STR, &burstiness,
         "gamma shape of the gaps: 1 Poisson, <1 bursty, >1 even, inf constant", 0, 0, NULL},
        {"normalize-arrivals", FLAG_BOOL, &rc_->normalize_arrivals,
         "rescale arrivals so the last is at num-prompts/rate, as vLLM", 0, 0, NULL},
        {"max-concurrency", FLAG_INT, &rc_->max_concurrency,
         "most requests in flight (0: unlimited; with rate inf: closed loop)", 0, 1e7, NULL},
        {"num-warmups", FLAG_INT, &rc_->num_warmups,
         "warm-up requests before the measured run (not recorded)", 0, 1e7, NULL},
        {"seed", FLAG_INT, &seed, "seed for the workload and arrival times", 0, 2147483647.0, NULL},
        {"request-timeout", FLAG_DOUBLE, &rc_->request_timeout_s,
         "seconds before a request is failed as timed out", 0.001, 1e7, NULL},
        /* request */
        {"ignore-eos", FLAG_BOOL, &rc_->ignore_eos,
         "send \"ignore_eos\": true so outputs reach max_tokens", 0, 0, NULL},
        {"temperature", FLAG_STR, &temperature, "sampling temperature (default: not sent)", 0, 0,
         NULL},
        {"extra-body", FLAG_STR, &extra_body, "JSON object merged into every request body", 0, 0,
         NULL},
        {"prompt-token-ids", FLAG_BOOL, &w->token_ids,
         "send prompts as token id arrays (completions): exact lengths on any server", 0, 0, NULL},
        {"token-id-range", FLAG_STR, &id_range,
         "LO:HI, token ids are drawn from [LO, HI) (default: printable bytes on Tandem)", 0, 0,
         NULL},
        /* workload */
        {"dataset-name", FLAG_STR, &dataset, lg_dataset_names(names, sizeof(names)), 0, 0, NULL},
        {"dataset-path", FLAG_STR, &dataset_path, "JSONL trace for --dataset-name trace", 0, 0,
         NULL},
        {"random-input-len", FLAG_INT, &w->random_input_len, "random: prompt tokens", 0, 1e8, NULL},
        {"random-output-len", FLAG_INT, &w->random_output_len, "random: output tokens", 1, 1e8,
         NULL},
        {"random-range-ratio", FLAG_DOUBLE, &w->random_range_ratio,
         "random: lengths uniform in [L(1-r), L(1+r)]", 0, 0.999999, NULL},
        {"random-prefix-len", FLAG_INT, &w->random_prefix_len,
         "random: tokens of a prefix shared by all prompts", 0, 1e8, NULL},
        {"gsp-num-groups", FLAG_INT, &w->gsp_num_groups, "shared-prefix: groups", 1, 1e7, NULL},
        {"gsp-prompts-per-group", FLAG_INT, &w->gsp_prompts_per_group,
         "shared-prefix: prompts per group", 1, 1e7, NULL},
        {"gsp-system-prompt-len", FLAG_INT, &w->gsp_system_prompt_len,
         "shared-prefix: tokens of each group's system prompt", 0, 1e8, NULL},
        {"gsp-question-len", FLAG_INT, &w->gsp_question_len,
         "shared-prefix: tokens of each question", 0, 1e8, NULL},
        {"gsp-output-len", FLAG_INT, &w->gsp_output_len, "shared-prefix: output tokens", 1, 1e8,
         NULL},
        {"multi-turn-turns", FLAG_INT, &w->mt_turns, "multi-turn: turns per session", 1, 10000,
         NULL},
        {"multi-turn-system-len", FLAG_INT, &w->mt_system_len,
         "multi-turn: tokens of the system prompt", 0, 1e8, NULL},
        {"multi-turn-input-len", FLAG_INT, &w->mt_input_len,
         "multi-turn: tokens of each user message", 1, 1e8, NULL},
        {"multi-turn-output-len", FLAG_INT, &w->mt_output_len, "multi-turn: output tokens per turn",
         1, 1e8, NULL},
        {"multi-turn-think-time", FLAG_DOUBLE, &rc_->think_time_s,
         "multi-turn: seconds between a reply and the next turn", 0, 1e6, NULL},
        {"multi-turn-history", FLAG_CHOICE, &history,
         "multi-turn: assistant messages are the replies, or synthetic text", 0, 0,
         history_choices},
        {"long-fraction", FLAG_DOUBLE, &w->long_fraction,
         "long-short: probability that a request is long", 0, 1, NULL},
        {"long-input-len", FLAG_INT, &w->long_input_len, "long-short: long prompt tokens", 1, 1e8,
         NULL},
        {"long-output-len", FLAG_INT, &w->long_output_len, "long-short: long output tokens", 1, 1e8,
         NULL},
        {"short-input-len", FLAG_INT, &w->short_input_len, "long-short: short prompt tokens", 1,
         1e8, NULL},
        {"short-output-len", FLAG_INT, &w->short_output_len, "long-short: short output tokens", 1,
         1e8, NULL},
        {"sharegpt-output-len", FLAG_INT, &w->sharegpt_output_len,
         "sharegpt-synth: fixed output tokens (0: sampled)", 0, 1e8, NULL},
        {"sharegpt-input-mean", FLAG_DOUBLE, &w->sharegpt_input_mean,
         "sharegpt-synth: mean prompt tokens of the lognormal", 1e-9, 1e8, NULL},
        {"sharegpt-input-median", FLAG_DOUBLE, &w->sharegpt_input_median,
         "sharegpt-synth: median prompt tokens (0: sigma 1.0)", 0, 1e8, NULL},
        {"sharegpt-output-mean", FLAG_DOUBLE, &w->sharegpt_output_mean,
         "sharegpt-synth: mean output tokens of the lognormal", 1e-9, 1e8, NULL},
        {"sharegpt-output-median", FLAG_DOUBLE, &w->sharegpt_output_median,
         "sharegpt-synth: median output tokens (0: sigma 0.8)", 0, 1e8, NULL},
        {"sharegpt-max-input", FLAG_INT, &w->sharegpt_max_input,
         "sharegpt-synth: longer prompts are drawn again", 4, 1e8, NULL},
        {"sharegpt-max-total", FLAG_INT, &w->sharegpt_max_total,
         "sharegpt-synth: prompt + output above this is drawn again", 8, 1e8, NULL},
        {"trace-time-scale", FLAG_DOUBLE, &w->trace_time_scale,
         "trace: multiply timestamps (0.001 for ms traces)", 1e-9, 1e9, NULL},
        {"trace-timestamps", FLAG_BOOL, &rc_->trace_timestamps,
         "trace: use its timestamps (false: --request-rate)", 0, 0, NULL},
        {"trace-block-size", FLAG_INT, &w->trace_block_size, "trace: tokens per hash_ids entry", 1,
         1e7, NULL},
        /* results */
        {"percentile-metrics", FLAG_STR, &pmetrics,
         "metrics with percentiles: ttft,tpot,itl,e2el,client_queue_time", 0, 0, NULL},
        {"metric-percentiles", FLAG_STR, &pcts, "percentiles to report, comma-separated", 0, 0,
         NULL},
        {"goodput", FLAG_STR, &goodput_flag,
         "SLOs KEY:MS (ttft, tpot, e2el); a request is good when all hold", 0, 0, NULL},
        {"json", FLAG_STR, &o->json_path, "write the summary as JSON to FILE (- for stdout)", 0, 0,
         NULL},
        {"save-result", FLAG_BOOL, &o->save_result, "write the JSON summary under vLLM's file name",
         0, 0, NULL},
        {"result-dir", FLAG_STR, &o->result_dir, "directory for --save-result", 0, 0, NULL},
        {"result-filename", FLAG_STR, &o->result_filename, "file name for --save-result", 0, 0,
         NULL},
        {"label", FLAG_STR, &o->label, "label in the JSON and the result file name", 0, 0, NULL},
        {"save-requests", FLAG_STR, &o->save_requests,
         "write one record per request to FILE.csv or FILE.jsonl", 0, 0, NULL},
        {"timeline", FLAG_STR, &o->timeline_dir,
         "write per-worker queue, running, KV usage and picks/s over time to DIR "
         "(timeline.csv, timeline.svg)",
         0, 0, NULL},
        {"timeline-ms", FLAG_INT, &o->timeline_ms, "period of --timeline samples (ms)", 10, 60000,
         NULL},
        {"progress", FLAG_BOOL, &progress, "show the progress line even when stderr is no TTY", 0,
         0, NULL},
        {"disable-progress", FLAG_BOOL, &disable_progress, "never show the progress line", 0, 0,
         NULL},
        {"disable-tqdm", FLAG_BOOL, &disable_tqdm, "same as --disable-progress (vLLM's name)", 0, 0,
         NULL},
    };
    int num_prompts_set = 0, goodput_seen = 0;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    if (args == NULL) {
        snprintf(err, errlen, "out of memory");
        return TANDEM_EINVAL;
    }
    int nargs = 0;
    int rc =
        prescan(o, argc, argv, first, args, &nargs, &num_prompts_set, &goodput_seen, err, errlen);
    if (rc == 0) {
        rc = flags_parse(flags, FLAGS_COUNT(flags), nargs, args, 0, NULL, err, errlen);
    }
    free(args);
    if (rc == FLAGS_HELP && help_out != NULL) {
        usage(help_out, flags, FLAGS_COUNT(flags));
    }
    if (rc != FLAGS_OK) {
        return rc;
    }
    (void)goodput_flag; /* only for --help: prescan took the values */

    /* target */
    const char *bu = base_url ? base_url : url;
    char prefix[256] = "";
    if (bu != NULL) {
        if (lg_parse_url(bu, o->host, sizeof(o->host), &port, prefix, sizeof(prefix)) != 0) {
            snprintf(err, errlen,
                     "--base-url: '%s' is not http://host[:port][/prefix] (https is not "
                     "supported)",
                     bu);
            return TANDEM_EINVAL;
        }
    } else {
        snprintf(o->host, sizeof(o->host), "%s", host);
    }
    if (strchr(o->host, ':') != NULL) {
        snprintf(o->base_url, sizeof(o->base_url), "http://[%s]:%d%s", o->host, port, prefix);
    } else {
        snprintf(o->base_url, sizeof(o->base_url), "http://%s:%d%s", o->host, port, prefix);
    }
    if (lg_dataset_parse(dataset, &w->dataset) != 0) {
        snprintf(err, errlen, "--dataset-name: '%s' is not one of %s", dataset,
                 lg_dataset_names(names, sizeof(names)));
        return TANDEM_EINVAL;
    }
    int api = -1;
    if (endpoint_type != NULL) {
        if (strcmp(endpoint_type, "completions") == 0) {
            api = LG_API_COMPLETIONS;
        } else if (strcmp(endpoint_type, "chat") == 0) {
            api = LG_API_CHAT;
        } else {
            snprintf(err, errlen, "--endpoint-type: '%s' is not completions or chat",
                     endpoint_type);
            return TANDEM_EINVAL;
        }
    }
    if (backend != NULL && api < 0) {
        if (strcmp(backend, "openai") == 0 || strcmp(backend, "vllm") == 0) {
            api = LG_API_COMPLETIONS;
        } else if (strcmp(backend, "openai-chat") == 0) {
            api = LG_API_CHAT;
        } else {
            snprintf(err, errlen, "--backend: '%s' is not openai, vllm or openai-chat", backend);
            return TANDEM_EINVAL;
        }
    }
    if (endpoint != NULL && endpoint[0] != '/') {
        snprintf(err, errlen, "--endpoint: '%s' must start with /", endpoint);
        return TANDEM_EINVAL;
    }
    if (api < 0 && endpoint != NULL) {
        size_t l = strlen(endpoint);
        api = l >= 16 && strcmp(endpoint + l - 16, "chat/completions") == 0 ? LG_API_CHAT
                                                                            : LG_API_COMPLETIONS;
    }
    if (api < 0) {
        api = w->dataset == LG_DATASET_MULTI_TURN ? LG_API_CHAT : LG_API_COMPLETIONS;
    }
    w->api = (enum lg_api)api;
    if (endpoint == NULL) {
        endpoint = api == LG_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
    }
    snprintf(o->path, sizeof(o->path), "%s%s", prefix, endpoint);
    snprintf(o->models_path, sizeof(o->models_path), "%s/v1/models", prefix);
    o->backend = api == LG_API_CHAT ? "openai-chat" : "openai";
    rc_->host = o->host;
    rc_->port = port;
    rc_->path = o->path;
    rc_->models_path = o->models_path;
    rc_->model = model;
    rc_->api_key = getenv("OPENAI_API_KEY");

    /* load */
    if (parse_rate("request-rate", rate, &rc_->request_rate, err, errlen) != 0 ||
        parse_rate("burstiness", burstiness, &rc_->burstiness, err, errlen) != 0) {
        return TANDEM_EINVAL;
    }
    rc_->duration_s = duration;
    rc_->num_prompts = num_prompts;
    if (!num_prompts_set && (duration > 0 || w->dataset == LG_DATASET_TRACE)) {
        rc_->num_prompts = -1; /* until the duration ends / the whole trace */
    }
    if (duration > 0 && isinf(rc_->request_rate) && rc_->max_concurrency == 0 &&
        rc_->num_prompts < 0) {
        snprintf(err, errlen,
                 "--duration with --request-rate inf needs --max-concurrency (a "
                 "closed loop) or --num-prompts");
        return TANDEM_EINVAL;
    }
    w->seed = (uint64_t)seed;
    w->trace_path = dataset_path;
    w->mt_history = (enum lg_history)history;
    if (dataset_path != NULL && w->dataset != LG_DATASET_TRACE) {
        snprintf(err, errlen, "--dataset-path is only for --dataset-name trace");
        return TANDEM_EINVAL;
    }
    if (w->dataset == LG_DATASET_TRACE && dataset_path == NULL) {
        snprintf(err, errlen, "--dataset-name trace needs --dataset-path FILE.jsonl");
        return TANDEM_EINVAL;
    }
    if (w->token_ids && api == LG_API_CHAT) {
        snprintf(err, errlen, "--prompt-token-ids needs the completions endpoint");
        return TANDEM_EINVAL;
    }
    {
        char *end;
        long lo = strtol(id_range, &end, 10);
        long hi = *end == ':' ? strtol(end + 1, &end, 10) : -1;
        if (*end != '\0' || lo < 0 || hi <= lo || hi > 2147483647L) {
            snprintf(err, errlen, "--token-id-range: '%s' is not LO:HI with 0 <= LO < HI",
                     id_range);
            return TANDEM_EINVAL;
        }
        w->id_lo = (int32_t)lo;
        w->id_hi = (int32_t)hi;
    }
    if (temperature != NULL) {
        char *end;
        errno = 0;
        rc_->temperature = strtod(temperature, &end);
        if (end == temperature || *end != '\0' || errno != 0 || !(rc_->temperature >= 0)) {
            snprintf(err, errlen, "--temperature: '%s' is not a number >= 0", temperature);
            return TANDEM_EINVAL;
        }
    }
    if (extra_body != NULL) {
        json_error_t jerr;
        o->extra_body = json_loads(extra_body, 0, &jerr);
        if (!json_is_object(o->extra_body)) {
            snprintf(err, errlen, "--extra-body: not a JSON object (%s)",
                     o->extra_body ? "wrong type" : jerr.text);
            return TANDEM_EINVAL;
        }
        rc_->extra_body = o->extra_body;
    }

    /* results */
    if (lg_parse_metrics(pmetrics, &o->metrics) != 0) {
        snprintf(err, errlen,
                 "--percentile-metrics: '%s' is not a comma list of ttft, tpot, itl, e2el, "
                 "client_queue_time",
                 pmetrics);
        return TANDEM_EINVAL;
    }
    if (lg_parse_percentiles(pcts, &o->summary) != 0) {
        snprintf(err, errlen,
                 "--metric-percentiles: '%s' is not a comma list of at most %d numbers in "
                 "[0, 100]",
                 pcts, LG_MAX_PERCENTILES);
        return TANDEM_EINVAL;
    }
    lg_slo_clear(&o->summary.slo);
    if (goodput_seen && lg_parse_goodput(o->goodput, &o->summary.slo) != 0) {
        snprintf(err, errlen,
                 "--goodput: '%s' is not KEY:MS pairs with KEY ttft, tpot or e2el and MS >= 0",
                 o->goodput + 1);
        return TANDEM_EINVAL;
    }
    enum lg_requests_format fmt;
    if (o->save_requests != NULL && lg_requests_format(o->save_requests, &fmt) != 0) {
        snprintf(err, errlen, "--save-requests: '%s' must end in .csv or .jsonl", o->save_requests);
        return TANDEM_EINVAL;
    }
    o->progress = !disable_progress && !disable_tqdm && (progress || progress_tty);
    rc_->progress = o->progress;
    return FLAGS_OK;
}

void bench_options_fini(struct bench_options *o)
{
    json_decref(o->extra_body);
    o->extra_body = NULL;
}
