/* SPDX-License-Identifier: MIT */
/* The io_uring waiter. See waiter.h and the handshake in doorbell.h.
 *
 * Where the time of a wake-up goes, and what is done about it (measured
 * against a bare futex ping-pong between two processes, bench_ring):
 *   - The ring is created with IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN.
 *     A FUTEX_WAKE then only adds the completion to the sleeper's local list
 *     and wakes it where it waits in io_uring_enter, instead of queueing
 *     generic task work with a signal-style notification. Such a ring belongs
 *     to one thread, so it is created disabled and the first sleep enables it
 *     from the sleeping thread (and submits the peer and shutdown polls).
 *     Kernels without these flags get a plain ring; a sleep from a second
 *     thread (-EEXIST) rebuilds a plain ring and carries on.
 *   - The deadline is a standalone TIMEOUT request that stays armed across
 *     sleeps and is updated only when a sleep needs an earlier one. A timeout
 *     linked to every wait (or the wait's own timeout) arms and cancels an
 *     hrtimer per sleep, which cost 15-40% of a wake-up here.
 *   - The doorbell wait also stays armed when a sleep ends for another
 *     reason (a timer, a peer, shutdown): nothing to cancel, and no wake-up
 *     can be lost, because a producer that sees SLEEPING changes the word
 *     before its FUTEX_WAKE, and the wait is queued on the word as long as it
 *     is armed. A completion that arrives while we are awake is stale by the
 *     next sleep, whose ready() check decides instead.
 * With all three, an io_uring wake-up costs what a bare futex one does.
 */
#include "waiter.h"

#include <errno.h>
#include <stdatomic.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "doorbell.h"
#include "error.h"

/* The kernel's io_uring futex opcodes (6.7+); liburing 2.3 has no helpers. */
#define SR_IORING_OP_FUTEX_WAIT 51
#define SR_IORING_OP_FUTEX_WAKE 52
#define SR_FUTEX2_SIZE_U32 0x02u /* without FUTEX2_PRIVATE (0x80): the word is shared between processes */
#define SR_FUTEX_BITSET_MATCH_ANY 0xffffffffu

#define RING_ENTRIES 64
#define FAST_SETUP (IORING_SETUP_R_DISABLED | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN)

enum { TAG_WAIT = 1, TAG_TIMER = 2, TAG_PEER = 3, TAG_SHUTDOWN = 4, TAG_TIMER_UPDATE = 5, TAG_KICK = 6 };
#define UD(tag, v) (((uint64_t)(tag) << 32) | (uint32_t)(v))

int sr__doorbell_wake(_Atomic uint32_t *word, uint32_t kind, int eventfd)
{
    if (kind == SR_DOORBELL_EVENTFD) {
        uint64_t one = 1;
        return write(eventfd, &one, sizeof(one)) == sizeof(one);
    }
    /* All waiters but the stand-by, though there is one: the worker's armed
     * wait. Only while a ring rebuilt by the fallback is being torn down may
     * an old wait still be queued on the word, and waking one could pick
     * that one. A holder's futex_waitv matches any bit. */
    return syscall(SYS_futex, word, FUTEX_WAKE_BITSET, INT_MAX, NULL, NULL,
                   SR_DOORBELL_BIT_PROGRESS | SR_DOORBELL_BIT_USER) >= 0;
}

int sr__doorbell_wake_standby(_Atomic uint32_t *word)
{
    /* Shared futex; only the stand-by waits with this bit alone (a holder's futex_waitv matches any). */
    return syscall(SYS_futex, word, FUTEX_WAKE_BITSET, INT_MAX, NULL, NULL, SR_DOORBELL_BIT_STANDBY) >= 0;
}

int sr__doorbell_wake_user(_Atomic uint32_t *word)
{
    /* Shared futex; the progress thread's armed wait (BIT_PROGRESS) does not match. */
    return syscall(SYS_futex, word, FUTEX_WAKE_BITSET, INT_MAX, NULL, NULL, SR_DOORBELL_BIT_USER) >= 0;
}

/* Fill a FUTEX_WAIT SQE by hand: wait while *word == val, woken by wakes whose bitset meets mask. */
static void prep_futex_wait(struct io_uring_sqe *sqe, _Atomic uint32_t *word, uint32_t val, uint32_t mask)
{
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = SR_IORING_OP_FUTEX_WAIT;
    sqe->fd = SR_FUTEX2_SIZE_U32;
    sqe->addr = (uint64_t)(uintptr_t)word;
    sqe->addr2 = val;
    sqe->addr3 = mask;
}

/* The probe itself, on a ring of its own. */
static bool probe_futex_ops(void)
{
    struct io_uring r;
    if (io_uring_queue_init(2, &r, 0) < 0)
        return false;
    struct io_uring_probe *p = io_uring_get_probe_ring(&r);
    bool ok = p && io_uring_opcode_supported(p, SR_IORING_OP_FUTEX_WAIT) &&
              io_uring_opcode_supported(p, SR_IORING_OP_FUTEX_WAKE);
    if (p)
        io_uring_free_probe(p);
    if (ok) {
        /* A wait whose expected value does not match must fail with -EAGAIN. */
        static _Atomic uint32_t probe_word = 1;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&r);
        struct io_uring_cqe *cqe;
        if (sqe)
            prep_futex_wait(sqe, &probe_word, 0, SR_FUTEX_BITSET_MATCH_ANY);
        ok = sqe && io_uring_submit_and_wait(&r, 1) == 1 && io_uring_peek_cqe(&r, &cqe) == 0 &&
             cqe->res == -EAGAIN;
    }
    io_uring_queue_exit(&r);
    return ok;
}

static void *probe_main(void *out)
{
    *(bool *)out = probe_futex_ops();
    return NULL;
}

/* The probe runs on a thread of its own, which ends before we return. A
 * ring torn down after its creator has used it signals that thread later,
 * from the kernel's teardown work (task work, like a signal): on the
 * caller, that would be one stray wake-up of whatever it sleeps in next
 * (sr_init's thread is often the idle waiter soon after). An ended thread
 * has let go of the ring, so the teardown signals nobody. The answer is
 * the kernel's, so one probe per process serves every later one. */
bool sr__waiter_futex_supported(void)
{
    static _Atomic int known = -1; /* relaxed: every thread that probes finds the same answer */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k >= 0)
        return k;
    bool ok = false;
    pthread_attr_t attr;
    sigset_t all;
    pthread_t th;
    sigfillset(&all);
    pthread_attr_init(&attr); /* glibc: cannot fail */
    pthread_attr_setsigmask_np(&attr, &all); /* no process signal lands on the probe */
    if (pthread_create(&th, &attr, probe_main, &ok) == 0)
        pthread_join(th, NULL);
    else
        ok = probe_futex_ops(); /* no thread to spare: probe here, at the cost of that one wake-up */
    pthread_attr_destroy(&attr);
    atomic_store_explicit(&known, ok, memory_order_relaxed);
    return ok;
}

static struct io_uring_sqe *get_sqe(sr_waiter *w)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (!sqe && w->armed) { /* SQ full: push what is queued (only the sleeping thread, once enabled) */
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
    }
    return sqe;
}

static uint32_t choose_kind(uint32_t wanted, int eventfd)
{
    const char *env = getenv("SHMRPC_DOORBELL");
    if (!wanted && env && !strcmp(env, "eventfd"))
        wanted = SR_DOORBELL_EVENTFD;
    if (!wanted)
        wanted = sr__waiter_futex_supported() ? SR_DOORBELL_FUTEX : SR_DOORBELL_EVENTFD;
    if (wanted == SR_DOORBELL_EVENTFD && eventfd < 0)
        return 0;
    return wanted;
}

/* The fast ring if the kernel has it (5.19 / 6.1 flags), else a plain one. */
static int ring_create(sr_waiter *w, unsigned flags)
{
    int rc = io_uring_queue_init(RING_ENTRIES, &w->ring, flags);
    if (rc == -EINVAL && flags) {
        flags = 0;
        rc = io_uring_queue_init(RING_ENTRIES, &w->ring, 0);
    }
    if (rc < 0)
        return sr__fail(rc, "sr__waiter_init", "io_uring_queue_init: %s", strerror(-rc));
    w->setup_flags = flags;
    w->armed = w->wait_inflight = w->timer_armed = w->kick_inflight = false;
    return 0;
}

int sr__waiter_init(sr_waiter *w, _Atomic uint32_t *word, int efd, uint32_t kind_wanted)
{
    memset(w, 0, sizeof(*w));
    w->word = word;
    w->eventfd = efd;
    w->kind = choose_kind(kind_wanted, efd);
    if (!w->kind)
        return sr__fail(-EOPNOTSUPP, "sr__waiter_init", "no doorbell: io_uring futex unsupported and no eventfd given");
    w->shutdown_fd = eventfd(0, EFD_CLOEXEC);
    w->kick_fd = w->shutdown_fd < 0 ? -1 : eventfd(0, EFD_CLOEXEC);
    int rc = w->kick_fd < 0 ? sr__fail(-errno, "sr__waiter_init", "eventfd: %s", strerror(errno))
                            : ring_create(w, FAST_SETUP);
    if (rc) {
        if (w->shutdown_fd >= 0)
            close(w->shutdown_fd);
        if (w->kick_fd >= 0)
            close(w->kick_fd);
        w->shutdown_fd = w->kick_fd = -1;
    }
    return rc;
}

void sr__waiter_fini(sr_waiter *w)
{
    io_uring_queue_exit(&w->ring);
    if (w->shutdown_fd >= 0)
        close(w->shutdown_fd);
    if (w->kick_fd >= 0)
        close(w->kick_fd);
    for (int i = 0; w->pidfds && i < w->npeers; i++)
        if (w->pidfds[i] >= 0)
            close(w->pidfds[i]);
    free(w->pidfds);
    free(w->peer_dead);
    memset(w, 0, sizeof(*w));
    w->shutdown_fd = w->kick_fd = -1;
}

static int alloc_peers(sr_waiter *w, int n)
{
    w->pidfds = malloc((size_t)n * sizeof(int));
    w->peer_dead = calloc((size_t)n, sizeof(bool));
    if (!w->pidfds || !w->peer_dead)
        return sr__fail(-ENOMEM, "sr__waiter_watch_peer", "no memory for %d peers", n);
    for (int i = 0; i < n; i++)
        w->pidfds[i] = -1;
    w->npeers = n;
    return 0;
}

static void queue_poll(sr_waiter *w, int fd, uint64_t ud)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    if (!sqe)
        return; /* cannot happen once armed (get_sqe flushes); before, arm() queues it */
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data64(sqe, ud);
}

int sr__waiter_watch_peer(sr_waiter *w, int world_size, int rank, int pid)
{
    int rc;
    if (!w->pidfds && (rc = alloc_peers(w, world_size)))
        return rc;
    if (rank < 0 || rank >= w->npeers)
        return sr__fail(-EINVAL, "sr__waiter_watch_peer", "rank %d is out of range [0, %d)", rank, w->npeers);
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) {
        if (errno == ESRCH) { /* already gone */
            w->peer_dead[rank] = true;
            return 0;
        }
        return sr__fail(-errno, "sr__waiter_watch_peer", "pidfd_open(%d) for rank %d: %s", pid, rank, strerror(errno));
    }
    w->pidfds[rank] = fd;
    if (w->armed) /* else arm() polls it; either way the next sleep submits it */
        queue_poll(w, fd, UD(TAG_PEER, rank));
    return 0;
}

void sr__waiter_notify_shutdown(sr_waiter *w)
{
    uint64_t one = 1;
    if (write(w->shutdown_fd, &one, sizeof(one)) < 0)
        return; /* an eventfd write fails only on counter overflow: already notified */
}

void sr__waiter_kick(sr_waiter *w)
{
    uint64_t one = 1;
    if (write(w->kick_fd, &one, sizeof(one)) < 0)
        return; /* fails only on counter overflow: a kick is pending anyway */
}

/* First sleep, in the sleeping thread: enable the ring (binding it to this
 * thread) and queue the shutdown and peer polls, submitted with the first
 * wait. (The ring fd is not registered: a registration belongs to one
 * thread, and would turn a second thread's sleep into -EBADF.) */
static int arm(sr_waiter *w)
{
    if (w->setup_flags & IORING_SETUP_R_DISABLED) {
        /* liburing 2.3 declares io_uring_enable_rings but does not export it */
        int rc = io_uring_register((unsigned)w->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL, 0);
        if (rc < 0)
            return sr__fail(rc, "sr__waiter_sleep", "IORING_REGISTER_ENABLE_RINGS: %s", strerror(-rc));
    }
    w->armed = true;
    queue_poll(w, w->shutdown_fd, UD(TAG_SHUTDOWN, 0));
    for (int r = 0; r < w->npeers; r++)
        if (w->pidfds[r] >= 0 && !w->peer_dead[r])
            queue_poll(w, w->pidfds[r], UD(TAG_PEER, r));
    return 0;
}

/* A second thread slept on a single-issuer ring: replace it by a plain one.
 * Waits, timer and polls die with the old ring; arm() re-creates them. */
static int rebuild_plain(sr_waiter *w)
{
    io_uring_queue_exit(&w->ring);
    int rc = ring_create(w, 0);
    return rc ? rc : arm(w);
}

/* The kick READ stays armed like the doorbell wait; an eventfd keeps its
 * count until read, so a kick before the READ is queued is not lost. */
static int queue_kick(sr_waiter *w)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    if (!sqe)
        return sr__fail(-EBUSY, "sr__waiter_sleep", "no free submission entry for the kick read");
    io_uring_prep_read(sqe, w->kick_fd, &w->kick_buf, sizeof(w->kick_buf), 0);
    io_uring_sqe_set_data64(sqe, UD(TAG_KICK, 0));
    w->kick_inflight = true;
    return 0;
}

static int queue_wait(sr_waiter *w)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    if (!sqe)
        return sr__fail(-EBUSY, "sr__waiter_sleep", "no free submission entry for the doorbell wait");
    if (w->kind == SR_DOORBELL_FUTEX)
        prep_futex_wait(sqe, w->word, SR_DOORBELL_SLEEPING, SR_DOORBELL_BIT_PROGRESS);
    else
        io_uring_prep_read(sqe, w->eventfd, &w->efd_buf, sizeof(w->efd_buf), 0);
    io_uring_sqe_set_data64(sqe, UD(TAG_WAIT, ++w->wait_gen));
    w->wait_inflight = true;
    return 0;
}

/* Make sure a TIMEOUT fires no later than deadline_ns: arm one, or move the
 * armed one earlier. An armed one that fires earlier is kept: that wake-up
 * is spurious (see wait_events) but cheaper than an update per sleep. */
static int queue_timer(sr_waiter *w, int64_t deadline_ns)
{
    if (w->timer_armed && w->timer_at <= deadline_ns)
        return 0;
    struct io_uring_sqe *sqe = get_sqe(w);
    if (!sqe)
        return sr__fail(-EBUSY, "sr__waiter_sleep", "no free submission entry for the deadline");
    w->ts.tv_sec = deadline_ns / 1000000000;
    w->ts.tv_nsec = deadline_ns % 1000000000;
    if (w->timer_armed) {
        io_uring_prep_timeout_update(sqe, &w->ts, UD(TAG_TIMER, w->timer_gen), IORING_TIMEOUT_ABS);
        io_uring_sqe_set_data64(sqe, UD(TAG_TIMER_UPDATE, w->timer_gen));
        /* A successful update needs no completion (which would end the wait
         * at once); a failed one (the timer fired first) reports itself. */
        if (w->ring.features & IORING_FEAT_CQE_SKIP)
            sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    } else {
        io_uring_prep_timeout(sqe, &w->ts, 0, IORING_TIMEOUT_ABS);
        io_uring_sqe_set_data64(sqe, UD(TAG_TIMER, ++w->timer_gen));
        w->timer_armed = true;
    }
    w->timer_at = deadline_ns;
    return 0;
}

/* Consume every completion; returns the SR_WAKE_* events they carry. */
static unsigned reap(sr_waiter *w)
{
    unsigned ev = 0;
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&w->ring, &cqe) == 0) {
        uint64_t ud = cqe->user_data;
        io_uring_cqe_seen(&w->ring, cqe);
        switch (ud >> 32) {
        case TAG_WAIT:
            if ((uint32_t)ud != w->wait_gen)
                break;
            w->wait_inflight = false;
            ev |= SR_WAKE_DOORBELL; /* woken (0 / 8 bytes), or -EAGAIN: rung before the wait began */
            break;
        case TAG_TIMER:
            if ((uint32_t)ud != w->timer_gen)
                break;
            w->timer_armed = false; /* -ETIME: it fired; -ECANCELED only with the ring */
            w->timer_fired = true;
            break;
        case TAG_PEER:
            w->peer_dead[(uint32_t)ud] = true;
            ev |= SR_WAKE_PEER;
            break;
        case TAG_SHUTDOWN:
            w->shutdown = true;
            break;
        case TAG_KICK:
            w->kick_inflight = false;
            ev |= SR_WAKE_KICK;
            break;
        default: /* TAG_TIMER_UPDATE: -ENOENT, the timer fired first and its own completion tells */
            break;
        }
    }
    return ev | (w->shutdown ? SR_WAKE_SHUTDOWN : 0);
}

/* Did the deadline pass? Read the clock only after a timer fired. */
static unsigned check_deadline(sr_waiter *w, int64_t deadline_ns)
{
    if (!w->timer_fired)
        return 0;
    w->timer_fired = false;
    return deadline_ns >= 0 && sr__now_ns() >= deadline_ns ? SR_WAKE_TIMEOUT : 0;
}

/* Sleep in io_uring_enter until an event for this sleep arrives. With
 * bell false, no doorbell wait is queued (one still armed may complete). */
static int wait_events(sr_waiter *w, int64_t deadline_ns, bool bell, unsigned *ev)
{
    for (;;) {
        if ((*ev |= check_deadline(w, deadline_ns)))
            return 0;
        int rc = w->wait_inflight || !bell ? 0 : queue_wait(w);
        if (!rc && !w->kick_inflight)
            rc = queue_kick(w);
        if (!rc && deadline_ns >= 0)
            rc = queue_timer(w, deadline_ns);
        if (rc)
            return rc;
        rc = io_uring_submit_and_wait(&w->ring, 1);
        if (rc == -EEXIST && (w->setup_flags & IORING_SETUP_SINGLE_ISSUER) && (rc = rebuild_plain(w)) == 0)
            continue;
        if (rc < 0 && rc != -EINTR && rc != -ETIME && rc != -EAGAIN && rc != -EBUSY)
            return sr__fail(rc, "sr__waiter_sleep", "io_uring_submit_and_wait: %s", strerror(-rc));
        if ((*ev |= reap(w)))
            return 0;
    }
}

/* Say AWAKE again after a sleep, but only over our own SLEEPING. Another
 * thread of this worker may have taken the inbox while we slept and be
 * asleep on the word as SLEEPING_USER (lib/rpc/agent.c): taking that away
 * would leave it deaf to the producers, who would then see AWAKE and ring
 * nobody. Returns 0 (no event). */
static unsigned take_back_sleeping(sr_waiter *w)
{
    uint32_t mine = SR_DOORBELL_SLEEPING;
    /* relaxed: a racing producer's exchange also writes AWAKE; the wake syscall carries the event */
    atomic_compare_exchange_strong_explicit(w->word, &mine, SR_DOORBELL_AWAKE, memory_order_relaxed,
                                            memory_order_relaxed);
    return 0;
}

int sr__waiter_sleep(sr_waiter *w, int64_t deadline_ns, bool (*ready)(void *), void *arg)
{
    int rc = w->armed ? 0 : arm(w);
    if (rc)
        return rc;
    /* A doorbell completion from before this sleep is stale: ready() decides. */
    unsigned ev = reap(w) & ~SR_WAKE_DOORBELL;
    if (ev)
        return (int)ev;
    /* relaxed: D2 below orders it before the ring re-check */
    atomic_store_explicit(w->word, SR_DOORBELL_SLEEPING, memory_order_relaxed);
    /* D2: pairs with the producer's D3 fence in sr__doorbell_ring */
    atomic_thread_fence(memory_order_seq_cst);
    if (ready(arg))
        ev = SR_WAKE_DOORBELL;
    else
        rc = wait_events(w, deadline_ns, true, &ev);
    return rc ? rc : (int)(ev | take_back_sleeping(w));
}

int sr__waiter_sleep_aside(sr_waiter *w, int64_t deadline_ns, bool (*ready)(void *), void *arg)
{
    int rc = w->armed ? 0 : arm(w);
    if (rc)
        return rc;
    /* A doorbell completion is not ours to act on here; a kick is re-checked by ready(). */
    unsigned ev = reap(w) & ~(SR_WAKE_DOORBELL | SR_WAKE_KICK);
    if (ev || ready(arg))
        return (int)(ev | SR_WAKE_KICK);
    rc = wait_events(w, deadline_ns, false, &ev);
    return rc ? rc : (int)ev;
}
