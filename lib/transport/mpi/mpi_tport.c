/* SPDX-License-Identifier: MIT */
/* The MPI transport (mpi_tport.h). */
#include "mpi_tport.h"

#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "heap.h"
#include "log.h"
#include "segment.h" /* SR_NAME_MAX */
#include "waiter.h"  /* sr__now_ns */

#define INLINE_MAX (8u << 10)      /* a part up to this size rides in the frame (copied) */
#define FRAME_INLINE_MAX (64u << 10) /* and the frame carries at most this much of them */
#define MAX_PARTS 65536u
#define PART_APART (UINT64_C(1) << 63) /* in a part's length: it follows as a message of its own */

/* The frame's fixed head; then nparts little-endian u64 lengths, then the
 * inline parts' bytes in order. */
struct frame_head {
    sr_msg m;
    uint32_t nparts;
};
_Static_assert(sizeof(struct frame_head) == 64, "the lengths that follow are 8-byte aligned");

/* A message on its way: its requests, and the head kept to drop its parts
 * once they left. Allocated by the sender, freed by whoever completes it. */
struct send_op {
    struct send_op *next;
    sr_msg m;
    bool has_parts;
    int frame_len;    /* bytes of frame[] */
    int nreq;
    MPI_Request *req; /* [nreq], after the frame */
    uint8_t frame[];
};

struct part {
    const void *data;
    uint64_t len;
    bool inside; /* rides in the frame (copied); else a message of its own */
};

struct mpi_tport {
    sr_tport tp;
    const struct sr_mpi_job *job;
    char (*names)[SR_NAME_MAX]; /* [world], exchanged at create */
    pthread_mutex_t send_lock;  /* posting a message's requests; the in-flight list */
    struct send_op *inflight;   /* under send_lock */
    _Atomic uint32_t ninflight; /* written under send_lock; read relaxed as a hint by the consumer */
    _Atomic int64_t last_ns;    /* the last message in or out (relaxed: a poll heuristic) */
    _Atomic uint64_t sent, received; /* relaxed: statistics */
    _Atomic uint32_t zero;      /* the hint words of the groups it has not (transport.h): never raised */
    /* The consumer's: a frame matched by pending() and not yet received. */
    bool stashed;
    MPI_Message stash;
    MPI_Status stash_st;
    uint8_t *rbuf;              /* the frame receive buffer, grown as needed */
    size_t rcap;
};

#define T(t) ((struct mpi_tport *)(t))

static int mpi_fail(int rc, const char *fn, const char *what, int to)
{
    char err[MPI_MAX_ERROR_STRING];
    return sr__fail(-EIO, fn, "%s (rank %d): %s", what, to, sr__mpi_strerror(rc, err, sizeof(err)));
}

/* ---- sending ---------------------------------------------------------- */

/* The parts of one message, in order; most messages have a few, kept in
 * `few` without an allocation. */
struct collect {
    struct part *p; /* few, or a heap array once there are more */
    size_t n, cap;
    uint64_t inline_bytes;
    struct part few[8];
};

static int collect_part(void *arg, const void *data, uint64_t len)
{
    struct collect *c = arg;
    if (len > INT_MAX)
        return sr__fail(-EMSGSIZE, "sr_rpc", "a part of %llu bytes is larger than one MPI message (2 GiB)",
                        (unsigned long long)len);
    if (c->n == MAX_PARTS)
        return sr__fail(-EMSGSIZE, "sr_rpc", "a message with more than %u parts (tensors) cannot cross hosts",
                        MAX_PARTS - 1);
    if (c->n == c->cap) {
        size_t cap = 2 * c->cap;
        struct part *p = c->p == c->few ? malloc(cap * sizeof(*p)) : realloc(c->p, cap * sizeof(*p));
        if (!p)
            return sr__fail(-ENOMEM, "sr_rpc", "out of memory for %zu message parts", cap);
        if (c->p == c->few)
            memcpy(p, c->few, sizeof(c->few));
        c->p = p;
        c->cap = cap;
    }
    bool inside = len <= INLINE_MAX && c->inline_bytes + len <= FRAME_INLINE_MAX;
    c->p[c->n++] = (struct part){data, len, inside};
    c->inline_bytes += inside ? len : 0;
    return 0;
}

static void collect_init(struct collect *c)
{
    c->p = c->few;
    c->n = 0;
    c->cap = sizeof(c->few) / sizeof(c->few[0]);
    c->inline_bytes = 0;
}

static void collect_fini(struct collect *c)
{
    if (c->p != c->few)
        free(c->p);
}

/* The frame of m and its parts, and room for its requests. */
static struct send_op *build_op(const sr_msg *m, const struct collect *c)
{
    size_t frame = sizeof(struct frame_head) + 8 * c->n + c->inline_bytes;
    size_t reqs_at = (sizeof(struct send_op) + frame + 7) / 8 * 8 - sizeof(struct send_op);
    struct send_op *op = malloc(sizeof(*op) + reqs_at + (c->n + 1) * sizeof(MPI_Request));
    if (!op)
        return NULL;
    op->m = *m;
    op->has_parts = c->n > 0;
    op->frame_len = (int)frame;
    op->req = (MPI_Request *)(void *)(op->frame + reqs_at);
    op->nreq = 0;
    struct frame_head h = {.m = *m, .nparts = (uint32_t)c->n};
    memcpy(op->frame, &h, sizeof(h));
    uint8_t *lens = op->frame + sizeof(h), *in = lens + 8 * c->n;
    for (size_t i = 0; i < c->n; i++) {
        const struct part *p = &c->p[i];
        uint64_t word = htole64(p->inside ? p->len : p->len | PART_APART);
        memcpy(lens + 8 * i, &word, 8);
        if (p->inside) {
            memcpy(in, p->data, p->len);
            in += p->len;
        }
    }
    return op;
}

/* Post the frame and the large parts, in order, under send_lock. */
static int post_op(struct mpi_tport *x, int to, struct send_op *op, const struct collect *c)
{
    int rc = MPI_Isend(op->frame, op->frame_len, MPI_BYTE, to, SR_MPI_TAG_FRAME, x->job->comm, &op->req[0]);
    op->nreq = rc == MPI_SUCCESS;
    for (size_t i = 0; rc == MPI_SUCCESS && i < c->n; i++) {
        if (c->p[i].inside)
            continue;
        /* the part's bytes go straight from the shared heap: no copy */
        rc = MPI_Isend(c->p[i].data, (int)c->p[i].len, MPI_BYTE, to, SR_MPI_TAG_PART, x->job->comm,
                       &op->req[op->nreq]);
        op->nreq += rc == MPI_SUCCESS;
    }
    return rc;
}

static void finish_op(struct mpi_tport *x, struct send_op *op)
{
    if (op->has_parts && x->tp.marshal)
        x->tp.marshal->sent(&op->m);
    free(op);
}

static int t_send(sr_tport *t, int to, sr_msg *m)
{
    struct mpi_tport *x = T(t);
    if (to < 0 || to >= t->world || x->job->host_of[to] == x->job->host)
        return sr__fail(-EINVAL, "sr_rpc", "rank %d is not on another host (world %d)", to, t->world);
    m->src = (uint16_t)t->rank;
    m->gens = 0; /* no rank of an MPI job is ever replaced */
    struct collect c;
    collect_init(&c);
    int rc = t->marshal ? t->marshal->parts(m, collect_part, &c) : 0;
    struct send_op *op = rc ? NULL : build_op(m, &c);
    if (!rc && !op)
        rc = sr__fail(-ENOMEM, "sr_rpc", "out of memory for a message to rank %d", to);
    if (rc) {
        collect_fini(&c);
        return rc;
    }
    pthread_mutex_lock(&x->send_lock);
    int mrc = post_op(x, to, op, &c);
    pthread_mutex_unlock(&x->send_lock);
    collect_fini(&c);
    if (mrc != MPI_SUCCESS && op->nreq == 0) { /* nothing left: the parts stay the caller's */
        free(op);
        return mpi_fail(mrc, "sr_rpc", "MPI_Isend to another host failed", to);
    }
    if (mrc != MPI_SUCCESS) { /* the frame left without all its parts: the peer's stream cannot recover */
        mpi_fail(mrc, "sr_rpc", "MPI_Isend of a message's part failed after its frame had left", to);
        sr_logf(SR_LOG_ERROR, "%s: ending the job (MPI_Abort)", sr_last_error());
        MPI_Abort(x->job->comm, 1);
    }
    atomic_fetch_add_explicit(&x->sent, 1, memory_order_relaxed);        /* relaxed: statistics */
    atomic_store_explicit(&x->last_ns, sr__now_ns(), memory_order_relaxed); /* relaxed: a heuristic */
    int done = 0;
    MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE);
    if (done) { /* an eager frame is usually out at once */
        finish_op(x, op);
        return 0;
    }
    pthread_mutex_lock(&x->send_lock);
    op->next = x->inflight;
    x->inflight = op;
    /* relaxed: under send_lock; the consumer reads it as a hint to poll */
    atomic_fetch_add_explicit(&x->ninflight, 1, memory_order_relaxed);
    pthread_mutex_unlock(&x->send_lock);
    return 0;
}

/* The consumer: complete the sends that are done, dropping their parts. */
static void progress_sends(struct mpi_tport *x)
{
    if (!atomic_load_explicit(&x->ninflight, memory_order_relaxed)) /* relaxed: a hint; re-read under the lock */
        return;
    struct send_op *done = NULL;
    pthread_mutex_lock(&x->send_lock);
    uint32_t left = 0;
    for (struct send_op **pp = &x->inflight; *pp;) {
        struct send_op *op = *pp;
        int flag = 0;
        MPI_Testall(op->nreq, op->req, &flag, MPI_STATUSES_IGNORE);
        if (flag) {
            *pp = op->next;
            op->next = done;
            done = op;
        } else {
            pp = &op->next;
            left++;
        }
    }
    atomic_store_explicit(&x->ninflight, left, memory_order_relaxed); /* relaxed: under send_lock */
    pthread_mutex_unlock(&x->send_lock);
    while (done) {
        struct send_op *n = done->next;
        finish_op(x, done);
        done = n;
    }
}

/* ---- receiving -------------------------------------------------------- */

static bool match_frame(struct mpi_tport *x)
{
    if (x->stashed)
        return true;
    int flag = 0;
    MPI_Improbe(MPI_ANY_SOURCE, SR_MPI_TAG_FRAME, x->job->comm, &flag, &x->stash, &x->stash_st);
    x->stashed = flag != 0;
    return x->stashed;
}

static bool t_pending(sr_tport *t) { return match_frame(T(t)); }

/* Receive the stashed frame into rbuf; its size, or -errno. */
static int64_t take_frame(struct mpi_tport *x)
{
    int count = 0;
    MPI_Get_count(&x->stash_st, MPI_BYTE, &count);
    x->stashed = false;
    if ((size_t)count > x->rcap) {
        uint8_t *b = realloc(x->rbuf, (size_t)count);
        if (!b) { /* consume it all the same: the stream stays in step */
            MPI_Mrecv(NULL, 0, MPI_BYTE, &x->stash, MPI_STATUS_IGNORE);
            return sr__fail(-ENOMEM, "sr_rpc", "out of memory for a %d-byte frame from rank %d", count,
                            x->stash_st.MPI_SOURCE);
        }
        x->rbuf = b;
        x->rcap = (size_t)count;
    }
    MPI_Mrecv(x->rbuf, count, MPI_BYTE, &x->stash, MPI_STATUS_IGNORE);
    return count;
}

struct incoming {
    int src;
    uint32_t n;
    uint64_t *blocks; /* [n] offsets; 0 until allocated; NULL: out of memory, the parts are discarded */
};

/* Materialise part i (length word w) in our heap; the bytes are in the
 * frame at *in, or follow as a message of their own. A part that cannot be
 * placed is still received (discarded), so the stream stays in step. */
static int take_part(struct mpi_tport *x, struct incoming *g, uint32_t i, uint64_t w, const uint8_t **in, int rc)
{
    bool apart = w & PART_APART;
    uint64_t len = w & ~PART_APART;
    sr_block *b = rc ? NULL : sr__block_alloc(len ? len : 1);
    if (!rc && !b)
        rc = -ENOMEM;
    void *data = b ? sr__block_data(b) : NULL;
    if (b)
        g->blocks[i] = sr__block_send_off(b); /* b implies !rc: blocks exists; the message's reference (heap.h) */
    if (!apart) {
        if (data)
            memcpy(data, *in, len);
        *in += len;
        return rc;
    }
    MPI_Status st;
    int got = -1;
    int mrc = MPI_Recv(data, data ? (int)len : 0, MPI_BYTE, g->src, SR_MPI_TAG_PART, x->job->comm, &st);
    if (mrc == MPI_SUCCESS)
        MPI_Get_count(&st, MPI_BYTE, &got);
    if (!rc && (mrc != MPI_SUCCESS || (uint64_t)got != len))
        rc = sr__fail(-EBADMSG, "sr_rpc", "part %u of a message from rank %d: %d bytes for %llu", i, g->src, got,
                      (unsigned long long)len);
    return rc;
}

/* Check the frame's layout: 0 with the head copied out, or -EBADMSG. */
static int check_frame(const uint8_t *f, int64_t size, int src, struct frame_head *h)
{
    if (size < (int64_t)sizeof(*h))
        return sr__fail(-EBADMSG, "sr_rpc", "a %lld-byte frame from rank %d is shorter than its head",
                        (long long)size, src);
    memcpy(h, f, sizeof(*h));
    if (h->nparts > MAX_PARTS || (int64_t)(sizeof(*h) + 8 * (uint64_t)h->nparts) > size)
        return sr__fail(-EBADMSG, "sr_rpc", "a frame from rank %d announces %u parts in %lld bytes", src, h->nparts,
                        (long long)size);
    uint64_t inl = 0;
    for (uint32_t i = 0; i < h->nparts; i++) {
        uint64_t w;
        memcpy(&w, f + sizeof(*h) + 8 * i, 8);
        w = le64toh(w);
        /* a part apart is one MPI message; one inside lies in the frame: bounded
         * before they are summed, so the sum below cannot wrap */
        if ((w & ~PART_APART) > ((w & PART_APART) ? (uint64_t)INT_MAX : (uint64_t)size))
            return sr__fail(-EBADMSG, "sr_rpc", "part %u from rank %d is %llu bytes", i, src,
                            (unsigned long long)(w & ~PART_APART));
        if (!(w & PART_APART))
            inl += w;
    }
    if ((int64_t)(sizeof(*h) + 8 * (uint64_t)h->nparts + inl) != size)
        return sr__fail(-EBADMSG, "sr_rpc", "a frame from rank %d holds %lld bytes, its parts say %llu", src,
                        (long long)size, (unsigned long long)(sizeof(*h) + 8 * h->nparts + inl));
    return 0;
}

static void drop_blocks(const struct incoming *g)
{
    for (uint32_t i = 0; i < g->n; i++) {
        sr_block *b = g->blocks[i] ? sr__block_recv_off(g->blocks[i]) : NULL;
        if (b)
            sr__block_unref(b);
    }
}

/* Receive one frame and its parts into *m. 0; -errno: the message is
 * dropped (the reason logged), the stream stays in step. */
static int take_message(struct mpi_tport *x, sr_msg *m)
{
    int src = x->stash_st.MPI_SOURCE;
    int64_t size = take_frame(x);
    struct frame_head h;
    int rc = size < 0 ? (int)size : check_frame(x->rbuf, size, src, &h);
    if (rc) /* a frame we cannot read says nothing we can trust about the parts that follow */
        return rc;
    uint64_t stack[8] = {0};
    struct incoming g = {.src = src, .n = h.nparts, .blocks = h.nparts <= 8 ? stack : calloc(h.nparts, 8)};
    if (!g.blocks)
        rc = sr__fail(-ENOMEM, "sr_rpc", "out of memory for the %u parts of a message from rank %d", h.nparts, src);
    const uint8_t *in = x->rbuf + sizeof(h) + 8 * (size_t)h.nparts;
    for (uint32_t i = 0; i < g.n; i++) {
        uint64_t w;
        memcpy(&w, x->rbuf + sizeof(h) + 8 * i, 8);
        rc = take_part(x, &g, i, le64toh(w), &in, rc);
    }
    *m = h.m;
    m->src = (uint16_t)src; /* who sent it is MPI's word, not the frame's */
    m->gens = 0;            /* as the sender stamped it: nothing is replaced across hosts */
    if (!rc)
        rc = x->tp.marshal ? x->tp.marshal->rebind(m, g.blocks, g.n) : (g.n ? -EBADMSG : 0);
    if (rc && g.blocks)
        drop_blocks(&g);
    if (g.blocks != stack)
        free(g.blocks);
    return rc;
}

static unsigned t_recv_burst(sr_tport *t, sr_msg *out, unsigned n)
{
    struct mpi_tport *x = T(t);
    progress_sends(x);
    unsigned k = 0;
    while (k < n && match_frame(x)) {
        int src = x->stash_st.MPI_SOURCE;
        if (take_message(x, &out[k]) == 0)
            k++;
        else
            sr_logf(SR_LOG_WARN, "dropped a message from rank %d (another host): %s", src, sr_last_error());
    }
    if (k) {
        atomic_fetch_add_explicit(&x->received, k, memory_order_relaxed);    /* relaxed: statistics */
        atomic_store_explicit(&x->last_ns, sr__now_ns(), memory_order_relaxed); /* relaxed: a heuristic */
    }
    return k;
}

/* 0 while a send is in flight (MPI progresses only when called) or a frame
 * waits; else an interval that grows with the time since the last message. */
static int64_t t_poll_ns(sr_tport *t)
{
    struct mpi_tport *x = T(t);
    if (x->stashed || atomic_load_explicit(&x->ninflight, memory_order_relaxed)) /* relaxed: a hint */
        return 0;
    int64_t idle = sr__now_ns() - atomic_load_explicit(&x->last_ns, memory_order_relaxed); /* relaxed: a hint */
    int64_t ns = idle / 4;
    return ns < SR_MPI_POLL_MIN_NS ? SR_MPI_POLL_MIN_NS : ns > SR_MPI_POLL_MAX_NS ? SR_MPI_POLL_MAX_NS : ns;
}

/* ---- names and statistics --------------------------------------------- */

static const char *t_name(sr_tport *t, int rank) { return T(t)->names[rank]; }

static void t_stats(sr_tport *t, struct sr_tport_stats *o)
{
    *o = (struct sr_tport_stats){
        .sent = atomic_load_explicit(&T(t)->sent, memory_order_relaxed),         /* relaxed: statistics */
        .received = atomic_load_explicit(&T(t)->received, memory_order_relaxed), /* relaxed: statistics */
    };
}

/* No flow (MPI never refuses a send), no wake (nothing rings a doorbell
 * across hosts: the consumer polls, poll_ns), no live (a rank of another
 * host that dies ends the job), no inbox to find corrupt. */
static const struct sr_tport_ops mpi_ops = {
    .kind = "mpi",
    .send = t_send,
    .recv_burst = t_recv_burst,
    .pending = t_pending,
    .name = t_name,
    .stats = t_stats,
    .poll_ns = t_poll_ns,
};

/* ---- lifetime ---------------------------------------------------------- */

int sr__mpi_tport_create(struct sr_mpi_job *job, const char *name, sr_tport **out)
{
    struct mpi_tport *x = calloc(1, sizeof(*x));
    char (*names)[SR_NAME_MAX] = calloc((size_t)job->world, SR_NAME_MAX);
    char mine[SR_NAME_MAX] = {0};
    if (!x || !names) {
        free(x);
        free(names);
        return sr__fail(-ENOMEM, "sr_init", "out of memory for the MPI transport");
    }
    snprintf(mine, sizeof(mine), "%s", name);
    MPI_Comm_set_errhandler(job->comm, MPI_ERRORS_RETURN); /* our failures are -errno, not an abort */
    int rc = MPI_Allgather(mine, SR_NAME_MAX, MPI_CHAR, names, SR_NAME_MAX, MPI_CHAR, job->comm);
    if (rc != MPI_SUCCESS) {
        free(x);
        free(names);
        return mpi_fail(rc, "sr_init", "exchanging the workers' names over MPI failed", job->rank);
    }
    for (int r = 0; r < job->world; r++)
        names[r][SR_NAME_MAX - 1] = '\0';
    x->job = job;
    x->names = names;
    pthread_mutex_init(&x->send_lock, NULL);
    x->tp = (sr_tport){.ops = &mpi_ops, .caps = SR_TPORT_COPIES, .rank = job->rank, .world = job->world,
                       .space_kick = &x->zero, .inbox_bad = &x->zero, .exits = &x->zero};
    atomic_init(&x->last_ns, sr__now_ns());
    *out = &x->tp;
    return 0;
}

/* The threads that used the instance have stopped. Sends still in flight complete (a
 * graceful shutdown's last barrier has been answered, so peers receive
 * them) within DRAIN_NS, else they are cancelled; frames nobody will read
 * are left to MPI. */
/* A send still in flight at the end: complete it within the bound, or
 * cancel it (its peer no longer receives: a shutdown that was not graceful). */
static void drain_op(struct mpi_tport *x, struct send_op *op, int64_t deadline)
{
    int done = 0;
    while (!done && sr__now_ns() < deadline)
        MPI_Testall(op->nreq, op->req, &done, MPI_STATUSES_IGNORE);
    if (!done) {
        for (int i = 0; i < op->nreq; i++)
            if (op->req[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&op->req[i]);
                MPI_Request_free(&op->req[i]);
            }
        sr_logf(SR_LOG_WARN, "a message of type %u was still in flight to another host at shutdown: dropped",
                op->m.type);
    }
    finish_op(x, op);
}

#define DRAIN_NS (INT64_C(10) * 1000000000)

void sr__mpi_tport_destroy(sr_tport *t)
{
    if (!t)
        return;
    struct mpi_tport *x = T(t);
    int64_t deadline = sr__now_ns() + DRAIN_NS;
    while (x->inflight) {
        struct send_op *op = x->inflight;
        x->inflight = op->next;
        drain_op(x, op, deadline);
    }
    pthread_mutex_destroy(&x->send_lock);
    free(x->rbuf);
    free(x->names);
    free(x);
}
