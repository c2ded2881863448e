/* Assertions for the integration tests that say what they saw: EXPECT_EQ on
 * integers and EXPECT_STR on strings print both sides (and where) before the
 * CUnit assertion, so a failure in a long end-to-end run needs no rerun. */
#ifndef TANDEM_EXPECT_H
#define TANDEM_EXPECT_H

#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

#define EXPECT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            fprintf(stderr, "\n%s:%d: %s == %lld, want %s == %lld\n", __FILE__, __LINE__, #a, a_,  \
                    #b, b_);                                                                       \
        CU_ASSERT(a_ == b_);                                                                       \
    } while (0)

#define EXPECT_STR(got, want)                                                                      \
    do {                                                                                           \
        const char *g_ = (got), *w_ = (want);                                                      \
        int ok_ = g_ != NULL && w_ != NULL && strcmp(g_, w_) == 0;                                 \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n%s:%d:\n  got  [%s]\n  want [%s]\n", __FILE__, __LINE__,            \
                    g_ ? g_ : "(null)", w_ ? w_ : "(null)");                                       \
        CU_ASSERT(ok_);                                                                            \
    } while (0)

#endif
