/* The router's default EndpointPickerConfig, for the router (no --routing)
 * and for `tandem up` (a cluster without routing): one copy, the text of
 * deploy/routing/pd-prefix-precise.yaml (pd-prefix-based.yaml with the
 * precise, KV-event prefix index), compiled in at build time by
 * router/CMakeLists.txt (default_routing.c.in). */
#ifndef TANDEM_DEFAULT_ROUTING_H
#define TANDEM_DEFAULT_ROUTING_H

/* NUL-terminated, static; any thread. */
const char *rt_default_routing(void);

#endif
