/* What a worker's messages tell the pipeline: see rt_feed.h. */
#include "rt_feed.h"

#include <string.h>

#include "log.h"
#include "tandem_err.h"

static int role_of(Tandem__WorkerHello__Role r, enum rt_role *out)
{
    switch (r) {
    case TANDEM__WORKER_HELLO__ROLE__PREFILL:
        *out = RT_ROLE_PREFILL;
        return 0;
    case TANDEM__WORKER_HELLO__ROLE__DECODE:
        *out = RT_ROLE_DECODE;
        return 0;
    case TANDEM__WORKER_HELLO__ROLE__COLOCATED:
        *out = RT_ROLE_COLOCATED;
        return 0;
    default:
        return TANDEM_EINVAL;
    }
}

int rt_feed_hello_info(const Tandem__WorkerHello *h, struct rt_endpoint_info *info)
{
    if (role_of(h->role, &info->role) != 0 || strlen(h->worker_id) >= RT_ID_MAX ||
        strlen(h->control_address) >= RT_ADDR_MAX || strlen(h->kv_address) >= RT_ADDR_MAX) {
        return TANDEM_EINVAL;
    }
    info->id = h->worker_id;
    info->control_addr = h->control_address;
    info->data_addr = h->kv_address[0] ? h->kv_address : NULL;
    info->block_size = (int)h->block_size;
    info->max_running = h->max_running_seqs;
    info->max_context = h->max_context;
    return 0;
}

int rt_feed_heartbeat(struct rt_pipeline *pl, int ep, const Tandem__Heartbeat *hb)
{
    struct rt_load load = {
        .waiting = hb->waiting,
        .running = hb->running,
        .prefill_tokens_queued = hb->prefill_tokens_queued,
        .kv_blocks_used = hb->kv_blocks_used,
        .kv_blocks_total = hb->kv_blocks_total,
        .kv_blocks_cached_idle = hb->kv_blocks_cached_idle,
        .timestamp_ms = hb->timestamp_ms,
        .prefix_cache_queries = hb->prefix_cache_queries,
        .prefix_cache_hits = hb->prefix_cache_hits,
        .kv_bytes_sent = hb->kv_bytes_sent,
        .kv_bytes_received = hb->kv_bytes_received,
    };
    return rt_pipeline_endpoint_set_load(pl, ep, &load);
}

static enum rt_kv_event kind_of(Tandem__KvEvent__Kind k)
{
    switch (k) {
    case TANDEM__KV_EVENT__KIND__STORED:
        return RT_KV_STORED;
    case TANDEM__KV_EVENT__KIND__REMOVED:
        return RT_KV_REMOVED;
    default:
        return RT_KV_ALL_CLEARED;
    }
}

void rt_feed_kv_events(struct rt_pipeline *pl, int ep, const char *name, struct rt_feed_seq *seq,
                       const Tandem__KvEvents *ke)
{
    if (seq->known && ke->seq != seq->last + 1) {
        seq->gaps++;
        LOG_WARN("registry", "endpoint %s: KV events seq %llu after %llu: prefix index reset", name,
                 (unsigned long long)ke->seq, (unsigned long long)seq->last);
        rt_pipeline_endpoint_reset_cache(pl, ep);
    }
    seq->last = ke->seq;
    seq->known = 1;
    for (size_t i = 0; i < ke->n_events; i++) {
        const Tandem__KvEvent *ev = ke->events[i];
        int rc = rt_pipeline_kv_event(pl, ep, kind_of(ev->kind), ev->block_hashes,
                                      (int)ev->n_block_hashes);
        if (rc != 0) {
            LOG_WARN("registry", "endpoint %s: KV event not applied (%s): prefix index reset", name,
                     tandem_strerror(rc));
            rt_pipeline_endpoint_reset_cache(pl, ep);
        }
    }
}

int rt_feed_max_context(const struct rt_pipeline *pl)
{
    int best = 0, max = rt_pipeline_endpoints_hi(pl); /* per request: not all 1024 slots */
    for (int ep = 0; ep < max; ep++) {
        const struct rt_endpoint *e = rt_pipeline_endpoint(pl, ep);
        if (e != NULL && e->in_use && e->healthy && rt_role_can_decode(e->role) &&
            e->max_context > 0 && (best == 0 || (int)e->max_context < best)) {
            best = (int)e->max_context;
        }
    }
    return best;
}
