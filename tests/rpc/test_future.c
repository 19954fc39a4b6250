/* SPDX-License-Identifier: MIT */
/* Futures on their own (no RPC agent): completion, re-raised errors,
 * then-chains, callbacks, double completion, wait_all failing fast. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <string.h>

#include "shmrpc/future.h"
#include "common.h"

LEAK_CHECKED_SUITE(future);

Test(future, result_and_done)
{
    sr_future *f = sr_future_new();
    cr_assert_not(sr_future_done(f));
    cr_assert_eq(sr_future_value(f, NULL), -EAGAIN);
    sr_value *v = sr_int(7), *got;
    cr_assert_eq(sr_future_set_result(f, v), 0);
    sr_value_unref(v);
    cr_assert(sr_future_done(f));
    cr_assert_eq(sr_future_wait(f, &got), 0);
    cr_assert_eq(sr_value_int(got), 7);
    sr_value_unref(got);
    sr_future_unref(f);
}

Test(future, wait_reraises_the_error_every_time)
{
    sr_future *f = sr_future_new();
    cr_assert_eq(sr_future_set_error(f, -EIO, "boom %d", 42), 0);
    for (int i = 0; i < 3; i++) {
        strcpy((char *)sr_last_error(), "");
        cr_assert_eq(sr_future_wait(f, NULL), -EIO);
        cr_assert_str_eq(sr_last_error(), "boom 42");
    }
    sr_future_unref(f);
}

Test(future, second_completion_is_an_error)
{
    sr_future *f = sr_future_new();
    cr_assert_eq(sr_future_set_result(f, NULL), 0);
    cr_assert_eq(sr_future_set_result(f, NULL), -EALREADY);
    cr_assert(strstr(sr_last_error(), "Future can only be marked completed once"));
    cr_assert_eq(sr_future_set_error(f, -EIO, "x"), -EALREADY);
    sr_future_unref(f);
}

static int add_one(sr_future *parent, void *arg, sr_value **out)
{
    (void)arg;
    sr_value *v;
    int rc = sr_future_wait(parent, &v);
    if (rc)
        return rc;
    *out = sr_int(sr_value_int(v) + 1);
    sr_value_unref(v);
    return 0;
}

static int refuse(sr_future *parent, void *arg, sr_value **out)
{
    (void)parent;
    (void)arg;
    (void)out;
    return sr_errorf(-ERANGE, "refused by the callback");
}

Test(future, then_chains_values_and_errors)
{
    sr_future *f = sr_future_new(), *g, *h, *k;
    cr_assert_eq(sr_future_then(f, add_one, NULL, &g), 0);
    cr_assert_eq(sr_future_then(g, add_one, NULL, &h), 0);
    cr_assert_eq(sr_future_then(h, refuse, NULL, &k), 0);
    cr_assert_eq(sr_future_then(f, NULL, NULL, &k), -EINVAL, "then(NULL) is an error");
    cr_assert(strstr(sr_last_error(), "incompatible function arguments"));
    sr_value *one = sr_int(1), *got;
    sr_future_set_result(f, one);
    sr_value_unref(one);
    cr_assert_eq(sr_future_wait(h, &got), 0);
    cr_assert_eq(sr_value_int(got), 3);
    sr_value_unref(got);
    cr_assert_eq(sr_future_wait(k, NULL), -ERANGE);
    cr_assert_str_eq(sr_last_error(), "refused by the callback");
    sr_future_unref(f);
    sr_future_unref(g);
    sr_future_unref(h);
    sr_future_unref(k);
}

Test(future, then_propagates_the_parent_error)
{
    sr_future *f = sr_future_new(), *g;
    cr_assert_eq(sr_future_then(f, add_one, NULL, &g), 0);
    sr_future_set_error(f, -EPIPE, "parent failed");
    cr_assert_eq(sr_future_wait(g, NULL), -EPIPE);
    cr_assert_str_eq(sr_last_error(), "parent failed");
    sr_future_unref(f);
    sr_future_unref(g);
}

static void record(sr_future *f, void *arg)
{
    (void)f;
    int *order = arg;
    order[order[0] + 1] = order[0] + 100;
    order[0]++;
}

Test(future, callbacks_run_once_in_order_even_after_completion)
{
    int order[8] = {0};
    sr_future *f = sr_future_new();
    cr_assert_eq(sr_future_add_done_callback(f, record, order), 0);
    cr_assert_eq(sr_future_add_done_callback(f, record, order), 0);
    cr_assert_eq(order[0], 0, "no callback before completion");
    sr_future_set_result(f, NULL);
    cr_assert_eq(order[0], 2);
    cr_assert_eq(sr_future_add_done_callback(f, record, order), 0);
    cr_assert_eq(order[0], 3, "a callback added after completion runs at once");
    cr_assert_eq(order[1] + order[2] + order[3], 100 + 101 + 102);
    cr_assert_eq(sr_future_add_done_callback(f, NULL, NULL), -EINVAL);
    sr_future_unref(f);
}

struct completer {
    sr_future *f;
    int64_t v;
};

static void *complete_later(void *p)
{
    struct completer *c = p;
    sr_value *v = sr_int(c->v);
    sr_future_set_result(c->f, v);
    sr_value_unref(v);
    return NULL;
}

Test(future, wait_blocks_until_another_thread_completes)
{
    sr_future *f = sr_future_new();
    struct completer c = {f, 99};
    pthread_t t;
    pthread_create(&t, NULL, complete_later, &c);
    sr_value *got;
    cr_assert_eq(sr_future_wait(f, &got), 0);
    cr_assert_eq(sr_value_int(got), 99);
    pthread_join(t, NULL);
    sr_value_unref(got);
    sr_future_unref(f);
}

/* The waiter drops the last reference as soon as it sees the future done,
 * while the thread that completed it may still be in sr_future_set_result
 * (its callbacks, the wake-up of sleepers): completion must not touch the
 * future after publishing "done" unless it holds a reference of its own.
 * Under ASan the use after free shows as a report, under ThreadSanitizer
 * (tests/tsan) as a race with pthread_mutex_destroy. */
static void count_done(sr_future *f, void *arg)
{
    (void)f;
    atomic_fetch_add_explicit((_Atomic int *)arg, 1, memory_order_relaxed); /* relaxed: read after the joins */
}

static void *wait_and_drop(void *p)
{
    sr_future *f = p;
    cr_assert_eq(sr_future_wait(f, NULL), 0);
    sr_future_unref(f); /* the only reference: the future goes now */
    return NULL;
}

Test(future, waiter_may_free_the_future_as_soon_as_it_is_done)
{
    enum { ROUNDS = 2000 };
    _Atomic int ran = 0;
    for (int i = 0; i < ROUNDS; i++) {
        sr_future *f = sr_future_new();
        cr_assert_eq(sr_future_add_done_callback(f, count_done, &ran), 0);
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, wait_and_drop, f), 0); /* the thread owns f now */
        sr_value *v = sr_int(i);
        cr_assert_eq(sr_future_set_result(f, v), 0);
        sr_value_unref(v);
        pthread_join(t, NULL);
    }
    cr_assert_eq(atomic_load(&ran), ROUNDS);
}

Test(future, wait_all_collects_values)
{
    sr_future *fs[3];
    for (int i = 0; i < 3; i++) {
        fs[i] = sr_future_new();
        sr_value *v = sr_int(i * 10);
        sr_future_set_result(fs[i], v);
        sr_value_unref(v);
    }
    sr_value *all;
    cr_assert_eq(sr_future_wait_all(fs, 3, &all), 0);
    cr_assert_eq(sr_value_list_len(all), 3);
    cr_assert_eq(sr_value_int(sr_value_list_at(all, 2)), 20);
    sr_value_unref(all);
    for (int i = 0; i < 3; i++)
        sr_future_unref(fs[i]);
}

Test(future, wait_all_fails_fast_without_waiting_for_the_rest)
{
    sr_future *fs[3] = {sr_future_new(), sr_future_new(), sr_future_new()};
    sr_future_set_error(fs[1], -EIO, "second failed");
    /* fs[0] and fs[2] never complete: wait_all must still return. */
    cr_assert_eq(sr_future_wait_all(fs, 3, NULL), -EIO);
    cr_assert_str_eq(sr_last_error(), "second failed");
    sr_future_set_result(fs[0], NULL); /* stragglers completing later is harmless */
    for (int i = 0; i < 3; i++)
        sr_future_unref(fs[i]);
}

/* Futures are reused by the thread that freed them (future.c): a new one is
 * pending and holds nothing of the one before, whatever that one held. */
Test(future, a_new_future_holds_nothing_of_a_freed_one)
{
    for (int i = 0; i < 32; i++) {
        sr_future *f = sr_future_new();
        if (i % 2)
            sr_future_set_error(f, -EIO, "round %d failed", i);
        else
            cr_assert_eq(sr_future_add_done_callback(f, record, (int[8]){0}), 0); /* never runs: never completed */
        sr_future_unref(f);
        sr_future *g = sr_future_new();
        cr_assert(!sr_future_done(g), "round %d: a new future is done", i);
        cr_assert_eq(sr_future_error_code(g), -EAGAIN);
        cr_assert_eq(sr_future_set_result(g, NULL), 0);
        sr_value *v = NULL;
        cr_assert_eq(sr_future_wait(g, &v), 0, "round %d: %s", i, sr_last_error());
        cr_assert_eq(sr_value_type(v), SR_KIND_NONE);
        sr_value_unref(v);
        sr_future_unref(g);
    }
}
