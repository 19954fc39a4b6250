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
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
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

static inline int run_job(const char *name, int world, struct harness *h)
{
    uint64_t size = h->shm_size ? h->shm_size : (uint64_t)world * (64u << 20);
    sr_spawn_opts o = {.name_prefix = test_ns(name), .shm_size = size, .ring_slots = h->ring_slots};
    return sr_spawn(world, harness_worker, h, &o);
}

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
