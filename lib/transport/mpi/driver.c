/* SPDX-License-Identifier: MIT */
/* The MPI transport's driver (driver.h): boot the job (mpi_job.h), open the
 * instance that reaches the other hosts (mpi_tport.h), finish the job. In
 * the plug-in (plugin.h), or linked into a program that uses the transport
 * itself. */
#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>

#include "driver.h"
#include "error.h"
#include "mpi_job.h"
#include "mpi_tport.h"
#include "plugin.h"

static int boot(void **out)
{
    struct sr_mpi_job *job = calloc(1, sizeof(*job));
    if (!job)
        return sr__fail(-ENOMEM, "sr_init", "out of memory");
    int rc = sr__mpi_boot(job);
    if (rc) {
        free(job);
        return rc;
    }
    *out = job;
    return 0;
}

/* Over several (pretend) hosts: a collective, every rank of the job opens
 * it, or none. */
static int open_remote(void *p, const char *name, const struct sr_tport_marshal *marshal, sr_tport **out,
                       bool *reach)
{
    struct sr_mpi_job *job = p;
    *out = NULL;
    if (job->nhosts < 2)
        return 0;
    int rc = sr__mpi_tport_create(job, name, out);
    if (rc)
        return rc;
    (*out)->marshal = marshal;
    /* The sleeps bounded by its poll interval (from 5 microseconds) must
     * not be stretched by the default 50 us timer slack; the runtime's
     * threads, created after this, inherit it. */
    prctl(PR_SET_TIMERSLACK, 1000UL);
    for (int r = 0; r < job->world; r++)
        reach[r] = job->host_of[r] != job->host;
    return 0;
}

static void fini(void *p)
{
    sr__mpi_job_fini(p);
    free(p);
}

const struct sr_tport_driver sr__mpi_builtin_driver = {
    .kind = "mpi",
    .launched = sr__mpi_launched,
    .boot = boot,
    .open = open_remote,
    .close = sr__mpi_tport_destroy,
    .fini = fini,
};
