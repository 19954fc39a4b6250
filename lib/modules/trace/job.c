/* SPDX-License-Identifier: MIT */
/* The launcher's side of the profiler (trace_seam.h): the workers' record
 * areas, and what is written from them at the end of each job attempt.
 *
 * One memfd holds every worker's area (rank r's at r * SR_AREA_SIZE, sparse:
 * only what the workers record takes memory). An attempt that replaces
 * ranks in place has room for each later generation g of rank r too, in
 * slot r + world * g (g <= the replacements it may make): a generation's
 * records, names and threads are its own, and it is a process of its own in
 * the trace, named with its generation. Its process writes its slot's
 * header before it attaches (sr__trace_job_child). It is made before the first
 * fork and inherited: a forked worker (sr_spawn) is handed its slot in
 * memory, an exec'd one (shmrun) finds it in SHMRPC_TRACE_AREA. After every
 * worker is reaped, whatever their end, the launcher maps each slot and
 * writes the trace part and the statistics from it: the records are in the
 * memfd, not in the dead process. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "shmrpc/stats.h"
#include "trace.h"

struct sr_trace_job {
    int fd;
    int world, attempt;
    int gens; /* generations a rank may have: 1 + the replacements the attempt may make */
    uint32_t flags; /* SR_AREA_JOB_TRACE, SR_AREA_JOB_STATS */
    const char *who;
    char path[4096];
};

static bool env_on(const char *var)
{
    const char *v = getenv(var);
    return v && *v && strcmp(v, "0") != 0;
}

/* The trace file can be made: its directory takes a new file (the name the
 * merger's temporary file will have), and it is not a directory. */
static int check_path(const char *path, const char *who)
{
    struct stat st;
    char probe[4200];
    if (strlen(path) >= 4000)
        return sr__fail(-ENAMETOOLONG, who, "SHMRPC_TRACE='%.64s...': the path is too long", path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return sr__fail(-EISDIR, who, "SHMRPC_TRACE='%s' is a directory, not a file to write", path);
    snprintf(probe, sizeof(probe), "%s.%d.tmp", path, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return sr__fail(-errno, who, "cannot write the trace SHMRPC_TRACE='%s' (a file beside it: '%s'): %s", path,
                        probe, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

/* Write the header of the slot of rank's generation gen. 0 or -errno. */
static int init_slot(const struct sr_trace_job *tj, int rank, uint32_t gen)
{
    size_t len = sizeof(struct sr_area);
    int slot = rank + tj->world * (int)gen;
    struct sr_area *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, tj->fd, (off_t)slot * (off_t)SR_AREA_SIZE);
    if (a == MAP_FAILED)
        return -errno;
    sr__area_init(a, rank, slot, gen, tj->flags);
    munmap(a, len);
    return 0;
}

/* The memfd of every slot, the first generation's headers written; never
 * on fds 0-2 (a worker's stdio is set up over them). */
static int make_areas(struct sr_trace_job *tj)
{
    int fd = memfd_create("shmrpc-trace", MFD_CLOEXEC);
    if (fd >= 0 && fd < 3) {
        int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        close(fd);
        fd = high;
    }
    if (fd < 0)
        return sr__fail(-errno, tj->who, "the profiler's record areas: memfd_create: %s", strerror(errno));
    tj->fd = fd;
    off_t slots = (off_t)tj->world * tj->gens;
    if (ftruncate(fd, slots * (off_t)SR_AREA_SIZE))
        return sr__fail(-errno, tj->who, "the profiler's record areas: ftruncate to %lld x %llu bytes: %s",
                        (long long)slots, (unsigned long long)SR_AREA_SIZE, strerror(errno));
    for (int r = 0; r < tj->world; r++) {
        int rc = init_slot(tj, r, 0);
        if (rc)
            return sr__fail(rc, tj->who, "the profiler's record area of rank %d: mmap: %s", r, strerror(-rc));
    }
    return 0;
}

int sr__trace_job_begin(struct sr_trace_job **out, int world, int replacements, int attempt, const char *who)
{
    *out = NULL;
    const char *path = getenv("SHMRPC_TRACE");
    uint32_t flags = (path && *path ? SR_AREA_JOB_TRACE : 0) | (env_on("SHMRPC_STATS") ? SR_AREA_JOB_STATS : 0);
    if (!flags)
        return 0;
    if (replacements > 0)
        flags |= SR_AREA_JOB_REPLACES;
    int rc = flags & SR_AREA_JOB_TRACE ? check_path(path, who) : 0;
    struct sr_trace_job *tj = rc ? NULL : calloc(1, sizeof(*tj));
    if (rc || !tj)
        return rc ? rc : sr__fail(-ENOMEM, who, "no memory for the profiler");
    *tj = (struct sr_trace_job){.fd = -1, .world = world, .attempt = attempt, .gens = 1 + (replacements > 0 ? replacements : 0),
                                .flags = flags, .who = who};
    snprintf(tj->path, sizeof(tj->path), "%s", flags & SR_AREA_JOB_TRACE ? path : "");
    if ((rc = make_areas(tj))) {
        if (tj->fd >= 0)
            close(tj->fd);
        free(tj);
        return rc;
    }
    *out = tj;
    return 0;
}

void sr__trace_job_child(struct sr_trace_job *tj, int rank, bool exec)
{
    if (!tj) {
        if (exec) /* a launcher's variable from further up names nothing of this job */
            unsetenv("SHMRPC_TRACE_AREA");
        return;
    }
    const char *g = getenv("SHMRPC_GENERATION"); /* lib/job's, in every worker's child */
    uint32_t gen = g ? (uint32_t)strtoul(g, NULL, 10) : 0;
    int slot = rank;
    if (gen > 0 && gen < (uint32_t)tj->gens && !init_slot(tj, rank, gen))
        slot = rank + tj->world * (int)gen;
    else if (gen > 0) /* never (a generation past the budget), or no mapping: no records */
        slot = -1;
    if (slot < 0) {
        if (exec)
            unsetenv("SHMRPC_TRACE_AREA");
        return;
    }
    if (!exec) {
        sr__area_give(tj->fd, slot);
        return;
    }
    char v[32];
    snprintf(v, sizeof(v), "%d:%d", tj->fd, slot);
    fcntl(tj->fd, F_SETFD, 0); /* across the exec; the worker closes it once mapped */
    setenv("SHMRPC_TRACE_AREA", v, 1);
}

/* A worker's statistics: widened into c (print NULL), or printed with c's
 * units, marked if the worker did not reach sr_shutdown. */
static void slot_stats(const struct sr_trace_job *tj, const struct sr_area *a, int rank, struct sr_stats_cols *c,
                       bool print)
{
    sr_stats *s;
    if (sr__stats_of(a, &s))
        return;
    if (!print) {
        sr__stats_widen(s, c);
        sr_stats_free(s);
        return;
    }
    char name[SR_AREA_WORKER], who[SR_AREA_WORKER + 320];
    if (a->worker[0])
        snprintf(name, sizeof(name), "%.*s", SR_AREA_WORKER - 1, a->worker);
    else /* it died before sr_init named it */
        snprintf(name, sizeof(name), "worker%d", rank);
    char gen[32] = "", ended[128] = "";
    if (tj->flags & SR_AREA_JOB_REPLACES)
        snprintf(gen, sizeof(gen), ", generation %u", a->generation);
    /* relaxed: the worker is reaped, its writes are all visible */
    if (!(atomic_load_explicit(&((struct sr_area *)a)->flags, memory_order_relaxed) & SR_AREA_STATS_FINAL))
        snprintf(ended, sizeof(ended), ", printed by %s: the worker ended before sr_shutdown", tj->who);
    snprintf(who, sizeof(who), "%s (rank %d%s%s)", name, rank, gen, ended);
    sr__stats_print_cols(s, who, c, stderr);
    sr_stats_free(s);
}

/* Map a slot's area read-only: NULL for a hole (a later generation's slot
 * that no process took: its header is read without mapping, nor
 * allocating, a page of it) or an area no worker recorded in. */
static struct sr_area *map_slot(const struct sr_trace_job *tj, int slot)
{
    uint64_t magic = 0;
    off_t off = (off_t)slot * (off_t)SR_AREA_SIZE;
    if (slot >= tj->world && (pread(tj->fd, &magic, sizeof(magic), off) != sizeof(magic) || magic != SR_AREA_MAGIC))
        return NULL;
    struct sr_area *a = mmap(NULL, SR_AREA_SIZE, PROT_READ, MAP_SHARED, tj->fd, off);
    if (a == MAP_FAILED) {
        sr_logf(SR_LOG_ERROR, "the record area of slot %d: mmap: %s", slot, strerror(errno));
        return NULL;
    }
    /* relaxed: the worker is reaped, its writes are all visible */
    if (a->magic != SR_AREA_MAGIC || !(atomic_load_explicit(&a->flags, memory_order_relaxed) & SR_AREA_ATTACHED)) {
        munmap(a, SR_AREA_SIZE);
        return NULL;
    }
    return a;
}

/* Every worker's statistics, by rank (each rank's generations in order),
 * each latency column in one unit across the job: a first pass finds the
 * columns' largest values. */
static void print_job_stats(const struct sr_trace_job *tj)
{
    struct sr_stats_cols c = SR_STATS_COLS_EMPTY;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < tj->world; r++)
            for (int g = 0; g < tj->gens; g++) {
                struct sr_area *a = map_slot(tj, r + tj->world * g);
                if (!a)
                    continue;
                slot_stats(tj, a, r, &c, pass == 1);
                munmap(a, SR_AREA_SIZE);
            }
}

/* A slot's trace part. */
static void read_slot(const struct sr_trace_job *tj, int slot)
{
    struct sr_area *a = map_slot(tj, slot);
    if (!a)
        return;
    if (sr__trace_write_part(a, tj->path, slot, tj->who))
        sr__log_text(SR_LOG_ERROR, sr_last_error());
    munmap(a, SR_AREA_SIZE);
}

/* A restart's trace goes to path; the one before it moves to path.attempt<k-1>. */
static void keep_previous(const struct sr_trace_job *tj)
{
    char old[4200];
    snprintf(old, sizeof(old), "%s.attempt%d", tj->path, tj->attempt - 1);
    if (tj->attempt > 0 && rename(tj->path, old) && errno != ENOENT)
        sr_logf(SR_LOG_ERROR, "cannot keep the previous attempt's trace as '%s': %s", old,
                strerror(errno));
}

void sr__trace_job_end(struct sr_trace_job *tj)
{
    if (!tj)
        return;
    char keep[1024]; /* the job's own report (sr_spawn's failure) stays the last error */
    snprintf(keep, sizeof(keep), "%s", sr_last_error());
    fflush(stderr);
    for (int s = 0; (tj->flags & SR_AREA_JOB_TRACE) && s < tj->world * tj->gens; s++)
        read_slot(tj, s);
    if (tj->flags & SR_AREA_JOB_STATS)
        print_job_stats(tj);
    if (tj->flags & SR_AREA_JOB_TRACE) {
        keep_previous(tj);
        if (sr__trace_merge(tj->path, tj->world, tj->world * tj->gens))
            sr__log_text(SR_LOG_ERROR, sr_last_error());
    }
    sr__error_set_text(keep);
    close(tj->fd);
    free(tj);
}
