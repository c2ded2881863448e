/* Cost of the cluster secret's frame tag on the KV data link (docs/reliability.md,
 * "Cluster secret"), one core, in one process:
 *   - the tag alone: sealing a KV frame's envelope (HMAC-SHA256 of the
 *     envelope, which holds the payload's XXH3-64) and checking it, which is
 *     all a secret adds per frame;
 *   - the frame path of a 3000-token tiny prompt: 188 KV frames of 128 KiB
 *     (bench_xfer's "tiny" case) packed with checksum and copy, then checked
 *     and unpacked as a decode worker does, plain and sealed, alternating;
 *   - the alternative not taken: an HMAC over every payload byte.
 * Figures are medians (and minima) over the runs. Every sealed frame is
 * checked (auth_frame_check); the bench fails if one does not pass.
 *
 * usage: bench_frame_tag [runs (default 21)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "auth.h"
#include "bench_util.h"
#include "wire.h"

#define N_FRAMES    188
#define FRAME_BYTES 131072 /* a tiny f32 KV block of 16 tokens */

static void seal(void *arg, const void *env, size_t len, uint8_t tag[WIRE_AUTH_TAG_BYTES])
{
    auth_frame_tag(arg, env, len, tag);
}

/* The envelope of one tiny KV frame (6 layers, 16 f32 tokens) of request
 * 0x1234567890ab around *h, which the caller keeps alive while it packs env
 * and may renumber (h->block_index) between packs. */
static void frame_env(Tandem__Envelope *env, Tandem__KvFrameHeader *h)
{
    Tandem__KvFrameHeader init = TANDEM__KV_FRAME_HEADER__INIT;
    *h = init;
    h->layer_count = 6;
    h->token_count = 16;
    h->dtype = TANDEM__KV_DTYPE__KV_DTYPE_F32;
    h->block_hash = 0x0123456789abcdefull;
    wire_env_init(env, TANDEM__ENVELOPE__KIND__KV_FRAME, 0x1234567890abull, h);
}

/* The length of the envelope a packed frame's body b starts with (4 bytes,
 * little-endian), which a worker reads before it checks the tag. */
static uint32_t frame_env_len(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Packs and unpacks N_FRAMES frames of payload, sealed with key and checked
 * when key is not NULL. Returns the seconds taken, or -1 when a frame fails. */
static double frame_path(const struct auth_key *key, const uint8_t *payload)
{
    Tandem__KvFrameHeader h;
    Tandem__Envelope env;
    frame_env(&env, &h);
    double t0 = bench_now_s();
    for (int i = 0; i < N_FRAMES; i++) {
        h.block_index = (uint32_t)i;
        nng_msg *msg = NULL;
        int rc = key != NULL ? wire_frame_pack_msg_sealed(&env, payload, FRAME_BYTES, seal,
                                                          (void *)key, &msg)
                             : wire_frame_pack_msg(&env, payload, FRAME_BYTES, &msg);
        if (rc != 0) {
            return -1;
        }
        if (key != NULL) {
            /* What a worker checks before decoding (worker/worker.c). */
            const uint8_t *b = nng_msg_body(msg);
            uint32_t n = frame_env_len(b);
            if (auth_frame_check(key, b + 4, n) != 0) {
                nng_msg_free(msg);
                return -1;
            }
        }
        struct wire_frame f;
        if (wire_frame_unpack_msg(msg, &f) != 0) {
            nng_msg_free(msg);
            return -1;
        }
        wire_frame_fini(&f);
    }
    return bench_now_s() - t0;
}

/* Seconds per seal and per check of one sealed frame's envelope (*env_len
 * bytes), over reps of each; -1 when the check fails. */
static int tag_alone(const struct auth_key *key, const uint8_t *payload, int reps, double *seal_s,
                     double *check_s, uint32_t *env_len)
{
    Tandem__KvFrameHeader h;
    Tandem__Envelope env;
    frame_env(&env, &h);
    nng_msg *msg = NULL;
    if (wire_frame_pack_msg_sealed(&env, payload, FRAME_BYTES, seal, (void *)key, &msg) != 0) {
        return -1;
    }
    const uint8_t *b = nng_msg_body(msg);
    uint32_t n = frame_env_len(b);
    *env_len = n;
    /* The tag covers the envelope without its last field (the tag). */
    uint8_t tag[AUTH_TAG_BYTES];
    double t0 = bench_now_s();
    for (int i = 0; i < reps; i++) {
        auth_frame_tag(key, b + 4, n - AUTH_ENV_TAG_FIELD_BYTES, tag);
    }
    *seal_s = (bench_now_s() - t0) / reps;
    int bad = 0;
    t0 = bench_now_s();
    for (int i = 0; i < reps; i++) {
        bad |= auth_frame_check(key, b + 4, n);
    }
    *check_s = (bench_now_s() - t0) / reps;
    nng_msg_free(msg);
    return bad != 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 21;
    if (runs < 1) {
        fprintf(stderr, "usage: %s [runs (default 21)]\n", argv[0]);
        return 2;
    }
    static const char secret[] = "bench-frame-tag-secret-0123456789";
    struct auth_key key;
    auth_key_init(&key, secret, strlen(secret));
    uint8_t *payload = malloc(FRAME_BYTES);
    double *plain = malloc((size_t)runs * sizeof *plain);
    double *sealed = malloc((size_t)runs * sizeof *sealed);
    double *mac = malloc((size_t)runs * sizeof *mac);
    double *tseal = malloc((size_t)runs * sizeof *tseal);
    double *tcheck = malloc((size_t)runs * sizeof *tcheck);
    if (payload == NULL || plain == NULL || sealed == NULL || mac == NULL || tseal == NULL ||
        tcheck == NULL) {
        return 1;
    }
    for (size_t i = 0; i < FRAME_BYTES; i++) {
        payload[i] = (uint8_t)(i * 31);
    }
    uint32_t env_len = 0;
    for (int r = 0; r < runs; r++) {
        if (tag_alone(&key, payload, 2000, &tseal[r], &tcheck[r], &env_len) != 0) {
            fprintf(stderr, "bench_frame_tag: a sealed envelope failed its check\n");
            return 1;
        }
        plain[r] = frame_path(NULL, payload);
        sealed[r] = frame_path(&key, payload);
        if (plain[r] < 0 || sealed[r] < 0) {
            fprintf(stderr, "bench_frame_tag: a frame failed to pack, check or unpack\n");
            return 1;
        }
        uint8_t tag[AUTH_TAG_BYTES];
        double t0 = bench_now_s();
        for (int i = 0; i < 32; i++) {
            payload[i] ^= 1;
            auth_frame_tag(&key, payload, FRAME_BYTES, tag);
        }
        mac[r] = (bench_now_s() - t0) / 32;
    }
    double pmin = bench_min(plain, runs), smin = bench_min(sealed, runs);
    double tp = bench_median_upper(plain, runs), ts = bench_median_upper(sealed, runs),
           tm = bench_median_upper(mac, runs);
    double gib = (double)N_FRAMES * FRAME_BYTES / (1 << 30);
    printf("bench_frame_tag: medians (minima) of %d runs\n", runs);
    printf("  the tag alone, a %u-byte envelope: seal %.2f us (%.2f), check %.2f us (%.2f)\n",
           env_len, bench_median_upper(tseal, runs) * 1e6, bench_min(tseal, runs) * 1e6,
           bench_median_upper(tcheck, runs) * 1e6, bench_min(tcheck, runs) * 1e6);
    printf("  frame path, %d x %d KiB (pack + checksum + copy + unpack + checksum):\n", N_FRAMES,
           FRAME_BYTES / 1024);
    printf("    plain   %.2f ms (%.2f), %.2f GiB/s\n", tp * 1e3, pmin * 1e3, gib / tp);
    printf("    sealed  %.2f ms (%.2f), %.2f GiB/s: %+.2f us per frame (%+.2f), %+.1f%%\n",
           ts * 1e3, smin * 1e3, gib / ts, (ts - tp) / N_FRAMES * 1e6,
           (smin - pmin) / N_FRAMES * 1e6, 100 * (ts - tp) / tp);
    printf("  an HMAC of the payload instead: %.0f us per frame (%.2f GB/s)\n", tm * 1e6,
           FRAME_BYTES / tm / 1e9);
    free(tcheck);
    free(tseal);
    free(mac);
    free(sealed);
    free(plain);
    free(payload);
    auth_key_wipe(&key);
    return 0;
}
