/* SPDX-License-Identifier: MIT */
/* What the RPC layer's values (lib/rpc/value.c) ask of a tensor: equality
 * and a short description. See desc.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "desc.h"
#include "tensor_impl.h"

_Static_assert(SR_TENSOR_REPR >= 16 + SR_SHAPE_STR, "room for a dtype name and a shape");

struct elem_cmp {
    sr_dtype dt;
    bool equal;
};

/* Floats compare like double values (0.0 == -0.0, NaN == NaN). */
static void compare_row(char **p, const int64_t *stride, int64_t n, void *arg)
{
    struct elem_cmp *c = arg;
    for (int64_t i = 0; i < n && c->equal; i++) {
        const char *x = p[0] + i * stride[0], *y = p[1] + i * stride[1];
        if (c->dt == SR_I64) {
            int64_t a, b;
            memcpy(&a, x, 8);
            memcpy(&b, y, 8);
            c->equal = a == b;
        } else {
            double a, b;
            sr__load_f64(&a, x, 0, 1, c->dt);
            sr__load_f64(&b, y, 0, 1, c->dt);
            c->equal = a == b || (isnan(a) && isnan(b));
        }
    }
}

/* Same dtype, shape and elements; strides, offsets and storage may differ. */
bool sr__tensor_equal(const sr_tensor *a, const sr_tensor *b)
{
    if (a == b)
        return true;
    if (a->dtype != b->dtype || !sr__same_shape(a, b))
        return false;
    struct elem_cmp c = {.dt = a->dtype, .equal = true};
    struct sr_loop L;
    const sr_tensor *ops[2] = {a, b};
    sr__loop_init(&L, a->ndim, a->shape, 2, 0, ops); /* both read, so both pinned */
    sr__loop_run(&L, compare_row, &c);
    sr__loop_done(&L);
    return c.equal;
}

const char *sr__tensor_repr(const sr_tensor *t, char *buf)
{
    char shape[SR_SHAPE_STR];
    snprintf(buf, SR_TENSOR_REPR, "%s%s", sr_dtype_name(t->dtype), sr__shape_str(t->ndim, t->shape, shape));
    return buf;
}
