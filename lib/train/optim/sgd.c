/* SPDX-License-Identifier: MIT */
/* SGD, as torch.optim.SGD / _single_tensor_sgd (1.13). The momentum buffer
 * starts as a copy of the first gradient, not as zeros. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "optim_impl.h"

enum { MOMENTUM_BUFFER };

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    char b[40];
    if (!(o->lr >= 0.0))
        return sr__fail(-EINVAL, fn, "%s: Invalid learning rate: %s", kind, sr__optim_repr(o->lr, b, sizeof(b)));
    if (o->momentum < 0.0)
        return sr__fail(-EINVAL, fn, "%s: Invalid momentum value: %s", kind,
                        sr__optim_repr(o->momentum, b, sizeof(b)));
    if (o->weight_decay < 0.0)
        return sr__fail(-EINVAL, fn, "%s: Invalid weight_decay value: %s", kind,
                        sr__optim_repr(o->weight_decay, b, sizeof(b)));
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return sr__fail(-EINVAL, fn, "%s: Nesterov momentum requires a momentum and zero dampening", kind);
    return 0;
}

static unsigned used(const sr_optim_opts *o) { return o->momentum != 0 ? 1u << MOMENTUM_BUFFER : 0; }

static int init(sr_optim *o, size_t i)
{
    (void)o, (void)i;
    return 0; /* the buffer is the first gradient, made by update */
}

static int update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    sr_tensor *param = o->params[i], **bufp = sr__optim_slot(o, i, MOMENTUM_BUFFER);
    struct sr__ox x = {0};
    sr_tensor *d_p = sr__ox_grad(&x, grad, param, op->maximize, op->weight_decay);
    if (op->momentum != 0 && d_p) {
        if (!*bufp)
            x.rc = (*bufp = sr_clone(d_p)) ? 0 : -ENOMEM; /* torch.clone(d_p).detach() */
        else
            sr__ox_add_(&x, sr__ox_mul_(&x, *bufp, op->momentum), d_p, 1 - op->dampening);
        if (op->nesterov)
            d_p = sr__ox_add_(&x, sr__ox_clone(&x, d_p), *bufp, op->momentum); /* d_p.add(buf, alpha=momentum) */
        else
            d_p = *bufp;
    }
    sr__ox_add_(&x, param, d_p, -op->lr);
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_sgd = {
    .name = "SGD",
    .slots = {"momentum_buffer"},
    .check = check,
    .used = used,
    .init = init,
    .update = update,
};
