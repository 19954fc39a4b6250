/* SPDX-License-Identifier: MIT */
/* The transport. See xport.h; the ring and doorbell contracts are in ring.h
 * and doorbell.h. */
#include "futex.h"
#include "xport.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "crash.h"
#include "error.h"
#include "log.h"
#include "heap.h"
#include "parse.h"
#include "spin.h"

#define SPIN_MAX_NS 50000     /* longer than a futex round trip on a busy VM */
#define SPIN_START_NS 20000
#define START_TIMEOUT_NS (60ll * 1000000000)
#define SLICE_NS (100ll * 1000000) /* bounded futex sleeps while waiting on peers */
#define LOAD_SAMPLE_NS (4ll * 1000000) /* the spin policy's runnable-thread count is this fresh */

static int futex_wait_ns(_Atomic uint32_t *w, uint32_t val, int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    return (int)syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static int count_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int spin_policy(sr_xport *x, const sr_xport_opts *o)
{
    int64_t env = -1;
    int rc = sr__env_int("sr_init", "SHMRPC_SPIN_NS", 0, INT64_MAX, &env);
    if (rc)
        return rc;
    x->ncpu = count_cpus();
    x->fixed_spin = o->fixed_spin || env >= 0;
    x->loadavg_fd = x->fixed_spin ? -1 : open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    int64_t spin = env >= 0 ? env : (o->fixed_spin ? o->spin_ns : SPIN_START_NS);
    atomic_init(&x->spin_ns, spin < 0 ? 0 : spin); /* before any thread of the agent starts */
    return 0;
}

static int missing_ranks(sr_xport *x)
{
    char list[256] = "";
    size_t len = 0;
    for (int r = 0; r < x->world && len < sizeof(list) - 16; r++)
        /* acquire: pairs with the worker's release store of ATTACHED */
        if (x->peers[r].local && !sr__worker_state_attached(atomic_load_explicit(&sr__seg_worker(&x->seg, r)->state, memory_order_acquire)))
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d", len ? "," : "", r);
    return sr__fail(-ETIMEDOUT, "sr_init", "ranks [%s] never attached to segment '%s'", list, x->seg.name);
}

/* The rank whose exit the supervisor published first, or -1: the cause,
 * not a peer that gave up because of it. */
static int first_exited(sr_xport *x)
{
    int first = -1;
    uint32_t seq = 0;
    for (int r = 0; r < x->world; r++) {
        const struct sr_worker_info *w = sr__seg_worker(&x->seg, r);
        /* seq_cst: after the generation read by the caller (X2 pairs with it) */
        if (x->peers[r].local && atomic_load_explicit(&w->exited, memory_order_seq_cst) &&
            w->exit_code != SR_EXIT_FREE && (first < 0 || w->exit_seq < seq)) /* a free rank never started (E1) */
            first = r, seq = w->exit_seq; /* exit_seq: written before X1 */
    }
    return first;
}

static int exited_before_start(sr_xport *x, int r)
{
    char how[128];
    sr__seg_exit_text(sr__seg_worker(&x->seg, r), how, sizeof(how));
    return sr__fail(-EPIPE, "sr_init", "rank %d %s, while rank %d waited for every worker to attach to segment '%s'",
                    r, how, x->rank, x->seg.name);
}

/* Sleep until `attached` moves off n, `exits` moves off e (a worker ended:
 * the supervisor wakes `attached` after publishing it), or ns pass. One
 * futex_waitv on both words, so no exit is missed between our check and the
 * sleep; kernels before 5.16 sleep on `attached` alone, in bounded slices. */
static void wait_start(struct sr_seg_header *h, uint32_t n, uint32_t e, int64_t ns)
{
    static bool no_waitv; /* racy but monotonic: every thread finds the same answer */
    if (!no_waitv) {
        struct futex_waitv v[2] = {
            {.val = n, .uaddr = (uintptr_t)&h->attached, .flags = FUTEX_32},
            {.val = e, .uaddr = (uintptr_t)&h->exits, .flags = FUTEX_32},
        };
        int64_t at = sr__now_ns() + ns;
        struct timespec ts = {.tv_sec = at / 1000000000, .tv_nsec = at % 1000000000};
        if (syscall(SYS_futex_waitv, v, 2, 0, &ts, CLOCK_MONOTONIC) >= 0 || errno != ENOSYS)
            return;
        no_waitv = true;
    }
    futex_wait_ns(&h->attached, n, ns < SLICE_NS ? ns : SLICE_NS);
}

/* The start barrier: every worker that attaches to the segment (nlocal of
 * them) has published its pid and doorbell. A worker may attach again after
 * detaching (init -> shutdown -> init), so its r-th attach to the same
 * segment waits for r * nlocal arrivals; an attach to another segment (the
 * MPI bootstrap makes one per sr_init) starts again at round 1. A worker
 * that has ended can never arrive: the barrier fails at once, naming it.
 *
 * Only the arrival that completes a round wakes the sleepers: the others
 * change the count without a wake, so each waiter sleeps once (a futex wait
 * on a count that has moved returns at once and reads it again). Rounds
 * never overlap: a round-r+1 arrival comes after its own round-r barrier
 * passed, i.e. after every round-r arrival. Waking at every arrival woke
 * every waiter N times: O(N^2) wake-ups for a job, which on 2 cores held
 * back the last arrivals behind the woken.
 *
 * The bound counts from the latest arrival this waiter has seen, not from
 * its own: a job of a thousand workers takes longer than any fixed bound to
 * start on a busy machine, while a rank that never comes leaves the count
 * still for the whole bound. A waiter wakes at its deadline, finds the
 * count moved and sleeps again: one wake per bound. */
static int start_barrier(sr_xport *x, int64_t timeout_ns)
{
    /* attaches by this process to the segment whose memfd inode is round_ino;
     * one thread attaches at a time (sr_init's lock) */
    static uint32_t round;
    static uint64_t round_ino;
    if (x->seg.ino != round_ino)
        round = 0, round_ino = x->seg.ino;
    struct sr_seg_header *h = x->seg.hdr;
    uint32_t want = ++round * (x->elastic ? x->seg.launched : (uint32_t)x->nlocal); /* E1: the launched ranks */
    /* release: pairs with peers' acquire loads below; publishes our table line */
    if (atomic_fetch_add_explicit(&h->attached, 1, memory_order_release) + 1 >= want)
        sr__futex_wake_all(&h->attached); /* the round is complete: everyone in it waits for this count */
    int64_t deadline = 0;
    uint32_t seen = 0; /* the count the deadline was set at; ours is at least 1 */
    sr_logf(SR_LOG_DEBUG, "attach: rank %d is in segment '%.48s'; waiting for the other workers (%u arrivals), up to %.0f s after each arrival",
            x->rank, h->name, want, (double)timeout_ns / 1e9);
    for (;;) {
        /* seq_cst: pairs with the supervisor's X2; read before the count, so
         * that an exit published after it changes the word we sleep on */
        uint32_t e = atomic_load_explicit(&h->exits, memory_order_seq_cst);
        /* acquire: pairs with each peer's release increment above */
        uint32_t n = atomic_load_explicit(&h->attached, memory_order_acquire);
        if (n >= want) {
            sr_logf(SR_LOG_DEBUG, "attach: every worker is in segment '%.48s'", h->name);
            return 0;
        }
        int r = e ? first_exited(x) : -1;
        if (r >= 0)
            return exited_before_start(x, r);
        int64_t now = sr__now_ns();
        if (n != seen) /* an arrival since we last looked (or our own): the bound starts again */
            seen = n, deadline = now + timeout_ns;
        int64_t left = deadline - now;
        if (left <= 0)
            return missing_ranks(x);
        wait_start(h, n, e, left);
    }
}

/* Is fd an eventfd of this process? (The fallback doorbell's fds are
 * inherited from the creator, so a peer's number is one of ours.) */
static bool is_eventfd(int fd)
{
    char path[64], link[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = fd >= 0 ? readlink(path, link, sizeof(link) - 1) : -1;
    if (n < 0)
        return false;
    link[n] = '\0';
    return !strcmp(link, "anon_inode:[eventfd]");
}

/* Copy rank r's table line (doorbell kind, eventfd, name) and check it. A
 * rank that is not local keeps no inbox and no doorbell, and its line (empty)
 * is not read: its name is the MPI transport's. */
static int resolve_peer(sr_xport *x, int r)
{
    struct sr_worker_info *w = sr__seg_worker(&x->seg, r);
    struct sr_peer *p = &x->peers[r];
    if (!p->local) {
        *p = (struct sr_peer){.exited = &w->exited, .generation = &w->generation, .state = &w->state, .eventfd = -1};
        return 0;
    }
    *p = (struct sr_peer){.inbox = sr__seg_inbox(&x->seg, r), .local = true, .exited = &w->exited,
                          .generation = &w->generation, .state = &w->state, .doorbell = &w->doorbell};
    memcpy(p->name, w->name, sizeof(p->name)); /* also a peer's that left since: sr_init checks them all */
    p->name[sizeof(p->name) - 1] = '\0';
    /* acquire: pairs with the supervisor's R2 store; the line's state after it */
    uint32_t gen = atomic_load_explicit(&w->generation, memory_order_acquire);
    /* acquire: pairs with the peer's release store of ATTACHED, after its line */
    if (x->replaces && r != x->rank &&
        atomic_load_explicit(&w->state, memory_order_acquire) == SR_WORKER_EMPTY) {
        /* A replacement of it is starting (we are one too: two ranks died
         * close together): unknown until it attaches (sr__xport_rejoin). */
        atomic_init(&p->gen, UINT32_MAX);
        atomic_init(&p->kind, SR_DOORBELL_FUTEX);
        p->eventfd = w->eventfd;
        return 0;
    }
    atomic_init(&p->gen, r == x->rank ? x->gen : gen);
    if (r == x->rank) {
        atomic_init(&p->kind, x->waiter.kind);
        p->eventfd = x->waiter.eventfd;
        return 0;
    }
    uint32_t kind = w->doorbell_kind;
    atomic_init(&p->kind, kind);
    p->eventfd = w->eventfd;
    if (kind == SR_DOORBELL_FUTEX || (kind == SR_DOORBELL_EVENTFD && is_eventfd(p->eventfd)))
        return 0;
    return sr__fail(-EPROTO, "sr_init", "the worker table line of rank %d is corrupt: doorbell kind %u, eventfd %d",
                    r, kind, p->eventfd);
}

/* Which ranks attach to our segment: a private copy of the creator's flags,
 * taken once, so that the barrier's count, the peers resolved and the pidfds
 * watched agree even if a peer scribbles on the table later. */
static int local_ranks(sr_xport *x)
{
    x->peers = calloc((size_t)x->world, sizeof(*x->peers));
    if (!x->peers)
        return sr__fail(-ENOMEM, "sr_init", "no memory for %d peers", x->world);
    for (int r = 0; r < x->world; r++) {
        x->peers[r].local = sr__seg_attaches(&x->seg, r);
        x->nlocal += x->peers[r].local;
    }
    if (!x->peers[x->rank].local)
        return sr__fail(-EINVAL, "sr_init", "rank %d does not attach to segment '%.48s' (made for %d of %d ranks)",
                        x->rank, x->seg.name, x->nlocal, x->world);
    return 0;
}

static int resolve_peers(sr_xport *x)
{
    for (int r = 0; r < x->world; r++) {
        int rc = resolve_peer(x, r);
        if (rc)
            return rc;
        /* Under shmrun or sr_spawn the supervisor publishes every exit and
         * wakes whoever it concerns (segment.h, "Peer exit"): a pidfd per
         * peer would only wake us first, at the cost of N pidfds, N polls
         * and N wake-ups per exit in every worker. Only without one (mpirun)
         * do we watch the local peers, to publish their exits (orphan.c). */
        if (!x->publish_exits || r == x->rank || !x->peers[r].local)
            continue;
        /* relaxed: written before the peer's release increment that our barrier acquired */
        rc = sr__waiter_watch_peer(&x->waiter, x->world, r, sr__seg_worker(&x->seg, r)->pid);
        if (rc)
            return rc;
    }
    return 0;
}

/* Take the consumer's private view of our inbox (ring.h), checked against
 * the segment's layout. */
static int attach_inbox(sr_xport *x)
{
    char why[160];
    x->inbox = &x->inbox_view;
    struct sr_ring *r = sr__seg_inbox(&x->seg, x->rank);
    /* A replacement's predecessor died without writing its position back.
     * What it left unread is delivered: the stamps refuse it above, and the
     * refusal lets go of what it carries (discarded here, it would leak). */
    int rc = x->gen ? sr__ring_cons_recover(x->inbox, r, x->seg.ring_slots, SR_RING_RECOVER_DELIVER, why, sizeof(why))
                    : sr__ring_cons_attach(x->inbox, r, x->seg.ring_slots, why, sizeof(why));
    if (rc)
        return sr__fail(-EPROTO, "sr_init", "the inbox ring of rank %d is corrupt: %s", x->rank, why);
    return 0;
}

static int publish_self(sr_xport *x, const sr_xport_opts *o)
{
    x->me = sr__seg_worker(&x->seg, x->rank);
    int rc = attach_inbox(x);
    if (rc)
        return rc;
    int efd = x->me->eventfd; /* written by the creator; read once, here */
    if (efd != -1 && !is_eventfd(efd))
        return sr__fail(-EPROTO, "sr_init", "the worker table line of rank %d is corrupt: eventfd %d is not one",
                        x->rank, efd);
    /* A replacement keeps its rank's doorbell kind: peers resolved it once
     * (relaxed: its predecessor's, ordered by the supervisor's fork). */
    uint32_t kind = x->gen ? x->me->doorbell_kind : o->doorbell;
    rc = sr__waiter_init(&x->waiter, &x->me->doorbell, efd, kind);
    if (rc)
        return rc;
    x->me->pid = getpid();
    if (o->name)
        snprintf(x->me->name, sizeof(x->me->name), "%s", o->name);
    else
        snprintf(x->me->name, sizeof(x->me->name), "worker%d", x->rank);
    x->me->doorbell_kind = x->waiter.kind;
    /* release: pairs with missing_ranks()' acquire; the barrier increment publishes the rest */
    atomic_store_explicit(&x->me->state, SR_WORKER_ATTACHED, memory_order_release);
    return 0;
}

/* A joiner of an elastic job checks its name against the workers present
 * before it publishes itself, so that no peer ever sees two of them with one
 * name (two joiners racing with the same name are caught by sr_init's check
 * of the names it collects). */
static int name_free(sr_xport *x, const sr_xport_opts *o)
{
    char want[SR_NAME_MAX];
    if (o->name)
        snprintf(want, sizeof(want), "%s", o->name);
    else
        snprintf(want, sizeof(want), "worker%d", x->rank);
    for (int r = 0; r < x->world; r++) {
        struct sr_worker_info *w = sr__seg_worker(&x->seg, r);
        /* acquire: pairs with the peer's release store of ATTACHED, after its name */
        uint32_t st = atomic_load_explicit(&w->state, memory_order_acquire);
        /* seq_cst: pairs with X1 */
        if (r == x->rank || !sr__worker_state_attached(st) || atomic_load_explicit(&w->exited, memory_order_seq_cst) ||
            strncmp(w->name, want, sizeof(want)))
            continue;
        return sr__fail(-EEXIST, "sr_init", "Worker name '%s' of rank %d is taken: rank %d, present in the job, has it",
                        want, x->rank, r);
    }
    return 0;
}

/* Our generation (segment.h, "Replacement in place"). A replacement must
 * keep its rank's name: its peers know the rank by it (their tables of
 * names are not written again). */
static int take_generation(sr_xport *x, const sr_xport_opts *o)
{
    struct sr_worker_info *w = sr__seg_worker(&x->seg, x->rank);
    x->elastic = (x->seg.flags & SR_SEG_F_ELASTIC) != 0; /* our copy of the creator's (segment.h) */
    x->replaces = x->elastic || (x->seg.flags & SR_SEG_F_REPLACE) != 0;
    /* acquire: pairs with the supervisor's R2 store (its fork of us orders it anyway) */
    x->gen = atomic_load_explicit(&w->generation, memory_order_acquire);
    if (!x->gen)
        return 0;
    if (!x->replaces)
        return sr__fail(-EPROTO, "sr_init", "rank %d has generation %u in segment '%.48s', whose job replaces no rank",
                        x->rank, x->gen, x->seg.name);
    if (x->elastic) /* a worker that joins a free rank names itself (E4), one no worker present has */
        return name_free(x, o);
    char had[SR_NAME_MAX], want[SR_NAME_MAX];
    memcpy(had, w->name, sizeof(had)); /* the predecessor's, written at its attach */
    had[sizeof(had) - 1] = '\0';
    if (o->name)
        snprintf(want, sizeof(want), "%s", o->name);
    else
        snprintf(want, sizeof(want), "worker%d", x->rank);
    if (strcmp(had, want))
        return sr__fail(-EINVAL, "sr_init", "rank %d is a replacement (generation %u) and must keep its name '%s', not '%s'",
                        x->rank, x->gen, had, want);
    return 0;
}

/* R3 of a replacement: tell every worker that we are here. The increment
 * of header.exits makes their next scan find our generation (they re-check
 * it after announcing a sleep), the doorbells wake the sleepers. */
static void announce_return(sr_xport *x)
{
    /* seq_cst: as X2, after our release store of ATTACHED */
    atomic_fetch_add_explicit(&x->seg.hdr->exits, 1, memory_order_seq_cst);
    for (int r = 0; r < x->world; r++)
        if (r != x->rank && x->peers[r].local)
            sr__doorbell_ring(x->peers[r].doorbell, sr__xport_peer_kind(&x->peers[r]), x->peers[r].eventfd);
}

/* E3 (segment.h, "Elastic jobs"): we detached; every peer takes us as gone
 * from its next scan, before the supervisor reaps our process. */
static uint64_t left_ino; /* the segment this process left (E3): it may not attach to it again */

static void announce_departure(sr_xport *x)
{
    left_ino = x->seg.ino;
    /* seq_cst: as X2, after our store of the state */
    atomic_fetch_add_explicit(&x->seg.hdr->exits, 1, memory_order_seq_cst);
    for (int r = 0; r < x->world; r++)
        if (r != x->rank && x->peers[r].local && x->peers[r].doorbell)
            sr__doorbell_ring(x->peers[r].doorbell, x->peers[r].kind, x->peers[r].eventfd);
}

int sr__xport_rejoin(sr_xport *x, int rank)
{
    struct sr_worker_info *w = sr__seg_worker(&x->seg, rank);
    struct sr_peer *p = &x->peers[rank];
    /* acquire (both): pair with the supervisor's R2 stores and the new
     * process's release store of ATTACHED (its line before it) */
    uint32_t gen = atomic_load_explicit(&w->generation, memory_order_acquire);
    uint32_t st = atomic_load_explicit(&w->state, memory_order_acquire);
    if (!p->local || !sr__worker_state_attached(st) || atomic_load_explicit(&w->exited, memory_order_seq_cst) ||
        atomic_load_explicit(&w->generation, memory_order_seq_cst) != gen)
        return -EAGAIN;
    uint32_t kind = w->doorbell_kind;
    if (kind != SR_DOORBELL_FUTEX && kind != SR_DOORBELL_EVENTFD)
        return sr__fail(-EPROTO, "sr_init", "the worker table line of rank %d (generation %u) is corrupt: doorbell kind %u",
                        rank, gen, kind);
    /* Its own line's: unchanged unless we never knew it (resolve_peer).
     * Sending threads ring with it meanwhile, so it is an atomic (relaxed:
     * a word whole in itself), and the release store of the generation
     * publishes it to a sender that stamps that generation (enqueue_to's
     * acquire load): it rings the doorbell the new process sleeps on. */
    atomic_store_explicit(&p->kind, kind, memory_order_relaxed);
    /* Written before its release store of ATTACHED, acquired above; a
     * joiner of an elastic job may have a name of its own (E4). Only this
     * thread writes it, while the rank is gone (no sender reads it). */
    memcpy(p->name, w->name, sizeof(p->name));
    p->name[sizeof(p->name) - 1] = '\0';
    /* release: pairs with enqueue_to's acquire load; peer_gone's relaxed
     * one only compares it with the line's (which it loads seq_cst) */
    atomic_store_explicit(&p->gen, gen, memory_order_release);
    return 0;
}

/* The eventfds of the local ranks are exactly the fds lo..hi, each once:
 * no other descriptor lies among them (the launcher makes them in a row). */
static bool eventfds_in_a_row(const sr_xport *x, int *lo, int *hi)
{
    int n = 0;
    *lo = INT_MAX, *hi = -1;
    for (int r = 0; r < x->world; r++) {
        int fd = x->peers[r].eventfd;
        if (fd >= 0)
            n++, *lo = fd < *lo ? fd : *lo, *hi = fd > *hi ? fd : *hi;
    }
    if (!n || *hi - *lo + 1 != n)
        return false;
    bool *seen = calloc((size_t)n, sizeof(*seen)), row = seen != NULL;
    for (int r = 0; row && r < x->world; r++) {
        int fd = x->peers[r].eventfd;
        if (fd >= 0)
            row = !seen[fd - *lo], seen[fd - *lo] = true;
    }
    free(seen);
    return row;
}

/* shmrun passes the segment and the doorbell eventfds across one exec, the
 * worker's own: a program the worker execs in turn (a command, a helper)
 * must not hold the segment, which would outlive the job in it
 * (docs/LAUNCHER.md). They stay open here, for a later attach. One
 * close_range for the eventfds when they lie in a row, as the launchers
 * make them: not one fcntl per rank in every worker (kernels before 5.11
 * refuse the flag: then one by one). */
static void inherited_once(sr_xport *x)
{
    fcntl(x->seg.fd, F_SETFD, FD_CLOEXEC);
    int lo, hi;
    if (eventfds_in_a_row(x, &lo, &hi) && close_range((unsigned)lo, (unsigned)hi, CLOSE_RANGE_CLOEXEC) == 0)
        return;
    for (int r = 0; r < x->world; r++)
        if (x->peers[r].eventfd >= 0)
            fcntl(x->peers[r].eventfd, F_SETFD, FD_CLOEXEC);
}

int sr__xport_attach(const sr_xport_opts *o, sr_xport **out)
{
    static const sr_xport_opts defaults;
    struct sr_launch_env env;
    if (!o)
        o = &defaults;
    if (o->name && strnlen(o->name, SR_NAME_MAX) >= SR_NAME_MAX) /* refused, never truncated */
        return sr__fail(-EINVAL, "sr__xport_attach", "worker name must be shorter than %d characters, got %zu",
                        SR_NAME_MAX, strlen(o->name));
    int rc = sr__launch_env_get(&env);
    if (rc)
        return rc;
    sr_xport *x = aligned_alloc(SR_CACHELINE, sizeof(*x)); /* sizeof is a multiple of the alignment */
    if (x)
        memset(x, 0, sizeof(*x));
    if (!x)
        return sr__fail(-ENOMEM, "sr_init", "no memory for the transport");
    x->seg.fd = x->loadavg_fd = -1; /* until attached / opened: a failed attach must not close fd 0 */
    x->rank = env.rank;
    x->world = env.world_size;
    x->publish_exits = o->publish_exits;
    sr__error_set_rank(env.rank);
    sr__log_set_worker(o->name, env.rank);
    rc = sr__segment_attach(env.fd, &x->seg);
    if (!rc && x->seg.world != (uint32_t)env.world_size)
        rc = sr__fail(-EINVAL, "sr_init", "SHMRPC_WORLD_SIZE is %d but the segment was made for %u workers",
                      env.world_size, x->seg.world);
    if (!rc && (x->seg.flags & SR_SEG_F_ELASTIC) && left_ino == x->seg.ino)
        rc = sr__fail(-EPIPE, "sr_init", "rank %d left the elastic job of segment '%.48s': its rank may go to another "
                      "worker, so this process cannot attach again (a new one joins: shmrun --join)",
                      env.rank, x->seg.name);
    if (!rc)
        rc = spin_policy(x, o);
    if (!rc)
        rc = local_ranks(x);
    if (!rc)
        rc = take_generation(x, o);
    if (!rc)
        rc = publish_self(x, o);
    if (!rc && !x->gen) /* a replacement's peers are past the barrier */
        rc = start_barrier(x, o->start_timeout_ns > 0 ? o->start_timeout_ns : START_TIMEOUT_NS);
    if (!rc)
        rc = resolve_peers(x);
    if (!rc) /* a replacement takes a fresh area: survivors may hold blocks of its predecessor's */
        rc = x->gen ? sr__heap_attach_gen(&x->seg, x->rank, x->gen + 1) : sr__heap_attach(&x->seg, x->rank);
    if (!rc && x->gen)
        announce_return(x);
    if (rc) {
        sr__xport_detach(x);
        return rc;
    }
    inherited_once(x);
    sr__crash_install(x->me); /* from now on a fatal signal names the call it interrupted */
    if (x->nlocal == x->world)
        sr_logf(SR_LOG_INFO, "attached to segment '%s' (%d workers, pid %d)", x->seg.name, x->world,
                (int)getpid());
    else
        sr_logf(SR_LOG_INFO, "attached to segment '%s' (%d of %d workers, pid %d)", x->seg.name, x->nlocal,
                x->world, (int)getpid());
    *out = x;
    return 0;
}

void sr__xport_detach(sr_xport *x)
{
    if (!x)
        return;
    sr__crash_uninstall(); /* before the segment is unmapped: the handler writes into it */
    if (x->me)
        sr_logf(SR_LOG_INFO, "detaching (%s)",
                x->graceful    ? (x->leaving ? "after leaving the job" : "after a graceful shutdown")
                : x->timed_out ? "after a graceful shutdown timed out"
                               : "without a graceful shutdown");
    sr__heap_detach(); /* before the segment is unmapped: the arena's extents live there */
    if (x->me) {
        uint32_t st = x->graceful ? (x->leaving ? SR_WORKER_LEFT_JOB : SR_WORKER_DETACHED)
                      : x->timed_out ? SR_WORKER_TIMED_OUT : SR_WORKER_LEFT;
        /* release: our last sends are complete before peers see DETACHED */
        atomic_store_explicit(&x->me->state, st, memory_order_release);
        if (x->elastic && x->peers)
            announce_departure(x);
        sr__waiter_fini(&x->waiter);
    }
    if (x->inbox)
        sr__ring_cons_detach(x->inbox); /* our position, for the next attach */
    sr__segment_detach(&x->seg, false); /* the launch fd stays: the worker may attach again */
    if (x->loadavg_fd >= 0)
        close(x->loadavg_fd);
    free(x->peers);
    free(x);
    sr__log_set_worker(NULL, -1); /* lines from now on name the process, not the worker */
}

int sr__xport_check_peers(sr_xport *x)
{
    for (int r = 0; r < x->world; r++) {
        /* dead: its pidfd fired (mpirun), or its exit is published (a
         * supervisor's, X1; seq_cst inside). acquire: pairs with the peer's
         * release store of DETACHED/LEFT in sr__xport_detach */
        if (r != x->rank && x->peers[r].local && (sr__xport_peer_dead(x, r) || sr__xport_peer_gone(x, r)) &&
            sr__worker_state_attached(atomic_load_explicit(&sr__seg_worker(&x->seg, r)->state, memory_order_acquire)))
            return sr__fail(-EPIPE, "sr__xport_check_peers", "rank %d (pid %d) died without detaching", r,
                            sr__seg_worker(&x->seg, r)->pid);
    }
    return 0;
}

/* The destination's inbox holds values no legal history produces (ring.h,
 * Validation): name whose inbox it is, and what was read. */
static int corrupt_inbox(sr_xport *x, int to, const char *fn)
{
    struct sr_ring *r = x->peers[to].inbox;
    uint32_t mask = x->seg.ring_slots - 1;
    /* relaxed: for the report only */
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint32_t seq = atomic_load_explicit(&r->slots[tail & mask].seq, memory_order_relaxed); /* relaxed: as above */
    return sr__fail(-EPROTO, fn, "the inbox ring of %s (rank %d) is corrupt: slot %u holds sequence %u at tail %u (%u slots)",
                    x->peers[to].name, to, tail & mask, seq, tail, x->seg.ring_slots);
}

const char *sr__xport_gone_text(const sr_xport *x, int rank, char *buf, size_t len)
{
    const struct sr_worker_info *w = sr__seg_worker(&x->seg, rank);
    char how[128], dflt[24];
    sr__seg_exit_text(w, how, sizeof(how));
    snprintf(dflt, sizeof(dflt), "worker%d", rank);
    char gen[32] = "";
    /* relaxed: our own view: the generation that died (UINT32_MAX: none known, a free rank) */
    if (x->replaces && atomic_load_explicit(&x->peers[rank].gen, memory_order_relaxed) != UINT32_MAX)
        snprintf(gen, sizeof(gen), "generation %u", atomic_load_explicit(&x->peers[rank].gen, memory_order_relaxed));
    /* the name was written before the peer's start-barrier increment, read after ours */
    if (!w->name[0] || !strncmp(w->name, dflt, sizeof(w->name)))
        snprintf(buf, len, "worker%d%s%s%s %s", rank, *gen ? " (" : "", gen, *gen ? ")" : "", how);
    else
        snprintf(buf, len, "'%.*s' (rank %d%s%s) %s", SR_NAME_MAX, w->name, rank, *gen ? ", " : "", gen, how);
    return buf;
}

void sr__xport_closing(sr_xport *x)
{
    if (x->elastic) { /* E2: seq_cst, before the leaver reads its peers' counts */
        x->leaving = true;
        atomic_store_explicit(&x->me->state, SR_WORKER_LEAVING, memory_order_seq_cst);
        return;
    }
    /* release: as the store of ATTACHED (the supervisor's acquire reads it) */
    atomic_store_explicit(&x->me->state, SR_WORKER_CLOSING, memory_order_release);
}

bool sr__xport_peer_left_gracefully(const sr_xport *x, int rank)
{
    /* relaxed: read after the peer's exit was seen (X1 orders its last store) */
    return atomic_load_explicit(&sr__seg_worker(&x->seg, rank)->state, memory_order_relaxed) == SR_WORKER_DETACHED;
}

bool sr__xport_peer_left_timed_out(const sr_xport *x, int rank)
{
    /* relaxed: read after the peer's exit was seen (X1 orders its last store) */
    return atomic_load_explicit(&sr__seg_worker(&x->seg, rank)->state, memory_order_relaxed) == SR_WORKER_TIMED_OUT;
}

static int __attribute__((noinline, cold)) gone_error(sr_xport *x, int to)
{
    char text[256];
    return sr__fail(-EPIPE, "sr_xport_send", "destination rank %d is gone: %s", to,
                    sr__xport_gone_text(x, to, text, sizeof(text)));
}

/* A rank of another host: the MPI transport's, never the rings'. */
static int __attribute__((noinline, cold)) not_local_error(sr_xport *x, int to, const char *fn)
{
    return sr__fail(-EINVAL, fn, "destination rank %d does not attach to segment '%.48s' (another host's rank)", to,
                    x->seg.name);
}

/* A ring owed to p by quiet sends (R1), taken: true once per owed ring.
 * The relaxed load keeps the exchange off sends that owe nothing. acquire:
 * pairs with the quiet send's release store, after its publish. */
static inline bool owed_taken(struct sr_peer *p)
{
    return atomic_load_explicit(&p->owed, memory_order_relaxed) &&
           atomic_exchange_explicit(&p->owed, false, memory_order_acquire);
}

/* How a send wakes its consumer: RING (as it publishes), QUIET (it does
 * not: the thread rings later, R1) or LAZY (no ring follows: it rings only
 * when a message behind it may be waiting on it, R2). */
enum send_mode { SEND_RING, SEND_QUIET, SEND_LAZY };

static int enqueue_to(sr_xport *x, int to, sr_msg *m, enum send_mode mode)
{
    if (sr_unlikely((unsigned)to >= (unsigned)x->world))
        return sr__fail(-EINVAL, "sr_xport_send", "destination rank %d is out of range [0, %d)", to, x->world);
    if (sr_unlikely(sr__xport_peer_gone(x, to)))
        return gone_error(x, to);
    struct sr_peer *p = &x->peers[to];
    if (sr_unlikely(!p->inbox))
        return not_local_error(x, to, "sr_xport_send");
    m->src = (uint16_t)x->rank;
    /* acquire: pairs with sr__xport_rejoin's release store: the doorbell
     * kind rung below is at least the one taken with this generation */
    m->gens = (uint8_t)((x->gen & 0xfu) | (atomic_load_explicit(&p->gen, memory_order_acquire) & 0xfu) << 4);
    uint32_t pos;
    int rc = sr__ring_enqueue_at(p->inbox, x->seg.ring_slots, (uint32_t)x->rank, m, &pos);
    if (sr_unlikely(rc < 0)) {
        if (rc == -EPROTO) {
            /* Its consumer may be asleep with nothing ready, waiting for an
             * answer that can no longer arrive: wake it, so it finds the
             * corruption itself (sr__ring_cons_pending) and fails what waits on
             * its inbox. Only a corrupt head slot is seen that way (ring.h). */
            sr__doorbell_ring(p->doorbell, sr__xport_peer_kind(p), p->eventfd);
            return corrupt_inbox(x, to, "sr_xport_send");
        }
        atomic_fetch_add_explicit(&x->st.full, 1, memory_order_relaxed); /* relaxed: statistics */
        return -EAGAIN;
    }
    /* rc 1: the consumer watched the free slot (doorbell.h): it may sleep.
     * Else it may sleep on a claimed head: the claim watch (D3'). A loud
     * send also pays what quiet ones before it owe (R1: it is their ring). */
    bool ring;
    if (mode == SEND_QUIET) {
        if (rc == 1) /* release: pairs with owed_taken's acquire exchange */
            atomic_store_explicit(&p->owed, true, memory_order_release);
        ring = false;
    } else if (mode == SEND_LAZY) {
        ring = rc == 1 ? !sr__ring_watch_next(p->inbox, x->seg.ring_slots, pos) : sr__ring_claim_watched(p->inbox);
    } else {
        ring = rc == 1 || owed_taken(p) || sr__ring_claim_watched(p->inbox);
    }
    /* relaxed: statistics; one add either way (sr_xport_stats) */
    atomic_fetch_add_explicit(ring ? &x->st.sent : &x->st.quiet, 1, memory_order_relaxed);
    if (ring && sr__doorbell_ring(p->doorbell, sr__xport_peer_kind(p), p->eventfd))
        atomic_fetch_add_explicit(&x->st.wakes, 1, memory_order_relaxed); /* relaxed: statistics */
    return 0;
}

int sr_xport_send(sr_xport *x, int to, sr_msg *m) { return enqueue_to(x, to, m, SEND_RING); }
int sr__xport_send_quiet(sr_xport *x, int to, sr_msg *m) { return enqueue_to(x, to, m, SEND_QUIET); }
int sr__xport_send_lazy(sr_xport *x, int to, sr_msg *m) { return enqueue_to(x, to, m, SEND_LAZY); }

/* R1 (doorbell.h): the D3 fence inside sr__doorbell_ring orders every
 * message this thread published to `to` before it, quietly or not, before
 * the doorbell load; a consumer that announced its sleep after reading
 * some of them is woken for the rest. */
int sr__xport_ring_peer(sr_xport *x, int to)
{
    if (sr_unlikely((unsigned)to >= (unsigned)x->world))
        return sr__fail(-EINVAL, "sr__xport_ring_peer", "destination rank %d is out of range [0, %d)", to, x->world);
    struct sr_peer *p = &x->peers[to];
    if (sr_unlikely(!p->inbox))
        return not_local_error(x, to, "sr__xport_ring_peer");
    if (!owed_taken(p) && !sr__ring_claim_watched(p->inbox))
        return 0; /* no slot of ours was watched: its consumer polls, or will see them before it sleeps */
    atomic_fetch_add_explicit(&x->st.peer_rings, 1, memory_order_relaxed); /* relaxed: statistics */
    if (sr__doorbell_ring(p->doorbell, sr__xport_peer_kind(p), p->eventfd))
        atomic_fetch_add_explicit(&x->st.wakes, 1, memory_order_relaxed); /* relaxed: statistics */
    return 0;
}

int sr__xport_probe(sr_xport *x, int to)
{
    if ((unsigned)to >= (unsigned)x->world)
        return sr__fail(-EINVAL, "sr__xport_probe", "destination rank %d is out of range [0, %d)", to, x->world);
    if (!x->peers[to].inbox)
        return not_local_error(x, to, "sr__xport_probe");
    int rc = sr__ring_probe(x->peers[to].inbox, x->seg.ring_slots);
    return rc == -EPROTO ? corrupt_inbox(x, to, "sr__xport_probe") : rc;
}

void sr__xport_space_arm(sr_xport *x, int to)
{
    if (!sr__xport_local(x, to)) /* nothing to wait for: its sends fail with -EINVAL */
        return;
    sr__ring_space_arm(x->peers[to].inbox, (uint32_t)x->rank, false);
}

int sr__xport_send_wait(sr_xport *x, int to, sr_msg *m, int64_t deadline_ns)
{
    for (;;) {
        int rc = sr_xport_send(x, to, m);
        if (rc != -EAGAIN)
            return rc;
        struct sr_ring *r = x->peers[to].inbox;
        sr__ring_space_arm(r, (uint32_t)x->rank, true); /* W1 (ring.h) */
        if ((rc = sr_xport_send(x, to, m)) != -EAGAIN)
            return rc;
        int64_t left = deadline_ns < 0 ? SLICE_NS : deadline_ns - sr__now_ns();
        if (left <= 0)
            return sr__fail(-ETIMEDOUT, "sr__xport_send_wait", "the inbox of %s (rank %d) stayed full (%u slots)",
                            x->peers[to].name, to, x->seg.ring_slots);
        /* relaxed: the futex compares it again; any change (the consumer's exchange) ends the wait */
        uint32_t v = atomic_load_explicit(&r->space_wait, memory_order_relaxed);
        if (v & SR_SPACE_FUTEX)
            futex_wait_ns(&r->space_wait, v, left < SLICE_NS ? left : SLICE_NS);
    }
}

/* Count on a statistic that only the inbox's consumer writes (one thread at
 * a time; a hand-over of the inbox orders the next one after it). A plain
 * load and store, not a locked add: this runs on the way to every reply. */
static inline void consumer_count(_Atomic uint64_t *c, uint64_t n)
{
    /* relaxed: a single writer; readers only want a recent value */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n, memory_order_relaxed);
}

/* Wake the workers whose bits the consumer took from our inbox's
 * space_ranks: set each one's space_kick, then ring its doorbell (whose D3
 * fence orders the kick before the doorbell load, against the sleeper's D2
 * fence and its check of space_kick). A bit for a rank outside the job is a
 * foreign write: ignored. */
static void kick_space_waiters(sr_xport *x)
{
    uint32_t words = ((uint32_t)x->world + 63) / 64;
    for (uint32_t w = 0; w < words; w++) {
        uint64_t bits = sr__ring_space_ranks(x->inbox->ring, w);
        while (bits) {
            int rank = (int)(w * 64 + (uint32_t)__builtin_ctzll(bits));
            bits &= bits - 1;
            if (rank >= x->world)
                break;
            struct sr_peer *p = &x->peers[rank];
            if (!p->local) /* only a local rank can have armed it: a foreign write */
                continue;
            /* release: pairs with the sender's acquire exchange in sr__xport_space_take; our freed slots are visible */
            atomic_store_explicit(&sr__seg_worker(&x->seg, rank)->space_kick, 1, memory_order_release);
            if (sr__doorbell_ring(p->doorbell, sr__xport_peer_kind(p), p->eventfd))
                atomic_fetch_add_explicit(&x->st.wakes, 1, memory_order_relaxed); /* relaxed: statistics */
        }
    }
}

/* Free the slots handed out by the previous recv_burst (see ring.h: freeing
 * them here, not as they are read, keeps that write off the critical path of
 * a reply), and wake the producers that found the inbox full (W2). */
static void release_inbox(sr_xport *x)
{
    if (!sr__ring_release(x->inbox))
        return;
    uint32_t w = sr__ring_space_take(x->inbox->ring);
    if (sr_likely(!w))
        return;
    if (w & SR_SPACE_FUTEX)
        sr__futex_wake_all(&x->inbox->ring->space_wait);
    if (w & SR_SPACE_RANKS)
        kick_space_waiters(x);
}

const char *sr__xport_inbox_text(sr_xport *x, char *buf, size_t len)
{
    uint32_t pos, seq;
    if (!sr__ring_cons_error(x->inbox, &pos, &seq))
        snprintf(buf, len, "the inbox ring of %s (rank %d) is not corrupt", x->peers[x->rank].name, x->rank);
    else
        snprintf(buf, len,
                 "the inbox ring of %s (rank %d) is corrupt: position %u (slot %u) holds sequence %u, "
                 "neither free nor published; nothing past it can be read",
                 x->peers[x->rank].name, x->rank, pos, pos & x->inbox->mask, seq);
    return buf;
}

int sr__xport_inbox_error(sr_xport *x)
{
    if (!sr__xport_inbox_bad(x))
        return 0;
    char text[320];
    return sr__fail(-EPROTO, "sr__xport_recv_burst", "%s", sr__xport_inbox_text(x, text, sizeof(text)));
}

/* The consumer just latched a corrupt inbox: say so once, naming us (the
 * callers of recv_burst see an empty inbox; sr__xport_wait fails). */
static void report_corrupt_inbox(sr_xport *x)
{
    if (x->inbox_reported)
        return;
    x->inbox_reported = true;
    sr__xport_inbox_error(x);
    sr__log_text(SR_LOG_ERROR, sr_last_error());
}

unsigned sr__xport_recv_burst(sr_xport *x, sr_msg *out, unsigned n)
{
    release_inbox(x);
    unsigned got = sr__ring_read_burst(x->inbox, out, n);
    if (got)
        consumer_count(&x->st.received, got);
    else if (sr_unlikely(sr__xport_inbox_bad(x)))
        report_corrupt_inbox(x);
    return got;
}

/* After the doorbell announcement: a message, or a corrupt head not yet
 * latched (the wake of a producer that found it, xport.h). */
static bool inbox_ready(void *arg) { return sr__ring_cons_pending(arg); }

/* Spin on the inbox for up to budget_ns, giving way to a thread queued on
 * this core (spin.h); true if a message arrived. */
static bool spin(sr_xport *x, int64_t budget_ns)
{
    int64_t now = sr__now_ns(), until = now + budget_ns, give = now + SR_SPIN_YIELD_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (sr__ring_ready(x->inbox))
                return true;
            sr__cpu_relax();
        }
        if ((now = sr__now_ns()) >= until)
            return false;
        give = sr__spin_give_way(now, give);
    }
}

/* The machine's runnable threads now (the fourth field of /proc/loadavg,
 * "running/total"), or INT_MAX if it cannot be read. */
static int runnable_threads(int fd)
{
    char buf[128];
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;
    if (n <= 0)
        return INT_MAX;
    buf[n] = 0;
    int running;
    return sscanf(buf, "%*s %*s %*s %d/", &running) == 1 ? running : INT_MAX;
}

#define GATE_OVER 1u  /* sr__spin_gate_next: the state, oversubscribed */
#define GATE_KNOWN 2u /* a sample has been taken */
#define GATE_STREAK 4u /* one more sample in a row that disagreed with the state */

uint32_t sr__spin_gate_next(uint32_t gate, int runnable, int ncpu)
{
    uint32_t says = runnable > ncpu ? GATE_OVER : 0;
    if (!(gate & GATE_KNOWN) || says == (gate & GATE_OVER))
        return GATE_KNOWN | says; /* the first sample, or one that agrees: no streak */
    uint32_t streak = gate / GATE_STREAK + 1;
    return streak >= SR_SPIN_GATE_SAMPLES ? GATE_KNOWN | says : streak * GATE_STREAK | GATE_KNOWN | (gate & GATE_OVER);
}

/* Never spin when more threads are runnable than we have cores: spinning
 * then takes the core of the thread we wait for. The count is sampled at
 * most once per LOAD_SAMPLE_NS per worker, from the kernel's own count of
 * runnable threads (those of other jobs included), so no counter is written
 * on a sleep or a wake, and no line is shared between workers. The count is
 * of one instant: sr__spin_gate_next debounces it (xport.h). */
int64_t sr__xport_spin_budget(sr_xport *x)
{
    if (x->fixed_spin)
        return atomic_load_explicit(&x->spin_ns, memory_order_relaxed); /* never written after attach */
    int64_t now = sr__now_coarse_ns();
    /* relaxed (load and CAS): a heuristic; the CAS elects one sampling
     * thread per period, so each period feeds the gate once */
    int64_t next = atomic_load_explicit(&x->load_next, memory_order_relaxed);
    if (now >= next && atomic_compare_exchange_strong_explicit(&x->load_next, &next, now + LOAD_SAMPLE_NS,
                                                               memory_order_relaxed, memory_order_relaxed)) {
        /* relaxed (both): written only by the elected sampler, read by any spinning thread below */
        uint32_t gate = atomic_load_explicit(&x->spin_gate, memory_order_relaxed);
        gate = sr__spin_gate_next(gate, runnable_threads(x->loadavg_fd), x->ncpu);
        atomic_store_explicit(&x->spin_gate, gate, memory_order_relaxed);
    }
    /* relaxed (both): as above; the budget is adapt()'s latest value */
    return sr__spin_gate_oversubscribed(atomic_load_explicit(&x->spin_gate, memory_order_relaxed))
               ? 0
               : atomic_load_explicit(&x->spin_ns, memory_order_relaxed);
}

/* Oversubscribed, a waiter that sleeps pays a sleep and a wake-up per
 * message (10-20 us on a VM, more than the calls it waits for), and the
 * thread it waits for is often queued on its own core (spin.h). Polling by
 * sched_yield instead gives that core to whoever is queued there at once,
 * for about one budget; past it, or past a yield that another job's slice
 * made that long, it sleeps. Fixed budgets (SHMRPC_SPIN_NS, tests) keep
 * their exact meaning: no yield polling. */
#define YIELD_POLL_NS 30000
int64_t sr__xport_yield_budget(sr_xport *x)
{
    /* relaxed: as in sr__xport_spin_budget, whose sample this reads */
    return !x->fixed_spin && sr__spin_gate_oversubscribed(atomic_load_explicit(&x->spin_gate, memory_order_relaxed))
               ? YIELD_POLL_NS
               : 0;
}

int64_t sr__spin_adapt_next(int64_t spin_ns, int64_t slept_ns, int64_t max_ns)
{
    if (slept_ns <= max_ns)
        spin_ns = slept_ns * 2 > spin_ns ? slept_ns * 2 : spin_ns;
    else
        spin_ns /= 2;
    return spin_ns > max_ns ? max_ns : spin_ns;
}

/* Adapt: a sleep that ended soon would have been cheaper as a spin
 * (sr__spin_adapt_next, xport.h). */
static void adapt(sr_xport *x, int64_t slept_ns)
{
    if (x->fixed_spin)
        return;
    /* relaxed (both): a heuristic read by any spinning thread; two sleepers
     * adapting at once only lose one step, and nothing is published with it */
    int64_t spin = atomic_load_explicit(&x->spin_ns, memory_order_relaxed);
    atomic_store_explicit(&x->spin_ns, sr__spin_adapt_next(spin, slept_ns, SPIN_MAX_NS), memory_order_relaxed);
}

int sr__xport_wait(sr_xport *x, int64_t deadline_ns)
{
    release_inbox(x); /* a producer waiting for space must not wait for our wait */
    sr__heap_drain(); /* blocks peers gave back; one relaxed load when none */
    if (sr__ring_ready(x->inbox))
        return SR_WAKE_DOORBELL;
    /* a corrupt slot is never ready: fail instead of sleeping on it */
    sr__ring_cons_check(x->inbox);
    if (sr_unlikely(sr__xport_inbox_error(x))) {
        report_corrupt_inbox(x);
        return -EPROTO;
    }
    int64_t budget = sr__xport_spin_budget(x);
    if (budget > 0 && spin(x, budget)) {
        consumer_count(&x->st.spin_hits, 1);
        return SR_WAKE_DOORBELL;
    }
    return sr__xport_sleep(x, deadline_ns, inbox_ready, x->inbox);
}

int64_t sr__xport_sleep_begin(const sr_xport *x)
{
    return x->fixed_spin ? 0 : sr__now_ns(); /* the clock only feeds the adaptive budget */
}

void sr__xport_sleep_end(sr_xport *x, int64_t t0)
{
    if (!x->fixed_spin)
        adapt(x, sr__now_ns() - t0);
}

int sr__xport_sleep(sr_xport *x, int64_t deadline_ns, bool (*ready)(void *), void *arg)
{
    release_inbox(x); /* never sleep holding slots a blocked producer waits for */
    if (!sr__ring_watch(x->inbox)) /* W1 (doorbell.h): a message at head is the ring's re-check */
        return SR_WAKE_DOORBELL;
    consumer_count(&x->st.sleeps, 1);
    int64_t t0 = sr__xport_sleep_begin(x);
    int ev = sr__waiter_sleep(&x->waiter, deadline_ns, ready, arg);
    sr__xport_sleep_end(x, t0);
    /* The sleeper polls again, or parked the inbox (ready() handed it over:
     * its next holder unwatches) */
    return ev;
}
