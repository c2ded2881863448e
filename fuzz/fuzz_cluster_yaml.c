/* `tandem up` cluster files (tools/cluster.h) on any text: cluster_parse,
 * which also validates the routing (file or inline) through the router's
 * loader and plugin table.
 *
 * Relative paths resolve against a directory that does not exist, so the
 * result depends on the input alone (absolute paths that exist on the
 * machine are the exception, and are as stable as the machine).
 *
 * Properties: no crash or leak; a failure leaves *out NULL with a message; a
 * cluster that loads is written by cluster_write into a file that loads
 * again and writes back the same bytes (the fixed point `tandem up` relies
 * on: it hands workers what it wrote), and its inline routing, written by
 * cluster_write_routing, loads with the router's own loader. */
#include <stdio.h>
#include <string.h>

#include "cluster.h"
#include "config.h"
#include "fuzz.h"
#include "tandem_err.h"

#define BASE_DIR "/nonexistent/tandem-fuzz"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    return 0;
}

/* cluster_write into a new string (free()); *len its length. */
static char *write_mem(const struct cluster *c, size_t *len,
                       int (*writer)(const struct cluster *, FILE *))
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    FUZZ_CHECK(f != NULL);
    int rc = writer(c, f);
    FUZZ_CHECK(fclose(f) == 0);
    FUZZ_CHECK(rc == 0);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[CLUSTER_ERR_MAX];
    struct cluster *c = NULL;
    int rc = cluster_parse(&c, (const char *)data, size, "fuzz.yaml", BASE_DIR, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(c == NULL && rc < 0);
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
        FUZZ_CHECK(rc == TANDEM_ENOMEM || err[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(c != NULL);
    int workers = cluster_worker_count(c);
    FUZZ_CHECK(workers >= 0 && workers <= CLUSTER_N_ROLES * CLUSTER_MAX_POOL);

    size_t alen = 0, blen = 0;
    char *a = write_mem(c, &alen, cluster_write);
    struct cluster *again = NULL;
    rc = cluster_parse(&again, a, alen, "fuzz.yaml", BASE_DIR, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "written cluster does not load: %s\n---\n%s---\n", err, a);
    FUZZ_CHECK(rc == 0);
    char *b = write_mem(again, &blen, cluster_write);
    if (alen != blen || memcmp(a, b, alen) != 0)
        fprintf(stderr, "not a fixed point:\n---\n%s---\n%s---\n", a, b);
    FUZZ_CHECK(alen == blen && memcmp(a, b, alen) == 0);

    if (c->routing_text != NULL) {
        size_t rlen = 0;
        char *r = write_mem(c, &rlen, cluster_write_routing);
        struct rt_config *cfg = NULL;
        char rerr[RT_ERR_MAX];
        rc = rt_config_parse(&cfg, r, rlen, "routing.yaml", rerr, sizeof rerr);
        if (rc != 0)
            fprintf(stderr, "inline routing does not load: %s\n---\n%s---\n", rerr, r);
        FUZZ_CHECK(rc == 0);
        rt_config_free(cfg);
        free(r);
    }
    free(a);
    free(b);
    cluster_free(again);
    cluster_free(c);
    return 0;
}
