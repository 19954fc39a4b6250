/* SPDX-License-Identifier: MIT */
/* Crash reports: see crash.h. */
#include "crash.h"

#include <signal.h>
#include <stdbool.h>
#include <string.h>

_Thread_local struct sr__serving sr__serving_now;

static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define NFATAL (sizeof(fatal) / sizeof(fatal[0]))

/* Written by install/uninstall (sr_init, sr_shutdown: one thread at a time);
 * read by the handler. slot is cleared before the segment is unmapped. */
static struct sigaction previous[NFATAL];
static _Atomic(struct sr_worker_info *) slot;
static atomic_flag claimed = ATOMIC_FLAG_INIT; /* the first crashing thread writes the slot */

static int index_of(int sig)
{
    for (unsigned i = 0; i < NFATAL; i++)
        if (fatal[i] == sig)
            return (int)i;
    return -1;
}

/* Async-signal-safe: plain stores into the segment, sigaction and raise. */
static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    (void)si;
    (void)uc;
    /* acquire: pairs with the release store in sr__crash_install */
    struct sr_worker_info *w = atomic_load_explicit(&slot, memory_order_acquire);
    struct sr__serving now = sr__serving_now;
    if (w && now.fn && !atomic_flag_test_and_set_explicit(&claimed, memory_order_relaxed)) {
        size_t n = strnlen(now.fn, SR_CRASH_FN_MAX - 1);
        memcpy(w->crash_fn, now.fn, n);
        w->crash_fn[n] = 0;
        w->crash_caller = now.caller;
        /* release: pairs with the supervisor's acquire load in sr__seg_crash_text */
        atomic_store_explicit(&w->crashed, 1, memory_order_release);
    }
    int i = index_of(sig);
    if (i >= 0)
        sigaction(sig, &previous[i], NULL);
    else
        signal(sig, SIG_DFL);
    /* Pending until this handler returns (the signal is blocked in it); then
     * the previous disposition acts on it: the default ends the process. */
    raise(sig);
}

void sr__crash_install(struct sr_worker_info *w)
{
    /* release: the slot pointer is published before any handler can read it */
    atomic_store_explicit(&slot, w, memory_order_release);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (unsigned i = 0; i < NFATAL; i++)
        sigaction(fatal[i], &sa, &previous[i]);
}

void sr__crash_uninstall(void)
{
    for (unsigned i = 0; i < NFATAL; i++) {
        struct sigaction cur;
        if (sigaction(fatal[i], NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fatal)
            sigaction(fatal[i], &previous[i], NULL); /* ours: give back what was there */
    }
    /* release: pairs with the handler's acquire load; it finds no slot once the segment goes */
    atomic_store_explicit(&slot, NULL, memory_order_release);
}
