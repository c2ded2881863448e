/* The plugin table: every plugin type the configuration may name. Adding a
 * policy = one file in this folder defining a `const struct rt_plugin_ops`,
 * and one entry in RT_PLUGIN_LIST. */
#include "pipeline.h"

#include <string.h>

#define RT_PLUGIN_LIST(X)                                                                          \
    X(rt_decode_filter_ops)                                                                        \
    X(rt_prefill_filter_ops)                                                                       \
    X(rt_prefix_cache_scorer_ops)                                                                  \
    X(rt_precise_prefix_cache_scorer_ops)                                                          \
    X(rt_queue_scorer_ops)                                                                         \
    X(rt_kv_cache_utilization_scorer_ops)                                                          \
    X(rt_load_aware_scorer_ops)                                                                    \
    X(rt_active_request_scorer_ops)                                                                \
    X(rt_session_affinity_scorer_ops)                                                              \
    X(rt_random_scorer_ops)                                                                        \
    X(rt_max_score_picker_ops)                                                                     \
    X(rt_random_picker_ops)                                                                        \
    X(rt_weighted_random_picker_ops)                                                               \
    X(rt_round_robin_picker_ops)                                                                   \
    X(rt_power_of_two_picker_ops)                                                                  \
    X(rt_single_profile_handler_ops)                                                               \
    X(rt_pd_profile_handler_ops)                                                                   \
    X(rt_prefix_based_pd_decider_ops)                                                              \
    X(rt_always_disagg_pd_decider_ops)                                                             \
    X(rt_never_disagg_pd_decider_ops)                                                              \
    X(rt_load_aware_pd_decider_ops)

#define RT_DECLARE(ops) extern const struct rt_plugin_ops ops;
RT_PLUGIN_LIST(RT_DECLARE)
#undef RT_DECLARE

const struct rt_plugin_ops *const rt_plugin_registry[] = {
#define RT_ENTRY(ops) &ops,
    RT_PLUGIN_LIST(RT_ENTRY)
#undef RT_ENTRY
};

const int rt_plugin_registry_len = RT_COUNT(rt_plugin_registry);
