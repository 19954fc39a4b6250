/* SPDX-License-Identifier: MIT */
/* The driver of a program started by no launcher (driver.h), asked after
 * the launchers' drivers: the process makes a one-worker job of its own, as
 * PyTorch's init_rpc(world_size=1) does, instead of failing. Without any
 * SHMRPC_* variable it says so in one line and how to start N workers; with
 * SHMRPC_WORLD_SIZE=1 (and SHMRPC_RANK unset or 0) it asked for this and is
 * quiet. Any other rank or world size without a launcher is refused by the
 * launch environment, naming the launchers (docs/LAUNCHER.md, "Without a
 * launcher"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "error.h"
#include "log.h"
#include "segment.h"

static bool env_is(const char *name, const char *want)
{
    const char *v = getenv(name);
    return !v || !strcmp(v, want);
}

static bool launched(void) { return env_is("SHMRPC_WORLD_SIZE", "1") && env_is("SHMRPC_RANK", "0"); }

/* The job: the segment's fd, the launch fd (the mapping goes at once). */
struct solo_job {
    int fd;
};

static int boot(void **out)
{
    struct solo_job *job = calloc(1, sizeof(*job));
    if (!job)
        return sr__fail(-ENOMEM, "sr_init", "out of memory");
    char name[48];
    snprintf(name, sizeof(name), "shmrpc-solo-%d", (int)getpid());
    sr_segment seg;
    int rc = sr__segment_create(&(sr_segment_opts){.world_size = 1, .name = name}, &seg);
    if (rc) {
        free(job);
        return rc;
    }
    job->fd = seg.fd;
    sr__segment_detach(&seg, false); /* the fd keeps the memory */
    if (!getenv("SHMRPC_WORLD_SIZE"))
        sr_logf(SR_LOG_WARN, "not started by shmrun, sr_spawn or mpirun: running as a one-worker job (rank 0 of 1); "
                "for N workers run 'shmrun -n N %s' (SHMRPC_WORLD_SIZE=1: one worker, no warning)",
                program_invocation_short_name);
    sr__launch_env_set(&(struct sr_launch_env){.fd = job->fd, .rank = 0, .world_size = 1});
    *out = job;
    return 0;
}

static void fini(void *p)
{
    struct solo_job *job = p;
    sr__launch_env_clear();
    close(job->fd);
    free(job);
}

const struct sr_tport_driver sr__solo_driver = {.kind = "solo", .launched = launched, .boot = boot, .fini = fini};
