/* SPDX-License-Identifier: MIT */
/* Op spans: the hooks a layer above registers (tensor_seam.h, "op spans"). */
#include "tensor_impl.h"

_Atomic(const sr_op_hooks *) sr__op_hooks;

void sr__tensor_op_hooks_set(const sr_op_hooks *h)
{
    atomic_store_explicit(&sr__op_hooks, h, memory_order_release); /* pairs with sr__op_scope_begin's acquire */
}
