/* SPDX-License-Identifier: MIT */
/* What the segment's tests share (tests/shm/test_segment.c, the substrate's
 * checks; tests/transport/test_xport_attach.c, the transport's attach to the
 * same segments): one small segment per test, the error text it expects,
 * and the launch variables shmrun sets. Include it once, in a Criterion
 * test file (the segment is the file's). */
#ifndef SR_TESTS_SEGMENT_FIXTURE_H
#define SR_TESTS_SEGMENT_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "heap.h"
#include "segment.h"

static sr_segment seg;

/* The smallest valid segment for two workers. */
static void make_segment(void)
{
    sr_segment_opts o = {.world_size = 2, .ring_slots = 64, .name = test_ns("seg")};
    o.size = sr__segment_fixed_size(2, 64) + 2 * SR_HEAP_MIN;
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "sr__segment_create: %s", sr_last_error());
}

static void drop_segment(void)
{
    if (seg.base)
        sr__segment_detach(&seg, true);
    sr_test_no_leaks();
}

static void assert_msg(const char *want)
{
    cr_assert(strstr(sr_last_error(), want), "sr_last_error() is '%s'; it should name '%s'", sr_last_error(), want);
}

/* The variables shmrun sets (sr__launch_env_get). */
static void set_env(const char *fd, const char *rank, const char *world)
{
    fd ? setenv("SHMRPC_FD", fd, 1) : unsetenv("SHMRPC_FD");
    rank ? setenv("SHMRPC_RANK", rank, 1) : unsetenv("SHMRPC_RANK");
    world ? setenv("SHMRPC_WORLD_SIZE", world, 1) : unsetenv("SHMRPC_WORLD_SIZE");
}

#endif
