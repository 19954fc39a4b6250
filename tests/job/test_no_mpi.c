/* SPDX-License-Identifier: MIT */
/* A build without Open MPI, started by mpirun: sr_init refuses with a
 * message that says so, instead of the shmrun advice (registered only when
 * the build has no MPI, tests/meson.build). mpirun is not needed to see it:
 * its environment is what sr_init looks at. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "shmrpc/rpc.h"

LEAK_CHECKED_SUITE(no_mpi);

Test(no_mpi, sr_init_under_mpirun_says_mpi_support_was_not_built)
{
    unsetenv("SHMRPC_FD");
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    int rc = sr_init(NULL);
    cr_assert_eq(rc, -ENOTSUP, "sr_init returned %d (%s)", rc, sr_last_error());
    cr_assert(strstr(sr_last_error(), "shmrpc was built without MPI support"), "%s", sr_last_error());
}

/* Two workers asked for without a launcher (no launcher at all makes a
 * one-worker job: tests/job/check_solo.py). */
Test(no_mpi, sr_init_without_a_launcher_still_names_shmrun)
{
    unsetenv("SHMRPC_FD");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMIX_RANK");
    setenv("SHMRPC_WORLD_SIZE", "2", 1);
    int rc = sr_init(NULL);
    cr_assert_eq(rc, -ENOENT, "sr_init returned %d (%s)", rc, sr_last_error());
    cr_assert(strstr(sr_last_error(), "SHMRPC_FD is not set"), "%s", sr_last_error());
}
