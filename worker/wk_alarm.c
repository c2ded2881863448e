#include "wk_alarm.h"

#include <errno.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "tandem_err.h"

static void on_readable(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct wk_alarm *a = h->data;
    uint64_t expirations;
    /* EAGAIN: disarmed (or re-armed) after the kernel woke the poll. */
    if (read(a->fd, &expirations, sizeof(expirations)) != (ssize_t)sizeof(expirations) ||
        !a->armed) {
        return;
    }
    a->armed = 0;
    uv_poll_stop(&a->poll);
    a->cb(a);
}

int wk_alarm_init(uv_loop_t *loop, struct wk_alarm *a, wk_alarm_cb cb)
{
    *a = (struct wk_alarm){.fd = -1, .cb = cb};
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) {
        return TANDEM_EIO;
    }
    if (uv_poll_init(loop, &a->poll, fd) != 0) {
        close(fd);
        return TANDEM_EUV;
    }
    a->fd = fd;
    a->poll.data = a;
    return 0;
}

static void settime(struct wk_alarm *a, uint64_t due_ns)
{
    /* it_value 0 disarms: a time in the past is 1 ns after the clock's origin. */
    struct itimerspec its = {.it_value = {.tv_sec = (time_t)(due_ns / 1000000000u),
                                          .tv_nsec = (long)(due_ns % 1000000000u)}};
    if (due_ns == 0) {
        its.it_value.tv_nsec = 1;
    }
    timerfd_settime(a->fd, TFD_TIMER_ABSTIME, &its, NULL);
}

void wk_alarm_at(struct wk_alarm *a, uint64_t due_ns)
{
    settime(a, due_ns);
    if (!a->armed) {
        uv_poll_start(&a->poll, UV_READABLE, on_readable);
        a->armed = 1;
    }
}

void wk_alarm_stop(struct wk_alarm *a)
{
    if (a->armed) {
        struct itimerspec off = {0};
        timerfd_settime(a->fd, 0, &off, NULL);
        uv_poll_stop(&a->poll);
        a->armed = 0;
    }
}

static void on_closed(uv_handle_t *h)
{
    struct wk_alarm *a = h->data;
    close(a->fd); /* after the handle, as libuv asks of a polled descriptor */
    a->fd = -1;
    a->close_cb(h);
}

void wk_alarm_close(struct wk_alarm *a, uv_close_cb close_cb)
{
    wk_alarm_stop(a);
    a->close_cb = close_cb;
    uv_close((uv_handle_t *)&a->poll, on_closed);
}
