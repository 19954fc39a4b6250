/* SPDX-License-Identifier: MIT */
/* The profiler (internal): per-thread tables behind the probes of lib/rpc
 * (rpc/module.h, "Probes"), the statistics (shmrpc/stats.h) and the trace
 * (SHMRPC_TRACE, docs/PROFILING.md).
 *
 * Names (names.c). Function names are interned once into small ids
 * (SR_TRACE_FNS of them; later names share the last id, "(other)"). Lookups
 * take no lock; insertions serialise on a mutex.
 *
 * The record area (area.c). Everything the profiler records lives in one
 * area per process: the interned names, the thread tables, their statistics
 * blocks and trace chunks, all handed out by a bump allocator and never
 * freed, linked by offsets from the area's start (0: none), never by
 * pointers. A worker of shmrun or sr_spawn records into its slot of a memfd
 * that the launcher made before the fork (job.c), so that the launcher can
 * still read it after the worker died however it died; any other process
 * records into a private anonymous mapping of the same layout. The memory is
 * reserved, not committed: pages are touched as records arrive.
 *
 * Thread tables (tables.c). Every thread that records owns one table: its
 * per-function statistics (made the first time it records a function)
 * and its trace records (chunks of fixed records). It is the only writer of
 * both; readers (a snapshot, the trace writer, the launcher after the
 * worker's end) read without locks, as hist.h and the chunk counters say. A
 * table outlives its thread: when the thread exits, the table is released
 * and the next new thread adopts it, data and all, so the memory is bounded
 * by the most threads alive at once (and, for the trace, by the cap on
 * records and the area's size). A forked child starts with a new area
 * (tables.c, atfork_child).
 *
 * Resets. sr_stats_reset bumps the area's epoch; a writer that sees its
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
#include <stdio.h>
#include <sys/types.h>

#include "hist.h"
#include "trace_seam.h" /* sr__trace_job_end */

#define SR_TRACE_FNS 256
#define SR_TRACE_CHUNK 4096

/* ---- the record area (area.c) ---- */
#define SR_AREA_MAGIC 0x3241455241525453ull /* "STRAREA2" */
#define SR_AREA_SIZE ((uint64_t)1 << 30)    /* reserved per worker; touched as used */
#define SR_AREA_WORKER 128

/* flags: what the launcher does at the job's end (set before the fork), and
 * what the worker did (set by it) */
enum {
    SR_AREA_JOB_TRACE = 1,     /* the launcher writes the trace: the worker writes no part */
    SR_AREA_JOB_STATS = 2,     /* the launcher prints every worker's statistics, in rank order */
    SR_AREA_ATTACHED = 4,      /* a worker records here */
    SR_AREA_STATS_FINAL = 8,   /* the worker reached sr_shutdown: its statistics are complete */
    SR_AREA_JOB_REPLACES = 16, /* the job replaces ranks in place: the trace names each generation */
};

struct sr_area {
    uint64_t magic;            /* written before the fork, read-only after */
    uint64_t size;
    int32_t rank;              /* the slot's rank; -1: a private area */
    int32_t slot;              /* the slot: rank + world * generation (job.c); -1: a private area */
    uint32_t generation;       /* the generation of the rank that records here */
    int32_t pid;               /* the process recording here (its main thread's tid), written when it attaches */
    _Atomic uint32_t flags;    /* fetch_or by the worker; read by the launcher after the worker's end */
    _Atomic uint64_t used;     /* the bump allocator's end (relaxed: it publishes nothing) */
    _Atomic uint64_t tables;   /* the newest thread table: push-only list, release on push, acquire on read */
    _Atomic uint32_t epoch;    /* statistics reset epoch: release by a reset, acquire by readers */
    _Atomic uint32_t nnames;   /* interned names: release after name[n] is written */
    uint64_t name[SR_TRACE_FNS]; /* offsets of the names' text (NUL-terminated) */
    char worker[SR_AREA_WORKER]; /* the worker's name, written at sr_init, before ATTACHED */
};

#define SR_AT(a, off) ((void *)((char *)(a) + (off)))

/* This process's area, attached or made now (NULL: no memory). */
struct sr_area *sr__area(void);
/* Zeroed bytes from a (64-byte aligned), as an offset; 0 when it is full. */
uint64_t sr__area_alloc(struct sr_area *a, uint64_t bytes);
/* The text of name id in a, bounds-checked ("?" if bad), "(other)" for the last id. */
const char *sr__area_name(const struct sr_area *a, uint32_t id);
/* The object of `bytes` at off in a, or NULL if it does not fit (a reader's check). */
const void *sr__area_get(const struct sr_area *a, uint64_t off, uint64_t bytes);
/* A forked worker's area (job.c, sr_spawn's child): slot `slot` of the
 * memfd fd, attached at the next use. An exec'd worker finds it in
 * SHMRPC_TRACE_AREA ("fd:slot") instead. */
void sr__area_give(int fd, int slot);
/* Forget this process's area (a forked child, tables.c): the next use makes
 * a private one, or attaches the one sr__area_give names. */
void sr__area_forget(void);
/* The header of a worker's slot, written by the launcher before the fork
 * (a later generation's: by its process, before it attaches). */
void sr__area_init(struct sr_area *a, int rank, int slot, uint32_t generation, uint32_t flags);

/* ---- names ---- */
/* The id of name (interned now if new). */
uint32_t sr__trace_name_id(const char *name);
/* The name of id (valid for the process), or NULL past the interned ones. */
const char *sr__trace_name(uint32_t id);
uint32_t sr__trace_names(void);
/* A forked child: no name is interned. */
void sr__trace_names_forget(void);

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
    SR_REC_SPAN,     /* a module's phase, or a tensor op (X) */
    SR_REC_THREAD,   /* the thread's name (M thread_name): the first record of each thread in a table */
    SR_REC_COUNTER,  /* the worker's gauges at t0 (C events): t1 heap bytes, t2 inbox depth, flow calls in flight */
};

/* SR_REC_SPAN: peer of a tensor op's span (cat "op"); -1: a module's phase (cat "span"). */
#define SR_SPAN_OP (-2)

struct sr_rec {
    int64_t t0;         /* ns */
    union {
        struct {
            int64_t t1; /* ns; t1 == t0 for instants */
            int64_t t2; /* ANSWER, LOST: the call's start; RUN: the queue span's start */
        };
        char text[16];  /* THREAD: the thread's name (as prctl PR_GET_NAME gives it; NUL-terminated) */
    };
    uint64_t flow;      /* the call's flow id (caller rank, call id) */
    uint32_t name;      /* interned */
    int32_t peer;       /* the other side's rank */
    int32_t err;
    int32_t tid;        /* the thread the slice belongs to */
    int32_t tid2;       /* ANSWER, LOST: the sender's thread (the async span's) */
    uint8_t kind;
};

/* In the area. */
struct sr_chunk {
    _Atomic uint64_t next;  /* offset, written once: release by the writer, acquire by the reader */
    _Atomic uint32_t n;     /* records written: release by the writer, acquire by the reader */
    struct sr_rec r[SR_TRACE_CHUNK];
};

/* In the area. */
struct sr_ttable {
    _Atomic uint64_t next;     /* offset of the next table in the list; written before publication */
    _Atomic bool owned;        /* a live thread writes it */
    _Atomic uint32_t epoch;    /* the reset epoch its statistics belong to */
    int32_t tid;               /* the owner's thread id (writer's) */
    _Atomic uint64_t fn[SR_TRACE_FNS]; /* offsets of the blocks: release by the writer when made */
    _Atomic uint64_t head;     /* offset of the first chunk: release by the writer when made */
    struct sr_chunk *tail;     /* writer only (a pointer of the writer's process) */
    uint64_t nrec;             /* writer only: records made, against the cap */
    bool named;                /* writer only: the owner's THREAD record is made (cleared at adoption) */
    _Atomic uint64_t dropped;  /* records refused at the cap or with the area full (relaxed: a statistic) */
};

/* This thread's table (adopted or made now), or NULL without memory. */
struct sr_ttable *sr__ttable(void);
/* The statistics block of function id in this thread's table (made now). */
struct sr_fn_block *sr__fn_block(struct sr_ttable *t, uint32_t id);
/* The current reset epoch, and a reset. */
uint32_t sr__stats_epoch(void);
void sr__stats_bump_epoch(void);
/* Append a record to this thread's table (dropped at the cap). */
void sr__trace_add(struct sr_ttable *t, const struct sr_rec *r);
/* The cap on records per thread (SHMRPC_TRACE_MAX_EVENTS). */
extern uint64_t sr__trace_cap;

/* Readers of an area (this process's, or a worker's after its end): the
 * tables in order, NULL after the last; every offset is bounds-checked. */
const struct sr_ttable *sr__area_tables(const struct sr_area *a);
const struct sr_ttable *sr__area_next(const struct sr_area *a, const struct sr_ttable *t);

/* ---- statistics of an area (stats.c) ---- */
struct sr_stats;
/* A snapshot of a's statistics; its names point into a. 0 or -ENOMEM. */
int sr__stats_of(const struct sr_area *a, struct sr_stats **out);
/* The range of p50, p99 and max in the tables to print together: each
 * latency column is printed in one unit, chosen for its range. Start from
 * SR_STATS_COLS_EMPTY. */
struct sr_stats_cols {
    uint64_t min_ns[3], max_ns[3];
};
#define SR_STATS_COLS_EMPTY {{UINT64_MAX, UINT64_MAX, UINT64_MAX}, {0, 0, 0}}
void sr__stats_widen(const struct sr_stats *s, struct sr_stats_cols *c);
/* sr_stats_print with the columns' units chosen from c. */
int sr__stats_print_cols(const struct sr_stats *s, const char *who, const struct sr_stats_cols *c, FILE *f);

/* ---- the trace file (write.c, merge.c) ---- */
/* Write every record of area a as part file `part` of `path` (merge.c
 * names it), as the trace's process `part` (a rank, or a later generation's
 * slot). who: the function for the error. 0 or -errno. */
int sr__trace_write_part(const struct sr_area *a, const char *path, int part, const char *who);
/* The part file r of path in buf. */
void sr__trace_part_name(const char *path, int r, char *buf, size_t len);
/* Merge the part files [0, parts) of a job of `world` workers into path
 * (then remove them): flows whose other end is missing (a crashed worker, a
 * full buffer) are left out. 0 or -errno (with sr_last_error); no part at
 * all: -ENOENT. */
int sr__trace_merge(const char *path, int world, int parts);

#endif
