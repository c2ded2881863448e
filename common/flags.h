/* Command-line flags for every Tandem binary: a table of struct flag, parsed
 * in one call, with --help generated from the same table (every flag with its
 * default). Accepts --name value and --name=value; booleans take no value
 * (--name) or an explicit --name=true|false.
 *
 * Convention (issue: "every binary"): main() prints flags_usage on --help and
 * exits 0, prints the version on --version and exits 0, and on a parse error
 * prints the message (which names the flag) and exits 2.
 *
 * A table describes where values go, not what they are: settings that also
 * appear in cluster files and experiments are described once in a struct
 * setting table (common/settings.h), which builds its struct flag entries.
 *
 * Ownership: the table and argv are the caller's; FLAG_STR values point into
 * argv (nothing is copied or allocated), so argv must outlive them.
 * Threads: no state of its own; call from one thread per table.
 * Errors: TANDEM_EINVAL with a message naming the flag in err; *dst of the
 * flags parsed before the error may already hold new values. */
#ifndef TANDEM_FLAGS_H
#define TANDEM_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum flag_type {
    FLAG_STR,    /* const char **dst; points into argv, not copied */
    FLAG_INT,    /* int *dst; decimal, range [min, max] when min < max */
    FLAG_DOUBLE, /* double *dst; range [min, max] when min < max */
    FLAG_BOOL,   /* int *dst; set to 1, or 0 with --name=false */
    FLAG_BYTES,  /* uint64_t *dst; 1e9, 140GB, 80GiB, 512MiB, 4096 */
    FLAG_CHOICE, /* int *dst = index into choices (NULL-terminated) */
};

struct flag {
    const char *name; /* without the leading "--" */
    enum flag_type type;
    void *dst;
    const char *help;
    double min, max;            /* numeric range; ignored when min >= max */
    const char *const *choices; /* FLAG_CHOICE only */
};

enum { FLAGS_OK = 0, FLAGS_HELP = 1, FLAGS_VERSION = 2 };

/* Parses argv[first..argc). Stops at the first argument that does not start
 * with "--" (or after "--") and stores its index in *rest when rest is not
 * NULL; without rest, a positional argument is an error. Returns FLAGS_OK,
 * FLAGS_HELP (--help or -h), FLAGS_VERSION (--version), or TANDEM_EINVAL
 * with a message naming the flag in err. Values already in *dst are the
 * defaults shown by flags_usage, so set them before calling. */
int flags_parse(const struct flag *flags, size_t n, int argc, char **argv, int first, int *rest,
                char *err, size_t errlen);

/* Prints "usage: prog summary", then one line per flag: name, value kind,
 * help and the current value of *dst as the default. */
void flags_usage(FILE *out, const char *usage, const struct flag *flags, size_t n);

/* Parses a byte count: a non-negative number (decimal or exponent form)
 * with an optional unit: B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB,
 * TiB (powers of 1024), case-insensitive. Returns 0 or TANDEM_EINVAL. */
int flags_parse_bytes(const char *s, uint64_t *out);

#define FLAGS_COUNT(a) (sizeof(a) / sizeof((a)[0]))

#endif
