/* SPDX-License-Identifier: MIT */
/* Module state: the parameters as a named list (state_dict) and loading one
 * back (load_state_dict); nn.h states the ownership rule. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "module_impl.h"
#include "shmrpc/nn.h"
#include "tensor_seam.h"

SR_API void sr_module_state_free(size_t n, char **names, sr_tensor **tensors)
{
    for (size_t i = 0; i < n; i++) {
        if (names)
            free(names[i]);
        if (tensors)
            sr_tensor_unref(tensors[i]);
    }
    free(names);
    free(tensors);
}

SR_API int sr_module_state_dict(const sr_module *m, const char *prefix, size_t *n, char ***names,
                                sr_tensor ***tensors)
{
    const char *fn = "sr_module_state_dict";
    if (!m || !n || !names || !tensors)
        return sr__fail(-EINVAL, fn, "%s is NULL", !m ? "module" : "an out pointer");
    if (!prefix)
        prefix = "";
    char **nm = calloc(m->n ? m->n : 1, sizeof(*nm));
    sr_tensor **ts = calloc(m->n ? m->n : 1, sizeof(*ts));
    int rc = nm && ts ? 0 : -ENOMEM;
    for (size_t i = 0; !rc && i < m->n; i++) {
        size_t len = strlen(prefix) + strlen(m->names[i]) + 1;
        if (!(nm[i] = malloc(len))) {
            rc = -ENOMEM;
            break;
        }
        snprintf(nm[i], len, "%s%s", prefix, m->names[i]);
        ts[i] = sr_tensor_ref(m->params[i]);
    }
    if (rc) {
        sr_module_state_free(nm && ts ? m->n : 0, nm, ts);
        return sr__fail(rc, fn, "out of memory for %zu parameters", m->n);
    }
    *n = m->n;
    *names = nm;
    *tensors = ts;
    return 0;
}

/* The index of the parameter called name; m->n when there is none. */
static size_t param_index(const sr_module *m, const char *name)
{
    size_t i = 0;
    while (i < m->n && strcmp(m->names[i], name))
        i++;
    return i;
}

/* src can go into parameter i as it is. */
static int check_entry(const sr_module *m, size_t i, const sr_tensor *src)
{
    const char *fn = "sr_module_load_state_dict", *name = m->names[i];
    const sr_tensor *dst = m->params[i];
    if (!src)
        return sr__fail(-EINVAL, fn, "the tensor for '%s' is NULL", name);
    if (sr_tensor_dtype(src) != sr_tensor_dtype(dst))
        return sr__fail(-EINVAL, fn, "'%s' is %s in the state, %s in the module", name,
                        sr_dtype_name(sr_tensor_dtype(src)), sr_dtype_name(sr_tensor_dtype(dst)));
    if (!sr__same_shape(src, dst)) {
        char a[SR_SHAPE_STR], b[SR_SHAPE_STR];
        return sr__fail(-EINVAL, fn, "'%s' has shape %s in the state, %s in the module", name,
                        sr__tensor_shape_str(src, a), sr__tensor_shape_str(dst, b));
    }
    return 0;
}

/* Every name is a parameter, given once, with a tensor that fits it; when
 * strict, every parameter is given. src[i] = the tensor for parameter i. */
static int check_state(const sr_module *m, size_t n, const char *const *names, sr_tensor *const *tensors,
                       bool strict, const sr_tensor **src)
{
    const char *fn = "sr_module_load_state_dict";
    for (size_t k = 0; k < n; k++) {
        if (!names[k])
            return sr__fail(-EINVAL, fn, "name %zu is NULL", k);
        size_t i = param_index(m, names[k]);
        if (i == m->n)
            return sr__fail(-ENOENT, fn, "unexpected key '%s': the module has no such parameter", names[k]);
        if (src[i])
            return sr__fail(-EINVAL, fn, "'%s' is given twice", names[k]);
        int rc = check_entry(m, i, tensors[k]);
        if (rc)
            return rc;
        src[i] = tensors[k];
    }
    for (size_t i = 0; strict && i < m->n; i++)
        if (!src[i])
            return sr__fail(-ENOENT, fn, "missing key '%s': the state has no value for this parameter",
                            m->names[i]);
    return 0;
}

SR_API int sr_module_load_state_dict(sr_module *m, size_t n, const char *const *names, sr_tensor *const *tensors,
                                     bool strict)
{
    const char *fn = "sr_module_load_state_dict";
    if (!m || (n && (!names || !tensors)))
        return sr__fail(-EINVAL, fn, "%s is NULL", !m ? "module" : !names ? "names" : "tensors");
    const sr_tensor **src = calloc(m->n ? m->n : 1, sizeof(*src));
    if (!src)
        return sr__fail(-ENOMEM, fn, "no memory for %zu parameters", m->n);
    int rc = check_state(m, n, names, tensors, strict, src);
    /* Grad mode off, as torch's load_state_dict: the parameters are leaves
     * that require grad, and take the values without recording history. */
    bool prev = sr_no_grad_enter();
    for (size_t i = 0; i < m->n && !rc; i++)
        rc = src[i] && src[i] != m->params[i] ? sr_copy_(m->params[i], src[i]) : 0;
    sr_no_grad_exit(prev);
    free((void *)src);
    return rc;
}
