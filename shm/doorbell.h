/* SPDX-License-Identifier: MIT */
/* Doorbells: how a producer wakes a sleeping consumer.
 *
 * Each worker owns one 32-bit word in the worker table (sr_worker_info.doorbell).
 *
 *   consumer (sr__waiter_sleep)             producer (sr__doorbell_ring)
 *   D1 store word = SLEEPING               (message published in the ring)
 *   D2 fence(seq_cst)                      D3 fence(seq_cst)
 *      re-check the ring; if non-empty,       load word; if SLEEPING and our
 *      clear the word and do not sleep        exchange wins, wake the consumer
 *
 * D2 pairs with D3 (a Dekker handshake): either the consumer sees the
 * message, or the producer sees SLEEPING. So no wake-up is ever lost, and a
 * producer makes the wake syscall only when the consumer really sleeps, and
 * only one producer makes it (the one whose exchange returned SLEEPING).
 *
 * R1, quiet sends and one ring: a producer may publish several messages to
 * one consumer without ringing (a quiet send) and then ring once
 * (sr__xport_ring_peer). D3 then follows every one of those publishes in
 * the producing thread's order, so the handshake covers them all: a
 * consumer that read some of them and then announced its sleep (D1, D2)
 * either sees the rest in its re-check, or the producer's load after D3
 * sees SLEEPING and wakes it. The ring must come from the thread that made
 * the quiet sends (its fence orders its own stores), after the last of
 * them and before that thread itself waits for anything the consumer will
 * do (the RPC layer's poll bursts: lib/rpc/poll.c).
 *
 * R2, a lazy send (no ring follows: a message nobody waits on, read when
 * the consumer next polls) can still hold up messages that others wait on:
 * the consumer reads in order and stops at a claimed, unpublished slot, so
 * if it looked while the lazy producer had claimed its slot and not yet
 * published it, it may sleep with later messages in its ring whose
 * producers found it awake and rang nobody. So after publishing, the lazy
 * producer fences (P2, seq_cst) and looks at the next slot; if it was
 * claimed or published since, it rings as a send does. P2 pairs with that
 * later producer's D3 (its claim precedes its D3): either the lazy producer
 * sees the claim and rings, or the later producer's doorbell load comes
 * after the consumer's announcement, sees it, and wakes it (shm/ring.h,
 * sr__ring_claimed_behind).
 *
 * The same pair carries space events (xport.h): the consumer of a full inbox
 * that frees slots stores the blocked sender's space_kick and then rings
 * the sender's doorbell (D3 after the store), and every sender-side thread
 * about to sleep checks space_kick after its D2, next to its ring.
 *
 * Two kinds of consumer sleep on the word, told apart by the value announced:
 *   SLEEPING       the progress thread, in io_uring (shm/waiter.c). Its
 *                  FUTEX_WAIT carries SR_DOORBELL_BIT_PROGRESS and stays armed
 *                  across sleeps, so it is still queued on the word while
 *                  another thread holds the inbox.
 *   SLEEPING_USER  a user thread that holds the worker's inbox (the RPC
 *                  agent's consumer token) sleeps on the word itself, in
 *                  futex_waitv with its future. The producer wakes it with
 *                  bitset SR_DOORBELL_BIT_USER, which the progress thread's
 *                  armed wait does not match: a response wakes its caller
 *                  directly, and only it.
 * The same handshake covers both: a producer acts on any value but AWAKE.
 *
 * The wake is FUTEX_WAKE (or FUTEX_WAKE_BITSET) on the shared (not private)
 * word, or, in the eventfd fallback, an 8-byte write to the consumer's
 * eventfd (there only the progress thread sleeps on the doorbell).
 *
 * Cost: D3 makes the producer wait until its publish owns the slot's cache
 * line. The consumer cannot see the message before that anyway, so the fence
 * adds nothing to a round trip; it only spaces out one producer's
 * back-to-back sends (bench_ring: a burst still costs less than one line
 * transfer per message). It cannot be skipped when the consumer is "known
 * awake": a stale AWAKE is exactly the case the handshake exists for.
 */
#ifndef SR_SHM_DOORBELL_H
#define SR_SHM_DOORBELL_H

#if !defined(SR__SEES_SHM)
#error "doorbell.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "atomics.h"

enum { SR_DOORBELL_AWAKE = 0, SR_DOORBELL_SLEEPING = 1, SR_DOORBELL_SLEEPING_USER = 2 };

/* FUTEX_WAIT_BITSET masks of the two sleepers (a futex_waitv sleeper matches any). */
#define SR_DOORBELL_BIT_PROGRESS 0x1u
#define SR_DOORBELL_BIT_USER 0x2u

enum sr_doorbell_kind {
    SR_DOORBELL_FUTEX = 1,   /* io_uring FUTEX_WAIT / futex(FUTEX_WAKE) */
    SR_DOORBELL_EVENTFD = 2, /* io_uring READ of an eventfd / write(2) */
};

/* Out of line: the syscall. Returns 1 if a wake was issued. Wakes every
 * sleeper on the word, whichever its kind. */
int sr__doorbell_wake(_Atomic uint32_t *word, uint32_t kind, int eventfd);
/* Wake only a SLEEPING_USER sleeper (futex doorbells only). */
int sr__doorbell_wake_user(_Atomic uint32_t *word);

/* Producer side, called after publishing a message. Returns 1 if it woke the
 * consumer (a syscall), 0 if the consumer was awake (no syscall). */
static inline int sr__doorbell_ring(_Atomic uint32_t *word, uint32_t kind, int eventfd)
{
    /* D3: pairs with the consumer's D2 fence between announcing SLEEPING and re-checking its ring */
    atomic_thread_fence(memory_order_seq_cst);
    /* relaxed: ordered after our publish by D3 */
    if (atomic_load_explicit(word, memory_order_relaxed) == SR_DOORBELL_AWAKE)
        return 0;
    /* relaxed: the exchange only elects one waker; the wake syscall carries the event */
    uint32_t was = atomic_exchange_explicit(word, SR_DOORBELL_AWAKE, memory_order_relaxed);
    if (was == SR_DOORBELL_AWAKE)
        return 0;
    return was == SR_DOORBELL_SLEEPING_USER ? sr__doorbell_wake_user(word) : sr__doorbell_wake(word, kind, eventfd);
}

#endif
