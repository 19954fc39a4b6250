/* SPDX-License-Identifier: MIT */
/* The writes and fsyncs of one checkpoint save, submitted through io_uring.
 *
 * One ring per save: creating it costs tens of microseconds against the
 * milliseconds a save spends on its data and its fsyncs, and a ring owned by
 * the save needs no lock and no lifetime beyond it.
 *
 * Without io_uring (no kernel support, a seccomp filter, sysctl
 * kernel.io_uring_disabled, or SHMRPC_CKPT_IO=sync in the environment) the
 * same calls run as pwrite/fsync, so a save never fails for lack of a ring.
 *
 * Lifetime: a buffer given to sr__ckpt_io_write must stay valid and
 * unchanged until sr__ckpt_io_drain or sr__ckpt_io_fini returns.
 */
#ifndef SR_LIB_CHECKPOINT_IO_H
#define SR_LIB_CHECKPOINT_IO_H

#if !defined(SR__IN_TRAIN)
#error "io.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <liburing.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SR__CKPT_QD 32u               /* writes in flight at most */
#define SR__CKPT_CHUNK (16u << 20)    /* bytes per write request at most */

enum { SR__CKPT_FILE = 0, SR__CKPT_DIR = 1 }; /* which descriptor to fsync */

typedef struct sr__ckpt_req {
    const uint8_t *buf;
    size_t len;
    uint64_t off;
} sr__ckpt_req;

typedef struct sr__ckpt_io {
    bool uring;           /* false: plain syscalls */
    struct io_uring ring;
    int fds[2];           /* the temporary file, its directory (borrowed) */
    const char *names[2]; /* their paths, for errors (borrowed) */
    int err;              /* first failure, sticky */
    unsigned inflight, nfree;
    unsigned free_slots[SR__CKPT_QD];
    sr__ckpt_req reqs[SR__CKPT_QD];
} sr__ckpt_io;

/* Never fails for want of io_uring (falls back); 0 or -errno otherwise. */
int sr__ckpt_io_init(sr__ckpt_io *io, int fd, const char *name, int dirfd, const char *dirname);
/* Queue len bytes of buf at file offset off; may wait for earlier writes
 * to make room. Returns 0, or the first error of any write so far. */
int sr__ckpt_io_write(sr__ckpt_io *io, const void *buf, size_t len, uint64_t off);
/* Wait for every queued write; 0 or the first error. */
int sr__ckpt_io_drain(sr__ckpt_io *io);
/* fsync the file or the directory (after a drain); 0 or -errno. */
int sr__ckpt_io_fsync(sr__ckpt_io *io, int which);
/* Waits for writes still in flight, then frees the ring. */
void sr__ckpt_io_fini(sr__ckpt_io *io);

#endif
