/* Built-in functions: callable by name on every worker without registration,
 * like torch.add through RPC. They run inline on the polling thread (they
 * never block). Arithmetic works on ints and doubles here; tensor operands
 * are added with the tensor library. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "registry.h"
#include "error.h"

static int want_args(sr_call *c, const char *op, size_t n)
{
    if (sr_call_nargs(c) != n)
        return sr_call_fail(c, -EINVAL, "%s() expects %zu arguments, got %zu", op, n, sr_call_nargs(c));
    for (size_t i = 0; i < n; i++) {
        sr_kind k = sr_value_type(sr_call_arg(c, i));
        if (k != SR_KIND_INT && k != SR_KIND_DOUBLE)
            return sr_call_fail(c, -EINVAL, "%s() argument %zu must be a number, not %s", op, i + 1, sr_kind_name(k));
    }
    return 0;
}

static bool both_int(sr_call *c)
{
    return sr_value_type(sr_call_arg(c, 0)) == SR_KIND_INT && sr_value_type(sr_call_arg(c, 1)) == SR_KIND_INT;
}

#define ARITH(name, op)                                                                          \
    static int builtin_##name(sr_call *c)                                                        \
    {                                                                                            \
        int rc = want_args(c, #name, 2);                                                         \
        if (rc)                                                                                  \
            return rc;                                                                           \
        sr_value *a = sr_call_arg(c, 0), *b = sr_call_arg(c, 1);                                 \
        if (both_int(c))                                                                         \
            return sr_call_return(c, sr_int((int64_t)((uint64_t)sr_value_int(a) op (uint64_t)sr_value_int(b)))); \
        return sr_call_return(c, sr_double(sr_value_double(a) op sr_value_double(b)));           \
    }

ARITH(add, +)
ARITH(sub, -)
ARITH(mul, *)

static int builtin_div(sr_call *c)
{
    int rc = want_args(c, "div", 2);
    if (rc)
        return rc;
    return sr_call_return(c, sr_double(sr_value_double(sr_call_arg(c, 0)) / sr_value_double(sr_call_arg(c, 1))));
}

static int builtin_neg(sr_call *c)
{
    int rc = want_args(c, "neg", 1);
    if (rc)
        return rc;
    sr_value *a = sr_call_arg(c, 0);
    if (sr_value_type(a) == SR_KIND_INT)
        return sr_call_return(c, sr_int((int64_t)(0 - (uint64_t)sr_value_int(a))));
    return sr_call_return(c, sr_double(-sr_value_double(a)));
}

/* The no-op: returns None. Useful to measure the runtime itself. */
static int builtin_noop(sr_call *c)
{
    return sr_call_return(c, NULL);
}

/* Returns its arguments as a list (identity for one argument). */
static int builtin_echo(sr_call *c)
{
    if (sr_call_nargs(c) == 1)
        return sr_call_return(c, sr_value_ref(sr_call_arg(c, 0)));
    sr_value *items[64];
    size_t n = sr_call_nargs(c);
    if (n > 64)
        return sr_call_fail(c, -EINVAL, "echo() takes at most 64 arguments, got %zu", n);
    for (size_t i = 0; i < n; i++)
        items[i] = sr_call_arg(c, i);
    return sr_call_return(c, sr_list(n, items));
}

static void register_all(void)
{
    static const struct { const char *name; sr_fn fn; } table[] = {
        {"add", builtin_add}, {"sub", builtin_sub}, {"mul", builtin_mul}, {"div", builtin_div},
        {"neg", builtin_neg}, {"noop", builtin_noop}, {"echo", builtin_echo},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (sr__registry_add(table[i].name, SR_FN_BUILTIN, table[i].fn, NULL))
            fprintf(stderr, "shmrpc: cannot register built-in '%s': %s\n", table[i].name, sr_last_error());
}

void sr__builtins_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_all);
}
