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
 * sr__mpi_job_fini in sr_shutdown. MPI itself is initialised once per
 * process (MPI_Init_thread, MPI_THREAD_MULTIPLE) and finalised at exit,
 * unless the program initialised it itself.
 */
#ifndef SR_MPI_JOB_H
#define SR_MPI_JOB_H

#include <stdbool.h>

#include <mpi.h>

struct sr_mpi_job {
    int rank, world;  /* in comm */
    int host, nhosts; /* this rank's host (real or pretend), and how many there are */
    int *host_of;     /* [world]: each rank's host */
    MPI_Comm comm;    /* a duplicate of the job's communicator, ours alone */
};

/* Was this process started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
 * PMIx PMIX_RANK), or has the program initialised MPI itself? */
bool sr__mpi_launched(void);

/* Bootstrap (above): 0, or -errno with sr_last_error naming the step. */
int sr__mpi_boot(struct sr_mpi_job *job);
void sr__mpi_job_fini(struct sr_mpi_job *job);

/* Tests: the next sr_init uses *comm instead of MPI_COMM_WORLD (the MPI
 * suite runner gives each test a sub-world of the size it asks for). */
void sr__mpi_use_comm(const MPI_Comm *comm);

#endif
