/* SPDX-License-Identifier: MIT */
/* Outputs and gradients against PyTorch's, for expressions covering every op.
 * tests/golden/golden.txt comes from tests/golden/make_golden.py (see there
 * for the format and the loss each case backpropagates). This file builds the
 * same expressions in C, by case name.
 *
 * Tolerances: f64 |got - want| <= 1e-12 + 1e-9 |want| (different summation
 * orders and libm implementations; BLAS vs PyTorch's kernels); f32
 * 1e-6 + 1e-4 |want|. */
#include <errno.h>
#include <stdlib.h>

#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(golden);

#ifndef GOLDEN_FILE
#error "GOLDEN_FILE must name tests/golden/golden.txt"
#endif

#define MAX_IN 8
#define MAX_OUT 4

typedef int (*build_fn)(sr_tensor **in, sr_tensor **out);

/* Keeps intermediates of one expression and drops them at the end. */
struct scratch {
    sr_tensor *t[32];
    int n;
};

static sr_tensor *keep(struct scratch *s, sr_tensor *t)
{
    cr_assert(t, "expression failed: %s", sr_last_error());
    cr_assert(s->n < 32);
    s->t[s->n++] = t;
    return t;
}

static void drop(struct scratch *s)
{
    while (s->n)
        sr_tensor_unref(s->t[--s->n]);
}

#define ONE(expr)                                                                                               \
    do {                                                                                                        \
        out[0] = (expr);                                                                                        \
        return 1;                                                                                               \
    } while (0)

static int add_bcast(sr_tensor **in, sr_tensor **out) { ONE(sr_add(in[0], in[1])); }
static int sub_bcast(sr_tensor **in, sr_tensor **out) { ONE(sr_sub(in[0], in[1])); }
static int mul_bcast(sr_tensor **in, sr_tensor **out) { ONE(sr_mul(in[0], in[1])); }
static int mul_self(sr_tensor **in, sr_tensor **out) { ONE(sr_mul(in[0], in[0])); }
static int div_bcast(sr_tensor **in, sr_tensor **out) { ONE(sr_div(in[0], in[1])); }
static int pow_tensor(sr_tensor **in, sr_tensor **out) { ONE(sr_pow(in[0], in[1])); }
static int neg(sr_tensor **in, sr_tensor **out) { ONE(sr_neg(in[0])); }
static int pow_scalar(sr_tensor **in, sr_tensor **out) { ONE(sr_pow_scalar(in[0], 2.5)); }
static int pow_scalar_int(sr_tensor **in, sr_tensor **out) { ONE(sr_pow_scalar(in[0], 3)); }
static int u_exp(sr_tensor **in, sr_tensor **out) { ONE(sr_exp(in[0])); }
static int u_sin(sr_tensor **in, sr_tensor **out) { ONE(sr_sin(in[0])); }
static int u_cos(sr_tensor **in, sr_tensor **out) { ONE(sr_cos(in[0])); }
static int u_tanh(sr_tensor **in, sr_tensor **out) { ONE(sr_tanh(in[0])); }
static int u_relu(sr_tensor **in, sr_tensor **out) { ONE(sr_relu(in[0])); }
static int u_sigmoid(sr_tensor **in, sr_tensor **out) { ONE(sr_sigmoid(in[0])); }
static int u_log(sr_tensor **in, sr_tensor **out) { ONE(sr_log(in[0])); }
static int u_sqrt(sr_tensor **in, sr_tensor **out) { ONE(sr_sqrt(in[0])); }
static int matmul(sr_tensor **in, sr_tensor **out) { ONE(sr_matmul(in[0], in[1])); }
static int mm(sr_tensor **in, sr_tensor **out) { ONE(sr_mm(in[0], in[1])); }
static int bmm(sr_tensor **in, sr_tensor **out) { ONE(sr_bmm(in[0], in[1])); }
static int sum_all(sr_tensor **in, sr_tensor **out) { ONE(sr_sum(in[0])); }
static int sum_dim(sr_tensor **in, sr_tensor **out) { ONE(sr_sum_dim(in[0], 1, false)); }
static int sum_dim_keep(sr_tensor **in, sr_tensor **out) { ONE(sr_sum_dim(in[0], 0, true)); }
static int mean_all(sr_tensor **in, sr_tensor **out) { ONE(sr_mean(in[0])); }
static int mean_dim(sr_tensor **in, sr_tensor **out) { ONE(sr_mean_dim(in[0], -1, false)); }
static int mean_dim_keep(sr_tensor **in, sr_tensor **out) { ONE(sr_mean_dim(in[0], 1, true)); }
static int transpose(sr_tensor **in, sr_tensor **out) { ONE(sr_transpose(in[0], 0, 2)); }
static int t(sr_tensor **in, sr_tensor **out) { ONE(sr_t(in[0])); }
static int permute(sr_tensor **in, sr_tensor **out) { ONE(sr_permute(in[0], (const int[]){2, 0, 1})); }
static int narrow(sr_tensor **in, sr_tensor **out) { ONE(sr_narrow(in[0], 1, 1, 3)); }
static int expand(sr_tensor **in, sr_tensor **out) { ONE(sr_expand(in[0], 3, SHAPE(2, 3, 4))); }
static int cat(sr_tensor **in, sr_tensor **out) { ONE(sr_cat(in, 2, 1)); }
static int mse_loss(sr_tensor **in, sr_tensor **out) { ONE(sr_mse_loss(in[0], in[1])); }
static int log_softmax_1(sr_tensor **in, sr_tensor **out) { ONE(sr_log_softmax(in[0], 1)); }
static int log_softmax_0(sr_tensor **in, sr_tensor **out) { ONE(sr_log_softmax(in[0], 0)); }
static int softmax(sr_tensor **in, sr_tensor **out) { ONE(sr_softmax(in[0], -1)); }
static int cross_entropy(sr_tensor **in, sr_tensor **out) { ONE(sr_cross_entropy(in[0], in[1])); }

static int scalar_ops(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *a = keep(&s, sr_add_scalar(in[0], 2.0)), *b = keep(&s, sr_sub_scalar(a, 0.5));
    sr_tensor *c = keep(&s, sr_mul_scalar(b, 3.0));
    out[0] = sr_div_scalar(c, 4.0);
    drop(&s);
    return 1;
}

static int mm_transposed(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    out[0] = sr_mm(keep(&s, sr_t(in[0])), keep(&s, sr_t(in[1])));
    drop(&s);
    return 1;
}

static int view(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *v = keep(&s, sr_view(in[0], 2, SHAPE(3, 4)));
    out[0] = sr_mul(v, v);
    drop(&s);
    return 1;
}

static int reshape_copy(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    out[0] = sr_reshape(keep(&s, sr_t(in[0])), 1, SHAPE(12));
    drop(&s);
    return 1;
}

static int squeeze_unsqueeze(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *u = keep(&s, sr_unsqueeze(keep(&s, sr_squeeze(in[0], 1)), 0));
    out[0] = sr_mul_scalar(u, 2.0);
    drop(&s);
    return 1;
}

static int stack(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *b2 = keep(&s, sr_mul_scalar(in[1], 2.0));
    out[0] = sr_stack((sr_tensor *[]){in[0], b2, in[2]}, 3, 1);
    drop(&s);
    return 1;
}

static int chunk(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *p[3], *q[3];
    cr_assert_eq(sr_chunk(in[0], 3, 0, p), 3);
    for (int i = 0; i < 3; i++) {
        keep(&s, p[i]);
        q[i] = keep(&s, sr_mul_scalar(p[i], i + 1));
    }
    out[0] = sr_cat(q, 3, 0);
    drop(&s);
    return 1;
}

static int split(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *p[3], *q[3];
    cr_assert_eq(sr_split(in[0], 3, 0, p), 3);
    for (int i = 0; i < 3; i++)
        keep(&s, p[i]);
    q[0] = keep(&s, sr_exp(p[0]));
    q[1] = keep(&s, sr_mul_scalar(p[1], 2.0));
    q[2] = keep(&s, sr_mul_scalar(p[2], 2.0));
    out[0] = sr_cat(q, 3, 0);
    drop(&s);
    return 1;
}

static int split_unused(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *p[3];
    cr_assert_eq(sr_split(in[0], 2, 0, p), 3);
    for (int i = 0; i < 3; i++)
        keep(&s, p[i]);
    out[0] = sr_mul_scalar(p[1], 3.0);
    drop(&s);
    return 1;
}

static int clone(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    out[0] = sr_mul(keep(&s, sr_clone(in[0])), in[0]);
    drop(&s);
    return 1;
}

static int contiguous(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    out[0] = sr_contiguous(keep(&s, sr_t(in[0])));
    drop(&s);
    return 1;
}

static int nll_loss(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    out[0] = sr_nll_loss(keep(&s, sr_log_softmax(in[0], -1)), in[1]);
    drop(&s);
    return 1;
}

static int mlp(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *h = keep(&s, sr_relu(keep(&s, sr_add(keep(&s, sr_matmul(in[0], in[1])), in[2]))));
    sr_tensor *o = keep(&s, sr_add(keep(&s, sr_matmul(h, in[3])), in[4]));
    out[0] = sr_cross_entropy(o, in[5]);
    drop(&s);
    return 1;
}

static int multi_root(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    out[0] = sr_sum(keep(&s, sr_add(in[0], in[1])));
    out[1] = sr_sum(keep(&s, sr_mul(in[0], in[1])));
    out[2] = sr_sum(keep(&s, sr_cos(in[0])));
    out[3] = sr_sum(keep(&s, sr_div(in[0], in[1])));
    drop(&s);
    return 4;
}

/* ---- convolution layers ---- */
static int conv2d_basic(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], in[2], NULL, NULL, NULL, 1));
}
static int conv2d_stride2_pad1(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], in[2], SHAPE(2, 2), SHAPE(1, 1), NULL, 1));
}
static int conv2d_dilation2(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], in[2], NULL, SHAPE(1, 2), SHAPE(2, 2), 1));
}
static int conv2d_groups2(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], in[2], SHAPE(2, 1), SHAPE(1, 1), NULL, 2));
}
static int conv2d_nobias_odd(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], NULL, SHAPE(1, 2), NULL, NULL, 1));
}
static int f32_conv2d(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], in[2], NULL, SHAPE(1, 1), NULL, 1));
}
/* conv2d's fast paths: the direct forward, the backward as a convolution of dY */
static int f32_conv2d_direct_c3(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], in[2], SHAPE(2, 1), SHAPE(0, 1), NULL, 1));
}
static int f32_conv2d_by_conv_pad(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_conv2d(in[0], in[1], NULL, NULL, SHAPE(1, 2), NULL, 1));
}
static int max_pool2d(sr_tensor **in, sr_tensor **out) { ONE(sr_max_pool2d(in[0], SHAPE(2, 2), NULL, NULL)); }
static int max_pool2d_pad(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_max_pool2d(in[0], SHAPE(3, 3), SHAPE(2, 2), SHAPE(1, 1)));
}
static int avg_pool2d(sr_tensor **in, sr_tensor **out) { ONE(sr_avg_pool2d(in[0], SHAPE(2, 2), NULL, NULL)); }
static int avg_pool2d_pad(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_avg_pool2d(in[0], SHAPE(3, 3), SHAPE(2, 2), SHAPE(1, 1)));
}
static int flatten(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *a = keep(&s, sr_flatten(in[0], 1, -1));
    sr_tensor *b = keep(&s, sr_reshape(keep(&s, sr_flatten(in[0], 1, 2)), 2, SHAPE(2, 60)));
    out[0] = sr_mul(a, b);
    drop(&s);
    return 1;
}
static int layer_norm(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_layer_norm(in[0], 2, SHAPE(4, 5), in[1], in[2], 1e-5));
}
static int layer_norm_chw(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_layer_norm(in[0], 3, SHAPE(3, 4, 5), NULL, NULL, 1e-5));
}
static int f32_layer_norm(sr_tensor **in, sr_tensor **out)
{
    ONE(sr_layer_norm(in[0], 1, SHAPE(8), in[1], in[2], 1e-5));
}
static int cnn(sr_tensor **in, sr_tensor **out)
{
    struct scratch s = {0};
    sr_tensor *c = keep(&s, sr_conv2d(in[0], in[1], in[2], NULL, SHAPE(1, 1), NULL, 1));
    sr_tensor *p = keep(&s, sr_max_pool2d(keep(&s, sr_relu(c)), SHAPE(2, 2), NULL, NULL));
    sr_tensor *f = keep(&s, sr_flatten(p, 1, -1));
    sr_tensor *l = keep(&s, sr_add(keep(&s, sr_matmul(f, keep(&s, sr_t(in[3])))), in[4]));
    out[0] = sr_cross_entropy(l, in[5]);
    drop(&s);
    return 1;
}

static const struct {
    const char *name;
    build_fn build;
} cases[] = {
    {"add_bcast", add_bcast},       {"add_bcast_both", add_bcast},   {"sub_bcast", sub_bcast},
    {"mul_bcast", mul_bcast},       {"mul_self", mul_self},          {"div_bcast", div_bcast},
    {"pow_tensor", pow_tensor},     {"neg", neg},                    {"scalar_ops", scalar_ops},
    {"pow_scalar", pow_scalar},     {"pow_scalar_int", pow_scalar_int}, {"unary_exp", u_exp},
    {"unary_sin", u_sin},           {"unary_cos", u_cos},            {"unary_tanh", u_tanh},
    {"unary_relu", u_relu},         {"unary_sigmoid", u_sigmoid},    {"unary_log", u_log},
    {"unary_sqrt", u_sqrt},         {"matmul_1d1d", matmul},         {"matmul_2d1d", matmul},
    {"matmul_1d2d", matmul},        {"matmul_2d2d", matmul},         {"matmul_3d2d", matmul},
    {"matmul_bcast", matmul},       {"matmul_1d3d", matmul},         {"matmul_3d1d", matmul},
    {"mm", mm},                     {"mm_transposed", mm_transposed}, {"bmm", bmm},
    {"sum_all", sum_all},           {"sum_dim", sum_dim},            {"sum_dim_keep", sum_dim_keep},
    {"mean_all", mean_all},         {"mean_dim", mean_dim},          {"mean_dim_keep", mean_dim_keep},
    {"view", view},                 {"reshape_copy", reshape_copy},  {"transpose", transpose},
    {"t", t},                       {"permute", permute},            {"narrow", narrow},
    {"squeeze_unsqueeze", squeeze_unsqueeze}, {"expand", expand},    {"stack", stack},
    {"cat", cat},                   {"chunk", chunk},                {"split", split},
    {"split_unused", split_unused}, {"clone", clone},                {"contiguous", contiguous},
    {"mse_loss", mse_loss},         {"log_softmax_1", log_softmax_1}, {"log_softmax_0", log_softmax_0},
    {"softmax", softmax},           {"nll_loss", nll_loss},          {"nll_loss_1d", nll_loss},
    {"cross_entropy", cross_entropy}, {"cross_entropy_1d", cross_entropy},
    {"f32_add_bcast", add_bcast},   {"f32_matmul", matmul},          {"f32_log_softmax", log_softmax_1},
    {"f32_mse_loss", mse_loss},     {"mlp", mlp},                    {"multi_root", multi_root},
    {"conv2d_basic", conv2d_basic}, {"conv2d_stride2_pad1", conv2d_stride2_pad1},
    {"conv2d_dilation2", conv2d_dilation2}, {"conv2d_groups2", conv2d_groups2},
    {"conv2d_nobias_odd", conv2d_nobias_odd}, {"f32_conv2d", f32_conv2d}, {"max_pool2d", max_pool2d},
    {"max_pool2d_pad", max_pool2d_pad}, {"avg_pool2d", avg_pool2d}, {"avg_pool2d_pad", avg_pool2d_pad},
    {"f32_max_pool2d", max_pool2d}, {"f32_avg_pool2d", avg_pool2d_pad}, {"flatten", flatten},
    {"layer_norm", layer_norm},     {"layer_norm_chw", layer_norm_chw}, {"f32_layer_norm", f32_layer_norm},
    {"cnn", cnn},
    {"f32_conv2d_direct", f32_conv2d},  {"f32_conv2d_direct_c3", f32_conv2d_direct_c3},
    {"f32_conv2d_by_conv", f32_conv2d}, {"f32_conv2d_by_conv_pad", f32_conv2d_by_conv_pad},
};

/* ---- the golden file ---- */

struct record {
    char kind[8];
    int index, requires_grad, ndim;
    sr_dtype dt;
    int64_t shape[SR_MAX_DIMS];
    double *vals;
    size_t n;
};

static sr_dtype parse_dtype(const char *s)
{
    return !strcmp(s, "f32") ? SR_F32 : !strcmp(s, "f64") ? SR_F64 : SR_I64;
}

/* One "in"/"out"/"grad" line; the values follow " : ". */
static void parse_record(char *line, struct record *r)
{
    char *colon = strstr(line, " : ");
    cr_assert(colon, "malformed golden line: %s", line);
    *colon = 0;
    char *tok = strtok(line, " "), dt[8] = "f64";
    snprintf(r->kind, sizeof(r->kind), "%s", tok);
    if (!strcmp(r->kind, "in")) {
        r->index = atoi(strtok(NULL, " "));
        snprintf(dt, sizeof(dt), "%s", strtok(NULL, " "));
        r->requires_grad = atoi(strtok(NULL, " "));
    } else if (!strcmp(r->kind, "out")) {
        snprintf(dt, sizeof(dt), "%s", strtok(NULL, " "));
    } else {
        r->index = atoi(strtok(NULL, " "));
    }
    r->dt = parse_dtype(dt);
    r->ndim = atoi(strtok(NULL, " "));
    for (int d = 0; d < r->ndim; d++)
        r->shape[d] = atoll(strtok(NULL, " "));
    r->n = 1;
    for (int d = 0; d < r->ndim; d++)
        r->n *= (size_t)r->shape[d];
    r->vals = calloc(r->n + 1, sizeof(double));
    char *p = colon + 3, *end;
    for (size_t i = 0; i < r->n; i++, p = end) {
        r->vals[i] = strtod(p, &end);
        cr_assert(end != p, "golden line has %zu values, expected %zu", i, r->n);
    }
}

struct golden_case {
    char name[64];
    struct record rec[2 * MAX_IN + MAX_OUT];
    int nrec;
};

/* The next case in f, or false at the end. */
static bool next_case(FILE *f, struct golden_case *c)
{
    static char line[1 << 16];
    memset(c, 0, sizeof(*c));
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "case ", 5))
            snprintf(c->name, sizeof(c->name), "%.63s", line + 5);
        else if (!strcmp(line, "end"))
            return true;
        else if (line[0] && line[0] != '#')
            parse_record(line, &c->rec[c->nrec++]);
    }
    return false;
}

static void free_case(struct golden_case *c)
{
    for (int i = 0; i < c->nrec; i++)
        free(c->rec[i].vals);
}

static void tolerance(sr_dtype dt, double *atol, double *rtol)
{
    *atol = dt == SR_F32 ? 1e-6 : 1e-12;
    *rtol = dt == SR_F32 ? 1e-4 : 1e-9;
}

/* sum(out * w), w[j] = cos(0.37 j) in out's dtype, as make_golden.py does. */
static sr_tensor *weighted_loss(sr_tensor *out)
{
    size_t n = sr_tensor_numel(out);
    double *w = calloc(n + 1, sizeof(double));
    for (size_t j = 0; j < n; j++)
        w[j] = cos(0.37 * (double)j);
    sr_tensor *wt = tu_tensor(sr_tensor_dtype(out), sr_tensor_ndim(out), sr_tensor_shape(out), w, 0);
    sr_tensor *prod = sr_mul(out, wt), *loss = sr_sum(prod);
    free(w);
    sr_tensor_unref(wt);
    sr_tensor_unref(prod);
    return loss;
}

static void run_case(struct golden_case *c, build_fn build)
{
    sr_tensor *in[MAX_IN] = {0}, *out[MAX_OUT] = {0};
    int nin = 0, nout = 0;
    double atol, rtol;
    for (int i = 0; i < c->nrec; i++) {
        struct record *r = &c->rec[i];
        if (!strcmp(r->kind, "in"))
            in[nin++] = tu_tensor(r->dt, r->ndim, r->shape, r->vals, r->requires_grad ? SR_REQUIRES_GRAD : 0);
    }
    int n = build(in, out);
    for (int k = 0; k < c->nrec; k++) {
        struct record *r = &c->rec[k];
        if (strcmp(r->kind, "out"))
            continue;
        char what[96];
        snprintf(what, sizeof(what), "%s: output %d", c->name, nout);
        tu_expect_shape(out[nout], r->ndim, r->shape, what);
        cr_assert_eq(sr_tensor_dtype(out[nout]), r->dt, "%s: dtype", what);
        tolerance(r->dt, &atol, &rtol);
        tu_expect(out[nout++], r->vals, r->n, atol, rtol, what);
    }
    cr_assert_eq(n, nout, "%s: %d outputs, the golden file has %d", c->name, n, nout);
    sr_tensor *loss = n == 1 ? weighted_loss(out[0]) : NULL;
    int rc = n == 1 ? sr_backward(loss, false) : sr_backward_multi(out, NULL, (size_t)n, false);
    cr_assert_eq(rc, 0, "%s: backward: %s", c->name, sr_last_error());
    for (int k = 0; k < c->nrec; k++) {
        struct record *r = &c->rec[k];
        if (strcmp(r->kind, "grad"))
            continue;
        char what[96];
        snprintf(what, sizeof(what), "%s: grad of input %d", c->name, r->index);
        tolerance(sr_tensor_dtype(in[r->index]), &atol, &rtol);
        sr_tensor *g = sr_tensor_grad(in[r->index]);
        sr_tensor *z = g ? NULL : sr_zeros_like(in[r->index]); /* no gradient reached it: PyTorch's zeros */
        tu_expect(g ? g : z, r->vals, r->n, atol, rtol, what);
        sr_tensor_unref(z);
    }
    sr_tensor_unref(loss);
    for (int i = 0; i < n; i++)
        sr_tensor_unref(out[i]);
    for (int i = 0; i < nin; i++)
        sr_tensor_unref(in[i]);
}

Test(golden, every_case_matches_pytorch)
{
    FILE *f = fopen(GOLDEN_FILE, "r");
    cr_assert(f, "cannot open %s", GOLDEN_FILE);
    static struct golden_case c;
    size_t ncases = sizeof(cases) / sizeof(cases[0]), seen = 0;
    while (next_case(f, &c)) {
        build_fn build = NULL;
        for (size_t i = 0; i < ncases && !build; i++)
            if (!strcmp(cases[i].name, c.name))
                build = cases[i].build;
        cr_assert(build, "golden case %s has no C expression", c.name);
        run_case(&c, build);
        free_case(&c);
        seen++;
    }
    fclose(f);
    cr_assert_eq(seen, ncases, "%zu golden cases ran, %zu expressions are defined", seen, ncases);
}

/* grad t1 = 1 + t2 - sin(t1) + 1/t2, grad t2 = 1 + t1 - t1/t2^2 (the
 * dist_autograd multiple-roots test), checked by formula as well. */
Test(golden, multiple_roots_match_the_formula)
{
    sr_manual_seed(3);
    sr_tensor *t1 = sr_rand(SR_F64, 2, SHAPE(3, 3), SR_REQUIRES_GRAD);
    sr_tensor *t2r = sr_rand(SR_F64, 2, SHAPE(3, 3), 0), *t2 = sr_add_scalar(t2r, 0.5);
    sr_tensor_set_requires_grad(t2, true);
    sr_tensor *in[2] = {t1, t2}, *roots[4];
    cr_assert_eq(multi_root(in, roots), 4);
    cr_assert_eq(sr_backward_multi(roots, NULL, 4, false), 0, "%s", sr_last_error());
    double a[9], b[9], g1[9], g2[9];
    sr_tensor_to_f64(t1, a, 9);
    sr_tensor_to_f64(t2, b, 9);
    sr_tensor_to_f64(sr_tensor_grad(t1), g1, 9);
    sr_tensor_to_f64(sr_tensor_grad(t2), g2, 9);
    for (int i = 0; i < 9; i++) {
        cr_assert_float_eq(g1[i], 1 + b[i] - sin(a[i]) + 1 / b[i], 1e-12);
        cr_assert_float_eq(g2[i], 1 + a[i] - a[i] / (b[i] * b[i]), 1e-12);
    }
    for (int i = 0; i < 4; i++)
        sr_tensor_unref(roots[i]);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2r);
    sr_tensor_unref(t2);
}
