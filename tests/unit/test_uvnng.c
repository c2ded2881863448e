/* NNG -> libuv bridge: messages and pipe events reach the loop thread. */
#include <CUnit/Basic.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <string.h>
#include <uv.h>

#include "uvnng.h"

struct ctx {
    struct uvnng u;
    int received;
    int sum;
    int adds;
    int removes;
    int closed;
    uv_timer_t timer;
};

static void on_msg(struct uvnng *u, nng_msg *msg)
{
    struct ctx *c = u->data;
    uint32_t v;
    CU_ASSERT_EQUAL_FATAL(nng_msg_len(msg), 4);
    memcpy(&v, nng_msg_body(msg), 4);
    c->received++;
    c->sum += (int)v;
    nng_msg_free(msg);
}

static void on_pipe_ev(struct uvnng *u, nng_pipe p, nng_pipe_ev ev)
{
    struct ctx *c = u->data;
    CU_ASSERT(nng_pipe_id(p) > 0);
    if (ev == NNG_PIPE_EV_ADD_POST) {
        c->adds++;
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        c->removes++;
    }
}

static int closed_calls;

static void on_closed(uv_handle_t *h)
{
    (void)h;
    closed_calls++;
}

static void on_tick(uv_timer_t *t)
{
    struct ctx *c = t->data;
    (void)c;
}

static void run_until(uv_loop_t *loop, int *flag, int want)
{
    for (int i = 0; i < 2000 && *flag < want; i++) {
        uv_run(loop, UV_RUN_ONCE);
    }
}

static void test_messages_and_pipes(void)
{
    uv_loop_t loop;
    struct ctx c;
    memset(&c, 0, sizeof(c));
    CU_ASSERT_EQUAL_FATAL(uv_loop_init(&loop), 0);
    /* A timer so UV_RUN_ONCE never blocks forever if an event is missing. */
    uv_timer_init(&loop, &c.timer);
    c.timer.data = &c;
    uv_timer_start(&c.timer, on_tick, 5, 5);

    nng_socket pull, push;
    CU_ASSERT_EQUAL_FATAL(nng_pull0_open(&pull), 0);
    CU_ASSERT_EQUAL_FATAL(nng_push0_open(&push), 0);
    /* Buffers large enough for the whole burst: the loop is not running while
     * the test sends. */
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_int(pull, NNG_OPT_RECVBUF, 1024), 0);
    CU_ASSERT_EQUAL_FATAL(nng_socket_set_int(push, NNG_OPT_SENDBUF, 1024), 0);
    CU_ASSERT_EQUAL_FATAL(uvnng_init(&loop, &c.u, pull, on_msg, on_pipe_ev, &c), 0);
    CU_ASSERT_EQUAL_FATAL(nng_listen(pull, "inproc://uvnng-test", NULL, 0), 0);
    CU_ASSERT_EQUAL_FATAL(nng_dial(push, "inproc://uvnng-test", NULL, 0), 0);
    run_until(&loop, &c.adds, 1);
    CU_ASSERT_EQUAL(c.adds, 1);

    /* More than one batch, so the drain limit and re-arming are exercised. */
    int expect = 0;
    for (uint32_t i = 1; i <= 3 * UVNNG_BATCH + 5; i++) {
        nng_msg *m;
        nng_msg_alloc(&m, 4);
        memcpy(nng_msg_body(m), &i, 4);
        CU_ASSERT_EQUAL_FATAL(nng_sendmsg(push, m, 0), 0);
        expect += (int)i;
    }
    run_until(&loop, &c.received, 3 * UVNNG_BATCH + 5);
    CU_ASSERT_EQUAL(c.received, 3 * UVNNG_BATCH + 5);
    CU_ASSERT_EQUAL(c.sum, expect);

    nng_close(push);
    run_until(&loop, &c.removes, 1);
    CU_ASSERT_EQUAL(c.removes, 1);

    uvnng_close(&c.u, on_closed);
    uv_close((uv_handle_t *)&c.timer, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CU_ASSERT_EQUAL(closed_calls, 1);
    CU_ASSERT_EQUAL(uv_loop_close(&loop), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("uvnng", NULL, NULL);
    CU_add_test(s, "messages_and_pipes", test_messages_and_pipes);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    nng_fini(); /* NNG's threads, so valgrind sees no leak */
    return failed ? 1 : 0;
}
