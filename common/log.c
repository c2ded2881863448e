#include "log.h"
#include "tandem_err.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static char log_component[32] = "tandem";
static enum log_level log_min = LOG_LEVEL_INFO;

const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};

/* As printed on each line: upper case, padded to one width. */
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};

void log_init(const char *component, enum log_level level)
{
    if (component != NULL) {
        snprintf(log_component, sizeof(log_component), "%s", component);
    }
    log_min = level;
}

int log_level_parse(const char *s, enum log_level *out)
{
    for (int i = 0; log_level_names[i] != NULL; i++) {
        if (strcmp(s, log_level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

void log_set_level(enum log_level level)
{
    log_min = level;
}

enum log_level log_get_level(void)
{
    return log_min;
}

void log_vmsg(enum log_level level, const char *module, const char *fmt, va_list ap)
{
    if (level < log_min) {
        return;
    }
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);

    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            level_tags[level], log_component, module ? module : "-", msg);
}

void log_msg(enum log_level level, const char *module, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, module, fmt, ap);
    va_end(ap);
}
