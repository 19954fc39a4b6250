/* SPDX-License-Identifier: MIT */
/* A peer on the same (pretend) host dies in the middle of a call under
 * mpirun: the caller's wait fails at once with -EPIPE naming it, as under
 * shmrun, though no process of the host is the others' parent (the
 * survivors publish the exit from their pidfds: lib/transport/shm/orphan.c). Run by
 * local_death.sh as mpirun -n 4 with SHMRPC_HOSTS=2: rank 0 calls "die" on
 * rank 1 with no timeout; rank 1 ends its process inside it. Rank 0 prints
 * what the call returned; the launcher then ends the job. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shmrpc/shmrpc.h"

static int die(sr_call *c)
{
    (void)c;
    fflush(stderr);
    _exit(3);
}

int main(void)
{
    sr_register("die", die);
    if (sr_init(NULL)) {
        fprintf(stderr, "local_death: sr_init: %s\n", sr_last_error());
        return 1;
    }
    if (sr_rank() == 0) {
        int rc = sr_rpc_sync(1, "die", SR_NOARGS, SR_TIMEOUT_NONE, NULL); /* 0: no timeout */
        printf("local_death: rank 0: the call to rank 1 returned %d (%s): %s\n", rc,
               rc == -EPIPE ? "EPIPE" : "not EPIPE", sr_last_error());
        fflush(stdout);
        sr_shutdown(false, 0);
        return rc == -EPIPE ? 0 : 1;
    }
    sr_shutdown(true, 0); /* ranks 2 and 3 wait here until the launcher ends the job */
    return 0;
}
