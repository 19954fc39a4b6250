/* SPDX-License-Identifier: MIT */
/* Module internals shared by lib/train/nn (module.c, sequential.c).
 *
 * An sr_module is an ordered list of named leaf parameters plus what its
 * forward needs: a Linear layer, an MLP, or a sequential model of layer
 * specs (nn.h). A sequential model's layers own a contiguous run of the
 * parameter list each ([first, first + nparams)), in layer order, so the
 * parameters of a range of layers (one pipeline stage) are one run too. */
#ifndef SR_LIB_NN_MODULE_IMPL_H
#define SR_LIB_NN_MODULE_IMPL_H

#if !defined(SR__IN_TRAIN)
#error "module_impl.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include "shmrpc/nn.h"

enum sr__module_kind { SR__MODULE_LINEAR, SR__MODULE_MLP, SR__MODULE_SEQUENTIAL };

struct sr__seq_layer {
    sr_layer_spec spec;
    size_t first;   /* its first parameter */
    size_t nparams; /* 0 (no parameters), 1 or 2 */
};

struct sr_module {
    enum sr__module_kind kind;
    int nlayers;     /* MLP: Linear layers; sequential: entries of layers */
    size_t n;        /* parameters so far */
    sr_tensor **params; /* one reference each */
    char **names;       /* malloc'd */
    struct sr__seq_layer *layers; /* sequential only, [nlayers] */
    bool training;                /* sequential: dropout on (sr_module_train) */
    sr_generator drop;            /* sequential: dropout masks */
};

/* A module of `kind` with room for cap parameters; -ENOMEM. */
int sr__module_new(enum sr__module_kind kind, int nlayers, size_t cap, sr_module **out);
/* Appends t (adopted, NULL: the error is already set) as parameter
 * "<prefix><what>". */
int sr__module_add(sr_module *m, const char *prefix, const char *what, sr_tensor *t);
/* Appends U(-bound, bound) of shape as parameter "<prefix><what>", drawn from g. */
int sr__module_add_uniform(sr_module *m, const char *prefix, const char *what, int ndim, const int64_t *shape,
                           double bound, sr_dtype dt, sr_generator *g);
/* The parameter dtype check of every constructor: -EINVAL naming fn. */
int sr__module_check_dtype(const char *fn, sr_dtype dt, const sr_generator *g);
/* A sequential model's forward over layers [from, to). */
sr_tensor *sr__sequential_forward(sr_module *m, sr_tensor *x, int from, int to);

#endif
