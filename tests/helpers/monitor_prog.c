/* SPDX-License-Identifier: MIT */
/* A job for tests/job/test_monitor.c, under shmrun --monitor:
 *
 *   monitor_prog CALLS
 *
 * Rank 0 makes CALLS calls of the built-in noop on rank 1, then reads one
 * byte from its stdin (shmrun's: the test sends it once the monitor has
 * shown those calls, at most 60 s later), then shuts down; the other ranks
 * serve from sr_shutdown. Exits non-zero, saying why, if anything fails. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "shmrpc/shmrpc.h"

int main(int argc, char **argv)
{
    int calls = argc > 1 ? atoi(argv[1]) : 0;
    if (sr_init(NULL)) {
        fprintf(stderr, "monitor_prog: sr_init: %s\n", sr_last_error());
        return 1;
    }
    int rc = 0;
    for (int i = 0; sr_rank() == 0 && i < calls && !rc; i++)
        if ((rc = sr_rpc_sync(1, "noop", SR_NOARGS, 30, NULL)))
            fprintf(stderr, "monitor_prog: call %d: %s\n", i, sr_last_error());
    if (sr_rank() == 0 && !rc) {
        struct pollfd p = {.fd = 0, .events = POLLIN};
        char c;
        if ((rc = poll(&p, 1, 60000) != 1 || read(0, &c, 1) != 1))
            fprintf(stderr, "monitor_prog: no byte on stdin within 60 s\n");
    }
    if (sr_shutdown(true, 60)) {
        fprintf(stderr, "monitor_prog: sr_shutdown: %s\n", sr_last_error());
        return 1;
    }
    return rc;
}
