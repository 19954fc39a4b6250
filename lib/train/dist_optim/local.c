/* SPDX-License-Identifier: MIT */
/* The owner's side of the distributed optimizer: build a local optimizer
 * over the local values of parameter RRefs, and step it with a context's
 * gradients under the worker's one lock (torch's _LocalOptimizer). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dist_optim_impl.h"
#include "error.h"
#include "shmrpc/dist_autograd.h"

/* Shared by every local optimizer of this worker, as torch's class-wide
 * _LocalOptimizer.global_lock: optimizers built by different trainers over
 * the same parameters never step at once. */
static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
/* Relaxed counters: statistics for tests, read after the steps finished. */
static _Atomic uint64_t steps_run;
static _Atomic uint32_t inside, max_inside;
static _Atomic int64_t live;

void sr__dist_optim_stats_get(struct sr__dist_optim_stats *out)
{
    out->steps = atomic_load_explicit(&steps_run, memory_order_relaxed);
    out->max_inside = atomic_load_explicit(&max_inside, memory_order_relaxed);
    out->live = atomic_load_explicit(&live, memory_order_relaxed);
}

/* The last failure's text without its "worker<R>: " prefix: the caller reads
 * it after "Error on Node R: ", which names the worker already. */
static const char *detail(void)
{
    const char *msg = sr_last_error(), *p = msg;
    if (strncmp(p, "worker", 6) != 0)
        return msg;
    for (p += 6; *p >= '0' && *p <= '9'; p++)
        ;
    return p[0] == ':' && p[1] == ' ' ? p + 2 : msg;
}

static void local_free(void *p)
{
    sr_optim_destroy(p);
    atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed); /* relaxed: statistics */
}

/* The local values of the n parameter RRefs in list: the owner's tensors
 * themselves (vals[i] holds the reference that keeps ts[i] alive). */
static int local_params(sr_call *c, const sr_value *list, sr_value **vals, sr_tensor **ts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sr_value *item = sr_value_list_at(list, i);
        sr_rref *r = sr_value_rref(item);
        if (!r)
            return sr_call_fail(c, -EINVAL, "parameter %zu is a %s, not an RRef", i,
                                sr_kind_name(sr_value_type(item)));
        if (!sr_rref_is_owner(r))
            return sr_call_fail(c, -EINVAL, "parameter %zu is owned by worker%d, not by worker%d", i,
                                sr_rref_owner(r), sr_rank());
        int rc = sr_rref_local_value(r, &vals[i]);
        if (rc)
            return sr_call_fail(c, rc, "parameter %zu: %s", i, detail());
        ts[i] = sr_value_tensor(vals[i]);
        if (!ts[i])
            return sr_call_fail(c, -EINVAL, "parameter %zu holds a %s, not a tensor", i,
                                sr_kind_name(sr_value_type(vals[i])));
    }
    return 0;
}

/* An RRef owned here holding o (taken over, destroyed on failure). */
static int keep_in_rref(sr_call *c, sr_optim *o)
{
    sr_value *obj = sr_object(o, local_free, SR_DIST_OPTIM_TYPE);
    sr_rref *r = NULL;
    if (!obj) {
        sr_optim_destroy(o);
        return sr_call_fail(c, -ENOMEM, "%s", detail());
    }
    atomic_fetch_add_explicit(&live, 1, memory_order_relaxed); /* relaxed: statistics */
    int rc = sr_rref_create(obj, &r);
    sr_value_unref(obj); /* the RRef holds its own reference (or, on failure, o goes here) */
    if (rc)
        return sr_call_fail(c, rc, "%s", detail());
    sr_value *v = sr_value_from_rref(r);
    sr_rref_unref(r);
    return v ? sr_call_return(c, v) : sr_call_fail(c, -ENOMEM, "%s", detail());
}

/* new(kind, opts, [param RRefs]): torch's _new_local_optimizer. */
static int fn_new(sr_call *c)
{
    sr_optim_opts opts;
    const sr_optim_opts *po = NULL;
    size_t len = 0;
    if (sr_call_nargs(c) != 3 || sr_value_type(sr_call_arg(c, 2)) != SR_KIND_LIST)
        return sr_call_fail(c, -EINVAL, SR_DIST_OPTIM_NEW ": expects (kind, options, [RRefs])");
    const void *b = sr_value_bytes(sr_call_arg(c, 1), &len);
    if (b && len == sizeof(opts)) {
        memcpy(&opts, b, sizeof(opts));
        po = &opts;
    } else if (sr_value_type(sr_call_arg(c, 1)) != SR_KIND_NONE) {
        return sr_call_fail(c, -EINVAL, SR_DIST_OPTIM_NEW ": the options are not an sr_optim_opts");
    }
    const sr_value *list = sr_call_arg(c, 2);
    size_t n = sr_value_list_len(list);
    sr_value **vals = calloc(n ? n : 1, sizeof(*vals));
    sr_tensor **ts = calloc(n ? n : 1, sizeof(*ts));
    sr_optim *o = NULL;
    int rc = !vals || !ts ? sr_call_fail(c, -ENOMEM, "out of memory for %zu parameters", n)
                          : local_params(c, list, vals, ts, n);
    if (!rc && (rc = sr_optim_create((sr_optim_kind)sr_value_int(sr_call_arg(c, 0)), po, ts, n, &o)))
        sr_call_fail(c, rc, "%s", detail());
    for (size_t i = 0; vals && i < n; i++)
        sr_value_unref(vals[i]); /* the optimizer holds its own tensor references */
    free(vals);
    free(ts);
    return rc ? rc : keep_in_rref(c, o);
}

/* The step itself, under the worker's lock. */
static int locked_step(sr_optim *o, sr_tensor *const *grads)
{
    pthread_mutex_lock(&global_lock);
    uint32_t now = atomic_fetch_add_explicit(&inside, 1, memory_order_relaxed) + 1; /* relaxed: statistics */
    uint32_t max = atomic_load_explicit(&max_inside, memory_order_relaxed);
    while (now > max && !atomic_compare_exchange_weak_explicit(&max_inside, &max, now, memory_order_relaxed,
                                                               memory_order_relaxed))
        ;
    int rc = sr_optim_step_grads(o, grads);
    atomic_fetch_sub_explicit(&inside, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&steps_run, 1, memory_order_relaxed);
    pthread_mutex_unlock(&global_lock);
    return rc;
}

/* step(local optimizer, context id), an RRef proxy call: torch's
 * _local_optimizer_step. The gradients are read before the lock is taken,
 * as torch reads them; a parameter without one gets NULL (no change). */
static int fn_step(sr_call *c)
{
    sr_value *ov = sr_call_arg(c, 0);
    sr_optim *o = sr_value_object(ov);
    if (sr_call_nargs(c) != 2 || !o || strcmp(sr_value_object_type(ov), SR_DIST_OPTIM_TYPE))
        return sr_call_fail(c, -EINVAL, SR_DIST_OPTIM_STEP ": expects (a local optimizer RRef, context id)");
    int64_t ctx = sr_value_int(sr_call_arg(c, 1));
    size_t n = sr_optim_nparams(o);
    sr_tensor **grads = calloc(n ? n : 1, sizeof(*grads));
    if (!grads)
        return sr_call_fail(c, -ENOMEM, "out of memory for %zu gradients", n);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = sr_dist_autograd_get_gradient(ctx, sr_optim_param(o, i), &grads[i]);
        if (rc == -ENOENT)
            rc = 0;
    }
    if (!rc)
        rc = locked_step(o, grads);
    for (size_t i = 0; i < n; i++)
        sr_tensor_unref(grads[i]);
    free(grads);
    return rc ? sr_call_fail(c, rc, "%s", detail()) : sr_call_return(c, NULL);
}

/* Before main(), so every worker of every program that links shmrpc can
 * answer (the registry takes functions at any time, sr_init or not; a
 * constructor is the one point that runs in every process, the workers that
 * never create a distributed optimizer included). */
__attribute__((constructor)) static void dist_optim_register(void)
{
    sr_register(SR_DIST_OPTIM_NEW, fn_new);
    sr_register(SR_DIST_OPTIM_STEP, fn_step);
}

/* The local optimizer behind an optimizer RRef owned here, or NULL with the
 * reason in sr_last_error(). */
static sr_optim *local_of(sr_rref *r, size_t i)
{
    const char *fn = "sr_dist_optim_with_locals";
    sr_value *v = NULL;
    if (!r || !sr_rref_is_owner(r))
        return sr__fail(-EINVAL, fn, "optimizer RRef %zu is %s", i, r ? "not owned here" : "NULL"), NULL;
    if (sr_rref_local_value(r, &v))
        return NULL;
    sr_optim *o = sr_value_object(v);
    const char *type = sr_value_object_type(v);
    sr_value_unref(v); /* the RRef keeps the object alive */
    if (!o || !type || strcmp(type, SR_DIST_OPTIM_TYPE))
        return sr__fail(-EINVAL, fn, "RRef %zu does not hold a local optimizer", i), NULL;
    return o;
}

SR_API int sr_dist_optim_with_locals(sr_rref *const *rrefs, size_t n,
                                     int (*fn)(sr_optim *const *optims, size_t n, void *arg), void *arg)
{
    if (!fn || (n && !rrefs))
        return sr__fail(-EINVAL, "sr_dist_optim_with_locals", "fn or rrefs is NULL");
    sr_optim **os = calloc(n ? n : 1, sizeof(*os));
    if (!os)
        return sr__fail(-ENOMEM, "sr_dist_optim_with_locals", "out of memory for %zu optimizers", n);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = (os[i] = local_of(rrefs[i], i)) ? 0 : -EINVAL;
    if (!rc) {
        pthread_mutex_lock(&global_lock);
        rc = fn(os, n, arg);
        pthread_mutex_unlock(&global_lock);
    }
    free(os);
    return rc;
}
