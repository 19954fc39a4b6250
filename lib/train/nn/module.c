/* SPDX-License-Identifier: MIT */
/* Modules: an ordered list of named leaf parameters and the forward function
 * that uses them (nn.h states the lifetime rule; module_impl.h the layout). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "module_impl.h"
#include "shmrpc/nn.h"

int sr__module_new(enum sr__module_kind kind, int nlayers, size_t cap, sr_module **out)
{
    sr_module *m = calloc(1, sizeof(*m));
    if (m) {
        m->params = calloc(cap, sizeof(*m->params));
        m->names = calloc(cap, sizeof(*m->names));
    }
    if (!m || !m->params || !m->names) {
        sr_module_destroy(m);
        return sr__fail(-ENOMEM, "sr_module", "out of memory for %zu parameters", cap);
    }
    m->kind = kind;
    m->nlayers = nlayers;
    m->training = true;
    *out = m;
    return 0;
}

int sr__module_add(sr_module *m, const char *prefix, const char *what, sr_tensor *t)
{
    char name[64];
    snprintf(name, sizeof(name), "%s%s", prefix, what);
    if (!t)
        return -EINVAL; /* the detail is already set */
    char *copy = strdup(name);
    if (!copy) {
        sr_tensor_unref(t);
        return sr__fail(-ENOMEM, "sr_module", "out of memory for a parameter name");
    }
    m->params[m->n] = t;
    m->names[m->n++] = copy;
    return 0;
}

int sr__module_add_uniform(sr_module *m, const char *prefix, const char *what, int ndim, const int64_t *shape,
                           double bound, sr_dtype dt, sr_generator *g)
{
    return sr__module_add(m, prefix, what,
                          sr_generator_uniform_tensor(g, dt, ndim, shape, -bound, bound, SR_REQUIRES_GRAD));
}

int sr__module_check_dtype(const char *fn, sr_dtype dt, const sr_generator *g)
{
    if (dt != SR_F32 && dt != SR_F64)
        return sr__fail(-EINVAL, fn, "dtype %s: parameters must be f32 or f64", sr_dtype_name(dt));
    return g ? 0 : sr__fail(-EINVAL, fn, "no generator given");
}

/* torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) on the
 * weight has bound gain * sqrt(3 / fan_in) with gain sqrt(2 / (1 + 5)),
 * i.e. 1/sqrt(in), the same bound as the bias. Weight first, then bias. */
static int add_linear(sr_module *m, const char *prefix, int64_t in, int64_t out, bool bias, sr_dtype dt,
                      sr_generator *g)
{
    double bound = 1.0 / sqrt((double)in);
    int rc = sr__module_add_uniform(m, prefix, "weight", 2, (const int64_t[]){out, in}, bound, dt, g);
    return rc || !bias ? rc : sr__module_add_uniform(m, prefix, "bias", 1, &out, bound, dt, g);
}

static int check_layer(const char *fn, int64_t in, int64_t out, sr_dtype dt, const sr_generator *g)
{
    if (in < 1 || out < 1)
        return sr__fail(-EINVAL, fn, "a layer of %lld -> %lld features: both must be >= 1", (long long)in,
                        (long long)out);
    return sr__module_check_dtype(fn, dt, g);
}

SR_API int sr_linear_create(int64_t in, int64_t out, bool bias, sr_dtype dt, sr_generator *g, sr_module **m)
{
    int rc = check_layer("sr_linear_create", in, out, dt, g);
    if (rc || (rc = sr__module_new(SR__MODULE_LINEAR, 1, 2, m)))
        return rc;
    if ((rc = add_linear(*m, "", in, out, bias, dt, g))) {
        sr_module_destroy(*m);
        *m = NULL;
    }
    return rc;
}

SR_API int sr_mlp_create(const int64_t *sizes, int nlayers, sr_generator *g, sr_dtype dt, sr_module **m)
{
    if (!sizes || nlayers < 1)
        return sr__fail(-EINVAL, "sr_mlp_create", "needs sizes[0..nlayers] with nlayers >= 1 (got %d)", nlayers);
    int rc = 0;
    for (int i = 0; !rc && i < nlayers; i++)
        rc = check_layer("sr_mlp_create", sizes[i], sizes[i + 1], dt, g);
    if (rc || (rc = sr__module_new(SR__MODULE_MLP, nlayers, 2 * (size_t)nlayers, m)))
        return rc;
    for (int i = 0; !rc && i < nlayers; i++) {
        char prefix[16];
        snprintf(prefix, sizeof(prefix), "%d.", 2 * i); /* nn.Sequential counts the ReLUs */
        rc = add_linear(*m, prefix, sizes[i], sizes[i + 1], true, dt, g);
    }
    if (rc) {
        sr_module_destroy(*m);
        *m = NULL;
    }
    return rc;
}

SR_API void sr_module_destroy(sr_module *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++) {
        sr_tensor_unref(m->params[i]);
        free(m->names[i]);
    }
    free(m->params);
    free(m->names);
    free(m->layers);
    free(m);
}

SR_API sr_tensor *sr_module_forward(sr_module *m, sr_tensor *x)
{
    if (!m || !x) {
        if (!m)
            sr__fail(-EINVAL, "sr_module_forward", "no module given");
        return NULL;
    }
    if (m->kind == SR__MODULE_SEQUENTIAL)
        return sr__sequential_forward(m, x, 0, m->nlayers);
    if (m->kind == SR__MODULE_MLP)
        return sr_mlp_apply(x, m->params, m->nlayers);
    return sr_linear(x, m->params[0], m->n > 1 ? m->params[1] : NULL);
}

SR_API void sr_module_params(const sr_module *m, size_t *n, sr_tensor *const **params, const char *const **names)
{
    if (n)
        *n = m->n;
    if (params)
        *params = m->params;
    if (names)
        *names = (const char *const *)m->names;
}

SR_API sr_tensor *sr_module_param(const sr_module *m, const char *name)
{
    for (size_t i = 0; name && i < m->n; i++)
        if (!strcmp(m->names[i], name))
            return m->params[i];
    sr__fail(-ENOENT, "sr_module_param", "no parameter named \"%s\"", name ? name : "(null)");
    return NULL;
}

SR_API size_t sr_module_numel(const sr_module *m)
{
    if (!m) {
        sr__fail(-EINVAL, "sr_module_numel", "module is NULL");
        return 0;
    }
    size_t total = 0;
    for (size_t i = 0; i < m->n; i++)
        total += sr_tensor_numel(m->params[i]);
    return total;
}

SR_API void sr_module_zero_grad(sr_module *m)
{
    if (!m) {
        sr__fail(-EINVAL, "sr_module_zero_grad", "module is NULL");
        return;
    }
    for (size_t i = 0; i < m->n; i++)
        sr_tensor_set_grad(m->params[i], NULL);
}
