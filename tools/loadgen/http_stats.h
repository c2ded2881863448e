/* The HTTP client's connection counters (http_client.h fills them), apart
 * from the client so a run result can carry them without libuv. Plain data. */
#ifndef TANDEM_LG_HTTP_STATS_H
#define TANDEM_LG_HTTP_STATS_H

#include <stdint.h>

struct lg_http_client_stats {
    uint64_t connections_opened;
    uint64_t connections_reused; /* requests sent on an idle connection */
    uint64_t retries;
    unsigned open;      /* connections now */
    unsigned idle;      /* of which idle */
    unsigned peak_open; /* most connections open at once */
};

#endif
