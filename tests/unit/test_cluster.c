/* Cluster files (tools/cluster.c): the embedded default, every example in
 * deploy/clusters/ (found through TANDEM_SOURCE_DIR, set by ctest), a file
 * with every key, write/read round trips, the tls section, and bad files
 * whose messages must name the key and the line exactly.
 *
 * The tls files are stand-ins made at start in a temporary directory (the
 * loader checks they are readable PEM of the right kind; real certificates
 * are tests/integration/test_up.c's). The same directory mirrors the
 * repository's layout (deploy/clusters, deploy/routing, run/certs) so the
 * TLS example, whose certificates are generated and not committed, loads
 * as it would after deploy/make-cluster-ca.sh run/certs 127.0.0.1. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "scheduler.h"
#include "tandem_err.h"
#include "up_plan.h"

static const char *source_dir(void)
{
    const char *d = getenv("TANDEM_SOURCE_DIR");
    return d ? d : ".";
}

/* The temporary tree: tls_root/deploy/clusters (base directory of the tls
 * tests), tls_root/deploy/routing -> the source's, tls_root/run/certs/ with
 * ca.crt, 127.0.0.1.crt, 127.0.0.1.key, and not-a-cert.txt. */
static char tls_root[] = "/tmp/test_cluster_tls_XXXXXX";
static char tls_base[256];

static const char PEM_CERT[] = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
static const char PEM_KEY[] = "-----BEGIN PRIVATE KEY-----\nMIGHfake\n-----END PRIVATE KEY-----\n";

static int write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        return -1;
    }
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int tls_tree_create(void)
{
    char path[512], target[1024];
    if (!mkdtemp(tls_root)) {
        return -1;
    }
    snprintf(path, sizeof(path), "%s/deploy", tls_root);
    if (mkdir(path, 0755) != 0) {
        return -1;
    }
    snprintf(tls_base, sizeof(tls_base), "%s/deploy/clusters", tls_root);
    snprintf(path, sizeof(path), "%s/deploy/routing", tls_root);
    snprintf(target, sizeof(target), "%s/deploy/routing", source_dir());
    if (mkdir(tls_base, 0755) != 0 || symlink(target, path) != 0) {
        return -1;
    }
    snprintf(path, sizeof(path), "%s/run", tls_root);
    if (mkdir(path, 0755) != 0) {
        return -1;
    }
    snprintf(path, sizeof(path), "%s/run/certs", tls_root);
    if (mkdir(path, 0755) != 0 || write_text(path, "ca.crt", PEM_CERT) != 0 ||
        write_text(path, "127.0.0.1.crt", PEM_CERT) != 0 ||
        write_text(path, "127.0.0.1.key", PEM_KEY) != 0 ||
        write_text(path, "not-a-cert.txt", "hello\n") != 0) {
        return -1;
    }
    return 0;
}

static void tls_tree_remove(void)
{
    static const char *const files[] = {"run/certs/ca.crt", "run/certs/127.0.0.1.crt",
                                        "run/certs/127.0.0.1.key", "run/certs/not-a-cert.txt",
                                        "deploy/routing"};
    static const char *const dirs[] = {"run/certs", "run", "deploy/clusters", "deploy", ""};
    char path[512];
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tls_root, files[i]);
        unlink(path);
    }
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tls_root, dirs[i]);
        rmdir(path);
    }
}

/* Parses text as t.yaml in dir (NULL: the source's deploy/clusters). */
/* The value of a pool's setting as text ("(unset)" when the pool does not
 * give it), for string and choice settings. */
static const char *pool_text(const struct cluster_pool *p, const char *name)
{
    static char buf[4096];
    int i = wk_setting(name);
    CU_ASSERT_FATAL(i >= 0);
    if (!cluster_pool_has(p, name)) {
        return "(unset)";
    }
    CU_ASSERT_EQUAL_FATAL(settings_format(&wk_settings[i], &p->cfg, buf, sizeof(buf)), 0);
    return buf;
}

static struct cluster *parse_ok_in(const char *dir, const char *text)
{
    char err[CLUSTER_ERR_MAX];
    struct cluster *c = NULL;
    char def[1024];
    snprintf(def, sizeof(def), "%s/deploy/clusters", source_dir());
    int rc = cluster_parse(&c, text, strlen(text), "t.yaml", dir ? dir : def, err, sizeof(err));
    if (rc != 0) {
        printf("\nunexpected error %d: %s\n", rc, err);
    }
    CU_ASSERT_EQUAL(rc, 0);
    return c;
}

static struct cluster *parse_ok(const char *text)
{
    return parse_ok_in(NULL, text);
}

/* Parses text in dir (NULL: the source's deploy/clusters), expects
 * TANDEM_ECONFIG with want in the message. */
static void parse_bad_in(const char *dir, const char *text, const char *want)
{
    char err[CLUSTER_ERR_MAX];
    struct cluster *c = NULL;
    char def[1024];
    snprintf(def, sizeof(def), "%s/deploy/clusters", source_dir());
    int rc = cluster_parse(&c, text, strlen(text), "t.yaml", dir ? dir : def, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, TANDEM_ECONFIG);
    CU_ASSERT_PTR_NULL(c);
    if (!strstr(err, want)) {
        printf("\n  want: %s\n  got:  %s\n", want, err);
        CU_FAIL("message does not contain the expected text");
    }
    cluster_free(c);
}

static void parse_bad(const char *text, const char *want)
{
    parse_bad_in(NULL, text, want);
}

/* Writes c and reads it back; the second write must equal the first. */
static void round_trip(const struct cluster *c)
{
    char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    FILE *f = open_memstream(&a, &alen);
    CU_ASSERT_EQUAL(cluster_write(c, f), 0);
    fclose(f);
    char err[CLUSTER_ERR_MAX];
    struct cluster *back = NULL;
    int rc = cluster_parse(&back, a, alen, c->source, c->base_dir, err, sizeof(err));
    if (rc != 0) {
        printf("\nround trip of %s: %s\n%s\n", c->source, err, a);
    }
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    f = open_memstream(&b, &blen);
    CU_ASSERT_EQUAL(cluster_write(back, f), 0);
    fclose(f);
    CU_ASSERT_STRING_EQUAL(a, b);
    CU_ASSERT_EQUAL(cluster_worker_count(back), cluster_worker_count(c));
    CU_ASSERT_EQUAL(back->transport, c->transport);
    CU_ASSERT_EQUAL(back->router_port, c->router_port);
    free(a);
    free(b);
    cluster_free(back);
}

static void test_default(void)
{
    char err[CLUSTER_ERR_MAX];
    struct cluster *c = NULL;
    CU_ASSERT_EQUAL_FATAL(cluster_default(&c, err, sizeof(err)), 0);
    CU_ASSERT_STRING_EQUAL(c->source, "(default)");
    CU_ASSERT_STRING_EQUAL(c->name, "default");
    CU_ASSERT_STRING_EQUAL(c->model, "tiny");
    CU_ASSERT_STRING_EQUAL(c->backend, "tiny");
    CU_ASSERT_STRING_EQUAL(c->log_level, "info");
    CU_ASSERT_STRING_EQUAL(c->router_host, "127.0.0.1");
    CU_ASSERT_EQUAL(c->block_size, 16);
    CU_ASSERT_EQUAL(c->router_port, 8000);
    CU_ASSERT_EQUAL(c->metrics_base, 0);
    CU_ASSERT_EQUAL(c->transport, CLUSTER_IPC);
    CU_ASSERT_PTR_NULL(c->ipc_dir);
    CU_ASSERT_PTR_NULL(c->tokenizer);
    CU_ASSERT_EQUAL(c->pools[CLUSTER_PREFILL].count, 1);
    CU_ASSERT_EQUAL(c->pools[CLUSTER_DECODE].count, 1);
    CU_ASSERT_EQUAL(c->pools[CLUSTER_COLOCATED].count, 0);
    CU_ASSERT_STRING_EQUAL(pool_text(&c->pools[CLUSTER_PREFILL], "backend"), "tiny");
    CU_ASSERT_STRING_EQUAL(pool_text(&c->pools[CLUSTER_DECODE], "model"), "tiny");
    CU_ASSERT_FALSE(cluster_pool_has(&c->pools[CLUSTER_DECODE], "kv-blocks"));
    CU_ASSERT_FALSE(cluster_pool_has(&c->pools[CLUSTER_DECODE], "tp"));
    CU_ASSERT_FALSE(cluster_pool_has(&c->pools[CLUSTER_DECODE], "gpu"));
    CU_ASSERT_EQUAL(c->pools[CLUSTER_DECODE].n_args, 0);
    /* No routing: the router's default (one copy, compiled into the router). */
    CU_ASSERT_PTR_NULL(c->routing_path);
    CU_ASSERT_PTR_NULL(c->routing_text);
    CU_ASSERT_EQUAL(c->routing_line, 0);
    CU_ASSERT_EQUAL(cluster_worker_count(c), 2);
    round_trip(c);
    cluster_free(c);
}

/* Loads deploy/clusters/<name>. An example with a tls section is parsed
 * from the temporary tree instead, where its generated certificates exist. */
static struct cluster *load_example(const char *name)
{
    char path[1024], err[CLUSTER_ERR_MAX];
    struct cluster *c = NULL;
    snprintf(path, sizeof(path), "%s/deploy/clusters/%s", source_dir(), name);
    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    int rc = strstr(text, "\ntls:") ? cluster_parse(&c, text, n, path, tls_base, err, sizeof(err))
                                    : cluster_load(&c, path, err, sizeof(err));
    if (rc != 0) {
        printf("\n%s: %s\n", name, err);
    }
    CU_ASSERT_EQUAL(rc, 0);
    return c;
}

/* Every *.yaml of deploy/clusters/sub (sub "" or one level down: offline/,
 * distserve/) loads, names its routing (a file or inline) and is named
 * after its file.
 * Returns how many; the top-level examples are clusters of at least two
 * workers (a P/D pair or a colocated set). */
static int every_example_in(const char *sub)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/deploy/clusters%s%s", source_dir(), *sub ? "/" : "", sub);
    DIR *d = opendir(dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".yaml") != 0) {
            continue;
        }
        char rel[512];
        snprintf(rel, sizeof(rel), "%s%s%s", sub, *sub ? "/" : "", e->d_name);
        struct cluster *c = load_example(rel);
        if (c) {
            /* Its routing: a file (which exists), or inline. */
            CU_ASSERT(c->routing_path != NULL || c->routing_text != NULL);
            CU_ASSERT(cluster_worker_count(c) >= (*sub ? 1 : 2));
            char want[300];
            snprintf(want, sizeof(want), "%.*s", (int)(l - 5), e->d_name);
            CU_ASSERT_STRING_EQUAL(c->name, want);
            round_trip(c);
            cluster_free(c);
        }
        n++;
    }
    closedir(d);
    return n;
}

static void test_every_example(void)
{
    CU_ASSERT(every_example_in("") >= 11);
    CU_ASSERT(every_example_in("offline") >= 3);
    CU_ASSERT(every_example_in("distserve") >= 10);
}

static void test_examples_shape(void)
{
    struct cluster *one = load_example("tiny-1p1d.yaml");
    struct cluster *pd = load_example("tiny-2p2d.yaml");
    struct cluster *co = load_example("tiny-colocated-x4.yaml");
    struct cluster *spd = load_example("sim-llama3-70b-h100-4p4d.yaml");
    struct cluster *sco = load_example("sim-llama3-70b-h100-colocated-x8.yaml");
    CU_ASSERT_FATAL(one && pd && co && spd && sco);

    CU_ASSERT_EQUAL(one->pools[CLUSTER_PREFILL].count, 1);
    CU_ASSERT_EQUAL(one->pools[CLUSTER_DECODE].count, 1);
    CU_ASSERT_EQUAL(one->pools[CLUSTER_DECODE].cfg.kv_blocks, 2048);
    CU_ASSERT_EQUAL(one->pools[CLUSTER_DECODE].cfg.max_running, 64);
    CU_ASSERT_PTR_NOT_NULL(strstr(one->routing_path, "/deploy/routing/pd-prefix-precise.yaml"));
    CU_ASSERT_EQUAL(one->routing_path[0], '/');

    CU_ASSERT_EQUAL(pd->pools[CLUSTER_PREFILL].count, 2);
    CU_ASSERT_EQUAL(pd->pools[CLUSTER_DECODE].count, 2);
    CU_ASSERT_EQUAL(pd->pools[CLUSTER_PREFILL].cfg.token_budget, 256);
    /* Colocated x4 has the worker count of 2P2D. */
    CU_ASSERT_EQUAL(co->pools[CLUSTER_COLOCATED].count, 4);
    CU_ASSERT_EQUAL(co->pools[CLUSTER_PREFILL].count, 0);
    CU_ASSERT_EQUAL(cluster_worker_count(co), cluster_worker_count(pd));
    CU_ASSERT_EQUAL(co->pools[CLUSTER_COLOCATED].cfg.max_prefill_chunk, 256);

    CU_ASSERT_STRING_EQUAL(spd->backend, "sim");
    CU_ASSERT_STRING_EQUAL(spd->model, "llama-3-70b");
    CU_ASSERT_EQUAL(spd->transport, CLUSTER_TCP);
    CU_ASSERT_STRING_EQUAL(spd->tcp_host, "127.0.0.1");
    CU_ASSERT_EQUAL(spd->base_port, 0);
    CU_ASSERT_EQUAL(spd->announce_port, -1);
    CU_ASSERT_EQUAL(cluster_announce_port(spd), 8001); /* router port + 1 */
    spd->router_port = 9000;                           /* tandem up --port 9000 */
    CU_ASSERT_EQUAL(cluster_announce_port(spd), 9001);
    spd->router_port = 0;
    CU_ASSERT_EQUAL(cluster_announce_port(spd), 0);
    spd->router_port = 8000;
    for (int r = CLUSTER_PREFILL; r <= CLUSTER_DECODE; r++) {
        const struct cluster_pool *p = &spd->pools[r];
        CU_ASSERT_EQUAL(p->count, 4);
        CU_ASSERT_STRING_EQUAL(pool_text(p, "backend"), "sim");
        CU_ASSERT_STRING_EQUAL(pool_text(p, "model"), "llama-3-70b");
        CU_ASSERT_STRING_EQUAL(pool_text(p, "gpu"), "h100-sxm");
        CU_ASSERT_STRING_EQUAL(pool_text(p, "link"), "ib-400g");
        CU_ASSERT_STRING_EQUAL(pool_text(p, "kv-dtype"), "bf16");
        CU_ASSERT_EQUAL(p->cfg.tp, 4);
        CU_ASSERT_EQUAL(p->cfg.time_scale, 1.0);
    }
    CU_ASSERT_EQUAL(spd->pools[CLUSTER_PREFILL].cfg.token_budget, 8192);
    CU_ASSERT_EQUAL(spd->pools[CLUSTER_DECODE].cfg.max_running, 256);
    /* Colocated x8 uses the same simulated GPUs as 4P4D: 8 x 4 = (4 + 4) x 4. */
    CU_ASSERT_EQUAL(sco->pools[CLUSTER_COLOCATED].count, 8);
    CU_ASSERT_EQUAL(sco->pools[CLUSTER_COLOCATED].count * sco->pools[CLUSTER_COLOCATED].cfg.tp,
                    (spd->pools[0].count + spd->pools[1].count) * spd->pools[0].cfg.tp);

    static const char *const variants[] = {"prefix-aware-precise", "prefix-aware-approx",
                                           "load-only", "round-robin"};
    for (int i = 0; i < 4; i++) {
        char name[128], want[128];
        snprintf(name, sizeof(name), "tiny-colocated-x4-%s.yaml", variants[i]);
        snprintf(want, sizeof(want), "/deploy/routing/%s.yaml", variants[i]);
        struct cluster *v = load_example(name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(v);
        CU_ASSERT_PTR_NOT_NULL(strstr(v->routing_path, want));
        CU_ASSERT_EQUAL(v->pools[CLUSTER_COLOCATED].count, 4);
        cluster_free(v);
    }
    /* The TLS example: tiny-1p1d over tls+tcp://, certificates from
     * deploy/make-cluster-ca.sh run/certs 127.0.0.1 at the repository root. */
    struct cluster *tls = load_example("tiny-1p1d-tls.yaml");
    CU_ASSERT_PTR_NOT_NULL_FATAL(tls);
    CU_ASSERT(cluster_tls(tls));
    CU_ASSERT_STRING_EQUAL(cluster_tcp_scheme(tls), "tls+tcp");
    CU_ASSERT_EQUAL(tls->transport, CLUSTER_TCP);
    CU_ASSERT_EQUAL(cluster_announce_port(tls), 8001);
    char want[600];
    snprintf(want, sizeof(want), "%s/run/certs/ca.crt", tls_root);
    CU_ASSERT_STRING_EQUAL(tls->tls_ca, want);
    snprintf(want, sizeof(want), "%s/run/certs/127.0.0.1.crt", tls_root);
    CU_ASSERT_STRING_EQUAL(tls->tls_cert, want);
    snprintf(want, sizeof(want), "%s/run/certs/127.0.0.1.key", tls_root);
    CU_ASSERT_STRING_EQUAL(tls->tls_key, want);
    CU_ASSERT_EQUAL(tls->pools[CLUSTER_PREFILL].count, one->pools[CLUSTER_PREFILL].count);
    CU_ASSERT_EQUAL(tls->pools[CLUSTER_DECODE].count, one->pools[CLUSTER_DECODE].count);
    CU_ASSERT_EQUAL(tls->pools[CLUSTER_DECODE].cfg.kv_blocks,
                    one->pools[CLUSTER_DECODE].cfg.kv_blocks);
    CU_ASSERT_FALSE(cluster_tls(one));
    CU_ASSERT_STRING_EQUAL(cluster_tcp_scheme(spd), "tcp");
    cluster_free(tls);
    cluster_free(one);
    cluster_free(pd);
    cluster_free(co);
    cluster_free(spd);
    cluster_free(sco);
}

static void test_every_key(void)
{
    struct cluster *c =
        parse_ok("name: full\n"
                 "model: llama-3-8b\n"
                 "backend: sim\n"
                 "block_size: 32\n"
                 "log_level: debug\n"
                 "router:\n"
                 "  host: 127.0.0.2\n"
                 "  args: [\"--log-level\", debug]\n"
                 "ports:\n"
                 "  router: 18000\n"
                 "  announce: 18001\n"
                 "  metrics_base: 19000\n"
                 "transport:\n"
                 "  kind: tcp\n"
                 "  host: 127.0.0.3\n"
                 "  base_port: 20000\n"
                 "routing: {apiVersion: llm-d.ai/v1, kind: EndpointPickerConfig, plugins: [{type: "
                 "decode-filter}, {type: "
                 "round-robin-picker}], schedulingProfiles: [{name: a, plugins: "
                 "[{pluginRef: decode-filter}, {pluginRef: round-robin-picker}]}]}\n"
                 "pools:\n"
                 "  decode:\n"
                 "    count: 2\n"
                 "    gpu: h200\n"
                 "    tp: 2\n"
                 "    link: nvlink\n"
                 "    payload: 1/8\n"
                 "    time_scale: 0.5\n"
                 "    kv_memory: 40GiB\n"
                 "    kv_dtype: fp8\n"
                 "    max_running: 128\n"
                 "    token_budget: 4096\n"
                 "    max_prefill_chunk: 1024\n"
                 "    scheduler: prefill-first\n"
                 "    args: [--seed, 7]\n"
                 "    addresses:\n"
                 "    - {control: tcp://127.0.0.4:21000, kv: tcp://127.0.0.4:21001}\n"
                 "    - control: ipc:///tmp/x.ctl.ipc\n"
                 "      kv: tcp://h:1\n"
                 "  prefill:\n"
                 "    count: 1\n"
                 "    kv_blocks: 100\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_STRING_EQUAL(c->name, "full");
    CU_ASSERT_STRING_EQUAL(c->model, "llama-3-8b");
    CU_ASSERT_STRING_EQUAL(c->backend, "sim");
    CU_ASSERT_EQUAL(c->block_size, 32);
    CU_ASSERT_STRING_EQUAL(c->log_level, "debug");
    CU_ASSERT_STRING_EQUAL(c->router_host, "127.0.0.2");
    CU_ASSERT_EQUAL_FATAL(c->n_router_args, 2);
    CU_ASSERT_STRING_EQUAL(c->router_args[0], "--log-level");
    CU_ASSERT_STRING_EQUAL(c->router_args[1], "debug");
    CU_ASSERT_EQUAL(c->router_port, 18000);
    CU_ASSERT_EQUAL(c->announce_port, 18001);
    CU_ASSERT_EQUAL(cluster_announce_port(c), 18001);
    CU_ASSERT_EQUAL(c->metrics_base, 19000);
    CU_ASSERT_EQUAL(c->transport, CLUSTER_TCP);
    CU_ASSERT_STRING_EQUAL(c->tcp_host, "127.0.0.3");
    CU_ASSERT_EQUAL(c->base_port, 20000);
    CU_ASSERT_EQUAL(c->routing_flow, 1);
    CU_ASSERT_EQUAL(c->routing_line, 17);
    CU_ASSERT_EQUAL(strncmp(c->routing_text, "{apiVersion: llm-d.ai/v1, kind: ", 32), 0);
    const struct cluster_pool *d = &c->pools[CLUSTER_DECODE];
    CU_ASSERT_EQUAL(d->count, 2);
    CU_ASSERT_EQUAL(d->line, 19);
    CU_ASSERT_STRING_EQUAL(pool_text(d, "backend"), "sim");
    CU_ASSERT_STRING_EQUAL(pool_text(d, "model"), "llama-3-8b");
    CU_ASSERT_STRING_EQUAL(pool_text(d, "gpu"), "h200");
    CU_ASSERT_EQUAL(d->cfg.tp, 2);
    CU_ASSERT_STRING_EQUAL(pool_text(d, "link"), "nvlink");
    CU_ASSERT_STRING_EQUAL(pool_text(d, "payload"), "1/8");
    CU_ASSERT_EQUAL(d->cfg.time_scale, 0.5);
    CU_ASSERT_EQUAL(d->cfg.kv_memory, 40ull << 30);
    CU_ASSERT_FALSE(cluster_pool_has(d, "kv-blocks"));
    CU_ASSERT_STRING_EQUAL(pool_text(d, "kv-dtype"), "fp8");
    CU_ASSERT_EQUAL(d->cfg.max_running, 128);
    CU_ASSERT_EQUAL(d->cfg.token_budget, 4096);
    CU_ASSERT_EQUAL(d->cfg.max_prefill_chunk, 1024);
    CU_ASSERT_EQUAL(d->cfg.scheduler, SCHED_POLICY_PREFILL_FIRST);
    CU_ASSERT_EQUAL(c->pools[CLUSTER_PREFILL].cfg.scheduler, SCHED_POLICY_CHUNKED);
    CU_ASSERT_EQUAL_FATAL(d->n_args, 2);
    CU_ASSERT_STRING_EQUAL(d->args[0], "--seed");
    CU_ASSERT_STRING_EQUAL(d->args[1], "7");
    CU_ASSERT_EQUAL_FATAL(d->n_addrs, 2);
    CU_ASSERT_STRING_EQUAL(d->addrs[0].control, "tcp://127.0.0.4:21000");
    CU_ASSERT_STRING_EQUAL(d->addrs[0].kv, "tcp://127.0.0.4:21001");
    CU_ASSERT_STRING_EQUAL(d->addrs[1].control, "ipc:///tmp/x.ctl.ipc");
    CU_ASSERT_STRING_EQUAL(d->addrs[1].kv, "tcp://h:1");
    const struct cluster_pool *p = &c->pools[CLUSTER_PREFILL];
    CU_ASSERT_EQUAL(p->count, 1);
    CU_ASSERT_EQUAL(p->cfg.kv_blocks, 100);
    CU_ASSERT_STRING_EQUAL(pool_text(p, "model"), "llama-3-8b"); /* inherited */
    CU_ASSERT_FALSE(cluster_pool_has(p, "gpu"));
    CU_ASSERT_FALSE(cluster_pool_has(p, "tp"));
    CU_ASSERT_FALSE(cluster_pool_has(p, "time-scale"));
    round_trip(c);
    cluster_free(c);

    /* Defaults: tcp announce is the router port + 1; the sim model default. */
    c = parse_ok("backend: sim\ntransport: {kind: tcp}\npools: {colocated: {count: 1}}\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_STRING_EQUAL(c->model, "llama-3-8b");
    CU_ASSERT_STRING_EQUAL(c->name, "cluster");
    CU_ASSERT_EQUAL(cluster_announce_port(c), 8001);
    CU_ASSERT_EQUAL(c->base_port, 0);
    CU_ASSERT_STRING_EQUAL(c->tcp_host, "127.0.0.1");
    CU_ASSERT_PTR_NULL(c->routing_path);
    CU_ASSERT_PTR_NULL(c->routing_text);
    CU_ASSERT_EQUAL(c->routing_line, 0);
    cluster_free(c);

    /* Block-style inline routing inside the file keeps working after a
     * round trip, and ipc with an explicit directory. */
    c = parse_ok("transport:\n"
                 "  kind: ipc\n"
                 "  dir: /tmp/tandem-test-ipc\n"
                 "routing:\n"
                 "    apiVersion: llm-d.ai/v1\n"
                 "    kind: EndpointPickerConfig\n"
                 "    plugins:\n"
                 "    - type: decode-filter\n"
                 "    - type: round-robin-picker\n"
                 "    # a comment inside\n"
                 "    schedulingProfiles:\n"
                 "    - name: default\n"
                 "      plugins:\n"
                 "      - pluginRef: decode-filter\n"
                 "      - pluginRef: round-robin-picker\n"
                 "\n"
                 "# trailing comment\n"
                 "pools:\n"
                 "  colocated: {count: 3}\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_STRING_EQUAL(c->ipc_dir, "/tmp/tandem-test-ipc");
    CU_ASSERT_STRING_EQUAL(c->routing_text, "apiVersion: llm-d.ai/v1\n"
                                            "kind: EndpointPickerConfig\n"
                                            "plugins:\n"
                                            "- type: decode-filter\n"
                                            "- type: round-robin-picker\n"
                                            "# a comment inside\n"
                                            "schedulingProfiles:\n"
                                            "- name: default\n"
                                            "  plugins:\n"
                                            "  - pluginRef: decode-filter\n"
                                            "  - pluginRef: round-robin-picker\n"
                                            "\n"
                                            "# trailing comment\n");
    round_trip(c);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(cluster_write_routing(c, f), 0);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "(line 4)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\nplugins:\n- type: decode-filter\n"));
    free(text);
    cluster_free(c);
}

static void test_bad_files(void)
{
    static const char *const valid_top = "name, model, backend, tokenizer, block_size, log_level, "
                                         "router, ports, transport, tls, routing, pools";
    char want[512];
    snprintf(want, sizeof(want), "t.yaml:2: colour: unknown key (valid: %s)", valid_top);
    parse_bad("name: x\ncolour: blue\n", want);
    parse_bad(
        "pools:\n  decode:\n    count: 1\n    kv-blocks: 4\n",
        "t.yaml:4: pools.decode.kv-blocks: unknown key (valid: count, backend, model, "
        "checkpoint, gpu, tp, link, payload, time_scale, mfu, mbu, step_overhead_ms, "
        "kv_blocks, kv_memory, kv_dtype, "
        "max_running, token_budget, max_prefill_chunk, scheduler, args, addresses); did you mean "
        "'kv_blocks'?");
    parse_bad("pools:\n  decode:\n    count: many\n",
              "t.yaml:3: pools.decode.count: expected an integer in [0, 1024], got 'many'");
    parse_bad("pools:\n  decode:\n    count: 1025\n",
              "t.yaml:3: pools.decode.count: expected an integer in [0, 1024], got '1025'");
    parse_bad("pools:\n  decode:\n    count: 1\n    backend: gpu\n",
              "t.yaml:4: pools.decode.backend: expected one of tiny, sim, got 'gpu'");
    parse_bad("pools:\n  encode:\n    count: 1\n",
              "t.yaml:2: pools.encode: unknown pool (valid: prefill, decode, colocated)");
    parse_bad("pools:\n  decode:\n    count: 1\n    count: 2\n",
              "t.yaml:4: pools.decode.count: duplicate key");
    parse_bad("pools:\n  decode: {count: 1}\n  decode: {count: 2}\n",
              "t.yaml:3: pools.decode: duplicate key");
    parse_bad("transport:\n  kind: udp\npools: {decode: {count: 1}}\n",
              "t.yaml:2: transport.kind: expected one of ipc, tcp, got 'udp'");
    parse_bad("ports:\n  router: 70000\n",
              "t.yaml:2: ports.router: expected an integer in [0, 65535], got '70000'");
    parse_bad("pools:\n  decode:\n    count: 1\n    gpu: h100-sxm\n",
              "t.yaml:4: pools.decode.gpu: only for the sim backend");
    parse_bad("backend: sim\npools:\n  decode:\n    count: 1\n    gpu: h900\n",
              "t.yaml:5: pools.decode.gpu: unknown GPU 'h900' (one of: a100-80g, h100-sxm");
    parse_bad("backend: sim\nmodel: llama-9\npools:\n  decode:\n    count: 1\n",
              "t.yaml:2: model: unknown sim model 'llama-9' (one of: llama-3-8b");
    parse_bad("backend: sim\npools:\n  decode:\n    count: 1\n    model: llama-9\n",
              "t.yaml:5: pools.decode.model: unknown sim model 'llama-9' (one of: llama-3-8b");
    parse_bad("pools:\n  decode:\n    count: 1\n    model: gpt\n",
              "t.yaml:4: pools.decode.model: the tiny backend has the model 'tiny' (or a "
              "checkpoint), got 'gpt'");
    parse_bad("backend: sim\npools:\n  decode:\n    count: 1\n    link: carrier-pigeon\n",
              "t.yaml:5: pools.decode.link: unknown link 'carrier-pigeon'");
    parse_bad("backend: sim\npools:\n  prefill: {count: 1}\n  decode:\n    count: 1\n"
              "    model: llama-3-70b\n",
              "t.yaml:6: pools.decode.model: 'llama-3-70b' differs from pools.prefill.model "
              "'llama-3-8b' (one cluster serves one model)");
    parse_bad("pools:\n  prefill: {count: 1}\n  decode:\n    count: 1\n    backend: sim\n",
              "t.yaml:5: pools.decode.backend: 'sim' differs from pools.prefill.backend 'tiny'");
    parse_bad("name: x\npools:\n  prefill: {count: 1}\n",
              "t.yaml:2: pools: no decode or colocated worker (a cluster needs at least one)");
    parse_bad("name: x\n", "t.yaml:1: pools: no decode or colocated worker");
    parse_bad("pools:\n  prefill: {count: 1}\n  colocated: {count: 1}\n",
              "t.yaml:2: pools.prefill: prefill workers need decode workers");
    parse_bad("pools:\n  decode:\n    count: 1\n    args: [--seed, 1, --id, x]\n",
              "t.yaml:4: pools.decode.args: '--id' is set by tandem up");
    parse_bad("pools:\n  decode:\n    count: 1\n    args: [\"--router=tcp://x:1\"]\n",
              "t.yaml:4: pools.decode.args: '--router' is set by tandem up");
    parse_bad("router:\n  args: [--port, 9]\npools: {decode: {count: 1}}\n",
              "t.yaml:2: router.args: '--port' is set by tandem up");
    parse_bad("pools:\n  decode:\n    count: 1\n    args: --seed 1\n",
              "t.yaml:4: pools.decode.args: expected a list of strings");
    parse_bad("pools:\n  decode:\n    count: 1\n    args: [[a]]\n",
              "t.yaml:4: pools.decode.args[0]: expected a string");
    parse_bad("routing: no-such-file.yaml\npools: {decode: {count: 1}}\n",
              "t.yaml:1: routing: cannot read '");
    parse_bad("routing: [a]\npools: {decode: {count: 1}}\n",
              "t.yaml:1: routing: expected the path of an EndpointPickerConfig file or an "
              "inline mapping");
    /* The router's own loader, with the line in this file. */
    parse_bad("pools: {decode: {count: 1}}\n"
              "routing:\n"
              "  apiVersion: llm-d.ai/v1\n"
              "  kind: EndpointPickerConfig\n"
              "  plugins:\n"
              "  - type: decode-filter\n"
              "  - type: telepathy-scorer\n"
              "  schedulingProfiles:\n"
              "  - name: default\n"
              "    plugins:\n"
              "    - pluginRef: decode-filter\n"
              "    - pluginRef: telepathy-scorer\n",
              "t.yaml:2: routing: t.yaml:7: ");
    parse_bad("pools: {decode: {count: 1}}\n"
              "routing:\n"
              "  apiVersion: llm-d.ai/v1\n"
              "  kind: EndpointPickerConfig\n"
              "  plugins:\n"
              "  - type: decode-filter\n"
              "  - type: telepathy-scorer\n"
              "  schedulingProfiles:\n"
              "  - name: default\n"
              "    plugins:\n"
              "    - pluginRef: decode-filter\n"
              "    - pluginRef: telepathy-scorer\n",
              "t.yaml:7: plugin 'telepathy-scorer': unknown type 'telepathy-scorer'");
    parse_bad("block_size: 32\nrouting: ../routing/prefix-aware-precise.yaml\n"
              "pools: {decode: {count: 1}}\n",
              "t.yaml:2: routing: the prefix-cache-scorer's blockSize 16 differs from block_size "
              "32");
    parse_bad("pools:\n  decode:\n    count: [1\n", "t.yaml:4: YAML syntax error: ");
    parse_bad("", "t.yaml:1: empty cluster file");
    parse_bad("- a\n- b\n", "t.yaml:1: the cluster file must be a mapping of keys to values");
    parse_bad("pools:\n  decode: 2\n", "t.yaml:2: pools.decode: expected a mapping");
    parse_bad("pools:\n  decode:\n    count: 1\n    kv_memory: lots\n",
              "t.yaml:4: pools.decode.kv_memory: expected a byte count such as 40GiB, 512MiB or "
              "1e9, got 'lots'");
    parse_bad("pools:\n  decode:\n    count: 1\n    kv_blocks: 10\n    kv_memory: 1GB\n",
              "t.yaml:5: pools.decode.kv_memory: conflicts with pools.decode.kv_blocks");
    parse_bad("pools:\n  decode:\n    count: 1\n    payload: half\n",
              "t.yaml:4: pools.decode.payload: expected auto, full, none or 1/N, got 'half'");
    parse_bad("pools:\n  decode:\n    count: 1\n    kv_dtype: int4\n",
              "t.yaml:4: pools.decode.kv_dtype: expected one of auto, f32, f16, bf16, fp8, got "
              "'int4'");
    parse_bad("pools:\n  decode:\n    count: 1\n    scheduler: fifo\n",
              "t.yaml:4: pools.decode.scheduler: expected one of chunked, prefill-first, got "
              "'fifo'");
    parse_bad("pools:\n  decode:\n    count: 2\n    addresses:\n"
              "    - {control: tcp://127.0.0.1:1, kv: tcp://127.0.0.1:2}\n",
              "t.yaml:4: pools.decode.addresses: 1 address for 2 workers");
    parse_bad("pools:\n  decode:\n    count: 1\n    addresses:\n"
              "    - {control: http://x:1, kv: tcp://127.0.0.1:2}\n",
              "t.yaml:5: pools.decode.addresses[0]: 'http://x:1' is not tcp://host:port");
    parse_bad("pools:\n  decode:\n    count: 1\n    addresses:\n    - {control: tcp://x:1}\n",
              "t.yaml:5: pools.decode.addresses[0]: needs both control and kv");
    parse_bad("transport:\n  base_port: 9000\npools: {decode: {count: 1}}\n",
              "t.yaml:2: transport.base_port: only for transport kind tcp (this cluster uses "
              "ipc)");
    parse_bad("ports:\n  announce: 9000\npools: {decode: {count: 1}}\n",
              "t.yaml:2: ports.announce: only for transport kind tcp");
    parse_bad("transport:\n  kind: tcp\n  dir: /tmp\npools: {decode: {count: 1}}\n",
              "t.yaml:3: transport.dir: only for transport kind ipc (this cluster uses tcp)");
    parse_bad("transport:\n  dir: /tmp/a-very-long-directory-name-for-sockets/that/goes/on/and/"
              "on/and/on/and/on/forever\npools: {decode: {count: 1}}\n",
              "t.yaml:2: transport.dir: '/tmp/a-very-long");
    parse_bad("ports:\n  router: 8000\n  metrics_base: 7999\npools: {decode: {count: 2}}\n",
              "t.yaml:3: ports.metrics_base: ports 7999-8000 overlap ports.router (8000-8000)");
    parse_bad("transport: {kind: tcp, base_port: 8001}\npools: {decode: {count: 1}}\n",
              "t.yaml:1: transport.base_port: ports 8001-8002 overlap ports.announce (8001-8001)");
    parse_bad("transport: {kind: tcp, base_port: 65535}\npools: {decode: {count: 1}}\n",
              "t.yaml:1: transport.base_port: 65535 + 2 x 1 workers passes 65535");
    parse_bad("tokenizer: /no/such/tokenizer.bin\npools: {decode: {count: 1}}\n",
              "t.yaml:1: tokenizer: cannot read '/no/such/tokenizer.bin': No such file or "
              "directory");
    parse_bad("pools:\n  decode:\n    count: 1\n    checkpoint: ../clusters/tiny-1p1d.yaml\n"
              "    model: tiny\n",
              "t.yaml:4: pools.decode.checkpoint: conflicts with pools.decode.model");
    parse_bad("backend: sim\npools:\n  decode:\n    count: 1\n    time_scale: -1\n",
              "t.yaml:5: pools.decode.time_scale: expected a number in [0, 1e+06], got '-1'");
    parse_bad("router: localhost\npools: {decode: {count: 1}}\n",
              "t.yaml:1: router: expected a mapping of keys to values");
    parse_bad("name: [a, b]\npools: {decode: {count: 1}}\n",
              "t.yaml:1: name: expected a single value, got a list");
    parse_bad("name: \"\"\npools: {decode: {count: 1}}\n", "t.yaml:1: name: empty value");
    parse_bad("log_level: loud\npools: {decode: {count: 1}}\n",
              "t.yaml:1: log_level: expected one of debug, info, warn, error, got 'loud'");
    parse_bad("block_size: 0\npools: {decode: {count: 1}}\n",
              "t.yaml:1: block_size: expected an integer in [1, 1024], got '0'");
}

/* The tls section: valid (block and flow style, relative paths resolved
 * against the file's directory, tcp implied, round trip), and every way to
 * get it wrong, each with the line that has the problem. */
static void test_tls(void)
{
    const char *dir = tls_base;
    struct cluster *c = parse_ok_in(dir, "name: t\n"
                                         "tls:\n"
                                         "  ca: ../../run/certs/ca.crt\n"
                                         "  cert: ../../run/certs/127.0.0.1.crt\n"
                                         "  key: ../../run/certs/127.0.0.1.key\n"
                                         "pools: {prefill: {count: 1}, decode: {count: 1}}\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    char want[1024];
    CU_ASSERT(cluster_tls(c));
    snprintf(want, sizeof(want), "%s/run/certs/ca.crt", tls_root);
    CU_ASSERT_STRING_EQUAL(c->tls_ca, want);
    snprintf(want, sizeof(want), "%s/run/certs/127.0.0.1.crt", tls_root);
    CU_ASSERT_STRING_EQUAL(c->tls_cert, want);
    snprintf(want, sizeof(want), "%s/run/certs/127.0.0.1.key", tls_root);
    CU_ASSERT_STRING_EQUAL(c->tls_key, want);
    /* tls makes tcp the transport, with the tcp defaults. */
    CU_ASSERT_EQUAL(c->transport, CLUSTER_TCP);
    CU_ASSERT_STRING_EQUAL(c->tcp_host, "127.0.0.1");
    CU_ASSERT_EQUAL(c->base_port, 0);
    CU_ASSERT_EQUAL(cluster_announce_port(c), 8001);
    CU_ASSERT_STRING_EQUAL(cluster_tcp_scheme(c), "tls+tcp");
    /* Written out with absolute paths and an explicit tcp transport. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(cluster_write(c, f), 0);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "transport:\n  kind: tcp\n  host: \"127.0.0.1\"\n"));
    snprintf(want, sizeof(want),
             "\ntls:\n  ca: \"%s/run/certs/ca.crt\"\n  cert: \"%s/run/certs/127.0.0.1.crt\"\n"
             "  key: \"%s/run/certs/127.0.0.1.key\"\n",
             tls_root, tls_root, tls_root);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
    if (!strstr(text, want)) {
        printf("\nwant %s\nin:\n%s\n", want, text);
    }
    free(text);
    round_trip(c);
    cluster_free(c);

    /* Flow style, absolute paths, explicit tcp and tls+tcp:// addresses. */
    char flow[2048];
    snprintf(flow, sizeof(flow),
             "transport: {kind: tcp, host: 127.0.0.2}\n"
             "tls: {ca: %s/run/certs/ca.crt, cert: %s/run/certs/127.0.0.1.crt, key: "
             "%s/run/certs/127.0.0.1.key}\n"
             "pools:\n  decode:\n    count: 1\n    addresses:\n"
             "    - {control: tls+tcp://127.0.0.3:9100, kv: tls+tcp://127.0.0.3:9101}\n",
             tls_root, tls_root, tls_root);
    c = parse_ok_in(dir, flow);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT(cluster_tls(c));
    CU_ASSERT_STRING_EQUAL(c->tcp_host, "127.0.0.2");
    CU_ASSERT_STRING_EQUAL(c->pools[CLUSTER_DECODE].addrs[0].control, "tls+tcp://127.0.0.3:9100");
    round_trip(c);
    cluster_free(c);

    /* Without tls nothing changes: no paths, plain tcp. */
    c = parse_ok("transport: {kind: tcp}\npools: {decode: {count: 1}}\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_FALSE(cluster_tls(c));
    CU_ASSERT_PTR_NULL(c->tls_ca);
    CU_ASSERT_PTR_NULL(c->tls_cert);
    CU_ASSERT_PTR_NULL(c->tls_key);
    CU_ASSERT_STRING_EQUAL(cluster_tcp_scheme(c), "tcp");
    text = NULL;
    f = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(cluster_write(c, f), 0);
    fclose(f);
    CU_ASSERT_PTR_NULL(strstr(text, "tls"));
    free(text);
    cluster_free(c);

    /* All three or none: the missing one named, at the tls key's line. */
    parse_bad_in(
        dir,
        "name: t\ntls:\n  ca: ../../run/certs/ca.crt\n  cert: ../../run/certs/127.0.0.1.crt\n"
        "pools: {decode: {count: 1}}\n",
        "t.yaml:2: tls: missing key (give all three: ca, cert and key, or no tls "
        "section)");
    parse_bad_in(dir, "pools: {decode: {count: 1}}\ntls: {key: ../../run/certs/127.0.0.1.key}\n",
                 "t.yaml:2: tls: missing ca");
    parse_bad_in(dir,
                 "tls:\n  ca: ../../run/certs/ca.crt\n  key: ../../run/certs/127.0.0.1.key\n"
                 "pools: {decode: {count: 1}}\n",
                 "t.yaml:1: tls: missing cert");
    /* Unknown and duplicate keys, wrong shapes. */
    parse_bad_in(
        dir,
        "name: t\ntls:\n  ca: ../../run/certs/ca.crt\n  cert: ../../run/certs/127.0.0.1.crt\n"
        "  key: ../../run/certs/127.0.0.1.key\n  crl: revoked.pem\n"
        "pools: {decode: {count: 1}}\n",
        "t.yaml:6: tls.crl: unknown key (valid: ca, cert, key)");
    parse_bad_in(dir, "tls:\n  ca: a\n  ca: b\npools: {decode: {count: 1}}\n",
                 "t.yaml:3: tls.ca: duplicate key");
    parse_bad_in(dir, "tls: on\npools: {decode: {count: 1}}\n",
                 "t.yaml:1: tls: expected a mapping {ca: FILE, cert: FILE, key: FILE}");
    parse_bad_in(dir, "tls:\npools: {decode: {count: 1}}\n", "t.yaml:1: tls: expected a mapping");
    parse_bad_in(dir, "tls: {ca: [a], cert: b, key: c}\npools: {decode: {count: 1}}\n",
                 "t.yaml:1: tls.ca: expected a single value, got a list");
    /* Files: missing, a directory, the wrong kind of PEM (swapped). */
    snprintf(want, sizeof(want),
             "t.yaml:4: tls.cert: cannot read '%s/run/certs/nobody.crt': No such file or "
             "directory (deploy/make-cluster-ca.sh makes a CA and certificates)",
             tls_root);
    parse_bad_in(dir,
                 "name: t\ntls:\n  ca: ../../run/certs/ca.crt\n  cert: ../../run/certs/nobody.crt\n"
                 "  key: ../../run/certs/127.0.0.1.key\npools: {decode: {count: 1}}\n",
                 want);
    snprintf(want, sizeof(want), "t.yaml:2: tls.ca: cannot read '%s/run/certs' (a directory?)",
             tls_root);
    parse_bad_in(dir,
                 "tls:\n  ca: ../../run/certs\n  cert: ../../run/certs/127.0.0.1.crt\n"
                 "  key: ../../run/certs/127.0.0.1.key\npools: {decode: {count: 1}}\n",
                 want);
    snprintf(want, sizeof(want),
             "t.yaml:4: tls.key: '%s/run/certs/127.0.0.1.crt' holds no PEM private key "
             "(-----BEGIN PRIVATE KEY-----)",
             tls_root);
    parse_bad_in(dir,
                 "tls:\n  ca: ../../run/certs/ca.crt\n  cert: ../../run/certs/127.0.0.1.crt\n"
                 "  key: ../../run/certs/127.0.0.1.crt\npools: {decode: {count: 1}}\n",
                 want);
    snprintf(want, sizeof(want),
             "t.yaml:3: tls.cert: '%s/run/certs/127.0.0.1.key' holds no PEM certificate "
             "(-----BEGIN CERTIFICATE-----)",
             tls_root);
    parse_bad_in(dir,
                 "tls:\n  ca: ../../run/certs/ca.crt\n  cert: ../../run/certs/127.0.0.1.key\n"
                 "  key: ../../run/certs/127.0.0.1.key\npools: {decode: {count: 1}}\n",
                 want);
    parse_bad_in(
        dir,
        "tls:\n  ca: ../../run/certs/not-a-cert.txt\n  cert: ../../run/certs/127.0.0.1.crt\n"
        "  key: ../../run/certs/127.0.0.1.key\npools: {decode: {count: 1}}\n",
        "t.yaml:2: tls.ca: '");

    /* tls needs tcp: ipc given explicitly is refused; ipc-only keys too. */
    static const char tls_ok[] = "tls:\n  ca: ../../run/certs/ca.crt\n"
                                 "  cert: ../../run/certs/127.0.0.1.crt\n"
                                 "  key: ../../run/certs/127.0.0.1.key\n";
    char buf[2048];
    snprintf(buf, sizeof(buf), "transport:\n  kind: ipc\n%spools: {decode: {count: 1}}\n", tls_ok);
    parse_bad_in(dir, buf,
                 "t.yaml:2: transport.kind: ipc cannot be used with tls (line 3): tls+tcp:// needs "
                 "kind tcp");
    snprintf(buf, sizeof(buf), "%stransport:\n  dir: /tmp/x\npools: {decode: {count: 1}}\n",
             tls_ok);
    parse_bad_in(dir, buf,
                 "t.yaml:6: transport.dir: only for transport kind ipc (this cluster uses tcp, for "
                 "tls)");
    /* Addresses must match: tls+tcp:// with tls, never without. */
    snprintf(buf, sizeof(buf),
             "%spools:\n  decode:\n    count: 1\n    addresses:\n"
             "    - control: tls+tcp://127.0.0.1:9100\n      kv: tcp://127.0.0.1:9101\n",
             tls_ok);
    parse_bad_in(dir, buf,
                 "t.yaml:10: pools.decode.addresses[0].kv: 'tcp://127.0.0.1:9101' is not "
                 "tls+tcp:// (with tls, every address must be)");
    snprintf(buf, sizeof(buf),
             "%spools:\n  decode:\n    count: 1\n    addresses:\n"
             "    - {control: ipc:///tmp/d.ctl.ipc, kv: tls+tcp://127.0.0.1:9101}\n",
             tls_ok);
    parse_bad_in(dir, buf,
                 "t.yaml:9: pools.decode.addresses[0].control: 'ipc:///tmp/d.ctl.ipc' is not "
                 "tls+tcp://");
    parse_bad("transport: {kind: tcp}\npools:\n  decode:\n    count: 1\n    addresses:\n"
              "    - control: tcp://127.0.0.1:9100\n      kv: tls+tcp://127.0.0.1:9101\n",
              "t.yaml:7: pools.decode.addresses[0].kv: 'tls+tcp://127.0.0.1:9101' needs the tls "
              "section (certificates for every process)");
    /* The TLS flags come from the tls section only. */
    parse_bad("pools:\n  decode:\n    count: 1\n    args: [--tls-ca, ca.crt]\n",
              "t.yaml:4: pools.decode.args: '--tls-ca' is set by tandem up");
    parse_bad("router:\n  args: [\"--tls-key=x.key\"]\npools: {decode: {count: 1}}\n",
              "t.yaml:2: router.args: '--tls-key' is set by tandem up");
    snprintf(buf, sizeof(buf), "%spools:\n  colocated:\n    count: 1\n    args: [--tls-cert, x]\n",
             tls_ok);
    parse_bad_in(dir, buf, "t.yaml:8: pools.colocated.args: '--tls-cert' is set by tandem up");
}

/* Strings that YAML would not read back as written unless escaped: a line
 * separator inside a quoted scalar is folded into a space (fuzz_cluster_yaml
 * found it in a name), DEL and C1 controls are not printable, a BOM is
 * dropped. The cluster written must read back with the same name. */
static void test_write_escapes(void)
{
    struct cluster *c =
        parse_ok("name: \"a\\Lb\\Pc\\Nd\\x7fe\\x80f\\uFEFFg\\\\h\\\"i\\tj\"\n"
                 "model: tiny\nbackend: tiny\npools:\n  colocated:\n    count: 1\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_STRING_EQUAL(c->name, "a\xE2\x80\xA8"
                                    "b\xE2\x80\xA9"
                                    "c\xC2\x85"
                                    "d\x7f"
                                    "e\xC2\x80"
                                    "f\xEF\xBB\xBF"
                                    "g\\h\"i\tj");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(cluster_write(c, f), 0);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "name: \"a\\u2028b\\u2029c\\u0085d\\x7fe\\u0080f\\ufeffg"
                                        "\\\\h\\\"i\\x09j\"\n"));
    free(text);
    round_trip(c);
    char err[CLUSTER_ERR_MAX];
    struct cluster *back = NULL;
    f = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(cluster_write(c, f), 0);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(cluster_parse(&back, text, len, "w.yaml", NULL, err, sizeof(err)), 0);
    CU_ASSERT_STRING_EQUAL(back->name, c->name);
    free(text);
    cluster_free(back);
    cluster_free(c);
}

/* Inline routing after multi-byte characters: libyaml's marks count
 * characters, so the mapping's text must be found by characters, not bytes
 * (fuzz_cluster_yaml: an "é" before a block mapping shifted it by a byte). */
static void test_inline_routing_after_utf8(void)
{
    static const char *routing[] = {
        "routing:\n"
        "  apiVersion: llm-d.ai/v1\n"
        "  kind: EndpointPickerConfig\n"
        "  plugins:\n"
        "  - type: round-robin-picker\n"
        "  schedulingProfiles:\n"
        "  - name: default\n"
        "    plugins:\n"
        "    - pluginRef: round-robin-picker\n",
        "routing: {apiVersion: llm-d.ai/v1, kind: EndpointPickerConfig, plugins: [{type: "
        "round-robin-picker}], schedulingProfiles: [{name: default, plugins: [{pluginRef: "
        "round-robin-picker}]}]}\n"};
    for (int i = 0; i < 2; i++) {
        char text[1024];
        snprintf(text, sizeof(text),
                 "\xEF\xBB\xBF# caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\n"
                 "name: \"d\xC3\xA9j\xC3\xA0\"\n"
                 "pools:\n  colocated:\n    count: 1\n%s",
                 routing[i]);
        struct cluster *c = parse_ok(text);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c);
        CU_ASSERT_STRING_EQUAL(c->name, "d\xC3\xA9j\xC3\xA0");
        CU_ASSERT_PTR_NOT_NULL_FATAL(c->routing_text);
        if (i == 0) {
            CU_ASSERT_EQUAL(strncmp(c->routing_text, "apiVersion: llm-d.ai/v1\nkind:", 29), 0);
        } else {
            CU_ASSERT_EQUAL(strncmp(c->routing_text, "{apiVersion: llm-d.ai/v1, kind:", 31), 0);
        }
        round_trip(c);
        cluster_free(c);
    }
}

/* Inline block routing whose lines end in "\r\n", a lone "\r" or NEL: each
 * is a line break to libyaml, so each line loses its indentation
 * (fuzz_cluster_yaml: after a lone "\r" the next line kept it, and the
 * routing the router was handed no longer parsed). */
static void test_inline_routing_line_breaks(void)
{
    struct cluster *c = parse_ok("pools:\r\n  colocated:\r\n    count: 1\r\n"
                                 "routing:\r\n"
                                 "  apiVersion: llm-d.ai/v1\r"
                                 "  kind: EndpointPickerConfig\xC2\x85"
                                 "  plugins:\r\n"
                                 "  - type: round-robin-picker\r\n"
                                 "  schedulingProfiles:\n"
                                 "  - name: default\r"
                                 "    plugins:\r\n"
                                 "    - pluginRef: round-robin-picker\r\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c->routing_text);
    CU_ASSERT_EQUAL(c->routing_flow, 0);
    CU_ASSERT_EQUAL(c->routing_line, 4);
    CU_ASSERT_STRING_EQUAL(c->routing_text, "apiVersion: llm-d.ai/v1\n"
                                            "kind: EndpointPickerConfig\n"
                                            "plugins:\n"
                                            "- type: round-robin-picker\n"
                                            "schedulingProfiles:\n"
                                            "- name: default\n"
                                            "  plugins:\n"
                                            "  - pluginRef: round-robin-picker\n");
    round_trip(c);
    cluster_free(c);
}

/* router.api_key_file: resolved, written back, given to the router as
 * --api-key-file PATH (never the key), checked at load; --api-key and
 * --api-key-file are refused in router.args. */
static void test_api_key_file(void)
{
    char dir[] = "/tmp/test_cluster_key.XXXXXX";
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    char path[128], bad[128];
    snprintf(path, sizeof(path), "%s/key.txt", dir);
    snprintf(bad, sizeof(bad), "%s/bad.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("sk-cluster-key-91\n", f);
    fclose(f);
    f = fopen(bad, "w");
    fputs("a b\n", f);
    fclose(f);
    struct cluster *c =
        parse_ok_in(dir, "router:\n  api_key_file: key.txt\npools: {decode: {count: 1}}\n");
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    CU_ASSERT_STRING_EQUAL(c->router_api_key_file, path);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    CU_ASSERT_EQUAL(cluster_write(c, m), 0);
    fclose(m);
    char want[256];
    snprintf(want, sizeof(want), "router:\n  host: \"127.0.0.1\"\n  api_key_file: \"%s\"\n", path);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
    CU_ASSERT_PTR_NULL(strstr(text, "sk-cluster-key-91"));
    free(text);
    struct up_plan plan;
    struct up_plan_input in = {.bin_dir = "/b", .run_dir = dir, .ipc_dir = dir, .router_port = 1};
    char err[CLUSTER_ERR_MAX];
    CU_ASSERT_EQUAL_FATAL(up_plan_build(&plan, c, &in, err, sizeof(err)), 0);
    int at = -1;
    for (int i = 0; i < plan.n; i++) {
        for (int j = 0; j < plan.procs[i].argc; j++) {
            CU_ASSERT_PTR_NULL(strstr(plan.procs[i].argv[j], "sk-cluster-key-91"));
            if (i == 0 && strcmp(plan.procs[i].argv[j], "--api-key-file") == 0) {
                at = j;
            }
        }
    }
    CU_ASSERT_EQUAL(plan.procs[0].kind, UP_ROUTER);
    CU_ASSERT_FATAL(at > 0 && at + 1 < plan.procs[0].argc);
    CU_ASSERT_STRING_EQUAL(plan.procs[0].argv[at + 1], path);
    up_plan_free(&plan);
    cluster_free(c);
    parse_bad_in(dir, "router:\n  api_key_file: bad.txt\npools: {decode: {count: 1}}\n",
                 "t.yaml:2: router.api_key_file: API key from --api-key-file");
    parse_bad_in(dir, "router:\n  api_key_file: bad.txt\npools: {decode: {count: 1}}\n",
                 "byte 2 is 0x20");
    parse_bad_in(dir, "router:\n  api_key_file: none.txt\npools: {decode: {count: 1}}\n",
                 "t.yaml:2: router.api_key_file: cannot read");
    parse_bad("router:\n  args: [--api-key, sk-x]\npools: {decode: {count: 1}}\n",
              "t.yaml:2: router.args: '--api-key' would write the key into the cluster file");
    parse_bad("router:\n  args: [\"--api-key=sk-x\"]\npools: {decode: {count: 1}}\n",
              "t.yaml:2: router.args: '--api-key' would write the key");
    parse_bad("router:\n  args: [--api-key-file, k]\npools: {decode: {count: 1}}\n",
              "t.yaml:2: router.args: '--api-key-file' is set by tandem up");
    unlink(path);
    unlink(bad);
    rmdir(dir);
}

static void test_load_errors(void)
{
    char err[CLUSTER_ERR_MAX];
    struct cluster *c = NULL;
    CU_ASSERT_EQUAL(cluster_load(&c, "/no/such/cluster.yaml", err, sizeof(err)), TANDEM_ENOENT);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_STRING_EQUAL(err, "/no/such/cluster.yaml: cannot open: No such file or directory");
    /* The file's own path is in messages; relative paths resolve next to it. */
    char path[] = "/tmp/test_cluster_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    const char *text = "pools:\n  decode:\n    count: x\n";
    CU_ASSERT_EQUAL((size_t)write(fd, text, strlen(text)), strlen(text));
    close(fd);
    CU_ASSERT_EQUAL(cluster_load(&c, path, err, sizeof(err)), TANDEM_ECONFIG);
    char want[256];
    snprintf(want, sizeof(want), "%s:3: pools.decode.count: expected an integer", path);
    CU_ASSERT_EQUAL(strncmp(err, want, strlen(want)), 0);
    unlink(path);
}

int main(void)
{
    if (tls_tree_create() != 0) {
        perror("test_cluster: temporary tls tree");
        tls_tree_remove();
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cluster", NULL, NULL);
    CU_add_test(s, "default", test_default);
    CU_add_test(s, "write_escapes", test_write_escapes);
    CU_add_test(s, "inline_routing_after_utf8", test_inline_routing_after_utf8);
    CU_add_test(s, "inline_routing_line_breaks", test_inline_routing_line_breaks);
    CU_add_test(s, "every_example", test_every_example);
    CU_add_test(s, "examples_shape", test_examples_shape);
    CU_add_test(s, "every_key", test_every_key);
    CU_add_test(s, "bad_files", test_bad_files);
    CU_add_test(s, "tls", test_tls);
    CU_add_test(s, "load_errors", test_load_errors);
    CU_add_test(s, "api_key_file", test_api_key_file);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    tls_tree_remove();
    return failed ? 1 : 0;
}
