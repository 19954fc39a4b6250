/* SPDX-License-Identifier: MIT */
/* Logging: see shmrpc/log.h and log.h. The only writer to stderr in lib/ and
 * shm/ (tests/check_no_stderr.sh keeps it that way). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define LINE_MAX_BYTES 1024
#define IDENT_MAX 160
#define LEVEL_UNSET (-1)

/* The worker identity: two buffers, the one in use published by a release
 * store of `ident` (NULL: no worker; use the role). A setter writes the
 * buffer not in use, so a reader holding the old pointer reads a stable
 * string unless two changes happen during its one line (attach and detach
 * are far apart). */
static char ident_buf[2][IDENT_MAX];
static _Atomic(const char *) ident;
static unsigned ident_flip; /* which buffer the next set writes; setters are serialised by the runtime */
static char role[32];       /* written by the launcher's main thread before any other thread exists */

/* relaxed everywhere: an int read whole; parsing again races only with the
 * same result. */
static _Atomic int level = LEVEL_UNSET;
static _Atomic int bad_value;          /* the level in force replaces a bad value */
static _Atomic int bad_value_reported; /* by this process (inherited by an sr_spawn child) */
static _Atomic int ident_rank = -1;    /* the rank sr__log_set_worker set; -1: none */

static void report_bad_value(void);

void sr__log_set_worker(const char *name, int rank)
{
    atomic_store_explicit(&ident_rank, rank < 0 ? -1 : rank, memory_order_relaxed); /* relaxed: report_bad_value */
    if (rank < 0) {
        /* release: pairs with the acquire load in prefix() */
        atomic_store_explicit(&ident, NULL, memory_order_release);
        return;
    }
    char *b = ident_buf[ident_flip++ & 1];
    if (name && name[0])
        snprintf(b, IDENT_MAX, "%.127s (rank %d)", name, rank);
    else
        snprintf(b, IDENT_MAX, "worker%d (rank %d)", rank, rank);
    /* release: the buffer's bytes are visible to whoever loads the pointer (prefix()) */
    atomic_store_explicit(&ident, b, memory_order_release);
    sr_log_enabled(SR_LOG_ERROR); /* reads SHMRPC_LOG_LEVEL now: a bad value is reported at sr_init */
    report_bad_value();           /* read before, by a line of this process's that had no rank yet */
}

void sr__log_set_role(const char *r)
{
    snprintf(role, sizeof(role), "%s", r ? r : "");
    sr_log_enabled(SR_LOG_ERROR); /* as above: a launcher reports a bad value at its start */
    report_bad_value();
}

static const char *const names[] = {"error", "warn", "info", "debug"};

static int parse(const char *v, bool *bad)
{
    *bad = false;
    if (!v || !v[0])
        return SR_LOG_WARN;
    for (int i = 0; i <= SR_LOG_DEBUG; i++)
        if (!strcasecmp(v, names[i]))
            return i;
    if (!strcasecmp(v, "warning"))
        return SR_LOG_WARN;
    *bad = true;
    return SR_LOG_WARN;
}

/* One warning per job: by a launcher (shmrun, which then passes the level
 * in force to its workers: sr__log_pass_on), or by the worker of rank 0
 * where no launcher reads the variable (sr_spawn's children, mpirun's ranks,
 * a one-worker job). A process with neither role nor rank yet reports when
 * it gets one. */
static void report_bad_value(void)
{
    /* relaxed (all): ints read whole; only the exchange's atomicity matters */
    if (!atomic_load_explicit(&bad_value, memory_order_relaxed) ||
        (!role[0] && atomic_load_explicit(&ident_rank, memory_order_relaxed) != 0))
        return;
    if (atomic_exchange_explicit(&bad_value_reported, 1, memory_order_relaxed))
        return;
    const char *v = getenv("SHMRPC_LOG_LEVEL");
    sr_logf(SR_LOG_WARN, "SHMRPC_LOG_LEVEL='%.64s' is not one of error, warn, info, debug; using warn", v ? v : "");
}

sr_log_level sr__log_reload(void)
{
    bool bad;
    int l = parse(getenv("SHMRPC_LOG_LEVEL"), &bad);
    atomic_store_explicit(&level, l, memory_order_relaxed);    /* relaxed: see the declaration */
    atomic_store_explicit(&bad_value, bad, memory_order_relaxed); /* relaxed: see report_bad_value */
    report_bad_value();
    return (sr_log_level)l;
}

void sr__log_pass_on(void)
{
    sr_log_enabled(SR_LOG_ERROR); /* parsed, and reported if bad */
    /* relaxed: see report_bad_value */
    if (atomic_load_explicit(&bad_value, memory_order_relaxed))
        setenv("SHMRPC_LOG_LEVEL", names[atomic_load_explicit(&level, memory_order_relaxed)], 1);
}

static int normalise(int l) { return l < SR_LOG_ERROR || l > SR_LOG_DEBUG ? SR_LOG_ERROR : l; }

SR_API bool sr_log_enabled(sr_log_level l)
{
    int cur = atomic_load_explicit(&level, memory_order_relaxed); /* relaxed: see the declaration */
    if (cur == LEVEL_UNSET)
        cur = (int)sr__log_reload();
    return normalise((int)l) <= cur;
}

/* "<who>: " and the level word; returns the bytes written into line. */
static size_t prefix(char *line, size_t len, int l)
{
    static const char *const words[] = {"", "warning: ", "info: ", "debug: "};
    /* acquire: pairs with the release store in sr__log_set_worker */
    const char *who = atomic_load_explicit(&ident, memory_order_acquire);
    int n;
    if (who)
        n = snprintf(line, len, "%s: %s", who, words[l]);
    else if (role[0])
        n = snprintf(line, len, "%s: %s", role, words[l]);
    else
        n = snprintf(line, len, "pid %d: %s", (int)getpid(), words[l]);
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

/* One write(2) for the whole line (a pipe keeps writes up to PIPE_BUF whole;
 * the line is shorter). A short write to a file is completed. */
static void emit(const char *line, size_t n)
{
    while (n) {
        ssize_t w = write(STDERR_FILENO, line, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        line += w;
        n -= (size_t)w;
    }
}

static void vlog(int l, const char *fmt, va_list ap)
{
    char line[LINE_MAX_BYTES];
    size_t n = prefix(line, sizeof(line), l);
    int m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    if (m < 0)
        m = 0;
    if (n + (size_t)m >= sizeof(line) - 1) { /* cut: say so, keep room for the newline */
        n = sizeof(line) - 5;
        memcpy(line + n, "...", 3);
        n += 3;
    } else {
        n += (size_t)m;
    }
    line[n++] = '\n';
    int saved = errno; /* logging never changes errno */
    emit(line, n);
    errno = saved;
}

SR_API void sr_logf(sr_log_level l, const char *fmt, ...)
{
    if (!sr_log_enabled(l))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(normalise((int)l), fmt, ap);
    va_end(ap);
}

/* The text past a leading "worker<digits>: " or "<role>: ". */
static const char *own_prefix_skipped(const char *t)
{
    size_t rl = strlen(role);
    if (rl && !strncmp(t, role, rl) && t[rl] == ':' && t[rl + 1] == ' ')
        return t + rl + 2;
    if (strncmp(t, "worker", 6) != 0)
        return t;
    const char *p = t + 6;
    while (*p >= '0' && *p <= '9')
        p++;
    return p > t + 6 && p[0] == ':' && p[1] == ' ' ? p + 2 : t;
}

void sr__log_text(sr_log_level l, const char *text)
{
    if (sr_log_enabled(l))
        sr_logf(l, "%s", own_prefix_skipped(text ? text : ""));
}
