/* SPDX-License-Identifier: MIT */
/* io_uring writes for checkpoints. See io.h.
 *
 * Nothing is registered with the ring, on purpose:
 *   - Not the file. A fixed file would save each write SQE the fget/fput
 *     of a file-table lookup, an atomic or two against a copy of up to
 *     16 MiB. But the ring's file table holds its own reference to the
 *     file, and a ring is torn down asynchronously (a kernel worker) after
 *     its process dies, so the flock that marks the temporary file as
 *     being written (tmpfile.c) would outlive a crashed writer for an
 *     unbounded moment, and the next save would skip its stale file.
 *     Without the registration the lock dies with the process: the kernel
 *     closes its files before the parent can reap it.
 *   - Not the buffers. The writes are buffered (page cache, then one
 *     fsync), so the kernel copies from user memory either way; a fixed
 *     buffer only saves the per-request import of an iovec, while
 *     registering the tensors would pin every page of them (charged to
 *     RLIMIT_MEMLOCK, often 8 MiB in containers) for the length of the
 *     save. The data goes straight from the tensors' shared-heap blocks,
 *     with no staging copy, which registered buffers would have needed.
 *
 * The writes are independent (disjoint ranges), so up to SR__CKPT_QD go to
 * the kernel in one submission, and are never linked: ordering is imposed
 * only where durability needs it, by waiting for every write before the
 * fsync, and for the fsync before the rename (save.c).
 */
#include "io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

#define FSYNC_TAG UINT64_MAX

static int io_fail(sr__ckpt_io *io, int err, const char *what, uint64_t off)
{
    if (!io->err)
        io->err = sr__fail(err, "sr_checkpoint_save", "%s %s at offset %llu: %s", what, io->names[0],
                           (unsigned long long)off, strerror(-err));
    return io->err;
}

/* io_uring is used only where the kernel has a ring with IORING_OP_WRITE
 * (5.6); the probe itself needs 5.6, so an older kernel also falls back. */
static bool ring_usable(struct io_uring *ring)
{
    struct io_uring_probe *p = io_uring_get_probe_ring(ring);
    bool ok = p && io_uring_opcode_supported(p, IORING_OP_WRITE) && io_uring_opcode_supported(p, IORING_OP_FSYNC);
    if (p)
        io_uring_free_probe(p);
    return ok;
}

int sr__ckpt_io_init(sr__ckpt_io *io, int fd, const char *name, int dirfd, const char *dirname)
{
    memset(io, 0, sizeof(*io));
    io->fds[0] = fd;
    io->fds[1] = dirfd;
    io->names[0] = name;
    io->names[1] = dirname;
    for (unsigned i = 0; i < SR__CKPT_QD; i++)
        io->free_slots[io->nfree++] = SR__CKPT_QD - 1 - i;
    const char *env = getenv("SHMRPC_CKPT_IO");
    if (env && !strcmp(env, "sync"))
        return 0;
    if (io_uring_queue_init(SR__CKPT_QD, &io->ring, 0) < 0)
        return 0;
    if (!ring_usable(&io->ring)) {
        io_uring_queue_exit(&io->ring);
        return 0;
    }
    io->uring = true;
    return 0;
}

/* Every slot in use has at most one SQE queued and the SQ ring has
 * SR__CKPT_QD entries, so an SQE is always free here. */
static void queue_slot(sr__ckpt_io *io, unsigned slot)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    sr__ckpt_req *r = &io->reqs[slot];
    io_uring_prep_write(sqe, io->fds[0], r->buf, (unsigned)r->len, r->off);
    io_uring_sqe_set_data64(sqe, slot);
    io->inflight++;
}

/* A short write (the disk filled up mid-request, a signal) continues from
 * where it stopped; 0 bytes written would never progress, so it is -EIO. */
static void complete(sr__ckpt_io *io, unsigned slot, int res)
{
    sr__ckpt_req *r = &io->reqs[slot];
    io->inflight--;
    if (res <= 0)
        io_fail(io, res < 0 ? res : -EIO, "writing", r->off);
    if (res > 0 && (size_t)res < r->len && !io->err) {
        r->buf += res;
        r->len -= (size_t)res;
        r->off += (uint64_t)res;
        queue_slot(io, slot);
        return;
    }
    io->free_slots[io->nfree++] = slot;
}

/* Submit what is queued, wait for at least one completion, handle all. */
static int reap(sr__ckpt_io *io)
{
    int rc;
    do
        rc = io_uring_submit_and_wait(&io->ring, 1);
    while (rc == -EINTR);
    if (rc < 0)
        return sr__fail(rc, "sr_checkpoint_save", "io_uring_submit_and_wait for %s: %s", io->names[0],
                        strerror(-rc));
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&io->ring, head, cqe)
    {
        complete(io, (unsigned)cqe->user_data, cqe->res);
        seen++;
    }
    io_uring_cq_advance(&io->ring, seen);
    return 0;
}

static int pwrite_all(sr__ckpt_io *io, const uint8_t *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t n = pwrite(io->fds[0], buf, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return io_fail(io, n < 0 ? -errno : -EIO, "writing", off);
        buf += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int queue_chunk(sr__ckpt_io *io, const uint8_t *buf, size_t len, uint64_t off)
{
    if (!io->uring)
        return pwrite_all(io, buf, len, off);
    while (!io->nfree && !io->err) {
        int rc = reap(io);
        if (rc)
            return rc;
    }
    if (io->err)
        return io->err;
    unsigned slot = io->free_slots[--io->nfree];
    io->reqs[slot] = (sr__ckpt_req){buf, len, off};
    queue_slot(io, slot);
    return 0;
}

int sr__ckpt_io_write(sr__ckpt_io *io, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len && !io->err) {
        size_t n = len < SR__CKPT_CHUNK ? len : SR__CKPT_CHUNK;
        int rc = queue_chunk(io, p, n, off);
        if (rc)
            return rc;
        p += n;
        len -= n;
        off += n;
    }
    return io->err;
}

int sr__ckpt_io_drain(sr__ckpt_io *io)
{
    while (io->uring && io->inflight) {
        int rc = reap(io);
        if (rc)
            return rc;
    }
    return io->err;
}

static int ring_fsync(sr__ckpt_io *io, int which)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    io_uring_prep_fsync(sqe, io->fds[which], 0);
    io_uring_sqe_set_data64(sqe, FSYNC_TAG);
    int rc;
    do
        rc = io_uring_submit_and_wait(&io->ring, 1);
    while (rc == -EINTR);
    struct io_uring_cqe *cqe;
    if (rc >= 0)
        rc = io_uring_peek_cqe(&io->ring, &cqe);
    if (rc < 0)
        return rc;
    rc = cqe->res;
    io_uring_cqe_seen(&io->ring, cqe);
    return rc;
}

int sr__ckpt_io_fsync(sr__ckpt_io *io, int which)
{
    int rc = sr__ckpt_io_drain(io);
    if (rc)
        return rc;
    if (io->uring)
        rc = ring_fsync(io, which);
    else
        rc = fsync(io->fds[which]) ? -errno : 0;
    if (rc < 0)
        return sr__fail(rc, "sr_checkpoint_save", "fsync of %s%s: %s", which == SR__CKPT_DIR ? "directory " : "",
                        io->names[which], strerror(-rc));
    return 0;
}

void sr__ckpt_io_fini(sr__ckpt_io *io)
{
    /* The kernel may still read buffers of queued writes: wait for them
     * before the caller frees anything (closing the ring does not). */
    while (io->uring && io->inflight)
        if (reap(io))
            break;
    if (io->uring)
        io_uring_queue_exit(&io->ring);
    io->uring = false;
}
