/* The restart delay policy: see sv_backoff.h. */
#include "sv_backoff.h"

int sv_backoff_next(const struct sv_backoff *b, int prev_delay_ms, const struct sv_run *run)
{
    int ready = run->ready_ms != SV_NEVER && run->ready_ms >= run->started_ms;
    int healthy = ready && run->died_ms - run->ready_ms >= (int64_t)b->reset_ms;
    if (!ready && b->give_up > 0 && run->failed_before + 1 >= b->give_up) {
        return SV_GIVE_UP;
    }
    /* 64 bits: doubling a delay near INT_MAX must not wrap below the cap. */
    int64_t delay = prev_delay_ms <= 0 || healthy ? b->initial_ms : (int64_t)prev_delay_ms * 2;
    return delay > b->max_ms ? b->max_ms : (int)delay;
}
