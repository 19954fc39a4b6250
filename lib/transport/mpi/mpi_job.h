/* SPDX-License-Identifier: MIT */
/* shmrpc across hosts over Open MPI (internal; built with SR_HAVE_MPI).
 *
 * A job launched by mpirun: shmrpc ranks are the ranks of the job's
 * communicator (MPI_COMM_WORLD, or the test runner's, sr__mpi_use_comm).
 * The ranks that share a host (MPI_Comm_split_type SHARED, further split
 * into SHMRPC_HOSTS=k pretend hosts for tests) build one shared-memory
 * segment among themselves: the host's lowest rank creates it laid out for
 * the whole world, and only the host's ranks attach (the others' worker
 * lines stay empty). Within a host messages go through the rings as under
 * shmrun; between hosts through the MPI transport (mpi_tport.c).
 *
 * Lifetime: sr__mpi_boot runs in sr_init before the shared-memory transport
 * attaches (it sets the launch environment, segment.h); the job lives until
 * sr__mpi_job_fini in sr_shutdown, after the transport detached. Each
 * sr_init boots anew (a new segment: init -> shutdown -> init works as under
 * shmrun). MPI itself is initialised once per process (MPI_Init_thread,
 * MPI_THREAD_MULTIPLE) and finalised at exit, unless the program
 * initialised it itself (then it must ask for MPI_THREAD_MULTIPLE, and
 * finalise it after sr_shutdown).
 *
 * The segment: a memfd made by the host's lowest rank; the host's other
 * ranks open it through /proc/<creator's pid>/fd/<fd>, and after the
 * bootstrap every rank holds its own fd (job.fd), closed by
 * sr__mpi_job_fini: no file exists in any file system, and the memory goes
 * with the last rank of the host. Its worker lines of other hosts' ranks stay
 * empty: sr__seg_attaches / sr__xport_local say which ranks are local, and the
 * shared-memory transport has no inbox, name or pidfd for the others.
 *
 * Errors of MPI calls on comm (and communicators made from it) return
 * (MPI_ERRORS_RETURN) instead of aborting: check every code.
 */
#ifndef SR_MPI_JOB_H
#define SR_MPI_JOB_H

#if !defined(SR__IN_TRANSPORT)
#error "mpi_job.h is private to the transport layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include <mpi.h>

struct sr_mpi_job {
    int rank, world;  /* in comm */
    int host, nhosts; /* this rank's host (real or pretend) in [0, nhosts), and how many there are */
    int *host_of;     /* [world]: each rank's host; hosts are numbered by their lowest rank */
    MPI_Comm comm;    /* a duplicate of the job's communicator, ours alone */
    int fd;           /* this host's segment (the launch fd); -1 after fini */
    bool live;        /* booted, not yet finished: MPI is not finalized at exit under it (boot.c) */
};

/* Was this process started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
 * PMIx PMIX_RANK), or has the program initialised MPI itself? */
bool sr__mpi_launched(void);

/* Bootstrap (above; collective over the job's communicator): 0, or -errno
 * with sr_last_error naming the step, the rank and the value; every rank
 * then fails (a rank's failure is agreed on before anyone attaches). Errors:
 * -EINVAL bad SHMRPC_HOSTS (it must be an integer in [1, world]) or too many
 * ranks; -ENOTSUP MPI without MPI_THREAD_MULTIPLE; -EIO an MPI call failed;
 * -errno of memfd_create, open of /proc/<pid>/fd/<fd>, ...; -ENOMEM. On
 * failure *job is as after sr__mpi_job_fini. */
int sr__mpi_boot(struct sr_mpi_job *job);
/* Close the segment fd, forget the launch environment, free host_of and
 * comm. Idempotent. */
void sr__mpi_job_fini(struct sr_mpi_job *job);

/* MPI's own text for an error code (or "MPI error N"), in buf. */
const char *sr__mpi_strerror(int code, char *buf, size_t len);

/* Tests: the next sr_init uses *comm instead of MPI_COMM_WORLD (the MPI
 * suite runner gives each test a sub-world of the size it asks for). */
void sr__mpi_use_comm(const MPI_Comm *comm);

#endif
