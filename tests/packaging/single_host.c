/* SPDX-License-Identifier: MIT */
/* A single-host program linked with libshmrpc.so (tests/packaging):
 *
 *   single_host maps      a worker of a 2-worker sr_spawn job makes an RPC;
 *                         neither it nor the parent ever maps a library of
 *                         Open MPI's (libmpi, libopen-pal, libopen-rte, pmix)
 *   single_host plugin P  under mpirun's environment, with SHMRPC_MPI_PLUGIN=P
 *                         (absent), sr_init fails with -ELIBACC naming P
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shmrpc/shmrpc.h>

/* The first mapped file of Open MPI's, or NULL. */
static const char *mpi_mapped(void)
{
    static char line[1024];
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return "(cannot read /proc/self/maps)";
    const char *hit = NULL;
    while (!hit && fgets(line, sizeof(line), f)) {
        const char *p = strchr(line, '/');
        if (p && (strstr(p, "libmpi") || strstr(p, "libopen-pal") || strstr(p, "libopen-rte") || strstr(p, "pmix") ||
                  strstr(p, "libshmrpc-mpi")))
            hit = p;
    }
    fclose(f);
    return hit;
}

static int plus_one(sr_call *c) { return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0)) + 1)); }

static int worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    if (sr_init(NULL))
        return fprintf(stderr, "single_host: sr_init: %s\n", sr_last_error()), 1;
    int bad = 0;
    if (rank == 0) {
        sr_value *x = sr_int(41), *y = NULL;
        int rc = sr_rpc_sync(1, "plus_one", SR_ARGS(x), 10000, &y);
        long long v = y ? (long long)sr_value_int(y) : -1;
        sr_value_unref(x);
        sr_value_unref(y);
        if (rc || v != 42)
            bad = fprintf(stderr, "single_host: rpc_sync returned %d, value %lld: %s\n", rc, v, sr_last_error());
    }
    const char *m = mpi_mapped();
    if (m)
        bad = fprintf(stderr, "single_host: worker %d maps %s", rank, m);
    return sr_shutdown(true, 0) || bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "maps")) {
        if (sr_register("plus_one", plus_one))
            return fprintf(stderr, "single_host: sr_register: %s\n", sr_last_error()), 1;
        int rc = sr_spawn(2, worker, NULL, NULL);
        if (rc)
            return fprintf(stderr, "single_host: sr_spawn: %d %s\n", rc, sr_last_error()), 1;
        const char *m = mpi_mapped();
        if (m)
            return fprintf(stderr, "single_host: the parent maps %s", m), 1;
        printf("single_host: a 2-worker job ran, and no library of Open MPI's was loaded\n");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "plugin")) {
        setenv("SHMRPC_MPI_PLUGIN", argv[2], 1);
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        unsetenv("SHMRPC_FD");
        int rc = sr_init(NULL);
        printf("single_host: sr_init under mpirun without the plug-in: %d: %s\n", rc, sr_last_error());
        if (rc != -ELIBACC || !strstr(sr_last_error(), argv[2]))
            return fprintf(stderr, "single_host: expected -ELIBACC (%d) naming %s\n", -ELIBACC, argv[2]), 1;
        return 0;
    }
    fprintf(stderr, "usage: single_host maps | plugin PATH\n");
    return 2;
}
