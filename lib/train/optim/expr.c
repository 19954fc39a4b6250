/* SPDX-License-Identifier: MIT */
/* Expression helpers for the update rules (see optim_impl.h): thin wrappers
 * of the tensor ops that stop at the first failure and keep temporaries. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "optim_impl.h"
#include "tensor_seam.h"

int sr__ox_end(struct sr__ox *x)
{
    while (x->ntmp)
        sr_tensor_unref(x->tmp[--x->ntmp]);
    return x->rc;
}

/* Keep t as a temporary; a NULL t (the op failed and said why) fails x. */
static sr_tensor *keep(struct sr__ox *x, sr_tensor *t)
{
    if (!t) {
        x->rc = x->rc ? x->rc : -ENOMEM;
        return NULL;
    }
    if (x->ntmp == SR__OX_TMPS) { /* a bug in an update rule, not a user error */
        sr_tensor_unref(t);
        x->rc = sr__fail(-ENOSPC, "sr_optim_step", "too many temporaries in one update");
        return NULL;
    }
    return x->tmp[x->ntmp++] = t;
}

sr_tensor *sr__ox_clone(struct sr__ox *x, sr_tensor *t) { return x->rc ? NULL : keep(x, sr_clone(t)); }
sr_tensor *sr__ox_neg(struct sr__ox *x, sr_tensor *t) { return x->rc ? NULL : keep(x, sr_neg(t)); }
sr_tensor *sr__ox_sqrt(struct sr__ox *x, sr_tensor *t) { return x->rc ? NULL : keep(x, sr_sqrt(t)); }
sr_tensor *sr__ox_div(struct sr__ox *x, sr_tensor *a, sr_tensor *b) { return x->rc ? NULL : keep(x, sr_div(a, b)); }

sr_tensor *sr__ox_div_scalar(struct sr__ox *x, sr_tensor *t, double s)
{
    return x->rc ? NULL : keep(x, sr_div_scalar(t, s));
}

sr_tensor *sr__ox_map(struct sr__ox *x, sr_tensor *const *in, int nin, sr_map_fn f, const void *arg)
{
    return x->rc ? NULL : keep(x, sr__map("sr_optim_step", in, nin, f, arg));
}

/* Record an in-place op's result; t, or NULL once x has failed. */
static sr_tensor *done(struct sr__ox *x, int rc, sr_tensor *t)
{
    if (rc)
        x->rc = rc;
    return x->rc ? NULL : t;
}

sr_tensor *sr__ox_mul_(struct sr__ox *x, sr_tensor *t, double s)
{
    return x->rc ? NULL : done(x, sr_mul_scalar_(t, s), t);
}

sr_tensor *sr__ox_mul_t_(struct sr__ox *x, sr_tensor *t, sr_tensor *other)
{
    return x->rc ? NULL : done(x, sr_mul_(t, other), t);
}

sr_tensor *sr__ox_add_scalar_(struct sr__ox *x, sr_tensor *t, double s)
{
    return x->rc ? NULL : done(x, sr_add_scalar_(t, s), t);
}

sr_tensor *sr__ox_add_(struct sr__ox *x, sr_tensor *t, sr_tensor *other, double alpha)
{
    return x->rc ? NULL : done(x, sr_add_(t, other, alpha), t);
}

sr_tensor *sr__ox_addcmul_(struct sr__ox *x, sr_tensor *t, sr_tensor *a, sr_tensor *b, double value)
{
    return x->rc ? NULL : done(x, sr_addcmul_(t, a, b, value), t);
}

sr_tensor *sr__ox_addcdiv_(struct sr__ox *x, sr_tensor *t, sr_tensor *a, sr_tensor *b, double value)
{
    return x->rc ? NULL : done(x, sr_addcdiv_(t, a, b, value), t);
}

sr_tensor *sr__ox_copy_(struct sr__ox *x, sr_tensor *dst, sr_tensor *src)
{
    return x->rc ? NULL : done(x, sr_copy_(dst, src), dst);
}

/* The inputs were checked by the caller (same shapes and dtype); only the
 * copy-on-write of dst can fail. The write pins its inputs and holds dst's
 * write lock, as the in-place ops do (tensor_impl.h). */
sr_tensor *sr__ox_map_(struct sr__ox *x, sr_tensor *dst, sr_tensor *const *in, int nin, sr_map_fn f,
                       const void *arg)
{
    if (x->rc)
        return NULL;
    const sr_tensor *const *src = (const sr_tensor *const *)in;
    int rc = sr__tensor_write_begin_from(dst, "sr_optim_step", src, nin);
    if (!rc) {
        sr__map_into(dst, in, nin, f, arg);
        sr__tensor_write_end_from(dst, src, nin);
    }
    return done(x, rc, dst);
}

static double maximum_fn(const double *v, const void *arg)
{
    (void)arg;
    if (isnan(v[0]) || isnan(v[1]))
        return NAN;
    return v[0] > v[1] ? v[0] : v[1];
}

sr_tensor *sr__ox_maximum_(struct sr__ox *x, sr_tensor *dst, sr_tensor *other)
{
    return sr__ox_map_(x, dst, (sr_tensor *[]){dst, other}, 2, maximum_fn, NULL);
}

sr_tensor *sr__ox_grad(struct sr__ox *x, sr_tensor *grad, sr_tensor *param, bool maximize, double wd)
{
    sr_tensor *g = maximize ? sr__ox_neg(x, grad) : grad;
    if (wd != 0)
        g = sr__ox_add_(x, sr__ox_clone(x, g), param, wd); /* grad.add(param, alpha=wd) */
    return x->rc ? NULL : g;
}

double sr__ox_count(struct sr__ox *x, sr_tensor *step)
{
    if (!sr__ox_add_scalar_(x, step, 1.0))
        return NAN;
    return sr_tensor_item(step);
}
