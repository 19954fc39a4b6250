/* Probes: where a profiler (lib/modules/trace) sees the agent's calls (internal).
 *
 * lib/rpc never names the profiler: lib/modules/trace registers one ops table from a
 * constructor (sr__probe_register) and turns it on and off with
 * sr__probe_set(mask). Each probe point in lib/rpc is
 *     if (sr__probing()) ...;
 * one relaxed load of a word that is almost never written, and one branch
 * the CPU predicts: that is the whole cost while profiling is off. A build
 * with -Dprobes=false (SR_NO_PROBES) compiles every point out; bench_rpc
 * measures both (docs/PERFORMANCE.md, "Profiling off").
 *
 * The ops run on the thread of the event, must not block and must not call
 * back into RPC. Times are CLOCK_MONOTONIC ns (sr_probe_now), the same clock
 * in every process of the host.
 *
 * A call's life, on each side:
 *   caller  call_out (before the request leaves: the id is now in flight),
 *           call_sent (it left, or failed to: rc), call_end (its answer
 *           arrived, or it expired or its peer died: from = -1; t0 the
 *           arrival, before the future completes).
 *   callee  serve_in (decoded: t_arrive, t_decoded), ran (the function
 *           returned on its thread: t_run0, t_run1), served (the answer is
 *           about to go: err, t), reply (it went out: from t0 to t1).
 *           struct sr_probe_call carries the times; a field of 0 was not
 *           measured (profiling was turned on mid-call).
 * The statistics of both sides are recorded before the caller's future
 * completes (call_end, served), so a caller that sees its call finished
 * sees it counted on both workers.
 * Raw module messages: msg (dir 0 sent, 1 received). Spans: span (a module's
 * own phases, e.g. a distributed autograd pass).
 */
#ifndef SR_RPC_PROBE_H
#define SR_RPC_PROBE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

enum { SR_PROBE_STATS = 1u, SR_PROBE_TRACE = 2u };

struct sr_probe_call {
    int caller;
    uint64_t call_id;
    const char *name;     /* the function, or "<module>:<request>" */
    int64_t t_arrive, t_decoded, t_run0, t_run1;
};

struct sr_probe_ops {
    void (*call_out)(uint64_t id, int to, const char *name, int64_t t0);
    void (*call_sent)(uint64_t id, int to, int rc, int64_t t0, int64_t t1);
    void (*call_end)(uint64_t id, int from, int err, int64_t t0, int64_t t1);
    void (*serve_in)(const struct sr_probe_call *c);
    void (*ran)(const struct sr_probe_call *c);
    void (*served)(const struct sr_probe_call *c, int err, int64_t t);
    void (*reply)(const struct sr_probe_call *c, int err, int64_t t0, int64_t t1);
    void (*msg)(int dir, int peer, const char *name, int64_t t);
    void (*span)(const char *cat, const char *name, int64_t t0, int64_t t1);
};

/* Written by sr__probe_set, read relaxed by every probe point: a point that
 * reads a stale mask misses or records one event, which is harmless; the ops
 * themselves are published before any mask is set (registration happens in
 * a constructor, before main). */
extern _Atomic uint32_t sr__probe_mask;
extern const struct sr_probe_ops *sr__probe_ops;

static inline bool sr__probing(void)
{
#ifdef SR_NO_PROBES
    return false;
#else
    /* relaxed: see sr__probe_mask */
    return __builtin_expect(atomic_load_explicit(&sr__probe_mask, memory_order_relaxed) != 0, 0);
#endif
}

static inline int64_t sr_probe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Register the one profiler (once, from a constructor): -EEXIST if taken. */
int sr__probe_register(const struct sr_probe_ops *ops);
/* Turn probes on (mask != 0) or off; returns the previous mask. */
uint32_t sr__probe_set(uint32_t mask);
/* A module's name for a request sub-kind or raw message (module.h, describe)
 * as "<module>:<what>" in buf. */
const char *sr__probe_module_name(int module, int type, uint8_t sub, char *buf, size_t len);
/* A span of a layer above RPC (no-op when off). */
void sr__probe_span(const char *cat, const char *name, int64_t t0);

#endif
