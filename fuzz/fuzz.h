/* Shared by the libFuzzer harnesses in fuzz/ (see CMakeLists.txt and
 * docs/reliability.md "## Bad input").
 *
 * A harness is LLVMFuzzerTestOneInput(data, size): it must not leak, must
 * give the same result for the same input, and turns a broken property into
 * a crash with FUZZ_CHECK (a harness is not production code: abort() is how
 * it tells libFuzzer). */
#ifndef TANDEM_FUZZ_H
#define TANDEM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Also on stdout: runs close stderr (-close_fd_mask=2) and keep stdout in their logs. */
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);            \
            printf("%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);                     \
            fflush(stdout);                                                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Every log line is formatted (debug level), so a message that prints a bad
 * string is fuzzed too. Loaders log every refusal: the runs (ctest,
 * scripts/fuzz.sh) pass -close_fd_mask=2 so stderr costs nothing, while
 * libFuzzer and the sanitizers keep reporting on a copy of it. Replaying one
 * input by hand shows the logs. */
static inline void fuzz_init_logs(void)
{
    log_init("fuzz", LOG_LEVEL_DEBUG);
}

#endif
