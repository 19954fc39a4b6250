/* SPDX-License-Identifier: MIT */
/* shmrpc: values, the arguments and results of remote calls.
 *
 * A value is immutable and refcounted. Kinds: none, bool, int (int64),
 * double, string, bytes, tensor (zero-copy: shares storage, copy-on-write),
 * list (of values), and object: an opaque owner-local pointer with a
 * destructor, which never leaves its process (sending one to another worker
 * is an error; a self-call passes it by reference).
 *
 * Lifetime: every constructor returns a new reference (or NULL on -ENOMEM,
 * with sr_last_error()). sr_list() takes its own references to the items;
 * the caller keeps its own. Accessors return borrowed pointers, valid while
 * the value is alive. sr_value_unref(NULL) is a no-op.
 */
#ifndef SHMRPC_VALUE_H
#define SHMRPC_VALUE_H

#if defined(SR__BUILDING) && !defined(SR__SEES_RPC)
#error "shmrpc/value.h belongs to the RPC core (rpc) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sr_value sr_value;
typedef struct sr_tensor sr_tensor;
typedef struct sr_rref sr_rref;

typedef enum sr_kind {
    SR_KIND_NONE = 0,
    SR_KIND_BOOL,
    SR_KIND_INT,
    SR_KIND_DOUBLE,
    SR_KIND_STR,
    SR_KIND_BYTES,
    SR_KIND_TENSOR,
    SR_KIND_LIST,
    SR_KIND_OBJECT,
    /* Kinds of the layers above RPC, numbered as they register (at most 4):
     * each layer's header names its own (shmrpc/rref.h: SR_KIND_RREF). */
    SR_KIND_MODULE,
} sr_kind;

SR_API sr_value *sr_none(void);
SR_API sr_value *sr_bool(bool b);
SR_API sr_value *sr_int(int64_t i);
SR_API sr_value *sr_double(double d);
SR_API sr_value *sr_str(const char *s);                  /* copies; NULL s is -EINVAL */
SR_API sr_value *sr_bytes(const void *p, size_t n);      /* copies */
SR_API sr_value *sr_value_from_tensor(sr_tensor *t);     /* takes its own reference to t */
SR_API sr_value *sr_list(size_t n, sr_value *const *items); /* takes its own item references */
SR_API sr_value *sr_object(void *p, void (*destroy)(void *), const char *type_name);

/* The old name of sr_value_from_tensor, kept for one release. */
SR_API sr_value *sr_tensor_value(sr_tensor *t) __attribute__((deprecated("use sr_value_from_tensor")));

SR_API sr_value *sr_value_ref(sr_value *v);
SR_API void sr_value_unref(sr_value *v);

SR_API sr_kind sr_value_type(const sr_value *v);
SR_API const char *sr_kind_name(sr_kind k);              /* "int", "tensor", ... */
/* Accessors: the value if the kind matches, else 0/NULL/false. */
SR_API bool sr_value_bool(const sr_value *v);
SR_API int64_t sr_value_int(const sr_value *v);
SR_API double sr_value_double(const sr_value *v);        /* ints convert */
SR_API const char *sr_value_str(const sr_value *v);
SR_API const void *sr_value_bytes(const sr_value *v, size_t *len);
SR_API sr_tensor *sr_value_tensor(const sr_value *v);
SR_API size_t sr_value_list_len(const sr_value *v);
SR_API sr_value *sr_value_list_at(const sr_value *v, size_t i);
SR_API void *sr_value_object(const sr_value *v);
SR_API const char *sr_value_object_type(const sr_value *v);

/* Deep equality of two values (tensors: same shape, dtype and elements). */
SR_API bool sr_value_equal(const sr_value *a, const sr_value *b);

#ifdef __cplusplus
}
#endif
#endif
