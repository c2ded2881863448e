/* What a worker's own messages tell the scheduling pipeline: the load of a
 * Heartbeat and the prefix-cache changes of KvEvents (docs/protocol.md,
 * "Worker flows"). Pure: the live registry (registry.c) calls these for
 * messages from a control link, the offline simulator (simulate/) for the
 * same messages in modelled time, so routing sees the same state either way.
 *
 * Threading: the pipeline's thread. */
#ifndef TANDEM_RT_FEED_H
#define TANDEM_RT_FEED_H

#include <stdint.h>

#include "pipeline.h"
#include "tandem.pb-c.h"

/* The KvEvents sequence of one endpoint's link. Zero it when a link (re)starts. */
struct rt_feed_seq {
    uint64_t last; /* last KvEvents.seq applied */
    int known;     /* 0 until the first KvEvents */
    uint64_t gaps; /* sequence gaps seen (each reset the endpoint's index) */
};

/* The endpoint a WorkerHello describes (pointers into h). Returns 0, or
 * TANDEM_EINVAL for an unknown role or an id or address too long. */
int rt_feed_hello_info(const Tandem__WorkerHello *h, struct rt_endpoint_info *info);

/* Sets endpoint ep's load from hb. Returns rt_pipeline_endpoint_set_load's result. */
int rt_feed_heartbeat(struct rt_pipeline *pl, int ep, const Tandem__Heartbeat *hb);

/* Applies ke to endpoint ep's entries of the prefix index. A gap in the
 * sequence, or an event the index cannot apply, resets the endpoint's
 * entries (they resync from the events that follow); name (the endpoint's
 * id) is for the warning logged then. */
void rt_feed_kv_events(struct rt_pipeline *pl, int ep, const char *name, struct rt_feed_seq *seq,
                       const Tandem__KvEvents *ke);

/* The smallest context the healthy decode-capable endpoints announced; 0
 * when none did (rt_core_host.learned_context). */
int rt_feed_max_context(const struct rt_pipeline *pl);

#endif
