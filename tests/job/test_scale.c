/* SPDX-License-Identifier: MIT */
/* Start-up at scale: a job of SCALE_N workers under sr_spawn, each of which
 * attaches, finds its neighbour by name and completes a call to it.
 *
 * What each worker's start-up may cost does not grow with the job
 * (docs/PERFORMANCE.md, "Start-up at scale"), checked per worker:
 *   - the start barrier wakes a waiting worker once, when the last worker
 *     arrives, not at every arrival: the voluntary context switches of
 *     sr_init's thread stay under a small bound whatever the job's size
 *     (an early worker was woken by each of the others: about SCALE_N);
 *   - under a launcher, which publishes every exit itself (segment.h, "Peer
 *     exit"), a worker opens no pidfd on its peers (it opened SCALE_N - 1).
 * Workers are forked copies of this test: they report through a shared page
 * and their exit status, never through Criterion. Every wait is bounded:
 * sr_init's start barrier (60 s), the call's timeout, sr_shutdown's.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common.h"
#include "helpers/pidfds.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "shmrpc/value.h"

LEAK_CHECKED_SUITE(scale);

#define SCALE_N 128
#define MAX_SWITCHES 16 /* sr_init's own sleeps: the barrier's one, the threads it starts */

enum { EXIT_INIT = 41, EXIT_NAME, EXIT_CALL, EXIT_ANSWER, EXIT_SHUTDOWN };

struct worker_seen {
    _Atomic int called;  /* its call to its neighbour came back with the right answer */
    long switches;       /* voluntary context switches of its thread inside sr_init */
    int pidfds;          /* pidfds it holds once past sr_init */
};

static long switches_now(void)
{
    struct rusage u;
    return getrusage(RUSAGE_THREAD, &u) ? -1 : u.ru_nvcsw;
}

/* Worker: sr_init as "s<rank>", look the neighbour up by name, call echo
 * on it with our rank, check the answer, shut down gracefully. */
static int worker(int rank, int n, void *arg)
{
    struct worker_seen *seen = arg;
    char name[16], next[16];
    snprintf(name, sizeof(name), "s%d", rank);
    snprintf(next, sizeof(next), "s%d", (rank + 1) % n);
    long before = switches_now();
    if (sr_init(&(sr_init_opts){.name = name, .num_worker_threads = 1}))
        return EXIT_INIT;
    seen[rank].switches = switches_now() - before;
    seen[rank].pidfds = count_pidfds();
    int to = sr_worker_rank(next);
    if (to != (rank + 1) % n) {
        sr_shutdown(false, 0);
        return EXIT_NAME;
    }
    sr_value *arg_v = sr_int(rank), *out = NULL;
    int rc = sr_rpc_sync(to, "echo", SR_ARGS(arg_v), 60, &out);
    sr_value_unref(arg_v);
    bool right = !rc && out && sr_value_type(out) == SR_KIND_INT && sr_value_int(out) == rank;
    sr_value_unref(out);
    if (rc || !right) {
        sr_shutdown(false, 0);
        return rc ? EXIT_CALL : EXIT_ANSWER;
    }
    atomic_store_explicit(&seen[rank].called, 1, memory_order_relaxed); /* relaxed: read after sr_spawn reaped us */
    return sr_shutdown(true, 120) ? EXIT_SHUTDOWN : 0;
}

Test(scale, every_worker_completes_a_call, .timeout = 300)
{
    size_t bytes = SCALE_N * sizeof(struct worker_seen);
    struct worker_seen *seen = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(seen, MAP_FAILED, "mmap: %s", strerror(errno));
    for (int r = 0; r < SCALE_N; r++)
        seen[r].switches = seen[r].pidfds = -1;
    sr_spawn_opts o = {.shm_size = (uint64_t)SCALE_N * (6u << 20), .ring_slots = 64,
                       .name_prefix = test_ns("scale")};
    int rc = sr_spawn(SCALE_N, worker, seen, &o);
    cr_assert_eq(rc, 0, "sr_spawn of %d workers: %d: %s", SCALE_N, rc, sr_last_error());
    long most = 0;
    int most_rank = 0, pidfd_rank = -1;
    for (int r = 0; r < SCALE_N; r++) {
        cr_assert_eq(atomic_load_explicit(&seen[r].called, memory_order_relaxed), 1,
                     "rank %d of %d never completed its call", r, SCALE_N);
        if (seen[r].pidfds && pidfd_rank < 0)
            pidfd_rank = r;
        if (seen[r].switches > most)
            most = seen[r].switches, most_rank = r;
    }
    cr_expect_lt(pidfd_rank, 0, "rank %d holds %d pidfds past sr_init (its launcher publishes every exit)", pidfd_rank,
                 pidfd_rank < 0 ? 0 : seen[pidfd_rank].pidfds);
    cr_expect_leq(most, MAX_SWITCHES,
                  "rank %d's sr_init slept %ld times (bound %d, %d workers): the start barrier woke it for "
                  "arrivals other than the last",
                  most_rank, most, MAX_SWITCHES, SCALE_N);
    munmap(seen, bytes);
}
