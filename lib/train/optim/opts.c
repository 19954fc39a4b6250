/* SPDX-License-Identifier: MIT */
/* Kinds, their names, default options, and the option checks they share.
 * Defaults and messages are torch 1.13's (torch/optim/<kind>.py). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "optim_impl.h"

static const struct sr__optim_ops *const kinds[SR_OPTIM_NKINDS] = {
    [SR_OPTIM_SGD] = &sr__optim_sgd,         [SR_OPTIM_ADAM] = &sr__optim_adam,
    [SR_OPTIM_ADAMW] = &sr__optim_adamw,     [SR_OPTIM_ADAGRAD] = &sr__optim_adagrad,
    [SR_OPTIM_RMSPROP] = &sr__optim_rmsprop, [SR_OPTIM_ADADELTA] = &sr__optim_adadelta,
    [SR_OPTIM_ADAMAX] = &sr__optim_adamax,   [SR_OPTIM_RPROP] = &sr__optim_rprop,
};

const struct sr__optim_ops *sr__optim_ops_of(sr_optim_kind k)
{
    return (unsigned)k < SR_OPTIM_NKINDS ? kinds[k] : NULL;
}

SR_API const char *sr_optim_kind_name(sr_optim_kind k)
{
    const struct sr__optim_ops *ops = sr__optim_ops_of(k);
    return ops ? ops->name : "?";
}

SR_API int sr_optim_kind_parse(const char *name, sr_optim_kind *k)
{
    if (!name || !k)
        return sr__fail(-EINVAL, "sr_optim_kind_parse", "name or result is NULL");
    for (int i = 0; i < SR_OPTIM_NKINDS; i++)
        if (!strcasecmp(name, kinds[i]->name)) {
            *k = (sr_optim_kind)i;
            return 0;
        }
    return sr__fail(-EINVAL, "sr_optim_kind_parse", "unknown optimizer \"%s\"", name);
}

/* Adam's, AdamW's and Adamax's shared defaults. */
static void adam_like(sr_optim_opts *o, double lr, double wd)
{
    o->lr = lr;
    o->betas[0] = 0.9;
    o->betas[1] = 0.999;
    o->eps = 1e-8;
    o->weight_decay = wd;
}

/* torch's defaults of kind k (a valid kind); NaN marks a required option. */
static void defaults(sr_optim_kind k, sr_optim_opts *o)
{
    memset(o, 0, sizeof(*o));
    switch (k) {
    case SR_OPTIM_SGD: o->lr = NAN; break; /* torch: lr=required */
    case SR_OPTIM_ADAM: adam_like(o, 1e-3, 0); break;
    case SR_OPTIM_ADAMW: adam_like(o, 1e-3, 1e-2); break;
    case SR_OPTIM_ADAMAX: adam_like(o, 2e-3, 0); break;
    case SR_OPTIM_ADAGRAD: o->lr = 1e-2, o->eps = 1e-10; break;
    case SR_OPTIM_RMSPROP: o->lr = 1e-2, o->alpha = 0.99, o->eps = 1e-8; break;
    case SR_OPTIM_ADADELTA: o->lr = 1.0, o->rho = 0.9, o->eps = 1e-6; break;
    case SR_OPTIM_RPROP:
        o->lr = 1e-2;
        o->etas[0] = 0.5, o->etas[1] = 1.2;
        o->step_sizes[0] = 1e-6, o->step_sizes[1] = 50;
        break;
    }
}

SR_API int sr_optim_opts_default(sr_optim_kind k, sr_optim_opts *o)
{
    if (!o || !sr__optim_ops_of(k))
        return sr__fail(-EINVAL, "sr_optim_opts_default", "bad kind %d or NULL options", (int)k);
    defaults(k, o);
    if (isnan(o->lr))
        o->lr = 0; /* SGD's required lr: unset, refused until it is set */
    return 0;
}

/* The floating-point fields, named as in messages. */
#define FIELD(f) {#f, offsetof(sr_optim_opts, f)}
static const struct {
    const char *name;
    size_t off;
} fields[] = {
    FIELD(lr),       FIELD(momentum), FIELD(dampening), FIELD(weight_decay), FIELD(betas[0]),
    FIELD(betas[1]), FIELD(eps),      FIELD(alpha),     FIELD(rho),          FIELD(lr_decay),
    FIELD(initial_accumulator_value), FIELD(etas[0]),   FIELD(etas[1]),      FIELD(step_sizes[0]),
    FIELD(step_sizes[1]),
};
#undef FIELD
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static double *field(sr_optim_opts *o, size_t i) { return (double *)((char *)o + fields[i].off); }

/* A +0.0 field takes the default; SR_OPTIM_ZERO (-0.0) is an explicit 0. */
static int fill_defaults(sr_optim_kind k, const sr_optim_opts *in, sr_optim_opts *out, const char *fn)
{
    sr_optim_opts def;
    defaults(k, &def);
    *out = *in;
    for (size_t i = 0; i < NFIELDS; i++) {
        double *v = field(out, i);
        if (*v != 0)
            continue;
        if (!signbit(*v) && isnan(*field(&def, i)))
            return sr__fail(-EINVAL, fn, "%s: parameter group didn't specify a value of required optimization "
                                         "parameter %s", sr_optim_kind_name(k), fields[i].name);
        *v = signbit(*v) ? 0.0 : *field(&def, i);
    }
    return 0;
}

/* NaN and the infinities make no sense in any field, read or not. */
static int check_finite(sr_optim_kind k, sr_optim_opts *o, const char *fn)
{
    char b[40];
    for (size_t i = 0; i < NFIELDS; i++)
        if (!isfinite(*field(o, i)))
            return sr__fail(-EINVAL, fn, "%s: Invalid %s value: %s", sr_optim_kind_name(k), fields[i].name,
                            sr__optim_repr(*field(o, i), b, sizeof(b)));
    return 0;
}

int sr__optim_resolve(sr_optim_kind k, const sr_optim_opts *in, sr_optim_opts *out, const char *fn)
{
    const struct sr__optim_ops *ops = sr__optim_ops_of(k);
    if (!ops || !out)
        return sr__fail(-EINVAL, fn, "bad kind %d or NULL options", (int)k);
    int rc = fill_defaults(k, in ? in : &(sr_optim_opts){0}, out, fn);
    if (!rc)
        rc = ops->check(out, fn, ops->name);
    if (!rc)
        rc = check_finite(k, out, fn);
    return rc;
}

SR_API int sr_optim_opts_resolve(sr_optim_kind k, const sr_optim_opts *in, sr_optim_opts *out)
{
    sr_optim_opts o;
    int rc = sr__optim_resolve(k, in, &o, "sr_optim_opts_resolve");
    if (!rc)
        *out = o;
    return rc;
}

/* Python's repr() of a float: the shortest digits that read back exactly,
 * with ".0" on integral values, so messages match torch's "{}".format(v). */
const char *sr__optim_repr(double v, char *buf, size_t len)
{
    if (isnan(v) || isinf(v)) {
        snprintf(buf, len, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        return buf;
    }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, len, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    snprintf(buf, len, "%.*e", prec - 1, v);
    int exp = atoi(strchr(buf, 'e') + 1);
    if (-4 <= exp && exp < 16) /* Python writes these without an exponent: 10.0, not 1e+01 */
        snprintf(buf, len, "%.*f", prec - 1 - exp > 0 ? prec - 1 - exp : 0, v);
    if (!strpbrk(buf, ".e"))
        strncat(buf, ".0", len - strlen(buf) - 1);
    return buf;
}

/* "fn: kind: <what><value>" with Python's repr of the value. */
static int bad(const char *fn, const char *kind, const char *what, double v)
{
    char b[40];
    return sr__fail(-EINVAL, fn, "%s: %s%s", kind, what, sr__optim_repr(v, b, sizeof(b)));
}

int sr__optim_check_lr(const sr_optim_opts *o, const char *fn, const char *kind)
{
    return 0.0 <= o->lr ? 0 : bad(fn, kind, "Invalid learning rate: ", o->lr);
}

int sr__optim_check_eps(const sr_optim_opts *o, const char *fn, const char *kind)
{
    return 0.0 <= o->eps ? 0 : bad(fn, kind, "Invalid epsilon value: ", o->eps);
}

int sr__optim_check_wd(const sr_optim_opts *o, const char *fn, const char *kind)
{
    return 0.0 <= o->weight_decay ? 0 : bad(fn, kind, "Invalid weight_decay value: ", o->weight_decay);
}

int sr__optim_check_adam_like(const sr_optim_opts *o, const char *fn, const char *kind)
{
    int rc = sr__optim_check_lr(o, fn, kind);
    if (!rc)
        rc = sr__optim_check_eps(o, fn, kind);
    if (!rc)
        rc = sr__optim_check_betas(o, fn, kind);
    if (!rc)
        rc = sr__optim_check_wd(o, fn, kind);
    return rc;
}

int sr__optim_check_betas(const sr_optim_opts *o, const char *fn, const char *kind)
{
    if (!(0.0 <= o->betas[0] && o->betas[0] < 1.0))
        return bad(fn, kind, "Invalid beta parameter at index 0: ", o->betas[0]);
    if (!(0.0 <= o->betas[1] && o->betas[1] < 1.0))
        return bad(fn, kind, "Invalid beta parameter at index 1: ", o->betas[1]);
    return 0;
}
