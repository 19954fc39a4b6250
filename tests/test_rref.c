/* RRef protocol tests on 4 workers: the four sharing scenarios of the RRef
 * protocol note (seed 000), each with the owner's fork set checked at the
 * protocol's stable points; the RRef-to-self cases; RRefs nested in lists,
 * as arguments and results; nested remote(); a chain of 8 forwards; ids and
 * string forms. The same binary runs under the reordering delivery mode
 * (SHMRPC_REORDER_SEED, tests/meson.build) with many seeds.
 *
 * Stable points: a fork is known to its owner once the user is confirmed
 * (wait_confirmed) or a function that received it has run; a delete has
 * been applied once its sender is idle (sr_rref_wait_idle). */
#include "rref_fns.h"

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
    RUN_JOB("rref1", WORLD, .scenario = sc_remote_return, .register_fns = register_rref_fns);
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
    sr_value *rv = sr_rref_value(r);
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
    RUN_JOB("rref2", WORLD, .scenario = sc_user_to_owner, .register_fns = register_rref_fns);
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
    sr_value *rv = sr_rref_value(r);
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
    RUN_JOB("rref3", WORLD, .scenario = sc_owner_to_user, .register_fns = register_rref_fns);
}

/* Scenario 4: a user passes the RRef to another user: the receiver asks the
 * owner (FORK_REQUEST), runs its function only once confirmed, and then
 * accepts the child at the parent, which holds the parent until then (G2). */
static int sc_user_to_user(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_value *n = sr_int(9), *v = NULL, *zero = sr_int(0), *seed = sr_int(3);
    sr_rref *r = NULL;
    WCHECK(sr_remote(2, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value *rv = sr_rref_value(r);
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
    RUN_JOB("rref4", WORLD, .scenario = sc_user_to_user, .register_fns = register_rref_fns);
}
