/* The router's last decision records, for GET /v1/decisions and the debug
 * log: a ring of the last `cap` decisions, newest first when read.
 *
 * Lazy: a decision is kept as a binary copy (its scalars, and per profile
 * run the candidates, raw scores and totals, which live in the pipeline's
 * scratch only until the next decision) and written as JSON only when read
 * (rt_declog_json), with rt_decision_format_with: the text is byte for byte
 * rt_decision_format's of the live decision.
 *
 * Endpoint names: a record names its endpoints as they were when it was made.
 * The log keeps, per endpoint slot, the id of the slot's generation its kept
 * records name (copied when a record first names that generation). When a
 * record names a newer generation of a slot (the endpoint was removed and
 * the slot reused by another), the older records naming the slot are written
 * as JSON at once, with the old id, before the id is replaced. Scorer,
 * picker, decider and profile names are read through pointers into the
 * pipeline, which outlives the log (struct rt_core).
 *
 * Costs: rt_declog_add copies O(candidates x scorers) numbers and, in the
 * steady state, allocates nothing (each ring slot keeps and grows its own
 * buffers). rt_declog_json formats one record.
 *
 * Threading: one thread (the router's loop). */
#ifndef TANDEM_RT_DECLOG_H
#define TANDEM_RT_DECLOG_H

#include <stddef.h>
#include <stdint.h>

#include "endpoint.h"
#include "pipeline.h"

struct rt_declog_entry {
    int actual; /* cached tokens the worker reported, -1 until then */
    int text;   /* the record is json (formatted when a slot it names was reused) */
    char *json; /* (json_cap) owned */
    size_t json_cap;
    struct rt_decision dec; /* runs[].candidates, raw and total point into cand and num */
    int *cand;              /* (cand_cap) every run's candidates, owned */
    size_t cand_cap;
    double *num; /* (num_cap) every run's raw scores then totals, owned */
    size_t num_cap;
};

/* The id of a slot's generation named by the kept records. */
struct rt_declog_name {
    uint32_t gen; /* 0: none yet */
    char id[RT_ID_MAX];
};

struct rt_declog {
    struct rt_declog_entry *e; /* (cap) */
    uint64_t *seq;             /* (cap) each entry's decision seq, 0: empty; apart from
                                  the entries so rt_declog_actual scans 8 bytes each */
    int cap, head, n;
    struct rt_declog_name *names; /* (n_names) by endpoint slot */
    int n_names;
    char *buf; /* scratch for formatting */
    size_t buf_cap;
};

/* Keeps the last cap records (0: none; rt_declog_add then only logs at
 * debug level). Returns 0 or TANDEM_ENOMEM. */
int rt_declog_init(struct rt_declog *l, int cap);
void rt_declog_fini(struct rt_declog *l);

/* Keeps a copy of decision d, just made by pl (the oldest record is dropped
 * when cap are kept), and logs it as JSON when the log level is debug. pl
 * must outlive the log. Out of memory: the record is not kept. */
void rt_declog_add(struct rt_declog *l, const struct rt_pipeline *pl, const struct rt_decision *d);

/* Records the cached tokens reported for decision seq (if still kept). */
void rt_declog_actual(struct rt_declog *l, uint64_t seq, int actual);

/* Records kept (at most cap). */
int rt_declog_count(const struct rt_declog *l);

/* Record k (0: the newest) as one line of JSON (rt_decision_format's text),
 * and its reported cached tokens in *actual (-1: none yet). The text belongs
 * to the log and is valid until the next rt_declog_ call. NULL when k is out
 * of range, the record was dropped for want of memory, or memory runs out. */
const char *rt_declog_json(struct rt_declog *l, int k, int *actual);

#endif
