/* SPDX-License-Identifier: MIT */
/* Sequential models: a list of layer specs (nn.h), their parameters
 * initialised as PyTorch's layers initialise theirs, and the forward that
 * runs the layers in order (or a range of them, a pipeline stage). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "module_impl.h"
#include "shmrpc/nn.h"
#include "tensor_seam.h"

static const char *kind_name(sr_layer_kind k)
{
    static const char *names[] = {"?", "linear", "conv2d", "relu", "max_pool2d", "avg_pool2d", "flatten",
                                  "dropout", "layer_norm"};
    return k >= SR_LAYER_LINEAR && k <= SR_LAYER_LAYER_NORM ? names[k] : names[0];
}

static int bad(const char *fn, int i, const sr_layer_spec *s, const char *what)
{
    return sr__fail(-EINVAL, fn, "layer %d (%s): %s", i, kind_name(s->kind), what);
}

static int check_conv(const char *fn, int i, const sr_layer_spec *s)
{
    int64_t groups = s->groups ? s->groups : 1;
    if (s->in < 1 || s->out < 1 || groups < 1 || s->in % groups || s->out % groups)
        return bad(fn, i, s, "in and out channels must be >= 1 and divisible by groups");
    for (int d = 0; d < 2; d++)
        if (s->kernel[d] < 1 || s->stride[d] < 0 || s->padding[d] < 0 || s->dilation[d] < 0)
            return bad(fn, i, s, "kernel must be >= 1, stride, padding and dilation >= 0 (0: the default)");
    return 0;
}

static int check_spec(const char *fn, int i, const sr_layer_spec *s)
{
    switch (s->kind) {
    case SR_LAYER_LINEAR:
        return s->in < 1 || s->out < 1 ? bad(fn, i, s, "in and out features must be >= 1") : 0;
    case SR_LAYER_CONV2D:
        return check_conv(fn, i, s);
    case SR_LAYER_MAX_POOL2D:
    case SR_LAYER_AVG_POOL2D:
        return s->kernel[0] < 1 || s->kernel[1] < 1 ? bad(fn, i, s, "kernel must be >= 1") : 0;
    case SR_LAYER_DROPOUT:
        return !(s->p >= 0.0 && s->p <= 1.0) ? bad(fn, i, s, "p must be between 0 and 1") : 0;
    case SR_LAYER_LAYER_NORM:
        if (s->norm_ndim < 1 || s->norm_ndim > 4)
            return bad(fn, i, s, "norm_ndim must be 1 to 4");
        for (int d = 0; d < s->norm_ndim; d++)
            if (s->norm_shape[d] < 1)
                return bad(fn, i, s, "norm_shape entries must be >= 1");
        return 0;
    case SR_LAYER_RELU:
    case SR_LAYER_FLATTEN:
        return 0;
    }
    return sr__fail(-EINVAL, fn, "layer %d: unknown kind %d", i, (int)s->kind);
}

/* Fills PyTorch's defaults into the zero fields of the copy the model keeps. */
static void fill_defaults(sr_layer_spec *s)
{
    for (int d = 0; d < 2; d++) {
        if (s->kind == SR_LAYER_CONV2D && !s->stride[d])
            s->stride[d] = 1;
        if ((s->kind == SR_LAYER_MAX_POOL2D || s->kind == SR_LAYER_AVG_POOL2D) && !s->stride[d])
            s->stride[d] = s->kernel[d];
        if (!s->dilation[d])
            s->dilation[d] = 1;
    }
    if (!s->groups)
        s->groups = 1;
    if (s->kind == SR_LAYER_FLATTEN && !s->start_dim && !s->end_dim)
        s->start_dim = 1, s->end_dim = -1;
    if (s->kind == SR_LAYER_LAYER_NORM && s->eps == 0.0)
        s->eps = 1e-5;
}

/* Layer i's parameters, appended in PyTorch's order (weight, then bias),
 * named "<i>.weight" in a sequential model, "weight" in a lone layer (i < 0). */
static int add_layer_params(sr_module *m, int i, const sr_layer_spec *s, sr_dtype dt, sr_generator *g)
{
    char prefix[16] = "";
    if (i >= 0)
        snprintf(prefix, sizeof(prefix), "%d.", i);
    if (s->kind == SR_LAYER_LAYER_NORM) {
        int rc = sr__module_add(m, prefix, "weight", sr_ones(dt, s->norm_ndim, s->norm_shape, SR_REQUIRES_GRAD));
        return rc ? rc : sr__module_add(m, prefix, "bias", sr_zeros(dt, s->norm_ndim, s->norm_shape, SR_REQUIRES_GRAD));
    }
    if (s->kind != SR_LAYER_LINEAR && s->kind != SR_LAYER_CONV2D)
        return 0;
    bool conv = s->kind == SR_LAYER_CONV2D;
    int64_t cg = conv ? s->in / s->groups : s->in, fan_in = conv ? cg * s->kernel[0] * s->kernel[1] : s->in;
    double bound = 1.0 / sqrt((double)fan_in); /* kaiming_uniform_(a = sqrt(5)): gain sqrt(1/3) * sqrt(3/fan_in) */
    int64_t wshape[4] = {s->out, conv ? cg : s->in, s->kernel[0], s->kernel[1]};
    int rc = sr__module_add_uniform(m, prefix, "weight", conv ? 4 : 2, wshape, bound, dt, g);
    return rc || s->no_bias ? rc : sr__module_add_uniform(m, prefix, "bias", 1, &s->out, bound, dt, g);
}

static int build(sr_module *m, const sr_layer_spec *layers, bool lone, sr_dtype dt, sr_generator *g)
{
    int rc = 0;
    for (int i = 0; !rc && i < m->nlayers; i++) {
        struct sr__seq_layer *l = &m->layers[i];
        l->spec = layers[i];
        fill_defaults(&l->spec);
        l->first = m->n;
        rc = add_layer_params(m, lone ? -1 : i, &l->spec, dt, g);
        l->nparams = m->n - l->first;
    }
    if (!rc)
        sr_generator_init(&m->drop, sr_generator_next(g));
    return rc;
}

static int create(const char *fn, const sr_layer_spec *layers, int n, bool lone, sr_dtype dt, sr_generator *g,
                  sr_module **m)
{
    if (!m || !layers || n < 1)
        return sr__fail(-EINVAL, fn, "needs %d >= 1 layer specs and an out pointer", n);
    *m = NULL;
    int rc = sr__module_check_dtype(fn, dt, g);
    for (int i = 0; !rc && i < n; i++)
        rc = check_spec(fn, i, &layers[i]);
    if (rc || (rc = sr__module_new(SR__MODULE_SEQUENTIAL, n, 2 * (size_t)n, m)))
        return rc;
    (*m)->layers = calloc((size_t)n, sizeof(*(*m)->layers));
    rc = (*m)->layers ? build(*m, layers, lone, dt, g) : sr__fail(-ENOMEM, fn, "out of memory for %d layers", n);
    if (rc) {
        sr_module_destroy(*m);
        *m = NULL;
    }
    return rc;
}

SR_API int sr_sequential_create(const sr_layer_spec *layers, int n, sr_dtype dt, sr_generator *g, sr_module **m)
{
    return create("sr_sequential_create", layers, n, false, dt, g, m);
}

SR_API int sr_layer_create(const sr_layer_spec *layer, sr_dtype dt, sr_generator *g, sr_module **m)
{
    return create("sr_layer_create", layer, 1, true, dt, g, m);
}

static sr_tensor *layer_forward(sr_module *m, const struct sr__seq_layer *l, sr_tensor *x)
{
    const sr_layer_spec *s = &l->spec;
    sr_tensor *const *p = m->params + l->first;
    switch (s->kind) {
    case SR_LAYER_LINEAR:
        return sr_linear(x, p[0], l->nparams > 1 ? p[1] : NULL);
    case SR_LAYER_CONV2D:
        return sr_conv2d(x, p[0], l->nparams > 1 ? p[1] : NULL, s->stride, s->padding, s->dilation, s->groups);
    case SR_LAYER_RELU:
        return sr_relu(x);
    case SR_LAYER_MAX_POOL2D:
        return sr_max_pool2d(x, s->kernel, s->stride, s->padding);
    case SR_LAYER_AVG_POOL2D:
        return sr_avg_pool2d(x, s->kernel, s->stride, s->padding);
    case SR_LAYER_FLATTEN:
        return sr_flatten(x, s->start_dim, s->end_dim);
    case SR_LAYER_DROPOUT:
        return sr_dropout(x, s->p, m->training, &m->drop);
    case SR_LAYER_LAYER_NORM:
        return sr_layer_norm(x, s->norm_ndim, s->norm_shape, p[0], p[1], s->eps);
    }
    return NULL;
}

/* Whether layers i and i + 1, both in [.., to), are a layer norm and a
 * relu: they run as one op (sr__layer_norm_relu), with the same results. */
static bool norm_then_relu(const sr_module *m, int i, int to)
{
    return i + 1 < to && m->layers[i].spec.kind == SR_LAYER_LAYER_NORM && m->layers[i + 1].spec.kind == SR_LAYER_RELU;
}

/* ... and then a 2 x 2 max pool of stride 2 without padding: the three run
 * as one op (sr__layer_norm_relu_pool), with the same results. */
static bool then_pool_2x2(const sr_module *m, int i, int to)
{
    if (i + 2 >= to || m->layers[i + 2].spec.kind != SR_LAYER_MAX_POOL2D)
        return false;
    const sr_layer_spec *s = &m->layers[i + 2].spec;
    return s->kernel[0] == 2 && s->kernel[1] == 2 && s->stride[0] == 2 && s->stride[1] == 2 && !s->padding[0] &&
           !s->padding[1];
}

sr_tensor *sr__sequential_forward(sr_module *m, sr_tensor *x, int from, int to)
{
    sr_tensor *h = sr_tensor_ref(x);
    for (int i = from; h && i < to; i++) {
        const struct sr__seq_layer *l = &m->layers[i];
        sr_tensor *const *p = m->params + l->first;
        sr_tensor *y;
        if (norm_then_relu(m, i, to) && then_pool_2x2(m, i, to)) {
            y = sr__layer_norm_relu_pool(h, l->spec.norm_ndim, l->spec.norm_shape, p[0], p[1], l->spec.eps);
            i += 2;
        } else if (norm_then_relu(m, i, to)) {
            y = sr__layer_norm_relu(h, l->spec.norm_ndim, l->spec.norm_shape, p[0], p[1], l->spec.eps);
            i++;
        } else {
            y = layer_forward(m, l, h);
        }
        sr_tensor_unref(h);
        h = y;
    }
    return h;
}

static int check_range(const char *fn, const sr_module *m, int from, int to)
{
    if (!m || m->kind != SR__MODULE_SEQUENTIAL)
        return sr__fail(-EINVAL, fn, "not a sequential model");
    if (from < 0 || from > to || to > m->nlayers)
        return sr__fail(-EINVAL, fn, "layers [%d, %d) are not within the model's %d", from, to, m->nlayers);
    return 0;
}

SR_API sr_tensor *sr_sequential_forward_range(sr_module *m, sr_tensor *x, int from, int to)
{
    if (check_range("sr_sequential_forward_range", m, from, to) || !x)
        return NULL;
    return sr__sequential_forward(m, x, from, to);
}

SR_API int sr_sequential_param_range(const sr_module *m, int from, int to, size_t *first, size_t *count)
{
    int rc = check_range("sr_sequential_param_range", m, from, to);
    if (rc)
        return rc;
    size_t a = from < m->nlayers ? m->layers[from].first : m->n, b = to < m->nlayers ? m->layers[to].first : m->n;
    if (first)
        *first = a;
    if (count)
        *count = b - a;
    return 0;
}

SR_API void sr_module_train(sr_module *m, bool training)
{
    if (!m) {
        sr__fail(-EINVAL, "sr_module_train", "module is NULL");
        return;
    }
    m->training = training;
}

SR_API bool sr_module_is_training(const sr_module *m)
{
    return m ? m->training : false;
}

SR_API void sr_module_seed(sr_module *m, uint64_t seed)
{
    if (!m) {
        sr__fail(-EINVAL, "sr_module_seed", "module is NULL");
        return;
    }
    sr_generator_init(&m->drop, seed);
}
