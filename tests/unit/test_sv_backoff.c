/* `tandem up`'s restart delay (tools/sv_backoff.h, which the supervisor in
 * tools/supervise.c calls at every exit) on a fake clock: the first delay,
 * doubling, the cap (exactly max, never above it, whatever the first delay),
 * the reset after a run was ready for reset_ms (29.999 s: no reset; 30 s:
 * reset), no reset for a run that never became ready or whose ready time is
 * a previous run's, and the flags' values reaching the policy through
 * up_restart_policy (tools/up.c), the conversion up_main uses; giving up
 * after give_up runs in a row that never became ready (3 in `tandem up`), a
 * ready run in between starting the count again. No sleeps:
 * every time is a number on the fake clock. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

#include "../integration/expect.h"
#include "flags.h"
#include "sv_backoff.h"
#include "up.h"

static const struct sv_backoff defaults = {
    .initial_ms = SV_BACKOFF_INITIAL_MS,
    .max_ms = SV_BACKOFF_MAX_MS,
    .reset_ms = SV_BACKOFF_RESET_MS,
};

/* A supervised process on a fake clock: each run starts when the previous
 * restart delay has passed, as the supervisor's timer would start it. */
struct fake {
    const struct sv_backoff *b;
    int64_t now;  /* ms */
    int delay_ms; /* of the latest restart; 0 before the first (sv_proc.delay_ms) */
    int failed;   /* runs in a row never ready (sv_proc.failed_starts) */
};

/* One run that becomes ready ready_after ms after its start (< 0: never) and
 * dies lives ms after its start. Returns the restart delay and moves the
 * clock to the next start. */
static int run(struct fake *f, int64_t ready_after, int64_t lives)
{
    struct sv_run r = {
        .started_ms = f->now,
        .ready_ms = ready_after < 0 ? SV_NEVER : f->now + ready_after,
        .died_ms = f->now + lives,
        .failed_before = f->failed,
    };
    f->failed = ready_after < 0 ? f->failed + 1 : 0;
    f->delay_ms = sv_backoff_next(f->b, f->delay_ms, &r);
    f->now = r.died_ms + f->delay_ms;
    return f->delay_ms;
}

static void test_defaults_double_to_the_cap(void)
{
    /* docs/up.md: 0.5 s, doubling up to 10 s. */
    struct fake f = {.b = &defaults, .now = 1000};
    static const int want[] = {500, 1000, 2000, 4000, 8000, 10000, 10000, 10000};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        EXPECT_EQ(run(&f, 100, 200), want[i]); /* ready for 0.1 s each time */
    }
}

static void test_cap_with_odd_first_delays(void)
{
    /* Every first delay the flag accepts at ms resolution up to 12 s (its
     * range is 0.01-3600 s): the sequence starts at the first delay (or the
     * cap, if that is smaller), each delay is twice the previous one or
     * exactly the cap, and it reaches exactly the cap and stays there. */
    for (int initial = 10; initial <= 12000; initial++) {
        struct sv_backoff b = {.initial_ms = initial, .max_ms = 10000, .reset_ms = 30000};
        struct fake f = {.b = &b};
        int prev = 0, at_cap = 0, bad = 0;
        for (int i = 0; i < 20; i++) {
            int d = run(&f, SV_NEVER, 50);
            int want = i == 0 ? initial : 2 * prev;
            want = want > 10000 ? 10000 : want;
            bad += d != want;
            at_cap += d == 10000;
            prev = d;
        }
        if (bad || at_cap == 0 || prev != 10000) {
            printf("\nfirst delay %d ms: %d wrong delays, %d at the cap, last %d\n", initial, bad,
                   at_cap, prev);
            CU_FAIL("cap");
            return;
        }
    }
    /* A cap below the first delay: every delay is the cap. */
    struct sv_backoff b = {.initial_ms = 3000, .max_ms = 700, .reset_ms = 30000};
    struct fake f = {.b = &b};
    EXPECT_EQ(run(&f, 10, 20), 700);
    EXPECT_EQ(run(&f, 10, 20), 700);
    EXPECT_EQ(run(&f, 10, 40000), 700); /* the reset goes to the first delay, capped */
    /* Doubling near INT_MAX stays at the cap. */
    struct sv_backoff big = {.initial_ms = 1 << 30, .max_ms = 2147483647, .reset_ms = 30000};
    f = (struct fake){.b = &big};
    EXPECT_EQ(run(&f, SV_NEVER, 1), 1 << 30);
    EXPECT_EQ(run(&f, SV_NEVER, 1), 2147483647);
    EXPECT_EQ(run(&f, SV_NEVER, 1), 2147483647);
}

static void test_reset_after_ready_30s(void)
{
    struct fake f = {.b = &defaults, .now = 5};
    EXPECT_EQ(run(&f, 200, 300), 500);
    EXPECT_EQ(run(&f, 200, 300), 1000);
    EXPECT_EQ(run(&f, 200, 300), 2000);
    /* Ready for 29.999 s: no reset. The run itself lasted longer than 30 s:
     * what counts is the time since ready, not since start. */
    EXPECT_EQ(run(&f, 1500, 1500 + 29999), 4000);
    /* Ready for exactly 30 s: back to the first delay, then doubling again. */
    EXPECT_EQ(run(&f, 1500, 1500 + 30000), 500);
    EXPECT_EQ(run(&f, 0, 10), 1000);
    EXPECT_EQ(run(&f, 0, 10), 2000);
    /* Long after 30 s, and when ready at the very start. */
    EXPECT_EQ(run(&f, 0, 3600 * 1000), 500);
    EXPECT_EQ(run(&f, 0, 29999), 1000);
    /* From the cap too. */
    for (int i = 0; i < 6; i++) {
        run(&f, 0, 10);
    }
    EXPECT_EQ(f.delay_ms, 10000);
    EXPECT_EQ(run(&f, 100, 100 + 30000), 500);
}

static void test_never_ready_never_resets(void)
{
    struct fake f = {.b = &defaults, .now = 77};
    EXPECT_EQ(run(&f, SV_NEVER, 10), 500);
    EXPECT_EQ(run(&f, SV_NEVER, 10), 1000);
    /* An hour without becoming ready (e.g. a worker the router never
     * listed): still no reset. */
    EXPECT_EQ(run(&f, SV_NEVER, 3600 * 1000), 2000);
    EXPECT_EQ(run(&f, SV_NEVER, 3600 * 1000), 4000);
    /* A ready time before this run started is a previous run's. */
    struct sv_run stale = {.started_ms = 100000, .ready_ms = 50000, .died_ms = 200000};
    EXPECT_EQ(sv_backoff_next(&defaults, 4000, &stale), 8000);
    stale.ready_ms = 100000; /* ready at its start, 100 s before it died */
    EXPECT_EQ(sv_backoff_next(&defaults, 4000, &stale), 500);
}

static void test_give_up_after_three_failed_starts(void)
{
    struct sv_backoff b = defaults;
    b.give_up = SV_BACKOFF_GIVE_UP;
    EXPECT_EQ(SV_BACKOFF_GIVE_UP, 3); /* docs/up.md */
    struct fake f = {.b = &b, .now = 5};
    EXPECT_EQ(run(&f, SV_NEVER, 10), 500);
    EXPECT_EQ(run(&f, SV_NEVER, 10), 1000);
    EXPECT_EQ(run(&f, SV_NEVER, 10), SV_GIVE_UP);
    /* A run that became ready, however briefly, starts the count again; it
     * does not reset the delay (ready for less than reset_ms). */
    f = (struct fake){.b = &b, .now = 5};
    EXPECT_EQ(run(&f, SV_NEVER, 10), 500);
    EXPECT_EQ(run(&f, SV_NEVER, 10), 1000);
    EXPECT_EQ(run(&f, 5, 10), 2000);
    EXPECT_EQ(run(&f, SV_NEVER, 10), 4000);
    EXPECT_EQ(run(&f, SV_NEVER, 10), 8000);
    EXPECT_EQ(run(&f, SV_NEVER, 10), SV_GIVE_UP);
    /* A ready time from a previous run does not count as ready. */
    struct sv_run stale = {
        .started_ms = 100000, .ready_ms = 50000, .died_ms = 200000, .failed_before = 2};
    EXPECT_EQ(sv_backoff_next(&b, 4000, &stale), SV_GIVE_UP);
    stale.ready_ms = 100000;
    EXPECT_EQ(sv_backoff_next(&b, 4000, &stale), 500);
    /* give_up 1: the first failed start; 0: never (the other tests). */
    b.give_up = 1;
    f = (struct fake){.b = &b, .now = 5};
    EXPECT_EQ(run(&f, SV_NEVER, 10), SV_GIVE_UP);
    b.give_up = 0;
    f = (struct fake){.b = &b, .now = 5};
    for (int i = 0; i < 10; i++) {
        CU_ASSERT(run(&f, SV_NEVER, 10) > 0);
    }
}

static char last_err[256]; /* up_restart_policy's message for a bad flag */

/* up_restart_policy for "up" followed by the given flags. */
static int policy(struct sv_backoff *b, const char *a1, const char *a2, const char *a3,
                  const char *a4, const char *a5, const char *a6)
{
    char *argv[8] = {"up"};
    int argc = 1;
    const char *more[] = {a1, a2, a3, a4, a5, a6};
    for (int i = 0; i < 6 && more[i]; i++) {
        argv[argc++] = (char *)more[i];
    }
    last_err[0] = '\0';
    memset(b, 0, sizeof(*b));
    return up_restart_policy(argc, argv, b, last_err, sizeof(last_err));
}

static void test_flags_reach_the_policy(void)
{
    struct sv_backoff b;
    EXPECT_EQ(policy(&b, NULL, NULL, NULL, NULL, NULL, NULL), FLAGS_OK);
    EXPECT_EQ(b.initial_ms, 500);
    EXPECT_EQ(b.max_ms, 10000);
    EXPECT_EQ(b.reset_ms, 30000);
    EXPECT_EQ(b.give_up, SV_BACKOFF_GIVE_UP);

    EXPECT_EQ(policy(&b, "--restart-backoff", "0.3", "--restart-backoff-max", "2.5",
                     "--healthy-reset", "7"),
              FLAGS_OK);
    EXPECT_EQ(b.initial_ms, 300);
    EXPECT_EQ(b.max_ms, 2500);
    EXPECT_EQ(b.reset_ms, 7000);
    struct fake f = {.b = &b};
    EXPECT_EQ(run(&f, 0, 10), 300);
    EXPECT_EQ(run(&f, 0, 10), 600);
    EXPECT_EQ(run(&f, 0, 10), 1200);
    EXPECT_EQ(run(&f, 0, 10), 2400);
    EXPECT_EQ(run(&f, 0, 10), 2500);
    EXPECT_EQ(run(&f, 0, 6999), 2500);
    EXPECT_EQ(run(&f, 0, 7000), 300);

    /* Seconds to ms rounds: 1.005 * 1000 is 1004.999... in binary. */
    EXPECT_EQ(policy(&b, "--restart-backoff", "1.005", "--restart-backoff-max", "0.57", NULL, NULL),
              FLAGS_OK);
    EXPECT_EQ(b.initial_ms, 1005);
    EXPECT_EQ(b.max_ms, 570);
    EXPECT_EQ(b.reset_ms, 30000);

    /* Out of range (0.01-3600 s): refused, not clamped into a policy. */
    CU_ASSERT_NOT_EQUAL(policy(&b, "--restart-backoff", "0", NULL, NULL, NULL, NULL), FLAGS_OK);
    EXPECT_STR(last_err, "--restart-backoff: 0 is out of range [0.01, 3600]");
    CU_ASSERT_NOT_EQUAL(policy(&b, "--restart-backoff-max", "-1", NULL, NULL, NULL, NULL),
                        FLAGS_OK);
    EXPECT_STR(last_err, "--restart-backoff-max: -1 is out of range [0.01, 3600]");
    CU_ASSERT_NOT_EQUAL(policy(&b, "--healthy-reset", "x", NULL, NULL, NULL, NULL), FLAGS_OK);
    EXPECT_STR(last_err, "--healthy-reset: 'x' is not a number");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("sv_backoff", NULL, NULL);
    CU_add_test(s, "defaults_double_to_the_cap", test_defaults_double_to_the_cap);
    CU_add_test(s, "cap_with_odd_first_delays", test_cap_with_odd_first_delays);
    CU_add_test(s, "reset_after_ready_30s", test_reset_after_ready_30s);
    CU_add_test(s, "never_ready_never_resets", test_never_ready_never_resets);
    CU_add_test(s, "give_up_after_three_failed_starts", test_give_up_after_three_failed_starts);
    CU_add_test(s, "flags_reach_the_policy", test_flags_reach_the_policy);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed() +
                      CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
