/* SPDX-License-Identifier: MIT */
/* Function registry. See registry.h. */
#include "registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

#define TABLE 1024 /* power of two; at most TABLE/2 functions */

static _Atomic(struct sr_fn_entry *) table[TABLE];
static pthread_mutex_t add_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t count;

static uint32_t hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* A name is a few bytes: compared in line, not through a libc call. */
static bool same_name(const char *a, const char *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (a[i] != b[i])
            return false;
    return true;
}

const struct sr_fn_entry *sr__registry_find(const char *name, size_t len)
{
    if (len >= SR_FN_NAME_MAX)
        return NULL;
    for (uint32_t i = hash(name, len);; i++) {
        /* acquire: pairs with the release store in sr__registry_add; the entry is complete */
        struct sr_fn_entry *e = atomic_load_explicit(&table[i & (TABLE - 1)], memory_order_acquire);
        if (!e)
            return NULL;
        if (e->name[len] == '\0' && same_name(e->name, name, len))
            return e;
    }
}

/* Letters, digits, '_', '.', ':' and '-'. */
static bool name_char_ok(unsigned char ch)
{
    return (unsigned)((ch | 0x20) - 'a') < 26 || (unsigned)(ch - '0') < 10 || ch == '_' || ch == '.' || ch == ':' ||
           ch == '-';
}

/* Checked on every call: one pass for the length and the characters, no
 * strlen or strspn (at most SR_FN_NAME_MAX bytes are read). */
int sr__fn_name_check(const char *n, const char *caller)
{
    if (!n)
        return sr__fail(-EINVAL, caller, "function name is NULL");
    size_t len = 0;
    bool chars_ok = true;
    for (; len < SR_FN_NAME_MAX && n[len]; len++)
        chars_ok &= name_char_ok((unsigned char)n[len]);
    if (len == 0 || len >= SR_FN_NAME_MAX)
        return sr__fail(-EINVAL, caller, "function name '%.80s' must have 1 to %d characters", n, SR_FN_NAME_MAX - 1);
    if (!chars_ok)
        return sr__fail(-EINVAL, caller, "function name '%s' may only hold letters, digits, '_', '.', ':' and '-'", n);
    return 0;
}

int sr__registry_add(const char *name, enum sr_fn_kind kind, sr_fn fn, sr_async_fn afn)
{
    if (kind == SR_FN_PLAIN || kind == SR_FN_ASYNC)
        sr__builtins_init();
    const char *who = kind == SR_FN_ASYNC ? "sr_register_async" : "sr_register";
    int rc = sr__fn_name_check(name, who);
    if (rc)
        return rc;
    if (!fn && !afn)
        return sr__fail(-EINVAL, who, "function pointer for '%s' is NULL", name);
    struct sr_fn_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return sr__fail(-ENOMEM, who, "out of memory");
    *e = (struct sr_fn_entry){.kind = kind, .fn = fn, .afn = afn};
    strcpy(e->name, name);
    pthread_mutex_lock(&add_lock);
    size_t len = strlen(name);
    if (sr__registry_find(name, len) || count >= TABLE / 2) {
        pthread_mutex_unlock(&add_lock);
        free(e);
        return count >= TABLE / 2 ? sr__fail(-ENOSPC, who, "registry is full (%d functions)", TABLE / 2)
                                  : sr__fail(-EEXIST, who, "function '%s' is already registered", name);
    }
    uint32_t i = hash(name, len);
    /* relaxed: under add_lock, only adders write slots */
    while (atomic_load_explicit(&table[i & (TABLE - 1)], memory_order_relaxed))
        i++;
    /* release: pairs with the acquire in sr__registry_find */
    atomic_store_explicit(&table[i & (TABLE - 1)], e, memory_order_release);
    count++;
    pthread_mutex_unlock(&add_lock);
    return 0;
}

SR_API int sr_register(const char *name, sr_fn fn)
{
    return sr__registry_add(name, SR_FN_PLAIN, fn, NULL);
}

SR_API int sr_register_async(const char *name, sr_async_fn fn)
{
    return sr__registry_add(name, SR_FN_ASYNC, NULL, fn);
}

static void register_builtins(void)
{
    size_t n;
    const struct sr_builtin *t = sr__builtin_table(&n);
    for (size_t i = 0; i < n; i++)
        if (sr__registry_add(t[i].name, t[i].cheap ? SR_FN_BUILTIN_CHEAP : SR_FN_BUILTIN, t[i].fn, NULL))
            sr_logf(SR_LOG_ERROR, "cannot register built-in '%s': %s", t[i].name, sr_last_error());
}

void sr__builtins_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_builtins);
}
