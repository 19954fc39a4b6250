/* SPDX-License-Identifier: MIT */
/* A call that must answer at once (an open of a FIFO, say): run it in a
 * forked child and wait at most 5 s for its answer; a child that has not
 * answered by then is killed and the test fails, naming what hung, instead
 * of blocking the suite for ever. */
#ifndef SR_TESTS_BOUNDED_H
#define SR_TESTS_BOUNDED_H

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmrpc/error.h"

struct bounded {
    int rc;
    char err[512];
};

/* fn's result and error text, from a forked child: a child that has not
 * answered within 5 s hangs (in an open, say) and is killed, failing the
 * test instead of blocking it for ever. */
static inline struct bounded run_bounded(int (*fn)(void), const char *what)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        struct bounded b = {.rc = fn()};
        snprintf(b.err, sizeof(b.err), "%s", sr_last_error());
        _exit(write(p[1], &b, sizeof(b)) == (ssize_t)sizeof(b) ? 0 : 1);
    }
    close(p[1]);
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    int ready;
    while ((ready = poll(&pf, 1, 5000)) < 0 && errno == EINTR)
        ;
    struct bounded b = {0};
    ssize_t got = ready == 1 ? read(p[0], &b, sizeof(b)) : -1;
    if (ready != 1)
        kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    close(p[0]);
    cr_assert_eq(ready, 1, "%s hung: no answer within 5 s (killed)", what);
    cr_assert_eq(got, (ssize_t)sizeof(b), "%s: the child died without answering", what);
    return b;
}

#endif
