/* SPDX-License-Identifier: MIT */
/* The MPI suite runner's side of the test harness (tests/mpi/runner.c).
 * Under SR_TEST_MPI, tests/rpc_harness.h runs its jobs through these
 * instead of sr_spawn: every rank of the runner's job runs each test body;
 * a job of `world` workers is the runner's first `world` ranks, each
 * running its worker function in its own process (sr_init under mpirun,
 * on a sub-communicator: lib/transport/mpi/mpi_job.h's sr__mpi_use_comm).
 *
 * The collective calls below (srt_run, srt_shared_page, srt_shared_pipe)
 * are made by every rank in the same order, which holds because every rank
 * runs the same test body; each is bounded by the test's timeout (the
 * runner's watchdog takes the job down with a message naming the test). */
#ifndef SR_TESTS_MPI_SRT_H
#define SR_TESTS_MPI_SRT_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* Run fn(rank, world, arg) on the runner's ranks 0..world-1, the others
 * waiting; then every rank learns the outcome. 0 when every worker returned
 * 0, else -SR_EWORKER with sr_last_error() naming the first failing rank
 * (on every rank). A job larger than the runner's world skips the test
 * (cr_skip_test, with the reason). The segment size and ring slots of
 * sr_spawn's options are not honoured: under mpirun the job's defaults
 * apply (the message says so when they are asked for). */
int srt_run(const char *name, int world, int (*fn)(int, int, void *), void *arg, uint64_t shm_size,
            uint32_t ring_slots);

/* MAP_SHARED memory of n bytes, zeroed, the same pages on every rank (the
 * runner's ranks share one machine, even when they pretend to be several
 * hosts): what sr_spawn's workers inherit from the test. MAP_FAILED with
 * errno on failure, on every rank. Inside a job: private to the rank. */
void *srt_shared_page(size_t n);

/* A pipe every rank holds both ends of (a FIFO opened read-write): what
 * sr_spawn's workers inherit from a pipe() of the test. 0 or -1 with errno. */
int srt_shared_pipe(int fds[2]);

/* _exit() in a test under the runner: inside a job it takes the whole MPI
 * job down with a message naming the test and the rank (a worker that
 * leaves, as fail_fast does, is a death, and across hosts a death is the
 * job's abort); outside a job it is _exit. */
_Noreturn void srt_exit(int status);

#endif
