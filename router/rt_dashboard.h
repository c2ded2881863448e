/* GET /dashboard: the live page of the cluster (docs/api.md, "Dashboard"),
 * kept as router/dashboard/{index.html,dashboard.css,dashboard.js} and
 * compiled in as one self-contained HTML document by cmake/EmbedPage.cmake.
 * The page polls /v1/cluster, /v1/decisions and /metrics. */
#ifndef TANDEM_RT_DASHBOARD_H
#define TANDEM_RT_DASHBOARD_H

#include <stddef.h>

/* The page (static, NUL-terminated); its length in bytes in *len. Any thread. */
const char *rt_dashboard_page(size_t *len);

#endif
