/* SPDX-License-Identifier: MIT */
/* RRefs, internal side: the object, the per-worker context, and the helpers
 * shared by the files of lib/modules/rref. The protocol is described in docs/RREF.md;
 * the functions lib/rpc calls are in hooks.h.
 *
 * Locking: one mutex (ctx.lock) guards every map of the context and the
 * fields of sr_rref marked "lock". It is a static mutex, so an RRef that
 * outlives its context (after sr_shutdown) can still take it safely and
 * learn from ctx.gen that its round is over. No future is completed, no
 * message sent and no RRef unreffed while it is held (those may re-enter):
 * handlers collect them in a struct after and run it after unlocking.
 * The maps are all small per-operation updates; the hot paths take the lock
 * once or twice per call (documented in docs/RREF.md).
 */
#ifndef SR_RREF_INTERNAL_H
#define SR_RREF_INTERNAL_H

#if !defined(SR__IN_RREF)
#error "rref_internal.h is private to the rref module layer (docs/ARCHITECTURE.md)"
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "forks.h"
#include "map.h"
#include "module.h"
#include "waiter.h" /* sr__now_ns, sr__now_coarse_ns */

/* Ids: rank << 48 | (the creating generation mod 256) << SR_RREF_GEN_SHIFT |
 * counter (docs/RREF.md, "Ids"); ACK tokens start at their generation's
 * slice too. */
#define SR_RREF_GEN_SHIFT 40
#define SR_RREF_ID_GEN(id) ((uint32_t)(SR_RREF_ID_LOCAL(id) >> SR_RREF_GEN_SHIFT) & 0xffu)

/* The RRef module's id and value kind (module.c: sr__module_register). */
extern int sr__rref_module;
extern int sr__rref_kind;
/* The RRef module's raw message (its type SR_RREF_MSG_CTRL): control
 * messages, idempotent, each sent once (protocol.c), as these bytes. */
enum { SR_RREF_MSG_CTRL = 0 };
struct sr_rref_msg {
    uint64_t token;   /* the sender's token when it wants an ACK (echoed by the ACK; 0: none) */
    struct { uint64_t a, b, c; } args; /* rref_id, fork_id, extra */
    uint8_t kind;     /* enum sr_rref_ctrl */
    uint8_t pad[3];   /* zero: no byte of a message is left unset */
    uint32_t to_gen;  /* the generation of the destination rank it is meant for (lost.c): another
                         generation of that rank ignores it */
};
enum sr_rref_ctrl {
    SR_RREF_FORK_REQUEST = 1, /* user -> owner: register fork_id (args: rref_id, fork_id) */
    SR_RREF_CHILD_ACCEPT = 2, /* child -> parent: the owner knows fork_id; release the parent */
    SR_RREF_USER_DELETE = 3,  /* user -> owner: fork_id is gone (extra: SR_DELETE_QUIET_ACK below) */
    SR_RREF_ACK = 4,          /* answer to a FORK_REQUEST or USER_DELETE: token = the request's token,
                                 args.a = 0 or the -errno that kept the owner from applying it;
                                 token 0: the answer to a NUDGE (wakes its receiver, nothing else) */
    SR_RREF_NUDGE = 5,        /* waiter -> owner: answer me loudly (see protocol.c, quiet ACKs) */
    SR_RREF_ANNOUNCE = 6,     /* waiting parent -> a child's worker: ask the owner now for my children
                                 up to fork_id (unannounced users, fork.c); no answer */
    SR_RREF_ORPHANS_DONE = 7, /* survivor -> every worker: the fork requests it made for children of
                                 the dead generation (rank a, generation b) are applied; no answer (lost.c) */
};
/* USER_DELETE's extra word: adds_sent << 2 | SR_DELETE_QUIET_ACK? | confirmed. */
#define SR_DELETE_QUIET_ACK UINT64_C(2)
/* Module requests (tag = the rref id): to_here's fetch; CONFIRMED says the
 * sender's UserRRef is confirmed, so a missing OwnerRRef has been deleted
 * rather than not yet created. */
enum { SR_RREF_FETCH = 1, SR_RREF_FETCH_CONFIRMED = 2 };
/* The request's sub byte: the kind above, and the owner generation the
 * fetch is meant for (mod 64) << 2; another generation answers "lost". */
#define SR_RREF_FETCH_KIND(sub) ((sub) & 3u)
#define SR_RREF_FETCH_GEN(sub) ((uint32_t)(sub) >> 2)
#define SR_RREF_FETCH_SUB(kind, gen) ((uint8_t)((kind) | ((gen) & 0x3fu) << 2))
/* The module's extension byte on a call: argument 0 is an RRef owned by the
 * callee, and its local value replaces it before the function runs. */
#define SR_RREF_EXT_PROXY 0x1u
#include "shmrpc/rref.h"

struct sr_rref {
    _Atomic uint32_t refs;
    /* Immutable after creation. */
    bool is_owner;
    uint16_t owner;       /* rank of the owner */
    uint32_t owner_gen;   /* the owner's generation (segment.h, "Replacement in place"): the value
                             lives in that process only; once it died, every use fails (lost.c) */
    uint64_t rref_id;
    uint64_t fork_id;     /* users; SR_RREF_NO_ID for an owner */
    uint64_t gen;         /* the context round it belongs to */
    sr_future *value;     /* owner: completed once, with the value or the error that replaced it */
    /* user: completed once confirmed (or failed). A received user that must
     * ask its owner gets it before it is published; a remote() user gets it
     * lazily, under the lock, only if someone asks (sr_rref_confirmation). */
    sr_future *confirm;
    /* Owners. */
    bool awaiting;        /* lock: created by a use (fork, fetch) before its REMOTE_CALL arrived */
    /* Users. */
    _Atomic bool confirmed;  /* release store under the lock, acquire loads anywhere */
    _Atomic bool deleted;    /* set under the lock: the owner has been (or is being) told this fork is
                                is gone; read without it as a hint (relaxed) */
    bool registered;         /* lock: in pending_users, users or unannounced, or a remote() user awaiting
                                its REMOTE_RET */
    bool unannounced;        /* lock: received from another user by a call's arguments and not told to
                                its owner yet (in unannounced; see fork.c) */
    bool creating;           /* lock: a remote() user whose REMOTE_RET has not come (counted in pending_remote) */
    uint32_t adds_sent;      /* lock: add messages made for this fork (see forks.h) */
    sr_value *cached;        /* a remote() user: the small plain value its REMOTE_RET carried
                                (written before its confirmation completes; immutable) */
    /* remote() creation error: create_msg is written before the release store of create_err. */
    _Atomic int create_err;
    char *create_msg;
};

struct rref_ctx {
    pthread_mutex_t lock;
    bool active;             /* lock: between sr__rref_init and sr__rref_fini */
    bool ignore_leaks;       /* written at init, before any other thread looks */
    _Atomic uint64_t gen;    /* bumped by every init, under the lock (relaxed loads: see live_locked) */
    _Atomic uint64_t live_gen; /* gen while active, 0 after fini: the lock-free liveness check */
    int rank, world;         /* written at init */
    _Atomic uint64_t next_id;    /* the GUID counter (RRef and fork ids) */
    uint64_t next_token;         /* lock: ACK tokens */
    sr_u64map owners;            /* rref_id -> OwnerRRef (a reference): forked, or awaiting its creating call */
    sr_fork_table forks;         /* the owner's view of its users */
    sr_u64map pending_users;     /* fork_id -> sr_rref * (reference): received users asking their owner */
    uint32_t pending_remote;     /* lock: remote() users awaiting their REMOTE_RET (held by the call) */
    sr_u64map users;             /* fork_id -> sr_rref * (weak: removed by the RRef's destroy) */
    sr_u64map unannounced;       /* fork_id -> sr_rref * (weak: removed by the RRef's destroy or its
                                  * announcement): user->user forks held by a running call, whose
                                  * FORK_REQUEST waits for the call's end (fork.c) */
    sr_u64map announce_upto;     /* parent rank -> (void *)(fork id + 1): that parent waits for its
                                  * children up to this fork id, so they are not left unannounced */
    sr_u64map children;          /* fork_id -> parent sr_rref * (reference, G2) */
    sr_u64map child_to;          /* fork_id -> (void *)(rank + 2): where each child in children went
                                  * (-1: not known); the same keys as children */
    int lost_rank;               /* lock: -1, or a dead rank that took a pending child (reported once,
                                  * by sr_rref_wait_idle) */
    uint64_t lost_fid;           /* lock: that child's fork id */
    char lost_how[256];          /* lock: how lost_rank left ("worker2 exited with status 0 ...") */
    sr_u64map unacked;           /* token -> struct unacked * (protocol.c): messages awaiting their ACK */
    uint32_t awaiting;           /* lock: owners with awaiting set */
    sr_future *idle;             /* lock: completed when pending users, children and unacked are all gone */
    _Atomic uint64_t deferred;   /* statistics: calls waiting on their RRef arguments */
    _Atomic uint64_t sent;       /* statistics: control messages sent (ACKs included, nudges not) */
    _Atomic uint32_t idle_waiters; /* threads in sr_rref_wait_idle; ++ under the lock, -- anywhere */
    uint32_t my_gen;             /* this process's generation; written at init */
    sr_u64map lost;              /* rank -> struct sr_rref_lost * (lost.c): the generations of that
                                  * rank that died, and how the last one did */
    _Atomic uint32_t deaths;     /* peers that died this round: 0 lets uses skip the lock (lost.c) */
    sr_u64map drops;             /* rank << 32 | gen -> struct sr_rref_drop * (lost.c): a dead generation's
                                  * forks on this owner, dropped once the survivors announced its orphans */
    sr_u64map orphans;           /* rank << 32 | gen -> (void *)token: this worker's fork requests below
                                  * that token must be acknowledged before it sends ORPHANS_DONE */
    _Atomic uint32_t orphans_pending; /* orphans.n, for a lock-free look (++/-- under the lock) */
};

extern struct rref_ctx sr__rref_ctx;

/* Work collected under the lock, done after it (see the header comment). */
#define AFTER_MAX 6
struct after {
    sr_rref *unref[AFTER_MAX];
    int nunref;
    sr_future *complete[AFTER_MAX]; /* completed with none, then unreffed */
    int ncomplete;
    struct {
        int to;
        bool quiet;  /* an ACK the deleter allowed to be quiet */
        bool nudge;  /* a delete whose ACK may come quietly: nudge if a waiter appeared meanwhile */
        struct sr_rref_msg m;
    } send[AFTER_MAX];
    int nsend;
};
/* Only the counts: zeroing the arrays would cost more than the work. */
static inline void sr__after_init(struct after *d)
{
    d->nunref = d->ncomplete = d->nsend = 0;
}
void sr__after_run(struct after *d);
/* Tests only (tests/rref): called by sr__after_run before each control
 * message of d goes out, on the thread that made the decision to send it,
 * after the lock; it may block, to put an event (a peer's death and
 * replacement) between the decision and the send. NULL otherwise. Not
 * synchronised: set it before sr_init. */
extern void (*sr__rref_test_before_send)(int to, enum sr_rref_ctrl kind);

/* context.c */
void sr__rref_lock(void);
void sr__rref_unlock(void);
/* The caller's round is live (lock held). */
bool sr__rref_live_locked(const sr_rref *r);
/* The same without the lock, for checks that a racing shutdown may overtake anyway. */
static inline bool sr__rref_live(const sr_rref *r)
{
    extern struct rref_ctx sr__rref_ctx;
    /* acquire: pairs with the release store in sr__rref_init */
    return r->gen == atomic_load_explicit(&sr__rref_ctx.live_gen, memory_order_acquire);
}
/* n consecutive new ids; the first, or SR_RREF_NO_ID when the counter is spent. */
uint64_t sr__rref_new_ids(unsigned n);
/* The registered OwnerRRef of rid (borrowed), created (awaiting its value)
 * if absent; NULL on -ENOMEM. */
sr_rref *sr__owner_get_or_create_locked(uint64_t rid, bool awaiting);
/* Unregister the OwnerRRef once no fork is left and no creating call is awaited. */
void sr__owner_maybe_erase_locked(uint64_t rid, struct after *d);
/* Complete ctx.idle if the worker just became idle. */
void sr__idle_check_locked(struct after *d);
bool sr__idle_locked(void);
/* "(rank,counter)" */
const char *sr__id_str(uint64_t id, char *buf, size_t len);

/* rref.c */
sr_rref *sr__rref_alloc(bool is_owner, int owner, uint64_t rid, uint64_t fid);
/* Fail the owner's value future (creation never happened, shutdown...). */
void sr__rref_owner_fail(sr_rref *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Record a remote() creation failure on a user (first one wins). */
void sr__rref_set_create_error(sr_rref *r, int err, const char *msg);
/* A user stops pending (leaves pending_users, or its REMOTE_RET came): into
 * users (weak), confirmed or not. Lock held; the caller runs
 * sr__idle_check_locked once its own updates are done. */
void sr__user_resolve_locked(sr_rref *r, bool confirmed, struct after *d);

/* protocol.c: queue a control message (lock held), sent once by
 * sr__after_run. A FORK_REQUEST or USER_DELETE is tracked until its ACK.
 * 0, or -ENOMEM for a FORK_REQUEST that cannot be tracked (then not sent;
 * a delete that cannot be tracked is sent untracked). */
int sr__ctrl_queue_locked(struct after *d, int to, enum sr_rref_ctrl kind, uint64_t rid, uint64_t fid,
                          uint64_t extra);
/* Send one message now, counted for quiescence (quiet: wakes nobody); m
 * is stamped already (to_gen: protocol.c, queue_send). */
int sr__ctrl_send(int to, const struct sr_rref_msg *m, bool quiet);
/* After a send (d->send[i]) that may get a quiet answer: if a thread began
 * waiting for idleness meanwhile, nudge the destination. */
void sr__ctrl_after_send(int to, bool nudge);
/* ANNOUNCE to `to`: ask the owners for this worker's children there, up to fork id upto. */
void sr__ctrl_announce(int to, uint64_t upto);
/* A loud NUDGE: the owner answers it loudly after its earlier ACKs. */
void sr__ctrl_nudge(int to);
/* Mark (mark[rank] = true) the owners of unacknowledged deletes. Lock held. */
void sr__unacked_delete_owners_locked(bool *mark, int world);
/* A message sr__ctrl_send refused (err): settle what waited for its answer. */
void sr__ctrl_unsent(int to, const struct sr_rref_msg *m, int err);
/* rref.c: an unannounced user goes (let go, or its owner died): its parent
 * is told to drop its hold (G2). Lock held; one unref or one send of d. */
void sr__unannounced_gone_locked(sr_rref *r, struct after *d);
/* Tell the owner that a user is gone (G1), if not done yet. Lock held. */
void sr__user_delete_locked(sr_rref *r, struct after *d);

/* lost.c: owners that died (docs/RREF.md, "A dead worker, a replaced rank"). */
struct sr_rref_lost {
    uint32_t floor;   /* generations below it are dead */
    char how[200];    /* how the last of them died ("worker1 (generation 0) was killed by signal SIGKILL") */
};
/* rid is not registered on this owner and no REMOTE_CALL can create it any
 * more: it was made here (an OwnerRRef is registered before its first fork
 * leaves) or by an earlier generation of this rank, or by a generation of
 * its creator that died. A use of it then finds it deleted instead of
 * creating an OwnerRRef that would await a call that never comes. Lock held. */
bool sr__rref_gone_for_good_locked(uint64_t rid);
/* r is a user whose owner's generation has died (lock held). */
bool sr__rref_owner_lost_locked(const sr_rref *r);
/* The same, taking the lock only after some peer died; if lost, fails with
 * -SR_EOWNERLOST for fn naming the owner, its rank and generation. */
int sr__rref_check_owner(const sr_rref *r, const char *fn);
/* That failure, for r known to be lost or its owner gone (lock not held). */
int sr__rref_fail_lost(const sr_rref *r, const char *fn);
/* Record that rank's generation gen died (why: how); lock held. 0 or -ENOMEM. */
int sr__rref_lost_note_locked(int rank, uint32_t gen, const char *why);
/* Owner side, the dead generation (rank, gen): this owner handled its death
 * (its forks may go once every survivor sent ORPHANS_DONE; a dead rank owes
 * no ORPHANS_DONE for other deaths); `from` sent ORPHANS_DONE for it. Lock held. */
void sr__rref_death_armed_locked(int rank, uint32_t gen);
void sr__rref_orphans_done_locked(int from, int rank, uint32_t gen);
/* Drop the forks of the dead generations that are ready (force: every one
 * this owner handled; graceful shutdown, after quiescence), unregistering
 * the OwnerRRefs left with none. Lock not held. */
void sr__rref_drops_run(bool force);
/* Worker side (protocol.c): remember that ORPHANS_DONE for (rank, gen) is
 * owed once this worker's fork requests made so far are acknowledged
 * (lock held); send those that are owed now (lock not held). */
void sr__rref_orphans_note_locked(int rank, uint32_t gen);
void sr__rref_orphans_flush(void);
/* An OwnerRRef awaiting the creating REMOTE_CALL of the dead generation gen
 * of rank, which never comes: no longer awaiting (unregistered if no fork is
 * left); a reference for the caller to fail its value, or NULL if none. */
sr_rref *sr__rref_drop_awaiting_locked(int rank, uint32_t gen, struct after *d);

/* fork.c: user->user forks received by a call's arguments (see fork.c).
 * Announce an unannounced user to its owner now (FORK_REQUEST): it becomes
 * an ordinary pending user. Takes a reference of r for the pending table
 * (given back through d on failure). Lock held; 0 or -ENOMEM (then it stays
 * unannounced). */
int sr__user_announce_locked(sr_rref *r, struct after *d);
/* Take a reference of r unless its last one is already gone (its destroy
 * is then on its way and will take the lock). */
bool sr__rref_ref_live(sr_rref *r);
/* Announce the users in fids that are still unannounced (a call ended). */
void sr__rref_announce_forks(const uint64_t *fids, size_t n);
/* Announce every unannounced user whose parent is `parent` (-1: all): a
 * thread of this worker, or of the parent, waits for idleness. */
void sr__rref_announce_all(int parent);
/* A thread waits for idleness: ask the workers that hold this worker's
 * pending children to announce them (ANNOUNCE). */
void sr__rref_announce_children(void);
/* sr_rref_wait_idle, with the one-time report of a child lost to a dead
 * worker (-EPIPE) or without it (report_lost false: graceful shutdown in a
 * job that replaces ranks). use.c. */
int sr__rref_wait_idle(double timeout_s, bool report_lost);
/* The forks a call's arguments brought (its call state, module.c). */
struct rref_call {
    bool proxy;      /* argument 0 becomes the owner's local value */
    uint32_t n, cap;
    uint64_t *fids;  /* unannounced users decoded for the call */
};
/* Record fid in the state of the call being decoded; 0 or -ENOMEM. */
int sr__rref_call_note(sr_call *c, uint64_t fid);

/* protocol.c: a child fork is accepted (or gone): release its parent's hold
 * (G2). Lock held. */
void sr__child_accepted_locked(uint64_t fid, struct after *d);

/* The confirmation future of r (a reference), made on demand. */
int sr__rref_confirm_future(sr_rref *r, sr_future **out);

/* Wait for a future with the agent's polling wait; 0 or -ETIMEDOUT. */
int sr__rref_wait(sr_future *f, int64_t deadline_ns);
/* An absolute deadline from a timeout in seconds (< 0 default, 0 none). */
int sr__rref_deadline(double timeout_s, const char *fn, int64_t *ms, int64_t *deadline);

#endif
