/* SPDX-License-Identifier: MIT */
/* The transport seam: how the RPC layer reaches its peers and its inbox.
 *
 * The layer above sees a transport only through this header: instances
 * (sr_tport), each with an ops table, and the set of them that one worker
 * uses (sr_transports, opened and closed here, chosen per peer by the
 * transport layer: lib/transport/select.c). Within a host peers are reached
 * through the shared-memory transport (shm/: rings in the job's segment);
 * under mpirun, ranks of other hosts through the MPI transport (mpi/).
 *
 * The ops: a small required set that every transport has (send, recv_burst,
 * pending, name, stats), and optional groups, each NULL where a transport
 * has no such thing:
 *   flow   a bounded inbox that can refuse a send (-EAGAIN) and announce
 *          space again (space events): space_arm, probe, space_take.
 *   wake   the consumer's sleep and the producers' wake-up handshake: quiet
 *          sends, announcing who consumes the inbox, the sleeps, kicks.
 *   live   peers' departures as records say how they ended, and our own.
 *   poll_ns, inbox_text: single optional ops (below).
 * The shared-memory transport has every group; the MPI transport has the
 * required set and poll_ns only (its producers cannot wake our sleeps, a
 * peer's death ends the job, and MPI never refuses a send).
 *
 * Framing: a message is one sr_msg (its 64-byte head) and its parts: the
 * byte ranges outside the slot that it refers to (the payload's heap block,
 * and the blocks of the tensors the payload names). Within a host the parts
 * travel by reference: the head carries heap offsets, valid for every worker
 * of the segment. A transport whose peers do not share our heap (caps
 * SR_TPORT_COPIES: MPI between hosts) carries a message whole, the head and
 * every part's bytes, whatever their length, and the receiver materialises
 * each part as a block of its own heap and rebinds the head (and the
 * payload) to those blocks, so that what it decodes is exactly what a local
 * peer would have sent. Only the layer above knows where a message names
 * its parts; it hands the transports that knowledge as a marshal table
 * (struct sr_tport_marshal, given to sr__transport_open).
 *
 * Threads and the consumer. Exactly one thread at a time consumes an
 * instance's inbox: the consumer. Who that is, and how it is handed on, is
 * the caller's (one hand-off may cover several instances' inboxes); the
 * consumer ops (recv_burst, pending, poll_ns, inbox_text, the inbox_bad
 * hint, wake->hold, park, hold_sleep, sleep, sleep_aside) belong to it, and
 * everything else may be called from any thread of the worker at once. The
 * wake group is how a consumer announces itself to producers, the doorbell
 * handshake:
 *   hold       a thread other than the sleeping one (a user thread) took the
 *              inbox and polls it: producers need not wake the sleeper
 *              (shm: doorbell AWAKE).
 *   park       that thread hands the inbox back to the sleeping thread:
 *              announce the sleep again, fence, and re-check both the inbox
 *              and the caller's busy(arg) (the Dekker handshake of
 *              doorbell.h, D2); false (announcement withdrawn) if either has
 *              work, and the caller polls again.
 *   hold_sleep the holding thread sleeps on the inbox itself, and on one
 *              private futex word when caps has SR_TPORT_SLEEP_WORD, until a
 *              producer wakes it, the word changes or `until` passes;
 *              busy(arg) is re-checked after D2.
 *   sleep      the sleeping thread, consuming, sleeps until a message, a
 *              peer's death, a kick, stop or the deadline; ready(arg) is
 *              re-checked after D2 and must report a ready inbox.
 *   sleep_aside the sleeping thread sleeps while another holds the inbox, on
 *              kicks, peers' deaths, stop and the deadline only.
 *   send_quiet, ring_peer  a producer's burst: several quiet sends to one
 *              consumer, then one ring of its doorbell, from the same thread.
 *   send_lazy  a message read whenever the consumer next polls (no ring
 *              follows); it still makes sure that the message sent behind
 *              it wakes the consumer (shm: it hands the consumer's watch on,
 *              doorbell.h R2).
 *   kick       level-triggered: ends the sleeping thread's next or current
 *              sleep (either kind). poke: kick, and wake every sleeper on
 *              the inbox whatever it announced. nudge: wake a holder asleep
 *              on the inbox if messages wait there (quiet sends ring nobody).
 *   stop       sticky: ends every sleep, now and later.
 * The memory-ordering arguments of each step are written next to its code
 * in the shared-memory implementation (lib/transport/shm/xport_tport.c).
 *
 * Liveness (live): peer_gone (published by the supervisor), the exits hint
 * (a generation that moves with every published exit), exit_order (the
 * order of departures), gone_text / exit_text (how it ended),
 * left_gracefully, left_timed_out. Within a host these are the supervisor's
 * exit records; pidfds only wake sleeps. Without the group a peer's exit is
 * the job's end (mpirun's abort): peer_gone is false for it.
 *
 * The shared heap: what a transport's messages hold or bring into the
 * shared heap is the transport's to give back: a receive that finds the
 * inbox empty, and a sleep that ends, take back the blocks peers released.
 *
 * Lifetime: sr__transport_open .. sr__transport_close (below); the caller
 * stops every thread that uses an instance before closing.
 */
#ifndef SR_TRANSPORT_H
#define SR_TRANSPORT_H

#if !defined(SR__SEES_TRANSPORT)
#error "transport.h is the seam of the transport layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ring.h" /* sr_msg */

typedef struct sr_tport sr_tport;

/* A snapshot of the transport's debug counters (relaxed reads). sleeps: the
 * consumer's sleeps on the inbox, in wake->sleep and wake->hold_sleep (a
 * check that finds work and returns is no sleep); not sleep_aside. */
struct sr_tport_stats {
    uint64_t sent, received, wakes, sleeps, full, spin_hits;
    uint64_t rings; /* doorbell checks made by sends and ring_peer (wake): D3 fences, each a load of a peer's
                     * line; shm: only where the consumer watched (doorbell.h) */
};

/* caps: what the instance's sleeps can do, and how its messages travel. */
#define SR_TPORT_HOLD_SLEEP 0x1u /* wake->hold_sleep works: a holding thread can be woken by producers */
#define SR_TPORT_SLEEP_WORD 0x2u /* hold_sleep also sleeps on one private futex word (futex_waitv) */
#define SR_TPORT_COPIES 0x4u     /* peers do not share our heap: a message's parts travel as bytes (marshal) */
#define SR_TPORT_REPLACES 0x8u   /* live: a rank that died may come back as a new generation (live->rejoin) */
#define SR_TPORT_ELASTIC 0x10u   /* live: workers leave and join (live->leaving; with SR_TPORT_REPLACES) */

/* Where a message's parts are (above, "Framing"); the layer above's. */
struct sr_tport_marshal {
    /* Visit the parts of m in order: each(arg, data, len) for every byte
     * range outside the slot that m refers to; a nonzero return stops the
     * walk and is returned. 0: m has no parts. */
    int (*parts)(const sr_msg *m, int (*each)(void *arg, const void *data, uint64_t len), void *arg);
    /* m left (its bytes were sent) or never will: drop the references its
     * parts held, as a local receiver would once it has decoded it. */
    void (*sent)(const sr_msg *m);
    /* m arrived with n parts, materialised as blocks of our heap (their
     * offsets, in parts() order, one reference each): point m at them. 0, or
     * -EBADMSG (the reason in sr_last_error): the caller then drops the
     * blocks and the message. */
    int (*rebind)(sr_msg *m, const uint64_t *blocks, size_t n);
};

/* flow: a bounded inbox. Without it, send never returns -EAGAIN. */
struct sr_tport_flow {
    /* Register for rank to's next space event (after a send's -EAGAIN),
     * then retry once: either the retry finds room, or the space_kick hint
     * of our instance is raised when to's consumer frees slots. */
    void (*space_arm)(sr_tport *t, int to);
    int (*probe)(sr_tport *t, int to); /* 0 room, -EAGAIN full, -EPROTO corrupt (the error says why), -EINVAL */
    bool (*space_take)(sr_tport *t);   /* the consumer: clear a kick (acquire); true if one was pending */
};

/* wake: the consumer's sleeps and the producers' wake-ups (above, "Threads
 * and the consumer"). */
struct sr_tport_wake {
    int (*send_quiet)(sr_tport *t, int to, sr_msg *m); /* as send, but wakes nobody: ring_peer follows */
    /* As send, for a message nobody waits on and no ring_peer follows: it
     * wakes the consumer only if a message sent behind it may be waiting on
     * it (shm: doorbell.h R2). */
    int (*send_lazy)(sr_tport *t, int to, sr_msg *m);
    void (*hold)(sr_tport *t);
    bool (*park)(sr_tport *t, bool (*busy)(void *), void *arg);
    /* The stand-by (SR_TPORT_HOLD_SLEEP only; the RPC layer's agent.h, "The
     * progress thread serves"): park_away is park while the thread that
     * sleeps on the doorbell is away running a call, so that a message
     * wakes the stand-by instead; away_end, by that thread once it holds
     * the inbox again, ends it (and the head's watch). standby_wait is the
     * stand-by's sleep: 1 at once if a message or a poke came while away,
     * 0 after a sleep (or none: the caller looks again) that ends at
     * until(arg) at the latest (CLOCK_MONOTONIC ns, -1 none; asked after
     * the word was read, and a seq_cst fence), -ESHUTDOWN once
     * standby_stop was called; standby_settle, by the stand-by, clears a
     * ring that came for an away period already over (the caller holds off
     * the next one); standby_done after the stand-by returned. */
    bool (*park_away)(sr_tport *t, bool (*busy)(void *), void *arg);
    void (*away_end)(sr_tport *t);
    int (*standby_wait)(sr_tport *t, int64_t (*until)(void *), void *arg);
    void (*standby_settle)(sr_tport *t);
    void (*standby_stop)(sr_tport *t);
    void (*standby_done)(sr_tport *t);
    /* 0 woken or skipped (busy); 1: timed out while a message waited and the
     * doorbell had been taken away without a wake (a lost wake, which the
     * caller may count); -EOPNOTSUPP without SR_TPORT_HOLD_SLEEP. */
    int (*hold_sleep)(sr_tport *t, _Atomic uint32_t *word, uint32_t val, int64_t until, bool (*busy)(void *),
                      void *arg);
    int (*sleep)(sr_tport *t, int64_t deadline_ns, bool (*ready)(void *), void *arg);
    int (*sleep_aside)(sr_tport *t, int64_t deadline_ns, bool (*ready)(void *), void *arg);
    int64_t (*spin_budget)(sr_tport *t); /* any thread: how long to spin before a sleep; 0: do not spin */
    /* Any thread, after spin_budget gave 0: how long to poll by giving the
     * core away (sched_yield) before a sleep; 0: sleep at once. */
    int64_t (*yield_budget)(sr_tport *t);
    void (*kick)(sr_tport *t);
    void (*poke)(sr_tport *t);
    void (*nudge)(sr_tport *t);
    void (*ring)(sr_tport *t); /* as a producer would: wake a sleeper on our inbox unless it is awake */
    /* After send_quiet to `to` from this thread: ring to's doorbell once, as
     * a send does after its publish, for every quiet message this thread
     * sent it before (shm: doorbell.h R1). A thread must ring before it
     * waits for anything that consumer does. 0, or -EINVAL. */
    int (*ring_peer)(sr_tport *t, int to);
    void (*stop)(sr_tport *t);
};

/* live: departures (above, "Liveness"); any thread. */
struct sr_tport_live {
    bool (*peer_gone)(sr_tport *t, int rank); /* seq_cst: pairs with the supervisor's X1 */
    uint32_t (*exit_order)(sr_tport *t, int rank); /* rank gone: 1 for the first departure, ... */
    const char *(*gone_text)(sr_tport *t, int rank, char *buf, size_t len);
    const char *(*exit_text)(sr_tport *t, int rank, char *buf, size_t len);
    bool (*left_gracefully)(sr_tport *t, int rank);
    /* It left after its own graceful shutdown timed out: it had come to the
     * shutdown and gave up waiting, so it is no peer that died. */
    bool (*left_timed_out)(sr_tport *t, int rank);
    /* Our own departure as peers will see it: closing (a graceful shutdown
     * began), graceful (how it ended, rc: 0 it completed, a later exit is a
     * clean one; -ETIMEDOUT it timed out, a later exit is a timeout's, not a
     * death; any other error: a later exit is a non-graceful one). */
    void (*closing)(sr_tport *t);
    void (*graceful)(sr_tport *t, int rc);
    /* Replacement (SR_TPORT_REPLACES; NULL without it). generation: the
     * rank's generation as we know it (ours for t->rank; messages carry
     * both modulo 16 in sr_msg.gens). rejoin: a gone rank's new process
     * has attached: know it from now on (0), or -EAGAIN not yet; called by
     * the thread that handles exits, after the old one's exit. */
    uint32_t (*generation)(sr_tport *t, int rank);
    int (*rejoin)(sr_tport *t, int rank);
    /* Elastic jobs (SR_TPORT_ELASTIC; NULL without it): rank is leaving
     * the job or has left it, so no call may start to it. seq_cst: the
     * caller counts the call first (segment.h, E2). In such a job closing
     * says that we leave, and a graceful end that we left. */
    bool (*leaving)(sr_tport *t, int rank);
};

struct sr_tport_ops {
    const char *kind; /* "shm", "mpi" */

    /* Required. Sending: any thread. 0; -EAGAIN full (flow only: arm, then
     * retry once); -EINVAL; -EPIPE the peer has gone; -EPROTO the peer's
     * inbox is corrupt. m->src is stamped. */
    int (*send)(sr_tport *t, int to, sr_msg *m);
    /* The consumer: up to n messages. It also gives back what the last
     * burst held (n = 0: only that), and, finding nothing, takes back the
     * blocks its peers released to our heap (peers that share it). */
    unsigned (*recv_burst)(sr_tport *t, sr_msg *out, unsigned n);
    bool (*pending)(sr_tport *t); /* the consumer: a message, or a corrupt head not yet latched */
    const char *(*name)(sr_tport *t, int rank); /* any thread: the worker's name */
    void (*stats)(sr_tport *t, struct sr_tport_stats *out);

    /* Optional groups: NULL where the transport has no such thing. */
    const struct sr_tport_flow *flow;
    const struct sr_tport_wake *wake;
    const struct sr_tport_live *live;
    /* The consumer: how soon it must poll this instance again rather than
     * sleep on; -1 never, 0 now (a transfer in flight needs polling to
     * progress). NULL: producers wake our sleeps (wake), never poll on a
     * timer. */
    int64_t (*poll_ns)(sr_tport *t);
    /* The consumer, once the inbox_bad hint is raised: why the inbox is
     * corrupt. NULL: it cannot be (the hint stays zero). */
    const char *(*inbox_text)(sr_tport *t, char *buf, size_t len);
};

/* An instance. Transports embed it in their own state. The three hint
 * words are read on every poll, so they are loads, not calls (an indirect
 * call on each of them cost the hot round trip about 30 ns); they stay
 * valid for the instance's lifetime, and are never NULL: a transport
 * without the group a word belongs to points it at a word that stays zero. */
struct sr_tport {
    const struct sr_tport_ops *ops;
    uint32_t caps;
    int rank, world;
    _Atomic uint32_t *space_kick; /* flow: nonzero, a space event is pending (space_take clears it) */
    _Atomic uint32_t *inbox_bad;  /* inbox_text: nonzero, the inbox was latched corrupt (the consumer latches it) */
    _Atomic uint32_t *exits;      /* live: the count of published exits, a generation (segment.h X2) */
    const struct sr_tport_marshal *marshal; /* SR_TPORT_COPIES: set when the instance is opened */
};

/* A space event is pending. relaxed: a hint; space_take synchronises. */
static inline bool sr__tport_space_kicked(const sr_tport *t)
{
    return atomic_load_explicit(t->space_kick, memory_order_relaxed) != 0;
}

/* The consumer's: has it latched a corrupt inbox? relaxed: latched by the
 * consumer (the thread asking, or one that handed it the inbox). */
static inline bool sr__tport_inbox_bad(const sr_tport *t)
{
    return atomic_load_explicit(t->inbox_bad, memory_order_relaxed) != 0;
}

/* The exit generation: a change means some peer's exit is new to whoever
 * last read it. seq_cst (acquire at least): pairs with the supervisor's X2. */
static inline uint32_t sr__tport_exits(const sr_tport *t)
{
    return atomic_load_explicit(t->exits, memory_order_seq_cst);
}

/* rank has gone (live): false without the group (its exit ends the job). */
static inline bool sr__tport_peer_gone(sr_tport *t, int rank)
{
    return t->ops->live && t->ops->live->peer_gone(t, rank);
}

/* ---- one worker's transports (select.c) --------------------------------- */

/* The instances one worker uses, chosen per peer:
 *   home    the instance whose inbox the consumer reads first and whose
 *           sleeps it sleeps in: it has every optional group (flow, wake,
 *           live, inbox_text) and never copies (its peers share our heap).
 *           Within a host, the shared-memory transport.
 *   polled  an instance of a copying transport (SR_TPORT_COPIES) that
 *           reaches the peers home does not, or NULL when home reaches all:
 *           the consumer polls it after home and bounds its sleeps by its
 *           poll_ns (its producers cannot wake them); it has no optional
 *           group but poll_ns. Under mpirun over several hosts, the MPI
 *           transport.
 *   peer    [world]: the instance that reaches each rank (home for our own).
 * The hint words the consumer watches are home's. */
typedef struct sr_transports sr_transports; /* opaque: select.c */

struct sr_transport_opts {
    const char *name; /* this worker's name (checked by the caller); NULL: "worker<rank>" */
    const struct sr_tport_marshal *marshal; /* for the copying instances */
};

/* Open this worker's transports: the launch environment names the job's
 * segment (shmrun, sr_spawn); without one, a transport whose launcher
 * started the process (mpirun) boots the job first (a collective: every
 * rank of the job opens, or none). 0, or -errno with sr_last_error naming
 * the step (-ENOENT: not launched as a job; -ENOTSUP: launched by a
 * launcher whose transport was not built). */
int sr__transport_open(const struct sr_transport_opts *o, sr_transports **out);
/* Close what open opened, in reverse; NULL is a no-op. */
void sr__transport_close(sr_transports *s);
int sr__transport_rank(const sr_transports *s);
int sr__transport_world(const sr_transports *s);
sr_tport *sr__transport_home(const sr_transports *s);
sr_tport *sr__transport_polled(const sr_transports *s);
sr_tport *const *sr__transport_peers(const sr_transports *s); /* [world] */
/* The job state of the launcher's transport kind ("mpi") that booted the
 * job, or NULL (tests). */
void *sr__transport_job(const sr_transports *s, const char *kind);
/* The job's segment (segment.h) as this worker's shared-memory transport
 * maps it: the same addresses the transport reads and writes (a check that
 * protects or inspects the mapping in use, such as the read-only header of
 * a sleep test), or NULL where no shared-memory transport is open. A second
 * sr__segment_attach maps the segment again, at other addresses. */
struct sr_segment *sr__transport_segment(const sr_transports *s);

#endif
