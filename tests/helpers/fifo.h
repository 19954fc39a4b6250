/* SPDX-License-Identifier: MIT */
/* SCHED_FIFO on one CPU, for the spin tests: a spinner must give way to a
 * thread queued behind it (shm/base/spin.h). Among SCHED_FIFO threads of
 * one priority on one CPU nothing preempts the running one: the next runs
 * only when it blocks or yields. */
#ifndef SR_TESTS_HELPERS_FIFO_H
#define SR_TESTS_HELPERS_FIFO_H

#include <errno.h>
#include <pthread.h>
#include <sched.h>

/* The calling thread, and the threads started with *attr, SCHED_FIFO at
 * priority 1 on `cpu`. 0, or -errno (-EPERM without CAP_SYS_NICE); after a
 * 0 the caller destroys *attr. */
static inline int fifo_on_cpu(int cpu, pthread_attr_t *attr)
{
    struct sched_param p = {.sched_priority = 1};
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) || sched_setscheduler(0, SCHED_FIFO, &p))
        return -errno;
    pthread_attr_init(attr);
    pthread_attr_setaffinity_np(attr, sizeof(set), &set);
    pthread_attr_setinheritsched(attr, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(attr, SCHED_FIFO);
    pthread_attr_setschedparam(attr, &p);
    return 0;
}

/* The spin tests' job: one worker whose spins have a 500 ms budget
 * (SHMRPC_SPIN_NS), so a spinner that does not give way holds its CPU that
 * long. For the RPC suites (RUN_JOB: rpc_harness.h). */
#define SPIN_TEST_BUDGET_MS 500
#define RUN_SPINNING_JOB(name, scenario_fn)                       \
    do {                                                          \
        setenv("SHMRPC_SPIN_NS", "500000000", 1);                 \
        RUN_JOB(name, 1, .scenario = scenario_fn);                \
        unsetenv("SHMRPC_SPIN_NS");                               \
    } while (0)

#endif
