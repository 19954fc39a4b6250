/* SPDX-License-Identifier: MIT */
/* Checks inside sr_spawn workers. A worker is a forked child, not a Criterion
 * test: it reports a failure on stderr and returns non-zero, which makes
 * sr_spawn() fail with -SR_EWORKER naming the rank; the test asserts on that. */
#ifndef SR_TESTS_WORKER_CHECK_H
#define SR_TESTS_WORKER_CHECK_H

#include <stdio.h>

#define WCHECK(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "worker check failed at %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            return 1;                                                          \
        }                                                                      \
    } while (0)

#endif
