/* SPDX-License-Identifier: MIT */
/* Events of the replacement tests (sr_spawn with SR_RESTART_RANK): a
 * worker's generation, the replacement's "hello" to the driver as a futex
 * event, and a victim that stops itself (SIGSTOP) so that what is sent to
 * it waits in its inbox. Every wait is bounded by REPLACE_WAIT_S.
 *
 * The driver registers replace_fn_hello as "hello" and waits with
 * replace_wait_hello(n); a replacement calls "hello" once it is up. The
 * freeze record lives in a page shared by the job's processes (made before
 * sr_spawn): the victim's function calls replace_freeze_self(fz), the
 * driver replace_wait_stopped(fz), then kills fz->pid.
 */
#ifndef SR_TESTS_REPLACE_EVENTS_H
#define SR_TESTS_REPLACE_EVENTS_H

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shmrpc/rpc.h"

#define REPLACE_WAIT_S 20

/* This process's generation of its rank (SHMRPC_GENERATION; 0: the first). */
static inline unsigned replace_my_gen(void)
{
    const char *g = getenv("SHMRPC_GENERATION");
    return g ? (unsigned)atoi(g) : 0;
}

static inline int64_t replace_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- the driver's side of "hello" ---- */
static _Atomic uint32_t replace_hellos; /* the driver's process: hellos so far (a futex word) */

static inline int replace_fn_hello(sr_call *c)
{
    atomic_fetch_add_explicit(&replace_hellos, 1, memory_order_release); /* release: pairs with the wait */
    syscall(SYS_futex, &replace_hellos, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    return sr_call_return(c, NULL);
}

/* Until `want` hellos came; -ETIMEDOUT after REPLACE_WAIT_S. */
static inline int replace_wait_hello(uint32_t want)
{
    int64_t end = replace_now_ns() + (int64_t)REPLACE_WAIT_S * 1000000000;
    /* acquire: pairs with replace_fn_hello's release increment */
    for (uint32_t h; (h = atomic_load_explicit(&replace_hellos, memory_order_acquire)) < want;) {
        int64_t ns = end - replace_now_ns();
        if (ns <= 0)
            return -ETIMEDOUT;
        struct timespec left = {ns / 1000000000, ns % 1000000000};
        syscall(SYS_futex, &replace_hellos, FUTEX_WAIT_PRIVATE, h, &left, NULL, 0);
    }
    return 0;
}

/* ---- a victim that stops itself ---- */
struct replace_freeze {
    _Atomic int pid;    /* the process that stopped itself */
    _Atomic int frozen; /* it is about to */
};

/* In the victim: say which process it is, then stop it. */
static inline void replace_freeze_self(struct replace_freeze *fz)
{
    atomic_store_explicit(&fz->pid, getpid(), memory_order_relaxed);
    atomic_store_explicit(&fz->frozen, 1, memory_order_release); /* release: pairs with replace_wait_stopped */
    raise(SIGSTOP);
}

/* In the driver: the flag, then /proc says the process is stopped (state
 * T, a few microseconds after it). 0, or -ETIMEDOUT. */
static inline int replace_wait_stopped(struct replace_freeze *fz)
{
    int64_t end = replace_now_ns() + (int64_t)REPLACE_WAIT_S * 1000000000;
    /* acquire: pairs with replace_freeze_self's release store */
    while (!atomic_load_explicit(&fz->frozen, memory_order_acquire) && replace_now_ns() < end)
        sched_yield();
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", atomic_load_explicit(&fz->pid, memory_order_relaxed));
    while (replace_now_ns() < end) {
        FILE *f = fopen(path, "r");
        char *paren = f && fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
        if (f)
            fclose(f);
        if (paren && paren[2] == 'T')
            return 0;
        sched_yield();
    }
    return -ETIMEDOUT;
}

#endif
