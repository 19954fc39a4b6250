/* The io_uring waiter. See waiter.h and the handshake in doorbell.h. */
#include "waiter.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
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

enum { TAG_WAIT = 1, TAG_TIMEOUT = 2, TAG_PEER = 3, TAG_SHUTDOWN = 4, TAG_CANCEL = 5 };
#define UD(tag, v) (((uint64_t)(tag) << 32) | (uint32_t)(v))

int64_t sr_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t sr_now_coarse_ns(void)
{
    static int64_t res_ns = -1; /* racy init is harmless: every thread computes the same value */
    if (res_ns < 0) {
        struct timespec r;
        res_ns = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0 ? (int64_t)r.tv_sec * 1000000000 + r.tv_nsec : 0;
    }
    struct timespec t;
    if (res_ns == 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &t))
        return sr_now_ns();
    /* Round up by one tick, so a deadline computed from it never fires early. */
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec + res_ns;
}

int sr__doorbell_wake(_Atomic uint32_t *word, uint32_t kind, int eventfd)
{
    if (kind == SR_DOORBELL_EVENTFD) {
        uint64_t one = 1;
        return write(eventfd, &one, sizeof(one)) == sizeof(one);
    }
    return syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0) >= 0;
}

/* Fill a FUTEX_WAIT SQE by hand: wait while *word == val. */
static void prep_futex_wait(struct io_uring_sqe *sqe, _Atomic uint32_t *word, uint32_t val)
{
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = SR_IORING_OP_FUTEX_WAIT;
    sqe->fd = SR_FUTEX2_SIZE_U32;
    sqe->addr = (uint64_t)(uintptr_t)word;
    sqe->addr2 = val;
    sqe->addr3 = SR_FUTEX_BITSET_MATCH_ANY;
}

bool sr_waiter_futex_supported(void)
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
            prep_futex_wait(sqe, &probe_word, 0);
        ok = sqe && io_uring_submit_and_wait(&r, 1) == 1 && io_uring_peek_cqe(&r, &cqe) == 0 &&
             cqe->res == -EAGAIN;
    }
    io_uring_queue_exit(&r);
    return ok;
}

static struct io_uring_sqe *get_sqe(sr_waiter *w)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (!sqe) { /* SQ full: push what is queued and try once more */
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
        wanted = sr_waiter_futex_supported() ? SR_DOORBELL_FUTEX : SR_DOORBELL_EVENTFD;
    if (wanted == SR_DOORBELL_EVENTFD && eventfd < 0)
        return 0;
    return wanted;
}

int sr_waiter_init(sr_waiter *w, _Atomic uint32_t *word, int efd, uint32_t kind_wanted)
{
    memset(w, 0, sizeof(*w));
    w->word = word;
    w->eventfd = efd;
    w->kind = choose_kind(kind_wanted, efd);
    if (!w->kind)
        return sr__fail(-EOPNOTSUPP, "sr_waiter_init", "no doorbell: io_uring futex unsupported and no eventfd given");
    int rc = io_uring_queue_init(64, &w->ring, 0);
    if (rc < 0)
        return sr__fail(rc, "sr_waiter_init", "io_uring_queue_init: %s", strerror(-rc));
    w->shutdown_fd = eventfd(0, EFD_CLOEXEC);
    if (w->shutdown_fd < 0) {
        rc = sr__fail(-errno, "sr_waiter_init", "eventfd: %s", strerror(errno));
        io_uring_queue_exit(&w->ring);
        return rc;
    }
    struct io_uring_sqe *sqe = get_sqe(w);
    io_uring_prep_poll_add(sqe, w->shutdown_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, UD(TAG_SHUTDOWN, 0));
    io_uring_submit(&w->ring);
    return 0;
}

void sr_waiter_fini(sr_waiter *w)
{
    io_uring_queue_exit(&w->ring);
    if (w->shutdown_fd >= 0)
        close(w->shutdown_fd);
    for (int i = 0; w->pidfds && i < w->npeers; i++)
        if (w->pidfds[i] >= 0)
            close(w->pidfds[i]);
    free(w->pidfds);
    free(w->peer_dead);
    memset(w, 0, sizeof(*w));
    w->shutdown_fd = -1;
}

static int alloc_peers(sr_waiter *w, int n)
{
    w->pidfds = malloc((size_t)n * sizeof(int));
    w->peer_dead = calloc((size_t)n, sizeof(bool));
    if (!w->pidfds || !w->peer_dead)
        return sr__fail(-ENOMEM, "sr_waiter_watch_peer", "no memory for %d peers", n);
    for (int i = 0; i < n; i++)
        w->pidfds[i] = -1;
    w->npeers = n;
    return 0;
}

int sr_waiter_watch_peer(sr_waiter *w, int world_size, int rank, int pid)
{
    int rc;
    if (!w->pidfds && (rc = alloc_peers(w, world_size)))
        return rc;
    if (rank < 0 || rank >= w->npeers)
        return sr__fail(-EINVAL, "sr_waiter_watch_peer", "rank %d is out of range [0, %d)", rank, w->npeers);
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) {
        if (errno == ESRCH) { /* already gone */
            w->peer_dead[rank] = true;
            return 0;
        }
        return sr__fail(-errno, "sr_waiter_watch_peer", "pidfd_open(%d) for rank %d: %s", pid, rank, strerror(errno));
    }
    w->pidfds[rank] = fd;
    struct io_uring_sqe *sqe = get_sqe(w);
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data64(sqe, UD(TAG_PEER, rank));
    io_uring_submit(&w->ring);
    return 0;
}

void sr_waiter_notify_shutdown(sr_waiter *w)
{
    uint64_t one = 1;
    if (write(w->shutdown_fd, &one, sizeof(one)) < 0)
        return; /* an eventfd write fails only on counter overflow: already notified */
}

static void submit_wait(sr_waiter *w, int64_t deadline_ns)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    if (w->kind == SR_DOORBELL_FUTEX)
        prep_futex_wait(sqe, w->word, SR_DOORBELL_SLEEPING);
    else
        io_uring_prep_read(sqe, w->eventfd, &w->efd_buf, sizeof(w->efd_buf), 0);
    io_uring_sqe_set_data64(sqe, UD(TAG_WAIT, ++w->wait_gen));
    if (deadline_ns >= 0) {
        sqe->flags |= IOSQE_IO_LINK;
        w->ts.tv_sec = deadline_ns / 1000000000;
        w->ts.tv_nsec = deadline_ns % 1000000000;
        sqe = get_sqe(w);
        io_uring_prep_link_timeout(sqe, &w->ts, IORING_TIMEOUT_ABS);
        io_uring_sqe_set_data64(sqe, UD(TAG_TIMEOUT, w->wait_gen));
    }
    w->wait_inflight = true;
}

/* Consume every completion; returns the SR_WAKE_* events they carry. */
static unsigned reap(sr_waiter *w)
{
    unsigned ev = 0;
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&w->ring, &cqe) == 0) {
        uint64_t ud = cqe->user_data;
        int res = cqe->res;
        io_uring_cqe_seen(&w->ring, cqe);
        switch (ud >> 32) {
        case TAG_WAIT:
            if ((uint32_t)ud != w->wait_gen)
                break;
            w->wait_inflight = false;
            /* 0 / 8 bytes: woken; -EAGAIN: already woken before the wait began;
             * -ECANCELED: the linked timeout fired (or we cancelled it). */
            ev |= res == -ECANCELED ? SR_WAKE_TIMEOUT : SR_WAKE_DOORBELL;
            break;
        case TAG_PEER:
            w->peer_dead[(uint32_t)ud] = true;
            ev |= SR_WAKE_PEER;
            break;
        case TAG_SHUTDOWN:
            w->shutdown = true;
            break;
        default: /* TAG_TIMEOUT, TAG_CANCEL: the wait's own completion tells */
            break;
        }
    }
    return ev | (w->shutdown ? SR_WAKE_SHUTDOWN : 0);
}

static int wait_events(sr_waiter *w, unsigned *ev)
{
    for (;;) {
        int rc = io_uring_submit_and_wait(&w->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -ETIME && rc != -EAGAIN)
            return sr__fail(rc, "sr_waiter_sleep", "io_uring_submit_and_wait: %s", strerror(-rc));
        if ((*ev |= reap(w)))
            return 0;
    }
}

/* We woke for something other than the doorbell: take the wait back, so
 * that the next sleep starts from a clean state with its own deadline. */
static int cancel_wait(sr_waiter *w)
{
    struct io_uring_sqe *sqe = get_sqe(w);
    io_uring_prep_cancel64(sqe, UD(TAG_WAIT, w->wait_gen), 0);
    io_uring_sqe_set_data64(sqe, UD(TAG_CANCEL, w->wait_gen));
    unsigned ev = 0;
    while (w->wait_inflight) {
        int rc = wait_events(w, &ev);
        if (rc)
            return rc;
    }
    return 0;
}

int sr_waiter_sleep(sr_waiter *w, int64_t deadline_ns, bool (*ready)(void *), void *arg)
{
    unsigned ev = reap(w);
    if (ev & (SR_WAKE_SHUTDOWN | SR_WAKE_PEER))
        return (int)ev;
    /* relaxed: D2 below orders it before the ring re-check */
    atomic_store_explicit(w->word, SR_DOORBELL_SLEEPING, memory_order_relaxed);
    /* D2: pairs with the producer's D3 fence in sr_doorbell_ring */
    atomic_thread_fence(memory_order_seq_cst);
    if (ready(arg))
        ev = SR_WAKE_DOORBELL;
    else if (deadline_ns >= 0 && deadline_ns <= sr_now_ns())
        ev = SR_WAKE_TIMEOUT;
    else {
        submit_wait(w, deadline_ns);
        int rc = wait_events(w, &ev);
        if (!rc && w->wait_inflight)
            rc = cancel_wait(w);
        if (rc)
            return rc;
    }
    /* relaxed: only we write SLEEPING; a racing producer's exchange also writes AWAKE */
    atomic_store_explicit(w->word, SR_DOORBELL_AWAKE, memory_order_relaxed);
    return (int)ev;
}
