/* SPDX-License-Identifier: MIT */
/* The optimizer object: creation (checks like torch's constructors), steps,
 * zero_grad and accessors. The kinds' update rules live in one file each. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "optim_impl.h"
#include "tensor_seam.h"

static int check_params(sr_tensor *const *params, size_t n)
{
    const char *fn = "sr_optim_create";
    if (n == 0)
        return sr__fail(-EINVAL, fn, "optimizer got an empty parameter list");
    if (!params)
        return sr__fail(-EINVAL, fn, "params is NULL");
    for (size_t i = 0; i < n; i++) {
        sr_tensor *p = params[i];
        if (!p)
            return sr__fail(-EINVAL, fn, "parameter %zu is NULL", i);
        sr_dtype dt = sr_tensor_dtype(p);
        if (dt != SR_F32 && dt != SR_F64)
            return sr__fail(-EINVAL, fn, "parameter %zu has dtype %s; optimizers need f32 or f64", i,
                            sr_dtype_name(dt));
        if (!sr_tensor_is_leaf(p))
            return sr__fail(-EINVAL, fn, "parameter %zu: can't optimize a non-leaf Tensor", i);
        for (size_t j = 0; j < i; j++)
            if (params[j] == p)
                return sr__fail(-EINVAL, fn, "parameter %zu is parameter %zu again", i, j);
    }
    return 0;
}

static int make_state(sr_optim *o)
{
    if (!o->ops->eager)
        return 0;
    for (size_t i = 0; i < o->n; i++) {
        int rc = o->ops->init(o, i);
        if (rc)
            return rc;
        o->inited[i] = true;
    }
    return 0;
}

SR_API int sr_optim_create(sr_optim_kind k, const sr_optim_opts *opts, sr_tensor *const *params, size_t n,
                           sr_optim **out)
{
    const struct sr__optim_ops *ops = sr__optim_ops_of(k);
    sr_optim_opts def;
    if (!ops || !out)
        return sr__fail(-EINVAL, "sr_optim_create", "bad kind %d or NULL result", (int)k);
    int rc = sr__optim_resolve(k, opts, &def, "sr_optim_create");
    opts = &def;
    if (rc || (rc = check_params(params, n)))
        return rc;
    sr_optim *o = calloc(1, sizeof(*o));
    if (o) {
        o->params = calloc(n, sizeof(*o->params));
        o->state = calloc(n * SR__OPTIM_SLOTS, sizeof(*o->state));
        o->inited = calloc(n, sizeof(*o->inited));
    }
    if (!o || !o->params || !o->state || !o->inited) {
        sr_optim_destroy(o);
        return sr__fail(-ENOMEM, "sr_optim_create", "out of memory");
    }
    *o = (sr_optim){.kind = k, .opts = *opts, .ops = ops, .n = n, .params = o->params, .state = o->state,
                    .inited = o->inited};
    for (size_t i = 0; i < n; i++)
        o->params[i] = sr_tensor_ref(params[i]);
    if ((rc = make_state(o))) {
        sr_optim_destroy(o);
        return rc;
    }
    *out = o;
    return 0;
}

SR_API void sr_optim_destroy(sr_optim *o)
{
    if (!o)
        return;
    for (size_t i = 0; o->params && i < o->n; i++)
        sr_tensor_unref(o->params[i]);
    for (size_t i = 0; o->state && i < o->n; i++)
        sr__optim_clear(o, i);
    free(o->params);
    free(o->state);
    free(o->inited);
    free(o);
}

/* Every gradient matches its parameter's shape and dtype. */
static int check_grads(const sr_optim *o, sr_tensor *const *grads, const char *fn)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    for (size_t i = 0; i < o->n; i++) {
        const sr_tensor *g = grads[i], *p = o->params[i];
        if (!g)
            continue;
        if (!sr__same_shape(g, p))
            return sr__fail(-EINVAL, fn, "gradient %zu has shape %s but its parameter has shape %s", i,
                            sr__tensor_shape_str(g, b1), sr__tensor_shape_str(p, b2));
        if (sr_tensor_dtype(g) != sr_tensor_dtype(p))
            return sr__fail(-EINVAL, fn, "gradient %zu has dtype %s but its parameter has dtype %s", i,
                            sr_dtype_name(sr_tensor_dtype(g)), sr_dtype_name(sr_tensor_dtype(p)));
    }
    return 0;
}

/* Parameters in order, as torch's loop: state made at the first gradient. */
static int step(sr_optim *o, sr_tensor *const *grads, const char *fn)
{
    int rc = check_grads(o, grads, fn);
    bool prev = sr_no_grad_enter(); /* parameters are leaves that may require grad */
    for (size_t i = 0; !rc && i < o->n; i++) {
        if (!grads[i])
            continue;
        if (!o->inited[i] && !(rc = o->ops->init(o, i)))
            o->inited[i] = true;
        if (!rc)
            rc = o->ops->update(o, i, grads[i]);
    }
    sr_no_grad_exit(prev);
    return rc;
}

SR_API int sr_optim_step_grads(sr_optim *o, sr_tensor *const *grads)
{
    if (!o || !grads)
        return sr__fail(-EINVAL, "sr_optim_step_grads", "optimizer or grads is NULL");
    return step(o, grads, "sr_optim_step_grads");
}

SR_API int sr_optim_step(sr_optim *o)
{
    if (!o)
        return sr__fail(-EINVAL, "sr_optim_step", "optimizer is NULL");
    sr_tensor **grads = calloc(o->n, sizeof(*grads));
    if (!grads)
        return sr__fail(-ENOMEM, "sr_optim_step", "out of memory");
    for (size_t i = 0; i < o->n; i++) /* borrowed; held by the parameters during the step */
        grads[i] = sr_tensor_grad(o->params[i]);
    int rc = step(o, grads, "sr_optim_step");
    free(grads);
    return rc;
}

SR_API int sr_optim_zero_grad(sr_optim *o, bool set_to_none)
{
    if (!o)
        return sr__fail(-EINVAL, "sr_optim_zero_grad", "optimizer is NULL");
    for (size_t i = 0; i < o->n; i++) {
        sr_tensor *g = sr_tensor_grad(o->params[i]);
        int rc = !g ? 0 : set_to_none ? sr_tensor_set_grad(o->params[i], NULL) : sr_zero_(g);
        if (rc)
            return rc;
    }
    return 0;
}

SR_API sr_optim_kind sr_optim_kind_of(const sr_optim *o)
{
    if (!o)
        return (sr_optim_kind)sr__fail(-EINVAL, "sr_optim_kind_of", "optimizer is NULL");
    return o->kind;
}

SR_API const sr_optim_opts *sr_optim_options(const sr_optim *o)
{
    if (!o)
        sr__fail(-EINVAL, "sr_optim_options", "optimizer is NULL");
    return o ? &o->opts : NULL;
}
SR_API size_t sr_optim_nparams(const sr_optim *o) { return o ? o->n : 0; }

SR_API sr_tensor *sr_optim_param(const sr_optim *o, size_t i)
{
    return o && i < o->n ? o->params[i] : NULL;
}
