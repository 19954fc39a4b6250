/* SPDX-License-Identifier: MIT */
/* The MPI suite runner's own tests (tests/mpi/selftest.sh checks the lines
 * it prints): checks, skips, agreement across ranks, jobs on the first
 * ranks, the shared page and pipe, and the bounds (a hung test, a worker
 * that leaves its job). No shmrpc job here: the workers do not sr_init. */
#include <mpi.h>
#include <poll.h>
#include <time.h>

#include "../rpc_harness.h"

static int rank_(void)
{
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static int after_fatal, after_expect; /* what the checks let run: seen by the last test */

Test(selftest, passes) { cr_assert_eq(2 + 2, 4); }

Test(selftest, fatal_check_stops_the_test)
{
    cr_assert_eq(1 + 1, 3, "arithmetic %s", "fails");
    after_fatal = 1;
}

Test(selftest, expect_goes_on)
{
    cr_expect(0, "first");
    after_expect = 1;
}

Test(selftest, one_rank_fails) { cr_assert(rank_() != 3, "only here"); }

static int fail_on_2(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    return rank == 2 ? 7 : 0;
}

Test(selftest, worker_failure_names_the_rank)
{
    sr_spawn_opts o = {.name_prefix = "fail2"};
    cr_assert_eq(sr_spawn(4, fail_on_2, NULL, &o), 0, "%s", sr_last_error());
}

static _Atomic int *counter;

static int add_rank(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    atomic_fetch_add(counter, rank + 1);
    return 0;
}

Test(selftest, shared_page_and_jobs_on_the_first_ranks)
{
    counter = shared_page(4096);
    cr_assert_eq(sr_spawn(3, add_rank, NULL, NULL), 0, "%s", sr_last_error());
    cr_assert_eq(atomic_load(counter), 1 + 2 + 3, "every rank sees the job's workers' sums");
}

static int fds[2];

static int pass_bytes(int rank, int world, void *arg)
{
    (void)arg;
    if (rank == 0)
        for (int i = 1; i < world; i++)
            WCHECK(write(fds[1], "x", 1) == 1, "write");
    else {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        char b;
        WCHECK(poll(&p, 1, 20000) == 1 && read(fds[0], &b, 1) == 1 && b == 'x', "rank %d read nothing", rank);
    }
    return 0;
}

Test(selftest, shared_pipe_crosses_ranks, .timeout = 30)
{
    cr_assert(pipe(fds) == 0);
    cr_assert_eq(sr_spawn(4, pass_bytes, NULL, NULL), 0, "%s", sr_last_error());
    close(fds[0]);
    close(fds[1]);
}

Test(selftest, job_larger_than_the_world) { cr_assert_eq(sr_spawn(5, add_rank, NULL, NULL), 0); }

Test(selftest, disabled, .disabled = true) { cr_assert(0); }

Test(selftest, what_the_checks_let_run)
{
    cr_assert_eq(after_fatal, 0, "code after a failed cr_assert ran");
    cr_assert_eq(after_expect, 1, "code after a failed cr_expect did not run");
}

/* Run alone (--filter): each ends the MPI job. */
Test(selftest_bounds, hang, .timeout = 2)
{
    struct timespec ts = {60, 0};
    nanosleep(&ts, NULL);
}

static int leave(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    if (rank == 1)
        _exit(3);
    struct timespec ts = {60, 0};
    nanosleep(&ts, NULL);
    return 0;
}

Test(selftest_bounds, exit_in_a_job, .timeout = 30) { sr_spawn(2, leave, NULL, NULL); }
