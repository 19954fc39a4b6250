/* The transport seam: how the RPC agent reaches its peers and its inbox.
 *
 * The agent (lib/rpc/agent.c) sees a transport only through this header: an
 * instance (sr_tport) with an ops table. It keeps, per peer, the instance
 * that reaches it (sr_agent.tp[rank]; today always the shared-memory one),
 * and one instance whose inbox it consumes and whose waits it sleeps in
 * (sr_agent.self). A second transport (MPI, issue 13) is a new file that
 * fills an ops table; nothing of the agent changes but the choice per peer.
 *
 * The header lives in shm/ because the shared-memory transport (shm/
 * xport_tport.c, over shm/xport.c) implements it and shm/ must not depend on
 * lib/rpc; the interface names no shared-memory type but sr_msg (the 64-byte
 * slot framing, ring.h).
 *
 * Framing: a message is one sr_msg (its 64-byte head) and its parts: the
 * byte ranges outside the slot that it refers to (the payload's heap block,
 * and the blocks of the tensors the payload names, payload.h). Within a host
 * the parts travel by reference: the head carries heap offsets, valid for
 * every worker of the segment. A transport whose peers do not share our heap
 * (caps SR_TPORT_COPIES: MPI between hosts, lib/mpi/mpi_tport.c) carries a
 * message whole, the head and every part's bytes, whatever their length, and
 * the receiver materialises each part as a block of its own heap and
 * rebinds the head (and the payload) to those blocks, so that what it
 * decodes is exactly what a local peer would have sent. Only the agent
 * knows where a message names its parts; it hands the transport that
 * knowledge as a marshal table (struct sr_tport_marshal): the pluggable
 * tensor marshalling of issue 13.
 *
 * Threads and the consumer token. Exactly one thread at a time consumes an
 * instance's inbox: the agent's token holder (agent.h). The consumer ops
 * (recv_burst, pending, inbox_text, the inbox_bad hint, hold, park,
 * hold_sleep, nudge when told "consumer") belong to it; everything else may
 * be called from any thread of the worker at once. The agent decides who
 * holds the token (its CAS states are the agent's: one token covers every
 * transport's inbox); the transport owns how the holder announces itself to
 * producers, the doorbell handshake:
 *   hold       a user thread took the inbox: producers need not wake the
 *              parked progress thread (shm: doorbell AWAKE).
 *   park       a user thread hands the inbox back to the sleeping progress
 *              thread: announce the sleep again, fence, and re-check both
 *              the inbox and the agent's busy(arg) (the Dekker handshake of
 *              doorbell.h, D2); false (announcement withdrawn) if either has
 *              work, and the caller polls again.
 *   hold_sleep the holding user thread sleeps on the inbox itself, and on one
 *              private futex word (its future's) when caps has
 *              SR_TPORT_SLEEP_WORD, until a producer wakes it, the word
 *              changes or `until` passes; busy(arg) is re-checked after D2.
 *   sleep      the progress thread (the holder) sleeps until a message, a
 *              peer's death, a kick, shutdown or the deadline; ready(arg) is
 *              re-checked after D2 and must report a ready inbox.
 *   sleep_aside the progress thread sleeps while a user holds the inbox, on
 *              kicks, peers' deaths, shutdown and the deadline only.
 *   kick       level-triggered: ends the progress thread's next or current
 *              sleep (either kind). poke: kick, and wake every sleeper on
 *              the inbox whatever it announced. nudge: wake a user asleep on
 *              the inbox if messages wait there (quiet sends ring nobody).
 *   stop       sticky shutdown of every sleep (sr__agent_stop).
 * The memory-ordering arguments of each step are written next to its code
 * in the shared-memory implementation (shm/xport_tport.c).
 *
 * Liveness: peer_gone (published by the supervisor), exits (a generation that
 * moves with every published exit), exit_order (the order of departures),
 * gone_text / exit_text (how it ended), left_gracefully, left_timed_out. Within a host these
 * are the supervisor's exit records; pidfds only wake sleeps.
 *
 * Several instances: the agent consumes `self` (the rings) and, when some
 * peers are on other hosts, one instance of a copying transport too
 * (sr_agent.remote): the token holder polls both, and sleeps in self's
 * sleeps. A transport whose producers cannot ring our doorbell says how soon
 * it must be polled again (poll_ns) and the agent bounds its sleeps by that.
 *
 * Lifetime: an instance lives from its transport's attach to its detach
 * (for shm: sr_xport_attach .. sr_xport_detach; sr_xport_transport gives
 * its instance). The agent stops its threads before detaching.
 */
#ifndef SR_SHM_TRANSPORT_H
#define SR_SHM_TRANSPORT_H

#if !defined(SR__SEES_SHM)
#error "transport.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ring.h" /* sr_msg */

typedef struct sr_tport sr_tport;

/* A snapshot of the transport's debug counters (relaxed reads). */
struct sr_tport_stats {
    uint64_t sent, received, wakes, sleeps, full, spin_hits;
};

/* caps: what the instance's sleeps can do. */
#define SR_TPORT_HOLD_SLEEP 0x1u /* hold_sleep exists: a holding user thread can be woken by producers */
#define SR_TPORT_SLEEP_WORD 0x2u /* hold_sleep also sleeps on one private futex word (futex_waitv) */
#define SR_TPORT_COPIES 0x4u     /* peers do not share our heap: a message's parts travel as bytes (marshal) */

/* Where a message's parts are (above, "Framing"); the agent's (lib/rpc/marshal.c). */
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

struct sr_tport_ops {
    const char *kind; /* "shm" */

    /* Sending: any thread. 0; -EAGAIN full (retry after a space event:
     * space_arm, then retry once); -EINVAL; -EPIPE the peer has gone;
     * -EPROTO the peer's inbox is corrupt. m->src is stamped. */
    int (*send)(sr_tport *t, int to, sr_msg *m);
    int (*send_quiet)(sr_tport *t, int to, sr_msg *m); /* wakes nobody */
    void (*space_arm)(sr_tport *t, int to);
    int (*probe)(sr_tport *t, int to); /* 0 room, -EAGAIN full, -EPROTO corrupt (the error says why), -EINVAL */
    bool (*space_take)(sr_tport *t);   /* the consumer: clear a kick (acquire); true if one was pending */

    /* Receiving: the consumer. recv_burst also frees what the last burst
     * held (n = 0: only that). pending: a message, or a corrupt head not
     * yet latched. */
    unsigned (*recv_burst)(sr_tport *t, sr_msg *out, unsigned n);
    bool (*pending)(sr_tport *t);
    const char *(*inbox_text)(sr_tport *t, char *buf, size_t len);

    /* The handshake (above). */
    void (*hold)(sr_tport *t);
    bool (*park)(sr_tport *t, bool (*busy)(void *), void *arg);
    /* 0 woken or skipped (busy); 1: timed out while a message waited and the
     * doorbell had been taken away without a wake (a lost wake, counted by
     * the agent for tests/rpc/test_idle_wake.c); -EOPNOTSUPP without the cap. */
    int (*hold_sleep)(sr_tport *t, _Atomic uint32_t *word, uint32_t val, int64_t until, bool (*busy)(void *),
                      void *arg);
    int (*sleep)(sr_tport *t, int64_t deadline_ns, bool (*ready)(void *), void *arg);
    int (*sleep_aside)(sr_tport *t, int64_t deadline_ns, bool (*ready)(void *), void *arg);
    int64_t (*spin_budget)(sr_tport *t); /* any thread; 0: do not spin */
    /* The consumer: how soon it must poll this instance again rather than
     * sleep on; -1 never (its producers wake our sleeps), 0 now (a
     * transfer in flight needs polling to progress). */
    int64_t (*poll_ns)(sr_tport *t);
    void (*kick)(sr_tport *t);
    void (*poke)(sr_tport *t);
    void (*nudge)(sr_tport *t);
    void (*ring)(sr_tport *t); /* as a producer would: wake a sleeper on our inbox unless it is awake */
    void (*stop)(sr_tport *t);

    /* Liveness and names: any thread. */
    bool (*peer_gone)(sr_tport *t, int rank); /* seq_cst: pairs with the supervisor's X1 */
    uint32_t (*exit_order)(sr_tport *t, int rank); /* rank gone: 1 for the first departure, ... */
    const char *(*gone_text)(sr_tport *t, int rank, char *buf, size_t len);
    const char *(*exit_text)(sr_tport *t, int rank, char *buf, size_t len);
    bool (*left_gracefully)(sr_tport *t, int rank);
    /* It left after its own graceful shutdown timed out: it had come to the
     * shutdown and gave up waiting, so it is no peer that died. */
    bool (*left_timed_out)(sr_tport *t, int rank);
    const char *(*name)(sr_tport *t, int rank);
    void (*stats)(sr_tport *t, struct sr_tport_stats *out);

    /* Our own departure as peers will see it: closing (a graceful shutdown
     * began), graceful (how it ended, rc: 0 it completed, a later exit is a
     * clean one; -ETIMEDOUT it timed out, a later exit is a timeout's, not a
     * death; any other error: a later exit is a non-graceful one). */
    void (*closing)(sr_tport *t);
    void (*graceful)(sr_tport *t, int rc);
};

/* An instance. Transports embed it in their own state. The three hint
 * words are read on every poll, so they are loads, not calls (an indirect
 * call on each of them cost the hot round trip about 30 ns); they stay
 * valid for the instance's lifetime. */
struct sr_tport {
    const struct sr_tport_ops *ops;
    uint32_t caps;
    int rank, world;
    _Atomic uint32_t *space_kick; /* nonzero: a space event is pending (space_take clears it) */
    _Atomic uint32_t *inbox_bad;  /* nonzero: the inbox was latched corrupt (the consumer latches it) */
    _Atomic uint32_t *exits;      /* the count of published exits, a generation (segment.h X2) */
    const struct sr_tport_marshal *marshal; /* SR_TPORT_COPIES: set by the agent before the first send */
};

/* A space event is pending. relaxed: a hint; space_take synchronises. */
static inline bool sr_tport_space_kicked(const sr_tport *t)
{
    return atomic_load_explicit(t->space_kick, memory_order_relaxed) != 0;
}

/* The consumer's: has it latched a corrupt inbox? relaxed: latched by the
 * consumer (the thread asking, or one that handed it the inbox). */
static inline bool sr_tport_inbox_bad(const sr_tport *t)
{
    return atomic_load_explicit(t->inbox_bad, memory_order_relaxed) != 0;
}

/* The exit generation: a change means some peer's exit is new to whoever
 * last read it. seq_cst (acquire at least): pairs with the supervisor's X2. */
static inline uint32_t sr_tport_exits(const sr_tport *t)
{
    return atomic_load_explicit(t->exits, memory_order_seq_cst);
}

#endif
