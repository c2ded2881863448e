/* One description per setting (issue 13): a table of struct setting, each
 * entry naming a field of a config struct (by offset) with its type, default,
 * range, allowed values and help. From that one table come
 *   - the command-line flags (settings_flags: struct flag for common/flags,
 *     so --help and the flag errors are those of every other binary),
 *   - the key in cluster files and experiment overrides, with the checks and
 *     the messages of those files (settings_parse_value),
 *   - the value as text, for the argv `tandem up` builds and for cluster
 *     files it writes (settings_format).
 * The worker's table is wk_settings (worker/wk_config.h).
 *
 * Ownership: tables are static and const. The functions read or write the
 * config struct the caller passes (base); FLAG_STR values are pointers that
 * the caller owns (settings_* never allocate or free them).
 * Threads: pure functions, any thread.
 * Errors: TANDEM_EINVAL with a message (without the key: the caller adds the
 * key or flag it was read under) in why. */
#ifndef TANDEM_SETTINGS_H
#define TANDEM_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "flags.h"

/* Where a setting appears besides the command line (struct setting.flags). */
#define SETTING_POOL     (1u << 0) /* a key of pools.<role> in cluster files */
#define SETTING_OVERRIDE (1u << 1) /* a key of an experiment's cluster_overrides */
#define SETTING_MANAGED  (1u << 2) /* set by `tandem up` itself, refused in a pool's args */
#define SETTING_PATH                                                                               \
    (1u << 3)                             /* FLAG_STR: a readable file (cluster files resolve it   \
                                             against their directory) */
#define SETTING_TAG(i) (1u << (16 + (i))) /* free for the table's owner */

/* Settings per table: a mask of uint64_t marks which were given. */
#define SETTINGS_MAX 64

struct setting {
    const char *name; /* the flag, without "--": "max-running" */
    const char *key;  /* the file key ("max_running"); NULL: command line only */
    enum flag_type type;
    size_t off;                 /* of the value in the config struct; its C type is the one
                                   enum flag_type names */
    const char *def_str;        /* FLAG_STR default (NULL: none) */
    double def;                 /* other types: the default (FLAG_CHOICE: the index) */
    double min, max;            /* numeric range; none when min >= max */
    const char *const *choices; /* FLAG_CHOICE: NULL-terminated */
    /* FLAG_STR: an extra check of the value (0 or TANDEM_EINVAL), and what it
     * accepts, for messages ("auto, full, none or 1/N"). */
    int (*check)(const char *s);
    const char *check_what;
    /* Which backends read it, as bits the table's owner defines (the
     * worker's: BACKEND_READS_*, engine/backend.h): a cluster file refuses
     * the key in a pool whose backend has none of them, an override skips
     * such pools. 0: every backend. */
    unsigned reads;
    /* Experiment overrides apply only to pools whose backend has one of these
     * bits (0: all). */
    unsigned override_reads;
    /* The flag name of a setting this one excludes: a file may not give both,
     * and an override of that one unsets this one. */
    const char *conflicts;
    unsigned flags; /* SETTING_* */
    const char *help;
};

/* The allowed values of a FLAG_CHOICE setting (NULL-terminated). */
const char *const *settings_choices(const struct setting *s);

/* Writes every default into base (other fields are left alone). */
void settings_defaults(const struct setting *t, size_t n, void *base);

/* Fills out[0..cap) with the flags of t[0..n) whose flags have none of the
 * bits in skip, pointing into base. Returns how many (at most cap). */
size_t settings_flags(const struct setting *t, size_t n, unsigned skip, void *base,
                      struct flag *out, size_t cap);

/* The index of the setting with this flag name, or key; -1 when none. */
int settings_find(const struct setting *t, size_t n, const char *name);
int settings_find_key(const struct setting *t, size_t n, const char *key);

/* Parses text (a file's scalar) as the value of s into base. FLAG_STR
 * values are checked (s->check) and stored as the pointer text (the caller
 * copies it if text does not outlive base). Byte counts must be > 0. Returns
 * 0, or TANDEM_EINVAL with "expected ..., got '<text>'" in why. */
int settings_parse_value(const struct setting *s, const char *text, void *base, char *why,
                         size_t whylen);

/* The value of s in base as text, the form settings_parse_value and the flag
 * both read back: "%d", "%.17g", "%llu", the choice's name, the string ("" for
 * NULL), "true"/"false". Returns 0, or TANDEM_ETOOBIG when len is short. */
int settings_format(const struct setting *s, const void *base, char *buf, size_t len);

/* 1 when a and b hold the same value of s (strings compared by content). */
int settings_equal(const struct setting *s, const void *a, const void *b);

/* Copies the value of s from src to dst (strings: the pointer). */
void settings_copy(const struct setting *s, void *dst, const void *src);

#endif
