/* SPDX-License-Identifier: MIT */
/* Values: refcounted, immutable, one allocation each (see value_internal.h).
 *
 * Refcount contract: a reference is only ever created from a reference the
 * caller already holds, so sr_value_ref() needs no ordering. The decrement
 * that reaches zero must see every other thread's use of the value before it
 * frees it, hence acq_rel on each decrement (release: publish my uses;
 * acquire on the last one: see everybody's).
 *
 * Objects: the destructor runs exactly once, when the last reference goes. If
 * sr_object() fails, it is never called and the caller still owns p.
 */
#include "value_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "module.h"
#include "desc.h"

/* Live values of this process by kind, for the shutdown leak check.
 * relaxed (every access): a count, ordered with nothing; the check reads it
 * after the runtime's threads are joined. */
static _Atomic int64_t live_values[SR__VALUE_KINDS];

void sr__value_live_counts(int64_t out[SR__VALUE_KINDS])
{
    for (int i = 0; i < SR__VALUE_KINDS; i++)
        out[i] = atomic_load_explicit(&live_values[i], memory_order_relaxed);
}

static sr_value *value_alloc(sr_kind kind, size_t tail, const char *fn)
{
    if (tail > SIZE_MAX - sizeof(sr_value)) {
        sr__fail(-ENOMEM, fn, "a %s of %zu bytes does not fit in memory", sr_kind_name(kind), tail);
        return NULL;
    }
    sr_value *v = malloc(sizeof(sr_value) + tail);
    if (!v) {
        sr__fail(-ENOMEM, fn, "out of memory for a %s of %zu bytes", sr_kind_name(kind), tail);
        return NULL;
    }
    /* Relaxed: nobody else can see v until the constructor returns it. */
    atomic_init(&v->refs, 1);
    v->kind = (uint8_t)kind;
    v->depth = 0;
    atomic_fetch_add_explicit(&live_values[kind], 1, memory_order_relaxed); /* relaxed: see live_values */
    return v;
}

/* None is immortal: one static value shared by everybody; ref and unref
 * leave it alone, so no call ever allocates or frees it. */
static sr_value none_value = {.kind = SR_KIND_NONE};
/* So is the empty list (values are immutable): a call without arguments
 * decodes its argument list without allocating, on every call. */
static sr_value empty_list = {.kind = SR_KIND_LIST, .depth = 1};

static bool immortal(const sr_value *v) { return v == &none_value || v == &empty_list; }

SR_API sr_value *sr_none(void) { return &none_value; }

SR_API sr_value *sr_bool(bool b)
{
    sr_value *v = value_alloc(SR_KIND_BOOL, 0, __func__);
    if (v)
        v->u.b = b;
    return v;
}

SR_API sr_value *sr_int(int64_t i)
{
    sr_value *v = value_alloc(SR_KIND_INT, 0, __func__);
    if (v)
        v->u.i = i;
    return v;
}

SR_API sr_value *sr_double(double d)
{
    sr_value *v = value_alloc(SR_KIND_DOUBLE, 0, __func__);
    if (v)
        v->u.d = d;
    return v;
}

/* Strings and bytes share a layout: len, then the data and a NUL (so a
 * string is a C string in place, and bytes of length 0 still have a tail). */
static sr_value *blob_new(sr_kind kind, const void *p, size_t n, const char *fn)
{
    if (n == SIZE_MAX) {
        sr__fail(-ENOMEM, fn, "a %s of %zu bytes does not fit in memory", sr_kind_name(kind), n);
        return NULL;
    }
    sr_value *v = value_alloc(kind, n + 1, fn);
    if (!v)
        return NULL;
    v->u.len = n;
    if (n)
        memcpy(v->tail, p, n);
    v->tail[n] = 0;
    return v;
}

SR_API sr_value *sr_str(const char *s)
{
    if (!s) {
        sr__fail(-EINVAL, __func__, "the string is NULL");
        return NULL;
    }
    return blob_new(SR_KIND_STR, s, strlen(s), __func__);
}

sr_value *sr__str_n(const char *s, size_t n) { return blob_new(SR_KIND_STR, s, n, "sr_str"); }

SR_API sr_value *sr_bytes(const void *p, size_t n)
{
    if (!p && n) {
        sr__fail(-EINVAL, __func__, "NULL data with length %zu", n);
        return NULL;
    }
    return blob_new(SR_KIND_BYTES, p, n, __func__);
}

SR_API sr_value *sr_value_from_tensor(sr_tensor *t)
{
    if (!t) {
        sr__fail(-EINVAL, __func__, "the tensor is NULL");
        return NULL;
    }
    sr_value *v = value_alloc(SR_KIND_TENSOR, 0, __func__);
    if (v)
        v->u.tensor = sr_tensor_ref(t);
    return v;
}

SR_API sr_value *sr_tensor_value(sr_tensor *t) { return sr_value_from_tensor(t); }

sr_value *sr__value_module(int kind, void *obj)
{
    sr_value *v = value_alloc((sr_kind)kind, 0, __func__);
    if (v)
        v->u.mod = obj;
    return v;
}

void *sr__value_module_obj(const sr_value *v, int kind) { return v && v->kind == kind ? v->u.mod : NULL; }

sr_value *sr__list_alloc(size_t n)
{
    if (n == 0)
        return &empty_list;
    if (n > (SIZE_MAX - sizeof(sr_value)) / sizeof(sr_value *)) {
        sr__fail(-ENOMEM, "sr_list", "a list of %zu items does not fit in memory", n);
        return NULL;
    }
    sr_value *v = value_alloc(SR_KIND_LIST, n * sizeof(sr_value *), "sr_list");
    if (!v)
        return NULL;
    v->u.n = n;
    v->depth = 1;
    sr_value **items = sr__list_items(v);
    for (size_t i = 0; i < n; i++)
        items[i] = NULL;
    return v;
}

void sr__list_set(sr_value *list, size_t i, sr_value *item)
{
    sr__list_items(list)[i] = item;
    if (item->depth >= list->depth)
        list->depth = (uint8_t)(item->depth + 1);
}

SR_API sr_value *sr_list(size_t n, sr_value *const *items)
{
    if (n && !items) {
        sr__fail(-EINVAL, __func__, "NULL items with n = %zu", n);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!items[i]) {
            sr__fail(-EINVAL, __func__, "item %zu of %zu is NULL", i, n);
            return NULL;
        }
        if (items[i]->depth >= SR_VALUE_MAX_DEPTH) {
            sr__fail(-EINVAL, __func__, "item %zu is nested %d lists deep; a list may nest at most %d",
                     i, items[i]->depth, SR_VALUE_MAX_DEPTH);
            return NULL;
        }
    }
    sr_value *v = sr__list_alloc(n);
    if (!v)
        return NULL;
    for (size_t i = 0; i < n; i++)
        sr__list_set(v, i, sr_value_ref(items[i]));
    return v;
}

SR_API sr_value *sr_object(void *p, void (*destroy)(void *), const char *type_name)
{
    if (!type_name) {
        sr__fail(-EINVAL, __func__, "the type name of object %p is NULL", p);
        return NULL;
    }
    size_t tn = strlen(type_name);
    sr_value *v = value_alloc(SR_KIND_OBJECT, tn + 1, __func__);
    if (!v)
        return NULL;
    memcpy(v->tail, type_name, tn + 1);
    v->u.obj.p = p;
    v->u.obj.destroy = destroy;
    v->u.obj.type = (const char *)v->tail;
    return v;
}

SR_API sr_value *sr_value_ref(sr_value *v)
{
    /* Relaxed: the caller already holds a reference, so v cannot be freed
     * concurrently; the new reference needs no ordering of its own. */
    if (v && !immortal(v))
        atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
    return v;
}

static void value_destroy(sr_value *v)
{
    switch ((sr_kind)v->kind) {
    case SR_KIND_LIST: {
        sr_value **items = sr__list_items(v);
        for (size_t i = 0; i < v->u.n; i++)
            sr_value_unref(items[i]); /* NULL in a partly decoded list */
        break;
    }
    case SR_KIND_OBJECT:
        if (v->u.obj.destroy)
            v->u.obj.destroy(v->u.obj.p);
        break;
    case SR_KIND_TENSOR:
        sr_tensor_unref(v->u.tensor);
        break;
    default:
        if (v->kind >= SR_KIND_MODULE) /* only a module makes values of its kind */
            sr__value_kind(v->kind)->release(v->u.mod);
        break;
    }
    atomic_fetch_sub_explicit(&live_values[v->kind], 1, memory_order_relaxed); /* relaxed: see live_values */
    free(v);
}

SR_API void sr_value_unref(sr_value *v)
{
    if (!v || immortal(v))
        return;
    /* Sole owner: a count of 1 is our own reference, and nobody can take a
     * new one without holding one, so it cannot change under us; skip the
     * read-modify-write (most decoded values die this way). Acquire pairs
     * with the release half of the decrements that brought the count to 1,
     * so their holders' uses happen before the destroy. */
    if (atomic_load_explicit(&v->refs, memory_order_acquire) == 1) {
        value_destroy(v);
        return;
    }
    /* acq_rel, pairs with the other holders' decrements: release publishes
     * this thread's reads of v before its reference goes; the acquire on the
     * last decrement orders the destroy after everyone else's reads. */
    if (atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1)
        value_destroy(v);
}

SR_API sr_kind sr_value_type(const sr_value *v) { return v ? (sr_kind)v->kind : SR_KIND_NONE; }

SR_API const char *sr_kind_name(sr_kind k)
{
    switch (k) {
    case SR_KIND_NONE: return "none";
    case SR_KIND_BOOL: return "bool";
    case SR_KIND_INT: return "int";
    case SR_KIND_DOUBLE: return "double";
    case SR_KIND_STR: return "str";
    case SR_KIND_BYTES: return "bytes";
    case SR_KIND_TENSOR: return "tensor";
    case SR_KIND_LIST: return "list";
    case SR_KIND_OBJECT: return "object";
    case SR_KIND_MODULE: break;
    }
    const sr_value_kind_ops *m = sr__value_kind(k);
    return m ? m->name : "unknown";
}

static bool is(const sr_value *v, sr_kind k) { return v && v->kind == k; }

SR_API bool sr_value_bool(const sr_value *v) { return is(v, SR_KIND_BOOL) && v->u.b; }
SR_API int64_t sr_value_int(const sr_value *v) { return is(v, SR_KIND_INT) ? v->u.i : 0; }

SR_API double sr_value_double(const sr_value *v)
{
    if (is(v, SR_KIND_DOUBLE))
        return v->u.d;
    return is(v, SR_KIND_INT) ? (double)v->u.i : 0.0;
}

SR_API const char *sr_value_str(const sr_value *v)
{
    return is(v, SR_KIND_STR) ? (const char *)v->tail : NULL;
}

SR_API const void *sr_value_bytes(const sr_value *v, size_t *len)
{
    bool ok = is(v, SR_KIND_BYTES);
    if (len)
        *len = ok ? v->u.len : 0;
    return ok ? v->tail : NULL;
}

SR_API sr_tensor *sr_value_tensor(const sr_value *v) { return is(v, SR_KIND_TENSOR) ? v->u.tensor : NULL; }
SR_API size_t sr_value_list_len(const sr_value *v) { return is(v, SR_KIND_LIST) ? v->u.n : 0; }

SR_API sr_value *sr_value_list_at(const sr_value *v, size_t i)
{
    return is(v, SR_KIND_LIST) && i < v->u.n ? sr__list_items(v)[i] : NULL;
}

SR_API void *sr_value_object(const sr_value *v) { return is(v, SR_KIND_OBJECT) ? v->u.obj.p : NULL; }
SR_API const char *sr_value_object_type(const sr_value *v) { return is(v, SR_KIND_OBJECT) ? v->u.obj.type : NULL; }

/* Doubles: equal as numbers (so 0.0 == -0.0), and NaN equals NaN, so that a
 * value always equals itself and its decoded copy. Objects and rrefs compare
 * by identity: they are handles, not data. */
SR_API bool sr_value_equal(const sr_value *a, const sr_value *b)
{
    if (a == b)
        return true;
    if (!a || !b || a->kind != b->kind)
        return false;
    switch ((sr_kind)a->kind) {
    case SR_KIND_NONE: return true;
    case SR_KIND_BOOL: return a->u.b == b->u.b;
    case SR_KIND_INT: return a->u.i == b->u.i;
    case SR_KIND_DOUBLE: return a->u.d == b->u.d || (isnan(a->u.d) && isnan(b->u.d));
    case SR_KIND_STR:
    case SR_KIND_BYTES: return a->u.len == b->u.len && memcmp(a->tail, b->tail, a->u.len) == 0;
    case SR_KIND_LIST:
        if (a->u.n != b->u.n)
            return false;
        for (size_t i = 0; i < a->u.n; i++)
            if (!sr_value_equal(sr__list_items(a)[i], sr__list_items(b)[i]))
                return false;
        return true;
    case SR_KIND_OBJECT: return a->u.obj.p == b->u.obj.p;
    case SR_KIND_TENSOR: return sr__tensor_equal(a->u.tensor, b->u.tensor);
    default: break;
    }
    /* a module's kind: the same object (an RRef's received copy is another fork) */
    return a->kind >= SR_KIND_MODULE && a->u.mod == b->u.mod;
}

const char *sr__value_repr(const sr_value *v, char *buf, size_t len)
{
    if (!len)
        return buf;
    if (!v) {
        snprintf(buf, len, "NULL");
        return buf;
    }
    switch ((sr_kind)v->kind) {
    case SR_KIND_BOOL: snprintf(buf, len, "bool %s", v->u.b ? "true" : "false"); break;
    case SR_KIND_INT: snprintf(buf, len, "int %" PRId64, v->u.i); break;
    case SR_KIND_DOUBLE: snprintf(buf, len, "double %.17g", v->u.d); break;
    case SR_KIND_STR:
        snprintf(buf, len, "str '%.40s'%s", (const char *)v->tail, v->u.len > 40 ? "..." : "");
        break;
    case SR_KIND_BYTES: snprintf(buf, len, "bytes of %zu", v->u.len); break;
    case SR_KIND_LIST: snprintf(buf, len, "list of %zu", v->u.n); break;
    case SR_KIND_OBJECT: snprintf(buf, len, "object of type '%s'", v->u.obj.type); break;
    case SR_KIND_TENSOR: {
        char t[SR_TENSOR_REPR];
        snprintf(buf, len, "tensor %s", sr__tensor_repr(v->u.tensor, t));
        break;
    }
    default: {
        char r[96];
        const sr_value_kind_ops *k = sr__value_kind(v->kind);
        if (k)
            snprintf(buf, len, "%s %s", k->name, k->str ? k->str(v->u.mod, r, sizeof(r)) : "?");
        else
            snprintf(buf, len, "%s", sr_kind_name((sr_kind)v->kind));
        break;
    }
    }
    return buf;
}
