/* Shared helpers for the Criterion suites. */
#ifndef SR_TESTS_COMMON_H
#define SR_TESTS_COMMON_H

#include <stdio.h>
#include <unistd.h>

/* A segment name unique to this test process, so suites can run in parallel
 * and leak checks can look for exactly this test's segment. */
static inline const char *test_ns(const char *test)
{
    static _Thread_local char buf[40];
    snprintf(buf, sizeof(buf), "t-%.24s-%d", test, (int)getpid());
    return buf;
}

#endif
