/* SPDX-License-Identifier: MIT */
/* One worker's transports (transport.h, sr_transports): the shared-memory
 * transport within the host, and, when a launcher's transport booted the
 * job over several hosts (driver.h), its instance for the ranks of the
 * other hosts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "error.h"
#include "heap.h"
#include "segment.h" /* the launch environment */
#include "transport.h"
#include "shm/xport.h"

/* The launchers' transports, asked in order when no launch environment
 * exists; last, the one-worker job of a program started by none (solo.c). */
static const struct sr_tport_driver *const drivers[] = {&sr__mpi_driver, &sr__solo_driver};

struct sr_transports {
    int rank, world;
    sr_tport *home, *polled;
    sr_tport **peer;                      /* [world] */
    sr_xport *shm;                        /* home's transport */
    const struct sr_tport_driver *driver; /* the launcher's that booted the job, or NULL */
    void *job;                            /* its job state */
};

/* Not under shmrun or sr_spawn (env: -ENOENT): the driver of the launcher
 * that started us boots the job, which then sets the launch environment. */
static int launch(sr_transports *s, struct sr_launch_env *env)
{
    int rc = sr__launch_env_get(env);
    for (size_t i = 0; rc == -ENOENT && i < sizeof(drivers) / sizeof(drivers[0]); i++) {
        if (!drivers[i]->launched())
            continue;
        if ((rc = drivers[i]->boot(&s->job)))
            return rc;
        s->driver = drivers[i];
        return sr__launch_env_get(env);
    }
    return rc;
}

/* Per peer: home, or the driver's instance for the ranks it reaches. */
static int choose(sr_transports *s, const struct sr_transport_opts *o, const char *name)
{
    s->home = sr__xport_transport(s->shm);
    s->rank = s->shm->rank;
    s->world = s->shm->world;
    s->peer = calloc((size_t)s->world, sizeof(*s->peer));
    bool *reach = calloc((size_t)s->world, sizeof(*reach));
    int rc = s->peer && reach ? 0 : sr__fail(-ENOMEM, "sr_init", "out of memory");
    if (!rc && s->driver && s->driver->open)
        rc = s->driver->open(s->job, name, o->marshal, &s->polled, reach);
    for (int r = 0; !rc && r < s->world; r++)
        s->peer[r] = s->polled && reach[r] && r != s->rank ? s->polled : s->home;
    free(reach);
    return rc;
}

int sr__transport_open(const struct sr_transport_opts *o, sr_transports **out)
{
    sr_transports *s = calloc(1, sizeof(*s));
    if (!s)
        return sr__fail(-ENOMEM, "sr_init", "out of memory");
    struct sr_launch_env env;
    char name[SR_NAME_MAX];
    int rc = launch(s, &env);
    if (!rc)
        snprintf(name, sizeof(name), "%s", o->name ? o->name : "");
    if (!rc && !o->name)
        snprintf(name, sizeof(name), "worker%d", env.rank);
    /* under another launcher no supervisor publishes the local peers' exits */
    sr_xport_opts xo = {.name = name, .publish_exits = s->driver != NULL};
    if (!rc)
        rc = sr__xport_attach(&xo, &s->shm);
    if (!rc)
        rc = choose(s, o, name);
    if (rc) {
        sr__transport_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sr__transport_close(sr_transports *s)
{
    if (!s)
        return;
    if (s->polled && s->driver->close)
        s->driver->close(s->polled); /* first: its sends still in flight drop their parts in the heap */
    if (s->shm) {
        sr__heap_detach();
        sr__xport_detach(s->shm);
    }
    if (s->driver && s->driver->fini)
        s->driver->fini(s->job);
    free(s->peer);
    free(s);
}

int sr__transport_rank(const sr_transports *s) { return s->rank; }
int sr__transport_world(const sr_transports *s) { return s->world; }
sr_tport *sr__transport_home(const sr_transports *s) { return s->home; }
sr_tport *sr__transport_polled(const sr_transports *s) { return s->polled; }
sr_tport *const *sr__transport_peers(const sr_transports *s) { return s->peer; }

void *sr__transport_job(const sr_transports *s, const char *kind)
{
    return s->driver && !strcmp(s->driver->kind, kind) ? s->job : NULL;
}

sr_xport *sr__transport_xport(const sr_transports *s) { return s->shm; }
struct sr_segment *sr__transport_segment(const sr_transports *s) { return s->shm ? &s->shm->seg : NULL; }
