/* SPDX-License-Identifier: MIT */
/* The caller's side of the distributed optimizer (torch's
 * DistributedOptimizer): one local optimizer per parameter owner, built and
 * stepped by calls to every owner at once. See shmrpc/dist_optim.h. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_autograd_seam.h"
#include "dist_optim_impl.h"
#include "error.h"

struct sr_dist_optim {
    size_t n;        /* owners */
    sr_rref **optim; /* [n]: each owner's RRef to its local optimizer */
};

/* The last error seen while waiting (torch's _wait_for_all raises the last). */
struct last_error {
    int code;
    char text[512];
};

/* outside_context. The calls to the owners are sent with no current
 * distributed autograd context, whatever the caller's thread has. They carry
 * no tensor that requires grad, so torch records nothing for them; here a
 * user call inside a context would record a send and a recv function that
 * no root uses (and create the context on the owner, so an owner that never
 * saw the context would find it empty instead of unknown). The step names
 * its context explicitly. */

/* A call that could not be sent, as a future that failed with its error, so
 * that waiting treats it like any other. NULL only without memory. */
static sr_future *failed_call(int rc)
{
    sr_future *f = sr_future_new();
    if (f)
        sr_future_set_error(f, rc, "%s", sr_last_error());
    return f;
}

/* Wait for every future in order (each is bounded by its call's timeout)
 * and drop it; values into vals[i] when vals is given. */
static void wait_all(sr_future **fs, size_t n, sr_value **vals, struct last_error *e)
{
    for (size_t i = 0; i < n; i++) {
        int rc = fs[i] ? sr_future_wait(fs[i], vals ? &vals[i] : NULL) : -ENOMEM;
        if (rc) {
            e->code = rc;
            snprintf(e->text, sizeof(e->text), "%s", fs[i] ? sr_last_error() : "out of memory for a call");
        }
        sr_future_unref(fs[i]);
    }
}

/* Owners in order of first appearance: owner[k] for k < *ng, and
 * group[i] = the k of params[i]. */
static void group_by_owner(sr_rref *const *params, size_t n, int *owner, size_t *group, size_t *ng)
{
    *ng = 0;
    for (size_t i = 0; i < n; i++) {
        int r = sr_rref_owner(params[i]);
        size_t k = 0;
        while (k < *ng && owner[k] != r)
            k++;
        if (k == *ng)
            owner[(*ng)++] = r;
        group[i] = k;
    }
}

/* Ask owner k to build its optimizer over its parameters. */
static sr_future *send_new(sr_optim_kind kind, const sr_optim_opts *opts, sr_rref *const *params, size_t n,
                           const size_t *group, size_t k, int owner)
{
    sr_value **items = calloc(n, sizeof(*items));
    size_t m = 0;
    bool ok = items != NULL;
    for (size_t i = 0; ok && i < n; i++)
        if (group[i] == k)
            ok = (items[m++] = sr_value_from_rref(params[i])) != NULL;
    sr_value *list = ok ? sr_list(m, items) : NULL;
    sr_value *kv = sr_int(kind), *ov = opts ? sr_bytes(opts, sizeof(*opts)) : sr_none();
    sr_future *f = NULL;
    int rc = list && kv && ov ? sr_rpc_async(owner, SR_DIST_OPTIM_NEW, SR_ARGS(kv, ov, list), 0, &f)
                              : sr__fail(-ENOMEM, "sr_dist_optim_create", "out of memory for the arguments");
    for (size_t i = 0; i < m; i++)
        sr_value_unref(items[i]);
    free(items);
    sr_value_unref(list);
    sr_value_unref(kv);
    sr_value_unref(ov);
    return rc ? failed_call(rc) : f;
}

/* Keep each owner's answer (an RRef) in o->optim; *e gets the first bad one. */
static void take_optimizers(sr_dist_optim *o, sr_value **vals, struct last_error *e)
{
    for (size_t k = 0; k < o->n; k++) {
        sr_rref *r = sr_value_rref(vals[k]);
        if (r)
            o->optim[k] = sr_rref_ref(r);
        else if (vals[k] && !e->code)
            *e = (struct last_error){.code = -EPROTO, .text = "an owner answered without an optimizer RRef"};
        sr_value_unref(vals[k]);
    }
}

static int check_create(sr_optim_kind kind, sr_rref *const *params, size_t n, sr_dist_optim **out)
{
    const char *fn = "sr_dist_optim_create";
    if (!out)
        return sr__fail(-EINVAL, fn, "out is NULL");
    *out = NULL;
    if (n && !params)
        return sr__fail(-EINVAL, fn, "params is NULL");
    if (!strcmp(sr_optim_kind_name(kind), "?"))
        return sr__fail(-EINVAL, fn, "bad optimizer kind %d", (int)kind);
    for (size_t i = 0; i < n; i++)
        if (!params[i])
            return sr__fail(-EINVAL, fn, "parameter RRef %zu is NULL", i);
    return 0;
}

SR_API int sr_dist_optim_create(sr_optim_kind kind, const sr_optim_opts *opts, sr_rref *const *params, size_t n,
                                sr_dist_optim **out)
{
    int rc = check_create(kind, params, n, out);
    if (rc)
        return rc;
    sr_dist_optim *o = calloc(1, sizeof(*o));
    int *owner = calloc(n ? n : 1, sizeof(*owner));
    size_t *group = calloc(n ? n : 1, sizeof(*group));
    sr_future **fs = calloc(n ? n : 1, sizeof(*fs));
    sr_value **vals = calloc(n ? n : 1, sizeof(*vals));
    if (!o || !owner || !group || !fs || !vals) {
        rc = sr__fail(-ENOMEM, "sr_dist_optim_create", "out of memory for %zu parameters", n);
        goto out;
    }
    group_by_owner(params, n, owner, group, &o->n);
    if (!(o->optim = calloc(o->n ? o->n : 1, sizeof(*o->optim)))) {
        rc = sr__fail(-ENOMEM, "sr_dist_optim_create", "out of memory for %zu owners", o->n);
        goto out;
    }
    int64_t ctx = sr__dctx_set_current(SR_NO_CONTEXT); /* outside_context, above */
    for (size_t k = 0; k < o->n; k++) /* every owner at once ... */
        fs[k] = send_new(kind, opts, params, n, group, k, owner[k]);
    sr__dctx_set_current(ctx);
    struct last_error e = {0};
    wait_all(fs, o->n, vals, &e); /* ... then all of them, failed or not */
    take_optimizers(o, vals, &e);
    if (e.code)
        rc = sr__fail(e.code, "sr_dist_optim_create", "Error creating optimizer. %s", e.text);
out:
    free(owner);
    free(group);
    free(fs);
    free(vals);
    if (rc)
        sr_dist_optim_destroy(o);
    else
        *out = o;
    return rc;
}

SR_API int sr_dist_optim_step(sr_dist_optim *o, int64_t context_id)
{
    const char *fn = "sr_dist_optim_step";
    if (!o)
        return sr__fail(-EINVAL, fn, "the optimizer is NULL");
    int rc = sr__dctx_check(fn, context_id); /* a context whose worker died: -EPIPE, naming it */
    if (rc)
        return rc;
    if (!o->n)
        return 0;
    sr_future **fs = calloc(o->n, sizeof(*fs));
    sr_value *ctx = sr_int(context_id);
    if (!fs || !ctx) {
        free(fs);
        sr_value_unref(ctx);
        return sr__fail(-ENOMEM, fn, "out of memory for %zu owners", o->n);
    }
    int64_t cur = sr__dctx_set_current(SR_NO_CONTEXT); /* outside_context, above */
    for (size_t k = 0; k < o->n; k++) { /* every owner at once ... */
        int rc = sr_rref_rpc_async(o->optim[k], SR_DIST_OPTIM_STEP, SR_ARGS(ctx), 0, &fs[k]);
        if (rc)
            fs[k] = failed_call(rc);
    }
    sr__dctx_set_current(cur);
    struct last_error e = {0};
    wait_all(fs, o->n, NULL, &e); /* ... then all of them, failed or not */
    free(fs);
    sr_value_unref(ctx);
    return e.code ? sr__fail(e.code, fn, "Error running optimizer. %s", e.text) : 0;
}

SR_API void sr_dist_optim_destroy(sr_dist_optim *o)
{
    if (!o)
        return;
    for (size_t k = 0; o->optim && k < o->n; k++)
        sr_rref_unref(o->optim[k]);
    free(o->optim);
    free(o);
}

SR_API sr_rref *sr_dist_optim_local_rref(const sr_dist_optim *o, int owner)
{
    for (size_t k = 0; o && k < o->n; k++)
        if (o->optim[k] && sr_rref_owner(o->optim[k]) == owner)
            return o->optim[k];
    return NULL;
}
