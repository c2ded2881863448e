#include "settings.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

const char *const *settings_choices(const struct setting *s)
{
    return s->choices;
}

static void *at(void *base, const struct setting *s)
{
    return (char *)base + s->off;
}

static const void *cat(const void *base, const struct setting *s)
{
    return (const char *)base + s->off;
}

void settings_defaults(const struct setting *t, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        const struct setting *s = &t[i];
        void *p = at(base, s);
        switch (s->type) {
        case FLAG_STR:
            *(const char **)p = s->def_str;
            break;
        case FLAG_INT:
        case FLAG_BOOL:
        case FLAG_CHOICE:
            *(int *)p = (int)s->def;
            break;
        case FLAG_DOUBLE:
            *(double *)p = s->def;
            break;
        case FLAG_BYTES:
            *(uint64_t *)p = (uint64_t)s->def;
            break;
        }
    }
}

size_t settings_flags(const struct setting *t, size_t n, unsigned skip, void *base,
                      struct flag *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k < cap; i++) {
        const struct setting *s = &t[i];
        if (s->flags & skip) {
            continue;
        }
        out[k++] = (struct flag){
            .name = s->name,
            .type = s->type,
            .dst = at(base, s),
            .help = s->help,
            .min = s->min,
            .max = s->max,
            .choices = settings_choices(s),
        };
    }
    return k;
}

int settings_find(const struct setting *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(t[i].name, name) == 0) {
            return (int)i;
        }
    }
    return -1;
}

int settings_find_key(const struct setting *t, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].key != NULL && strcmp(t[i].key, key) == 0) {
            return (int)i;
        }
    }
    return -1;
}

static int in_range(const struct setting *s, double v)
{
    return s->min >= s->max || (v >= s->min && v <= s->max);
}

static int bad(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad(char *why, size_t len, const char *fmt, ...)
{
    if (len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return TANDEM_EINVAL;
}

/* "a, b, c" */
static void join(char *out, size_t cap, const char *const *list)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; list != NULL && list[i] != NULL && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s%s", i ? ", " : "", list[i]);
        if (w < 0) {
            break;
        }
        n += (size_t)w;
    }
}

static int parse_int(const struct setting *s, const char *text, int *out, char *why, size_t len)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < -2147483647L || v > 2147483647L ||
        !in_range(s, (double)v)) {
        return s->min < s->max ? bad(why, len, "expected an integer in [%.0f, %.0f], got '%s'",
                                     s->min, s->max, text)
                               : bad(why, len, "expected an integer, got '%s'", text);
    }
    *out = (int)v;
    return 0;
}

static int parse_double(const struct setting *s, const char *text, double *out, char *why,
                        size_t len)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(v) || !in_range(s, v)) {
        return s->min < s->max
                   ? bad(why, len, "expected a number in [%g, %g], got '%s'", s->min, s->max, text)
                   : bad(why, len, "expected a number, got '%s'", text);
    }
    *out = v;
    return 0;
}

int settings_parse_value(const struct setting *s, const char *text, void *base, char *why,
                         size_t whylen)
{
    void *p = at(base, s);
    switch (s->type) {
    case FLAG_STR:
        if (s->check != NULL && s->check(text) != 0) {
            return bad(why, whylen, "expected %s, got '%s'", s->check_what, text);
        }
        *(const char **)p = text;
        return 0;
    case FLAG_INT:
        return parse_int(s, text, (int *)p, why, whylen);
    case FLAG_DOUBLE:
        return parse_double(s, text, (double *)p, why, whylen);
    case FLAG_BOOL:
        if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0) {
            *(int *)p = text[0] == 't';
            return 0;
        }
        return bad(why, whylen, "expected true or false, got '%s'", text);
    case FLAG_BYTES: {
        uint64_t v;
        if (flags_parse_bytes(text, &v) != 0 || v == 0 || !in_range(s, (double)v)) {
            return bad(why, whylen, "expected a byte count such as 40GiB, 512MiB or 1e9, got '%s'",
                       text);
        }
        *(uint64_t *)p = v;
        return 0;
    }
    case FLAG_CHOICE: {
        const char *const *ch = settings_choices(s);
        for (int i = 0; ch != NULL && ch[i] != NULL; i++) {
            if (strcmp(ch[i], text) == 0) {
                *(int *)p = i;
                return 0;
            }
        }
        char names[512];
        join(names, sizeof(names), ch);
        return bad(why, whylen, "expected one of %s, got '%s'", names, text);
    }
    }
    return TANDEM_EINVAL;
}

int settings_format(const struct setting *s, const void *base, char *buf, size_t len)
{
    const void *p = cat(base, s);
    int w = 0;
    switch (s->type) {
    case FLAG_STR: {
        const char *v = *(const char *const *)p;
        w = snprintf(buf, len, "%s", v != NULL ? v : "");
        break;
    }
    case FLAG_INT:
        w = snprintf(buf, len, "%d", *(const int *)p);
        break;
    case FLAG_DOUBLE:
        w = snprintf(buf, len, "%.17g", *(const double *)p);
        break;
    case FLAG_BOOL:
        w = snprintf(buf, len, "%s", *(const int *)p ? "true" : "false");
        break;
    case FLAG_BYTES:
        w = snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case FLAG_CHOICE: {
        const char *const *ch = settings_choices(s);
        w = snprintf(buf, len, "%s", ch != NULL ? ch[*(const int *)p] : "");
        break;
    }
    }
    return w < 0 || (size_t)w >= len ? TANDEM_ETOOBIG : 0;
}

int settings_equal(const struct setting *s, const void *a, const void *b)
{
    const void *x = cat(a, s), *y = cat(b, s);
    switch (s->type) {
    case FLAG_STR: {
        const char *u = *(const char *const *)x, *v = *(const char *const *)y;
        return u == v || (u != NULL && v != NULL && strcmp(u, v) == 0);
    }
    case FLAG_INT:
    case FLAG_BOOL:
    case FLAG_CHOICE:
        return *(const int *)x == *(const int *)y;
    case FLAG_DOUBLE:
        return *(const double *)x == *(const double *)y;
    case FLAG_BYTES:
        return *(const uint64_t *)x == *(const uint64_t *)y;
    }
    return 0;
}

void settings_copy(const struct setting *s, void *dst, const void *src)
{
    static const size_t sizes[] = {
        [FLAG_STR] = sizeof(const char *), [FLAG_INT] = sizeof(int),
        [FLAG_DOUBLE] = sizeof(double),    [FLAG_BOOL] = sizeof(int),
        [FLAG_BYTES] = sizeof(uint64_t),   [FLAG_CHOICE] = sizeof(int),
    };
    memcpy(at(dst, s), cat(src, s), sizes[s->type]);
}
