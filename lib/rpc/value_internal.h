/* SPDX-License-Identifier: MIT */
/* Values, internal side: the layout shared with the codec, and helpers that
 * build lists in place.
 *
 * A value is one allocation: this header, then (for strings, bytes, lists and
 * objects) its inline tail. Values are private to a process (they are never
 * placed in the segment); a value may be shared between threads, which is why
 * the refcount is atomic. Every field other than refs is written once, by the
 * constructor, before the value is published to any other thread; the list
 * helpers below are only for a list that no other thread can see yet.
 */
#ifndef SR_RPC_VALUE_INTERNAL_H
#define SR_RPC_VALUE_INTERNAL_H

#if !defined(SR__IN_RPC)
#error "value_internal.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shmrpc/value.h"

/* Deepest list nesting a value may have (a scalar has depth 0, a list one more
 * than its deepest item). It bounds the recursion of destroy, equal and repr;
 * the codec's own limit (SR_CODEC_MAX_DEPTH) is lower. */
#define SR_VALUE_MAX_DEPTH 64

struct sr_value {
    _Atomic uint32_t refs;
    uint8_t kind;   /* sr_kind */
    uint8_t depth;  /* list nesting, see SR_VALUE_MAX_DEPTH */
    union {
        bool b;
        int64_t i;
        double d;
        size_t len;          /* str (without its NUL) and bytes: data in tail */
        size_t n;            /* list: n item pointers in tail */
        sr_tensor *tensor;
        void *mod;           /* a module kind's object (module.h): a reference, dropped with the value */
        struct {
            void *p;
            void (*destroy)(void *);
            const char *type; /* points into tail */
        } obj;
    } u;
    _Alignas(sr_value *) unsigned char tail[];
};

static inline sr_value **sr__list_items(const sr_value *v)
{
    return (sr_value **)(uintptr_t)v->tail;
}

/* Value kinds: the built-in ones and at most SR_MODULE_MAX (4) of modules. */
#define SR__VALUE_KINDS (SR_KIND_MODULE + 4)
/* Values of this process alive now, by kind. */
void sr__value_live_counts(int64_t out[SR__VALUE_KINDS]);

/* A list of n NULL items with refcount 1, for a decoder that fills it in
 * place; NULL (-ENOMEM, -EINVAL) on failure. Destroying a list skips NULL
 * items, so a partly filled list may be unreffed. */
sr_value *sr__list_alloc(size_t n);
/* Store item i, adopting the caller's reference (no new one is taken). The
 * caller guarantees that the depth stays within SR_VALUE_MAX_DEPTH. */
void sr__list_set(sr_value *list, size_t i, sr_value *item);

/* A string of n bytes (s need not be NUL-terminated and must hold no NUL). */
sr_value *sr__str_n(const char *s, size_t n);

/* A short description for error messages: "int 5", "str 'abc'", "list of 3",
 * "object of type 'Net'". Always NUL-terminates (len > 0); returns buf. */
const char *sr__value_repr(const sr_value *v, char *buf, size_t len);

#endif
