/* SPDX-License-Identifier: MIT */
/* Exact user-mode instruction counts by single-stepping (icount.h). */
#include "icount.h"

#include "bench_util.h" /* bench_now_ns */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

enum { IC_STARTING, IC_STEPPING, IC_STOP, IC_DONE, IC_FAILED };

/* Shared by the counted thread and its tracer. state: the tracer writes
 * STEPPING, DONE and FAILED, the counted thread STOP; count and err are
 * the tracer's, read after DONE or FAILED. */
struct bench_icount_area {
    _Atomic int state;
    int seq; /* the counted process's count of regions: the profile's file suffix */
    int err;
    int64_t count;
};

/* BENCH_ICOUNT_PROFILE=file: each step's instruction address, counted,
 * written to file.N (N: the process's counted regions before this one) as
 * "address count" lines after the thread's executable mappings (its
 * /proc/pid/maps lines, each after "map "), for bench/icount_profile.py.
 * An open-addressing table of 2^16 addresses (a hot path has a few
 * thousand); once full, further new addresses are counted as one line 0. */
#define PROF_BITS 16
struct prof {
    uint64_t addr[1u << PROF_BITS];
    uint64_t n[1u << PROF_BITS];
};

static void prof_add(struct prof *p, uint64_t ip)
{
    uint32_t mask = (1u << PROF_BITS) - 1, h = (uint32_t)((ip * 0x9e3779b97f4a7c15ull) >> (64 - PROF_BITS));
    for (uint32_t i = 0; i <= mask; i++, h = (h + 1) & mask) {
        if (p->addr[h] == ip || !p->addr[h]) {
            p->addr[h] = ip;
            p->n[h]++;
            return;
        }
    }
}

static void prof_write(const struct prof *p, pid_t tid, const char *path, int seq)
{
    char name[4096], line[512];
    snprintf(name, sizeof(name), "%s.%d", path, seq);
    FILE *out = fopen(name, "w"), *maps;
    snprintf(name, sizeof(name), "/proc/%d/maps", (int)tid);
    if (!out)
        return;
    if ((maps = fopen(name, "r"))) {
        char perms[8];
        while (fgets(line, sizeof(line), maps))
            if (sscanf(line, "%*s %7s", perms) == 1 && perms[2] == 'x')
                fprintf(out, "map %s", line);
        fclose(maps);
    }
    for (uint32_t i = 0; i < (1u << PROF_BITS); i++)
        if (p->n[i])
            fprintf(out, "%" PRIx64 " %" PRIu64 "\n", p->addr[i], p->n[i]);
    fclose(out);
}

/* Where counting starts: the counted thread calls it once the tracer
 * steps it, so that the count does not depend on where in its wait for
 * the tracer the attach found it (a forked tracer has the same addresses). */
static void __attribute__((noinline)) icount_mark(void) { __asm__ volatile(""); }

/* The tracer: step `tid` until the area says STOP, counting the steps
 * from icount_mark on. */
static void trace(pid_t tid, struct bench_icount_area *a)
{
    int st, sig = 0;
    int64_t n = 0;
    const char *path = getenv("BENCH_ICOUNT_PROFILE");
    struct prof *prof = path && *path ? calloc(1, sizeof(*prof)) : NULL;
    struct user_regs_struct regs;
    bool counting = false;
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) || ptrace(PTRACE_INTERRUPT, tid, 0, 0) || waitpid(tid, &st, __WALL) != tid) {
        a->err = errno ? errno : ESRCH;
        /* release: pairs with the counted thread's acquire load of state */
        atomic_store_explicit(&a->state, IC_FAILED, memory_order_release);
        _exit(1);
    }
    atomic_store_explicit(&a->state, IC_STEPPING, memory_order_release); /* release: as above */
    for (;;) {
        if (ptrace(PTRACE_SINGLESTEP, tid, 0, sig) || waitpid(tid, &st, __WALL) != tid || !WIFSTOPPED(st)) {
            a->err = errno ? errno : ECHILD;
            atomic_store_explicit(&a->state, IC_FAILED, memory_order_release); /* release: as above */
            _exit(1);
        }
        sig = 0;
        if (WSTOPSIG(st) == SIGTRAP && !(st >> 16)) { /* one step */
            if (!counting) {
                counting = !ptrace(PTRACE_GETREGS, tid, 0, &regs) && regs.rip == (uint64_t)(uintptr_t)icount_mark;
            } else {
                n++;
                if (prof && !ptrace(PTRACE_GETREGS, tid, 0, &regs))
                    prof_add(prof, regs.rip);
            }
        }
        else if (!(st >> 16))
            sig = WSTOPSIG(st); /* a signal for the thread: deliver it with the next step */
        /* acquire: pairs with bench_icount_end's release store of STOP */
        if (atomic_load_explicit(&a->state, memory_order_acquire) == IC_STOP)
            break;
    }
    if (prof)
        prof_write(prof, tid, path, a->seq); /* before the detach: the maps are the stopped thread's */
    ptrace(PTRACE_DETACH, tid, 0, sig);
    a->count = n;
    atomic_store_explicit(&a->state, IC_DONE, memory_order_release); /* release: the count before it */
    _exit(0);
}

static void icount_close(bench_icount *ic)
{
    int st;
    if (ic->tracer > 0)
        while (waitpid(ic->tracer, &st, 0) < 0 && errno == EINTR) {
        }
    munmap(ic->sh, sizeof(*ic->sh));
    prctl(PR_SET_PTRACER, 0, 0, 0, 0); /* no-op without Yama */
    ic->tracer = 0;
    ic->sh = NULL;
}

int bench_icount_begin(bench_icount *ic)
{
    ic->tracer = 0;
    ic->sh = mmap(NULL, sizeof(*ic->sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ic->sh == MAP_FAILED)
        return ic->sh = NULL, -errno;
    static int seq; /* one counted region at a time (icount.h) */
    atomic_init(&ic->sh->state, IC_STARTING);
    ic->sh->seq = seq++;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* Yama's scope 1 lets only ancestors trace */
    ic->tracer = fork();
    if (ic->tracer < 0) {
        int rc = -errno;
        icount_close(ic);
        return rc;
    }
    if (ic->tracer == 0)
        trace(tid, ic->sh);
    int64_t give_up = bench_now_ns() + 10 * 1000000000ll;
    int s;
    /* acquire: pairs with the tracer's release stores */
    while ((s = atomic_load_explicit(&ic->sh->state, memory_order_acquire)) == IC_STARTING && bench_now_ns() < give_up)
        sched_yield();
    if (s == IC_STEPPING) {
        icount_mark();
        return 0;
    }
    int rc = s == IC_FAILED ? -ic->sh->err : -ETIMEDOUT;
    if (s == IC_STARTING)
        kill(ic->tracer, SIGKILL);
    icount_close(ic);
    return rc;
}

int64_t bench_icount_end(bench_icount *ic)
{
    /* release: pairs with the tracer's acquire load after each step */
    atomic_store_explicit(&ic->sh->state, IC_STOP, memory_order_release);
    int st;
    pid_t t = ic->tracer;
    while (waitpid(t, &st, 0) < 0 && errno == EINTR) {
    }
    ic->tracer = 0;
    /* acquire: pairs with the tracer's release store of DONE */
    int64_t n = atomic_load_explicit(&ic->sh->state, memory_order_acquire) == IC_DONE ? ic->sh->count
                                                                                     : -(int64_t)(ic->sh->err ? ic->sh->err : ECHILD);
    icount_close(ic);
    return n;
}
