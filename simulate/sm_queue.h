/* The simulator's event queue: a binary min-heap on (time, seq), seq being
 * the order of queueing, so that events at the same modelled time run in
 * the order they were queued and a run is deterministic.
 * Internal to simulate/. One thread. */
#ifndef TANDEM_SM_QUEUE_H
#define TANDEM_SM_QUEUE_H

#include <stddef.h>
#include <stdint.h>

struct sm_event {
    double t;     /* modelled seconds */
    uint64_t seq; /* queueing order */
    int kind;     /* the owner's enum */
    int who;      /* the owner's index (a worker), or -1 */
    void *p;      /* the owner's payload, or NULL */
};

struct sm_queue {
    struct sm_event *h; /* (cap) heap */
    size_t n, cap;
    uint64_t next_seq;
};

void sm_queue_init(struct sm_queue *q);
void sm_queue_fini(struct sm_queue *q);

/* Queues an event. Returns 0 or TANDEM_ENOMEM. */
int sm_queue_push(struct sm_queue *q, double t, int kind, int who, void *p);

/* Removes the earliest event into *out. Returns 0, or TANDEM_ENOENT when
 * the queue is empty. */
int sm_queue_pop(struct sm_queue *q, struct sm_event *out);

#endif
