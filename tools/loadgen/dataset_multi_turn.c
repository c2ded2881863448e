/* --dataset-name multi-turn: chat sessions whose history grows turn by turn.
 *
 * Request i is turn i mod T of session i / T (T = --multi-turn-turns). Turn 0
 * sends an optional system prompt (--multi-turn-system-len) and a user
 * message (--multi-turn-input-len); every later turn resends the whole
 * history (system, user, assistant, user, assistant, ...) plus a new user
 * message, so each prompt extends the previous one: the prefix cache should
 * hit on all of it. The assistant messages are the server's actual replies
 * (--multi-turn-history response, the default), or synthetic text of the
 * output length (synthetic: the workload then does not depend on the server;
 * also used when a turn failed). The run sends turn t only after turn t-1
 * finished (run.h). With the completions endpoint the history is sent as one
 * text, the messages' contents joined by newlines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"
#include "workload.h"

struct session {
    struct lg_message *msgs; /* history so far, NULL once the session ended */
    int n_msgs;
    int next_turn; /* the turn make() may produce next */
};

struct mt_state {
    struct session *sessions; /* indexed by session number */
    int64_t n_sessions;
};

static int mt_init(struct lg_workload *w, char *err, size_t errlen)
{
    const struct lg_workload_config *c = &w->cfg;
    if (c->mt_turns < 1 || c->mt_system_len < 0 || c->mt_input_len < 1 || c->mt_output_len < 1) {
        snprintf(err, errlen,
                 "--multi-turn-turns, --multi-turn-input-len and "
                 "--multi-turn-output-len must be >= 1");
        return TANDEM_EINVAL;
    }
    if (c->token_ids) {
        snprintf(err, errlen, "--prompt-token-ids does not apply to multi-turn (chat text)");
        return TANDEM_EINVAL;
    }
    w->state = calloc(1, sizeof(struct mt_state));
    if (w->state == NULL) {
        return TANDEM_ENOMEM;
    }
    w->turns = c->mt_turns;
    return 0;
}

static char *gen_text(struct lg_rng *r, size_t n)
{
    char *t = malloc(n + 1);
    if (t != NULL) {
        lg_text_fill(r, t, n);
        t[n] = '\0';
    }
    return t;
}

static int push(struct lg_message **msgs, int *n, const char *role, char *content, size_t len)
{
    struct lg_message *m = realloc(*msgs, (size_t)(*n + 1) * sizeof(*m));
    if (m == NULL) {
        return TANDEM_ENOMEM;
    }
    *msgs = m;
    m[*n] = (struct lg_message){.role = role, .content = content, .len = len};
    (*n)++;
    return 0;
}

static void free_msgs(struct lg_message *msgs, int n)
{
    for (int i = 0; i < n; i++) {
        free(msgs[i].content);
    }
    free(msgs);
}

/* Copies the history into out, as messages (chat) or as one text. */
static int render(const struct lg_workload_config *c, const struct lg_message *msgs, int n,
                  struct lg_prompt *out)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += msgs[i].len;
    }
    if (c->api == LG_API_COMPLETIONS) {
        size_t len = total + (size_t)(n > 0 ? n - 1 : 0);
        out->text = malloc(len + 1);
        if (out->text == NULL) {
            return TANDEM_ENOMEM;
        }
        size_t pos = 0;
        for (int i = 0; i < n; i++) {
            if (i > 0) {
                out->text[pos++] = '\n';
            }
            memcpy(out->text + pos, msgs[i].content, msgs[i].len);
            pos += msgs[i].len;
        }
        out->text[pos] = '\0';
        out->text_len = pos;
        out->prompt_len = (int32_t)pos;
        return 0;
    }
    if (n < 1) {
        return TANDEM_EINVAL;
    }
    out->msgs = calloc((size_t)n, sizeof(*out->msgs));
    if (out->msgs == NULL) {
        return TANDEM_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        out->msgs[i].role = msgs[i].role;
        out->msgs[i].len = msgs[i].len;
        out->msgs[i].content = malloc(msgs[i].len + 1);
        if (out->msgs[i].content == NULL) {
            return TANDEM_ENOMEM;
        }
        out->n_msgs = i + 1;
        memcpy(out->msgs[i].content, msgs[i].content, msgs[i].len + 1);
    }
    out->prompt_len = (int32_t)total;
    return 0;
}

/* The first messages of a session: optional system prompt and user turn 0. */
static int first_messages(struct lg_workload *w, int64_t session, int64_t index, int warmup,
                          struct lg_message **msgs, int *n)
{
    const struct lg_workload_config *c = &w->cfg;
    struct lg_rng rng;
    if (c->mt_system_len > 0) {
        lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_SESSION, (uint64_t)session);
        char *sys = gen_text(&rng, (size_t)c->mt_system_len);
        if (sys == NULL || push(msgs, n, "system", sys, (size_t)c->mt_system_len) != 0) {
            free(sys);
            return TANDEM_ENOMEM;
        }
    }
    lg_rng_derive(&rng, lg_workload_seed(w, warmup), LG_STREAM_REQUEST, (uint64_t)index);
    char *user = gen_text(&rng, (size_t)c->mt_input_len);
    if (user == NULL || push(msgs, n, "user", user, (size_t)c->mt_input_len) != 0) {
        free(user);
        return TANDEM_ENOMEM;
    }
    return 0;
}

static int mt_make(struct lg_workload *w, int64_t index, int warmup, struct lg_prompt *out)
{
    struct mt_state *st = w->state;
    const struct lg_workload_config *c = &w->cfg;
    int64_t sid = index / w->turns;
    int turn = (int)(index % w->turns);
    out->session = (int32_t)sid;
    out->turn = turn;
    out->output_len = c->mt_output_len;
    if (warmup) { /* a lone first turn, not remembered */
        struct lg_message *msgs = NULL;
        int n = 0;
        out->turn = 0;
        int rc = first_messages(w, sid, index, 1, &msgs, &n);
        if (rc == 0) {
            rc = render(c, msgs, n, out);
        }
        free_msgs(msgs, n);
        return rc;
    }
    if (sid >= st->n_sessions) {
        if (turn != 0) {
            return TANDEM_EINVAL;
        }
        int64_t n = st->n_sessions ? st->n_sessions : 16;
        while (n <= sid) {
            n *= 2;
        }
        struct session *s = realloc(st->sessions, (size_t)n * sizeof(*s));
        if (s == NULL) {
            return TANDEM_ENOMEM;
        }
        memset(s + st->n_sessions, 0, (size_t)(n - st->n_sessions) * sizeof(*s));
        st->sessions = s;
        st->n_sessions = n;
    }
    struct session *s = &st->sessions[sid];
    if (s->next_turn != turn) {
        return TANDEM_EINVAL; /* out of order: turn t needs turn t-1's reply */
    }
    int rc;
    if (turn == 0) {
        rc = first_messages(w, sid, index, 0, &s->msgs, &s->n_msgs);
    } else {
        struct lg_rng rng;
        lg_rng_derive(&rng, c->seed, LG_STREAM_REQUEST, (uint64_t)index);
        char *user = gen_text(&rng, (size_t)c->mt_input_len);
        rc = user ? push(&s->msgs, &s->n_msgs, "user", user, (size_t)c->mt_input_len)
                  : TANDEM_ENOMEM;
        if (rc != 0) {
            free(user);
        }
    }
    if (rc == 0) {
        rc = render(c, s->msgs, s->n_msgs, out);
    }
    if (rc == 0) {
        s->next_turn = -1; /* waiting for turn_done */
    }
    return rc;
}

static void mt_turn_done(struct lg_workload *w, const struct lg_prompt *p, const char *text,
                         size_t len)
{
    struct mt_state *st = w->state;
    const struct lg_workload_config *c = &w->cfg;
    if (p->session < 0 || p->session >= st->n_sessions) {
        return;
    }
    struct session *s = &st->sessions[p->session];
    if (s->next_turn != -1) {
        return;
    }
    if (p->turn + 1 >= w->turns) { /* the session is over */
        free_msgs(s->msgs, s->n_msgs);
        s->msgs = NULL;
        s->n_msgs = 0;
        s->next_turn = w->turns;
        return;
    }
    char *reply;
    size_t rlen;
    if (c->mt_history == LG_HISTORY_RESPONSE && text != NULL && len > 0) {
        reply = malloc(len + 1);
        if (reply != NULL) {
            memcpy(reply, text, len);
            reply[len] = '\0';
        }
        rlen = len;
    } else {
        struct lg_rng rng;
        lg_rng_derive(&rng, c->seed, LG_STREAM_SESSION, (uint64_t)p->index | (1ULL << 62));
        rlen = (size_t)c->mt_output_len;
        reply = gen_text(&rng, rlen);
    }
    if (reply == NULL || push(&s->msgs, &s->n_msgs, "assistant", reply, rlen) != 0) {
        free(reply); /* out of memory: the next turn goes without this reply */
    }
    s->next_turn = p->turn + 1;
}

static void mt_fini(struct lg_workload *w)
{
    struct mt_state *st = w->state;
    if (st != NULL) {
        for (int64_t i = 0; i < st->n_sessions; i++) {
            free_msgs(st->sessions[i].msgs, st->sessions[i].n_msgs);
        }
        free(st->sessions);
        free(st);
    }
}

const struct lg_dataset_ops lg_dataset_multi_turn = {
    .name = "multi-turn",
    .init = mt_init,
    .make = mt_make,
    .turn_done = mt_turn_done,
    .fini = mt_fini,
};
