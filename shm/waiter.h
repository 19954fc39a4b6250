/* SPDX-License-Identifier: MIT */
/* The waiter: the single place where a worker sleeps.
 *
 * One io_uring per worker watches, at the same time:
 *   - the worker's doorbell (io_uring FUTEX_WAIT on the shared word, or a READ
 *     of its eventfd in the fallback);
 *   - a TIMEOUT request for the nearest deadline;
 *   - each peer's pidfd (peer death);
 *   - a process-local shutdown eventfd.
 *
 * The futex opcodes are probed at start-up; SHMRPC_DOORBELL=eventfd forces the
 * fallback. Only the thread that owns the worker's inbox may call
 * sr__waiter_sleep (the first sleep binds the ring to its thread; a later sleep
 * from another thread still works, on a slower ring: see waiter.c);
 * sr__waiter_notify_shutdown may be called from any thread. Peers are watched
 * from the next sleep on: sr__waiter_watch_peer only records the pidfd and
 * queues its poll.
 *
 * Lifetime: sr__waiter_init .. sr__waiter_fini. The word must stay mapped and
 * the eventfd open until fini.
 */
#ifndef SR_SHM_WAITER_H
#define SR_SHM_WAITER_H

#if !defined(SR__SEES_SHM)
#error "waiter.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>

#include "clock.h" /* sr__now_ns: the deadlines of its sleeps */

#define SR_WAKE_DOORBELL 0x1u /* the doorbell rang, or the ready() check saw work */
#define SR_WAKE_TIMEOUT 0x2u  /* the deadline passed */
#define SR_WAKE_PEER 0x4u     /* a watched peer exited; see sr_waiter.peer_dead */
#define SR_WAKE_SHUTDOWN 0x8u /* sr__waiter_notify_shutdown was called (sticky) */
#define SR_WAKE_KICK 0x10u    /* sr__waiter_kick was called (or ready() said so in sr__waiter_sleep_aside) */

/* Process-local; only the sleeping thread touches the ring and the fields
 * below it (shutdown_fd excepted: any thread may write to it). */
typedef struct sr_waiter {
    struct io_uring ring;
    _Atomic uint32_t *word; /* our doorbell word in the segment */
    uint32_t kind;          /* enum sr_doorbell_kind */
    int eventfd;            /* our doorbell eventfd (fallback) */
    int shutdown_fd;        /* process-local */
    int kick_fd;            /* process-local: sr__waiter_kick */
    unsigned setup_flags;   /* the ring's IORING_SETUP_* flags (see waiter.c) */
    bool armed;             /* the first sleep enabled the ring and queued the polls */
    bool wait_inflight;     /* a doorbell wait is queued or in flight (kept across sleeps) */
    bool shutdown;          /* sticky once seen */
    bool timer_armed;       /* a TIMEOUT for timer_at is queued or in flight */
    bool timer_fired;       /* a TIMEOUT completed since the deadline was last checked */
    bool kick_inflight;     /* a READ of kick_fd is queued or in flight (kept across sleeps) */
    uint32_t wait_gen;      /* tags the current wait SQE */
    uint32_t timer_gen;     /* tags the current TIMEOUT */
    int64_t timer_at;       /* its expiry: absolute CLOCK_MONOTONIC ns */
    uint64_t efd_buf;       /* target of the eventfd READ */
    uint64_t kick_buf;      /* target of the kick_fd READ */
    struct __kernel_timespec ts; /* read by the kernel when the TIMEOUT (update) is submitted */
    int npeers;
    bool *peer_dead;        /* [npeers], set from pidfd completions */
    int *pidfds;
} sr_waiter;

/* kind_wanted: 0 = probe (futex if the kernel has it, unless SHMRPC_DOORBELL=eventfd). */
int sr__waiter_init(sr_waiter *w, _Atomic uint32_t *word, int eventfd, uint32_t kind_wanted);
void sr__waiter_fini(sr_waiter *w);

/* Watch peer `rank`'s process; npeers is fixed by the first call's world size. */
int sr__waiter_watch_peer(sr_waiter *w, int world_size, int rank, int pid);

/* Announce sleep, re-check ready(arg), and sleep until the doorbell rings,
 * deadline_ns (CLOCK_MONOTONIC, absolute; < 0 = none) passes, a peer dies or
 * shutdown is notified. Returns a mask of SR_WAKE_* (never 0), or -errno. */
int sr__waiter_sleep(sr_waiter *w, int64_t deadline_ns, bool (*ready)(void *), void *arg);

/* As sr__waiter_sleep, but without announcing sleep on the doorbell: for the
 * inbox's owner while another thread of the worker consumes the inbox (and
 * owns the doorbell word) in its stead. Sleeps until sr__waiter_kick, the
 * deadline, a peer's death or shutdown; ready(arg) is checked first, after
 * pending completions are consumed (true: return SR_WAKE_KICK at once).
 * A kick is level-triggered: one made before the sleep ends it at once. */
int sr__waiter_sleep_aside(sr_waiter *w, int64_t deadline_ns, bool (*ready)(void *), void *arg);

/* Wake the sleeper, whichever sleep it is in (any thread; an eventfd write). */
void sr__waiter_kick(sr_waiter *w);

/* Wake the sleeper and make every later sleep return SR_WAKE_SHUTDOWN. */
void sr__waiter_notify_shutdown(sr_waiter *w);

/* Does this kernel support io_uring FUTEX_WAIT on a shared word? */
bool sr__waiter_futex_supported(void);


#endif
