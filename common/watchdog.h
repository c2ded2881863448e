/* A stop watchdog: ends the process if a shutdown does not finish in time.
 *
 * NNG 1.5.2 (Debian 12's) can wedge its process-wide reaper when a socket's
 * pipe is closed locally while a message is half read on it
 * (docs/nng-close-deadlock.md); every later nng_close then blocks for good.
 * uvnng avoids that at exit (uvnng_set_exiting); the watchdog is what is
 * left if a stop hangs anyway. A fired watchdog is a failure, not a clean
 * stop: it says why on stderr and exits WATCHDOG_EXIT (70, EX_SOFTWARE), and
 * every integration test's clean-stop check expects 0. */
#ifndef TANDEM_WATCHDOG_H
#define TANDEM_WATCHDOG_H

/* Exit status of a process its stop watchdog ended (sysexits' EX_SOFTWARE). */
#define WATCHDOG_EXIT 70

/* Environment variable that overrides the seconds given to watchdog_start (a
 * whole number, 0..86400); 0 fires at the start of the stop, for tests of
 * the clean-stop checks. */
#define WATCHDOG_ENV "TANDEM_STOP_WATCHDOG_S"

/* Starts a detached thread that, seconds from now (or WATCHDOG_ENV's value),
 * writes "<prog>: stop watchdog: shutdown still blocked after N s ...;
 * exiting with status 70" to stderr and calls _exit(WATCHDOG_EXIT). With 0
 * seconds it does so at once, on the calling thread. Call it once, when the
 * stop begins (a signal); a process that finishes first never sees it.
 * Returns 0, or TANDEM_ENOMEM when no thread could be started (the stop then
 * goes on without a watchdog). prog must outlive the process (a literal). */
int watchdog_start(const char *prog, unsigned seconds);

#endif
