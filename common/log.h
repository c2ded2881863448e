/* Process-wide logging: one line per message on stderr,
 *   2026-11-29T07:40:01.123Z INFO  decode-0 kv: message
 * with UTC time, level, the process's component name and a module tag.
 * Safe to call from any thread (each line is written with one fprintf under
 * the stdio lock). */
#ifndef TANDEM_LOG_H
#define TANDEM_LOG_H

#include <stdarg.h>

enum log_level { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* Sets the component name printed on every line (copied, at most 31 bytes)
 * and the minimum level. Call once from main() before other threads start. */
void log_init(const char *component, enum log_level level);

/* The level names, indexed by enum log_level and NULL-terminated: "debug",
 * "info", "warn", "error". The one list every --log-level flag and every
 * log_level key of a cluster or experiment file takes its choices from. */
extern const char *const log_level_names[];

/* Parses one of log_level_names. Returns 0, or TANDEM_EINVAL. */
int log_level_parse(const char *s, enum log_level *out);

void log_set_level(enum log_level level);
enum log_level log_get_level(void);

void log_msg(enum log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void log_vmsg(enum log_level level, const char *module, const char *fmt, va_list ap);

#define LOG_DEBUG(mod, ...) log_msg(LOG_LEVEL_DEBUG, mod, __VA_ARGS__)
#define LOG_INFO(mod, ...)  log_msg(LOG_LEVEL_INFO, mod, __VA_ARGS__)
#define LOG_WARN(mod, ...)  log_msg(LOG_LEVEL_WARN, mod, __VA_ARGS__)
#define LOG_ERROR(mod, ...) log_msg(LOG_LEVEL_ERROR, mod, __VA_ARGS__)

#endif
