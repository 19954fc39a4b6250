/* SPDX-License-Identifier: MIT */
/* Elementwise kernels shared by the ops (internal). Callers check shapes and
 * dtypes, and make the output writable, before calling these. */
#ifndef SR_LIB_TENSOR_KERNELS_H
#define SR_LIB_TENSOR_KERNELS_H

#if !defined(SR__IN_TENSOR)
#error "kernels.h is private to the tensor layer (docs/ARCHITECTURE.md)"
#endif
#include "shmrpc/tensor.h"
#include "tensor_seam.h" /* sr__map, sr__map_into */

enum sr_binop { SR_BIN_ADD, SR_BIN_MUL, SR_BIN_DIV };
/* out = a + alpha*b, a*b or a/b; one dtype for all three; a and b
 * broadcast to out (out may be a, for in-place ops). */
void sr__binary_into(sr_tensor *out, const sr_tensor *a, const sr_tensor *b, enum sr_binop op, double alpha);

/* -EINVAL unless s fits t's dtype (an integer, for i64). */
int sr__check_scalar(const char *fn, const sr_tensor *t, double s);

#endif
