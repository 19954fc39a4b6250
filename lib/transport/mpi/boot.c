/* SPDX-License-Identifier: MIT */
/* The MPI bootstrap: from mpirun's ranks to one shared-memory segment per
 * host (mpi_job.h). The steps, each collective over the job's communicator:
 *   1. MPI_Init_thread(MPI_THREAD_MULTIPLE), once per process;
 *   2. duplicate the job's communicator (ours alone: tags cannot collide);
 *   3. split it by host (MPI_COMM_TYPE_SHARED), then into SHMRPC_HOSTS=k
 *      pretend hosts (rank r to r * k / world, within its real host);
 *   4. every rank learns every rank's host (one allgather of the host's
 *      lowest rank, numbered densely);
 *   5. the host's lowest rank creates the segment laid out for the whole
 *      world, with only the host's ranks marked as attaching (segment.h,
 *      "Partial attach"), and broadcasts its pid and fd number; the others
 *      open /proc/<pid>/fd/<fd> (a memfd: nothing exists in any file system);
 *   6. an allreduce of every rank's outcome: after it every rank holds its
 *      own fd (the creator's mapping and fd may go), or every rank fails.
 * The launch environment (segment.h) then names the fd, and sr__xport_attach
 * follows as under shmrun.
 */
#include "mpi_job.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "parse.h"
#include "segment.h"

static const MPI_Comm *next_comm; /* sr__mpi_use_comm; sr_init's lock orders it */
static unsigned boots;            /* segments made by this process, for their names */

void sr__mpi_use_comm(const MPI_Comm *comm) { next_comm = comm; }

bool sr__mpi_launched(void)
{
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK"))
        return true;
    int init = 0, fin = 0;
    MPI_Initialized(&init); /* both may be called at any time, even before MPI_Init */
    MPI_Finalized(&fin);
    return init && !fin;
}

const char *sr__mpi_strerror(int code, char *buf, size_t len)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int n = 0;
    if (MPI_Error_string(code, text, &n) != MPI_SUCCESS)
        snprintf(text, sizeof(text), "MPI error %d", code);
    snprintf(buf, len, "%s", text);
    return buf;
}

/* An MPI error code as -EIO with MPI's own text. */
static int mpi_fail(int code, const char *step, int rank)
{
    char text[MPI_MAX_ERROR_STRING];
    return sr__fail(-EIO, "sr_init", "MPI bootstrap, rank %d: %s failed: %s", rank, step,
                    sr__mpi_strerror(code, text, sizeof(text)));
}

static _Atomic int live_jobs; /* booted and not finished: an agent may be polling MPI */

/* A process that exits while sr_init's job is live (no sr_shutdown) must not
 * finalize MPI under the runtime's threads, which still poll it: it leaves
 * MPI as it is, and mpirun reports the exit without MPI_Finalize and ends
 * the job (docs/MULTIHOST.md, failure policy). */
static void finalize_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    /* relaxed: the count is written by sr_init and sr_shutdown, which the exiting thread ordered before */
    if (!fin && !atomic_load_explicit(&live_jobs, memory_order_relaxed))
        MPI_Finalize();
}

/* Step 1: MPI is initialised once per process, by us unless the program did. */
static int init_mpi(void)
{
    int init = 0, fin = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin)
        return sr__fail(-EINVAL, "sr_init", "MPI bootstrap: MPI_Finalize was already called in this process");
    if (!init) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "MPI_Init_thread", -1);
        atexit(finalize_at_exit);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE)
        return sr__fail(-ENOTSUP, "sr_init",
                        "MPI bootstrap: MPI provides thread level %d, shmrpc needs MPI_THREAD_MULTIPLE (%d)%s",
                        provided, MPI_THREAD_MULTIPLE,
                        init ? ": call MPI_Init_thread with MPI_THREAD_MULTIPLE before sr_init" : "");
    return 0;
}

/* SHMRPC_HOSTS=k: 0 when unset, else k in [1, world]. */
static int pretend_hosts(int rank, int world, int *k)
{
    const char *s = getenv("SHMRPC_HOSTS");
    *k = 0;
    if (!s)
        return 0;
    int64_t v;
    if (sr__parse_int(s, 1, SR_MAX_WORKERS, &v))
        return sr__fail(-EINVAL, "sr_init",
                        "MPI bootstrap, rank %d: environment SHMRPC_HOSTS=\"%s\" is not an integer in [1, %d] "
                        "(the number of pretend hosts)", rank, s, SR_MAX_WORKERS);
    /* More hosts than ranks: every rank its own host (a suite runner gives
     * each test a sub-world of the size it asks for, under one setting) */
    *k = v > world ? world : (int)v;
    return 0;
}

/* Step 3: the communicator of this rank's (pretend) host. */
static int split_host(struct sr_mpi_job *job, int k, MPI_Comm *host)
{
    MPI_Comm shared;
    int rc = MPI_Comm_split_type(job->comm, MPI_COMM_TYPE_SHARED, job->rank, MPI_INFO_NULL, &shared);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", job->rank);
    if (!k) {
        *host = shared;
        return 0;
    }
    int color = (int)((int64_t)job->rank * k / job->world);
    rc = MPI_Comm_split(shared, color, job->rank, host);
    MPI_Comm_free(&shared);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "MPI_Comm_split by SHMRPC_HOSTS", job->rank);
}

/* Number the hosts densely from lowest[r], each rank's host's lowest rank
 * (the host's id, unique across real and pretend hosts alike): host i is the
 * one with the i-th smallest lowest rank. A lowest rank must be a rank of
 * its own host, and not above r. */
static int number_hosts(struct sr_mpi_job *job, const int *lowest)
{
    int *id = malloc((size_t)job->world * sizeof(int));
    if (!id)
        return sr__fail(-ENOMEM, "sr_init", "MPI bootstrap, rank %d: no memory for %d ranks", job->rank, job->world);
    job->nhosts = 0;
    int rc = 0;
    for (int r = 0; r < job->world && !rc; r++) {
        int l = lowest[r];
        if (l < 0 || l > r || lowest[l] != l)
            rc = sr__fail(-EPROTO, "sr_init", "MPI bootstrap, rank %d: rank %d reports host id %d, not a lowest rank",
                          job->rank, r, l);
        else
            job->host_of[r] = l == r ? (id[r] = job->nhosts++) : id[l];
    }
    free(id);
    job->host = rc ? -1 : job->host_of[job->rank];
    return rc;
}

/* Step 4: host_of for every rank. */
static int learn_hosts(struct sr_mpi_job *job, MPI_Comm host)
{
    int lowest = job->rank, *all = malloc((size_t)job->world * sizeof(int));
    job->host_of = malloc((size_t)job->world * sizeof(int));
    if (!all || !job->host_of) {
        free(all);
        return sr__fail(-ENOMEM, "sr_init", "MPI bootstrap, rank %d: no memory for %d ranks", job->rank, job->world);
    }
    int rc = MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, host);
    if (rc == MPI_SUCCESS)
        rc = MPI_Allgather(&lowest, 1, MPI_INT, all, 1, MPI_INT, job->comm);
    rc = rc == MPI_SUCCESS ? number_hosts(job, all) : mpi_fail(rc, "exchanging host ids", job->rank);
    free(all);
    return rc;
}

/* Step 5, on the host's lowest rank: the segment, laid out for the world,
 * attached by this host's ranks. Its fd is the launch fd; the mapping goes. */
static int create_segment(struct sr_mpi_job *job)
{
    uint8_t *mask = malloc((size_t)job->world);
    if (!mask)
        return sr__fail(-ENOMEM, "sr_init", "MPI bootstrap, rank %d: no memory for %d ranks", job->rank, job->world);
    for (int r = 0; r < job->world; r++)
        mask[r] = job->host_of[r] == job->host;
    char name[48];
    snprintf(name, sizeof(name), "shmrpc-mpi-%d-h%d-%u", (int)getpid(), job->host, boots++);
    sr_segment seg;
    int rc = sr__segment_create(&(sr_segment_opts){.world_size = job->world, .name = name, .attaching = mask}, &seg);
    free(mask);
    if (rc)
        return rc;
    job->fd = seg.fd;
    sr__segment_detach(&seg, false); /* the fd keeps the memory: the peers open it through /proc */
    return 0;
}

/* Step 5, on the other ranks: open the creator's fd through /proc. A memfd
 * has no name in any file system; its creator keeps it open until step 6. */
static int open_segment(struct sr_mpi_job *job, int pid, int fd)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
    job->fd = open(path, O_RDWR | O_CLOEXEC);
    if (job->fd < 0)
        return sr__fail(-errno, "sr_init", "MPI bootstrap, rank %d: opening host %d's segment at %s: %s", job->rank,
                        job->host, path, strerror(errno));
    return 0;
}

/* Step 5: {outcome, pid, fd} from the host's creator to its ranks. */
static int share_segment(struct sr_mpi_job *job, MPI_Comm host)
{
    int me = 0, msg[3] = {0, (int)getpid(), -1};
    MPI_Comm_rank(host, &me);
    if (me == 0) {
        msg[0] = create_segment(job);
        msg[2] = job->fd;
    }
    int rc = MPI_Bcast(msg, 3, MPI_INT, 0, host);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Bcast of the segment's fd", job->rank);
    if (me == 0)
        return msg[0];
    if (msg[0] < 0)
        return sr__fail(msg[0], "sr_init", "MPI bootstrap, rank %d: host %d's segment was not made (%s; its creator's "
                        "error says why)", job->rank, job->host, strerror(-msg[0]));
    return open_segment(job, msg[1], msg[2]);
}

/* Step 6: every rank's outcome, so that no rank goes on to attach (and wait
 * for peers that will never come) when any failed. The creator's fd was
 * open until here; every rank of its host has its own now. */
static int agree(struct sr_mpi_job *job, int mine)
{
    struct { int rc, rank; } in = {mine, job->rank}, out;
    int rc = MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, job->comm);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Allreduce of the bootstrap's outcome", job->rank);
    if (mine || !out.rc)
        return mine;
    return sr__fail(out.rc, "sr_init", "MPI bootstrap, rank %d: rank %d failed to boot (%s)", job->rank, out.rank,
                    strerror(-out.rc));
}

/* Steps 2-6 on an initialised MPI. */
static int boot(struct sr_mpi_job *job, MPI_Comm base)
{
    int rc = MPI_Comm_dup(base, &job->comm), k = 0;
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Comm_dup", -1);
    MPI_Comm_set_errhandler(job->comm, MPI_ERRORS_RETURN); /* inherited by the splits below */
    MPI_Comm_rank(job->comm, &job->rank);
    MPI_Comm_size(job->comm, &job->world);
    if (job->world > SR_MAX_WORKERS) /* the same answer on every rank */
        return sr__fail(-EINVAL, "sr_init", "MPI bootstrap, rank %d: %d ranks, shmrpc has at most %d workers",
                        job->rank, job->world, SR_MAX_WORKERS);
    /* each rank reads its own environment: agree, so that none splits alone */
    if ((rc = agree(job, pretend_hosts(job->rank, job->world, &k))))
        return rc;
    MPI_Comm host = MPI_COMM_NULL;
    if (!(rc = split_host(job, k, &host)) && !(rc = learn_hosts(job, host)))
        rc = share_segment(job, host);
    if (host != MPI_COMM_NULL)
        MPI_Comm_free(&host);
    return agree(job, rc);
}

int sr__mpi_boot(struct sr_mpi_job *job)
{
    *job = (struct sr_mpi_job){.rank = -1, .host = -1, .comm = MPI_COMM_NULL, .fd = -1};
    const MPI_Comm *use = next_comm;
    int rc = init_mpi();
    if (!rc)
        rc = boot(job, use ? *use : MPI_COMM_WORLD);
    if (rc) {
        sr__mpi_job_fini(job);
        return rc;
    }
    sr__launch_env_set(&(struct sr_launch_env){.fd = job->fd, .rank = job->rank, .world_size = job->world});
    atomic_fetch_add_explicit(&live_jobs, 1, memory_order_relaxed); /* relaxed: see finalize_at_exit */
    job->live = true;
    return 0;
}

void sr__mpi_job_fini(struct sr_mpi_job *job)
{
    if (job->live)
        atomic_fetch_sub_explicit(&live_jobs, 1, memory_order_relaxed); /* relaxed: see finalize_at_exit */
    sr__launch_env_clear();
    if (job->fd >= 0)
        close(job->fd);
    free(job->host_of);
    int fin = 0;
    MPI_Finalized(&fin);
    if (job->comm != MPI_COMM_NULL && !fin)
        MPI_Comm_free(&job->comm);
    *job = (struct sr_mpi_job){.rank = -1, .host = -1, .comm = MPI_COMM_NULL, .fd = -1};
}
