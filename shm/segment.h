/* SPDX-License-Identifier: MIT */
/* The shared-memory segment: one memfd, mapped by every worker of a job.
 *
 * Layout (offsets from the segment base; the base differs per process, so
 * nothing in the segment ever holds a pointer):
 *
 *   0                 struct sr_seg_header            (SR_SEG_HEADER_SIZE)
 *   table_off         world_size x struct sr_worker_info
 *   inbox_off         world_size x inbox ring          (inbox_stride each)
 *   heap_off          heap_areas x heap area            (heap_stride each)
 *   area_off          heap_areas x struct sr_heap_area_info (area_stride each)
 *
 * Heap areas are not ranks: there are heap_areas = world_size + spares of
 * them, and the area table says who owns each (heap.h, "Areas"). Rank r
 * takes area r at its first attach; a process that replaces a dead one (a
 * new generation of its rank) takes a FREE area, most often a spare.
 *
 * Lifetime: the creator (shmrun, sr_spawn, or a host's lowest MPI rank)
 * makes the memfd and writes the header and the creator-owned fields of the
 * worker table before any worker starts; after that the header's first lines
 * are read-only. The memory is freed by the kernel when the last process
 * holding the fd or a mapping goes, so no file is ever left behind.
 *
 * Partial attach (MPI, lib/transport/mpi/mpi_job.h): a segment is laid out for the
 * whole world, but only the ranks of one host attach to it. The creator marks
 * each worker line (attaches = 1 for this host's ranks) and writes their
 * count in the header; the start barrier counts those ranks only, and the
 * lines of the others stay empty (their names and liveness come from the MPI
 * transport). When every rank attaches (shmrun, sr_spawn) nothing differs.
 */
#ifndef SR_SHM_SEGMENT_H
#define SR_SHM_SEGMENT_H

#if !defined(SR__SEES_SHM)
#error "segment.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"

#define SR_SEG_MAGIC UINT64_C(0x0143505252484d53) /* "SHMRRPC\1", little-endian */
#define SR_SEG_LAYOUT_FORMAT 10u                  /* bump when any offset below changes (2: remote_free;
                                                     3: ring space_ranks, worker space_kick; 4: exit lines;
                                                     5: crash lines; 6: attaching count, attaches flags;
                                                     7: flags, generations, heap areas apart from ranks,
                                                     the area table; 8: the area's foreign count and
                                                     its owner's table of held references; 9: launched,
                                                     elastic jobs' free ranks and leaves; 10: the
                                                     worker's counters) */
#define SR_SEG_VERSION 1u                         /* bump when the protocol changes */
#define SR_SEG_HEADER_SIZE 4096u
#define SR_MAX_WORKERS 4096                       /* RRef ids carry a 16-bit worker id */
#define SR_NAME_MAX 128                           /* worker names: < 128 bytes, like PyTorch */
#define SR_HEAP_ALIGN (2u << 20)
#define SR_HEAP_MIN (4u << 20)                    /* smallest per-worker heap accepted */
#define SR_HEAP_DEFAULT (UINT64_C(1) << 30)       /* per worker; memfd pages cost nothing until touched */
#define SR_HEAP_SPARES_DEFAULT_MAX 64u             /* default spares: world_size, at most this; and a replace
                                                     job's: max_restarts, at most this (sr__seg_replace_spares) */
#define SR_RING_SLOTS_DEFAULT 1024u
#define SR_CRASH_FN_MAX 64u                       /* function names are < 64 bytes (rpc/registry.h) */

enum sr_worker_state {
    SR_WORKER_EMPTY = 0,    /* slot written by the creator only */
    SR_WORKER_ATTACHED = 1, /* the worker has attached and set its fields */
    SR_WORKER_DETACHED = 2, /* the worker detached after a graceful shutdown */
    SR_WORKER_LEFT = 3,     /* the worker detached without one (sr_shutdown(false), a failed init) */
    SR_WORKER_CLOSING = 4,  /* attached, inside a graceful shutdown (for reports: it came to sr_shutdown) */
    SR_WORKER_TIMED_OUT = 5, /* the worker detached after its graceful shutdown timed out: it came, gave up
                                waiting, and left; no death (peers' shutdowns time out too, lib/rpc/shutdown.c) */
    SR_WORKER_LEAVING = 6,  /* elastic job: attached, leaving the job (peers start no new call to it) */
    SR_WORKER_LEFT_JOB = 7, /* elastic job: the worker detached after it left the job (sr_shutdown) */
};
/* Attached: its inbox is served (ATTACHED, CLOSING or LEAVING). */
static inline bool sr__worker_state_attached(uint32_t st)
{
    return st == SR_WORKER_ATTACHED || st == SR_WORKER_CLOSING || st == SR_WORKER_LEAVING;
}
/* Detached, its process maybe still running: in an elastic job its peers
 * take it as gone from then on (see "Elastic jobs" below). */
static inline bool sr__worker_state_detached(uint32_t st)
{
    return st == SR_WORKER_DETACHED || st == SR_WORKER_LEFT || st == SR_WORKER_TIMED_OUT || st == SR_WORKER_LEFT_JOB;
}

/* Peer exit (ordering contract). The supervisor (shmrun or sr_spawn: the
 * parent of every worker) reaps each worker and publishes how it ended:
 *   X1 store exit_code, exit_status, exit_seq (plain); seq_cst store exited = 1
 *   X2 seq_cst increment of header.exits
 *   X3 unless the worker had detached gracefully and the job goes on: ring
 *      every attached worker's doorbell (its D3 fence) and FUTEX_WAKE
 *      header.attached (workers still in the start barrier)
 * A worker reads header.exits (seq_cst or acquire, pairs with X2), then the
 * exited words of the ranks it has not handled yet. A sleeper re-checks
 * header.exits after announcing SLEEPING (its D2 fence), so X3 never finds
 * it asleep without a wake. The worker's own table fields (state, pid) were
 * written before its process ended, so they are visible to whoever sees
 * exited = 1 (waitid, then X1, orders them). seq_cst on X1 pairs with the
 * seq_cst check of a sender (sr_xport_send) and the call table's generation
 * bump: a call either sees the exit at send time or is seen by the scan
 * that fails the calls to the departed peer. */

/* Replacement in place (header.flags & SR_SEG_F_REPLACE: shmrun --restart
 * rank, sr_spawn's restart option). A rank whose process failed gets a new
 * process, a new generation of the rank, while the others keep running:
 *   R1 the supervisor reaps the dead process and publishes its exit (X1-X3):
 *      the survivors fail what was in flight with it, as for any exit;
 *   R2 it readies the rank's line for the next process: crashed = 0, state =
 *      EMPTY, then a seq_cst store of generation + 1, then a seq_cst store
 *      of exited = 0 (a survivor that reads exited = 0 and the old
 *      generation saw the line before the death; one that reads the new
 *      generation knows the old one is gone, whatever exited says);
 *   R3 it forks the new process, which attaches without the start barrier
 *      (its peers are past it), publishes its line as any worker does (pid,
 *      doorbell kind, name, then a release store of ATTACHED), then
 *      increments header.exits (seq_cst, as X2: the word every sleeper
 *      re-checks) and rings every attached worker's doorbell (as X3).
 * A survivor that sees header.exits move scans the lines: a rank whose
 * generation differs from the one it knows has died (handled once) and,
 * once its line says ATTACHED, has come back (its peer is resolved again).
 * Messages carry the generations of their sender and destination (sr_msg
 * gens, modulo 16); the layer above refuses one whose stamps do not match
 * the generations it knows, so nothing of a dead generation is ever taken
 * for the new one's, nor anything meant for it delivered to its successor.
 * A rank is replaced only once every worker has attached, and only if it
 * had not entered sr_shutdown itself (it may have arrived at the shutdown
 * barrier) nor, for rank 0, the leader of that barrier, had any other; a
 * death outside those times restarts the whole job, from the same budget
 * (lib/job/job.h, "Restarts"). */
#define SR_SEG_F_REPLACE 0x1u

/* Elastic jobs (header.flags & SR_SEG_F_ELASTIC: shmrun --max-workers,
 * sr_spawn's max_workers). The segment is laid out for world_size ranks,
 * header.launched of them (0..launched-1) start with the job, the others
 * are free. Workers behave as in a job that replaces ranks (messages carry
 * generations, a rank that comes back is taken again), and:
 *   E1 the creator writes each free rank's line as an exit (exit_code
 *      SR_EXIT_FREE, exited = 1) and counts them in header.exits before any
 *      worker starts; the start barrier counts the launched ranks only and
 *      never takes a free rank's exit for a failure;
 *   E2 a worker that leaves (sr_shutdown(graceful=true)) stores LEAVING
 *      (seq_cst) in its state before it counts what its peers sent it; a
 *      peer starting a call counts it (seq_cst add) before it loads the
 *      destination's state (seq_cst), and fails the call at once if it
 *      reads LEAVING or a detached state: either the leaver's count holds
 *      the call, or the caller saw it leaving (lib/rpc/leave.c);
 *   E3 any worker that detaches (after a leave: LEFT_JOB; or any other way)
 *      stores its state (release), then increments header.exits (seq_cst,
 *      as X2) and rings every attached peer's doorbell: from then on peers
 *      take it as gone, before the supervisor reaps its process;
 *   E4 the supervisor publishes its exit later (X1, X2): a rank whose
 *      process ended is free, and a worker that joins the job gets the
 *      lowest free one (or the one it asks for) as a new generation (R2,
 *      R3: readied, forked, attached without the start barrier). Its name
 *      may differ from its predecessor's: peers read it again at its return.
 * A leaver's exit with status 0 is no failure; any other failure ends the
 * job as in any job (or replaces the rank, with SR_SEG_F_REPLACE too). */
#define SR_SEG_F_ELASTIC 0x2u

/* exit_code of an exit published by a peer from its pidfd (no supervisor:
 * mpirun, lib/transport/shm/orphan.c): the process ended, its status is the launcher's. */
#define SR_EXIT_SEEN 0
/* exit_code of a free rank of an elastic job that no process has held yet (E1). */
#define SR_EXIT_FREE 100

struct sr_seg_header {
    /* Lines 0-2: written once by the creator before any worker starts; read-only after. */
    uint64_t magic;
    uint32_t layout_format;
    uint32_t version;
    uint32_t world_size;
    uint32_t ring_slots;    /* per inbox, a power of two */
    uint64_t seg_size;
    uint64_t table_off, table_stride;
    uint64_t inbox_off, inbox_stride;
    uint64_t heap_off, heap_stride;
    char name[48];          /* memfd name, for reports */
    uint32_t attaching;     /* ranks that attach here (lines with attaches = 1): world_size unless partial */
    uint32_t flags;         /* SR_SEG_F_*: the job's policies */
    uint32_t heap_areas;    /* world_size + spares: heap areas, and lines of the area table */
    uint32_t launched;      /* ranks started with the job: world_size, or fewer in an elastic job (E1) */
    uint64_t area_off, area_stride; /* the area table (struct sr_heap_area_info), after the heap areas */

    /* Line 3: written by every worker with atomic read-modify-writes. */
    _Atomic uint32_t attached SR_ALIGNED_LINE; /* workers past attach; futex word of the start barrier */

    /* Line 4: written by the supervisor only (see "Peer exit" above). */
    _Atomic uint32_t exits SR_ALIGNED_LINE;    /* workers whose exit was published (a generation) */
};
static_assert(sizeof(struct sr_seg_header) <= SR_SEG_HEADER_SIZE, "header fits its page");
static_assert(offsetof(struct sr_seg_header, attached) % SR_CACHELINE == 0, "shared counters on their own line");
static_assert(offsetof(struct sr_seg_header, exits) % SR_CACHELINE == 0, "the supervisor's counter on its own line");

/* A worker's running counters, in its line of the worker table: what the
 * launcher's live view shows (shmrun --monitor, docs/LAUNCHER.md) and the
 * profiler's counter tracks read (docs/PROFILING.md). Written only by the
 * worker's own process (lib/rpc), which zeroes them at sr_init (a rank's
 * next generation starts from zero), with relaxed read-modify-writes by
 * whichever of its threads counts, as it counted its calls in flight before
 * they were published here: no read-modify-write more than that per call.
 * Read by anyone with relaxed loads: each is a statistic, nothing is
 * published with it, and a reader takes in flight = made - ended (never
 * below 0: the two loads are not one snapshot). */
struct sr_worker_counters {
    _Atomic uint64_t calls_made;  /* calls this worker started (its threads, at the call's start) */
    _Atomic uint64_t calls_ended; /* those that ended: answered, failed, timed out, their peer gone */
    _Atomic uint64_t served_in;   /* requests it took to serve (the polling thread that decoded them) */
    _Atomic uint64_t served_out;  /* those it answered (the thread that finished them) */
    /* The worker's heap in use, bytes (sr__heap_allocated), sampled only
     * while SHMRPC_MONITOR_INTERVAL is set (shmrun --monitor): at most once
     * per interval, by a thread that starts or serves a call then (the one
     * that wins the agent's sample time, so one writer at a time). */
    _Atomic uint64_t heap_bytes;
};

struct sr_worker_info {
    /* Line 0: written by the creator before the worker starts; read-only after. */
    int32_t eventfd;        /* doorbell for the eventfd fallback (inherited fd number) */
    uint32_t rank;
    uint32_t attaches;      /* 1: this rank attaches to this segment; 0: it lives on another host */

    /* Line 1: written by the worker itself during attach, before its release
     * increment of header.attached; read by peers after their acquire of it. */
    int32_t pid SR_ALIGNED_LINE;
    uint32_t doorbell_kind; /* enum sr_doorbell_kind */
    _Atomic uint32_t state; /* enum sr_worker_state; written by the worker */
    char name[SR_NAME_MAX];

    /* Own line: the doorbell word. Written by the worker (announces SLEEPING,
     * clears to AWAKE) and by producers (exchange SLEEPING -> AWAKE). */
    _Atomic uint32_t doorbell SR_ALIGNED_LINE;
    /* Space event: set to 1 (release) by the consumer of an inbox this worker
     * waits to send into, after freeing slots and before ringing the doorbell
     * (ring.h W2, doorbell.h D3); exchanged to 0 (acquire) by this worker,
     * which then retries its queued messages. Read after D2 by a thread about
     * to sleep, so a kick is never lost (xport.h, space events). */
    _Atomic uint32_t space_kick;

    /* Own line: written by the supervisor once, after it reaped the worker's
     * process (X1 above); read by peers. */
    _Atomic uint32_t exited SR_ALIGNED_LINE; /* 0: running (or never started); 1: ended */
    int32_t exit_code;      /* siginfo si_code: CLD_EXITED, CLD_KILLED, CLD_DUMPED; SR_EXIT_SEEN */
    int32_t exit_status;    /* the exit status, or the signal */
    uint32_t exit_seq;      /* 1 for the job's first published exit, 2 for the next...: the order of departures */
    /* The rank's generation: 0 for the process the job started with, then
     * one more for each replacement (R2 above). Written by the supervisor
     * only while no process of the rank runs; read by the rank's new
     * process at attach and by peers after a load of header.exits. */
    _Atomic uint32_t generation;

    /* Own line: the call the worker was serving when it died of a fatal
     * signal (crash.h). Written once, by the worker's signal handler, just
     * before its process ends: crash_fn and crash_caller, then crashed = 1
     * (release). Read by the supervisor after it reaped the process (waitid
     * orders the worker's stores before it), and validated: a worker that
     * scribbled here gets its text refused, never read past its bounds. */
    _Atomic uint32_t crashed SR_ALIGNED_LINE; /* 0: no report; 1: the fields below are set */
    int32_t crash_caller;   /* rank of the caller of the call being served */
    char crash_fn[SR_CRASH_FN_MAX]; /* its function's name, NUL-terminated */

    /* Own line: the worker's counters (struct sr_worker_counters above). */
    struct sr_worker_counters counters SR_ALIGNED_LINE;
};
static_assert(offsetof(struct sr_worker_info, pid) == SR_CACHELINE, "worker line");
static_assert(offsetof(struct sr_worker_info, doorbell) % SR_CACHELINE == 0, "doorbell on its own line");
static_assert(offsetof(struct sr_worker_info, exited) % SR_CACHELINE == 0, "exit line on its own line");
static_assert(offsetof(struct sr_worker_info, crashed) % SR_CACHELINE == 0, "crash line on its own line");
static_assert(offsetof(struct sr_worker_info, counters) % SR_CACHELINE == 0, "counters on their own line");

/* One line of the area table per heap area (heap.h, "Areas"). */
enum sr_heap_area_state {
    SR_AREA_FREE = 0,        /* nobody's: holds no live block, reads as zero; taken by CAS at attach */
    SR_AREA_OWNED = 1,       /* a process allocates from it (its rank and generation in the word) */
    SR_AREA_QUARANTINED = 2, /* its owner died or left while blocks may still be held: they stay
                                valid and readable, nobody allocates or drains */
    SR_AREA_RECLAIMING = 3,  /* being emptied on its way back to FREE (sr__heap_area_reclaim) */
    SR_AREA_QUARANTINING = 4, /* its owner died: what it held of other areas is being let go (one
                                 process walks its table), then QUARANTINED */
};
/* The state word: state | rank << 8 | generation << 32. */
static inline uint64_t sr__area_word(uint32_t state, uint32_t rank, uint32_t gen)
{
    return (uint64_t)state | (uint64_t)(rank & 0xffffffu) << 8 | (uint64_t)gen << 32;
}
static inline uint32_t sr__area_word_state(uint64_t w) { return (uint32_t)(w & 0xff); }
static inline uint32_t sr__area_word_rank(uint64_t w) { return (uint32_t)(w >> 8) & 0xffffffu; }
static inline uint32_t sr__area_word_gen(uint64_t w) { return (uint32_t)(w >> 32); }

struct sr_heap_area_info {
    /* Own line: the state word (above). Zero (FREE) from the creator.
     * Changed only by compare-and-swap (acq_rel), by: the attaching process
     * (FREE -> OWNED), its owner at detach (OWNED -> FREE when none of its
     * blocks is live, else -> QUARANTINED), whoever handles a death
     * (OWNED -> QUARANTINED, sr__heap_area_quarantine), and a reclaimer
     * (QUARANTINED -> RECLAIMING, then a release store of FREE). Read by anyone. */
    _Atomic uint64_t state SR_ALIGNED_LINE;
    /* Own line: head of the area's remote-free list (segment offset of the
     * first block, 0 = empty). Pushed by any process that drops the last
     * reference to a block of the area it does not own (release CAS), taken
     * whole by the area's owner process (acquire exchange); reset by the
     * attaching process and by a reclaimer (no pusher can exist then). See heap.c. */
    _Atomic uint64_t remote_free SR_ALIGNED_LINE;
    /* Own line: references to the area's blocks held by processes other
     * than its owner, or inside messages (heap.c, "Who holds what"). Added
     * to and subtracted from by any process where a reference crosses the
     * owner's boundary; zero from the creator, reset by the attaching process.
     * Once the owner is dead, zero means no living process and no message
     * holds a block of the area: it is reclaimed. The owner's table of the
     * references it holds to other areas' blocks lies at the end of its
     * heap area (SR_HEAP_HELD_BYTES, heap.h). */
    _Atomic uint64_t foreign SR_ALIGNED_LINE;
};
static_assert(offsetof(struct sr_heap_area_info, remote_free) % SR_CACHELINE == 0, "remote-free head on its own line");
static_assert(offsetof(struct sr_heap_area_info, foreign) % SR_CACHELINE == 0, "foreign count on its own line");

/* The spare heap areas of a job that may replace ranks max_restarts times:
 * one per area quarantined at the same time, not one per replacement, since
 * a dead process's area is reclaimed once no survivor holds its blocks
 * (heap.h, "Areas"): min(max_restarts, SR_HEAP_SPARES_DEFAULT_MAX), at
 * least 1 for a positive max_restarts. */
static inline int sr__seg_replace_spares(int max_restarts)
{
    return max_restarts < (int)SR_HEAP_SPARES_DEFAULT_MAX ? max_restarts : (int)SR_HEAP_SPARES_DEFAULT_MAX;
}

typedef struct sr_segment_opts {
    int world_size;         /* 1..SR_MAX_WORKERS */
    uint64_t size;          /* total bytes; 0: SR_HEAP_DEFAULT per worker plus the fixed parts */
    uint32_t ring_slots;    /* 0: SR_RING_SLOTS_DEFAULT; else a power of two >= 2 */
    const char *name;       /* memfd name, "shmrpc" if NULL */
    const uint8_t *attaching; /* [world_size], nonzero: that rank attaches here; NULL: every rank
                                 (at least one must; the caller keeps it until create returns) */
    uint32_t flags;         /* SR_SEG_F_*: written to the header */
    int launched;           /* SR_SEG_F_ELASTIC: ranks started with the job, 1..world_size (the others
                               are free, E1); 0: world_size */
    int heap_spares;        /* heap areas beyond one per rank, for replacement processes (heap.h);
                               0: min(world_size, SR_HEAP_SPARES_DEFAULT_MAX); < 0: none. They come
                               on top of size, heap_stride bytes each (untouched pages cost nothing) */
} sr_segment_opts;

/* A process's view of a segment. The geometry below is copied from the
 * header when it is created or attached: attach reads the header's creator
 * lines once, validates that copy and takes the geometry from it. Only this
 * private copy is used to find the table, the inboxes and the heaps, to
 * read the job's policies and to name the segment: a peer that scribbles
 * on the header later cannot move them, nor unterminate the name. */
typedef struct sr_segment {
    int fd;
    void *base;
    size_t size;
    struct sr_seg_header *hdr;
    uint32_t world, ring_slots;
    uint32_t attaching;     /* ranks that attach (validated against the flags at attach) */
    uint32_t launched;      /* ranks started with the job (E1); the start barrier counts them */
    uint64_t ino;           /* the memfd's inode: tells segments apart (xport.c, start barrier) */
    uint64_t table_off, table_stride, inbox_off, inbox_stride, heap_off, heap_stride;
    uint32_t heap_areas;
    uint64_t area_off, area_stride;
    uint32_t flags;         /* SR_SEG_F_*: the job's policies */
    char name[sizeof(((struct sr_seg_header *)0)->name) + 1]; /* the memfd's name, NUL-terminated */
} sr_segment;

/* Bytes needed for the header, table and inboxes of n workers. */
uint64_t sr__segment_fixed_size(int world_size, uint32_t ring_slots);

/* A descriptor that a launcher holds while it sets up a worker's standard
 * fds must not be one of them: a launcher started with 0-2 closed gets its
 * first descriptors there, and the worker's stdin, stdout or stderr would be
 * copied over them. Returns fd itself when above 2 (or < 0); else a
 * close-on-exec copy above 2, closing fd; -errno (the error names `who`). */
int sr__fd_above_stdio(int fd, const char *who);

/* Create a segment (memfd, close-on-exec, above fd 2, mode 0600,
 * size bytes for the fixed parts and one heap area per rank, plus the spare
 * areas and the area table on top,
 * exec-sealed where the kernel has MFD_NOEXEC_SEAL; sealed against resizing) and write
 * its header. Errors: -EINVAL bad world size, ring size or a size too small
 * for world_size; -ENOMEM and other -errno from memfd_create/ftruncate/mmap. */
int sr__segment_create(const sr_segment_opts *o, sr_segment *seg);

/* Map an existing segment from fd and validate its header. Takes no
 * ownership of fd. Errors: -EPROTO wrong magic, layout format or version;
 * -EINVAL inconsistent sizes; other -errno from fstat/mmap. */
int sr__segment_attach(int fd, sr_segment *seg);

/* Does `rank` attach to this segment (its line's attaches flag)? False for a
 * rank out of range. The flags are the creator's and read-only after
 * creation; sr__segment_attach checked them against the count. A transport
 * that must not trust later scribbles keeps its own copy (xport.c). */
bool sr__seg_attaches(const sr_segment *s, int rank);

/* Unmap; closes fd only if close_fd. */
void sr__segment_detach(sr_segment *seg, bool close_fd);

/* rank: in [0, s->world) (the callers check it). */
static inline struct sr_worker_info *sr__seg_worker(const sr_segment *s, int rank)
{
    return (struct sr_worker_info *)((char *)s->base + s->table_off + (uint64_t)rank * s->table_stride);
}

static inline void *sr__seg_inbox(const sr_segment *s, int rank)
{
    return (char *)s->base + s->inbox_off + (uint64_t)rank * s->inbox_stride;
}

/* Heap area a: rank r's first area is area r. a in [0, s->heap_areas). */
static inline void *sr__seg_heap(const sr_segment *s, int a)
{
    return (char *)s->base + s->heap_off + (uint64_t)a * s->heap_stride;
}

static inline struct sr_heap_area_info *sr__seg_area(const sr_segment *s, int a)
{
    return (struct sr_heap_area_info *)((char *)s->base + s->area_off + (uint64_t)a * s->area_stride);
}

static inline uint64_t sr__seg_off(const sr_segment *s, const void *p)
{
    return (uint64_t)((const char *)p - (const char *)s->base);
}

static inline void *sr__seg_ptr(const sr_segment *s, uint64_t off)
{
    return (char *)s->base + off;
}

/* How worker w ended, for error messages: "exited with status 0 without
 * sr_shutdown", "was killed by signal SIGKILL", "exited with status 3 before
 * attaching", "exited with status 0 after sr_shutdown". Only meaningful once
 * w->exited reads 1. Returns buf. */
const char *sr__seg_exit_text(const struct sr_worker_info *w, char *buf, size_t len);
/* how: a siginfo si_code (CLD_EXITED, CLD_KILLED, CLD_DUMPED); status: the
 * exit status or the signal. "exited with status N", "was killed by signal
 * SIGX (core dumped)". */
const char *sr__exit_describe(int how, int status, char *buf, size_t len);
/* " while serving 'train_step' from worker0" when rank's worker died of a
 * fatal signal while it ran a call (crash.h), else "". Only meaningful after
 * the worker's process was reaped. The fields are validated (the name's
 * bound and characters, the caller's rank and name). Returns buf. */
const char *sr__seg_crash_text(const sr_segment *s, int rank, char *buf, size_t len);

/* How a worker finds its segment: sr_spawn children get it from a
 * process-global set after fork; shmrun children from SHMRPC_FD,
 * SHMRPC_RANK and SHMRPC_WORLD_SIZE. */
struct sr_launch_env {
    int fd, rank, world_size;
};
void sr__launch_env_set(const struct sr_launch_env *e);
/* Forget what sr__launch_env_set set (the MPI bootstrap's segment is gone
 * after sr_shutdown: the next sr_init boots anew). */
void sr__launch_env_clear(void);
/* 0, or -ENOENT when not launched by shmrun/sr_spawn, -EINVAL on a bad variable. */
int sr__launch_env_get(struct sr_launch_env *e);

#endif
