/* SPDX-License-Identifier: MIT */
/* User-defined autograd functions (shmrpc/autograd_function.h): a node type
 * whose apply calls the definition's backward, named after the definition.
 *
 * The context is made before forward (forward saves into it); when the
 * apply records history, the node is made after forward, once the number of
 * saved tensors is known: the snapshots move into the node's saved slots, so
 * the engine frees them after a backward without retain_graph and refuses a
 * second pass as for any built-in op (sr__node_saved, sr__node_use). The
 * node owns the context, which keeps what backward checks against (the
 * inputs' and outputs' dtypes and shapes; the inputs themselves are not
 * kept, as no built-in node keeps them). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "error.h"
#include "shmrpc/autograd_function.h"
#include "tensor_impl.h"

struct meta {
    bool tensor; /* false: a NULL (non-tensor) input */
    sr_dtype dt;
    int ndim;
    int64_t shape[SR_MAX_DIMS];
};

struct sr_function_ctx {
    const sr_autograd_function *def;
    sr_node *node; /* the recorded node (weak: it owns the context); NULL in forward */
    bool in_forward;
    bool materialize;
    size_t n, nout;
    bool *needs;           /* [n] */
    bool *non_diff;        /* [nout] */
    struct meta *in_meta;  /* [n] */
    struct meta *out_meta; /* [nout] */
    sr_tensor **saved;     /* snapshots, until they move into the node */
    size_t n_saved;
    void *state; /* sr_function_ctx_state */
    size_t state_size;
};

struct fn_node {
    sr_node base;
    sr_node_ops ops; /* fn_ops, named after the definition */
    sr_function_ctx *ctx; /* owned */
    const char *name; /* ops.name */
};

/* Node names are static strings to their readers (sr_tensor_grad_fn_name,
 * sr_dist_fn_info.next_names, which outlive the node), so each distinct
 * "<name>Backward" is made once and kept for the life of the process. */
struct interned {
    struct interned *next;
    char name[SR_FUNCTION_NAME_MAX + sizeof "Backward"];
};
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static struct interned *names;

static const char *node_name(const char *def_name)
{
    char want[SR_FUNCTION_NAME_MAX + sizeof "Backward"];
    snprintf(want, sizeof(want), "%sBackward", def_name);
    pthread_mutex_lock(&names_lock);
    struct interned *i = names;
    while (i && strcmp(i->name, want))
        i = i->next;
    if (!i && (i = malloc(sizeof(*i)))) {
        memcpy(i->name, want, sizeof(want));
        i->next = names;
        names = i;
    }
    pthread_mutex_unlock(&names_lock);
    return i ? i->name : NULL;
}

static void drop_saved(sr_function_ctx *ctx)
{
    for (size_t i = 0; i < ctx->n_saved; i++)
        sr_tensor_unref(ctx->saved[i]);
    free(ctx->saved);
    ctx->saved = NULL;
    ctx->n_saved = 0;
}

static void ctx_free(sr_function_ctx *ctx)
{
    if (!ctx)
        return;
    drop_saved(ctx);
    free(ctx->needs);
    free(ctx->non_diff);
    free(ctx->in_meta);
    free(ctx->out_meta);
    free(ctx->state);
    free(ctx);
}

static void meta_of(struct meta *m, const sr_tensor *t)
{
    m->tensor = t != NULL;
    if (!t)
        return;
    m->dt = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof(m->shape));
}

static sr_function_ctx *ctx_new(const sr_autograd_function *def, sr_tensor *const *in, size_t n, size_t nout)
{
    sr_function_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return NULL;
    *ctx = (sr_function_ctx){.def = def, .materialize = true, .n = n, .nout = nout};
    ctx->needs = calloc(n ? n : 1, sizeof(bool));
    ctx->non_diff = calloc(nout, sizeof(bool));
    ctx->in_meta = calloc(n ? n : 1, sizeof(struct meta));
    ctx->out_meta = calloc(nout, sizeof(struct meta));
    if (!ctx->needs || !ctx->non_diff || !ctx->in_meta || !ctx->out_meta) {
        ctx_free(ctx);
        return NULL;
    }
    bool grad_mode = sr__grad_mode();
    for (size_t i = 0; i < n; i++) {
        meta_of(&ctx->in_meta[i], in[i]);
        ctx->needs[i] = grad_mode && in[i] && in[i]->requires_grad;
    }
    return ctx;
}

/* Around a callback: the thread's last error is cleared, so that a failing
 * callback's own detail (or none) is what callback_failed reports, and put
 * back when the callback succeeds (a successful call leaves the last error
 * as it was, docs/API.md "Errors"). */
struct prior_error {
    int code;
    char text[512];
};

static void error_clear(struct prior_error *p)
{
    p->code = sr_last_error_code();
    snprintf(p->text, sizeof(p->text), "%s", sr_last_error());
    sr__error_set(0, "");
}

static void error_restore(const struct prior_error *p) { sr__error_set(p->code, p->text); }

/* A callback returned rc: keep its detail, name the function. */
static int callback_failed(int rc, const char *api, const char *name, const char *what)
{
    char why[256]; /* sr__fail rewrites the buffer sr_last_error() points to */
    snprintf(why, sizeof(why), "%s", sr_last_error()[0] ? sr_last_error() : "no detail given");
    return sr__fail(rc < 0 ? rc : -EINVAL, api, "%s: %s failed (%d): %s", name, what, rc, why);
}

/* ---- backward ---- */

/* The gradients backward sees: the engine's, or zeros where none came
 * (materialize), else NULL. *made[i] marks the zeros this made. */
static int grad_outputs(const sr_function_ctx *ctx, sr_tensor *const *in, sr_tensor **gout, bool *made)
{
    for (size_t i = 0; i < ctx->nout; i++) {
        gout[i] = in[i];
        if (in[i] || !ctx->materialize)
            continue;
        const struct meta *m = &ctx->out_meta[i];
        gout[i] = sr_zeros(m->dt, m->ndim, m->shape, 0);
        if (!gout[i])
            return -ENOMEM;
        made[i] = true;
    }
    return 0;
}

/* Check backward's gradient for input i; drop one that is not needed. */
static int check_grad(const struct fn_node *fn, size_t i, sr_tensor **g)
{
    const sr_function_ctx *ctx = fn->ctx;
    const struct meta *m = &ctx->in_meta[i];
    sr_tensor *t = *g;
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (!t)
        return 0;
    if (!m->tensor)
        return sr__fail(-EINVAL, "sr_backward",
                        "Function %s returned a gradient different than None at index %zu, but the "
                        "corresponding forward input was not a tensor",
                        fn->name, i);
    if (t->requires_grad)
        return sr__fail(-EPERM, "sr_backward",
                        "Function %s returned a gradient with history at index %zu: trying to differentiate "
                        "twice a function that was marked with @once_differentiable (custom functions are once "
                        "differentiable: there is no create_graph)",
                        fn->name, i);
    if (!ctx->needs[i]) { /* as PyTorch: a gradient nobody asked for is dropped */
        sr_tensor_unref(t);
        *g = NULL;
        return 0;
    }
    if (t->dtype != m->dt)
        return sr__fail(-EINVAL, "sr_backward",
                        "Function %s returned an invalid gradient at index %zu - expected dtype %s but got %s",
                        fn->name, i, sr_dtype_name(m->dt), sr_dtype_name(t->dtype));
    if (t->ndim != m->ndim || memcmp(t->shape, m->shape, (size_t)m->ndim * sizeof(int64_t)))
        return sr__fail(-EINVAL, "sr_backward",
                        "Function %s returned an invalid gradient at index %zu - got %s but expected shape "
                        "compatible with %s",
                        fn->name, i, sr__shape_str(t->ndim, t->shape, b1), sr__shape_str(m->ndim, m->shape, b2));
    return 0;
}

static int run_backward(struct fn_node *fn, sr_tensor *const *gout, sr_tensor **gin)
{
    sr_function_ctx *ctx = fn->ctx;
    bool grad_mode = sr__grad_mode(); /* off: the engine's; restored whatever backward does */
    struct prior_error prior;
    error_clear(&prior);
    int rc = ctx->def->backward(ctx, gout, ctx->nout, gin, ctx->n);
    sr_set_grad_enabled(grad_mode);
    if (rc)
        return callback_failed(rc, "sr_backward", fn->name, "backward");
    error_restore(&prior);
    for (size_t i = 0; i < ctx->n && !rc; i++)
        rc = check_grad(fn, i, &gin[i]);
    return rc;
}

static int fn_apply(sr_node *n, sr_tensor *const *grads_in, sr_tensor **grads_out)
{
    struct fn_node *fn = (struct fn_node *)n;
    sr_function_ctx *ctx = fn->ctx;
    sr_tensor **gout = calloc(ctx->nout, sizeof(*gout)), **gin = calloc(ctx->n ? ctx->n : 1, sizeof(*gin));
    bool *made = calloc(ctx->nout, sizeof(*made));
    int rc = gout && gin && made ? grad_outputs(ctx, grads_in, gout, made) : -ENOMEM;
    if (rc)
        sr__fail(rc, "sr_backward", "%s: out of memory", fn->name);
    else
        rc = run_backward(fn, gout, gin);
    for (size_t i = 0; gin && i < ctx->n; i++) {
        if (rc)
            sr_tensor_unref(gin[i]);
        else
            grads_out[i] = gin[i];
    }
    for (size_t i = 0; gout && made && i < ctx->nout; i++)
        if (made[i])
            sr_tensor_unref(gout[i]);
    free(gout);
    free(gin);
    free(made);
    return rc;
}

static void fn_destroy(sr_node *n) { ctx_free(((struct fn_node *)n)->ctx); }

static const sr_node_ops fn_ops = {.name = "FunctionBackward", .apply = fn_apply, .destroy = fn_destroy};

/* ---- forward and recording ---- */

static int check_args(const sr_autograd_function *def, sr_tensor *const *inputs, size_t n, sr_tensor **outputs,
                      size_t nout)
{
    const char *fn = "sr_function_apply";
    if (!def || !def->name || !def->forward || !def->backward)
        return sr__fail(-EINVAL, fn, "the definition %s", !def ? "is NULL" : "needs a name, a forward and a backward");
    size_t len = strlen(def->name);
    if (len == 0 || len > SR_FUNCTION_NAME_MAX)
        return sr__fail(-EINVAL, fn, "the name '%.80s' has %zu characters (1 to %d)", def->name, len,
                        SR_FUNCTION_NAME_MAX);
    if ((n && !inputs) || !outputs || nout == 0)
        return sr__fail(-EINVAL, fn, "%s: %s", def->name,
                        nout == 0 ? "a function has at least one output" : "inputs or outputs is NULL");
    return 0;
}

static int run_forward(sr_function_ctx *ctx, sr_tensor *const *in, sr_tensor **out)
{
    const char *name = ctx->def->name;
    bool prev = sr_no_grad_enter();
    ctx->in_forward = true;
    struct prior_error prior;
    error_clear(&prior);
    int rc = ctx->def->forward(ctx, in, ctx->n, out, ctx->nout);
    ctx->in_forward = false;
    sr_set_grad_enabled(prev);
    if (rc)
        return callback_failed(rc, "sr_function_apply", name, "forward");
    error_restore(&prior);
    for (size_t i = 0; i < ctx->nout; i++)
        if (!out[i])
            return sr__fail(-EINVAL, "sr_function_apply", "%s: forward returned no tensor for output %zu of %zu",
                            name, i, ctx->nout);
    return 0;
}

/* An output that is not a fresh tensor (an input, an output returned twice,
 * a tensor with history or requiring grad) becomes a new view of itself, so
 * that recording never changes a tensor the caller already has. */
static bool needs_view(const sr_tensor *o, sr_tensor *const *in, size_t n, sr_tensor *const *out, size_t i)
{
    if (o->requires_grad || o->grad_fn)
        return true;
    for (size_t j = 0; j < n; j++)
        if (in[j] == o)
            return true;
    for (size_t j = 0; j < i; j++)
        if (out[j] == o)
            return true;
    return false;
}

static int attach_output(struct fn_node *fn, sr_tensor *const *in, sr_tensor **out, size_t i)
{
    sr_function_ctx *ctx = fn->ctx;
    sr_tensor *o = out[i];
    meta_of(&ctx->out_meta[i], o);
    if (needs_view(o, in, ctx->n, out, i)) {
        sr_tensor *v = sr__tensor_alias(o, o->ndim, o->shape, o->strides, o->offset);
        if (!v)
            return sr__fail(-ENOMEM, "sr_function_apply", "%s: out of memory", ctx->def->name);
        sr_tensor_unref(o);
        out[i] = o = v;
    }
    if (ctx->non_diff[i] || (o->dtype != SR_F32 && o->dtype != SR_F64)) {
        ctx->non_diff[i] = true; /* integer outputs are never differentiable, as in PyTorch */
        return 0;
    }
    sr__tensor_set_history(o, &fn->base, (uint32_t)i);
    return 0;
}

/* Make the node (it adopts ctx, also on failure) and attach the outputs. */
static int record(sr_function_ctx *ctx, sr_tensor *const *in, sr_tensor **out)
{
    const char *name = node_name(ctx->def->name);
    struct fn_node *fn = !name ? NULL
                               : (struct fn_node *)sr__node_for_inputs(&fn_ops, sizeof(*fn), in, ctx->n,
                                                                       (uint32_t)ctx->nout, (uint32_t)ctx->n_saved);
    if (!fn) {
        const char *def_name = ctx->def->name; /* the user's definition: outlives ctx */
        ctx_free(ctx);
        return name ? -ENOMEM : sr__fail(-ENOMEM, "sr_function_apply", "%s: out of memory", def_name);
    }
    fn->name = name;
    fn->ops = fn_ops;
    fn->ops.name = fn->name;
    fn->base.ops = &fn->ops;
    fn->ctx = ctx;
    ctx->node = &fn->base;
    for (size_t i = 0; i < ctx->n_saved; i++) /* the snapshots move into the node's slots */
        fn->base.saved[i].t = ctx->saved[i];
    free(ctx->saved);
    ctx->saved = NULL;
    ctx->n_saved = 0;
    for (size_t i = 0; i < ctx->n; i++)
        ctx->needs[i] = sr__node_needs_grad(&fn->base, (uint32_t)i);
    int rc = 0;
    for (size_t i = 0; i < ctx->nout && !rc; i++)
        rc = attach_output(fn, in, out, i);
    sr__node_unref(&fn->base);
    return rc;
}

static bool records(const sr_function_ctx *ctx)
{
    for (size_t i = 0; i < ctx->n; i++)
        if (ctx->needs[i])
            return true;
    return false;
}

SR_API int sr_function_apply(const sr_autograd_function *def, sr_tensor *const *inputs, size_t n,
                             sr_tensor **outputs, size_t nout)
{
    int rc = check_args(def, inputs, n, outputs, nout);
    if (rc)
        return rc;
    memset(outputs, 0, nout * sizeof(*outputs));
    sr_function_ctx *ctx = ctx_new(def, inputs, n, nout);
    if (!ctx)
        return sr__fail(-ENOMEM, "sr_function_apply", "%s: out of memory", def->name);
    rc = run_forward(ctx, inputs, outputs);
    if (!rc && records(ctx))
        rc = record(ctx, inputs, outputs); /* the node owns ctx now */
    else
        ctx_free(ctx);
    for (size_t i = 0; rc && i < nout; i++) {
        sr_tensor_unref(outputs[i]);
        outputs[i] = NULL;
    }
    return rc;
}

/* ---- the context ---- */

static int ctx_in_forward(const sr_function_ctx *ctx, const char *fn)
{
    if (!ctx)
        return sr__fail(-EINVAL, fn, "ctx is NULL");
    return ctx->in_forward ? 0 : sr__fail(-EPERM, fn, "%s: only forward may call this", ctx->def->name);
}

SR_API int sr_function_ctx_save_for_backward(sr_function_ctx *ctx, sr_tensor *const *ts, size_t n)
{
    int rc = ctx_in_forward(ctx, "sr_function_ctx_save_for_backward");
    if (rc)
        return rc;
    if (!ts && n)
        return sr__fail(-EINVAL, "sr_function_ctx_save_for_backward", "%s: ts is NULL", ctx->def->name);
    sr_tensor **saved = calloc(n ? n : 1, sizeof(*saved));
    for (size_t i = 0; saved && i < n; i++) {
        if (!ts[i])
            continue;
        saved[i] = sr__tensor_snapshot(ts[i]);
        if (!saved[i]) {
            for (size_t j = 0; j < i; j++)
                sr_tensor_unref(saved[j]);
            free(saved);
            saved = NULL;
        }
    }
    if (!saved)
        return sr__fail(-ENOMEM, "sr_function_ctx_save_for_backward", "%s: out of memory", ctx->def->name);
    drop_saved(ctx);
    ctx->saved = saved;
    ctx->n_saved = n;
    return 0;
}

SR_API int sr_function_ctx_mark_non_differentiable(sr_function_ctx *ctx, size_t output)
{
    int rc = ctx_in_forward(ctx, "sr_function_ctx_mark_non_differentiable");
    if (rc)
        return rc;
    if (output >= ctx->nout)
        return sr__fail(-EINVAL, "sr_function_ctx_mark_non_differentiable", "%s: output %zu of %zu",
                        ctx->def->name, output, ctx->nout);
    ctx->non_diff[output] = true;
    return 0;
}

SR_API void sr_function_ctx_set_materialize_grads(sr_function_ctx *ctx, bool materialize)
{
    if (ctx)
        ctx->materialize = materialize;
}

SR_API void *sr_function_ctx_state(sr_function_ctx *ctx, size_t size)
{
    if (!ctx) {
        sr__fail(-EINVAL, "sr_function_ctx_state", "ctx is NULL");
        return NULL;
    }
    if (!ctx->in_forward)
        return ctx->state;
    if (!ctx->state && size) {
        ctx->state = calloc(1, size);
        ctx->state_size = ctx->state ? size : 0;
        if (!ctx->state)
            sr__fail(-ENOMEM, "sr_function_ctx_state", "%s: out of memory for %zu bytes", ctx->def->name, size);
        return ctx->state;
    }
    if (size > ctx->state_size) {
        sr__fail(-EINVAL, "sr_function_ctx_state", "%s: the state has %zu bytes, asked for %zu", ctx->def->name,
                 ctx->state_size, size);
        return NULL;
    }
    return ctx->state;
}

SR_API bool sr_function_ctx_needs_input_grad(const sr_function_ctx *ctx, size_t i)
{
    return ctx && i < ctx->n && ctx->needs[i];
}

SR_API size_t sr_function_ctx_num_saved(const sr_function_ctx *ctx)
{
    if (!ctx)
        return 0;
    return ctx->node ? ctx->node->num_saved : ctx->n_saved;
}

/* Saved tensor i, borrowed, into *out; fn names the caller in errors. */
static int saved_borrowed(sr_function_ctx *ctx, size_t i, sr_tensor **out, const char *fn)
{
    if (!ctx || !out)
        return sr__fail(-EINVAL, fn, "ctx or out is NULL");
    size_t n = sr_function_ctx_num_saved(ctx);
    if (i >= n)
        return sr__fail(-EINVAL, fn, "%s: saved tensor %zu of %zu", ctx->def->name, i, n);
    if (!ctx->node) {
        *out = ctx->saved[i];
        return 0;
    }
    return sr__node_saved(ctx->node, (uint32_t)i, out);
}

SR_API int sr_function_ctx_saved(sr_function_ctx *ctx, size_t i, sr_tensor **out)
{
    int rc = saved_borrowed(ctx, i, out, "sr_function_ctx_saved");
    if (!rc)
        sr_tensor_ref(*out);
    return rc;
}

SR_API int sr_function_ctx_saved_tensor(sr_function_ctx *ctx, size_t i, sr_tensor **out)
{
    return saved_borrowed(ctx, i, out, "sr_function_ctx_saved_tensor");
}

SR_API void *sr_function_ctx_user(const sr_function_ctx *ctx) { return ctx ? ctx->def->user : NULL; }
