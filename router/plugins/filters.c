/* decode-filter and prefill-filter: keep endpoints by role, as llm-d's
 * filters keep pods by their llm-d.ai/role label. A colocated worker (llm-d's
 * "both") passes decode-filter; prefill-filter keeps prefill workers only. */
#include "pipeline.h"

static int decode_filter(struct rt_plugin *p, struct rt_cycle *c, const int *in, int n, int *out)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (rt_role_can_decode(rt_pipeline_ep(c->pl, in[i])->role))
            out[k++] = in[i];
    return k;
}

static int prefill_filter(struct rt_plugin *p, struct rt_cycle *c, const int *in, int n, int *out)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (rt_role_can_prefill_remote(rt_pipeline_ep(c->pl, in[i])->role))
            out[k++] = in[i];
    return k;
}

const struct rt_plugin_ops rt_decode_filter_ops = {
    .type = "decode-filter",
    .kind = RT_KIND_FILTER,
    .filter = decode_filter,
};

const struct rt_plugin_ops rt_prefill_filter_ops = {
    .type = "prefill-filter",
    .kind = RT_KIND_FILTER,
    .filter = prefill_filter,
};
