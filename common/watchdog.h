/* A stop watchdog: ends the process if a shutdown does not finish in time.
 *
 * NNG 1.5 (Debian 12's) can deadlock in nng_close when pipes come and go
 * around it (reported upstream as nanomsg/nng#1543 and #1813): the thread
 * that closes stays blocked for good. Router and workers end every request
 * and flush what they owe before they close NNG sockets, so a process stuck
 * there has nothing left to lose; the watchdog ends it with the status a clean
 * stop has, after saying why on stderr. */
#ifndef TANDEM_WATCHDOG_H
#define TANDEM_WATCHDOG_H

/* Starts a detached thread that, seconds from now, writes "<prog>: shutdown
 * still blocked ... exiting" to stderr and calls _exit(0). Call it once, when
 * the stop begins (a signal); a process that finishes first never sees it.
 * Returns 0, or TANDEM_ENOMEM when no thread could be started (the stop then
 * goes on without a watchdog). prog must outlive the process (a literal). */
int watchdog_start(const char *prog, unsigned seconds);

#endif
