/* SPDX-License-Identifier: MIT */
/* Per-parameter state: how it starts, and its export and import under
 * torch's key names ("<param index>.<key>"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "optim_impl.h"
#include "tensor_seam.h"

#define STEP_KEY "step"

static int set_slot(sr_optim *o, size_t i, int s, sr_tensor *t)
{
    if (!t)
        return -ENOMEM; /* the factory said why */
    sr_tensor_unref(*sr__optim_slot(o, i, s));
    *sr__optim_slot(o, i, s) = t;
    return 0;
}

int sr__optim_init_step(sr_optim *o, size_t i, int s)
{
    return set_slot(o, i, s, sr_scalar_tensor(SR_F64, 0.0, 0));
}

int sr__optim_init_full(sr_optim *o, size_t i, int s, double v)
{
    const sr_tensor *p = o->params[i];
    return set_slot(o, i, s, sr_full(sr_tensor_dtype(p), sr_tensor_ndim(p), sr_tensor_shape(p), v, 0));
}

int sr__optim_init_default(sr_optim *o, size_t i)
{
    unsigned used = o->ops->used(&o->opts);
    int rc = 0;
    for (int s = 0; !rc && s < SR__OPTIM_SLOTS; s++)
        if (used & (1u << s))
            rc = strcmp(o->ops->slots[s], STEP_KEY) ? sr__optim_init_full(o, i, s, 0.0)
                                                    : sr__optim_init_step(o, i, s);
    return rc;
}

void sr__optim_clear(sr_optim *o, size_t i)
{
    for (int s = 0; s < SR__OPTIM_SLOTS; s++) {
        sr_tensor_unref(*sr__optim_slot(o, i, s));
        *sr__optim_slot(o, i, s) = NULL;
    }
    o->inited[i] = false;
}

/* ---- export ---- */

SR_API void sr_optim_state_free(size_t n, char **names, sr_tensor **tensors)
{
    for (size_t k = 0; (names || tensors) && k < n; k++) { /* no arrays: nothing to walk, whatever n says */
        if (names)
            free(names[k]);
        if (tensors)
            sr_tensor_unref(tensors[k]);
    }
    free(names);
    free(tensors);
}

static size_t count_entries(const sr_optim *o)
{
    size_t m = 0;
    for (size_t k = 0; k < o->n * SR__OPTIM_SLOTS; k++)
        m += o->state[k] != NULL;
    return m;
}

SR_API int sr_optim_state_export(const sr_optim *o, size_t *n, char ***names, sr_tensor ***tensors)
{
    if (!o || !n || !names || !tensors)
        return sr__fail(-EINVAL, "sr_optim_state_export", "an argument is NULL");
    size_t m = count_entries(o), k = 0;
    char **nm = calloc(m + 1, sizeof(*nm));
    sr_tensor **ts = calloc(m + 1, sizeof(*ts));
    bool ok = nm && ts;
    for (size_t i = 0; ok && i < o->n; i++)
        for (int s = 0; ok && s < SR__OPTIM_SLOTS; s++) {
            sr_tensor *t = o->state[i * SR__OPTIM_SLOTS + (size_t)s];
            if (!t)
                continue;
            size_t len = (size_t)snprintf(NULL, 0, "%zu.%s", i, o->ops->slots[s]) + 1;
            if ((nm[k] = malloc(len)))
                snprintf(nm[k], len, "%zu.%s", i, o->ops->slots[s]);
            ts[k] = sr_clone(t); /* a snapshot: later steps write the original */
            ok = nm[k] && ts[k];
            k++;
        }
    if (!ok) {
        sr_optim_state_free(k, nm, ts);
        return sr__fail(-ENOMEM, "sr_optim_state_export", "out of memory");
    }
    *n = m, *names = nm, *tensors = ts;
    return 0;
}

/* ---- import ---- */

static void free_table(size_t n, sr_tensor **state, bool *inited)
{
    for (size_t k = 0; state && k < n * SR__OPTIM_SLOTS; k++)
        sr_tensor_unref(state[k]);
    free(state);
    free(inited);
}

/* name = "<i>.<key>" with i < o->n and key a slot the options use: *i, *s. */
static int parse_name(const sr_optim *o, const char *name, size_t *i, int *s)
{
    const char *fn = "sr_optim_state_import";
    char *end;
    if (!name || name[0] < '0' || name[0] > '9')
        return sr__fail(-EINVAL, fn, "%s: bad state name \"%s\"", o->ops->name, name ? name : "(null)");
    unsigned long long v = strtoull(name, &end, 10);
    if (*end != '.')
        return sr__fail(-EINVAL, fn, "%s: bad state name \"%s\"", o->ops->name, name);
    if (v >= o->n)
        return sr__fail(-EINVAL, fn, "%s: state \"%s\" names parameter %llu of %zu", o->ops->name, name, v, o->n);
    unsigned used = o->ops->used(&o->opts);
    for (int k = 0; k < SR__OPTIM_SLOTS && o->ops->slots[k]; k++)
        if ((used & (1u << k)) && !strcmp(end + 1, o->ops->slots[k])) {
            *i = (size_t)v, *s = k;
            return 0;
        }
    return sr__fail(-EINVAL, fn, "%s: unknown state \"%s\" for these options", o->ops->name, name);
}

/* The tensor fits slot s of parameter i. */
static int check_entry(const sr_optim *o, const char *name, size_t i, int s, const sr_tensor *t)
{
    const char *fn = "sr_optim_state_import";
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    const sr_tensor *p = o->params[i];
    if (!t)
        return sr__fail(-EINVAL, fn, "%s: state \"%s\" is NULL", o->ops->name, name);
    if (!strcmp(o->ops->slots[s], STEP_KEY))
        return sr_tensor_numel(t) == 1 ? 0
                                       : sr__fail(-EINVAL, fn, "%s: state \"%s\" has %zu elements, expected 1",
                                                  o->ops->name, name, sr_tensor_numel(t));
    if (sr_tensor_dtype(t) == SR_I64)
        return sr__fail(-EINVAL, fn, "%s: state \"%s\" has dtype i64", o->ops->name, name);
    if (!sr__same_shape(t, p))
        return sr__fail(-EINVAL, fn, "%s: state \"%s\" has shape %s but parameter %zu has shape %s", o->ops->name,
                        name, sr__tensor_shape_str(t, b1), i, sr__tensor_shape_str(p, b2));
    return 0;
}

/* Every entry valid, none twice, and each parameter with all of its slots or
 * none. where[k] = slot index i * SR__OPTIM_SLOTS + s of entry k. */
static int check_import(const sr_optim *o, size_t n, const char *const *names, sr_tensor *const *ts, size_t *where)
{
    const char *fn = "sr_optim_state_import";
    unsigned used = o->ops->used(&o->opts);
    unsigned *have = calloc(o->n, sizeof(*have));
    int rc = have ? 0 : sr__fail(-ENOMEM, fn, "out of memory");
    for (size_t k = 0; !rc && k < n; k++) {
        size_t i = 0;
        int s = 0;
        if (!(rc = parse_name(o, names[k], &i, &s)) && !(rc = check_entry(o, names[k], i, s, ts[k]))) {
            if (have[i] & (1u << s))
                rc = sr__fail(-EINVAL, fn, "%s: state \"%s\" appears twice", o->ops->name, names[k]);
            have[i] |= 1u << s;
            where[k] = i * SR__OPTIM_SLOTS + (size_t)s;
        }
    }
    for (size_t i = 0; !rc && i < o->n; i++)
        if (have[i] && have[i] != used)
            rc = sr__fail(-EINVAL, fn, "%s: parameter %zu has some of its state but not all", o->ops->name, i);
    free(have);
    return rc;
}

/* A private copy of t for slot s of parameter p. */
static sr_tensor *import_copy(const sr_optim *o, int s, const sr_tensor *p, sr_tensor *t)
{
    if (!strcmp(o->ops->slots[s], STEP_KEY))
        return sr_scalar_tensor(SR_F64, sr_tensor_item(t), 0);
    sr_tensor *c = sr_empty(sr_tensor_dtype(p), sr_tensor_ndim(p), sr_tensor_shape(p), 0);
    if (c && sr_copy_(c, t)) {
        sr_tensor_unref(c);
        return NULL;
    }
    return c;
}

/* The new state table: the copies, then fresh state where a parameter got none. */
static int build_state(sr_optim *o, size_t n, sr_tensor *const *ts, const size_t *where)
{
    int rc = 0;
    for (size_t k = 0; !rc && k < n; k++) {
        size_t i = where[k] / SR__OPTIM_SLOTS;
        int s = (int)(where[k] % SR__OPTIM_SLOTS);
        rc = set_slot(o, i, s, import_copy(o, s, o->params[i], ts[k]));
        o->inited[i] = true;
    }
    for (size_t i = 0; !rc && i < o->n; i++)
        if (!o->inited[i] && o->ops->eager && !(rc = o->ops->init(o, i)))
            o->inited[i] = true;
    return rc;
}

SR_API int sr_optim_state_import(sr_optim *o, size_t n, const char *const *names, sr_tensor *const *tensors)
{
    const char *fn = "sr_optim_state_import";
    if (!o || (n && (!names || !tensors)))
        return sr__fail(-EINVAL, fn, "an argument is NULL");
    size_t *where = calloc(n + 1, sizeof(*where));
    if (!where)
        return sr__fail(-ENOMEM, fn, "out of memory");
    int rc = check_import(o, n, names, tensors, where);
    if (rc) {
        free(where);
        return rc;
    }
    /* Build into a scratch table (o's parameters, fresh state arrays), so
     * that a failure leaves o as it was; then release the losing table. */
    sr_optim tmp = *o;
    tmp.state = calloc(o->n * SR__OPTIM_SLOTS, sizeof(*tmp.state));
    tmp.inited = calloc(o->n, sizeof(*tmp.inited));
    rc = tmp.state && tmp.inited ? build_state(&tmp, n, tensors, where) : sr__fail(-ENOMEM, fn, "out of memory");
    sr_tensor **old_state = tmp.state;
    bool *old_inited = tmp.inited;
    if (!rc) {
        old_state = o->state, old_inited = o->inited;
        o->state = tmp.state, o->inited = tmp.inited;
    }
    free_table(o->n, old_state, old_inited);
    free(where);
    return rc;
}
