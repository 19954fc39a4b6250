/* SPDX-License-Identifier: MIT */
/* Segment creation, attach and header validation. See segment.h. */
#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "parse.h"
#include "ring.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

static_assert(SR_MAX_WORKERS <= SR_RING_MAX_PRODUCERS, "every rank has a space-waiter bit in each ring");

static uint64_t table_stride(void) { return ALIGN_UP(sizeof(struct sr_worker_info), SR_CACHELINE); }
static uint64_t inbox_stride(uint32_t slots) { return ALIGN_UP(sr__ring_bytes(slots), 4096); }

uint64_t sr__segment_fixed_size(int n, uint32_t slots)
{
    uint64_t table = SR_SEG_HEADER_SIZE + (uint64_t)n * table_stride();
    uint64_t inbox = ALIGN_UP(table, 4096) + (uint64_t)n * inbox_stride(slots);
    return ALIGN_UP(inbox, SR_HEAP_ALIGN);
}

static uint64_t area_stride(void) { return ALIGN_UP(sizeof(struct sr_heap_area_info), SR_CACHELINE); }

static uint32_t spares_of(const sr_segment_opts *o)
{
    if (o->heap_spares < 0)
        return 0;
    if (o->heap_spares > 0)
        return (uint32_t)o->heap_spares;
    return (uint32_t)o->world_size < SR_HEAP_SPARES_DEFAULT_MAX ? (uint32_t)o->world_size : SR_HEAP_SPARES_DEFAULT_MAX;
}

/* The geometry of the heap areas and their table for a segment whose fixed
 * parts and per-rank heaps take size bytes (the spares come on top). */
struct heap_geometry {
    uint64_t heap_off, heap_stride, area_off, file_size;
    uint32_t areas;
};

static struct heap_geometry heap_geometry(const sr_segment_opts *o, uint32_t slots, uint64_t size)
{
    struct heap_geometry g = {.heap_off = sr__segment_fixed_size(o->world_size, slots)};
    g.heap_stride = (size - g.heap_off) / (uint64_t)o->world_size / SR_HEAP_ALIGN * SR_HEAP_ALIGN;
    g.areas = (uint32_t)o->world_size + spares_of(o);
    g.area_off = g.heap_off + (uint64_t)g.areas * g.heap_stride;
    g.file_size = g.area_off + ALIGN_UP((uint64_t)g.areas * area_stride(), 4096);
    return g;
}

static int check_opts(const sr_segment_opts *o, uint32_t slots, uint64_t *size)
{
    if (o->world_size < 1 || o->world_size > SR_MAX_WORKERS)
        return sr__fail(-EINVAL, "sr__segment_create", "world size %d is out of range [1, %d]",
                        o->world_size, SR_MAX_WORKERS);
    if (slots < 2 || (slots & (slots - 1)) || slots > (1u << 24))
        return sr__fail(-EINVAL, "sr__segment_create",
                        "ring size %u is not a power of two in [2, 2^24]", slots);
    uint64_t fixed = sr__segment_fixed_size(o->world_size, slots);
    uint64_t need = fixed + (uint64_t)o->world_size * SR_HEAP_MIN;
    *size = o->size ? o->size : fixed + (uint64_t)o->world_size * SR_HEAP_DEFAULT;
    if (*size < need)
        return sr__fail(-EINVAL, "sr__segment_create",
                        "size %llu bytes is too small for %d workers (need at least %llu: %llu fixed + %u MiB of heap each)",
                        (unsigned long long)*size, o->world_size, (unsigned long long)need,
                        (unsigned long long)fixed, SR_HEAP_MIN >> 20);
    if (o->heap_spares > SR_MAX_WORKERS)
        return sr__fail(-EINVAL, "sr__segment_create", "%d spare heap areas is out of range [0, %d]",
                        o->heap_spares, SR_MAX_WORKERS);
    /* the spares come on top of size: the whole file must stay addressable */
    if ((*size - fixed) / (uint64_t)o->world_size > (UINT64_MAX / 4) / ((uint64_t)o->world_size + spares_of(o)))
        return sr__fail(-EINVAL, "sr__segment_create", "size %llu bytes with %u spare heap areas of %llu bytes "
                        "overflows", (unsigned long long)*size, spares_of(o),
                        (unsigned long long)((*size - fixed) / (uint64_t)o->world_size));
    if (o->flags & SR_SEG_F_ELASTIC) {
        if (o->launched < 0 || o->launched > o->world_size || o->attaching)
            return sr__fail(-EINVAL, "sr__segment_create", "elastic segment '%s': %d ranks launched of %d (want "
                            "1..%d, every rank attaching)", o->name ? o->name : "shmrpc", o->launched,
                            o->world_size, o->world_size);
    } else if (o->launched && o->launched != o->world_size) {
        return sr__fail(-EINVAL, "sr__segment_create", "segment '%s': %d ranks launched of %d, but the job is not "
                        "elastic", o->name ? o->name : "shmrpc", o->launched, o->world_size);
    }
    if (o->attaching) {
        int n = 0;
        for (int r = 0; r < o->world_size; r++)
            n += o->attaching[r] != 0;
        if (n == 0)
            return sr__fail(-EINVAL, "sr__segment_create", "no rank of %d attaches to segment '%s'",
                            o->world_size, o->name ? o->name : "shmrpc");
    }
    return 0;
}

/* The private copy of the geometry (segment.h), from a validated header:
 * the creator's copy (create) or the one attach read once and validated. */
static void take_geometry(sr_segment *seg, const struct sr_seg_header *h)
{
    seg->world = h->world_size;
    seg->ring_slots = h->ring_slots;
    seg->attaching = h->attaching;
    seg->launched = h->launched;
    seg->table_off = h->table_off;
    seg->table_stride = h->table_stride;
    seg->inbox_off = h->inbox_off;
    seg->inbox_stride = h->inbox_stride;
    seg->heap_off = h->heap_off;
    seg->heap_stride = h->heap_stride;
    seg->heap_areas = h->heap_areas;
    seg->area_off = h->area_off;
    seg->area_stride = h->area_stride;
    seg->flags = h->flags;
    snprintf(seg->name, sizeof(seg->name), "%.*s", (int)sizeof(h->name), h->name);
}

/* E1 (segment.h, "Elastic jobs"): a rank no process holds reads as one
 * whose process ended. relaxed: workers start after the creator returns. */
static void free_rank(struct sr_seg_header *h, struct sr_worker_info *w)
{
    w->exit_code = SR_EXIT_FREE;
    w->exit_status = 0;
    w->exit_seq = 0;
    atomic_store_explicit(&w->exited, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->exits, 1, memory_order_relaxed);
}

static void write_header(sr_segment *seg, const sr_segment_opts *o, uint32_t slots, const char *name,
                         const struct heap_geometry *g)
{
    struct sr_seg_header *h = seg->hdr;
    int n = o->world_size;
    h->magic = SR_SEG_MAGIC;
    h->layout_format = SR_SEG_LAYOUT_FORMAT;
    h->version = SR_SEG_VERSION;
    h->world_size = (uint32_t)n;
    h->ring_slots = slots;
    h->seg_size = seg->size;
    h->table_off = SR_SEG_HEADER_SIZE;
    h->table_stride = table_stride();
    h->inbox_off = ALIGN_UP(h->table_off + (uint64_t)n * h->table_stride, 4096);
    h->inbox_stride = inbox_stride(slots);
    h->heap_off = g->heap_off;
    h->heap_stride = g->heap_stride;
    h->heap_areas = g->areas;
    h->area_off = g->area_off;
    h->area_stride = area_stride(); /* the lines read as zero: every area FREE */
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->flags = o->flags;
    h->attaching = 0;
    for (int r = 0; r < n; r++)
        h->attaching += !o->attaching || o->attaching[r];
    h->launched = (uint32_t)(o->launched ? o->launched : n);
    take_geometry(seg, h);
    /* relaxed: workers start after the creator returns (fork/exec, or the
     * MPI bootstrap's barrier, orders it) */
    atomic_store_explicit(&h->attached, 0, memory_order_relaxed);
    for (int r = 0; r < n; r++) {
        struct sr_worker_info *w = sr__seg_worker(seg, r);
        w->rank = (uint32_t)r;
        w->eventfd = -1;
        w->attaches = !o->attaching || o->attaching[r];
        sr__ring_init(sr__seg_inbox(seg, r), slots);
        if ((uint32_t)r >= h->launched)
            free_rank(h, w);
    }
}

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U /* Linux 6.3 */
#endif

int sr__fd_above_stdio(int fd, const char *who)
{
    if (fd < 0 || fd > 2)
        return fd;
    int hi = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int err = errno;
    close(fd);
    if (hi < 0)
        return sr__fail(-err, who, "cannot move fd %d above the standard descriptors: %s", fd, strerror(err));
    return hi;
}

/* The job's memfd: readable and writable by its owner only (mode 0600; a
 * memfd is born 0777), and never executable: MFD_NOEXEC_SEAL seals its exec
 * bits off where the kernel has it (6.3+); an older kernel refuses the
 * unknown flag with EINVAL, and then the chmod alone takes the exec bits.
 * Never on fds 0-2, where a launcher sets up each worker's stdio. */
static int create_memfd(const char *name)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
    if (fd < 0 && errno == EINVAL)
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return sr__fail(-errno, "sr__segment_create", "memfd_create(\"%s\"): %s", name, strerror(errno));
    if ((fd = sr__fd_above_stdio(fd, "sr__segment_create")) < 0)
        return fd;
    if (fchmod(fd, 0600) < 0) {
        int rc = sr__fail(-errno, "sr__segment_create", "fchmod(0600) of memfd \"%s\": %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    return fd;
}

int sr__segment_create(const sr_segment_opts *o, sr_segment *seg)
{
    uint32_t slots = o->ring_slots ? o->ring_slots : SR_RING_SLOTS_DEFAULT;
    uint64_t size = 0;
    int rc = check_opts(o, slots, &size);
    if (rc)
        return rc;
    struct heap_geometry g = heap_geometry(o, slots, size);
    size = g.file_size;
    const char *name = o->name ? o->name : "shmrpc";
    int fd = create_memfd(name);
    if (fd < 0)
        return fd;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = sr__fail(-errno, "sr__segment_create", "ftruncate to %llu bytes: %s",
                      (unsigned long long)size, strerror(errno));
        close(fd);
        return rc;
    }
    /* A worker shrinking the file would turn every peer's access into SIGBUS. */
    (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = sr__fail(-errno, "sr__segment_create", "mmap of %llu bytes: %s",
                      (unsigned long long)size, strerror(errno));
        close(fd);
        return rc;
    }
    struct stat st;
    *seg = (sr_segment){.fd = fd, .base = base, .size = size, .hdr = base,
                        .ino = fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0};
    write_header(seg, o, slots, name, &g);
    return 0;
}

/* The attaches flags (0 or 1 each) agree with the header's count, which is
 * at least 1. After the geometry checks: every line lies inside the file.
 * h: the header as read once (sr__segment_attach); base: the mapping. */
static int validate_attaching(const struct sr_seg_header *h, const void *base)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < h->world_size; r++) {
        const struct sr_worker_info *w =
            (const void *)((const char *)base + h->table_off + (uint64_t)r * h->table_stride);
        uint32_t a = w->attaches; /* one read: checked and counted alike */
        if (a > 1)
            return sr__fail(-EINVAL, "sr__segment_attach", "segment '%.48s': the worker line of rank %u says attaches = %u",
                            h->name, r, a);
        n += a;
    }
    if (n == 0 || n != h->attaching)
        return sr__fail(-EINVAL, "sr__segment_attach",
                        "segment '%.48s': the header says %u ranks attach, the worker lines say %u",
                        h->name, h->attaching, n);
    bool elastic = h->flags & SR_SEG_F_ELASTIC;
    if (h->launched < 1 || h->launched > h->world_size || (!elastic && h->launched != h->world_size) ||
        (elastic && h->attaching != h->world_size))
        return sr__fail(-EINVAL, "sr__segment_attach", "segment '%.48s': %u ranks launched of %u (%u attaching) in a%s job",
                        h->name, h->launched, h->world_size, h->attaching, elastic ? "n elastic" : " non-elastic");
    return 0;
}

/* The first offset or stride of h off the alignment the creator gives it
 * (write_header), or NULL: the worker lines and the area table's lines
 * hold atomics that must not straddle a cache line, the inboxes and the
 * heap areas start on pages and on SR_HEAP_ALIGN. *value: its value. */
static const char *misaligned(const struct sr_seg_header *h, uint64_t *value)
{
    const struct {
        const char *name;
        uint64_t value, align;
    } f[] = {
        {"table_off", h->table_off, SR_CACHELINE},     {"table_stride", h->table_stride, SR_CACHELINE},
        {"inbox_off", h->inbox_off, 4096},             {"inbox_stride", h->inbox_stride, 4096},
        {"heap_off", h->heap_off, SR_HEAP_ALIGN},      {"heap_stride", h->heap_stride, SR_HEAP_ALIGN},
        {"area_off", h->area_off, SR_CACHELINE},       {"area_stride", h->area_stride, SR_CACHELINE},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].value % f[i].align) {
            *value = f[i].value;
            return f[i].name;
        }
    return NULL;
}

static int validate(const struct sr_seg_header *h, const void *base, uint64_t file_size)
{
    const char *fn = "sr__segment_attach";
    if (h->magic != SR_SEG_MAGIC)
        return sr__fail(-EPROTO, fn, "not a shmrpc segment: magic 0x%016llx, expected 0x%016llx",
                        (unsigned long long)h->magic, (unsigned long long)SR_SEG_MAGIC);
    if (h->layout_format != SR_SEG_LAYOUT_FORMAT)
        return sr__fail(-EPROTO, fn, "segment layout format %u, this library reads %u",
                        h->layout_format, SR_SEG_LAYOUT_FORMAT);
    if (h->version != SR_SEG_VERSION)
        return sr__fail(-EPROTO, fn, "segment version %u, this library speaks %u",
                        h->version, SR_SEG_VERSION);
    if (h->world_size < 1 || h->world_size > SR_MAX_WORKERS)
        return sr__fail(-EINVAL, fn, "segment world size %u is out of range", h->world_size);
    uint32_t n = h->world_size;
    uint64_t bad;
    const char *field = misaligned(h, &bad);
    if (field)
        return sr__fail(-EINVAL, fn, "segment '%.48s': the header's %s %llu is misaligned", h->name, field,
                        (unsigned long long)bad);
    /* each area [off, off + n * stride) must fit the file: checked by
     * division, so that no product or sum can wrap around */
    if (h->seg_size != file_size || h->ring_slots < 2 || (h->ring_slots & (h->ring_slots - 1)) ||
        h->ring_slots > (1u << 30) || h->table_off < SR_SEG_HEADER_SIZE ||
        h->table_stride < sizeof(struct sr_worker_info) || h->table_off > file_size ||
        n > (file_size - h->table_off) / h->table_stride || h->inbox_off < h->table_off + n * h->table_stride ||
        h->inbox_stride < sr__ring_bytes(h->ring_slots) || h->inbox_off > file_size ||
        n > (file_size - h->inbox_off) / h->inbox_stride || h->heap_off < h->inbox_off + n * h->inbox_stride ||
        h->heap_off > file_size || h->heap_areas < n || h->heap_areas > n + SR_MAX_WORKERS ||
        (h->heap_stride && h->heap_areas > (file_size - h->heap_off) / h->heap_stride) ||
        h->area_off < h->heap_off + (uint64_t)h->heap_areas * h->heap_stride ||
        h->area_stride < sizeof(struct sr_heap_area_info) ||
        h->area_off > file_size || h->heap_areas > (file_size - h->area_off) / h->area_stride)
        return sr__fail(-EINVAL, fn, "segment header sizes are inconsistent (header says %llu bytes, file has %llu)",
                        (unsigned long long)h->seg_size, (unsigned long long)file_size);
    return validate_attaching(h, base);
}

/* The header's creator lines (read-only after creation, segment.h), read
 * once: what is validated is what the geometry is taken from, whatever a
 * scribbling peer writes in between. */
static void read_header(const void *base, struct sr_seg_header *h)
{
    memcpy(h, base, offsetof(struct sr_seg_header, attached));
}

int sr__segment_attach(int fd, sr_segment *seg)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return sr__fail(-EBADF, "sr__segment_attach", "fd %d is not an open file", fd);
    if ((uint64_t)st.st_size < SR_SEG_HEADER_SIZE)
        return sr__fail(-EPROTO, "sr__segment_attach", "fd %d: %lld bytes is too small to be a shmrpc segment",
                        fd, (long long)st.st_size);
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return sr__fail(-errno, "sr__segment_attach", "mmap of fd %d: %s", fd, strerror(errno));
    struct sr_seg_header h;
    read_header(base, &h);
    int rc = validate(&h, base, (uint64_t)st.st_size);
    if (rc) {
        munmap(base, (size_t)st.st_size);
        return rc;
    }
    *seg = (sr_segment){.fd = fd, .base = base, .size = (size_t)st.st_size, .hdr = base, .ino = (uint64_t)st.st_ino};
    take_geometry(seg, &h);
    return 0;
}

bool sr__seg_attaches(const sr_segment *s, int rank)
{
    if (!s->base || rank < 0 || (uint32_t)rank >= s->world)
        return false;
    /* plain: the creator's, read-only after creation (segment.h) */
    return sr__seg_worker(s, rank)->attaches == 1;
}

void sr__segment_detach(sr_segment *seg, bool close_fd)
{
    if (seg->base)
        munmap(seg->base, seg->size);
    if (close_fd && seg->fd >= 0)
        close(seg->fd);
    *seg = (sr_segment){.fd = -1};
}

const char *sr__exit_describe(int how, int status, char *buf, size_t len)
{
    const char *name = sigabbrev_np(status); /* NULL for real-time signals */
    const char *core = how == CLD_DUMPED ? " (core dumped)" : "";
    if (how == SR_EXIT_SEEN)
        snprintf(buf, len, "ended (its process is gone; mpirun has its status)");
    else if (how == CLD_EXITED)
        snprintf(buf, len, "exited with status %d", status);
    else if (name)
        snprintf(buf, len, "was killed by signal SIG%s%s", name, core);
    else
        snprintf(buf, len, "was killed by signal %d%s", status, core);
    return buf;
}

const char *sr__seg_exit_text(const struct sr_worker_info *w, char *buf, size_t len)
{
    static const char *const after[] = {
        [SR_WORKER_EMPTY] = " before attaching",
        [SR_WORKER_ATTACHED] = " without sr_shutdown",
        [SR_WORKER_DETACHED] = " after sr_shutdown",
        [SR_WORKER_LEFT] = " after a non-graceful sr_shutdown",
        [SR_WORKER_CLOSING] = " during sr_shutdown",
        [SR_WORKER_TIMED_OUT] = " after its sr_shutdown timed out",
        [SR_WORKER_LEAVING] = " while leaving the job",
        [SR_WORKER_LEFT_JOB] = " after leaving the job",
    };
    char how[80];
    /* relaxed: the caller saw exited = 1 (X1), which orders the worker's last store */
    uint32_t st = atomic_load_explicit(&w->state, memory_order_relaxed);
    /* seq_cst: pairs with X1; a worker of an elastic job that detached is
     * gone before its exit is published (E3): its state says how it left */
    if (!atomic_load_explicit(&w->exited, memory_order_seq_cst) && sr__worker_state_detached(st)) {
        static const char *const left[] = {
            [SR_WORKER_DETACHED] = "detached after sr_shutdown",
            [SR_WORKER_LEFT] = "detached without a graceful sr_shutdown",
            [SR_WORKER_TIMED_OUT] = "detached after its sr_shutdown timed out",
            [SR_WORKER_LEFT_JOB] = "left the job",
        };
        snprintf(buf, len, "%s", left[st]);
        return buf;
    }
    if (w->exit_code == SR_EXIT_FREE) {
        snprintf(buf, len, "is free: no worker has joined it");
        return buf;
    }
    if (st == SR_WORKER_LEFT_JOB && w->exit_code == CLD_EXITED && w->exit_status == 0) {
        snprintf(buf, len, "left the job");
        return buf;
    }
    sr__exit_describe(w->exit_code, w->exit_status, how, sizeof(how));
    /* A killed worker was not leaving: how it was attached says nothing more. */
    bool killed = w->exit_code != CLD_EXITED;
    snprintf(buf, len, "%s%s", how, killed || st > SR_WORKER_LEFT_JOB ? "" : after[st]);
    return buf;
}

static struct sr_launch_env launch_env; /* set in a sr_spawn child before any thread exists */
static bool launch_env_set;

void sr__launch_env_set(const struct sr_launch_env *e)
{
    launch_env = *e;
    launch_env_set = true;
}

void sr__launch_env_clear(void)
{
    launch_env_set = false;
}

static int env_int(const char *name, int lo, int hi, int *out)
{
    const char *s = getenv(name);
    if (!s)
        return -ENOENT;
    int64_t v;
    if (sr__parse_int(s, lo, hi, &v))
        return sr__fail(-EINVAL, "sr_init", "environment %s=\"%s\" is not an integer in [%d, %d]",
                        name, s, lo, hi);
    *out = (int)v;
    return 0;
}

int sr__launch_env_get(struct sr_launch_env *e)
{
    if (launch_env_set) {
        *e = launch_env;
        return 0;
    }
    int rc = env_int("SHMRPC_FD", 0, INT_MAX, &e->fd);
    if (rc == -ENOENT)
        return sr__fail(-ENOENT, "sr_init", "SHMRPC_FD is not set: run the program under shmrun or sr_spawn()");
    if (rc || (rc = env_int("SHMRPC_WORLD_SIZE", 1, SR_MAX_WORKERS, &e->world_size)) ||
        (rc = env_int("SHMRPC_RANK", 0, e->world_size - 1, &e->rank)))
        return rc == -ENOENT ? sr__fail(-EINVAL, "sr_init", "SHMRPC_RANK or SHMRPC_WORLD_SIZE is missing") : rc;
    return 0;
}

/* A name we may print: NUL-terminated within max bytes, printable ASCII
 * without quotes. */
static bool printable_name(const char *n, size_t max)
{
    size_t len = strnlen(n, max);
    if (len == 0 || len == max)
        return false;
    for (size_t i = 0; i < len; i++)
        if (n[i] < 0x21 || n[i] > 0x7e || n[i] == '\'')
            return false;
    return true;
}

const char *sr__seg_crash_text(const sr_segment *s, int rank, char *buf, size_t len)
{
    buf[0] = 0;
    if (rank < 0 || (uint32_t)rank >= s->world)
        return buf;
    const struct sr_worker_info *w = sr__seg_worker(s, rank);
    /* acquire: pairs with the crash handler's release store (crash.c) */
    if (atomic_load_explicit(&((struct sr_worker_info *)w)->crashed, memory_order_acquire) != 1)
        return buf;
    char fn[SR_CRASH_FN_MAX];
    memcpy(fn, w->crash_fn, sizeof(fn)); /* one copy: validated and printed alike */
    if (!printable_name(fn, sizeof(fn)))
        return buf;
    int caller = w->crash_caller;
    if (caller < 0 || (uint32_t)caller >= s->world) {
        snprintf(buf, len, " while serving '%s'", fn);
        return buf;
    }
    char name[SR_NAME_MAX];
    memcpy(name, sr__seg_worker(s, caller)->name, sizeof(name));
    if (printable_name(name, sizeof(name)))
        snprintf(buf, len, " while serving '%s' from %s", fn, name);
    else
        snprintf(buf, len, " while serving '%s' from rank %d", fn, caller);
    return buf;
}
