#include "flags.h"
#include "tandem_err.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int flags_parse_bytes(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        {"kb", 1e3},
        {"mb", 1e6},
        {"gb", 1e9},
        {"tb", 1e12},
        {"k", 1e3},
        {"m", 1e6},
        {"g", 1e9},
        {"t", 1e12},
        {"kib", 1024.0},
        {"mib", 1048576.0},
        {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
    };
    if (s == NULL || *s == '\0' || *s == '-') {
        return TANDEM_EINVAL;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) {
        return TANDEM_EINVAL;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].unit) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551616.0) {
                return TANDEM_EINVAL;
            }
            *out = (uint64_t)llround(b);
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

static const struct flag *find_flag(const struct flag *flags, size_t n, const char *name,
                                    size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0) {
            return &flags[i];
        }
    }
    return NULL;
}

static int in_range(const struct flag *f, double v)
{
    return f->min >= f->max || (v >= f->min && v <= f->max);
}

static int set_value(const struct flag *f, const char *val, char *err, size_t errlen)
{
    char *end;
    switch (f->type) {
    case FLAG_STR:
        *(const char **)f->dst = val;
        return 0;
    case FLAG_INT: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno != 0 || end == val || *end != '\0' || v < -2147483647L || v > 2147483647L) {
            snprintf(err, errlen, "--%s: '%s' is not an integer", f->name, val);
            return TANDEM_EINVAL;
        }
        if (!in_range(f, (double)v)) {
            snprintf(err, errlen, "--%s: %ld is out of range [%g, %g]", f->name, v, f->min, f->max);
            return TANDEM_EINVAL;
        }
        *(int *)f->dst = (int)v;
        return 0;
    }
    case FLAG_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno != 0 || end == val || *end != '\0' || !isfinite(v)) {
            snprintf(err, errlen, "--%s: '%s' is not a number", f->name, val);
            return TANDEM_EINVAL;
        }
        if (!in_range(f, v)) {
            snprintf(err, errlen, "--%s: %g is out of range [%g, %g]", f->name, v, f->min, f->max);
            return TANDEM_EINVAL;
        }
        *(double *)f->dst = v;
        return 0;
    }
    case FLAG_BOOL:
        if (strcmp(val, "true") == 0 || strcmp(val, "1") == 0) {
            *(int *)f->dst = 1;
        } else if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0) {
            *(int *)f->dst = 0;
        } else {
            snprintf(err, errlen, "--%s: '%s' is not true or false", f->name, val);
            return TANDEM_EINVAL;
        }
        return 0;
    case FLAG_BYTES: {
        uint64_t v;
        if (flags_parse_bytes(val, &v) != 0) {
            snprintf(err, errlen, "--%s: '%s' is not a byte count (e.g. 4096, 140e9, 80GB, 4GiB)",
                     f->name, val);
            return TANDEM_EINVAL;
        }
        if (!in_range(f, (double)v)) {
            snprintf(err, errlen, "--%s: %s is out of range [%g, %g]", f->name, val, f->min,
                     f->max);
            return TANDEM_EINVAL;
        }
        *(uint64_t *)f->dst = v;
        return 0;
    }
    case FLAG_CHOICE:
        for (int i = 0; f->choices[i] != NULL; i++) {
            if (strcmp(val, f->choices[i]) == 0) {
                *(int *)f->dst = i;
                return 0;
            }
        }
        {
            size_t off = (size_t)snprintf(err, errlen, "--%s: '%s' is not one of", f->name, val);
            for (int i = 0; f->choices[i] != NULL && off < errlen; i++) {
                off += (size_t)snprintf(err + off, errlen - off, " %s", f->choices[i]);
            }
        }
        return TANDEM_EINVAL;
    }
    return TANDEM_EINVAL;
}

int flags_parse(const struct flag *flags, size_t n, int argc, char **argv, int first, int *rest,
                char *err, size_t errlen)
{
    int i = first;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            return FLAGS_HELP;
        }
        if (strcmp(a, "--version") == 0) {
            return FLAGS_VERSION;
        }
        if (strncmp(a, "--", 2) != 0) {
            break;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct flag *f = find_flag(flags, n, name, len);
        if (f == NULL) {
            snprintf(err, errlen, "unknown flag --%.*s (see --help)", (int)len, name);
            return TANDEM_EINVAL;
        }
        const char *val;
        if (eq != NULL) {
            val = eq + 1;
        } else if (f->type == FLAG_BOOL) {
            val = "true";
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            snprintf(err, errlen, "--%s needs a value", f->name);
            return TANDEM_EINVAL;
        }
        int rc = set_value(f, val, err, errlen);
        if (rc != 0) {
            return rc;
        }
    }
    if (rest != NULL) {
        *rest = i;
    } else if (i < argc) {
        snprintf(err, errlen, "unexpected argument '%s' (see --help)", argv[i]);
        return TANDEM_EINVAL;
    }
    return FLAGS_OK;
}

static void print_default(FILE *out, const struct flag *f)
{
    switch (f->type) {
    case FLAG_STR: {
        const char *s = *(const char **)f->dst;
        fprintf(out, "%s", s && *s ? s : "(none)");
        break;
    }
    case FLAG_INT:
        fprintf(out, "%d", *(int *)f->dst);
        break;
    case FLAG_DOUBLE:
        fprintf(out, "%g", *(double *)f->dst);
        break;
    case FLAG_BOOL:
        fprintf(out, "%s", *(int *)f->dst ? "true" : "false");
        break;
    case FLAG_BYTES:
        fprintf(out, "%llu", (unsigned long long)*(uint64_t *)f->dst);
        break;
    case FLAG_CHOICE:
        fprintf(out, "%s", f->choices[*(int *)f->dst]);
        break;
    }
}

void flags_usage(FILE *out, const char *usage, const struct flag *flags, size_t n)
{
    static const char *const kinds[] = {"STR", "N", "X", "", "BYTES", "CHOICE"};
    fprintf(out, "usage: %s\n\nflags:\n", usage);
    for (size_t i = 0; i < n; i++) {
        const struct flag *f = &flags[i];
        char lhs[64];
        snprintf(lhs, sizeof(lhs), "--%s%s%s", f->name, f->type == FLAG_BOOL ? "" : " ",
                 kinds[f->type]);
        fprintf(out, "  %-28s %s", lhs, f->help);
        if (f->type == FLAG_CHOICE) {
            fprintf(out, " (");
            for (int c = 0; f->choices[c] != NULL; c++) {
                fprintf(out, "%s%s", c ? "|" : "", f->choices[c]);
            }
            fprintf(out, ")");
        }
        fprintf(out, " [default: ");
        print_default(out, f);
        fprintf(out, "]\n");
    }
    fprintf(out, "  %-28s %s\n  %-28s %s\n", "--help", "print this help and exit", "--version",
            "print the version and exit");
}
