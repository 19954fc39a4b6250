/* SPDX-License-Identifier: MIT */
/* A worker's sleeps and wakes write no job-wide word.
 *
 * Every thread of every worker used to add to one segment-header counter
 * (`awake`, for the spin policy) on each sleep and each wake, bouncing its
 * cache line across the whole job. The words a worker may write while it
 * sleeps and wakes are its own (its doorbell, its inbox's slots) and those
 * of the peer it answers (that peer's inbox and doorbell), never a word of
 * the header, which every worker shares.
 *
 * Comparing the header before and after the cycles would not catch such a
 * counter: it goes down on a sleep and up on the wake, so it reads the same
 * whenever the job is in the same state. So each worker maps the header page
 * read-only in its own process for the cycles (mprotect: the other
 * processes' mappings are untouched), and a write to it is a SIGSEGV, which
 * the handler reports with the offset written.
 *
 * The cycles are events, not timing: spinning is off (SHMRPC_SPIN_NS=0, so
 * every wait sleeps), and each call is made only once the callee's progress
 * thread is asleep on its doorbell (its doorbell word says SLEEPING), so
 * each call wakes it and its caller sleeps until the response wakes it. */
#include <criterion/criterion.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent.h"
#include "doorbell.h" /* SR_DOORBELL_SLEEPING */
#include "segment.h"
#include "transport.h" /* sr__transport_segment: the segment as the agent's transport maps it */
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(sleep_writes);

#define CYCLES 200
#define EVENT_WAIT_S 30 /* bound on every wait for an event */

struct page {
    _Atomic uint32_t turn; /* futex: 1 when worker0 may make its calls, 2 when it has */
};
static struct page *pg;

#include "shared_event.h"

static uintptr_t header_lo, header_hi; /* the protected range, in this process */

static void put_hex(char *end, uintptr_t v, int digits)
{
    for (int i = 1; i <= digits; i++, v >>= 4)
        end[-i] = "0123456789abcdef"[v & 15];
}

/* A write to the read-only header: say where, and end the worker. */
static void on_segv(int sig, siginfo_t *si, void *ctx)
{
    (void)sig, (void)ctx;
    uintptr_t at = (uintptr_t)si->si_addr;
    static char msg[] = "a sleep or wake wrote a job-wide word: the segment header at offset 0x0000\n";
    if (at >= header_lo && at < header_hi)
        put_hex(msg + sizeof(msg) - 2, at - header_lo, 4);
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n;
    _exit(4);
}

static int fn_noop(sr_call *c) { return sr_call_return(c, sr_none()); }

/* The header page(s), read-only in this process (on), or writable again. */
static int protect_header(bool on)
{
    sr_segment *s = sr__transport_segment(sr__agent->tports);
    header_lo = (uintptr_t)s->base;
    header_hi = header_lo + SR_SEG_HEADER_SIZE;
    if (on) {
        struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
        sigaction(SIGSEGV, &sa, NULL);
    }
    return mprotect(s->base, SR_SEG_HEADER_SIZE, on ? PROT_READ : PROT_READ | PROT_WRITE);
}

/* Wait (bounded) until the progress thread of `rank` sleeps on its doorbell. */
static bool asleep(int rank)
{
    _Atomic uint32_t *bell = &sr__seg_worker(sr__transport_segment(sr__agent->tports), rank)->doorbell;
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    while (atomic_load(bell) != SR_DOORBELL_SLEEPING)
        if (now_ns() > deadline)
            return false;
        else
            sched_yield();
    return true;
}

/* CYCLES calls to `to`, each one made while its progress thread sleeps. */
static int cycles(int to)
{
    for (int i = 0; i < CYCLES; i++) {
        WCHECK(asleep(to), "worker%d's progress thread never went to sleep (cycle %d)", to, i);
        int rc = sr_rpc_sync(to, "noop", SR_NOARGS, SR_TIMEOUT_NONE, NULL);
        WCHECK(rc == 0, "call %d to worker%d: %s", i, to, sr_last_error());
    }
    return 0;
}

static int sleeper(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    setenv("SHMRPC_SPIN_NS", "0", 1); /* every wait sleeps */
    sr_register("noop", fn_noop);
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    WCHECK(sr__transport_segment(sr__agent->tports)->table_off >= SR_SEG_HEADER_SIZE,
           "the worker table starts inside the header page");
    WCHECK(protect_header(true) == 0, "mprotect: %s", strerror(errno));
    int rc = 0;
    if (rank == 1) { /* worker0's progress thread and executor wake and sleep; so does this caller */
        rc = cycles(0);
        set_and_wake(&pg->turn, 1);
        WCHECK(rc || wait_for(&pg->turn, 2), "worker0 never made its calls");
    } else { /* and the other way round */
        WCHECK(wait_for(&pg->turn, 1), "worker1 never made its calls");
        rc = cycles(1);
        set_and_wake(&pg->turn, 2);
    }
    WCHECK(protect_header(false) == 0, "mprotect: %s", strerror(errno));
    int sd = sr_shutdown(true, 60);
    WCHECK(sd == 0, "rank %d: graceful shutdown failed: %s", rank, sr_last_error());
    return rc;
}

Test(sleep_writes, sleep_and_wake_write_no_job_wide_word)
{
    pg = shared_page(sizeof(*pg));
    sr_spawn_opts o = {.name_prefix = test_ns("sleep_writes"), .shm_size = 2 * (64u << 20)};
    int rc = sr_spawn(2, sleeper, NULL, &o);
    cr_assert_eq(rc, 0, "job failed (a status 4 is a write to the header, see stderr): %s", sr_last_error());
}
