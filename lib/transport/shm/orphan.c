/* SPDX-License-Identifier: MIT */
/* Exits no supervisor publishes (xport.h, sr__xport_publish_orphans).
 *
 * Under shmrun or sr_spawn the launcher is every worker's parent: it reaps
 * a worker that ends and publishes how (segment.h, "Peer exit", X1-X3).
 * Under mpirun no process of a host is its peers' parent, so a host's
 * workers publish each other's exits themselves, from their pidfds: the
 * sleeps of every worker wake when a local peer's process ends (waiter.h),
 * and the lowest-ranked local worker still alive in its own view publishes
 * it. Two workers never both believe themselves the lowest alive: a pidfd
 * fires only for a process that has ended, so a worker that sees a lower
 * one dead is right, and one that has not yet seen it leaves the
 * publication to it, or to itself once its own pidfd fires. A publisher
 * that dies half-way leaves exited at 0, and the next one publishes again
 * (the same fields). The status is the launcher's to know: the record says
 * only that the process ended (SR_EXIT_SEEN).
 *
 * Threads: called by the thread that sleeps on the waiter (the progress
 * thread), which alone writes peer_dead; other threads never publish. */
#include <stdatomic.h>

#include "doorbell.h"
#include "futex.h"
#include "xport.h"

/* Lowest local rank alive in our view (we are alive). */
static int lowest_alive(const sr_xport *x)
{
    for (int r = 0; r < x->world; r++)
        if (x->peers[r].local && (r == x->rank || !sr__xport_peer_dead(x, r)))
            return r;
    return x->rank;
}

/* X3: wake every attached local worker (a sleeper re-checks the exits
 * generation after its D2), and the start barrier's sleepers. */
static void wake_local(sr_xport *x, int gone)
{
    sr__futex_wake_all(&x->seg.hdr->attached);
    for (int r = 0; r < x->world; r++) {
        struct sr_worker_info *w = sr__seg_worker(&x->seg, r);
        /* acquire: pairs with the worker's release store of ATTACHED (its doorbell kind before it) */
        if (r == gone || !x->peers[r].local ||
            !sr__worker_state_attached(atomic_load_explicit(&w->state, memory_order_acquire)))
            continue;
        sr__doorbell_ring(&w->doorbell, sr__xport_peer_kind(&x->peers[r]), x->peers[r].eventfd);
    }
}

static void publish(sr_xport *x, int r)
{
    struct sr_worker_info *w = sr__seg_worker(&x->seg, r);
    w->exit_code = SR_EXIT_SEEN;
    w->exit_status = 0;
    /* relaxed: publishers of one segment are serialised by the rule above */
    w->exit_seq = atomic_load_explicit(&x->seg.hdr->exits, memory_order_relaxed) + 1;
    /* X1, seq_cst: pairs with the senders' seq_cst check (segment.h) */
    atomic_store_explicit(&w->exited, 1, memory_order_seq_cst);
    /* X2, seq_cst: pairs with the peers' load of the generation */
    atomic_fetch_add_explicit(&x->seg.hdr->exits, 1, memory_order_seq_cst);
    wake_local(x, r);
}

void sr__xport_publish_orphans(sr_xport *x)
{
    if (!x->publish_exits || lowest_alive(x) != x->rank)
        return;
    for (int r = 0; r < x->world; r++)
        /* seq_cst: as the readers of exited (X1) */
        if (r != x->rank && x->peers[r].local && sr__xport_peer_dead(x, r) &&
            !atomic_load_explicit(x->peers[r].exited, memory_order_seq_cst))
            publish(x, r);
}
