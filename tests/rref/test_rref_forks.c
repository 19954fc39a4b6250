/* SPDX-License-Identifier: MIT */
/* Unit tests of the owner's fork table (lib/modules/rref/forks.h) and the id map
 * under it: duplicates and reordering of adds and deletes, deterministically,
 * one message at a time. The reordering runs of test_rref show the same
 * rules at work between processes; here every interleaving that matters is
 * written out. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common.h"
#include "forks.h"
#include "map.h"

LEAK_CHECKED_SUITE(rref_forks);

#define R1 UINT64_C(0x0001000000000005)
#define F1 UINT64_C(0x0001000000000006)
#define F2 UINT64_C(0x0002000000000009)

static enum sr_fork_add add(sr_fork_table *t, uint64_t r, uint64_t f)
{
    enum sr_fork_add res;
    cr_assert_eq(sr__forks_add(t, r, f, -1, 0, &res), 0);
    return res;
}

static enum sr_fork_del del(sr_fork_table *t, uint64_t r, uint64_t f, uint32_t adds, bool confirmed)
{
    enum sr_fork_del res;
    cr_assert_eq(sr__forks_del(t, r, f, adds, confirmed, &res), 0);
    return res;
}

Test(rref_forks, map_put_get_delete_many_keys_with_collisions)
{
    sr_u64map m = {0};
    enum { N = 5000 };
    for (uint64_t k = 0; k < N; k++) /* key 0 included: only NULL values are special */
        cr_assert_eq(sr__map_put(&m, k * 4096, (void *)(uintptr_t)(k + 1)), 0);
    cr_assert_eq(m.n, N);
    for (uint64_t k = 0; k < N; k += 2)
        cr_assert_eq((uintptr_t)sr__map_del(&m, k * 4096), k + 1);
    cr_assert_null(sr__map_del(&m, 2 * 4096), "a deleted key is gone");
    for (uint64_t k = 0; k < N; k++)
        cr_assert_eq((uintptr_t)sr__map_get(&m, k * 4096), k % 2 ? k + 1 : 0, "key %llu", (unsigned long long)k);
    size_t pos = 0, seen = 0;
    uint64_t k;
    void *v;
    while (sr__map_next(&m, &pos, &k, &v)) {
        cr_assert_eq((uintptr_t)v, k / 4096 + 1);
        seen++;
    }
    cr_assert_eq(seen, N / 2);
    sr__map_free(&m);
}

Test(rref_forks, add_then_delete_removes_the_fork)
{
    sr_fork_table t = {0};
    cr_assert_eq(add(&t, R1, F1), SR_FORK_ADDED);
    cr_assert_eq(add(&t, R1, F2), SR_FORK_ADDED);
    cr_assert_eq(sr__forks_count(&t, R1), 2);
    uint64_t l[4];
    cr_assert_eq(sr__forks_list(&t, R1, l, 4), 2);
    cr_assert(l[0] == F1 && l[1] == F2, "ascending");
    cr_assert_eq(del(&t, R1, F1, 1, true), SR_FORK_REMOVED);
    cr_assert_eq(sr__forks_count(&t, R1), 1);
    cr_assert_eq(del(&t, R1, F2, 1, true), SR_FORK_REMOVED);
    cr_assert_eq(sr__forks_count(&t, R1), 0);
    cr_assert(t.live == 0 && t.tombs == 0);
    sr__forks_free(&t);
}

/* G1 with a duplicated delete: the second one changes nothing. */
Test(rref_forks, duplicate_delete_is_ignored)
{
    sr_fork_table t = {0};
    add(&t, R1, F1);
    cr_assert_eq(del(&t, R1, F1, 1, true), SR_FORK_REMOVED);
    cr_assert_eq(del(&t, R1, F1, 1, true), SR_FORK_IGNORED);
    cr_assert(t.live == 0 && t.tombs == 0);
    sr__forks_free(&t);
}

/* A FORK_REQUEST retried: the copies count, the fork is live once. */
Test(rref_forks, duplicate_fork_request_counts_but_adds_once)
{
    sr_fork_table t = {0};
    cr_assert_eq(add(&t, R1, F1), SR_FORK_ADDED);
    cr_assert_eq(add(&t, R1, F1), SR_FORK_DUPLICATE);
    cr_assert_eq(sr__forks_count(&t, R1), 1);
    cr_assert_eq(del(&t, R1, F1, 2, true), SR_FORK_REMOVED);
    cr_assert(t.live == 0 && t.tombs == 0, "both copies arrived: no tombstone");
    sr__forks_free(&t);
}

/* The retried copy of a FORK_REQUEST arrives after the delete: without the
 * tombstone it would bring the fork back for good (a leak). */
Test(rref_forks, late_fork_request_copy_after_delete_is_cancelled)
{
    sr_fork_table t = {0};
    add(&t, R1, F1);
    cr_assert_eq(del(&t, R1, F1, 3, true), SR_FORK_REMOVED); /* sent 3 copies, 1 arrived */
    cr_assert_eq(t.tombs, 1);
    cr_assert_eq(add(&t, R1, F1), SR_FORK_CANCELLED);
    cr_assert_eq(add(&t, R1, F1), SR_FORK_CANCELLED);
    cr_assert(t.live == 0 && t.tombs == 0, "the tombstone goes with the last late copy");
    cr_assert_eq(add(&t, R1, F2), SR_FORK_ADDED, "other forks are unaffected");
    sr__forks_free(&t);
}

/* A timed-out remote(): the creator's delete overtakes its REMOTE_CALL. */
Test(rref_forks, delete_before_creation_leaves_a_tombstone)
{
    sr_fork_table t = {0};
    cr_assert_eq(del(&t, R1, F1, 1, false), SR_FORK_TOMBSTONE);
    cr_assert_eq(del(&t, R1, F1, 1, false), SR_FORK_IGNORED, "a retried delete keeps one tombstone");
    cr_assert_eq(sr__forks_count(&t, R1), 0);
    cr_assert_eq(add(&t, R1, F1), SR_FORK_CANCELLED, "the late creation is removed, not leaked");
    cr_assert(t.live == 0 && t.tombs == 0);
    sr__forks_free(&t);
}

/* A confirmed user's delete for a fork the owner does not know is a
 * duplicate (its add arrived before it was confirmed): no tombstone. */
Test(rref_forks, unknown_fork_of_a_confirmed_user_is_a_duplicate)
{
    sr_fork_table t = {0};
    cr_assert_eq(del(&t, R1, F1, 1, true), SR_FORK_IGNORED);
    cr_assert(t.live == 0 && t.tombs == 0);
    sr__forks_free(&t);
}

/* Every order of {add, add copy, delete(adds=2)} ends with nothing left. */
Test(rref_forks, every_order_of_two_adds_and_a_delete_ends_empty)
{
    enum { A, D };
    int orders[3][3] = {{A, A, D}, {A, D, A}, {D, A, A}};
    for (int o = 0; o < 3; o++) {
        sr_fork_table t = {0};
        for (int i = 0; i < 3; i++)
            orders[o][i] == A ? (void)add(&t, R1, F1) : (void)del(&t, R1, F1, 2, o != 2);
        cr_assert(t.live == 0 && t.tombs == 0, "order %d leaves %zu live, %zu tombstones", o, t.live, t.tombs);
        sr__forks_free(&t);
    }
}

/* A holder dies (docs/RREF.md, "A dead worker, a replaced rank"): exactly its
 * live forks go, in batches, each with its rref id; tombstones and other
 * holders' forks stay; a later delete of a dropped fork changes nothing. */
Test(rref_forks, a_dead_holders_forks_are_dropped_and_nothing_else)
{
    sr_fork_table t = {0};
    enum sr_fork_add a;
    enum { N = 10 };
    for (uint64_t i = 0; i < N; i++) /* holder 2: N forks of R1 */
        cr_assert_eq(sr__forks_add(&t, R1, F1 + 2 * i, 2, 0, &a), 0);
    cr_assert_eq(sr__forks_add(&t, R1, F2, 3, 0, &a), 0);              /* holder 3 */
    cr_assert_eq(sr__forks_add(&t, R1, F2 + 2, 2, 1, &a), 0);          /* holder 2's next generation */
    cr_assert_eq(del(&t, R1, F2 + 1, 1, false), SR_FORK_TOMBSTONE); /* a tombstone (holder unknown) */
    uint64_t rids[4];
    size_t got = 0, n;
    while ((n = sr__forks_drop_holder(&t, 2, 0, rids, 4)) > 0) {
        cr_assert_leq(n, 4);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(rids[i], R1);
        got += n;
    }
    cr_assert_eq(got, N);
    cr_assert_eq(sr__forks_count(&t, R1), 2, "holder 3's fork and holder 2 generation 1's stay");
    cr_assert_eq(t.live, 2);
    cr_assert_eq(t.tombs, 1, "the tombstone stays");
    cr_assert_eq(sr__forks_drop_holder(&t, -1, 0, rids, 4), 0, "unknown holders are never dropped");
    cr_assert_eq(sr__forks_drop_holder(&t, 2, 1, rids, 4), 1, "generation 1 of holder 2");
    cr_assert_eq(del(&t, R1, F1, 1, true), SR_FORK_IGNORED, "a late delete of a dropped fork");
    cr_assert_eq(del(&t, R1, F2, 1, true), SR_FORK_REMOVED);
    cr_assert_eq(sr__forks_count(&t, R1), 0);
    sr__forks_free(&t);
}
