/* SPDX-License-Identifier: MIT */
/* How a launcher's transport joins the selection (select.c; internal to the
 * transport layer, not part of the seam).
 *
 * A process started by a launcher other than shmrun or sr_spawn (mpirun)
 * has no launch environment: the driver of that launcher's transport boots
 * the job, which sets the launch environment (segment.h) naming this host's
 * segment; the shared-memory transport then attaches to it, and the driver
 * opens the instance that reaches the ranks of other hosts. select.c lists
 * the drivers; each is built whether or not its library was found (without
 * it, boot explains how to rebuild), and a driver whose library is large
 * loads it only in boot (the MPI transport: a plug-in, mpi/plugin.h).
 */
#ifndef SR_TRANSPORT_DRIVER_H
#define SR_TRANSPORT_DRIVER_H

#if !defined(SR__IN_TRANSPORT)
#error "driver.h is private to the transport layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>

#include "transport.h"

struct sr_tport_driver {
    const char *kind; /* "mpi" */
    /* The process was started by this driver's launcher. */
    bool (*launched)(void);
    /* Boot the job (a collective over the launcher's ranks): 0 with *job
     * set and the launch environment set, or -errno (sr_last_error says
     * why; -ENOTSUP: the transport was not built). */
    int (*boot)(void **job);
    /* After the shared-memory transport attached as `name`: the instance
     * that reaches the ranks not on this host, its parts described by
     * marshal (it copies), and which ranks it reaches (reach[world], all
     * false on entry); *out NULL when every rank is on this host. */
    int (*open)(void *job, const char *name, const struct sr_tport_marshal *marshal, sr_tport **out, bool *reach);
    /* Close what open made (NULL: nothing), before the shared-memory
     * transport detaches: its sends in flight drop their parts in the heap. */
    void (*close)(sr_tport *t);
    /* End the job after the shared-memory transport detached; frees job. */
    void (*fini)(void *job);
};

extern const struct sr_tport_driver sr__mpi_driver; /* mpi/load.c: loads the MPI transport under mpirun */
extern const struct sr_tport_driver sr__solo_driver; /* solo.c: no launcher, a one-worker job */

#endif
