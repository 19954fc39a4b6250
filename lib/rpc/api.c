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

static int collect_names(sr_agent *a)
{
    a->names = a->world > 0 ? calloc((size_t)a->world, sizeof(*a->names)) : NULL; /* world >= 1: the segment's */
    if (!a->names)
        return sr__fail(-ENOMEM, "sr_init", "out of memory");
    for (int r = 0; r < a->world; r++) {
        memcpy(a->names[r], a->tp[r]->ops->name(a->tp[r], r), SR_NAME_MAX);
        a->names[r][SR_NAME_MAX - 1] = '\0';
        for (int q = 0; q < r; q++)
            if (!strcmp(a->names[q], a->names[r]))
                return sr__fail(-EINVAL, "sr_init", "Worker name '%s' is not unique (workers %d and %d)",
                                a->names[r], q, r);
    }
    return 0;
}

static void agent_free(sr_agent *a)
{
    sr__modules_fini(); /* a no-op if teardown did it already */
    sr__reorder_destroy(a);
    if (a->slots)
        sr__calls_fini(a);
    sr__transport_close(a->tports);
    free(a->names);
    free(a->gone);
    free(a->ctl_in);
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
    if (!rc && (!(a->gone = calloc((size_t)a->world, sizeof(bool))) ||
                !(a->ctl_in = calloc((size_t)a->world, 1))))
        rc = sr__fail(-ENOMEM, "sr_init", "out of memory");
    if (!rc)
        rc = sr__calls_init(a, CALL_SLOTS);
    if (!rc)
        rc = sr__outq_init(a);
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
    if (!(opts->rpc_timeout_s >= 0) || isinf(opts->rpc_timeout_s)) /* NaN too */
        return sr__fail(-EINVAL, "sr_init", "rpc_timeout_s %g is not a finite number of seconds >= 0",
                        opts->rpc_timeout_s);
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
    if (a && graceful)
        rc = sr__graceful(a, sr__deadline_ns(sr_now_ns(), ms));
    if (a) {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", sr_last_error());
        teardown(a); /* always, even after an error */
        sr__error_set_text(keep);
    }
    pthread_mutex_unlock(&life_lock);
    return rc;
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
    for (int r = 0; name && r < a->world && found < 0; r++)
        if (!strcmp(a->names[r], name))
            found = r;
    sr__agent_put(a);
    if (found >= 0)
        return found;
    return sr__fail(-EINVAL, "sr_worker_rank", "could not find destination '%s'", name ? name : "(null)");
}

SR_API int sr_set_rpc_timeout(double s)
{
    int64_t ms = 0;
    int rc = sr__timeout_ms(s, "sr_set_rpc_timeout", &ms);
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
    double s = (double)atomic_load_explicit(&a->default_timeout_ms, memory_order_relaxed) / 1000.0;
    sr__agent_put(a);
    return s;
}

/* ---- calls ---------------------------------------------------------------- */

int sr__call_check(sr_agent *a, int to, const char *fn, sr_args args, double timeout, int64_t *ms)
{
    const char *who = "sr_rpc";
    if (to < 0 || to >= a->world)
        return sr__fail(-EINVAL, who, "destination rank %d is out of range [0, %d)", to, a->world);
    int rc = sr__fn_name_check(fn, who);
    if (rc)
        return rc;
    if (args.n && !args.v)
        return sr__fail(-EINVAL, who, "%zu arguments but the array is NULL", args.n);
    for (size_t i = 0; i < args.n; i++)
        if (!args.v[i])
            return sr__fail(-EINVAL, who, "argument %zu of '%s' is NULL", i, fn);
    if (timeout < 0 && !isinf(timeout)) {
        /* relaxed: the default is captured now, at send time */
        *ms = atomic_load_explicit(&a->default_timeout_ms, memory_order_relaxed);
        return 0;
    }
    return sr__timeout_ms(timeout, who, ms); /* NaN and the infinities: -EINVAL */
}

static enum sr_call_kind call_kind(const struct sr_req *q)
{
    return q->kind == SR_REQ_KEEP ? SR_CALL_KEEP : q->kind == SR_REQ_MODULE ? SR_CALL_MODULE : SR_CALL_UNKNOWN;
}

enum sr_call_kind sr__call_out_kind(const struct sr_call_out *o)
{
    if (o->kind != SR_CALL_UNKNOWN)
        return o->kind;
    const struct sr_fn_entry *e = o->fn ? sr__registry_find(o->fn, strlen(o->fn)) : NULL;
    return e && (e->kind == SR_FN_BUILTIN || e->kind == SR_FN_BUILTIN_CHEAP) ? SR_CALL_BUILTIN : SR_CALL_USER;
}

/* The modules' extension bytes for this request (ext.h). */
static void request_ext(int to, const struct sr_req *q, const char *fn, sr_args args, struct sr_ext_buf *e)
{
    struct sr_call_out o = {.to = to, .kind = call_kind(q), .fn = fn, .args = args,
                            .module = q->module, .sub = q->sub};
    sr__ext_request_out(&o, q->ext_len ? q->module : -1, q->ext, q->ext_len, e);
}

/* Encode [extension block] + name + args into m's payload (no name for a
 * module request); *enc and *enc_len locate the encoded args,
 * whose references (objects, tensor blocks, RRef forks) are released if the
 * request is never sent. */
static int build_request(sr_agent *a, int to, const struct sr_req *q, const char *fn, sr_args args, sr_msg *m,
                         struct sr_wire *w, const uint8_t **enc, size_t *enc_len)
{
    struct sr_ext_buf ext;
    request_ext(to, q, fn, args, &ext);
    size_t nlen = fn ? strlen(fn) : 0;
    int64_t alen = sr_codec_size(args.n, args.v, to == a->rank);
    if (alen < 0)
        return (int)alen;
    static const uint16_t wire_type[] = {[SR_REQ_CALL] = SR_MSG_REQ, [SR_REQ_KEEP] = SR_MSG_KEEP_CALL,
                                         [SR_REQ_MODULE] = SR_MSG_MOD_REQ};
    m->type = wire_type[q->kind];
    w->name_len = (uint16_t)(q->kind == SR_REQ_MODULE ? q->sub : nlen);
    w->ctrl = q->kind == SR_REQ_CALL ? 0 : (uint8_t)q->module;
    uint8_t *p = sr__payload_reserve(m, w, ext.len + nlen + (size_t)alen);
    if (!p)
        return -ENOMEM;
    w->flags |= ext.len ? SR_WIRE_EXT : 0;
    w->tag = q->tag;
    memcpy(p, ext.b, ext.len);
    p += ext.len;
    memcpy(p, fn ? fn : "", nlen);
    int64_t wrote = sr_codec_encode_to(args.n, args.v, to == a->rank, to, p + nlen, (size_t)alen);
    if (wrote != alen) {
        sr__payload_abandon(w);
        return wrote < 0 ? (int)wrote : sr__fail(-EINVAL, "sr_rpc", "cannot encode the arguments of '%s'", fn);
    }
    *enc = p + nlen;
    *enc_len = (size_t)alen;
    return 0;
}

/* The profiler learns of the call before its request can be answered. */
static int64_t probe_out(uint64_t id, int to, const struct sr_req *q, const char *fn)
{
    char buf[96];
    int64_t t0 = sr_probe_now();
    if (!fn)
        fn = sr__probe_module_name(q->module, SR_MSG_MOD_REQ, q->sub, NULL, buf, sizeof(buf));
    sr__probe_ops->call_out(id, to, fn, t0);
    return t0;
}

int sr__rpc_start(sr_agent *a, int to, const struct sr_req *q, const char *fn, sr_args args, int64_t ms,
                  sr_future *f)
{
    sr_msg m = {0};
    struct sr_wire w = {0};
    const uint8_t *enc = NULL;
    size_t enc_len = 0;
    int rc = build_request(a, to, q, fn, args, &m, &w, &enc, &enc_len);
    if (rc)
        return rc;
    if ((rc = sr__call_begin(a, to, ms, f, &w.call_id))) {
        if (enc_len)
            sr_codec_release(enc, enc_len);
        sr__payload_abandon(&w);
        return rc;
    }
    int64_t t0 = sr__probing() ? probe_out(w.call_id, to, q, fn) : 0;
    sr_wire_put(&m, &w, false);
    atomic_fetch_add_explicit(&a->user_sent, 1, memory_order_relaxed); /* relaxed: counted before it can arrive */
    if ((rc = sr__agent_send(a, to, &m))) {
        sr_future *own = sr__call_end(a, w.call_id);
        sr_future_unref(own);
        if (enc_len)
            sr_codec_release(enc, enc_len);
        sr__payload_abandon(&w);
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: it never arrives */
    }
    if (t0 && sr__probing())
        sr__probe_ops->call_sent(w.call_id, to, rc, t0, sr_probe_now());
    return rc;
}

static int rpc_async(sr_agent *a, int to, const char *fn, sr_args args, double timeout_s, sr_future **out)
{
    int64_t ms = 0;
    if (!out)
        return sr__fail(-EINVAL, "sr_rpc_async", "out is NULL");
    int rc = sr__call_check(a, to, fn, args, timeout_s, &ms);
    if (rc)
        return rc;
    sr_future *f = sr_future_new();
    if (!f)
        return -ENOMEM;
    struct sr_req q = {.kind = SR_REQ_CALL};
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
    int rc = rpc_async(a, to, fn, args, timeout_s, out);
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
    int rc = rpc_async(a, to, fn, args, timeout_s, &f);
    if (rc) {
        sr__agent_unhold(a);
        sr__agent_put(a);
        return rc;
    }
    rc = sr__agent_wait_counted(a, f, -1, SR_POLL_NESTED); /* uses the held token; lets go of the reference */
    if (!rc)
        rc = sr_future_value(f, out);
    sr_future_unref(f);
    return rc;
}

SR_API int sr_serve_until(sr_future *f, sr_value **out)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_serve_until", "future is NULL");
    sr_agent *a = sr__agent_get(NULL);
    if (!a)
        return sr_future_wait(f, out); /* no inbox to serve: a plain wait */
    if (sr__agent_polling_here(a)) { /* a nested wait keeps polling (agent.h): no jobs kept for later */
        sr__agent_put(a);
        return sr_future_wait(f, out);
    }
    /* The IDLE poll of sr_shutdown's waits (agent.h): plain functions and
     * module jobs this thread reads run here once it has handed the inbox
     * back (serve.c, start_call; exec.c, sr__exec_submit). */
    bool was = sr__exec_take_jobs(true);
    int rc = sr__agent_wait_counted(a, f, -1, SR_POLL_IDLE); /* lets go of the reference */
    sr__exec_take_jobs(was);
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
        .client_active_calls = atomic_load_explicit(&a->client_active, memory_order_relaxed),
        .server_active_calls = atomic_load_explicit(&a->server_active, memory_order_relaxed),
        .server_async_calls = atomic_load_explicit(&a->server_async, memory_order_relaxed),
        .thread_pool_size = (uint32_t)a->nexec,
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
