/* SPDX-License-Identifier: MIT */
/* RRef protocol tests on 4 workers: the four sharing scenarios of the RRef
 * protocol note (seed 000), each with the owner's fork set checked at the
 * protocol's stable points; the RRef-to-self cases; RRefs nested in lists,
 * as arguments and results; nested remote(); a chain of 8 forwards; ids and
 * string forms. The same binary runs under the reordering delivery mode
 * (SHMRPC_REORDER_SEED, tests/meson.build) with many seeds.
 *
 * Stable points: a fork is known to its owner once the user is confirmed
 * (wait_confirmed; hold and rref_info wait for it before they return) or
 * once the worker holding it is idle; a delete has been applied once its
 * sender is idle (sr_rref_wait_idle). */
#include <poll.h>
#include <unistd.h>

#include "rref_fns.h"
#include "module.h" /* the RPC seam: sr__future_wait_until */
#include "waiter.h" /* sr__now_ns */

LEAK_CHECKED_SUITE(rref);

/* Scenario 1: the user creates the RRef with remote() (user -> owner, as
 * the return value). Ids and string forms: a fresh worker's first remote()
 * gets rref local id 0 and fork local id 1. */
static int sc_remote_return(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *n = sr_int(5);
    sr_rref *r = NULL;
    WCHECK(sr_remote(2, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value_unref(n);
    WCHECK(!sr_rref_is_owner(r) && sr_rref_owner(r) == 2 && !strcmp(sr_rref_owner_name(r), "worker2"), "owner");
    uint64_t rid = sr_rref_id(r), fid = sr_rref_fork_id(r);
    WCHECK(SR_RREF_ID_RANK(rid) == 0 && SR_RREF_ID_LOCAL(rid) == 0 && SR_RREF_ID_RANK(fid) == 0 &&
               SR_RREF_ID_LOCAL(fid) == 1,
           "first remote() ids: rref %#llx fork %#llx", (unsigned long long)rid, (unsigned long long)fid);
    char s[96];
    WCHECK(!strcmp(sr_rref_str(r, s, sizeof(s)), "UserRRef(rref_id=(0,0), fork_id=(0,1))"), "str: %s", s);
    if (wait_confirmed(r) || expect_forks(r, &fid, 1, "after REMOTE_RET") || expect_pair(r, 5))
        return 1;
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    sr_value *id = sr_int((int64_t)rid), *v = NULL;
    WCHECK(sr_rpc_sync(2, "forks_of", SR_ARGS(id), WAIT_S, &v) == 0 && sr_value_list_len(v) == 0,
           "the owner still has forks after the user's delete");
    sr_value_unref(v);
    sr_value_unref(id);
    return expect_all_counters_zero("after the delete");
}

Test(rref, scenario1_user_creates_with_remote, .timeout = 120)
{
    RREF_JOB("rref1", sc_remote_return, .shutdown_timeout = 60);
}

/* Scenario 2: a user passes the RRef to its owner as an argument: the owner
 * gets its OwnerRRef, and accepts the child (CHILD_ACCEPT), which releases
 * the parent; the phantom child fork never reaches the fork set. */
static int sc_user_to_owner(int rank, int world)
{
    (void)world;
    if (rank != 1)
        return 0;
    sr_value *n = sr_int(7), *info = NULL;
    sr_rref *r = NULL;
    WCHECK(sr_remote(3, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_sync(3, "rref_info", SR_ARGS(rv), WAIT_S, &info) == 0, "rref_info: %s", sr_last_error());
    WCHECK(sr_value_int(sr_value_list_at(info, 0)) == 1 && sr_value_int(sr_value_list_at(info, 3)) == 7,
           "the owner did not get its OwnerRRef with the value");
    sr_value_unref(info);
    sr_value_unref(rv);
    sr_value_unref(n);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    sr_rref_debug_info d;
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_pending_children == 0, "the child was never accepted");
    uint64_t fid = sr_rref_fork_id(r);
    if (wait_confirmed(r) || expect_forks(r, &fid, 1, "after the owner accepted the child"))
        return 1;
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return expect_all_counters_zero("after the delete");
}

Test(rref, scenario2_user_passes_to_owner, .timeout = 120)
{
    RREF_JOB("rref2", sc_user_to_owner, .shutdown_timeout = 60);
}

/* Scenario 3: the owner passes a local RRef(x) to a user: it enters the
 * context only now, with the child's fork registered before the message
 * leaves (early fork registration); the user is confirmed on arrival. */
static int sc_owner_to_user(int rank, int world)
{
    (void)world;
    if (rank != 1)
        return 0;
    sr_value *n1 = sr_int(1), *n2 = sr_int(2), *l = sr_list(2, (sr_value *[]){n1, n2}), *v = NULL;
    sr_rref *r = NULL;
    WCHECK(sr_rref_create(l, &r) == 0 && sr_rref_is_owner(r) && sr_rref_confirmed_by_owner(r), "rref_create");
    char s[96];
    WCHECK(!strncmp(sr_rref_str(r, s, sizeof(s)), "OwnerRRef(rref_id=(1,", 21), "str: %s", s);
    sr_rref_debug_info d;
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_owner_rrefs == 0, "RRef(x) is registered before any fork");
    sr_value *rv = sr_value_from_rref(r), *rv2 = sr_value_from_rref(r);
    WCHECK(sr_value_equal(rv, rv2) && sr_value_rref(rv2) == r && sr_value_type(rv) == SR_KIND_RREF,
           "two values of one RRef");
    sr_value_unref(rv2);
    WCHECK(sr_rpc_sync(3, "hold", SR_ARGS(rv), WAIT_S, &v) == 0, "hold: %s", sr_last_error());
    uint64_t fid = (uint64_t)sr_value_int(v);
    sr_value_unref(v);
    WCHECK(SR_RREF_ID_RANK(fid) == 1, "the fork id is made by the parent (rank 1), got %#llx", (unsigned long long)fid);
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_owner_rrefs == 1 && d.num_forks == 1, "early registration");
    if (expect_forks(r, &fid, 1, "while the user holds it"))
        return 1;
    sr_value *zero = sr_int(0), *seed = sr_int(7);
    WCHECK(sr_rpc_sync(3, "held_to_here", SR_ARGS(zero), WAIT_S, &v) == 0 && sr_value_equal(v, l),
           "the user's to_here: %s", sr_last_error());
    sr_value_unref(v);
    WCHECK(sr_rpc_sync(3, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "drop_held: %s", sr_last_error());
    sr_value_unref(v);
    if (expect_forks(r, NULL, 0, "after the user dropped it"))
        return 1;
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_owner_rrefs == 0, "not unregistered when its last fork went");
    WCHECK(sr_rref_local_value(r, &v) == 0 && v == l, "local_value is not the object itself");
    sr_value_unref(v);
    sr_rref_unref(r);
    sr_value_unref(rv);
    sr_value_unref(l);
    sr_value_unref(n1);
    sr_value_unref(n2);
    sr_value_unref(zero);
    sr_value_unref(seed);
    return 0;
}

Test(rref, scenario3_owner_passes_to_user, .timeout = 120)
{
    RREF_JOB("rref3", sc_owner_to_user, .shutdown_timeout = 60);
}

/* Scenario 4: a user passes the RRef to another user: the receiver asks the
 * owner (FORK_REQUEST) and runs its function at once; once confirmed it
 * accepts the child at the parent, which holds the parent until then (G2).
 * (hold itself waits for the confirmation: see rref_fns.h.) */
static int sc_user_to_user(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *n = sr_int(9), *v = NULL, *zero = sr_int(0), *seed = sr_int(3);
    sr_rref *r = NULL;
    WCHECK(sr_remote(2, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value *rv = sr_value_from_rref(r);
    /* Sent at once, before the owner may even have the RRef. */
    WCHECK(sr_rpc_sync(1, "hold", SR_ARGS(rv), WAIT_S, &v) == 0, "hold: %s", sr_last_error());
    uint64_t forks[2] = {sr_rref_fork_id(r), (uint64_t)sr_value_int(v)};
    sr_value_unref(v);
    WCHECK(SR_RREF_ID_RANK(forks[1]) == 0 && forks[1] != forks[0], "child fork id %#llx", (unsigned long long)forks[1]);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (wait_confirmed(r) || expect_forks(r, forks, 2, "parent and child alive"))
        return 1;
    WCHECK(sr_rpc_sync(1, "held_to_here", SR_ARGS(zero), WAIT_S, &v) == 0, "child's to_here: %s", sr_last_error());
    WCHECK(sr_value_int(sr_value_list_at(v, 0)) == 9, "child's to_here value");
    sr_value_unref(v);
    /* The parent goes first: the child keeps the value alive. */
    sr_rref_unref(r);
    sr_value_unref(rv);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    sr_value *id = sr_int((int64_t)forks[0] - 1); /* remote(): the rref id comes just before the fork id */
    WCHECK(sr_rpc_sync(2, "forks_of", SR_ARGS(id), WAIT_S, &v) == 0 && sr_value_list_len(v) == 1 &&
               (uint64_t)sr_value_int(sr_value_list_at(v, 0)) == forks[1],
           "after the parent's delete only the child's fork is left");
    sr_value_unref(v);
    WCHECK(sr_rpc_sync(1, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "drop_held: %s", sr_last_error());
    sr_value_unref(v);
    WCHECK(sr_rpc_sync(2, "forks_of", SR_ARGS(id), WAIT_S, &v) == 0 && sr_value_list_len(v) == 0,
           "forks left after both deletes");
    sr_value_unref(v);
    sr_value_unref(id);
    sr_value_unref(n);
    sr_value_unref(zero);
    sr_value_unref(seed);
    return expect_all_counters_zero("after both deletes");
}

Test(rref, scenario4_user_passes_to_user, .timeout = 120)
{
    RREF_JOB("rref4", sc_user_to_user, .shutdown_timeout = 60);
}

/* The RRef-to-self cases: remote() to self is an OwnerRRef; an owner that
 * sends its RRef to itself gets the same OwnerRRef back and its fork is
 * undone; a user that sends its RRef to itself gets a new confirmed fork. */
static int sc_self(int rank, int world)
{
    (void)world;
    if (rank != 2)
        return 0;
    sr_value *n = sr_int(4), *info = NULL;
    sr_rref *own = NULL, *user = NULL;
    WCHECK(sr_remote(2, "make_list", SR_ARGS(n), WAIT_S, &own) == 0, "remote to self: %s", sr_last_error());
    WCHECK(sr_rref_is_owner(own) && sr_rref_confirmed_by_owner(own), "remote() to self is an OwnerRRef");
    if (expect_pair(own, 4))
        return 1;
    sr_value *ov = sr_value_from_rref(own);
    WCHECK(sr_rpc_sync(2, "rref_info", SR_ARGS(ov), WAIT_S, &info) == 0, "owner to self: %s", sr_last_error());
    WCHECK(sr_value_int(sr_value_list_at(info, 0)) == 1 && sr_value_int(sr_value_list_at(info, 3)) == 4,
           "the owner did not get its own OwnerRRef back");
    sr_value_unref(info);
    if (expect_forks(own, NULL, 0, "after the self-fork"))
        return 1;
    WCHECK(sr_remote(0, "make_list", SR_ARGS(n), WAIT_S, &user) == 0, "remote: %s", sr_last_error());
    sr_value *uv = sr_value_from_rref(user);
    WCHECK(sr_rpc_sync(2, "rref_info", SR_ARGS(uv), WAIT_S, &info) == 0, "user to self: %s", sr_last_error());
    WCHECK(sr_value_int(sr_value_list_at(info, 0)) == 0 && sr_value_int(sr_value_list_at(info, 1)) == 1 &&
               (uint64_t)sr_value_int(sr_value_list_at(info, 2)) != sr_rref_fork_id(user),
           "a user sending to itself gets a new, confirmed fork");
    sr_value_unref(info);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    uint64_t fid = sr_rref_fork_id(user);
    if (wait_confirmed(user) || expect_forks(user, &fid, 1, "after the self-child went"))
        return 1;
    sr_value_unref(ov);
    sr_value_unref(uv);
    sr_value_unref(n);
    sr_rref_unref(own);
    sr_rref_unref(user);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return expect_all_counters_zero("after the self cases");
}

Test(rref, rref_to_self_cases, .timeout = 120)
{
    RREF_JOB("rrefself", sc_self, .shutdown_timeout = 60);
}

/* RRefs nested in lists, as arguments and as results: a remote function
 * returns a list of RRefs owned by every worker (this one included: that one
 * comes back as the OwnerRRef); a nested remote() returns an RRef whose
 * value is another RRef. */
static int sc_nested(int rank, int world)
{
    if (rank != 3)
        return 0;
    sr_value *four = sr_int(4), *v = NULL;
    WCHECK(sr_rpc_sync(1, "rref_list", SR_ARGS(four), WAIT_S, &v) == 0, "rref_list: %s", sr_last_error());
    WCHECK(sr_value_list_len(v) == 4, "rref_list length");
    for (int i = 0; i < 4; i++) {
        sr_rref *r = sr_value_rref(sr_value_list_at(v, (size_t)i));
        WCHECK(r && sr_rref_owner(r) == i % world && sr_rref_is_owner(r) == (i == rank), "RRef %d of the list", i);
        if (expect_pair(r, 100 + i))
            return 1;
    }
    /* Send the whole list on, nested one level deeper. */
    sr_value *outer = sr_list(1, (sr_value *[]){v}), *got = NULL;
    WCHECK(sr_rpc_sync(0, "echo", SR_ARGS(outer), WAIT_S, &got) == 0, "echo of nested RRefs: %s", sr_last_error());
    sr_value *inner = sr_value_list_at(got, 0);
    for (int i = 0; i < 4; i++)
        if (expect_pair(sr_value_rref(sr_value_list_at(inner, (size_t)i)), 100 + i))
            return 1;
    sr_value_unref(got);
    sr_value_unref(outer);
    sr_value_unref(v);
    /* Nested remote(): worker1 makes an RRef on worker2 and returns it as the
     * value of the RRef we asked worker1 for. */
    sr_value *two = sr_int(2), *seven = sr_int(7), *val = NULL;
    sr_rref *outer_r = NULL;
    WCHECK(sr_remote(1, "remote_of", SR_ARGS(two, seven), WAIT_S, &outer_r) == 0, "remote: %s", sr_last_error());
    WCHECK(sr_rref_to_here(outer_r, WAIT_S, &val) == 0, "outer to_here: %s", sr_last_error());
    sr_rref *inner_r = sr_value_rref(val);
    WCHECK(inner_r && sr_rref_owner(inner_r) == 2, "the outer RRef's value is an RRef owned by worker2");
    if (expect_pair(inner_r, 7))
        return 1;
    sr_value_unref(val);
    sr_rref_unref(outer_r);
    sr_value_unref(two);
    sr_value_unref(seven);
    sr_value_unref(four);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return 0;
}

static int sc_nested_all(int rank, int world)
{
    int rc = sc_nested(rank, world);
    if (rc || barrier())
        return 1;
    /* Everyone idle: every delete applied. But worker1 still owns the outer
     * RRef's value until its OwnerRRef goes, which it has (our delete). */
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (barrier())
        return 1;
    return rank == 3 ? expect_all_counters_zero("after the nested RRefs") : 0;
}

Test(rref, nested_in_lists_and_nested_remote, .timeout = 120)
{
    RREF_JOB("rrefnest", sc_nested_all, .shutdown_timeout = 60);
}

/* A chain of 8 forwards: each hop forks the RRef user -> user (or to and
 * from its owner), and the last one fetches the value. */
static int sc_chain(int rank, int world)
{
    (void)world;
    sr_rref *r = NULL;
    if (rank == 0) {
        sr_value *n = sr_int(42), *hops = sr_int(8), *v = NULL;
        WCHECK(sr_remote(2, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
        sr_value *rv = sr_value_from_rref(r);
        WCHECK(sr_rpc_sync(1, "forward", SR_ARGS(rv, hops), WAIT_S, &v) == 0, "chain: %s", sr_last_error());
        WCHECK(sr_value_int(sr_value_list_at(v, 0)) == 42, "the value at the end of the chain");
        sr_value_unref(v);
        sr_value_unref(rv);
        sr_value_unref(n);
        sr_value_unref(hops);
    }
    /* Stable point: the chain is over (first barrier), every worker of it
     * has dropped its fork and is idle, so every delete was applied. */
    if (barrier())
        return 1;
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (barrier())
        return 1;
    if (rank == 0) {
        uint64_t fid = sr_rref_fork_id(r);
        if (wait_confirmed(r) || expect_forks(r, &fid, 1, "after the chain's forks were dropped"))
            return 1;
        sr_rref_unref(r);
        WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    }
    if (barrier())
        return 1;
    return rank == 0 ? expect_all_counters_zero("after the chain") : 0;
}

Test(rref, chain_of_eight_forwards, .timeout = 120)
{
    RREF_JOB("rrefchain", sc_chain, .shutdown_timeout = 60);
}

/* to_here() right after remote(): a small plain result comes back with the
 * REMOTE_RET, a large one (or one with tensors, objects, RRefs) is fetched
 * after it; either way the value is exact, and a later to_here() fetches. */
static int sc_carried(int rank, int world)
{
    (void)world;
    if (rank != 1)
        return 0;
    static char blob[6000];
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = (char)(i * 7);
    sr_value *vals[3] = {sr_int(42), sr_bytes(blob, 100), sr_bytes(blob, sizeof(blob))};
    for (int i = 0; i < 3; i++) {
        sr_rref *r = NULL;
        sr_value *v = NULL;
        WCHECK(sr_remote(2, "echo", SR_ARGS(vals[i]), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
        WCHECK(sr_rref_to_here(r, WAIT_S, &v) == 0 && sr_value_equal(v, vals[i]), "value %d at once: %s", i,
               sr_last_error());
        sr_value_unref(v);
        WCHECK(sr_rref_to_here(r, WAIT_S, &v) == 0 && sr_value_equal(v, vals[i]), "value %d fetched: %s", i,
               sr_last_error());
        sr_value_unref(v);
        sr_rref_unref(r);
        sr_value_unref(vals[i]);
    }
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return expect_all_counters_zero("after the carried values");
}

Test(rref, remote_results_carried_or_fetched, .timeout = 120)
{
    RREF_JOB("rrefcarry", sc_carried, .shutdown_timeout = 60);
}

/* Control messages are sent once: the rings never lose a
 * message, so a slow owner must not cause resends. worker0 makes FORKS
 * RRefs on worker1 and, while worker1's polling thread is stalled (an async
 * function that blocks it for STALL_MS, as a descheduled or overloaded peer
 * would be), forks each to worker2 and worker3 (user -> user). The fork
 * requests wait in worker1's inbox far longer than any retry interval the
 * protocol used to have (50 ms). Afterwards every RRef is dropped and every
 * worker's count of control messages sent must be exactly what the
 * protocol needs, nothing resent:
 *   worker2, worker3: per fork FORK_REQUEST, CHILD_ACCEPT, USER_DELETE (3 each)
 *   worker1 (owner):  an ACK per FORK_REQUEST (2 per RRef) and per USER_DELETE (3)
 *   worker0:          a USER_DELETE per RRef (CHILD_ACCEPTs need no ACK). */
#define FORKS 12
#define STALL_MS 300

static int fn_stall(sr_call *c, sr_future **out)
{
    sleep_ms(sr_value_int(sr_call_arg(c, 0))); /* on the polling thread: nothing else is read meanwhile */
    *out = sr_future_new();
    return *out ? sr_future_set_result(*out, NULL) : -ENOMEM;
}

static void register_stall_fns(void)
{
    register_rref_fns();
    sr_register_async("stall", fn_stall);
}

static int ctrl_counts(int64_t sent[WORLD], int64_t *retries)
{
    *retries = 0;
    for (int w = 0; w < WORLD; w++) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(w, "counters", SR_NOARGS, WAIT_S, &v) == 0, "counters: %s", sr_last_error());
        *retries += sr_value_int(sr_value_list_at(v, 9));
        sent[w] = sr_value_int(sr_value_list_at(v, 10));
        sr_value_unref(v);
    }
    return 0;
}

static int sc_sent_once(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_rref *r[FORKS];
    sr_future *fs[2 * FORKS], *stall = NULL;
    for (int i = 0; i < FORKS; i++) {
        sr_value *x = sr_int(i);
        WCHECK(sr_remote(1, "make_list", SR_ARGS(x), WAIT_S, &r[i]) == 0, "remote: %s", sr_last_error());
        sr_value_unref(x);
        if (wait_confirmed(r[i]))
            return 1;
    }
    sr_value *ms = sr_int(STALL_MS);
    WCHECK(sr_rpc_async(1, "stall", SR_ARGS(ms), WAIT_S, &stall) == 0, "stall: %s", sr_last_error());
    sr_value_unref(ms);
    for (int i = 0; i < FORKS; i++) {
        sr_value *rv = sr_value_from_rref(r[i]);
        WCHECK(sr_rpc_async(2, "hold", SR_ARGS(rv), WAIT_S, &fs[2 * i]) == 0 &&
                   sr_rpc_async(3, "hold", SR_ARGS(rv), WAIT_S, &fs[2 * i + 1]) == 0,
               "hold: %s", sr_last_error());
        sr_value_unref(rv);
    }
    WCHECK(sr_future_wait_all(fs, 2 * FORKS, NULL) == 0 && sr_future_wait(stall, NULL) == 0, "holds: %s",
           sr_last_error());
    for (int i = 0; i < 2 * FORKS; i++)
        sr_future_unref(fs[i]);
    sr_future_unref(stall);
    for (int i = 0; i < FORKS; i++)
        sr_rref_unref(r[i]);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    sr_value *seed = sr_int(3);
    for (int w = 2; w <= 3; w++)
        WCHECK(sr_rpc_sync(w, "drop_held", SR_ARGS(seed), WAIT_S, NULL) == 0, "drop_held: %s", sr_last_error());
    sr_value_unref(seed);
    int64_t sent[WORLD], retries;
    if (ctrl_counts(sent, &retries))
        return 1;
    WCHECK(retries == 0, "%lld control messages were sent again", (long long)retries);
    const int64_t want[WORLD] = {FORKS, 5 * FORKS, 3 * FORKS, 3 * FORKS};
    for (int w = 0; w < WORLD; w++)
        WCHECK(sent[w] == want[w], "worker%d sent %lld control messages, want exactly %lld", w, (long long)sent[w],
               (long long)want[w]);
    return expect_all_counters_zero("after the stalled forks");
}

Test(rref, control_messages_sent_once_past_a_stalled_owner, .timeout = 120)
{
    rref_scenario = sc_sent_once;
    RUN_JOB("rrefonce", WORLD, .scenario = fail_fast, .register_fns = register_stall_fns, .shutdown_timeout = 60);
}

/* A function given a UserRRef by another user runs at once, without waiting
 * for the owner's ACK (the ACK is bookkeeping, not on the
 * caller's path). worker1, the owner, is blocked (its polling thread waits
 * on a pipe that worker0 writes only after its call to worker2 returned):
 * the call must complete, and see the RRef unconfirmed; the confirmation
 * follows once the owner runs again. */
static int release_pipe[2] = {-1, -1}; /* made before the workers fork */

static int fn_block_until_released(sr_call *c, sr_future **out)
{
    (void)c;
    struct pollfd p = {.fd = release_pipe[0], .events = POLLIN};
    char b;
    if (poll(&p, 1, (int)(WAIT_S * 1000)) != 1 || read(release_pipe[0], &b, 1) != 1)
        return sr_call_fail(c, -ETIMEDOUT, "block_until_released: never released");
    *out = sr_future_new();
    return *out ? sr_future_set_result(*out, NULL) : -ENOMEM;
}

/* peek(rref): [confirmed_by_owner] as the function sees it (async: inline). */
static int fn_peek(sr_call *c, sr_future **out)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r)
        return sr_call_fail(c, -EINVAL, "peek wants an RRef");
    sr_value *v = sr_int(sr_rref_confirmed_by_owner(r));
    *out = sr_future_new();
    int rc = *out && v ? sr_future_set_result(*out, v) : -ENOMEM; /* the future takes its own reference */
    sr_value_unref(v);
    return rc;
}

static void register_release_fns(void)
{
    register_rref_fns();
    sr_register_async("block_until_released", fn_block_until_released);
    sr_register_async("peek", fn_peek);
}

/* worker0: an RRef on worker1 (make_list(n)), confirmed, and worker1 then
 * blocked in block_until_released (*blocked completes once released through
 * release_pipe). 0, or 1 after saying why. */
static int rref_with_owner_blocked(int64_t n, sr_rref **r, sr_future **blocked)
{
    sr_value *len = sr_int(n);
    int rc = sr_remote(1, "make_list", SR_ARGS(len), WAIT_S, r);
    sr_value_unref(len);
    WCHECK(rc == 0, "remote: %s", sr_last_error());
    if (wait_confirmed(*r))
        return 1;
    WCHECK(sr_rpc_async(1, "block_until_released", SR_NOARGS, WAIT_S, blocked) == 0, "block: %s", sr_last_error());
    return 0;
}

static int sc_runs_unconfirmed(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *v = NULL, *seed = sr_int(5);
    sr_rref *r = NULL;
    sr_future *blocked = NULL;
    if (rref_with_owner_blocked(4, &r, &blocked))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    int rc = sr_rpc_sync(2, "peek", SR_ARGS(rv), 5.0, &v);
    WCHECK(write(release_pipe[1], "x", 1) == 1, "cannot release the owner");
    WCHECK(rc == 0, "a call given a user->user RRef waited for its blocked owner: %s", sr_last_error());
    WCHECK(sr_value_int(v) == 0, "the function saw the RRef confirmed while its owner was blocked");
    WCHECK(sr_future_wait(blocked, NULL) == 0, "block: %s", sr_last_error());
    sr_future_unref(blocked);
    sr_value_unref(v);
    sr_value_unref(rv);
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    WCHECK(sr_rpc_sync(2, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "worker2 idle: %s", sr_last_error());
    sr_value_unref(v);
    sr_value_unref(seed);
    return expect_all_counters_zero("after the unconfirmed call");
}

Test(rref, function_given_a_user_rref_runs_before_the_owner_answers, .timeout = 120)
{
    cr_assert(pipe(release_pipe) == 0);
    rref_scenario = sc_runs_unconfirmed;
    RUN_JOB("rrefnowait", WORLD, .scenario = fail_fast, .register_fns = register_release_fns, .shutdown_timeout = 60);
    close(release_pipe[0]);
    close(release_pipe[1]);
}

/* sr_rref_confirmed_by_owner in a callee (docs/RREF.md, deviations).
 * PyTorch's test_user_rrefs_confirmed passes a user's RRef to its owner,
 * where the answer is true, as here. Passed to a third worker, PyTorch runs
 * the function only once the owner confirmed the fork, so it is true there
 * too; here the function runs at once and the fork is announced only when
 * the call ends or someone asks for the confirmation: false inside the call
 * even with the owner idle, true once the function asked and got it. */
static int sc_confirmed_in_callees(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *v = NULL, *seed = sr_int(6), *len = sr_int(3);
    sr_rref *r = NULL;
    int rc = sr_remote(1, "make_list", SR_ARGS(len), WAIT_S, &r);
    sr_value_unref(len);
    WCHECK(rc == 0, "remote: %s", sr_last_error());
    if (wait_confirmed(r))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_sync(1, "peek", SR_ARGS(rv), WAIT_S, &v) == 0, "peek on the owner: %s", sr_last_error());
    WCHECK(sr_value_int(v) == 1, "on its owner the RRef is not confirmed_by_owner (PyTorch: true)");
    sr_value_unref(v);
    WCHECK(sr_rpc_sync(2, "peek", SR_ARGS(rv), WAIT_S, &v) == 0, "peek on worker2: %s", sr_last_error());
    WCHECK(sr_value_int(v) == 0, "a user->user fork was confirmed inside its call without asking: the deviation "
           "docs/RREF.md lists is gone; update it");
    sr_value_unref(v);
    WCHECK(sr_rpc_sync(2, "rref_info", SR_ARGS(rv), WAIT_S, &v) == 0, "rref_info: %s", sr_last_error());
    WCHECK(sr_value_int(sr_value_list_at(v, 0)) == 0 && sr_value_int(sr_value_list_at(v, 1)) == 1,
           "after asking for the confirmation: is_owner %lld, confirmed %lld",
           (long long)sr_value_int(sr_value_list_at(v, 0)), (long long)sr_value_int(sr_value_list_at(v, 1)));
    sr_value_unref(v);
    sr_value_unref(rv);
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    WCHECK(sr_rpc_sync(2, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "worker2 idle: %s", sr_last_error());
    sr_value_unref(v);
    sr_value_unref(seed);
    return expect_all_counters_zero("after the callees looked at confirmed_by_owner");
}

Test(rref, confirmed_by_owner_in_callees, .timeout = 120)
{
    rref_scenario = sc_confirmed_in_callees;
    RUN_JOB("rrefconfirmed", WORLD, .scenario = fail_fast, .register_fns = register_release_fns,
            .shutdown_timeout = 60);
}

/* A user->user fork that its function lets go never reaches the owner
 * (it used to cost ~20x a no-op call, most of it waking the owner).
 * worker1, the owner, is blocked (as above) while worker0 passes
 * its RRef to worker2 DROPS times; each call must return, and both worker0
 * (no pending child) and worker2 (no pending user) must be idle while the
 * owner still is blocked: each child was settled with its parent alone
 * (CHILD_ACCEPT, riding with the answer). Afterwards the owner has sent no
 * control message and its fork set is the creator's fork alone. Before, each
 * fork asked the blocked owner (FORK_REQUEST) and its parent waited for the
 * owner's ACK: worker0's wait for idleness timed out. */
#define DROPS 16

static int sc_dropped_forks(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *v = NULL;
    sr_rref *r = NULL;
    sr_future *blocked = NULL;
    if (rref_with_owner_blocked(6, &r, &blocked))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    int rc = 0;
    for (int i = 0; i < DROPS && !rc; i++) {
        rc = sr_rpc_sync(2, "peek", SR_ARGS(rv), 5.0, &v);
        rc = rc ? rc : sr_value_int(v) != 0; /* unconfirmed: nobody asked the owner */
        sr_value_unref(v);
    }
    sr_value_unref(rv);
    int idle = rc ? 0 : sr_rref_wait_idle(5.0);
    sr_rref_debug_info d = {0};
    sr_rref_debug_info_get(&d);
    int64_t worker2[11] = {0};
    int got = rc || idle ? -1 : sr_rpc_sync(2, "counters", SR_NOARGS, 5.0, &v);
    for (int i = 0; got == 0 && i < 11; i++)
        worker2[i] = sr_value_int(sr_value_list_at(v, (size_t)i));
    sr_value_unref(v);
    WCHECK(write(release_pipe[1], "x", 1) == 1, "cannot release the owner");
    WCHECK(rc == 0, "a call given a user->user RRef failed or saw it confirmed: %s", sr_last_error());
    WCHECK(idle == 0, "worker0 not idle while the owner is blocked: %s", sr_last_error());
    WCHECK(d.num_pending_children == 0, "worker0 holds %llu pending children", (unsigned long long)d.num_pending_children);
    WCHECK(got == 0, "counters on worker2: %s", sr_last_error());
    WCHECK(worker2[3] == 0 && worker2[6] == 0, "worker2 has %lld pending users and %lld unacknowledged messages",
           (long long)worker2[3], (long long)worker2[6]);
    WCHECK(worker2[10] == DROPS, "worker2 sent %lld control messages, want exactly %d CHILD_ACCEPTs",
           (long long)worker2[10], DROPS);
    WCHECK(sr_future_wait(blocked, NULL) == 0, "block: %s", sr_last_error());
    sr_future_unref(blocked);
    WCHECK(sr_rpc_sync(1, "counters", SR_NOARGS, WAIT_S, &v) == 0, "counters: %s", sr_last_error());
    int64_t owner_sent = sr_value_int(sr_value_list_at(v, 10));
    sr_value_unref(v);
    WCHECK(owner_sent == 0, "the owner sent %lld control messages for forks it never needed to know",
           (long long)owner_sent);
    uint64_t creator = sr_rref_fork_id(r);
    if (expect_forks(r, &creator, 1, "after the dropped forks"))
        return 1;
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return expect_all_counters_zero("after the dropped forks");
}

Test(rref, user_fork_dropped_by_its_function_never_wakes_the_owner, .timeout = 120)
{
    cr_assert(pipe(release_pipe) == 0);
    rref_scenario = sc_dropped_forks;
    RUN_JOB("rrefdrop", WORLD, .scenario = fail_fast, .register_fns = register_release_fns, .shutdown_timeout = 60);
    close(release_pipe[0]);
    close(release_pipe[1]);
}

/* A user->user fork that its function keeps is told to the owner after the
 * call's answer (FORK_REQUEST from call_done), then lives as any user:
 * keep (async, inline) stores it without waiting for the confirmation, the
 * call returns while the owner is blocked, and once the owner runs, worker0
 * becomes idle (its child accepted after the owner confirmed it), the
 * owner's fork set holds the kept fork, and dropping it deletes it. A
 * function that then waits for idleness while holding a fresh fork
 * (idle_inside, on an executor) has it announced and confirmed instead of
 * waiting for ever. */
static int fn_keep(sr_call *c, sr_future **out)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r || held_add(r))
        return sr_call_fail(c, -EINVAL, "keep: not an RRef, or no memory");
    sr_value *v = sr_int((int64_t)sr_rref_fork_id(r));
    *out = sr_future_new();
    int rc = *out && v ? sr_future_set_result(*out, v) : -ENOMEM;
    sr_value_unref(v);
    return rc;
}

/* idle_inside(rref): [wait_idle's result, confirmed_by_owner after it] */
static int fn_idle_inside(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r)
        return sr_call_fail(c, -EINVAL, "idle_inside wants an RRef");
    sr_value *items[2] = {sr_int(sr_rref_wait_idle(WAIT_S)), sr_int(sr_rref_confirmed_by_owner(r))};
    sr_value *l = sr_list(2, items);
    sr_value_unref(items[0]);
    sr_value_unref(items[1]);
    return sr_call_return(c, l);
}

static void register_keep_fns(void)
{
    register_release_fns();
    sr_register_async("keep", fn_keep);
    sr_register("idle_inside", fn_idle_inside);
}

static int sc_kept_fork(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *v = NULL, *seed = sr_int(2);
    sr_rref *r = NULL;
    sr_future *blocked = NULL;
    if (rref_with_owner_blocked(9, &r, &blocked))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    int rc = sr_rpc_sync(2, "keep", SR_ARGS(rv), 5.0, &v);
    WCHECK(write(release_pipe[1], "x", 1) == 1, "cannot release the owner");
    WCHECK(rc == 0, "keep waited for the blocked owner: %s", sr_last_error());
    uint64_t want[2] = {sr_rref_fork_id(r), (uint64_t)sr_value_int(v)};
    sr_value_unref(v);
    WCHECK(sr_future_wait(blocked, NULL) == 0, "block: %s", sr_last_error());
    sr_future_unref(blocked);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle (the kept child accepted): %s", sr_last_error());
    if (expect_forks(r, want, 2, "with the kept fork"))
        return 1;
    WCHECK(sr_rpc_sync(2, "idle_inside", SR_ARGS(rv), WAIT_S, &v) == 0, "idle_inside: %s", sr_last_error());
    WCHECK(sr_value_int(sr_value_list_at(v, 0)) == 0 && sr_value_int(sr_value_list_at(v, 1)) == 1,
           "inside a call holding a fresh fork: wait_idle gave %lld, confirmed %lld",
           (long long)sr_value_int(sr_value_list_at(v, 0)), (long long)sr_value_int(sr_value_list_at(v, 1)));
    sr_value_unref(v);
    sr_value_unref(rv);
    WCHECK(sr_rpc_sync(2, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "drop_held: %s", sr_last_error());
    sr_value_unref(v);
    sr_value_unref(seed);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (expect_forks(r, want, 1, "after the kept fork was dropped"))
        return 1;
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return expect_all_counters_zero("after the kept fork");
}

Test(rref, user_fork_kept_by_its_function_is_announced_after_the_answer, .timeout = 120)
{
    cr_assert(pipe(release_pipe) == 0);
    rref_scenario = sc_kept_fork;
    RUN_JOB("rrefkeep", WORLD, .scenario = fail_fast, .register_fns = register_keep_fns, .shutdown_timeout = 60);
    close(release_pipe[0]);
    close(release_pipe[1]);
}

/* A parent that waits for idleness does not wait for the end of the call
 * its child was passed to: worker2's hold_until_told keeps the RRef and
 * answers only when told, and worker0's sr_rref_wait_idle (as graceful
 * shutdown's) must return meanwhile. Its wait asks worker2 to announce the
 * child (ANNOUNCE); the owner confirms it, and the child accepts itself at
 * the parent. */
static sr_future *told; /* worker2: completes hold_until_told's call */

static int fn_hold_until_told(sr_call *c, sr_future **out)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r || held_add(r))
        return sr_call_fail(c, -EINVAL, "hold_until_told: not an RRef, or no memory");
    *out = sr_future_ref(told);
    return 0;
}

static int fn_tell(sr_call *c)
{
    sr_future_set_result(told, NULL);
    return sr_call_return(c, NULL);
}

/* to_here_when_told(rref): waits (on an executor) until told, then returns
 * to_here of its argument. */
static int fn_to_here_when_told(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    sr_value *v = NULL;
    int rc = r ? sr__future_wait_until(told, sr__now_ns() + (int64_t)(WAIT_S * 1e9)) : -EINVAL;
    if (!rc)
        rc = sr_rref_to_here(r, WAIT_S, &v);
    if (rc)
        return sr_call_fail(c, rc, "to_here_when_told: %s", sr_last_error());
    return sr_call_return(c, v);
}

static void register_told_fns(void)
{
    register_rref_fns();
    sr_register("to_here_when_told", fn_to_here_when_told);
    sr_register_async("hold_until_told", fn_hold_until_told);
    sr_register("tell", fn_tell);
    sr_future_unref(told); /* the previous job's, where one process runs several (tests/mpi) */
    told = sr_future_new();
}

static int sc_parent_waits(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *n = sr_int(2), *v = NULL, *seed = sr_int(4);
    sr_rref *r = NULL;
    sr_future *held = NULL;
    WCHECK(sr_remote(1, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value_unref(n);
    if (wait_confirmed(r))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_async(2, "hold_until_told", SR_ARGS(rv), WAIT_S, &held) == 0, "hold: %s", sr_last_error());
    sr_value_unref(rv);
    int64_t pending = 0, until = sr__now_ns() + (int64_t)(WAIT_S * 1e9);
    while (pending == 0 && sr__now_ns() < until) { /* until worker2 decoded it */
        WCHECK(sr_rpc_sync(2, "counters", SR_NOARGS, WAIT_S, &v) == 0, "counters: %s", sr_last_error());
        pending = sr_value_int(sr_value_list_at(v, 3));
        sr_value_unref(v);
    }
    int idle = sr_rref_wait_idle(5.0);
    WCHECK(sr_future_done(held) == false, "hold_until_told answered before it was told");
    WCHECK(sr_rpc_sync(2, "tell", SR_NOARGS, WAIT_S, NULL) == 0, "tell: %s", sr_last_error());
    WCHECK(idle == 0, "worker0 waited for the end of the call its child was passed to: %s", sr_last_error());
    WCHECK(sr_future_wait(held, NULL) == 0, "hold_until_told: %s", sr_last_error());
    sr_future_unref(held);
    WCHECK(sr_rpc_sync(2, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "drop_held: %s", sr_last_error());
    WCHECK(sr_value_int(v) == 1, "worker2 held %lld RRefs, want 1", (long long)sr_value_int(v));
    sr_value_unref(v);
    sr_value_unref(seed);
    uint64_t creator = sr_rref_fork_id(r);
    if (expect_forks(r, &creator, 1, "after the held child was dropped"))
        return 1;
    sr_rref_unref(r);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return expect_all_counters_zero("after the parent's wait");
}

Test(rref, parent_waiting_for_idleness_does_not_wait_for_the_call_holding_its_child, .timeout = 120)
{
    rref_scenario = sc_parent_waits;
    RUN_JOB("rrefwaitp", WORLD, .scenario = fail_fast, .register_fns = register_told_fns, .shutdown_timeout = 60);
}

/* The parent's hold (G2) alone keeps the owner's value for an unannounced
 * child: worker0 passes its RRef to worker2's to_here_when_told and drops
 * every reference of its own while the call waits; the owner has never
 * heard of worker2's fork, yet the to_here that follows must get the value,
 * and once the child is let go with the call's arguments, the parent goes
 * too and the owner deletes the value (nothing leaks). */
static int sc_parent_dropped_first(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *n = sr_int(11), *v = NULL;
    sr_rref *r = NULL;
    sr_future *f = NULL;
    WCHECK(sr_remote(1, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value_unref(n);
    if (wait_confirmed(r))
        return 1;
    uint64_t rid = sr_rref_id(r);
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_async(2, "to_here_when_told", SR_ARGS(rv), WAIT_S, &f) == 0, "call: %s", sr_last_error());
    sr_value_unref(rv);
    sr_rref_unref(r); /* only the pending child's hold keeps worker0's fork now */
    sr_rref_debug_info d;
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_pending_children == 1, "worker0 has %llu pending children",
           (unsigned long long)d.num_pending_children);
    WCHECK(sr_rpc_sync(2, "tell", SR_NOARGS, WAIT_S, NULL) == 0, "tell: %s", sr_last_error());
    WCHECK(sr_future_wait(f, &v) == 0, "to_here on the unannounced child: %s", sr_last_error());
    WCHECK(sr_value_list_len(v) == 2 && sr_value_int(sr_value_list_at(v, 0)) == 11, "to_here gave the wrong value");
    sr_value_unref(v);
    sr_future_unref(f);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    /* worker2 let the child go with the call's arguments: that delete is
     * worker2's own control message, which our idleness does not cover, and
     * its answer to us may overtake it (the reordering mode delays each
     * message on its own). drop_held, with nothing held, returns once
     * worker2's deletes were applied by their owner. */
    sr_value *seed = sr_int(0);
    WCHECK(sr_rpc_sync(2, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "drop_held: %s", sr_last_error());
    WCHECK(sr_value_int(v) == 0, "worker2 held %lld RRefs, want 0", (long long)sr_value_int(v));
    sr_value_unref(v);
    sr_value_unref(seed);
    sr_value *id = sr_int((int64_t)rid);
    WCHECK(sr_rpc_sync(1, "forks_of", SR_ARGS(id), WAIT_S, &v) == 0, "forks_of: %s", sr_last_error());
    WCHECK(sr_value_list_len(v) == 0, "the owner still has %zu forks", sr_value_list_len(v));
    sr_value_unref(v);
    sr_value_unref(id);
    return expect_all_counters_zero("after the parent went first");
}

Test(rref, unannounced_child_is_covered_by_its_parent_after_the_parent_is_dropped, .timeout = 120)
{
    rref_scenario = sc_parent_dropped_first;
    RUN_JOB("rrefpfirst", WORLD, .scenario = fail_fast, .register_fns = register_told_fns, .shutdown_timeout = 60);
}
