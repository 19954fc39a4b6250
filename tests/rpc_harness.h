/* SPDX-License-Identifier: MIT */
/* Harness for RPC tests: run a scenario on every worker of an sr_spawn job.
 * Each worker registers the test functions, sr_init()s, runs the scenario,
 * and shuts down gracefully with a bound; any failure makes the worker exit
 * non-zero, which fails sr_spawn with the rank in sr_last_error(). */
#ifndef SR_TESTS_RPC_HARNESS_H
#define SR_TESTS_RPC_HARNESS_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"

typedef int (*scenario_fn)(int rank, int world);

struct harness {
    scenario_fn scenario;
    void (*register_fns)(void);
    sr_init_opts opts;
    double shutdown_timeout;
    uint64_t shm_size; /* the job's segment; 0: 64 MiB per worker */
    uint32_t ring_slots; /* inbox slots per worker; 0: the default */
};

/* Shared across the job's processes: created before sr_spawn, inherited. */
static inline void *shared_page(size_t n)
{
#ifdef SR_TEST_MPI
    void *p = srt_shared_page(n); /* the runner's ranks share it instead */
#else
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
#endif
    cr_assert_neq(p, MAP_FAILED);
    return p;
}

static int harness_worker(int rank, int world, void *arg)
{
    struct harness *h = arg;
    if (h->register_fns)
        h->register_fns();
    WCHECK(sr_init(&h->opts) == 0, "sr_init: %s", sr_last_error());
    int rc = h->scenario(rank, world);
    int sd = sr_shutdown(true, h->shutdown_timeout > 0 ? h->shutdown_timeout : 60);
    WCHECK(sd == 0, "rank %d: graceful shutdown failed: %s", rank, sr_last_error());
    return rc;
}

#ifndef SR_TEST_MPI
static inline int run_job(const char *name, int world, struct harness *h)
{
    uint64_t size = h->shm_size ? h->shm_size : (uint64_t)world * (64u << 20);
    sr_spawn_opts o = {.name_prefix = test_ns(name), .shm_size = size, .ring_slots = h->ring_slots};
    return sr_spawn(world, harness_worker, h, &o);
}
#else
/* The MPI suite runner (tests/mpi): the job is the runner's first `world`
 * ranks, each running its worker in its own process; what the suites do
 * with sr_spawn, their pipes and _exit goes through the runner too. */
static inline int run_job(const char *name, int world, struct harness *h)
{
    return srt_run(name, world, harness_worker, h, h->shm_size, h->ring_slots);
}
static inline int srt_spawn(int world, int (*fn)(int, int, void *), void *arg, const sr_spawn_opts *o)
{
    return srt_run(o && o->name_prefix ? o->name_prefix : "spawn", world, fn, arg, o ? o->shm_size : 0,
                   o ? o->ring_slots : 0);
}
#define sr_spawn srt_spawn
#define pipe srt_shared_pipe
#define _exit srt_exit
#endif

#ifdef SR_TEST_TSAN
/* The ThreadSanitizer runner (tests/tsan): a worker that _exit()s on purpose
 * dies as a killed one would, without TSan's end-of-process checks, which
 * would report the threads a dying worker never joins (runner.c). */
_Noreturn void srt_exit(int status);
#define _exit srt_exit
#endif

#define RUN_JOB(name, world, ...)                                                   \
    do {                                                                            \
        struct harness h_ = {__VA_ARGS__};                                          \
        int rc_ = run_job(name, world, &h_);                                        \
        cr_assert_eq(rc_, 0, "job '%s' failed: %s", name, sr_last_error());         \
    } while (0)

/* Expect an error code and a substring of its message. */
#define WEXPECT_ERR(rc, code, substr)                                               \
    WCHECK((rc) == (code) && strstr(sr_last_error(), substr),                       \
           "expected %d containing '%s', got %d: '%s'", code, substr, rc, sr_last_error())

#endif
