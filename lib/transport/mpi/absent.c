/* The MPI driver of a build without Open MPI (driver.h): it recognises
 * mpirun's environment only to say that MPI support was not built. */
#include <errno.h>
#include <stdlib.h>

#include "driver.h"
#include "error.h"

static bool launched(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK"); }

static int boot(void **job)
{
    *job = NULL;
    return sr__fail(-ENOTSUP, "sr_init",
                    "shmrpc was built without MPI support: rebuild it with Open MPI (libopenmpi-dev, meson "
                    "-Dmpi=enabled) to run under mpirun, or launch the program with shmrun");
}

/* Booting always fails: open, close and fini are never reached. */
const struct sr_tport_driver sr__mpi_driver = {.kind = "mpi", .launched = launched, .boot = boot};
