/* The router's EndpointPickerConfig loader (router/config.h) and pipeline
 * builder (router/pipeline.h) on any text: rt_config_parse, then
 * rt_pipeline_create, which resolves plugin types, parameters and profile
 * references.
 *
 * Properties: no crash or leak; every failure is TANDEM_ECONFIG (or
 * TANDEM_ENOMEM) with a non-empty, NUL-terminated message naming the
 * source. */
#include <string.h>

#include "config.h"
#include "fuzz.h"
#include "pipeline.h"
#include "tandem_err.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[RT_ERR_MAX];
    struct rt_config *cfg = NULL;
    memset(err, 'x', sizeof err);
    int rc = rt_config_parse(&cfg, (const char *)data, size, "fuzz.yaml", err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(cfg == NULL);
        FUZZ_CHECK(rc == TANDEM_ECONFIG || rc == TANDEM_ETOOBIG || rc == TANDEM_ENOMEM);
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(cfg != NULL);
    for (int i = 0; i < cfg->n_plugins; i++)
        FUZZ_CHECK(cfg->plugins[i].type != NULL && cfg->plugins[i].name != NULL);

    struct rt_pipeline_opts opts = {.max_endpoints = 8, .seed = 1};
    struct rt_pipeline *pl = NULL;
    memset(err, 'x', sizeof err);
    rc = rt_pipeline_create(&pl, cfg, &opts, err, sizeof err);
    if (rc == 0) {
        FUZZ_CHECK(pl != NULL);
        int bs = rt_pipeline_block_size(pl);
        FUZZ_CHECK(bs >= 1);
        rt_pipeline_destroy(pl);
    } else {
        FUZZ_CHECK(rc == TANDEM_ECONFIG || rc == TANDEM_EINVAL || rc == TANDEM_ENOMEM);
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0');
    }
    rt_config_free(cfg);
    return 0;
}
