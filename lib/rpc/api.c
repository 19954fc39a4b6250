/* SPDX-License-Identifier: MIT */
/* The public RPC entry points: lifecycle, names, timeouts, calls, debug. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "codec.h"
#include "ext.h"
#include "error.h"
#include "payload.h"
#include "module.h"
#include "registry.h"
#include "reorder.h"
#include "timeout.h"
#include "leaks.h"
#include "marshal.h"

#define CALL_SLOTS 65536

static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER; /* init/shutdown */


static int name_check(const char *n)
{
    size_t len = strlen(n);
    if (len == 0)
        return sr__fail(-EINVAL, "sr_init", "Worker name must be non-empty");
    if (len >= 128)
        return sr__fail(-EINVAL, "sr_init", "Worker name must be shorter than 128 characters: '%.40s...'", n);
    if (strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:-") != len)
        return sr__fail(-EINVAL, "sr_init", "Worker name must match ^[A-Za-z0-9_:-]+$, got '%s'", n);
    return 0;
}

/* The transports (transport.h): which instance reaches each peer is the
 * transport layer's choice. */
static int transports(sr_agent *a, const char *name)
{
    struct sr_transport_opts to = {.name = name, .marshal = &sr__rpc_marshal};
    int rc = sr__transport_open(&to, &a->tports);
    if (rc)
        return rc;
    a->rank = sr__transport_rank(a->tports);
    a->world = sr__transport_world(a->tports);
    a->self = sr__transport_home(a->tports);
    a->wake = a->self->ops->wake;
    a->tp = sr__transport_peers(a->tports);
    a->remote = sr__transport_polled(a->tports);
    return 0;
}

/* In an elastic job only the workers present count: a free rank has no
 * name, one that left leaves its name free (a joiner may take it), and a
 * joiner whose name a present worker has is refused, naming both. */
static bool absent(sr_agent *a, int r)
{
    sr_tport *t = a->tp[r];
    return (t->caps & SR_TPORT_ELASTIC) && r != a->rank && sr__tport_peer_gone(t, r);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Two workers present with one name: the first pair in rank order, q < r. */
static int name_clash(sr_agent *a, int q, int r)
{
    if ((a->tp[r]->caps & SR_TPORT_ELASTIC) && (q == a->rank || r == a->rank))
        return sr__fail(-EEXIST, "sr_init", "Worker name '%s' of rank %d is taken: rank %d, present in "
                        "the job, has it", a->names[r], a->rank, q == a->rank ? r : q);
    return sr__fail(-EINVAL, "sr_init", "Worker name '%s' is not unique (workers %d and %d)", a->names[r], q, r);
}

/* Copy every rank's name and check that the workers present have distinct
 * ones: a hash table of ranks by name, so that each worker's check is O(N)
 * and not N^2 / 2 comparisons (a millisecond per worker at 1024 workers,
 * and every worker does it). The table keeps the first rank with a name, so
 * a clash names the same pair as a scan in rank order would. */
static int collect_names(sr_agent *a)
{
    a->names = a->world > 0 ? calloc((size_t)a->world, sizeof(*a->names)) : NULL; /* world >= 1: the segment's */
    size_t cap = 2;
    while (cap < 2 * (size_t)a->world)
        cap *= 2;
    int *table = malloc(cap * sizeof(*table)); /* rank + 1; 0: empty */
    int rc = a->names && table ? 0 : sr__fail(-ENOMEM, "sr_init", "out of memory");
    if (table)
        memset(table, 0, cap * sizeof(*table));
    for (int r = 0; !rc && r < a->world; r++) {
        memcpy(a->names[r], a->tp[r]->ops->name(a->tp[r], r), SR_NAME_MAX);
        a->names[r][SR_NAME_MAX - 1] = '\0';
        if (!a->names[r][0]) /* a free rank nobody held: its default, for messages (sr_worker_rank skips it) */
            snprintf(a->names[r], sizeof(a->names[r]), "worker%d", r);
        if (absent(a, r))
            continue;
        size_t i = (size_t)name_hash(a->names[r]) & (cap - 1);
        for (; table[i] && strcmp(a->names[table[i] - 1], a->names[r]); i = (i + 1) & (cap - 1))
            ;
        if (table[i])
            rc = name_clash(a, table[i] - 1, r);
        else
            table[i] = r + 1;
    }
    free(table);
    return rc;
}

static void agent_free(sr_agent *a)
{
    sr__agent_release_held(a); /* none but a failed init's (teardown dropped them) */
    sr__modules_fini(); /* a no-op if teardown did it already */
    sr__reorder_destroy(a);
    if (a->slots)
        sr__calls_fini(a);
    sr__transport_close(a->tports);
    free(a->names);
    free(a->gone);
    free(a->expect);
    sr_future_unref(a->returns);
    free(a->quiesce);
    free(a->ctl_in);
    free(a->leave_want);
    free(a->leave_sent);
    free(a->leave_done);
    pthread_mutex_destroy(&a->gone_lock);
    pthread_mutex_destroy(&a->ctl_lock);
    sr__outq_fini(a);
    free(a);
}

static int agent_create(const sr_init_opts *o, sr_agent **out)
{
    char name[SR_NAME_MAX];
    sr_agent *a = calloc(1, sizeof(*a));
    if (!a)
        return sr__fail(-ENOMEM, "sr_init", "out of memory");
    pthread_mutex_init(&a->ctl_lock, NULL);
    pthread_mutex_init(&a->gone_lock, NULL);
    a->ctl_gone_rank = -1;
    int rc = 0;
    /* A name given is checked before anything else: the transports' opening
     * may be collective (a launcher's bootstrap), and a rank refused alone
     * must not enter it. */
    if (o->name && strnlen(o->name, SR_NAME_MAX) >= SR_NAME_MAX) /* before copying: never truncate */
        rc = sr__fail(-EINVAL, "sr_init", "Worker name must be shorter than %d characters, got %zu: '%.40s...'",
                      SR_NAME_MAX, strlen(o->name), o->name);
    if (!rc && o->name) {
        snprintf(name, sizeof(name), "%s", o->name);
        rc = name_check(name);
    }
    if (!rc)
        rc = transports(a, o->name ? name : NULL);
    if (!rc)
        rc = collect_names(a);
    if (!rc)
        rc = sr__counters_init(a);
    if (!rc && (!(a->gone = calloc((size_t)a->world, 1)) || !(a->ctl_in = calloc((size_t)a->world, 1)) ||
                !(a->expect = calloc((size_t)a->world, sizeof(*a->expect))) ||
                !(a->quiesce = calloc((size_t)a->world, sizeof(*a->quiesce)))))
        rc = sr__fail(-ENOMEM, "sr_init", "out of memory");
    if (!rc)
        sr__agent_stamps_init(a);
    if (!rc && !(a->returns = sr_future_new()))
        rc = sr__fail(-ENOMEM, "sr_init", "out of memory");
    if (!rc)
        rc = sr__calls_init(a, CALL_SLOTS);
    if (!rc)
        rc = sr__outq_init(a, sr__calls_fail_peer);
    if (!rc)
        rc = sr__reorder_create(a);
    int64_t ms = 0;
    if (!rc)
        rc = sr__timeout_ms(o->rpc_timeout_s > 0 ? o->rpc_timeout_s : SR_DEFAULT_RPC_TIMEOUT, "sr_init", &ms);
    atomic_init(&a->default_timeout_ms, ms);
    if (rc) {
        agent_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

/* A failed init: stop the executors already started, free everything. */
static void abandon(sr_agent *a)
{
    sr__exec_stop(a);
    sr__exec_fini(a);
    agent_free(a);
}

SR_API int sr_init(const sr_init_opts *opts)
{
    static const sr_init_opts defaults;
    if (!opts)
        opts = &defaults;
    if (opts->num_worker_threads < 0 || opts->num_worker_threads > 1024)
        return sr__fail(-EINVAL, "sr_init", "num_worker_threads %d is out of range [0, 1024]", opts->num_worker_threads);
    if (!(opts->rpc_timeout_s >= 0)) /* NaN too */
        return sr__fail(-EINVAL, "sr_init", "rpc_timeout_s %g is not a number of seconds >= 0 (0: the default, "
                        "SR_TIMEOUT_NONE: none)", opts->rpc_timeout_s);
    sr__builtins_init();
    pthread_mutex_lock(&life_lock);
    int rc = 0;
    sr_agent *a = sr__agent_get(NULL);
    if (a) {
        sr__agent_put(a);
        a = NULL;
        rc = sr__fail(-EALREADY, "sr_init", "RPC is already initialized");
    }
    if (!rc)
        rc = agent_create(opts, &a);
    if (!rc && (rc = sr__exec_start(a, opts->num_worker_threads ? opts->num_worker_threads
                                                                : SR_DEFAULT_NUM_WORKER_THREADS)))
        abandon(a);
    if (!rc) {
        /* The modules see the agent (rank, world) before any message can arrive. */
        sr__modules_identity(a->rank, a->world, a->reorder != NULL);
        sr__agent_publish(a);
        if ((rc = sr__modules_init(opts)) || (rc = sr__agent_start(a))) {
            sr__agent_unpublish(a);
            abandon(a);
            sr__modules_identity(-1, 0, false);
        }
    }
    if (!rc)
        sr__leaks_baseline();
    pthread_mutex_unlock(&life_lock);
    return rc;
}

/* Stop the executors, then wait for every thread inside an entry point to
 * leave, then stop the progress thread, then free (agent.h, "Lifetime"). */
static void teardown(sr_agent *a)
{
    sr__exec_stop(a);  /* first: a function finishing a nested call still gets its answer */
    sr__agent_unpublish(a); /* the progress thread still serves the threads that leave */
    sr__agent_stop(a);
    sr__exec_fini(a); /* requests the progress thread queued after the executors left */
    sr__agent_release_held(a); /* nobody holds the token now; the modules still let go of what they carry */
    sr__modules_fini(); /* no thread of the runtime is left to race it */
    sr__modules_identity(-1, 0, false);
    agent_free(a);
}

SR_API int sr_shutdown(bool graceful, double timeout_s)
{
    int64_t ms = 0;
    int rc = sr__timeout_ms(timeout_s, "sr_shutdown", &ms);
    if (rc) /* refused before anything is done: the caller may call again */
        return rc;
    pthread_mutex_lock(&life_lock);
    sr_agent *a = sr__agent_get("sr_shutdown");
    if (a) /* life_lock keeps it: no other sr_shutdown can free it */
        sr__agent_put(a);
    rc = a ? 0 : -SR_ESHUTDOWN;
    if (a && graceful) /* an elastic job: this worker leaves, nobody else waits (leave.c) */
        rc = a->elastic ? sr__leave(a, sr__deadline_ns(sr__now_ns(), ms))
                        : sr__graceful(a, sr__deadline_ns(sr__now_ns(), ms));
    if (a) {
        char keep[512], who[160];
        snprintf(keep, sizeof(keep), "%s", sr_last_error());
        snprintf(who, sizeof(who), "%s (rank %d)", a->names[a->rank], a->rank);
        teardown(a); /* always, even after an error */
        sr__error_set_text(keep);
        if (!rc && graceful) /* after teardown: the runtime holds nothing of the user's */
            rc = sr__leaks_check(who);
    }
    pthread_mutex_unlock(&life_lock);
    return rc;
}

SR_API int sr_wait_for_worker(int rank, double timeout_s)
{
    int64_t ms = 0;
    int rc = sr__timeout_ms(timeout_s, "sr_wait_for_worker", &ms);
    if (rc)
        return rc;
    sr_agent *a = sr__agent_get("sr_wait_for_worker");
    if (!a)
        return -SR_ESHUTDOWN;
    int64_t deadline = sr__deadline_ns(sr__now_ns(), ms);
    if (rank < 0 || rank >= a->world)
        rc = sr__fail(-EINVAL, "sr_wait_for_worker", "rank %d is out of range [0, %d)", rank, a->world);
    for (sr_future *f; !rc && (f = sr__agent_await_rank(a, rank));) {
        char how[256];
        if (!a->replaces) /* gone for good */
            rc = sr__fail(-EPIPE, "sr_wait_for_worker", "%s is gone and this job replaces no rank: %s",
                          a->names[rank], a->tp[rank]->ops->live->gone_text(a->tp[rank], rank, how, sizeof(how)));
        else if (sr__future_wait_until(f, deadline))
            rc = sr__fail(-ETIMEDOUT, "sr_wait_for_worker", "%s (rank %d) did not come back within %g s",
                          a->names[rank], rank, timeout_s);
        sr_future_unref(f);
    }
    sr__agent_put(a);
    return rc;
}

SR_API int sr_worker_present(int rank)
{
    sr_agent *a = sr__agent_get("sr_worker_present");
    if (!a)
        return -SR_ESHUTDOWN;
    int rc = rank < 0 || rank >= a->world
                 ? sr__fail(-EINVAL, "sr_worker_present", "rank %d is out of range [0, %d)", rank, a->world)
                 : sr__agent_generation(a, rank) >= 0;
    sr__agent_put(a);
    return rc;
}

SR_API int sr_wait_for_departure(int rank, double timeout_s)
{
    int64_t ms = 0;
    int rc = sr__timeout_ms(timeout_s, "sr_wait_for_departure", &ms);
    if (rc)
        return rc;
    sr_agent *a = sr__agent_get("sr_wait_for_departure");
    if (!a)
        return -SR_ESHUTDOWN;
    int64_t deadline = sr__deadline_ns(sr__now_ns(), ms);
    if (rank < 0 || rank >= a->world || rank == a->rank)
        rc = sr__fail(-EINVAL, "sr_wait_for_departure", "rank %d is out of range [0, %d) or this worker's own", rank,
                      a->world);
    for (sr_future *f; !rc && (f = sr__agent_await_departure(a, rank));) {
        if (sr__future_wait_until(f, deadline))
            rc = sr__fail(-ETIMEDOUT, "sr_wait_for_departure", "%s (rank %d) was still present after %g s",
                          a->names[rank], rank, timeout_s);
        sr_future_unref(f);
    }
    sr__agent_put(a);
    return rc;
}

SR_API int64_t sr_worker_generation(int rank)
{
    sr_agent *a = sr__agent_get("sr_worker_generation");
    if (!a)
        return -SR_ESHUTDOWN;
    int64_t g = rank < 0 || rank >= a->world
                    ? sr__fail(-EINVAL, "sr_worker_generation", "rank %d is out of range [0, %d)", rank, a->world)
                    : sr__agent_generation(a, rank);
    if (g == -EPIPE)
        sr__fail(-EPIPE, "sr_worker_generation", "%s (rank %d) is gone and not back yet", a->names[rank], rank);
    sr__agent_put(a);
    return g;
}

SR_API int sr_rank(void)
{
    sr_agent *a = sr__agent_get("sr_rank");
    if (!a)
        return -SR_ESHUTDOWN;
    int r = a->rank;
    sr__agent_put(a);
    return r;
}

SR_API int sr_world_size(void)
{
    sr_agent *a = sr__agent_get("sr_world_size");
    if (!a)
        return -SR_ESHUTDOWN;
    int w = a->world;
    sr__agent_put(a);
    return w;
}

/* The names live in the segment's worker table (collect_names copies them
 * from there), which stays mapped for the life of the process's attachment;
 * the pointer returned is valid until sr_shutdown. */
SR_API const char *sr_worker_name(int rank)
{
    sr_agent *a = sr__agent_get("sr_worker_name");
    if (!a)
        return NULL;
    const char *n = NULL;
    if (rank < 0 || rank >= a->world)
        sr__fail(-EINVAL, "sr_worker_name", "rank %d is out of range [0, %d)", rank, a->world);
    else
        n = a->names[rank];
    sr__agent_put(a);
    return n;
}

SR_API int sr_worker_rank(const char *name)
{
    sr_agent *a = sr__agent_get("sr_worker_rank");
    if (!a)
        return -SR_ESHUTDOWN;
    int found = -1;
    if (a->elastic) /* only the workers present have names (their exits handled first) */
        sr__agent_check_exits(a);
    pthread_mutex_lock(&a->gone_lock); /* names of ranks that come back are written under it (exits.c) */
    for (int r = 0; name && r < a->world && found < 0; r++)
        if (!strcmp(a->names[r], name) && (!a->elastic || a->gone[r] == SR_GONE_NO))
            found = r;
    pthread_mutex_unlock(&a->gone_lock);
    sr__agent_put(a);
    if (found >= 0)
        return found;
    return sr__fail(-EINVAL, "sr_worker_rank", "could not find destination '%s'", name ? name : "(null)");
}

SR_API int sr_set_rpc_timeout(double s)
{
    int64_t ms = 0;
    int rc = sr__timeout_ms(s == 0 ? SR_DEFAULT_RPC_TIMEOUT : s, "sr_set_rpc_timeout", &ms);
    if (rc)
        return rc;
    sr_agent *a = sr__agent_get("sr_set_rpc_timeout");
    if (!a)
        return -SR_ESHUTDOWN;
    /* relaxed: read once per call at send time */
    atomic_store_explicit(&a->default_timeout_ms, ms, memory_order_relaxed);
    sr__agent_put(a);
    return 0;
}

SR_API double sr_get_rpc_timeout(void)
{
    sr_agent *a = sr__agent_get("sr_get_rpc_timeout");
    if (!a)
        return -1.0;
    /* relaxed: see sr_set_rpc_timeout */
    int64_t ms = atomic_load_explicit(&a->default_timeout_ms, memory_order_relaxed);
    double s = ms ? (double)ms / 1000.0 : SR_TIMEOUT_NONE;
    sr__agent_put(a);
    return s;
}

/* ---- calls (the caller's path: calls.c) ----------------------------------- */

/* who: sr_rpc_async or sr_rpc_sync, for errors. */
static int rpc_async(sr_agent *a, int to, const char *fn, sr_args args, double timeout_s, sr_future **out,
                     const char *who)
{
    int64_t ms = 0;
    if (!out)
        return sr__fail(-EINVAL, who, "out is NULL");
    int rc = sr__call_check(a, to, fn, args, timeout_s, &ms);
    if (rc)
        return rc;
    sr_future *f = sr__future_new_call();
    if (!f)
        return -ENOMEM;
    struct sr_req q = {.kind = SR_REQ_CALL, .who = who};
    if ((rc = sr__rpc_start(a, to, &q, fn, args, ms, f))) {
        sr_future_unref(f);
        return rc;
    }
    *out = f;
    return 0;
}

SR_API int sr_rpc_async(int to, const char *fn, sr_args args, double timeout_s, sr_future **out)
{
    sr_agent *a = sr__agent_get("sr_rpc_async");
    if (!a)
        return -SR_ESHUTDOWN;
    int rc = rpc_async(a, to, fn, args, timeout_s, out, "sr_rpc_async");
    sr__agent_put(a);
    return rc;
}

SR_API int sr_rpc_sync(int to, const char *fn, sr_args args, double timeout_s, sr_value **out)
{
    sr_agent *a = sr__agent_get("sr_rpc_sync");
    if (!a)
        return -SR_ESHUTDOWN;
    sr_future *f;
    sr__agent_pretake(a); /* hold the inbox across the send: the response then wakes no other thread */
    int rc = rpc_async(a, to, fn, args, timeout_s, &f, "sr_rpc_sync");
    if (rc) {
        sr__agent_unhold(a);
        sr__agent_put(a);
        return rc;
    }
    rc = sr__agent_wait_counted(a, f, -1, SR_POLL_NESTED); /* uses the held token; a caller: serves no plain call; lets go of the reference */
    if (!rc)
        rc = sr_future_value(f, out);
    sr_future_unref(f);
    return rc;
}

/* sr_serve_until's wait, until deadline (-1: none). */
static int serve_until(sr_future *f, int64_t deadline)
{
    sr_agent *a = sr__agent_get(NULL);
    if (!a)
        return sr__future_wait_until(f, deadline); /* no inbox to serve: a plain wait */
    if (sr__agent_polling_here(a)) { /* a nested wait keeps polling (agent.h): no jobs kept for later */
        sr__agent_put(a);
        return sr__future_wait_until(f, deadline);
    }
    /* The IDLE poll of sr_shutdown's waits (agent.h): plain functions and
     * module jobs this thread reads run here once it has handed the inbox
     * back (serve.c, start_call; exec.c, sr__exec_submit). */
    bool was = sr__exec_take_jobs(true);
    int rc = sr__agent_wait_counted(a, f, deadline, SR_POLL_IDLE); /* lets go of the reference */
    sr__exec_take_jobs(was);
    return rc;
}

SR_API int sr_serve_until(sr_future *f, sr_value **out)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_serve_until", "future is NULL");
    int rc = serve_until(f, -1);
    return rc ? rc : sr_future_value(f, out);
}

SR_API int sr_serve_until_timeout(sr_future *f, double timeout_s, sr_value **out)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_serve_until_timeout", "future is NULL");
    int64_t ms = 0;
    int rc = sr__timeout_ms(timeout_s, "sr_serve_until_timeout", &ms);
    if (rc)
        return rc;
    rc = serve_until(f, sr__deadline_ns(sr__now_ns(), ms));
    if (rc == -ETIMEDOUT) {
        char who[32] = ""; /* "worker3: "; none before sr_init or after sr_shutdown */
        sr_agent *a = sr__agent_get(NULL);
        if (a) {
            snprintf(who, sizeof(who), "worker%d: ", a->rank);
            sr__agent_put(a);
        }
        return sr__fail(-ETIMEDOUT, "sr_serve_until_timeout", "%sthe future was not done within %g s", who, timeout_s);
    }
    return rc ? rc : sr_future_value(f, out);
}

SR_API int sr_debug_info_get(sr_debug_info *o)
{
    if (!o)
        return sr__fail(-EINVAL, "sr_debug_info_get", "out is NULL");
    sr_agent *a = sr__agent_get("sr_debug_info_get");
    if (!a)
        return -SR_ESHUTDOWN;
    /* relaxed throughout: a snapshot of statistics */
    *o = (sr_debug_info){
        .client_active_calls = sr__counters_in_flight(a->ctr),
        .server_active_calls = sr__counters_serving(a->ctr),
        .server_async_calls = atomic_load_explicit(&a->server_async, memory_order_relaxed),
        .thread_pool_size = (uint32_t)atomic_load_explicit(&a->nexec, memory_order_relaxed),
        .num_idle_threads = atomic_load_explicit(&a->exec_idle, memory_order_relaxed),
    };
    struct sr_tport_stats st;
    a->self->ops->stats(a->self, &st);
    o->messages_sent = st.sent;
    o->messages_received = st.received;
    o->wakes_issued = st.wakes;
    o->sleeps_taken = st.sleeps;
    sr__agent_put(a);
    return 0;
}
