/* SPDX-License-Identifier: MIT */
/* The shared-memory transport: a worker's view of the job's segment.
 *
 * Minimal messaging for the layers above: attach, send to a rank, receive in
 * bursts, and wait (spin briefly, then sleep in io_uring).
 *
 * Threads: sr_xport_send / sr__xport_send_wait may be called by any thread of
 * the worker at once. sr__xport_recv_burst and sr__xport_wait belong to the one
 * thread that consumes the inbox (the progress thread).
 *
 * Lifetime: sr__xport_attach .. sr__xport_detach. The segment fd the worker was
 * launched with stays open, so a worker may attach again (every worker of
 * the job must then attach the same number of times).
 */
#ifndef SR_TRANSPORT_SHM_XPORT_H
#define SR_TRANSPORT_SHM_XPORT_H

#if !defined(SR__IN_TRANSPORT)
#error "xport.h is private to the transport layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "doorbell.h"
#include "ring.h"
#include "segment.h"
#include "transport.h"
#include "waiter.h"

typedef struct sr_xport_opts {
    int64_t start_timeout_ns; /* attach barrier bound, from the latest arrival; 0: 60 s */
    uint32_t doorbell;        /* 0: probe (SHMRPC_DOORBELL=eventfd forces the fallback) */
    int64_t spin_ns;          /* < 0 or unset (0 with adaptive=true): adaptive; see below */
    bool fixed_spin;          /* use spin_ns as a fixed budget (0 = never spin) */
    const char *name;         /* published in the worker table; NULL: "worker<rank>" */
    bool publish_exits;       /* no supervisor reaps the workers (mpirun): publish local peers' exits */
} sr_xport_opts;

/* Counters of this worker (relaxed atomics: statistics only). sent (the
 * sends that rang: into a slot their consumer watched, or paying a ring
 * quiet ones owed; doorbell.h), quiet (those that did not), peer_rings
 * (sr__xport_ring_peer calls that paid an owed ring), wakes and full are added to by any sending
 * thread; received, sleeps and spin_hits are written by the inbox's
 * consumer alone. Every send adds to one of sent and quiet, so that the
 * doorbell checks (sent + peer_rings) cost no add of their own. */
typedef struct sr_xport_stats {
    _Atomic uint64_t sent, quiet, peer_rings, received, wakes, sleeps, full, spin_hits;
} sr_xport_stats;

/* A peer as resolved after the start barrier. kind, eventfd and name are
 * private copies of its worker-table line, validated then (a scribbled
 * eventfd would make a doorbell write to any file of ours; a name without
 * its NUL would overrun every report). For our own rank: our waiter's.
 * A rank that does not attach to our segment (another host's, segment.h
 * "Partial attach") has local = false, no inbox, no doorbell, an empty name
 * and no pidfd watch: the MPI transport reaches it and names it. */
struct sr_peer {
    struct sr_ring *inbox;      /* NULL: not local */
    bool local;                 /* attaches to our segment: a private copy of its line's flag, taken at attach */
    _Atomic uint32_t *exited;   /* its worker table's exit word (segment.h) */
    _Atomic uint32_t *generation; /* its worker table's generation word (same line as exited) */
    _Atomic uint32_t *state;    /* its worker table's state word (elastic jobs: a detached peer is gone, E3) */
    /* The generation we know (segment.h, "Replacement in place"): taken
     * after the start barrier, then by sr__xport_rejoin (the thread that
     * handles exits) once a new process of the rank attached; read by every
     * sending thread. UINT32_MAX: none known (not attached when we looked). */
    _Atomic uint32_t gen;
    _Atomic uint32_t *doorbell;
    /* Its doorbell's kind (enum sr_doorbell_kind): set before the peers are
     * shared, then by sr__xport_rejoin while sending threads ring with it:
     * an atomic, read with sr__xport_peer_kind. */
    _Atomic uint32_t kind;
    int eventfd;
    /* A quiet send to it found its slot watched (doorbell.h, R1): the next
     * ring_peer rings. Set by a sending thread after its publish, taken by
     * the ring_peer of any thread (exchange): a ring after the publish
     * either way. */
    _Atomic bool owed;
    char name[SR_NAME_MAX];
};

typedef struct sr_xport {
    sr_segment seg;
    int rank, world;
    int nlocal;               /* ranks that attach to our segment (peers[].local), us included */
    struct sr_ring_cons *inbox; /* = &inbox_view: the consumer's private view of our inbox (ring.h) */
    struct sr_worker_info *me;
    struct sr_peer *peers;    /* [world], resolved once after the start barrier */
    sr_waiter waiter;
    int ncpu;
    int loadavg_fd;           /* /proc/loadavg, for the spin policy; -1 with a fixed budget */
    _Atomic int64_t load_next; /* when to sample it again (coarse clock); any thread */
    _Atomic uint32_t spin_gate; /* the debounced samples (sr__spin_gate_next); written by the sampling thread */
    _Atomic int64_t spin_ns;  /* current budget: written by adapt() after a sleep, read by any spinning thread */
    bool fixed_spin;
    bool graceful;            /* set before detach after a graceful shutdown: peers see DETACHED, not LEFT */
    bool timed_out;           /* set before detach after a graceful shutdown timed out: peers see TIMED_OUT */
    bool publish_exits;       /* no supervisor (mpirun): local peers' exits are ours to publish (orphan.c); set at attach */
    bool replaces;            /* the job replaces failed ranks (header flags SR_SEG_F_REPLACE), or is
                                 elastic (ranks come back as new generations); set at attach */
    bool elastic;             /* SR_SEG_F_ELASTIC (segment.h, "Elastic jobs"); set at attach */
    bool leaving;             /* we left the job (sr_shutdown in an elastic job): detach as LEFT_JOB */
    uint32_t gen;             /* our own generation, read at attach */
    sr_xport_stats st;
    sr_tport tp;              /* this transport's instance behind the seam (sr__xport_transport) */
    /* Own lines: the consumer writes head on every burst; the fields above
     * are read by every sending thread (the struct is allocated aligned). */
    struct sr_ring_cons inbox_view SR_ALIGNED_LINE;
    bool inbox_reported;        /* a corrupt inbox was reported on stderr (once); the consumer's */
} sr_xport;

/* Attach the calling process as its launch rank (shmrun env, sr_spawn, or
 * the MPI bootstrap), and wait until every worker that attaches to the
 * segment (all of them, or this host's: segment.h, "Partial attach") has
 * attached. Errors: -ENOENT not launched by shmrun/sr_spawn; -EPROTO/-EINVAL
 * bad segment, or one our rank does not attach to; -ETIMEDOUT a peer never
 * attached; -EPIPE a worker's process ended before every worker had
 * attached (at once: the supervisor publishes it; the message names the rank
 * and its exit status); -ENOMEM. */
int sr__xport_attach(const sr_xport_opts *o, sr_xport **out);
void sr__xport_detach(sr_xport *x);

/* The instance of the transport seam (transport.h) over x, valid until
 * sr__xport_detach: the layer above reaches x only through it. Call once,
 * after attach (xport_tport.c). */
sr_tport *sr__xport_transport(sr_xport *x);
/* The shared-memory transport of a worker's set (select.c): white-box tests
 * reach the segment and the rings through it. */
sr_xport *sr__transport_xport(const sr_transports *s);

/* Does `rank` attach to our segment (reachable through its inbox)? False
 * for a rank out of range. */
static inline bool sr__xport_local(const sr_xport *x, int rank)
{
    return (unsigned)rank < (unsigned)x->world && x->peers[rank].local;
}

/* Send one message (m->src is stamped with our rank). 0; -EAGAIN the
 * destination inbox is full (back-pressure: nothing was sent, retry: see
 * space events below); -EINVAL bad rank, or one not local (sr__xport_local); -EPIPE the destination's process
 * has ended (published by the supervisor; the message says how); -EPROTO the
 * destination's inbox is corrupt (the error names its worker). */
int sr_xport_send(sr_xport *x, int to, sr_msg *m);

/* As sr_xport_send, but never wakes the destination: this thread rings it
 * later (sr__xport_ring_peer, doorbell.h R1). */
int sr__xport_send_quiet(sr_xport *x, int to, sr_msg *m);
/* As sr_xport_send, for a message nobody waits on and no ring follows: it
 * wakes the destination only if a message published behind it may be
 * waiting on it (doorbell.h R2); else it is read when the destination next
 * polls. */
int sr__xport_send_lazy(sr_xport *x, int to, sr_msg *m);
/* After quiet sends to `to`: ring its doorbell once, as the last of them
 * would have (doorbell.h R1). 0, or -EINVAL (out of range, not local). */
int sr__xport_ring_peer(sr_xport *x, int to);

/* As sr_xport_send, but wait for space until deadline_ns (absolute
 * CLOCK_MONOTONIC, < 0: none). -ETIMEDOUT when it passes. Must not be used
 * by a thread that is itself the only consumer the destination waits on. */
int sr__xport_send_wait(sr_xport *x, int to, sr_msg *m, int64_t deadline_ns);

/* Check `to`'s inbox without sending: 0 room, -EAGAIN full, -EPROTO corrupt
 * (reported as sr_xport_send does), -EINVAL bad rank. For error reports. */
int sr__xport_probe(sr_xport *x, int to);

/* Space events: waiting for room in a full inbox without a timer.
 * A sender that got -EAGAIN calls sr__xport_space_arm(x, to) and then retries
 * its send once (the W1/W2 handshake of ring.h); if that fails too, the
 * destination's consumer, when it next frees slots, sets our worker's
 * space_kick and rings our doorbell. Whoever polls our inbox checks
 * sr__xport_space_kicked (also after announcing SLEEPING, with D2 before it:
 * the consumer's doorbell ring has D3 after its kick), and on a kick calls
 * sr__xport_space_take, then retries everything it queued. */
void sr__xport_space_arm(sr_xport *x, int to);

static inline bool sr__xport_space_kicked(const sr_xport *x)
{
    /* relaxed: a hint; sr__xport_space_take synchronises */
    return atomic_load_explicit(&x->me->space_kick, memory_order_relaxed) != 0;
}

/* Clear our space kick; true if one was pending. */
static inline bool sr__xport_space_take(sr_xport *x)
{
    /* acquire: pairs with the consumer's release store in kick_space_waiters
     * (xport.c): the slots it freed before are visible to our retries */
    return atomic_exchange_explicit(&x->me->space_kick, 0, memory_order_acquire) != 0;
}

/* Copy out up to n messages from our inbox. Returns the count (0: empty,
 * or the inbox is corrupt: then the first call reports it on stderr, naming
 * this worker, and sr__xport_inbox_error says so).
 * Their slots are freed by the next sr__xport_recv_burst, sr__xport_wait or
 * sr__xport_sleep, not at once (ring.h says why); until then they count
 * against the inbox's capacity. */
unsigned sr__xport_recv_burst(sr_xport *x, sr_msg *out, unsigned n);

/* 0, or -EPROTO (with the error naming this worker and what was read) once
 * the consumer found a sequence word in its own inbox that no legal history
 * produces: no message can be read past it. A producer that finds an inbox
 * corrupt rings its owner's doorbell, and a corrupt head slot not yet latched
 * keeps the consumer from sleeping (sr__ring_cons_pending), so a consumer
 * asleep when its inbox is scribbled on learns of it from the next send. */
int sr__xport_inbox_error(sr_xport *x);

/* The consumer's: has it latched a corrupt inbox? One relaxed load. */
static inline bool sr__xport_inbox_bad(const sr_xport *x)
{
    /* relaxed: latched by the consumer (the thread asking, or one that
     * handed it the inbox); other threads only peek */
    return atomic_load_explicit(&x->inbox->bad, memory_order_relaxed) != 0;
}

/* "the inbox ring of worker1 (rank 1) is corrupt: position ... holds
 * sequence ..." for a latched corrupt inbox, without the error prefix. */
const char *sr__xport_inbox_text(sr_xport *x, char *buf, size_t len);

/* Wait until the inbox has a message, deadline_ns passes, a peer dies or
 * shutdown is notified: spin for the adaptive budget (zero when the machine
 * has more runnable threads than we have cores), then sleep. Returns SR_WAKE_*
 * or -errno (-EPROTO: our inbox is corrupt, see sr__xport_inbox_error). */
int sr__xport_wait(sr_xport *x, int64_t deadline_ns);

/* The two halves of sr__xport_wait, for callers that run their own spin loop:
 * the current spin budget (0 when oversubscribed), and the sleep, where
 * ready(arg) is checked after the doorbell announcement (return true to
 * cancel the sleep; it must at least report a ready inbox). */
int64_t sr__xport_spin_budget(sr_xport *x);
/* When the spin budget is 0 because the machine is oversubscribed (not
 * because SHMRPC_SPIN_NS or the options fixed it): how long a waiter may
 * poll by giving its core away (sched_yield) before it sleeps; else 0. */
int64_t sr__xport_yield_budget(sr_xport *x);
int sr__xport_sleep(sr_xport *x, int64_t deadline_ns, bool (*ready)(void *), void *arg);

/* Every sleep of a thread waiting for a message feeds the adaptive spin
 * budget (sr__spin_adapt_next), whichever way it sleeps: sr__xport_sleep
 * does it; a sleep of its own (the token holder's doorbell sleep,
 * xport_tport.c) brackets it with these. A sleep that did not feed it could
 * leave the budget at 0 for good once other sleeps had halved it: the
 * holder would never spin again and sleep on every wait. t0 is 0 with a
 * fixed budget (no clock read). */
int64_t sr__xport_sleep_begin(const sr_xport *x);
void sr__xport_sleep_end(sr_xport *x, int64_t t0);

/* The spin policy's decision, a pure function of the samples so that it can
 * be tested without timing. gate is one word: bit 0 oversubscribed (do not
 * spin), bit 1 a sample has been taken, bits 2.. the samples in a row that
 * disagreed with bit 0. A sample says oversubscribed when the runnable
 * threads it counted (the sampling thread included) exceed ncpu. The first
 * sample decides at once; after that the state flips only after
 * SR_SPIN_GATE_SAMPLES samples in a row say the other thing, so a thread
 * that is runnable for a moment (a kernel worker, one of our own threads
 * woken for a job) no longer turns spinning off for a whole sample period,
 * while a machine that stays oversubscribed still stops every spin within
 * SR_SPIN_GATE_SAMPLES periods. Returns the next gate. */
#define SR_SPIN_GATE_SAMPLES 3u
uint32_t sr__spin_gate_next(uint32_t gate, int runnable, int ncpu);
static inline bool sr__spin_gate_oversubscribed(uint32_t gate) { return gate & 1u; }

/* The adaptive spin budget after a sleep of slept_ns, a pure function so
 * that it can be tested without timing. A sleep that a spin of at most
 * max_ns would have caught (slept_ns <= max_ns) raises the budget to twice
 * the sleep (up to max_ns); a longer one halves it. slept_ns includes the
 * wake-up itself (15-20 us on a VM), so the bound is max_ns, not less: with
 * max_ns / 2, every sleep on such a machine halved the budget, and once it
 * reached 0 it never rose again (each sleep lasts at least a wake-up). */
int64_t sr__spin_adapt_next(int64_t spin_ns, int64_t slept_ns, int64_t max_ns);

/* The process of `rank` we know has ended: the supervisor published its
 * exit (segment.h, "Peer exit"), or the rank has another generation now
 * ("Replacement in place"), or, in an elastic job, it detached ("Elastic
 * jobs", E3: a free rank reads as an exit, E1). seq_cst: pairs with the
 * supervisor's X1 and R2 stores and the detaching worker's E3. The exit
 * and generation words share a line. */
static inline bool sr__xport_peer_gone(const sr_xport *x, int rank)
{
    const struct sr_peer *p = &x->peers[rank];
    return atomic_load_explicit(p->exited, memory_order_seq_cst) != 0 ||
           /* relaxed: our own view, written by the thread that handles exits */
           atomic_load_explicit(p->generation, memory_order_seq_cst) !=
               atomic_load_explicit(&p->gen, memory_order_relaxed) ||
           /* seq_cst: pairs with the detaching peer's E3 store and increment */
           (x->elastic && sr__worker_state_detached(atomic_load_explicit(p->state, memory_order_seq_cst)));
}

/* Elastic jobs (segment.h, E2): rank is leaving the job or has left it, so
 * no call may start to it. seq_cst: pairs with the leaver's store of
 * LEAVING, after the caller's seq_cst count of the call. */
static inline bool sr__xport_peer_leaving(const sr_xport *x, int rank)
{
    uint32_t st = atomic_load_explicit(x->peers[rank].state, memory_order_seq_cst);
    return st == SR_WORKER_LEAVING || sr__worker_state_detached(st);
}

/* The doorbell kind to ring rank's with. relaxed: a word whole in itself
 * (any value read is one sr__xport_rejoin or resolve_peer checked); a
 * sender that stamps the generation taken with it reads it after that
 * generation's acquire load (enqueue_to), which its release store orders. */
static inline uint32_t sr__xport_peer_kind(const struct sr_peer *p)
{
    return atomic_load_explicit(&p->kind, memory_order_relaxed);
}

/* A gone rank's new process has attached: take its generation as the one
 * we know (messages to it carry it from now on). 0; -EAGAIN none has
 * attached yet (or it ended too); -EPROTO its line is corrupt. Called by
 * the thread that handles exits, after it handled the old one's. */
int sr__xport_rejoin(sr_xport *x, int rank);

/* The count of published exits, a generation: a change means some peer's
 * exit is new to whoever last read it. seq_cst (acquire at least): pairs with X2. */
static inline uint32_t sr__xport_exits(const sr_xport *x)
{
    return atomic_load_explicit(&x->seg.hdr->exits, memory_order_seq_cst);
}

/* "worker2 exited with status 0 without sr_shutdown", or for a named worker
 * "'ps' (rank 2) was killed by signal SIGKILL"; `rank` must be gone. */
const char *sr__xport_gone_text(const sr_xport *x, int rank, char *buf, size_t len);
/* The peer detached after a graceful shutdown before its process ended:
 * nothing of the job can still be waiting for it. */
bool sr__xport_peer_left_gracefully(const sr_xport *x, int rank);
/* The peer detached after its own graceful shutdown timed out: it had come
 * to the shutdown and gave up waiting (SR_WORKER_TIMED_OUT); no death. */
bool sr__xport_peer_left_timed_out(const sr_xport *x, int rank);

/* This worker has entered a graceful shutdown: if it dies now, peers say
 * "during sr_shutdown" rather than "without sr_shutdown". */
void sr__xport_closing(sr_xport *x);

/* Without a supervisor (sr_xport_opts.publish_exits: under mpirun), publish
 * the exits of the local peers whose pidfds fired, when this worker is the
 * lowest-ranked local one alive (orphan.c): X1-X3 of segment.h, with the
 * status unknown (SR_EXIT_SEEN). The thread that sleeps on the waiter
 * calls it after each sleep. */
void sr__xport_publish_orphans(sr_xport *x);

/* The process of `rank` has exited (cleanly or not), seen through its pidfd
 * by this worker's waiter; says nothing of how (sr__xport_peer_gone does).
 * Only without a supervisor (publish_exits: mpirun) are pidfds watched;
 * under shmrun and sr_spawn this is always false and the supervisor's
 * publication (sr__xport_peer_gone) says it. */
static inline bool sr__xport_peer_dead(const sr_xport *x, int rank)
{
    return x->waiter.peer_dead && x->waiter.peer_dead[rank];
}

/* 0, or -EPIPE naming the first peer whose process exited without
 * detaching (a crash; under shmrun the launcher is already stopping the job):
 * seen through its pidfd, or its exit as published. */
int sr__xport_check_peers(sr_xport *x);

#endif
