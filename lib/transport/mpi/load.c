/* SPDX-License-Identifier: MIT */
/* The MPI driver that select.c lists (driver.h): it recognises mpirun's
 * environment, and only then loads the MPI transport, from the plug-in
 * (plugin.h) or, in a program that links the transport in, from itself.
 * In a build without Open MPI it says that MPI support was not built. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "driver.h"
#include "error.h"
#include "parse.h"
#include "plugin.h"
#include "shmrpc/version.h"

/* Started by mpirun (OMPI_COMM_WORLD_SIZE; PMIx: PMIX_RANK), or a program
 * that linked Open MPI itself and initialised it (then MPI_Initialized is
 * already in the process; looking it up loads nothing). */
static bool launched(void)
{
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK"))
        return true;
    int (*initialized)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "MPI_Initialized");
    int (*finalized)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "MPI_Finalized");
    int init = 0, fin = 0;
    if (initialized && finalized) {
        initialized(&init);
        finalized(&fin);
    }
    return init && !fin;
}

#ifdef SR_MPI_PLUGIN_FILE
static const struct sr_mpi_host host = {
    .abi = SR_MPI_PLUGIN_ABI,
    .version = SR_VERSION_STRING,
    .fail = sr__fail,
    .logf = sr_logf,
    .last_error = sr_last_error,
    .now_ns = sr__now_ns,
    .parse_int = sr__parse_int,
    .block_alloc = sr__block_alloc,
    .block_data = sr__block_data,
    .block_unref = sr__block_unref,
    .block_send_off = sr__block_send_off,
    .block_recv_off = sr__block_recv_off,
    .segment_create = sr__segment_create,
    .segment_detach = sr__segment_detach,
    .launch_env_set = sr__launch_env_set,
    .launch_env_clear = sr__launch_env_clear,
};

/* Where the plug-in may be, in order: SHMRPC_MPI_PLUGIN (a path) alone when
 * set; else beside the object holding this code (libshmrpc.so, or a program
 * linked with libshmrpc.a), then the installed library directory. */
static int candidates(char paths[2][PATH_MAX])
{
    const char *env = getenv("SHMRPC_MPI_PLUGIN");
    if (env && *env) {
        snprintf(paths[0], PATH_MAX, "%s", env);
        return 1;
    }
    int n = 0;
    Dl_info info;
    const char *slash = NULL;
    if (dladdr((void *)launched, &info) && info.dli_fname && (slash = strrchr(info.dli_fname, '/')))
        snprintf(paths[n++], PATH_MAX, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, SR_MPI_PLUGIN_FILE);
    snprintf(paths[n], PATH_MAX, "%s/%s", SR_MPI_PLUGIN_DIR, SR_MPI_PLUGIN_FILE);
    return n == 0 || strcmp(paths[0], paths[1]) ? n + 1 : n;
}

/* Open the plug-in once per process, never closed (Open MPI finalises at
 * exit, from the plug-in's code). RTLD_GLOBAL: Open MPI's own components,
 * which it opens in turn, resolve libmpi's symbols in the global scope. */
static int load(const struct sr_tport_driver **out)
{
    char paths[2][PATH_MAX], why[2][200];
    int n = candidates(paths);
    for (int i = 0; i < n; i++) {
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
        if (!h) {
            snprintf(why[i], sizeof(why[i]), "%s", dlerror());
            continue;
        }
        sr_mpi_plugin_entry_fn *entry = (sr_mpi_plugin_entry_fn *)dlsym(h, SR_MPI_PLUGIN_ENTRY);
        if (entry && (*out = entry(&host)))
            return 0;
        return sr__fail(-ELIBBAD, "sr_init", "the MPI transport plug-in %s is not of this library (shmrpc %s): "
                        "install the plug-in of the same build", paths[i], SR_VERSION_STRING);
    }
    return sr__fail(-ELIBACC, "sr_init", "under mpirun, and the MPI transport plug-in could not be loaded: %s%s%s "
                    "(install %s beside libshmrpc, or name it in SHMRPC_MPI_PLUGIN)",
                    why[0], n > 1 ? "; " : "", n > 1 ? why[1] : "", SR_MPI_PLUGIN_FILE);
}
#else
static int load(const struct sr_tport_driver **out)
{
    *out = NULL;
    return sr__fail(-ENOTSUP, "sr_init",
                    "shmrpc was built without MPI support: rebuild it with Open MPI (libopenmpi-dev, meson "
                    "-Dmpi=enabled) to run under mpirun, or launch the program with shmrun");
}
#endif

/* The transport's driver once booted: the one linked in, else the
 * plug-in's. Set by boot under sr_init's lock; open, close and fini come
 * after a boot that succeeded, in the same runtime's life. */
static const struct sr_tport_driver *mpi;

static int boot(void **job)
{
    *job = NULL;
    int rc = 0;
    if (!mpi && &sr__mpi_builtin_driver)
        mpi = &sr__mpi_builtin_driver;
    if (!mpi && (rc = load(&mpi)))
        return rc;
    return mpi->boot(job);
}

static int open_remote(void *job, const char *name, const struct sr_tport_marshal *marshal, sr_tport **out,
                       bool *reach)
{
    return mpi->open(job, name, marshal, out, reach);
}

static void close_remote(sr_tport *t) { mpi->close(t); }
static void fini(void *job) { mpi->fini(job); }

const struct sr_tport_driver sr__mpi_driver = {
    .kind = "mpi", .launched = launched, .boot = boot, .open = open_remote, .close = close_remote, .fini = fini};
