/* The restart delay of a supervised process (tools/supervise.h), as a pure
 * function of one run's times, so it can be tested with a fake clock.
 *
 * The policy (docs/up.md, "Supervision"): the first restart waits initial_ms;
 * each further one waits twice the previous delay, never more than max_ms;
 * a run that was ready for reset_ms or longer before it died starts the
 * sequence again at initial_ms. A run that never became ready never resets
 * it. With initial_ms > max_ms every delay is max_ms.
 *
 * Giving up: a run that never became ready, after give_up - 1 runs in a row
 * that did not either, is not restarted (SV_GIVE_UP): the process cannot
 * start, and a loop of restarts would only hide why.
 *
 * Threads: any (no state). */
#ifndef TANDEM_SV_BACKOFF_H
#define TANDEM_SV_BACKOFF_H

#include <stdint.h>

/* `tandem up`'s defaults (--restart-backoff, --restart-backoff-max,
 * --healthy-reset). */
#define SV_BACKOFF_INITIAL_MS 500
#define SV_BACKOFF_MAX_MS     10000
#define SV_BACKOFF_RESET_MS   30000
#define SV_BACKOFF_GIVE_UP    3 /* start-up failures in a row before giving up */

#define SV_GIVE_UP (-1) /* sv_backoff_next: do not restart */

#define SV_NEVER (-1) /* sv_run.ready_ms of a run that never became ready */

struct sv_backoff {
    int initial_ms; /* first delay, > 0 */
    int max_ms;     /* longest delay, > 0 */
    int reset_ms;   /* ready this long: back to initial_ms */
    int give_up;    /* this many runs in a row never ready: no restart (0: never give up) */
};

/* One run, on one monotonic clock in ms (uv_now in the supervisor). */
struct sv_run {
    int64_t started_ms;
    int64_t ready_ms; /* when it became ready, or SV_NEVER */
    int64_t died_ms;
    int failed_before; /* runs right before this one that ended before becoming ready */
};

/* The delay before restarting the process whose run ended as described.
 * prev_delay_ms is the delay before the restart that began this run, 0 when
 * this was the first run. A ready_ms before started_ms (a previous run's)
 * counts as never ready. Returns a delay in [min(initial_ms, max_ms),
 * max_ms], or SV_GIVE_UP when this run never became ready and it makes
 * give_up such runs in a row. */
int sv_backoff_next(const struct sv_backoff *b, int prev_delay_ms, const struct sv_run *run);

#endif
