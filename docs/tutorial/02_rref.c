/* SPDX-License-Identifier: MIT */
/* Tutorial, step 2: a first RRef (docs/TUTORIAL.md).
 *
 *     shmrun -n 3 ./tutorial_02_rref
 *
 * Worker 0 asks worker 1 to build a tensor and keep it (sr_remote): it gets
 * an RRef, a reference to a value that lives on worker 1, its owner. Then it
 * fetches the value (to_here), updates it on the owner (a proxy call), and
 * hands the RRef to worker 2, which fetches the value itself. The owner
 * frees the tensor when the last RRef to it is gone, anywhere. */
#include <errno.h>
#include <stdio.h>

#include <shmrpc/shmrpc.h>

/* make_ones(n): a tensor of n ones, kept by the owner when called by remote(). */
static int make_ones(sr_call *c)
{
    int64_t n = sr_value_int(sr_call_arg(c, 0));
    sr_tensor *t = sr_ones(SR_F32, 1, &n, 0);
    if (!t)
        return sr_call_fail(c, -EINVAL, "make_ones: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t); /* takes its own reference */
    sr_tensor_unref(t);
    return sr_call_return(c, v);
}

/* scale_(t, s), a proxy call: argument 0 is the owner's value itself, so the
 * update stays on the owner. */
static int scale_(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    if (sr_mul_scalar_(t, sr_value_double(sr_call_arg(c, 1))))
        return sr_call_fail(c, -EINVAL, "scale_: %s", sr_last_error());
    return sr_call_return(c, NULL);
}

/* sum_of(rref): fetches the RRef's value wherever it lives, returns its sum. */
static int sum_of(sr_call *c)
{
    sr_value *v = NULL;
    if (sr_rref_to_here(sr_value_rref(sr_call_arg(c, 0)), 0, &v))
        return sr_call_fail(c, -EINVAL, "sum_of: %s", sr_last_error());
    sr_tensor *s = sr_sum(sr_value_tensor(v));
    double total = sr_tensor_item(s);
    sr_tensor_unref(s);
    sr_value_unref(v);
    return sr_call_return(c, sr_double(total));
}

static double sum(sr_value *v)
{
    sr_tensor *s = sr_sum(sr_value_tensor(v));
    double total = sr_tensor_item(s);
    sr_tensor_unref(s);
    return total;
}

static int driver(void)
{
    sr_value *n = sr_int(4), *two = sr_double(2.0), *before = NULL, *after = NULL, *elsewhere = NULL;
    sr_rref *r = NULL;
    /* remote(): returns at once; the tensor is made on worker 1 and stays there. */
    if (sr_remote(1, "make_ones", SR_ARGS(n), 0, &r))
        return fprintf(stderr, "remote: %s\n", sr_last_error()), 1;
    char name[96];
    printf("%s, owned by %s\n", sr_rref_str(r, name, sizeof(name)), sr_rref_owner_name(r));

    /* to_here(): a copy of the value (a tensor is not copied: its block is
     * shared, copy-on-write). */
    if (sr_rref_to_here(r, 0, &before))
        return fprintf(stderr, "to_here: %s\n", sr_last_error()), 1;
    /* A proxy call runs scale_ on the owner, on the owner's tensor. */
    if (sr_rref_rpc_sync(r, "scale_", SR_ARGS(two), 0, NULL) || sr_rref_to_here(r, 0, &after))
        return fprintf(stderr, "proxy: %s\n", sr_last_error()), 1;
    printf("sum before %.0f, after scale_(2) %.0f (our first copy still says %.0f)\n", sum(before), sum(after),
           sum(before));

    /* Passing the RRef to worker 2 forks it: worker 2 gets its own UserRRef. */
    sr_value *rv = sr_value_from_rref(r);
    if (sr_rpc_sync(2, "sum_of", SR_ARGS(rv), 0, &elsewhere))
        return fprintf(stderr, "sum_of: %s\n", sr_last_error()), 1;
    printf("sum seen from %s: %.0f\n", sr_worker_name(2), sr_value_double(elsewhere));

    int ok = sum(before) == 4 && sum(after) == 8 && sr_value_double(elsewhere) == 8;
    sr_value_unref(rv);
    sr_value_unref(elsewhere);
    sr_value_unref(after);
    sr_value_unref(before);
    sr_value_unref(two);
    sr_value_unref(n);
    sr_rref_unref(r); /* the last user: the owner deletes the tensor */
    return ok ? 0 : 1;
}

int main(void)
{
    sr_register("make_ones", make_ones);
    sr_register("scale_", scale_);
    sr_register("sum_of", sum_of);
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    int rc = sr_rank() == 0 ? driver() : 0;
    /* Graceful shutdown also checks that no RRef was leaked. */
    if (sr_shutdown(true, 0))
        rc = 1;
    return rc;
}
