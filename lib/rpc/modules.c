/* SPDX-License-Identifier: MIT */
/* Protocol modules: the registry and the agent's side of the seam. See
 * module.h. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "agent.h"
#include "thread.h"
#include "error.h"
#include "module.h"
#include "wire.h"

const sr_module *sr__modules[SR_MODULE_MAX];
/* How many were registered, and how many of them have a value kind: only
 * the constructors write them, before main (see module.h, "Ids and kinds"). */
static int nmodules, nkinds;
/* The module of each value kind, by number - SR_KIND_MODULE. */
static int8_t kind_module[SR_MODULE_MAX];

uint8_t sr__hooks[SR_HOOK_N];

static void note_hooks(const sr_module *m, int id)
{
    const struct sr_module_call_ops *c = m->call;
    const struct sr_module_gate_ops *g = m->gate;
    const bool has[SR_HOOK_N] = {
        [SR_HOOK_REQUEST_OUT] = c && c->request_out, [SR_HOOK_REQUEST_IN] = c && c->request_in,
        [SR_HOOK_RUN_ENTER] = c && c->run_enter,     [SR_HOOK_RUN_EXIT] = c && c->run_exit,
        [SR_HOOK_RESPONSE_OUT] = c && c->response_out, [SR_HOOK_RESPONSE_IN] = c && c->response_in,
        [SR_HOOK_CALL_DONE] = c && c->call_done,
        [SR_HOOK_GATE] = g && g->gate,               [SR_HOOK_PREPARE] = g && g->prepare,
    };
    for (int h = 0; h < SR_HOOK_N; h++)
        if (has[h])
            sr__hooks[h] |= (uint8_t)(1u << id);
}

int sr__module_register(const sr_module *m, int *kind)
{
    if (!m || !m->name || (m->msg && (m->msg->ntypes > 4 || !m->msg->on_msg)))
        return -EINVAL;
    if (nmodules == SR_MODULE_MAX)
        return -ENOSPC;
    if (m->probe && sr__probe_ops)
        return -EEXIST;
    if (m->value_kind && !kind)
        return -EINVAL;
    if (m->value_kind) {
        kind_module[nkinds] = (int8_t)nmodules;
        *kind = SR_KIND_MODULE + nkinds++;
    }
    if (m->probe)
        sr__probe_ops = m->probe;
    sr__modules[nmodules] = m;
    note_hooks(m, nmodules);
    nmodules++;
    if (m->tls) /* user callbacks now carry the modules' thread context */
        sr__future_set_tls_hooks(sr__tls_capture, sr__tls_swap);
    return nmodules - 1;
}

/* The identity of the running agent, for the modules: set by sr_init before
 * the modules' init, cleared by sr_shutdown after their fini, so no module
 * reads a freed agent for it. */
static _Atomic int live_rank = -1, live_world;
static _Atomic bool live_reorder;

void sr__modules_identity(int rank, int world, bool reorder)
{
    /* relaxed: published to other threads by sr__agent_publish / thread creation */
    atomic_store_explicit(&live_rank, rank, memory_order_relaxed);
    atomic_store_explicit(&live_world, world, memory_order_relaxed);
    atomic_store_explicit(&live_reorder, reorder, memory_order_relaxed);
}

/* relaxed (the three): see sr__modules_identity */
int sr__rpc_rank(void) { return atomic_load_explicit(&live_rank, memory_order_relaxed); }
int sr__rpc_world(void) { return atomic_load_explicit(&live_world, memory_order_relaxed); }
bool sr__rpc_reordering(void) { return atomic_load_explicit(&live_reorder, memory_order_relaxed); }

uint32_t sr__rpc_generation(void)
{
    sr_agent *a = sr__agent_peek();
    return a ? a->gen : 0; /* fixed before the agent is published */
}

bool sr__rpc_replaces(void)
{
    sr_agent *a = sr__agent_peek();
    return a && a->replaces; /* fixed before the agent is published */
}

bool sr__rpc_peer_gone(int rank, char *why, size_t len)
{
    sr_agent *a = sr__agent_peek();
    if (!a || rank < 0 || rank >= a->world || !sr__tport_peer_gone(a->tp[rank], rank))
        return false;
    if (why)
        a->tp[rank]->ops->live->gone_text(a->tp[rank], rank, why, len);
    return true;
}

uint32_t sr__rpc_peer_generation(int rank)
{
    sr_agent *a = sr__agent_peek();
    if (!a || rank < 0 || rank >= a->world)
        return 0;
    if (rank == a->rank)
        return a->gen;
    if (!(a->tp[rank]->caps & SR_TPORT_REPLACES))
        return 0;
    return a->tp[rank]->ops->live->generation(a->tp[rank], rank);
}

bool sr__rpc_shares_heap(int rank)
{
    sr_agent *a = sr__agent_peek();
    return a && sr__agent_shares_heap(a, rank);
}

int64_t sr__rpc_default_timeout_ms(void)
{
    sr_agent *a = sr__agent_get(NULL);
    /* relaxed: the default is captured now, like a call's */
    int64_t ms = a ? atomic_load_explicit(&a->default_timeout_ms, memory_order_relaxed) : 0;
    if (a)
        sr__agent_put(a);
    return ms;
}

int sr__module_rpc(int to, int module, uint8_t sub, uint64_t tag, sr_args args, int64_t timeout_ms,
                   sr_future **out, const char *who)
{
    sr_agent *a = sr__agent_get(who);
    if (!a)
        return -SR_ESHUTDOWN;
    int rc = 0;
    sr_future *f = NULL;
    if (to < 0 || to >= a->world)
        rc = sr__fail(-EINVAL, who, "destination rank %d is out of range [0, %d)", to, a->world);
    else if (!(f = sr_future_new()))
        rc = -ENOMEM;
    struct sr_req q = {.kind = SR_REQ_MODULE, .who = who, .module = module, .sub = sub, .tag = tag};
    if (!rc && (rc = sr__rpc_start(a, to, &q, NULL, args, timeout_ms, f)))
        sr_future_unref(f);
    sr__agent_put(a);
    if (!rc)
        *out = f;
    return rc;
}

/* The profiler: a raw message of module id went to or came from peer. */
static void probe_msg(int dir, int peer, int id, uint8_t type, const uint8_t *bytes)
{
    char name[64];
    sr__probe_module_name(id, SR_MSG_MODULE_BASE + 4 * id + type, type, bytes, name, sizeof(name));
    sr__probe_ops->msg(dir, peer, name, sr__probe_now());
}

static_assert(SR_MODULE_MSG_MAX == SR_MSG_DATA, "a raw module message fills one slot");

int sr__module_send(int to, int module, uint8_t type, const void *bytes, size_t len, bool quiet)
{
    const sr_module *mod = module >= 0 && module < SR_MODULE_MAX ? sr__modules[module] : NULL;
    if (!mod || !mod->msg || type >= mod->msg->ntypes || len > SR_MODULE_MSG_MAX)
        return sr__fail(-EINVAL, "sr__module_send", "module %d: no raw message type %u of %zu bytes", module, type,
                        len);
    sr_msg m = {.type = (uint8_t)SR_MSG_MODULE_TYPE(module, type)};
    memcpy(m.data, bytes, len);
    if (sr__probing())
        probe_msg(0, to, module, type, m.data);
    sr_agent *a = sr__agent_get(NULL);
    if (!a)
        return -SR_ESHUTDOWN;
    unsigned slot = sr__quiesce_sent(a, to); /* before it can arrive */
    /* A message to a caller whose answer this thread sends next rides with
     * it: one doorbell, one wake-up (the answer follows it in the ring). */
    bool follows = sr__answer_follows(to);
    int rc = quiet || follows ? sr__agent_send_quiet(a, to, &m, follows) : sr__agent_send(a, to, &m);
    if (rc)
        sr__quiesce_unsent(a, to, slot);
    sr__agent_put(a);
    return rc;
}

int sr__module_wait(sr_future *f, int64_t deadline_ns)
{
    sr_agent *a = sr__agent_get(NULL);
    if (!a)
        return sr__future_wait_plain(f, deadline_ns);
    bool was = sr__exec_take_jobs(true); /* a module's waiter runs the module jobs it reads */
    int rc = sr__agent_wait_counted(a, f, deadline_ns, SR_POLL_NESTED);
    sr__exec_take_jobs(was);
    return rc;
}

void sr__tls_capture(struct sr_tls_snap *s)
{
    s->mask = 0;
    for (int id = 0; id < nmodules; id++) {
        const struct sr_module_tls_ops *t = sr__modules[id]->tls;
        if (t && t->get) {
            s->v[id] = t->get();
            s->mask |= (uint8_t)(1u << id);
        }
    }
}

void sr__tls_swap(struct sr_tls_snap *s)
{
    for (int id = 0; id < nmodules; id++)
        if (s->mask & (1u << id))
            s->v[id] = sr__modules[id]->tls->set(s->v[id]);
}

void sr__tls_clear(struct sr_tls_snap *s)
{
    s->mask = 0;
    for (int id = 0; id < nmodules; id++) {
        const struct sr_module_tls_ops *t = sr__modules[id]->tls;
        if (t && t->set) {
            s->v[id] = t->set(t->none);
            s->mask |= (uint8_t)(1u << id);
        }
    }
}

bool sr__module_msg(sr_agent *a, const sr_msg *m)
{
    int id = (m->type - SR_MSG_MODULE_BASE) / 4, type = (m->type - SR_MSG_MODULE_BASE) % 4;
    const sr_module *mod = m->type >= SR_MSG_MODULE_BASE && id < nmodules ? sr__modules[id] : NULL;
    if (!mod || !mod->msg || type >= mod->msg->ntypes)
        return false;
    if (sr__probing())
        probe_msg(1, m->src, id, (uint8_t)type, m->data);
    mod->msg->on_msg(m->src, (uint8_t)type, m->data, SR_MODULE_MSG_MAX);
    sr__quiesce_done(a, m->src, m->gens); /* after its answers were counted as sent */
    return true;
}

/* The life group of module id, or NULL. */
static const struct sr_module_life_ops *life(int id) { return sr__modules[id]->life; }

void sr__modules_peer_died(int rank, const char *why)
{
    for (int id = 0; id < nmodules; id++)
        if (life(id) && life(id)->peer_died)
            life(id)->peer_died(rank, why);
}

int sr__modules_init(const sr_init_opts *o)
{
    for (int id = 0; id < nmodules; id++) {
        int rc = life(id) && life(id)->init ? life(id)->init(o) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

/* Graceful shutdown steps: every module runs; the first error is kept. */
int sr__modules_shutdown_users(int64_t deadline_ns)
{
    int first = 0;
    for (int id = 0; id < nmodules; id++) {
        int rc = life(id) && life(id)->shutdown_users ? life(id)->shutdown_users(deadline_ns) : 0;
        first = first ? first : rc;
    }
    return first;
}

int sr__modules_shutdown_check(void)
{
    int first = 0;
    for (int id = 0; id < nmodules; id++) {
        int rc = life(id) && life(id)->shutdown_check ? life(id)->shutdown_check() : 0;
        first = first ? first : rc;
    }
    return first;
}

void sr__modules_fini(void)
{
    for (int id = nmodules - 1; id >= 0; id--)
        if (life(id) && life(id)->fini)
            life(id)->fini();
}

int sr__module_call_check(int to, const char *fn, sr_args args, double timeout_s, int64_t *ms, const char *who)
{
    sr_agent *a = sr__agent_get(who);
    if (!a)
        return -SR_ESHUTDOWN;
    int rc = sr__call_check(a, to, fn, args, timeout_s, ms);
    sr__agent_put(a);
    return rc;
}

int sr__module_call_start(int to, const struct sr_req *q, const char *fn, sr_args args, int64_t ms, sr_future *f)
{
    sr_agent *a = sr__agent_get("sr_rpc");
    if (!a)
        return -SR_ESHUTDOWN;
    int rc = sr__rpc_start(a, to, q, fn, args, ms, f);
    sr__agent_put(a);
    return rc;
}

const sr_value_kind_ops *sr__value_kind(int kind)
{
    if (kind < SR_KIND_MODULE || kind >= SR_KIND_MODULE + nkinds)
        return NULL;
    return sr__modules[kind_module[kind - SR_KIND_MODULE]]->value_kind;
}
