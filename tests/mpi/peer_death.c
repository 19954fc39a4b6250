/* SPDX-License-Identifier: MIT */
/* A rank on another (pretend) host dies in the middle of a call: the job
 * must end, never hang (the failure policy across hosts: mpirun's
 * abort; docs/MULTIHOST.md). Run by peer_death.sh under mpirun -n 4 with
 * SHMRPC_HOSTS=2: rank 0 calls "die" on rank 3 (the other host) with no
 * timeout, and rank 3 kills itself with SIGKILL inside it; ranks 1 and 2
 * wait for rank 0. Nothing here ends the wait: only the launcher's abort
 * can, and peer_death.sh bounds it. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "shmrpc/shmrpc.h"

static int die(sr_call *c)
{
    (void)c;
    fprintf(stderr, "peer_death: rank %d dies inside 'die'\n", sr_rank());
    fflush(stderr);
    raise(SIGKILL);
    return 0;
}

int main(void)
{
    sr_register("die", die);
    if (sr_init(NULL)) {
        fprintf(stderr, "peer_death: sr_init: %s\n", sr_last_error());
        return 1;
    }
    int rank = sr_rank();
    if (rank == 0) {
        int rc = sr_rpc_sync(3, "die", SR_NOARGS, SR_TIMEOUT_NONE, NULL); /* 0: no timeout */
        fprintf(stderr, "peer_death: rank 0: the call returned %d: %s\n", rc, sr_last_error());
    }
    sr_shutdown(true, 0); /* waits for rank 0, which waits for rank 3 */
    return 0;
}
