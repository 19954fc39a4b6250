/* The RRef layer as a protocol module of the agent (lib/rpc/module.h). */
#include "rpc/module.h"
#include "rref/hooks.h"

static int64_t rref_next_deadline(void) { return sr__rref_next_deadline(); }
static void rref_tick(void) { sr__rref_tick(sr__agent); }
static void rref_peer_died(int rank) { sr__rref_peer_died(sr__agent, rank); }
static int rref_init(const sr_init_opts *o) { return sr__rref_init(sr__agent, o->ignore_rref_leak); }
static int rref_shutdown_users(int64_t deadline) { return sr__rref_shutdown_users(sr__agent, deadline); }
static int rref_shutdown_check(void) { return sr__rref_shutdown_check(sr__agent); }

static const sr_module rref_module = {
    .name = "rref",
    .next_deadline = rref_next_deadline,
    .tick = rref_tick,
    .peer_died = rref_peer_died,
    .init = rref_init,
    .shutdown_users = rref_shutdown_users,
    .shutdown_check = rref_shutdown_check,
    .fini = sr__rref_fini,
};

__attribute__((constructor)) static void rref_register(void)
{
    sr__module_register(SR_MOD_RREF, &rref_module);
}
