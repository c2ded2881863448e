/* The event queue: see sm_queue.h. */
#include "sm_queue.h"

#include <stdlib.h>

#include "tandem_err.h"

void sm_queue_init(struct sm_queue *q)
{
    *q = (struct sm_queue){0};
}

void sm_queue_fini(struct sm_queue *q)
{
    free(q->h);
    *q = (struct sm_queue){0};
}

static int before(const struct sm_event *a, const struct sm_event *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

int sm_queue_push(struct sm_queue *q, double t, int kind, int who, void *p)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 1024;
        struct sm_event *h = realloc(q->h, cap * sizeof(*h));
        if (h == NULL) {
            return TANDEM_ENOMEM;
        }
        q->h = h;
        q->cap = cap;
    }
    struct sm_event e = {.t = t, .seq = q->next_seq++, .kind = kind, .who = who, .p = p};
    size_t i = q->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&e, &q->h[parent])) {
            break;
        }
        q->h[i] = q->h[parent];
        i = parent;
    }
    q->h[i] = e;
    return 0;
}

int sm_queue_pop(struct sm_queue *q, struct sm_event *out)
{
    if (q->n == 0) {
        return TANDEM_ENOENT;
    }
    *out = q->h[0];
    struct sm_event last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) {
            break;
        }
        if (c + 1 < q->n && before(&q->h[c + 1], &q->h[c])) {
            c++;
        }
        if (!before(&q->h[c], &last)) {
            break;
        }
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n > 0) {
        q->h[i] = last;
    }
    return 0;
}
