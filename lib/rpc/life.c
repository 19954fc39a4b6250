/* SPDX-License-Identifier: MIT */
/* The agent's lifetime (agent.h, "Lifetime"): publishing it, the
 * references every entry point takes, and unpublishing it for sr_shutdown. */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "error.h"

static _Atomic(sr_agent *) live;  /* the published agent, or NULL */
static _Atomic uint32_t users;    /* references taken by sr__agent_get and not yet put */
static _Atomic uint32_t draining; /* sr__agent_unpublish waits for users to reach 0 */
static _Atomic uint64_t epochs;   /* numbers the published agents */


sr_agent *sr__agent_get(const char *fn)
{
    /* seq_cst: pairs with sr__agent_unpublish (store live, then load users):
     * either it sees our reference, or we see NULL */
    atomic_fetch_add_explicit(&users, 1, memory_order_seq_cst);
    sr_agent *a = atomic_load_explicit(&live, memory_order_seq_cst);
    if (!a) {
        sr__agent_put(NULL);
        if (fn)
            sr__fail(-SR_ESHUTDOWN, fn, "RPC has not been initialized. Call sr_init first.");
    }
    return a;
}

sr_agent *sr__agent_peek(void)
{
    return atomic_load_explicit(&live, memory_order_acquire); /* acquire: pairs with sr__agent_publish */
}

void sr__agent_put(sr_agent *a)
{
    (void)a;
    /* seq_cst: pairs with sr__agent_unpublish (store draining, then load
     * users): either it sees the count drop, or we see it draining and wake it */
    if (atomic_fetch_sub_explicit(&users, 1, memory_order_seq_cst) == 1 &&
        atomic_load_explicit(&draining, memory_order_seq_cst))
        syscall(SYS_futex, &users, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void sr__agent_publish(sr_agent *a)
{
    a->epoch = atomic_fetch_add_explicit(&epochs, 1, memory_order_relaxed) + 1; /* relaxed: a unique number */
    /* seq_cst: a's fields are complete before any sr__agent_get sees it */
    atomic_store_explicit(&live, a, memory_order_seq_cst);
}

void sr__agent_unpublish(sr_agent *a)
{
    /* seq_cst: see sr__agent_get and sr__agent_put */
    atomic_store_explicit(&live, NULL, memory_order_seq_cst);
    atomic_store_explicit(&draining, 1, memory_order_seq_cst);
    /* seq_cst: pairs with the D2 fence of a holder about to sleep (holder_sleep) */
    atomic_store_explicit(&a->closing, true, memory_order_seq_cst);
    a->wake->poke(a->self);
    for (uint32_t u; (u = atomic_load_explicit(&users, memory_order_seq_cst)) != 0;)
        syscall(SYS_futex, &users, FUTEX_WAIT_PRIVATE, u, NULL, NULL, 0);
    atomic_store_explicit(&draining, 0, memory_order_relaxed); /* relaxed: only sr_shutdown (under life_lock) reads it again */
}
