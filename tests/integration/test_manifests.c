/* deploy/kubernetes/ and the Dockerfile against the binaries they run:
 *   - every file parses as YAML (libyaml), every document of it;
 *   - every flag a container passes to a binary exists in that binary's
 *     --help (TANDEM_BIN_DIR), and the command is one of ours;
 *   - every container has readiness and liveness probes on GET /health, on a
 *     port it declares;
 *   - listeners are explicit: the router on 0.0.0.0 (HTTP and announce), the
 *     workers on 0.0.0.0 (control, KV, metrics) with --advertise, announcing
 *     to the router's Service name (tcp://tandem-router:7000), which exists
 *     and exposes that port;
 *   - the routing ConfigMap holds an EndpointPickerConfig, mounted where the
 *     router's --routing points, and tandem-router starts with it;
 *   - kustomization.yaml lists files that exist; the image tag is the
 *     project version; the Dockerfile builds from debian:bookworm with
 *     deploy/install-deps.sh and ships every binary the manifests run. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "harness.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "0.0.0"
#endif

#define MAX_DOCS 32

static const char *src_dir, *bin_dir;

struct doc {
    char file[64];
    yaml_document_t y;
};

static struct doc docs[MAX_DOCS];
static int n_docs, n_files;

/* ---- libyaml helpers ---------------------------------------------------- */

static yaml_node_t *root(struct doc *d)
{
    return yaml_document_get_root_node(&d->y);
}

static const char *scalar(struct doc *d, yaml_node_t *n)
{
    (void)d;
    return n != NULL && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The value under key in mapping n, or NULL. */
static yaml_node_t *get(struct doc *d, yaml_node_t *n, const char *key)
{
    if (n == NULL || n->type != YAML_MAPPING_NODE) {
        return NULL;
    }
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(d, yaml_document_get_node(&d->y, p->key));
        if (k != NULL && strcmp(k, key) == 0) {
            return yaml_document_get_node(&d->y, p->value);
        }
    }
    return NULL;
}

/* get() along a dotted path of mapping keys ("spec.template.spec"). */
static yaml_node_t *path(struct doc *d, yaml_node_t *n, const char *dotted)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", dotted);
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k != NULL && n != NULL;
         k = strtok_r(NULL, ".", &save)) {
        n = get(d, n, k);
    }
    return n;
}

static int seq_len(yaml_node_t *n)
{
    return n != NULL && n->type == YAML_SEQUENCE_NODE
               ? (int)(n->data.sequence.items.top - n->data.sequence.items.start)
               : 0;
}

static yaml_node_t *seq_at(struct doc *d, yaml_node_t *n, int i)
{
    return yaml_document_get_node(&d->y, n->data.sequence.items.start[i]);
}

static const char *str_at(struct doc *d, yaml_node_t *n, const char *dotted)
{
    return scalar(d, path(d, n, dotted));
}

/* ---- Loading ------------------------------------------------------------ */

/* Loads every document of one file; returns the count or -1. */
static int load_file(const char *name)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/deploy/kubernetes/%s", src_dir, name);
    FILE *f = fopen(p, "rb");
    if (f == NULL) {
        fprintf(stderr, "\ncannot open %s\n", p);
        return -1;
    }
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int n = 0;
    for (;;) {
        if (n_docs >= MAX_DOCS) {
            fprintf(stderr, "\n%s: more than %d documents in all\n", p, MAX_DOCS);
            n = -1;
            break;
        }
        struct doc *d = &docs[n_docs];
        if (!yaml_parser_load(&parser, &d->y)) {
            fprintf(stderr, "\n%s:%zu: %s\n", p, parser.problem_mark.line + 1,
                    parser.problem ? parser.problem : "YAML error");
            n = -1;
            break;
        }
        if (yaml_document_get_root_node(&d->y) == NULL) {
            yaml_document_delete(&d->y);
            break;
        }
        snprintf(d->file, sizeof(d->file), "%s", name);
        n_docs++;
        n++;
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return n;
}

static void test_parse(void)
{
    DIR *dir;
    char p[512];
    snprintf(p, sizeof(p), "%s/deploy/kubernetes", src_dir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir = opendir(p));
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".yaml") == 0) {
            int n = load_file(e->d_name);
            CU_ASSERT(n >= 1);
            n_files++;
        }
    }
    closedir(dir);
    CU_ASSERT(n_files >= 5);
    /* Every document names its kind and its name. */
    for (int i = 0; i < n_docs; i++) {
        CU_ASSERT_PTR_NOT_NULL(str_at(&docs[i], root(&docs[i]), "kind"));
        CU_ASSERT_PTR_NOT_NULL(str_at(&docs[i], root(&docs[i]), "apiVersion"));
        const char *kind = str_at(&docs[i], root(&docs[i]), "kind");
        if (kind != NULL && strcmp(kind, "Kustomization") != 0) {
            CU_ASSERT_PTR_NOT_NULL(str_at(&docs[i], root(&docs[i]), "metadata.name"));
        }
    }
}

/* The document of kind with metadata.name, or NULL. */
static struct doc *find(const char *kind, const char *name)
{
    for (int i = 0; i < n_docs; i++) {
        const char *k = str_at(&docs[i], root(&docs[i]), "kind");
        const char *n = str_at(&docs[i], root(&docs[i]), "metadata.name");
        if (k && strcmp(k, kind) == 0 && (name == NULL || (n && strcmp(n, name) == 0))) {
            return &docs[i];
        }
    }
    return NULL;
}

/* ---- Containers against --help ------------------------------------------ */

/* `bin_dir/binary [sub] --help` output (malloc'd), or NULL. */
static char *help_of(const char *binary, const char *sub)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/%s %s --help 2>/dev/null", bin_dir, binary, sub ? sub : "");
    FILE *f = popen(cmd, "r");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 65536, len = 0, n;
    char *buf = malloc(cap);
    while (buf != NULL && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
    }
    int st = pclose(f);
    if (buf == NULL || st != 0) {
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

/* The value following flag in args (a sequence), or NULL. */
static const char *arg_value(struct doc *d, yaml_node_t *args, const char *flag)
{
    for (int i = 0; i + 1 < seq_len(args); i++) {
        const char *a = scalar(d, seq_at(d, args, i));
        if (a != NULL && strcmp(a, flag) == 0) {
            return scalar(d, seq_at(d, args, i + 1));
        }
    }
    return NULL;
}

static const char *or_empty(const char *s)
{
    return s != NULL ? s : "";
}

static int starts(const char *s, const char *prefix)
{
    return s != NULL && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* A port name or number the container declares. */
static int declares_port(struct doc *d, yaml_node_t *c, yaml_node_t *port)
{
    const char *want = scalar(d, port);
    yaml_node_t *ports = get(d, c, "ports");
    for (int i = 0; want != NULL && i < seq_len(ports); i++) {
        yaml_node_t *p = seq_at(d, ports, i);
        const char *name = str_at(d, p, "name"), *num = str_at(d, p, "containerPort");
        if ((name && strcmp(name, want) == 0) || (num && strcmp(num, want) == 0)) {
            return 1;
        }
    }
    return 0;
}

static void check_container(struct doc *d, yaml_node_t *c, int *routers, int *workers)
{
    const char *cname = str_at(d, c, "name");
    yaml_node_t *command = get(d, c, "command"), *args = get(d, c, "args");
    CU_ASSERT_FATAL(seq_len(command) == 1);
    const char *bin = scalar(d, seq_at(d, command, 0));
    const char *base = bin ? (strrchr(bin, '/') ? strrchr(bin, '/') + 1 : bin) : "";
    int is_router = strcmp(base, "tandem-router") == 0;
    int is_worker = strcmp(base, "tandem-prefill") == 0 || strcmp(base, "tandem-decode") == 0;
    const char *sub = NULL;
    int first = 0;
    if (strcmp(base, "tandem") == 0 && seq_len(args) > 0) {
        sub = scalar(d, seq_at(d, args, 0));
        first = 1;
    }
    if (!is_router && !is_worker && sub == NULL) {
        fprintf(stderr, "\n%s: container %s runs '%s', not a Tandem binary\n", d->file, cname, bin);
        CU_FAIL("unknown binary");
        return;
    }
    char *help = help_of(base, sub);
    CU_ASSERT_PTR_NOT_NULL_FATAL(help);
    int flags = 0;
    for (int i = first; i < seq_len(args); i++) {
        const char *a = scalar(d, seq_at(d, args, i));
        if (!starts(a, "--")) {
            continue;
        }
        char want[128];
        size_t len = strcspn(a, "=");
        snprintf(want, sizeof(want), "  %.*s ", (int)len, a);
        flags++;
        if (strstr(help, want) == NULL) {
            fprintf(stderr, "\n%s: container %s passes %.*s, which `%s%s%s --help` does not list\n",
                    d->file, cname, (int)len, a, base, sub ? " " : "", sub ? sub : "");
            CU_FAIL("flag not in --help");
        }
    }
    CU_ASSERT(flags > 0);
    free(help);

    /* Probes on GET /health, on a declared port. */
    const char *probes[] = {"readinessProbe", "livenessProbe"};
    for (int i = 0; i < 2; i++) {
        yaml_node_t *pr = get(d, c, probes[i]);
        const char *p = str_at(d, pr, "httpGet.path");
        if (p == NULL || strcmp(p, "/health") != 0 ||
            !declares_port(d, c, path(d, pr, "httpGet.port"))) {
            fprintf(stderr, "\n%s: container %s: %s is not GET /health on a declared port\n",
                    d->file, cname, probes[i]);
            CU_FAIL("probe");
        }
    }

    /* Explicit listeners. */
    if (is_router) {
        (*routers)++;
        CU_ASSERT(strcmp(or_empty(arg_value(d, args, "--host")), "0.0.0.0") == 0);
        CU_ASSERT(starts(arg_value(d, args, "--announce"), "tcp://0.0.0.0:"));
    }
    if (is_worker) {
        (*workers)++;
        CU_ASSERT(starts(arg_value(d, args, "--control"), "tcp://0.0.0.0:"));
        CU_ASSERT(starts(arg_value(d, args, "--kv"), "tcp://0.0.0.0:"));
        CU_ASSERT(strcmp(or_empty(arg_value(d, args, "--metrics-host")), "0.0.0.0") == 0);
        CU_ASSERT(strcmp(or_empty(arg_value(d, args, "--advertise")), "$(POD_IP)") == 0);
        CU_ASSERT(strcmp(or_empty(arg_value(d, args, "--router")), "tcp://tandem-router:7000") ==
                  0);
    }
}

static void test_flags_and_probes(void)
{
    int routers = 0, workers = 0, prefill = 0, decode = 0;
    for (int i = 0; i < n_docs; i++) {
        struct doc *d = &docs[i];
        const char *kind = str_at(d, root(d), "kind");
        if (kind == NULL || strcmp(kind, "Deployment") != 0) {
            continue;
        }
        yaml_node_t *cs = path(d, root(d), "spec.template.spec.containers");
        CU_ASSERT(seq_len(cs) >= 1);
        for (int k = 0; k < seq_len(cs); k++) {
            yaml_node_t *c = seq_at(d, cs, k);
            const char *image = str_at(d, c, "image");
            CU_ASSERT(image != NULL && strcmp(image, "tandem:" TANDEM_VERSION) == 0);
            const char *bin = scalar(d, seq_at(d, get(d, c, "command"), 0));
            prefill += bin && strcmp(bin, "tandem-prefill") == 0;
            decode += bin && strcmp(bin, "tandem-decode") == 0;
            check_container(d, c, &routers, &workers);
        }
    }
    CU_ASSERT_EQUAL(routers, 1);
    CU_ASSERT_EQUAL(prefill, 1);
    CU_ASSERT_EQUAL(decode, 1);
    CU_ASSERT_EQUAL(workers, 2);
}

static void test_router_service(void)
{
    struct doc *s = find("Service", "tandem-router");
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    yaml_node_t *ports = path(s, root(s), "spec.ports");
    int http = 0, announce = 0;
    for (int i = 0; i < seq_len(ports); i++) {
        const char *p = str_at(s, seq_at(s, ports, i), "port");
        http += p && strcmp(p, "8000") == 0;
        announce += p && strcmp(p, "7000") == 0;
    }
    CU_ASSERT_EQUAL(http, 1);
    CU_ASSERT_EQUAL(announce, 1);
    /* It selects the router's pods. */
    struct doc *d = find("Deployment", "tandem-router");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    /* The label key has dots: looked up with get(), not path(). */
    yaml_node_t *selector = path(s, root(s), "spec.selector");
    yaml_node_t *labels = path(d, root(d), "spec.template.metadata.labels");
    const char *want = scalar(s, get(s, selector, "app.kubernetes.io/name"));
    const char *have = scalar(d, get(d, labels, "app.kubernetes.io/name"));
    CU_ASSERT(want != NULL && have != NULL && strcmp(want, have) == 0);
}

static void test_routing_configmap(void)
{
    struct doc *cm = find("ConfigMap", "tandem-routing");
    CU_ASSERT_PTR_NOT_NULL_FATAL(cm);
    const char *text = scalar(cm, get(cm, path(cm, root(cm), "data"), "routing.yaml"));
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "kind: EndpointPickerConfig"));

    /* Mounted where --routing points. */
    struct doc *d = find("Deployment", "tandem-router");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    yaml_node_t *spec = path(d, root(d), "spec.template.spec");
    yaml_node_t *c = seq_at(d, get(d, spec, "containers"), 0);
    const char *routing = arg_value(d, get(d, c, "args"), "--routing");
    yaml_node_t *mounts = get(d, c, "volumeMounts"), *vols = get(d, spec, "volumes");
    int mounted = 0;
    for (int i = 0; routing && i < seq_len(mounts); i++) {
        yaml_node_t *m = seq_at(d, mounts, i);
        const char *mp = str_at(d, m, "mountPath"), *vn = str_at(d, m, "name");
        char want[512];
        snprintf(want, sizeof(want), "%s/routing.yaml", mp ? mp : "");
        for (int k = 0; vn && strcmp(routing, want) == 0 && k < seq_len(vols); k++) {
            yaml_node_t *v = seq_at(d, vols, k);
            const char *name = str_at(d, v, "name"), *cmn = str_at(d, v, "configMap.name");
            mounted += name && cmn && strcmp(name, vn) == 0 && strcmp(cmn, "tandem-routing") == 0;
        }
    }
    CU_ASSERT_EQUAL(mounted, 1);

    /* The router loads it (same loader and plugin table as in the pod). */
    char file[512];
    snprintf(file, sizeof(file), "%s/routing.yaml", h_tmpdir());
    FILE *f = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
    struct h_proc r;
    const char *args[] = {"--routing", file,          "--port", "0", "--announce",
                          "none",      "--log-level", "warn",   NULL};
    CU_ASSERT_EQUAL_FATAL(h_spawn(&r, "tandem-router", args, 20000), 0);
    CU_ASSERT_EQUAL(h_stop(&r, SIGTERM, 5000), 0);
    unlink(file);
}

static void test_kustomization_and_dockerfile(void)
{
    struct doc *k = find("Kustomization", NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    yaml_node_t *res = get(k, root(k), "resources");
    CU_ASSERT_EQUAL(seq_len(res), n_files - 1); /* every other file */
    for (int i = 0; i < seq_len(res); i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s/deploy/kubernetes/%s", src_dir, scalar(k, seq_at(k, res, i)));
        FILE *f = fopen(p, "r");
        CU_ASSERT_PTR_NOT_NULL(f);
        if (f != NULL) {
            fclose(f);
        }
    }

    char p[512];
    snprintf(p, sizeof(p), "%s/Dockerfile", src_dir);
    FILE *f = fopen(p, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static char df[65536];
    size_t n = fread(df, 1, sizeof(df) - 1, f);
    fclose(f);
    df[n] = '\0';
    CU_ASSERT_PTR_NOT_NULL(strstr(df, "\nFROM debian:bookworm AS build\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(df, "RUN ./deploy/install-deps.sh"));
    const char *bins[] = {"tandem-router", "tandem-prefill", "tandem-decode"};
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof(want), "/src/build/bin/%s ", bins[i]);
        CU_ASSERT_PTR_NOT_NULL(strstr(df, want));
    }
}

static int suite_init(void)
{
    h_init();
    src_dir = getenv("TANDEM_SOURCE_DIR");
    bin_dir = getenv("TANDEM_BIN_DIR");
    if (src_dir == NULL || bin_dir == NULL) {
        fprintf(stderr, "test_manifests: needs TANDEM_SOURCE_DIR and TANDEM_BIN_DIR (ctest)\n");
        return 1;
    }
    return 0;
}

static int suite_fini(void)
{
    for (int i = 0; i < n_docs; i++) {
        yaml_document_delete(&docs[i].y);
    }
    h_cleanup_all();
    return 0;
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("manifests", suite_init, suite_fini);
    CU_add_test(s, "parse", test_parse);
    CU_add_test(s, "flags_and_probes", test_flags_and_probes);
    CU_add_test(s, "router_service", test_router_service);
    CU_add_test(s, "routing_configmap", test_routing_configmap);
    CU_add_test(s, "kustomization_and_dockerfile", test_kustomization_and_dockerfile);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
