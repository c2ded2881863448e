/* A one-shot alarm at an absolute time on a libuv loop, to the tens of
 * microseconds: the live worker ends a sim step on it (worker.c).
 *
 * Why not a uv_timer_t: libuv's timers count whole milliseconds of a loop
 * time truncated to the millisecond, so a step ends 0.5 to 1 ms late on
 * average (measured: 1.2 ms on a loaded 2-core host, 0.14 ms with this), which
 * is several percent of a 20 ms step and would show as overrun. This is a
 * Linux timerfd on CLOCK_MONOTONIC (uv_hrtime's clock) armed at an absolute
 * time and watched by a uv_poll_t, so the kernel's high-resolution timer
 * wakes the loop.
 *
 * Threads: the loop's only. Ownership: struct wk_alarm is the owner's memory
 * (embed it); the descriptor is closed by wk_alarm_close. */
#ifndef TANDEM_WK_ALARM_H
#define TANDEM_WK_ALARM_H

#include <stdint.h>
#include <uv.h>

struct wk_alarm;
typedef void (*wk_alarm_cb)(struct wk_alarm *a);

struct wk_alarm {
    uv_poll_t poll; /* on fd */
    int fd;         /* timerfd; -1 before init and after close */
    int armed;
    wk_alarm_cb cb;
    uv_close_cb close_cb;
    void *data; /* the owner's */
};

/* Creates the timerfd and its poll handle on loop. Returns 0, TANDEM_EIO
 * (no timerfd: errno says why) or TANDEM_EUV. On failure nothing is open. */
int wk_alarm_init(uv_loop_t *loop, struct wk_alarm *a, wk_alarm_cb cb);

/* Calls cb once, from the loop, when uv_hrtime() reaches due_ns (at once
 * when it has); replaces an alarm armed before. */
void wk_alarm_at(struct wk_alarm *a, uint64_t due_ns);

/* Disarms; cb is not called. */
void wk_alarm_stop(struct wk_alarm *a);

/* Disarms and closes; close_cb((uv_handle_t *)&a->poll) runs once the handle
 * and then the descriptor are closed. */
void wk_alarm_close(struct wk_alarm *a, uv_close_cb close_cb);

#endif
