/* The profiler (internal): per-thread tables behind the probes of lib/rpc
 * (rpc/module.h, "Probes"), the statistics (shmrpc/stats.h) and the trace
 * (SHMRPC_TRACE, docs/PROFILING.md).
 *
 * Names (names.c). Function names are interned once into small ids
 * (SR_TRACE_FNS of them; later names share the last id, "(other)"). Lookups
 * take no lock; insertions serialise on a mutex.
 *
 * Thread tables (tables.c). Every thread that records owns one table: its
 * per-function statistics (allocated the first time it records a function)
 * and its trace records (chunks of fixed records). It is the only writer of
 * both; readers (a snapshot, the trace writer at sr_shutdown) read without
 * locks, as hist.h and the chunk counters say. A table outlives its thread:
 * when the thread exits, the table is released and the next new thread
 * adopts it, data and all, so the memory is bounded by the most threads
 * alive at once (and, for the trace, by the cap on records). Tables are
 * never freed: they stay reachable for the life of the process. A forked
 * child starts with them free and empty (tables.c, atfork_child).
 *
 * Resets. sr_stats_reset bumps a global epoch; a writer that sees its
 * table's epoch behind zeroes its own statistics first, and a reader skips a
 * table whose epoch is behind (it is zero by definition).
 */
#ifndef SR_TRACE_TRACE_H
#define SR_TRACE_TRACE_H

#if !defined(SR__IN_TRACE)
#error "trace.h is private to the trace module layer (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "hist.h"
#include "trace_seam.h" /* sr__trace_job_end */

#define SR_TRACE_FNS 256
#define SR_TRACE_CHUNK 4096

/* ---- names ---- */
/* The id of name (interned now if new). */
uint32_t sr__trace_name_id(const char *name);
/* The name of id (valid for the process), or NULL past the interned ones. */
const char *sr__trace_name(uint32_t id);
uint32_t sr__trace_names(void);

/* ---- per-function statistics of one thread ---- */
struct sr_fn_block {
    _Atomic uint64_t calls, errors, served, serve_errors;
    struct sr_hist rtt, queue, run;
};

/* ---- trace records ---- */
enum sr_rec_kind {
    SR_REC_SEND,     /* caller: the request left (X) + request flow start */
    SR_REC_ANSWER,   /* caller: the answer was handled (X) + response flow end, and the call's async span */
    SR_REC_LOST,     /* caller: the call ended unanswered (async span, with its error) */
    SR_REC_RECV,     /* callee: the request was decoded (X) + request flow end, queue span start */
    SR_REC_RUN,      /* callee: the function ran (X), queue span end */
    SR_REC_REPLY,    /* callee: the answer went out (X) + response flow start */
    SR_REC_MSG_OUT,  /* a raw module message sent (instant) */
    SR_REC_MSG_IN,   /* one received */
    SR_REC_SPAN,     /* a module's phase (X) */
};

struct sr_rec {
    int64_t t0, t1;     /* ns; t1 == t0 for instants */
    int64_t t2;         /* ANSWER, LOST: the call's start; RUN: the queue span's start */
    uint64_t flow;      /* the call's flow id (caller rank, call id) */
    uint32_t name;      /* interned */
    int32_t peer;       /* the other side's rank */
    int32_t err;
    int32_t tid;        /* the thread the slice belongs to */
    int32_t tid2;       /* ANSWER, LOST: the sender's thread (the async span's) */
    uint8_t kind;
};

struct sr_chunk {
    _Atomic(struct sr_chunk *) next; /* written once: release by the writer, acquire by the reader */
    _Atomic uint32_t n;     /* records written: release by the writer, acquire by the reader */
    struct sr_rec r[SR_TRACE_CHUNK];
};

struct sr_ttable {
    struct sr_ttable *next;    /* the list of every table; written before publication */
    _Atomic bool owned;        /* a live thread writes it */
    _Atomic uint32_t epoch;    /* the reset epoch its statistics belong to */
    pid_t tid;                 /* the owner's thread id (writer's) */
    _Atomic(struct sr_fn_block *) fn[SR_TRACE_FNS]; /* release by the writer when allocated */
    _Atomic(struct sr_chunk *) head; /* release by the writer when the first chunk is made */
    struct sr_chunk *tail;     /* writer only */
    uint64_t nrec;             /* writer only: records made, against the cap */
    _Atomic uint64_t dropped;  /* records refused at the cap (relaxed: a statistic) */
    struct sr_chunk *flushed;  /* reader (the trace writer, under its lock) only */
    uint32_t flushed_n;
};

/* This thread's table (adopted or made now), or NULL without memory. */
struct sr_ttable *sr__ttable(void);
/* Every table, for readers: the head of the list (acquire). */
struct sr_ttable *sr__ttables(void);
/* The statistics block of function id in this thread's table (made now). */
struct sr_fn_block *sr__fn_block(struct sr_ttable *t, uint32_t id);
/* The current reset epoch, and a reset. */
uint32_t sr__stats_epoch(void);
void sr__stats_bump_epoch(void);
/* Append a record to this thread's table (dropped at the cap). */
void sr__trace_add(struct sr_ttable *t, const struct sr_rec *r);
/* The cap on records per thread (SHMRPC_TRACE_MAX_EVENTS). */
extern uint64_t sr__trace_cap;

/* ---- the trace file (write.c, merge.c) ---- */
/* Write this worker's records since the last flush as the part file of
 * `path` for `rank` (merge.c names it). 0 or -errno. */
int sr__trace_write_part(const char *path, int rank, const char *worker);
/* The part file of rank r of path in buf. */
void sr__trace_part_name(const char *path, int r, char *buf, size_t len);
/* Merge the part files of ranks [0, world) into path (then remove them):
 * flows whose other end is missing (a crashed worker, a full buffer) are
 * left out. 0 or -errno (with sr_last_error); no part at all: -ENOENT. */
int sr__trace_merge(const char *path, int world);

#endif
