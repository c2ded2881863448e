/* Writes the binary seed corpora of fuzz/corpus/: one valid input per
 * message kind for wire/ and kvframe/, small llama2.c checkpoints for
 * checkpoint/, tokenizer.bin files for tokenizer/ and the embedded default
 * cluster for cluster_yaml/. The other text seeds (HTTP requests, JSON
 * bodies, YAML files) are written by hand or copied from deploy/routing/.
 *
 *   build-fuzz/fuzz/fuzz_seeds fuzz/corpus
 *
 * Run it again when a format changes; the output is the same on every run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "tandem_err.h"
#include "tiny.h"
#include "wire.h"

static int write_file(const char *dir, const char *sub, const char *name, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "fuzz_seeds: cannot write %s\n", path);
        return TANDEM_EIO;
    }
    return 0;
}

static uint32_t prompt[24] = {1,  72, 101, 108, 108, 111, 32,  119, 111, 114, 108, 100,
                              33, 10, 3,   258, 100, 200, 300, 400, 500, 7,   8,   9};
static uint32_t stop_ids[2] = {2, 13};
static uint32_t gen[3] = {44, 45, 46};
static uint32_t top_ids[2][3] = {{5, 6, 7}, {8, 9, 10}};
static float top_lp[2][3] = {{-0.1f, -2.0f, -3.5f}, {-0.5f, -1.0f, -INFINITY}};
static float chunk_lp[2] = {-0.1f, -0.5f};
static uint64_t hashes[3] = {0x0123456789abcdefull, 0xfedcba9876543210ull, 1};

static int write_wire(const char *dir)
{
    Tandem__SamplingParams sp;
    tandem__sampling_params__init(&sp);
    sp.temperature = 0.7f;
    sp.top_p = 0.9f;
    sp.top_k = 40;
    sp.optional_seed_case = TANDEM__SAMPLING_PARAMS__OPTIONAL_SEED_SEED;
    sp.seed = 42;
    sp.n_stop_token_ids = 2;
    sp.stop_token_ids = stop_ids;
    sp.logprobs = 2;
    sp.prompt_logprobs = 1;

    Tandem__WorkerHello hello;
    tandem__worker_hello__init(&hello);
    hello.worker_id = "decode-0";
    hello.role = TANDEM__WORKER_HELLO__ROLE__DECODE;
    hello.control_address = "tcp://127.0.0.1:7001";
    hello.kv_address = "tcp://127.0.0.1:7002";
    hello.metrics_address = "127.0.0.1:9101";
    hello.model = "tiny";
    hello.block_size = 16;
    hello.kv_dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    hello.kv_blocks_total = 256;
    hello.max_running_seqs = 16;
    hello.max_context = 4096;
    hello.incarnation = 1764400000123ull;

    Tandem__Heartbeat hb;
    tandem__heartbeat__init(&hb);
    hb.worker_id = "prefill-0";
    hb.waiting = 1;
    hb.running = 2;
    hb.prefill_tokens_queued = 300;
    hb.kv_blocks_used = 10;
    hb.kv_blocks_total = 256;
    hb.kv_blocks_cached_idle = 5;
    hb.timestamp_ms = 1764400000456ull;
    hb.prefix_cache_queries = 640;
    hb.prefix_cache_hits = 320;
    hb.kv_bytes_sent = 131072;
    hb.kv_bytes_received = 65536;

    Tandem__DecodeJob dj;
    tandem__decode_job__init(&dj);
    dj.n_prompt_token_ids = 24;
    dj.prompt_token_ids = prompt;
    dj.max_tokens = 16;
    dj.sampling = &sp;
    dj.prefill_address = "ipc:///tmp/tandem-p0.kv";
    dj.n_generated_token_ids = 3;
    dj.generated_token_ids = gen;

    Tandem__PrefillJob pj;
    tandem__prefill_job__init(&pj);
    pj.n_prompt_token_ids = 24;
    pj.prompt_token_ids = prompt;
    pj.skip_blocks = 1;
    pj.decode_kv_address = "ipc:///tmp/tandem-d0.kv";
    pj.sampling = &sp;

    Tandem__TopLogprobs top[2], *top_ptrs[2];
    for (int i = 0; i < 2; i++) {
        tandem__top_logprobs__init(&top[i]);
        top[i].n_token_ids = 3;
        top[i].token_ids = top_ids[i];
        top[i].n_logprobs = 3;
        top[i].logprobs = top_lp[i];
        top_ptrs[i] = &top[i];
    }
    Tandem__PrefillDone pd;
    tandem__prefill_done__init(&pd);
    pd.first_token = 77;
    pd.first_logprob = -0.25f;
    pd.first_top_logprobs = &top[0];
    pd.blocks_sent = 1;
    pd.cached_tokens = 16;

    Tandem__TokenChunk tc;
    tandem__token_chunk__init(&tc);
    tc.first_index = 0;
    tc.n_token_ids = 2;
    tc.token_ids = gen;
    tc.n_logprobs = 2;
    tc.logprobs = chunk_lp;
    tc.n_top_logprobs = 2;
    tc.top_logprobs = top_ptrs;

    Tandem__PromptLogprobs pl;
    tandem__prompt_logprobs__init(&pl);
    pl.first_index = 1;
    pl.n_logprobs = 2;
    pl.logprobs = chunk_lp;
    pl.n_top_logprobs = 2;
    pl.top_logprobs = top_ptrs;

    Tandem__Usage usage;
    tandem__usage__init(&usage);
    usage.prompt_tokens = 24;
    usage.completion_tokens = 3;
    usage.cached_tokens = 16;
    Tandem__Finish fin;
    tandem__finish__init(&fin);
    fin.reason = TANDEM__FINISH__REASON__LENGTH;
    fin.usage = &usage;

    Tandem__Cancel cancel;
    tandem__cancel__init(&cancel);
    Tandem__Error error;
    tandem__error__init(&error);
    error.code = TANDEM_ENOSPACE;
    error.message = "no free KV blocks";

    Tandem__KvEvent ev[3], *ev_ptrs[3];
    for (int i = 0; i < 3; i++) {
        tandem__kv_event__init(&ev[i]);
        ev_ptrs[i] = &ev[i];
    }
    ev[0].kind = TANDEM__KV_EVENT__KIND__STORED;
    ev[0].n_block_hashes = 2;
    ev[0].block_hashes = hashes;
    ev[0].optional_parent_case = TANDEM__KV_EVENT__OPTIONAL_PARENT_PARENT_HASH;
    ev[0].parent_hash = 0x1111222233334444ull;
    ev[1].kind = TANDEM__KV_EVENT__KIND__REMOVED;
    ev[1].n_block_hashes = 1;
    ev[1].block_hashes = hashes + 2;
    ev[2].kind = TANDEM__KV_EVENT__KIND__ALL_CLEARED;
    Tandem__KvEvents kve;
    tandem__kv_events__init(&kve);
    kve.worker_id = "decode-0";
    kve.seq = 7;
    kve.n_events = 3;
    kve.events = ev_ptrs;

    Tandem__Busy busy;
    tandem__busy__init(&busy);
    busy.reason = TANDEM__BUSY__REASON__TOO_MANY_SEQS;
    busy.detail = "16 running";

    struct {
        const char *name;
        Tandem__Envelope__Kind kind;
        uint64_t rid;
        void *body;
    } seeds[] = {
        {"hello", TANDEM__ENVELOPE__KIND__HELLO, 0, &hello},
        {"heartbeat", TANDEM__ENVELOPE__KIND__HEARTBEAT, 0, &hb},
        {"decode_job", TANDEM__ENVELOPE__KIND__DECODE_JOB, 11, &dj},
        {"prefill_job", TANDEM__ENVELOPE__KIND__PREFILL_JOB, 12, &pj},
        {"prefill_done", TANDEM__ENVELOPE__KIND__PREFILL_DONE, 12, &pd},
        {"token_chunk", TANDEM__ENVELOPE__KIND__TOKEN_CHUNK, 11, &tc},
        {"prompt_logprobs", TANDEM__ENVELOPE__KIND__PROMPT_LOGPROBS, 11, &pl},
        {"finish", TANDEM__ENVELOPE__KIND__FINISH, 11, &fin},
        {"cancel", TANDEM__ENVELOPE__KIND__CANCEL, 11, &cancel},
        {"error", TANDEM__ENVELOPE__KIND__ERROR, 11, &error},
        {"kv_events", TANDEM__ENVELOPE__KIND__KV_EVENTS, 0, &kve},
        {"busy", TANDEM__ENVELOPE__KIND__BUSY, 11, &busy},
    };
    uint8_t buf[4096];
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        Tandem__Envelope env;
        size_t len;
        int rc = wire_env_init(&env, seeds[i].kind, seeds[i].rid, seeds[i].body);
        if (rc == 0)
            rc = wire_pack(&env, buf, sizeof buf, &len);
        if (rc == 0)
            rc = write_file(dir, "wire", seeds[i].name, buf, len);
        /* The same envelope framed for the data link (PrefillDone travels
         * there; the rest exercise the framing). */
        if (rc == 0)
            rc = wire_frame_pack(&env, NULL, 0, buf, sizeof buf, &len);
        if (rc == 0)
            rc = write_file(dir, "kvframe", seeds[i].name, buf, len);
        if (rc != 0) {
            fprintf(stderr, "fuzz_seeds: %s: %s (%s)\n", seeds[i].name, tandem_strerror(rc),
                    wire_error_detail());
            return rc;
        }
    }

    /* A worker's loop turn as one control message: chunk, finish, events. */
    {
        static uint8_t items[3][1024];
        ProtobufCBinaryData bin[3];
        const size_t pick[3] = {5, 7, 10}; /* token_chunk, finish, kv_events */
        int rc = 0;
        for (int k = 0; k < 3 && rc == 0; k++) {
            Tandem__Envelope env;
            rc = wire_env_init(&env, seeds[pick[k]].kind, seeds[pick[k]].rid, seeds[pick[k]].body);
            if (rc == 0)
                rc = wire_pack(&env, items[k], sizeof items[k], &bin[k].len);
            bin[k].data = items[k];
        }
        Tandem__Batch b = TANDEM__BATCH__INIT;
        b.n_envelopes = 3;
        b.envelopes = bin;
        Tandem__Envelope env;
        size_t len;
        if (rc == 0)
            rc = wire_env_init(&env, TANDEM__ENVELOPE__KIND__BATCH, 0, &b);
        if (rc == 0)
            rc = wire_pack(&env, buf, sizeof buf, &len);
        if (rc == 0)
            rc = write_file(dir, "wire", "batch", buf, len);
        if (rc != 0) {
            fprintf(stderr, "fuzz_seeds: batch: %s (%s)\n", tandem_strerror(rc),
                    wire_error_detail());
            return rc;
        }
    }

    /* KV frames with payloads: a full f32 block slice, a partial block, and
     * an empty payload (the sim backend at payload "none"). */
    static const struct {
        const char *name;
        uint32_t tokens, layers;
        Tandem__KvDtype dtype;
        size_t payload;
    } kv[] = {
        {"kv_f32", 2, 1, TANDEM__KV_DTYPE__KV_DTYPE_F32, 256},
        {"kv_bf16_partial", 1, 2, TANDEM__KV_DTYPE__KV_DTYPE_BF16, 96},
        {"kv_fp8_empty", 16, 4, TANDEM__KV_DTYPE__KV_DTYPE_FP8_E4M3, 0},
    };
    uint8_t payload[256];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)(i * 37 + 11);
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        Tandem__KvFrameHeader h;
        tandem__kv_frame_header__init(&h);
        h.block_index = (uint32_t)i;
        h.block_hash = i == 1 ? 0 : hashes[i];
        h.first_layer = 1;
        h.layer_count = kv[i].layers;
        h.token_count = kv[i].tokens;
        h.dtype = kv[i].dtype;
        Tandem__Envelope env;
        size_t len;
        int rc = wire_env_init(&env, TANDEM__ENVELOPE__KIND__KV_FRAME, 12, &h);
        if (rc == 0)
            rc = wire_frame_pack(&env, payload, kv[i].payload, buf, sizeof buf, &len);
        if (rc == 0)
            rc = write_file(dir, "kvframe", kv[i].name, buf, len);
        if (rc != 0) {
            fprintf(stderr, "fuzz_seeds: %s: %s (%s)\n", kv[i].name, tandem_strerror(rc),
                    wire_error_detail());
            return rc;
        }
    }
    return 0;
}

/* Small checkpoints, written by tiny_save from seeded models. */
static int write_checkpoints(const char *dir)
{
    static const struct {
        const char *name;
        struct tiny_config c;
    } cks[] = {
        {"tiny_d4_v8",
         {.dim = 4,
          .hidden_dim = 8,
          .n_layers = 1,
          .n_heads = 2,
          .n_kv_heads = 1,
          .vocab_size = 8,
          .max_context = 8,
          .seed = 1}},
        {"tiny_d4_l2_v6_sep",
         {.dim = 4,
          .hidden_dim = 4,
          .n_layers = 2,
          .n_heads = 2,
          .n_kv_heads = 2,
          .vocab_size = 6,
          .max_context = 4,
          .seed = 2,
          .separate_classifier = 1}},
        {"tiny_d2_ctx1",
         {.dim = 2,
          .hidden_dim = 3,
          .n_layers = 1,
          .n_heads = 1,
          .n_kv_heads = 1,
          .vocab_size = 3,
          .max_context = 1,
          .seed = 3}},
    };
    for (size_t i = 0; i < sizeof cks / sizeof cks[0]; i++) {
        struct backend *be = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/checkpoint/%s", dir, cks[i].name);
        int rc = tiny_create(&be, &cks[i].c);
        if (rc == 0)
            rc = tiny_save(be, path);
        if (be)
            be->ops->destroy(be);
        if (rc != 0) {
            fprintf(stderr, "fuzz_seeds: %s: %s\n", path, tandem_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* tokenizer.bin files: the 259 required entries (3 specials, 256 bytes as
 * <0xXX>) plus a few merges, in llama2.c's layout. */
static int write_tokenizer(const char *dir, const char *name, const char *const *merges, int n,
                           int32_t max_len)
{
    size_t cap = 4 + (size_t)(259 + n) * (8 + 64);
    unsigned char *buf = malloc(cap), *p = buf + 4;
    if (buf == NULL)
        return TANDEM_ENOMEM;
    memcpy(buf, &max_len, 4);
    for (int id = 0; id < 259 + n; id++) {
        char piece[64];
        if (id == 0)
            snprintf(piece, sizeof piece, "<unk>");
        else if (id == 1)
            snprintf(piece, sizeof piece, "\n<s>\n");
        else if (id == 2)
            snprintf(piece, sizeof piece, "\n</s>\n");
        else if (id < 259)
            snprintf(piece, sizeof piece, "<0x%02X>", id - 3);
        else
            snprintf(piece, sizeof piece, "%s", merges[id - 259]);
        float score = id < 259 ? 0.0f : -(float)(id - 259);
        int32_t len = (int32_t)strlen(piece);
        memcpy(p, &score, 4);
        memcpy(p + 4, &len, 4);
        memcpy(p + 8, piece, (size_t)len);
        p += 8 + len;
    }
    int rc = write_file(dir, "tokenizer", name, buf, (size_t)(p - buf));
    free(buf);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds <corpus dir> (fuzz/corpus)\n");
        return 2;
    }
    static const char *const merges[] = {" t", "he", " the", "in", "er", " a", "é", "hello"};
    static const char *const none[] = {NULL};
    int rc = write_wire(argv[1]);
    if (rc == 0)
        rc = write_checkpoints(argv[1]);
    if (rc == 0)
        rc = write_tokenizer(argv[1], "bytes_only", none, 0, 6);
    if (rc == 0)
        rc = write_tokenizer(argv[1], "merges", merges, 8, 6);
    if (rc == 0)
        rc = write_file(argv[1], "cluster_yaml", "default", cluster_default_text(),
                        strlen(cluster_default_text()));
    return rc == 0 ? 0 : 1;
}
