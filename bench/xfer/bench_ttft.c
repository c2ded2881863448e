/* bench_ttft: time to first token and decode tokens/s of one request through
 * P -> D (tandem-prefill + tandem-decode) against a colocated decode worker
 * (tandem-decode --colocated), tiny model, real processes, driven with
 * common/ctl.h's synchronous ctl_run (docs/performance.md, "## KV transfer
 * (workers)").
 *
 * Each run sends the same fresh prompt (new per run, so no prefix cache
 * hits) to both setups, one after the other, alternating which goes first;
 * it checks that both generate the same ids. TTFT = ctl_run's send to the
 * first token's arrival; tokens/s = (completion - 1) / (last - first token).
 *
 *   ./build-rel/bin/bench_ttft [--runs 7] [--tokens 1000] [--max-tokens 64]
 *       [--transport tcp|ipc] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "xb.h"

#define MAX_RUNS 64

static uint64_t next_id = 1;

struct sample {
    double ttft, tps, e2e;
    /* P->D only, from the workers' debug timestamps (0 when absent), all
     * from the send: P's first chunk computed, its last, D holding every
     * block. */
    double p_first, p_last, d_all;
};

/* One request on D, prefilled by P (NULL: colocated). */
static int one(struct xb_worker *D, struct xb_worker *P, const uint32_t *prompt, int n,
               int max_tokens, struct sample *s, uint32_t *ids)
{
    struct ctl_stream st;
    uint64_t id = next_id++;
    double t0 = ctl_now();
    int rc = xb_request(D, id, prompt, n, max_tokens, P != NULL ? P->p.kv : NULL, &st);
    memset(s, 0, sizeof(*s));
    if (rc == 0) {
        s->ttft = st.t_first - t0;
        s->e2e = st.t_done - t0;
        s->tps = max_tokens > 1 ? (max_tokens - 1) / (st.t_done - st.t_first) : 0;
        memcpy(ids, st.tokens, (size_t)max_tokens * sizeof(*ids));
    }
    ctl_stream_fini(&st);
    static struct xb_chunk ch[256];
    double d_first, d_last;
    int nb, nc;
    if (rc == 0 && P != NULL && (nc = xb_p_chunks(P->log, id, ch, 256)) > 0 &&
        xb_d_installed(D->log, id, &d_first, &d_last, &nb) == 0) {
        s->p_first = ch[0].t_ready - t0;
        s->p_last = ch[nc - 1].t_ready - t0;
        s->d_all = d_last - t0;
    }
    return rc;
}

static void print_load(const char *when)
{
    char load[96];
    bench_loadavg(load, sizeof(load));
    printf("# %s: %s\n", when, load);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int runs = 7, n = 1000, max_tokens = 64;
    const char *transport = "tcp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--runs") == 0) {
            runs = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--tokens") == 0) {
            n = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--max-tokens") == 0) {
            max_tokens = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--transport") == 0) {
            transport = argv[i + 1];
        } else {
            break;
        }
    }
    if (argc % 2 == 0 || runs < 1 || runs > MAX_RUNS || n < 1 || max_tokens < 2 ||
        (strcmp(transport, "tcp") != 0 && strcmp(transport, "ipc") != 0)) {
        fprintf(stderr, "usage: bench_ttft [--runs N] [--tokens N] [--max-tokens N] "
                        "[--transport tcp|ipc]\n");
        return 2;
    }
    xb_init();
    char pkv[H_URL_MAX], dkv[H_URL_MAX];
    if (strcmp(transport, "ipc") == 0) {
        h_ipc_url(pkv, sizeof(pkv), "ttft-p");
        h_ipc_url(dkv, sizeof(dkv), "ttft-d");
    } else {
        snprintf(pkv, sizeof(pkv), "tcp://127.0.0.1:0");
        snprintf(dkv, sizeof(dkv), "tcp://127.0.0.1:0");
    }
    /* Debug: the transfer timestamps (a line per chunk on P, two per
     * request on D). */
    const char *pargs[] = {"--kv", pkv, "--log-level", "debug", NULL};
    const char *dargs[] = {"--kv", dkv, "--log-level", "debug", NULL};
    const char *cargs[] = {"--colocated", NULL};
    struct xb_worker P, D, C;
    int rc = 1;
    uint32_t *prompt = malloc((size_t)n * sizeof(*prompt));
    uint32_t *ids_pd = malloc((size_t)max_tokens * sizeof(*ids_pd));
    uint32_t *ids_c = malloc((size_t)max_tokens * sizeof(*ids_c));
    if (prompt == NULL || ids_pd == NULL || ids_c == NULL) {
        goto out_mem;
    }
    if (xb_spawn(&P, "tandem-prefill", pargs, "ttft-p", 0) != 0) {
        goto out_mem;
    }
    if (xb_spawn(&D, "tandem-decode", dargs, "ttft-d", 1) != 0) {
        goto out_p;
    }
    if (xb_spawn(&C, "tandem-decode", cargs, "ttft-c", 1) != 0) {
        goto out_d;
    }
    printf("# bench_ttft: tiny, %d-token prompt, %d tokens, P->D over %s vs colocated, %d runs\n",
           n, max_tokens, transport, runs);
    print_load("start");
    /* Untimed: connects D's and P's data links, faults in the first pages. */
    struct sample s;
    h_prompt(prompt, n, 1, 3, 259);
    if (one(&D, &P, prompt, n, max_tokens, &s, ids_pd) != 0 ||
        one(&C, NULL, prompt, n, max_tokens, &s, ids_c) != 0) {
        goto out_c;
    }
    double ttft[2][MAX_RUNS], tps[2][MAX_RUNS], e2e[2][MAX_RUNS], dttft[MAX_RUNS];
    double p_first[MAX_RUNS], p_last[MAX_RUNS], d_all[MAX_RUNS], after[MAX_RUNS];
    int n_split = 0;
    int mismatches = 0;
    for (int r = 0; r < runs; r++) {
        h_prompt(prompt, n, 100 + (uint64_t)r, 3, 259);
        for (int k = 0; k < 2; k++) {
            int colocated = (k + r) % 2;
            struct sample x;
            if (one(colocated ? &C : &D, colocated ? NULL : &P, prompt, n, max_tokens, &x,
                    colocated ? ids_c : ids_pd) != 0) {
                goto out_c;
            }
            if (!colocated && x.d_all > 0) {
                p_first[n_split] = x.p_first;
                p_last[n_split] = x.p_last;
                d_all[n_split] = x.d_all;
                after[n_split] = x.ttft - x.d_all;
                n_split++;
            }
            ttft[colocated][r] = x.ttft;
            tps[colocated][r] = x.tps;
            e2e[colocated][r] = x.e2e;
        }
        dttft[r] = ttft[0][r] - ttft[1][r];
        if (memcmp(ids_pd, ids_c, (size_t)max_tokens * sizeof(*ids_c)) != 0) {
            mismatches++;
        }
        printf("#   run %d: TTFT P->D %.1f ms, colocated %.1f ms; tok/s %.1f / %.1f\n", r,
               1e3 * ttft[0][r], 1e3 * ttft[1][r], tps[0][r], tps[1][r]);
        fflush(stdout);
    }
    double mt0 = bench_median(ttft[0], runs), mt1 = bench_median(ttft[1], runs);
    double mp0 = bench_median(tps[0], runs), mp1 = bench_median(tps[1], runs);
    double me0 = bench_median(e2e[0], runs), me1 = bench_median(e2e[1], runs);
    printf("| setup | TTFT | decode tokens/s | end to end |\n|---|---|---|---|\n");
    printf("| P->D (%s) | %.1f ms | %.1f | %.0f ms |\n", transport, 1e3 * mt0, mp0, 1e3 * me0);
    printf("| colocated | %.1f ms | %.1f | %.0f ms |\n", 1e3 * mt1, mp1, 1e3 * me1);
    printf("| P->D / colocated | %.2f | %.2f | %.2f |\n", mt0 / mt1, mp0 / mp1, me0 / me1);
    printf("# median of per-run TTFT differences (P->D - colocated): %+.1f ms\n",
           1e3 * bench_median(dttft, runs));
    if (n_split > 0) {
        printf("# P->D, medians from the send: P's first chunk computed %.1f ms, its last %.1f "
               "ms, D holds every block %.1f ms, first token at the client %.1f ms later\n",
               1e3 * bench_median(p_first, n_split), 1e3 * bench_median(p_last, n_split),
               1e3 * bench_median(d_all, n_split), 1e3 * bench_median(after, n_split));
    }
    printf("# generated ids identical in %d of %d runs\n", runs - mismatches, runs);
    print_load("end");
    rc = mismatches == 0 ? 0 : 1;
out_c:
    xb_stop(&C);
out_d:
    xb_stop(&D);
out_p:
    xb_stop(&P);
out_mem:
    free(prompt);
    free(ids_pd);
    free(ids_c);
    h_cleanup_all();
    nng_fini();
    return rc;
}
