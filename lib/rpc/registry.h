/* SPDX-License-Identifier: MIT */
/* Function registry (internal): name -> function, per process.
 * Append-only: lookups are lock-free (acquire loads of published entries);
 * registrations serialise on a mutex. Entries live until the process ends. */
#ifndef SR_RPC_REGISTRY_H
#define SR_RPC_REGISTRY_H

#if !defined(SR__IN_RPC)
#error "registry.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include "shmrpc/rpc.h"

#define SR_FN_NAME_MAX 64

/* BUILTIN computes over its tensors' elements; BUILTIN_CHEAP costs the same
 * at any size (no-op, echo, views), so it always runs inline. */
enum sr_fn_kind { SR_FN_PLAIN, SR_FN_ASYNC, SR_FN_BUILTIN, SR_FN_BUILTIN_CHEAP };

struct sr_fn_entry {
    char name[SR_FN_NAME_MAX];
    enum sr_fn_kind kind;
    sr_fn fn;
    sr_async_fn afn;
};

/* NULL if unknown. name need not be NUL-terminated. */
const struct sr_fn_entry *sr__registry_find(const char *name, size_t len);
int sr__registry_add(const char *name, enum sr_fn_kind kind, sr_fn fn, sr_async_fn afn);
/* Register the built-ins (idempotent); done before any lookup or user registration. */
void sr__builtins_init(void);
/* The built-in functions (builtins.c), which sr__builtins_init registers.
 * cheap: the same cost at any size (no-op, echo, views): SR_FN_BUILTIN_CHEAP. */
struct sr_builtin {
    const char *name;
    sr_fn fn;
    bool cheap;
};
const struct sr_builtin *sr__builtin_table(size_t *n);

/* Validate a function name; 0 or -EINVAL with a message. */
int sr__fn_name_check(const char *fn_name, const char *caller);

#endif
