/* SPDX-License-Identifier: MIT */
/* Local optimizers against torch.optim. tests/golden/optim_golden.txt comes
 * from tests/golden/make_optim_golden.py (see there for the format): every
 * case is rebuilt here by name and option, run for two steps, and compared
 * with PyTorch's parameters after each step and its state after the last.
 *
 * Tolerances: f64 |got - want| <= 1e-14 + 1e-12 |want| (the same operations
 * in the same order; only rounding inside scalar ops may differ); f32
 * 1e-6 + 1e-6 |want| (most kinds round each op's double result to f32,
 * Adam and AdamW compute in f32 with the scalars cast once, PyTorch
 * computes in f32). */
#include <errno.h>
#include <stdlib.h>

#include "shmrpc/optim.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(optim_golden);
LEAK_CHECKED_SUITE(optim);

#ifndef OPTIM_GOLDEN_FILE
#error "OPTIM_GOLDEN_FILE must name tests/golden/optim_golden.txt"
#endif

#define NP 2     /* parameters per case */
#define NSTEP 2  /* steps per case */
#define MAX_STATE 8

/* ---- the golden file ---- */

struct gt {
    int ndim;
    int64_t shape[SR_MAX_DIMS];
    size_t n;
    double vals[16];
};

struct gcase {
    char name[64];
    sr_optim_kind kind;
    sr_optim_opts opts;
    sr_dtype dt;
    struct gt param[NP], grad[NSTEP][NP], after[NSTEP][NP];
    bool has_grad[NSTEP][NP];
    int nstate;
    char state_name[MAX_STATE][64];
    struct gt state[MAX_STATE];
};

/* "NDIM SHAPE... : VALUES..." */
static void parse_gt(char *p, struct gt *t)
{
    char *end;
    t->ndim = (int)strtol(p, &end, 10);
    t->n = 1;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = strtoll(end, &end, 10);
        t->n *= (size_t)t->shape[d];
    }
    cr_assert(t->n <= 16 && !strncmp(end, " : ", 3), "malformed golden tensor: %s", p);
    p = end + 3;
    for (size_t i = 0; i < t->n; i++, p = end) {
        t->vals[i] = strtod(p, &end);
        cr_assert(end != p, "golden tensor has %zu values, expected %zu", i, t->n);
    }
}

static void set_opt(sr_optim_opts *o, const char *name, char *vals)
{
    static const struct { const char *name; size_t off; int n; } dbl[] = {
        {"lr", offsetof(sr_optim_opts, lr), 1}, {"momentum", offsetof(sr_optim_opts, momentum), 1},
        {"dampening", offsetof(sr_optim_opts, dampening), 1},
        {"weight_decay", offsetof(sr_optim_opts, weight_decay), 1}, {"betas", offsetof(sr_optim_opts, betas), 2},
        {"eps", offsetof(sr_optim_opts, eps), 1}, {"alpha", offsetof(sr_optim_opts, alpha), 1},
        {"rho", offsetof(sr_optim_opts, rho), 1}, {"lr_decay", offsetof(sr_optim_opts, lr_decay), 1},
        {"initial_accumulator_value", offsetof(sr_optim_opts, initial_accumulator_value), 1},
        {"etas", offsetof(sr_optim_opts, etas), 2}, {"step_sizes", offsetof(sr_optim_opts, step_sizes), 2},
    };
    static const struct { const char *name; size_t off; } flags[] = {
        {"nesterov", offsetof(sr_optim_opts, nesterov)}, {"amsgrad", offsetof(sr_optim_opts, amsgrad)},
        {"centered", offsetof(sr_optim_opts, centered)}, {"maximize", offsetof(sr_optim_opts, maximize)},
    };
    char *end;
    for (size_t k = 0; k < sizeof(dbl) / sizeof(dbl[0]); k++)
        if (!strcmp(name, dbl[k].name)) {
            for (int j = 0; j < dbl[k].n; j++, vals = end)
                ((double *)((char *)o + dbl[k].off))[j] = strtod(vals, &end);
            return;
        }
    for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
        if (!strcmp(name, flags[k].name)) {
            *(bool *)((char *)o + flags[k].off) = atoi(vals) != 0;
            return;
        }
    cr_assert_fail("golden file: unknown option %s", name);
}

static void parse_line(struct gcase *c, char *line)
{
    char w[64], key[48];
    int a, b, off;
    if (sscanf(line, "kind %63s", w) == 1) {
        cr_assert_eq(sr_optim_kind_parse(w, &c->kind), 0, "%s", sr_last_error());
        cr_assert_eq(sr_optim_opts_default(c->kind, &c->opts), 0);
    } else if (sscanf(line, "opt %63s %n", w, &off) == 1) {
        set_opt(&c->opts, w, line + off);
    } else if (sscanf(line, "param %d %63s %n", &a, w, &off) == 2) {
        c->dt = !strcmp(w, "f32") ? SR_F32 : SR_F64;
        parse_gt(line + off, &c->param[a]);
    } else if (sscanf(line, "grad %d %d %n", &a, &b, &off) == 2) {
        c->has_grad[a - 1][b] = true;
        parse_gt(line + off, &c->grad[a - 1][b]);
    } else if (sscanf(line, "after %d %d %n", &a, &b, &off) == 2) {
        parse_gt(line + off, &c->after[a - 1][b]);
    } else if (sscanf(line, "state %d %47s %n", &a, key, &off) == 2) {
        cr_assert(c->nstate < MAX_STATE);
        snprintf(c->state_name[c->nstate], sizeof(c->state_name[0]), "%d.%s", a, key);
        parse_gt(line + off, &c->state[c->nstate++]);
    } else {
        cr_assert_fail("malformed golden line: %s", line);
    }
}

/* All cases of the file into *out (freed by the caller); returns the count. */
static int load_cases(struct gcase **out)
{
    FILE *f = fopen(OPTIM_GOLDEN_FILE, "r");
    cr_assert(f, "cannot open %s", OPTIM_GOLDEN_FILE);
    static char line[4096];
    int n = 0;
    struct gcase *cs = calloc(64, sizeof(*cs));
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#')
            continue;
        if (!strncmp(line, "case ", 5)) {
            cr_assert(n < 64);
            snprintf(cs[n].name, sizeof(cs[n].name), "%.63s", line + 5);
        } else if (!strcmp(line, "end")) {
            n++;
        } else {
            parse_line(&cs[n], line);
        }
    }
    fclose(f);
    cr_assert(n >= 29, "golden file has %d cases", n);
    *out = cs;
    return n;
}

/* ---- running a case ---- */

static void tolerance(sr_dtype dt, double *atol, double *rtol)
{
    *atol = dt == SR_F32 ? 1e-6 : 1e-14;
    *rtol = dt == SR_F32 ? 1e-6 : 1e-12;
}

static sr_tensor *make(const struct gcase *c, const struct gt *t, unsigned flags)
{
    return tu_tensor(c->dt, t->ndim, t->shape, t->vals, flags);
}

static void make_params(const struct gcase *c, sr_tensor **p)
{
    for (int i = 0; i < NP; i++)
        p[i] = make(c, &c->param[i], SR_REQUIRES_GRAD);
}

static sr_optim *make_optim(const struct gcase *c, sr_tensor **p)
{
    sr_optim *o = NULL;
    cr_assert_eq(sr_optim_create(c->kind, &c->opts, p, NP, &o), 0, "%s: %s", c->name, sr_last_error());
    return o;
}

/* Step s (0-based) of case c: through .grad, or through sr_optim_step_grads. */
static void do_step(const struct gcase *c, sr_optim *o, sr_tensor **p, int s, bool explicit_grads)
{
    sr_tensor *g[NP] = {0};
    for (int i = 0; i < NP; i++) {
        g[i] = c->has_grad[s][i] ? make(c, &c->grad[s][i], 0) : NULL;
        if (!explicit_grads)
            cr_assert_eq(sr_tensor_set_grad(p[i], g[i]), 0, "%s", sr_last_error());
    }
    int rc = explicit_grads ? sr_optim_step_grads(o, g) : sr_optim_step(o);
    cr_assert_eq(rc, 0, "%s: step %d: %s", c->name, s + 1, sr_last_error());
    for (int i = 0; i < NP; i++)
        sr_tensor_unref(g[i]);
}

static void expect_after(const struct gcase *c, sr_tensor **p, int s)
{
    double atol, rtol;
    tolerance(c->dt, &atol, &rtol);
    for (int i = 0; i < NP; i++) {
        char what[160];
        snprintf(what, sizeof(what), "%s: parameter %d after step %d", c->name, i, s + 1);
        tu_expect_shape(p[i], c->after[s][i].ndim, c->after[s][i].shape, what);
        tu_expect(p[i], c->after[s][i].vals, c->after[s][i].n, atol, rtol, what);
    }
}

/* The exported state has exactly torch's keys, with torch's values. */
static void expect_state(const struct gcase *c, sr_optim *o)
{
    size_t n;
    char **names;
    sr_tensor **ts;
    double atol, rtol;
    tolerance(c->dt, &atol, &rtol);
    cr_assert_eq(sr_optim_state_export(o, &n, &names, &ts), 0, "%s", sr_last_error());
    cr_assert_eq(n, (size_t)c->nstate, "%s: %zu state entries, torch has %d", c->name, n, c->nstate);
    for (int k = 0; k < c->nstate; k++) {
        size_t j = 0;
        while (j < n && strcmp(names[j], c->state_name[k]))
            j++;
        cr_assert(j < n, "%s: no state \"%s\"", c->name, c->state_name[k]);
        char what[160];
        snprintf(what, sizeof(what), "%s: state %s", c->name, c->state_name[k]);
        tu_expect(ts[j], c->state[k].vals, c->state[k].n, atol, rtol, what);
    }
    sr_optim_state_free(n, names, ts);
}

static void unref_all(sr_tensor **p, int n)
{
    for (int i = 0; i < n; i++)
        sr_tensor_unref(p[i]);
}

/* Bitwise equality of two parameter lists. */
static void expect_same(const char *what, sr_tensor **a, sr_tensor **b)
{
    for (int i = 0; i < NP; i++) {
        double x[16], y[16];
        size_t n = sr_tensor_numel(a[i]);
        cr_assert_eq(sr_tensor_to_f64(a[i], x, 16), 0);
        cr_assert_eq(sr_tensor_to_f64(b[i], y, 16), 0);
        cr_assert(!memcmp(x, y, n * sizeof(double)), "%s: parameter %d differs", what, i);
    }
}

Test(optim_golden, every_case_matches_torch)
{
    struct gcase *cs;
    int n = load_cases(&cs);
    for (int k = 0; k < n; k++) {
        sr_tensor *p[NP];
        make_params(&cs[k], p);
        sr_optim *o = make_optim(&cs[k], p);
        for (int s = 0; s < NSTEP; s++) {
            do_step(&cs[k], o, p, s, false);
            expect_after(&cs[k], p, s);
        }
        expect_state(&cs[k], o);
        sr_optim_destroy(o);
        unref_all(p, NP);
    }
    free(cs);
}

Test(optim_golden, step_grads_agrees_with_step)
{
    struct gcase *cs;
    int n = load_cases(&cs);
    for (int k = 0; k < n; k++) {
        sr_tensor *p[NP], *q[NP];
        make_params(&cs[k], p);
        make_params(&cs[k], q);
        sr_optim *a = make_optim(&cs[k], p), *b = make_optim(&cs[k], q);
        for (int s = 0; s < NSTEP; s++) {
            do_step(&cs[k], a, p, s, false);
            do_step(&cs[k], b, q, s, true);
            expect_same(cs[k].name, p, q);
        }
        for (int i = 0; i < NP; i++)
            cr_assert_null(sr_tensor_grad(q[i]), "step_grads must not set .grad");
        sr_optim_destroy(a);
        sr_optim_destroy(b);
        unref_all(p, NP);
        unref_all(q, NP);
    }
    free(cs);
}

/* After step 1, a new optimizer over copies of the parameters, given the
 * exported state, takes step 2 exactly as the first one does. */
static void round_trip(const struct gcase *c)
{
    sr_tensor *p[NP], *q[NP];
    make_params(c, p);
    sr_optim *a = make_optim(c, p);
    do_step(c, a, p, 0, true);
    for (int i = 0; i < NP; i++) {
        sr_tensor *d = sr_detach(p[i]);
        q[i] = sr_clone(d);
        sr_tensor_unref(d);
        cr_assert_eq(sr_tensor_set_requires_grad(q[i], true), 0, "%s", sr_last_error());
    }
    size_t n;
    char **names;
    sr_tensor **ts;
    cr_assert_eq(sr_optim_state_export(a, &n, &names, &ts), 0, "%s", sr_last_error());
    sr_optim *b = make_optim(c, q);
    cr_assert_eq(sr_optim_state_import(b, n, (const char *const *)names, ts), 0, "%s: %s", c->name,
                 sr_last_error());
    sr_optim_state_free(n, names, ts);
    do_step(c, a, p, 1, true);
    do_step(c, b, q, 1, true);
    expect_same(c->name, p, q);
    expect_after(c, q, 1);
    expect_state(c, b);
    sr_optim_destroy(a);
    sr_optim_destroy(b);
    unref_all(p, NP);
    unref_all(q, NP);
}

Test(optim_golden, state_export_import_continues_identically)
{
    struct gcase *cs;
    int n = load_cases(&cs);
    for (int k = 0; k < n; k++)
        round_trip(&cs[k]);
    free(cs);
}

/* ---- defaults, names, options ---- */

Test(optim, defaults_match_torch)
{
    sr_optim_opts o;
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_SGD, &o), 0);
    cr_assert(o.lr == 0 && o.momentum == 0 && o.dampening == 0 && o.weight_decay == 0 && !o.nesterov &&
              !o.maximize);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADAM, &o), 0);
    cr_assert(o.lr == 1e-3 && o.betas[0] == 0.9 && o.betas[1] == 0.999 && o.eps == 1e-8 && o.weight_decay == 0 &&
              !o.amsgrad && !o.maximize);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADAMW, &o), 0);
    cr_assert(o.lr == 1e-3 && o.betas[0] == 0.9 && o.betas[1] == 0.999 && o.eps == 1e-8 && o.weight_decay == 1e-2);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADAGRAD, &o), 0);
    cr_assert(o.lr == 1e-2 && o.lr_decay == 0 && o.weight_decay == 0 && o.initial_accumulator_value == 0 &&
              o.eps == 1e-10);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_RMSPROP, &o), 0);
    cr_assert(o.lr == 1e-2 && o.alpha == 0.99 && o.eps == 1e-8 && o.weight_decay == 0 && o.momentum == 0 &&
              !o.centered);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADADELTA, &o), 0);
    cr_assert(o.lr == 1.0 && o.rho == 0.9 && o.eps == 1e-6 && o.weight_decay == 0);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADAMAX, &o), 0);
    cr_assert(o.lr == 2e-3 && o.betas[0] == 0.9 && o.betas[1] == 0.999 && o.eps == 1e-8 && o.weight_decay == 0);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_RPROP, &o), 0);
    cr_assert(o.lr == 1e-2 && o.etas[0] == 0.5 && o.etas[1] == 1.2 && o.step_sizes[0] == 1e-6 &&
              o.step_sizes[1] == 50);
    cr_assert_eq(sr_optim_opts_default((sr_optim_kind)99, &o), -EINVAL);
}

Test(optim, kind_names_round_trip)
{
    const char *want[] = {"SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "Adamax", "Rprop"};
    for (int k = 0; k < SR_OPTIM_NKINDS; k++) {
        sr_optim_kind got;
        cr_assert_str_eq(sr_optim_kind_name((sr_optim_kind)k), want[k]);
        cr_assert_eq(sr_optim_kind_parse(want[k], &got), 0);
        cr_assert_eq(got, (sr_optim_kind)k);
    }
    sr_optim_kind got;
    cr_assert_eq(sr_optim_kind_parse("adamw", &got), 0);
    cr_assert_eq(got, SR_OPTIM_ADAMW);
    cr_assert_eq(sr_optim_kind_parse("LBFGS", &got), -EINVAL);
    tu_expect_error("parse", "sr_optim_kind_parse", "LBFGS");
    cr_assert_str_eq(sr_optim_kind_name((sr_optim_kind)-1), "?");
}

/* NULL options are the defaults: an Adam step with them equals one with
 * sr_optim_opts_default's. */
Test(optim, null_options_are_the_defaults)
{
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, -2, 3), 0);
    sr_tensor *q = sr_clone(p), *g = tu_tensor(SR_F64, 1, SHAPE(3), VALS(0.5, 0.25, -1), 0);
    sr_optim_opts d;
    sr_optim *a, *b;
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADAM, &d), 0);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, &p, 1, &a), 0);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, &d, &q, 1, &b), 0);
    cr_assert_eq(sr_optim_options(a)->lr, 1e-3);
    cr_assert_eq(sr_optim_step_grads(a, &g), 0);
    cr_assert_eq(sr_optim_step_grads(b, &g), 0);
    tu_expect(p, VALS(1 - 1e-3, -2 - 1e-3, 3 + 1e-3), 3, 1e-9, 0, "Adam's first step moves lr * sign(grad)");
    double x[3], y[3];
    cr_assert(!sr_tensor_to_f64(p, x, 3) && !sr_tensor_to_f64(q, y, 3));
    cr_assert(!memcmp(x, y, sizeof(x)), "NULL options and the defaults differ");
    sr_optim_destroy(a);
    sr_optim_destroy(b);
    unref_all((sr_tensor *[]){p, q, g}, 3);
}

/* The natural C initialiser names only what it changes: the other fields
 * are torch's defaults, not zeros (eps 0 would turn a zero gradient into
 * 0/0 = NaN at the first step). */
Test(optim, zero_fields_take_the_defaults)
{
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, -2, 3), 0), *q = sr_clone(p);
    sr_tensor *g = sr_zeros(SR_F64, 1, SHAPE(3), 0);
    sr_optim *a, *b;
    sr_optim_opts d;
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, &(sr_optim_opts){.lr = 0.01}, &p, 1, &a), 0, "%s", sr_last_error());
    const sr_optim_opts *in_force = sr_optim_options(a);
    cr_assert(in_force->lr == 0.01 && in_force->betas[0] == 0.9 && in_force->betas[1] == 0.999 &&
                  in_force->eps == 1e-8 && in_force->weight_decay == 0,
              "Adam {.lr = 0.01}: betas (%g, %g), eps %g", in_force->betas[0], in_force->betas[1], in_force->eps);
    cr_assert_eq(sr_optim_opts_default(SR_OPTIM_ADAM, &d), 0);
    d.lr = 0.01;
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, &d, &q, 1, &b), 0);
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(sr_optim_step_grads(a, &g), 0);
        cr_assert_eq(sr_optim_step_grads(b, &g), 0);
    }
    tu_expect(p, VALS(1, -2, 3), 3, 0, 0, "a zero gradient leaves Adam's parameters as they were");
    double x[3], y[3];
    cr_assert(!sr_tensor_to_f64(p, x, 3) && !sr_tensor_to_f64(q, y, 3));
    cr_assert(!memcmp(x, y, sizeof(x)), "{.lr = 0.01} and the defaults with lr 0.01 differ");
    sr_optim_destroy(a);
    sr_optim_destroy(b);
    unref_all((sr_tensor *[]){p, q, g}, 3);
}

/* SR_OPTIM_ZERO is an explicit 0 where the default is not: AdamW without
 * weight decay steps as Adam does. */
Test(optim, explicit_zero_overrides_a_default)
{
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, -2, 3), 0), *q = sr_clone(p);
    sr_tensor *g = tu_tensor(SR_F64, 1, SHAPE(3), VALS(0.5, 0.25, -1), 0);
    sr_optim *a, *b;
    sr_optim_opts r;
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAMW, &(sr_optim_opts){.weight_decay = SR_OPTIM_ZERO}, &p, 1, &a), 0);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, &q, 1, &b), 0);
    cr_assert(sr_optim_options(a)->weight_decay == 0 && !signbit(sr_optim_options(a)->weight_decay));
    cr_assert_eq(sr_optim_step_grads(a, &g), 0);
    cr_assert_eq(sr_optim_step_grads(b, &g), 0);
    double x[3], y[3];
    cr_assert(!sr_tensor_to_f64(p, x, 3) && !sr_tensor_to_f64(q, y, 3));
    cr_assert(!memcmp(x, y, sizeof(x)), "AdamW with weight_decay SR_OPTIM_ZERO differs from Adam");
    cr_assert_eq(sr_optim_opts_resolve(SR_OPTIM_ADAMW, NULL, &r), 0);
    cr_assert(r.weight_decay == 1e-2 && r.lr == 1e-3, "AdamW's defaults: wd %g lr %g", r.weight_decay, r.lr);
    cr_assert_eq(sr_optim_opts_resolve(SR_OPTIM_SGD, &(sr_optim_opts){.momentum = 0.9}, &r), -EINVAL);
    tu_expect_error("SGD without lr", "sr_optim_opts_resolve: ", "SGD: parameter group didn't specify");
    sr_optim_destroy(a);
    sr_optim_destroy(b);
    unref_all((sr_tensor *[]){p, q, g}, 3);
}

struct bad_case {
    sr_optim_kind kind;
    void (*mutate)(sr_optim_opts *);
    const char *msg;
};

static void lr_neg(sr_optim_opts *o) { o->lr = -1; }
static void lr_nan(sr_optim_opts *o) { o->lr = NAN; }
static void lr_keep(sr_optim_opts *o) { (void)o; }
static void mom_neg(sr_optim_opts *o) { o->lr = 0.1, o->momentum = -0.5; }
static void wd_neg(sr_optim_opts *o) { o->lr = 0.1, o->weight_decay = -0.1; }
static void nesterov_no_mom(sr_optim_opts *o) { o->lr = 0.1, o->nesterov = true; }
static void nesterov_damp(sr_optim_opts *o) { o->lr = 0.1, o->nesterov = true, o->momentum = 0.9, o->dampening = 0.1; }
static void eps_neg(sr_optim_opts *o) { o->eps = -1e-8; }
static void beta0_one(sr_optim_opts *o) { o->betas[0] = 1.0; }
static void beta1_neg(sr_optim_opts *o) { o->betas[1] = -0.5; }
static void wd_neg_only(sr_optim_opts *o) { o->weight_decay = -1; }
static void lr_decay_neg(sr_optim_opts *o) { o->lr_decay = -0.5; }
static void init_acc_neg(sr_optim_opts *o) { o->initial_accumulator_value = -2; }
static void alpha_neg(sr_optim_opts *o) { o->alpha = -0.25; }
static void mom_neg_only(sr_optim_opts *o) { o->momentum = -1; }
static void rho_big(sr_optim_opts *o) { o->rho = 1.5; }
static void etas_bad(sr_optim_opts *o) { o->etas[0] = 1.0; }
static void etas_plus_bad(sr_optim_opts *o) { o->etas[1] = 0.9; }
static void sgd_mom_nan(sr_optim_opts *o) { o->lr = 0.1, o->momentum = NAN; }
static void sgd_lr_nan(sr_optim_opts *o) { o->lr = NAN; }
static void eps_inf(sr_optim_opts *o) { o->eps = INFINITY; }
static void beta1_one(sr_optim_opts *o) { o->betas[1] = 1.0; }
static void dampening_nan(sr_optim_opts *o) { o->dampening = NAN; }
static void steps_reversed(sr_optim_opts *o) { o->step_sizes[0] = 10, o->step_sizes[1] = 1; }

Test(optim, invalid_options_fail_with_torch_messages)
{
    static const struct bad_case cases[] = {
        {SR_OPTIM_SGD, lr_keep, "SGD: parameter group didn't specify a value of required optimization parameter lr"},
        {SR_OPTIM_SGD, lr_neg, "SGD: Invalid learning rate: -1.0"},
        {SR_OPTIM_SGD, mom_neg, "SGD: Invalid momentum value: -0.5"},
        {SR_OPTIM_SGD, wd_neg, "SGD: Invalid weight_decay value: -0.1"},
        {SR_OPTIM_SGD, nesterov_no_mom, "SGD: Nesterov momentum requires a momentum and zero dampening"},
        {SR_OPTIM_SGD, nesterov_damp, "SGD: Nesterov momentum requires a momentum and zero dampening"},
        {SR_OPTIM_ADAM, lr_neg, "Adam: Invalid learning rate: -1.0"},
        {SR_OPTIM_ADAM, lr_nan, "Adam: Invalid learning rate: nan"},
        {SR_OPTIM_ADAM, eps_neg, "Adam: Invalid epsilon value: -1e-08"},
        {SR_OPTIM_ADAM, beta0_one, "Adam: Invalid beta parameter at index 0: 1.0"},
        {SR_OPTIM_ADAM, beta1_neg, "Adam: Invalid beta parameter at index 1: -0.5"},
        {SR_OPTIM_ADAM, wd_neg_only, "Adam: Invalid weight_decay value: -1.0"},
        {SR_OPTIM_ADAMW, beta1_neg, "AdamW: Invalid beta parameter at index 1: -0.5"},
        {SR_OPTIM_ADAGRAD, lr_decay_neg, "Adagrad: Invalid lr_decay value: -0.5"},
        {SR_OPTIM_ADAGRAD, init_acc_neg, "Adagrad: Invalid initial_accumulator_value value: -2.0"},
        {SR_OPTIM_ADAGRAD, eps_neg, "Adagrad: Invalid epsilon value: -1e-08"},
        {SR_OPTIM_RMSPROP, alpha_neg, "RMSprop: Invalid alpha value: -0.25"},
        {SR_OPTIM_RMSPROP, mom_neg_only, "RMSprop: Invalid momentum value: -1.0"},
        {SR_OPTIM_ADADELTA, rho_big, "Adadelta: Invalid rho value: 1.5"},
        {SR_OPTIM_ADADELTA, lr_neg, "Adadelta: Invalid learning rate: -1.0"},
        {SR_OPTIM_ADAMAX, beta0_one, "Adamax: Invalid beta parameter at index 0: 1.0"},
        {SR_OPTIM_ADAMAX, wd_neg_only, "Adamax: Invalid weight_decay value: -1.0"},
        {SR_OPTIM_RPROP, etas_bad, "Rprop: Invalid eta values: 1.0, 1.2"},
        {SR_OPTIM_RPROP, etas_plus_bad, "Rprop: Invalid eta values: 0.5, 0.9"},
        {SR_OPTIM_RPROP, lr_neg, "Rprop: Invalid learning rate: -1.0"},
        {SR_OPTIM_SGD, sgd_mom_nan, "SGD: Invalid momentum value: nan"},
        {SR_OPTIM_SGD, sgd_lr_nan, "SGD: Invalid learning rate: nan"},
        {SR_OPTIM_ADAM, eps_inf, "Adam: Invalid eps value: inf"},
        {SR_OPTIM_ADAM, beta1_one, "Adam: Invalid beta parameter at index 1: 1.0"},
        {SR_OPTIM_ADAGRAD, dampening_nan, "Adagrad: Invalid dampening value: nan"},
        {SR_OPTIM_RPROP, steps_reversed, "Rprop: Invalid step_sizes values: 10.0, 1.0"},
    };
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        sr_optim_opts o;
        sr_optim *opt = (sr_optim *)&o; /* must stay untouched on failure */
        cr_assert_eq(sr_optim_opts_default(cases[k].kind, &o), 0);
        cases[k].mutate(&o);
        cr_assert_eq(sr_optim_create(cases[k].kind, &o, &p, 1, &opt), -EINVAL, "case %zu (%s) was accepted", k,
                     cases[k].msg);
        cr_assert_eq(opt, (sr_optim *)&o);
        tu_expect_error(cases[k].msg, "sr_optim_create: ", cases[k].msg);
    }
    sr_tensor_unref(p);
}

Test(optim, bad_parameters_are_refused)
{
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    sr_tensor *i64 = sr_zeros(SR_I64, 1, SHAPE(2), 0), *nonleaf = sr_mul_scalar(p, 2.0);
    sr_optim *o = NULL;
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, &p, 0, &o), -EINVAL);
    tu_expect_error("empty", "optimizer got an empty parameter list", NULL);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, (sr_tensor *[]){p, NULL}, 2, &o), -EINVAL);
    tu_expect_error("NULL", "parameter 1 is NULL", NULL);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, &i64, 1, &o), -EINVAL);
    tu_expect_error("i64", "dtype i64", NULL);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, &nonleaf, 1, &o), -EINVAL);
    tu_expect_error("non-leaf", "can't optimize a non-leaf Tensor", NULL);
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, NULL, (sr_tensor *[]){p, p}, 2, &o), -EINVAL);
    tu_expect_error("twice", "parameter 1 is parameter 0 again", NULL);
    cr_assert_eq(sr_optim_create((sr_optim_kind)42, NULL, &p, 1, &o), -EINVAL);
    cr_assert_null(o);
    unref_all((sr_tensor *[]){p, i64, nonleaf}, 3);
}

/* ---- steps ---- */

static sr_optim *adam_over(sr_tensor **p, size_t n)
{
    sr_optim *o;
    sr_optim_opts d;
    sr_optim_opts_default(SR_OPTIM_ADAM, &d);
    d.lr = 0.1;
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, &d, p, n, &o), 0, "%s", sr_last_error());
    return o;
}

/* Without gradients nothing moves and no state appears, for every kind. */
Test(optim, null_grads_leave_params_unchanged)
{
    for (int k = 0; k < SR_OPTIM_NKINDS; k++) {
        sr_tensor *p[2] = {tu_tensor(SR_F32, 1, SHAPE(3), VALS(1, -2, 3), SR_REQUIRES_GRAD),
                           tu_tensor(SR_F64, 2, SHAPE(1, 2), VALS(0.5, -0.5), SR_REQUIRES_GRAD)};
        sr_tensor *g1 = tu_tensor(SR_F64, 2, SHAPE(1, 2), VALS(0.25, 0.75), 0);
        sr_optim_opts d;
        sr_optim *o;
        sr_optim_opts_default((sr_optim_kind)k, &d);
        d.lr = 0.1;
        cr_assert_eq(sr_optim_create((sr_optim_kind)k, &d, p, 2, &o), 0, "%s", sr_last_error());
        cr_assert_eq(sr_optim_step(o), 0, "%s", sr_last_error());
        cr_assert_eq(sr_optim_step_grads(o, (sr_tensor *[]){NULL, NULL}), 0);
        tu_expect(p[0], VALS(1, -2, 3), 3, 0, 0, "p0, no gradients");
        tu_expect(p[1], VALS(0.5, -0.5), 2, 0, 0, "p1, no gradients");
        cr_assert_eq(sr_optim_step_grads(o, (sr_tensor *[]){NULL, g1}), 0, "%s", sr_last_error());
        tu_expect(p[0], VALS(1, -2, 3), 3, 0, 0, "p0 without a gradient, p1 with one");
        double x[2];
        sr_tensor_to_f64(p[1], x, 2);
        cr_assert(x[0] != 0.5 && x[1] != -0.5, "%s did not move p1", sr_optim_kind_name((sr_optim_kind)k));
        size_t n;
        char **names;
        sr_tensor **ts;
        cr_assert_eq(sr_optim_state_export(o, &n, &names, &ts), 0);
        for (size_t j = 0; j < n; j++) /* Adagrad's state exists from the start; only its step says "never" */
            if (strncmp(names[j], "1.", 2))
                cr_assert(k == SR_OPTIM_ADAGRAD && (strcmp(names[j], "0.step") || sr_tensor_item(ts[j]) == 0),
                          "%s has state %s for a parameter that never had a gradient",
                          sr_optim_kind_name((sr_optim_kind)k), names[j]);
        sr_optim_state_free(n, names, ts);
        sr_optim_destroy(o);
        unref_all((sr_tensor *[]){p[0], p[1], g1}, 3);
    }
}

Test(optim, mismatched_grads_change_nothing)
{
    sr_tensor *p[2] = {tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), 0), tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, 2, 3), 0)};
    sr_tensor *good = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 1), 0);
    sr_tensor *wrong_shape = sr_zeros(SR_F64, 1, SHAPE(2), 0), *wrong_dtype = sr_zeros(SR_F32, 1, SHAPE(3), 0);
    sr_optim *o = adam_over(p, 2);
    cr_assert_eq(sr_optim_step_grads(o, (sr_tensor *[]){good, wrong_shape}), -EINVAL);
    tu_expect_error("shape", "sr_optim_step_grads: gradient 1 has shape [2] but its parameter has shape [3]", NULL);
    cr_assert_eq(sr_optim_step_grads(o, (sr_tensor *[]){good, wrong_dtype}), -EINVAL);
    tu_expect_error("dtype", "gradient 1 has dtype f32 but its parameter has dtype f64", NULL);
    tu_expect(p[0], VALS(1, 2), 2, 0, 0, "checked before any update");
    cr_assert_eq(sr_optim_step_grads(o, NULL), -EINVAL);
    cr_assert_eq(sr_optim_step(NULL), -EINVAL);
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){p[0], p[1], good, wrong_shape, wrong_dtype}, 5);
}

Test(optim, zero_grad_zeroes_or_drops)
{
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    sr_tensor *g = tu_tensor(SR_F64, 1, SHAPE(2), VALS(3, 4), 0);
    sr_optim *o = adam_over(&p, 1);
    cr_assert_eq(sr_tensor_set_grad(p, g), 0);
    cr_assert_eq(sr_optim_zero_grad(o, false), 0);
    cr_assert_not_null(sr_tensor_grad(p));
    tu_expect(sr_tensor_grad(p), VALS(0, 0), 2, 0, 0, "zeroed in place");
    cr_assert_eq(sr_optim_zero_grad(o, true), 0);
    cr_assert_null(sr_tensor_grad(p));
    cr_assert_eq(sr_optim_nparams(o), 1);
    cr_assert_eq(sr_optim_param(o, 0), p);
    cr_assert_null(sr_optim_param(o, 1));
    cr_assert_eq(sr_optim_kind_of(o), SR_OPTIM_ADAM);
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){p, g}, 2);
}

/* The update writes the parameter's storage: views of it see the change. */
Test(optim, updates_parameters_in_place_through_views)
{
    sr_tensor *base = tu_tensor(SR_F64, 1, SHAPE(4), VALS(1, 2, 3, 4), 0);
    sr_tensor *p = sr_narrow(base, 0, 1, 2), *g = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, -1), 0);
    sr_optim_opts d;
    sr_optim *o;
    sr_optim_opts_default(SR_OPTIM_SGD, &d);
    d.lr = 0.5;
    cr_assert_eq(sr_optim_create(SR_OPTIM_SGD, &d, &p, 1, &o), 0);
    cr_assert_eq(sr_optim_step_grads(o, &g), 0);
    tu_expect(base, VALS(1, 1.5, 3.5, 4), 4, 0, 0, "base after a step on its view");
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){base, p, g}, 3);
}

/* ---- state import errors ---- */

Test(optim, state_import_checks_everything_first)
{
    sr_tensor *p[2] = {tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), 0), tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, 2, 3), 0)};
    sr_tensor *g[2] = {tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 1), 0), NULL};
    sr_tensor *z2 = sr_zeros(SR_F64, 1, SHAPE(2), 0), *z3 = sr_zeros(SR_F64, 1, SHAPE(3), 0);
    sr_tensor *one = sr_scalar_tensor(SR_F64, 1, 0), *two = sr_zeros(SR_F64, 1, SHAPE(2), 0);
    sr_optim *o = adam_over(p, 2);
    cr_assert_eq(sr_optim_step_grads(o, g), 0);
    static const struct {
        const char *names[3];
        int which[3]; /* 0 z2, 1 z3, 2 one, 3 two */
        const char *msg;
    } bad[] = {
        {{"0.step", "0.exp_avg", "0.bogus"}, {2, 0, 0}, "unknown state \"0.bogus\""},
        {{"0.step", "0.exp_avg", "0.max_exp_avg_sq"}, {2, 0, 0}, "unknown state \"0.max_exp_avg_sq\""},
        {{"7.step", "0.exp_avg", "0.exp_avg_sq"}, {2, 0, 0}, "names parameter 7 of 2"},
        {{"x.step", "0.exp_avg", "0.exp_avg_sq"}, {2, 0, 0}, "bad state name \"x.step\""},
        {{"0.step", "0.exp_avg", "0.exp_avg"}, {2, 0, 0}, "\"0.exp_avg\" appears twice"},
        {{"0.step", "0.exp_avg", "1.exp_avg_sq"}, {2, 0, 1}, "parameter 0 has some of its state but not all"},
        {{"1.step", "1.exp_avg", "1.exp_avg_sq"}, {2, 0, 1},
         "\"1.exp_avg\" has shape [2] but parameter 1 has shape [3]"},
        {{"0.step", "0.exp_avg", "0.exp_avg_sq"}, {3, 0, 0}, "\"0.step\" has 2 elements, expected 1"},
    };
    sr_tensor *pool[] = {z2, z3, one, two};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        sr_tensor *ts[3] = {pool[bad[k].which[0]], pool[bad[k].which[1]], pool[bad[k].which[2]]};
        cr_assert_eq(sr_optim_state_import(o, 3, bad[k].names, ts), -EINVAL, "case %zu accepted", k);
        tu_expect_error(bad[k].msg, "sr_optim_state_import: Adam: ", bad[k].msg);
    }
    size_t n; /* the state survived every failed import */
    char **names;
    sr_tensor **ts;
    cr_assert_eq(sr_optim_state_export(o, &n, &names, &ts), 0);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(names[0], "0.step");
    cr_assert_eq(sr_tensor_item(ts[0]), 1.0);
    sr_optim_state_free(n, names, ts);
    cr_assert_eq(sr_optim_state_import(o, 0, NULL, NULL), 0, "empty import: back to the initial state");
    cr_assert_eq(sr_optim_state_export(o, &n, &names, &ts), 0);
    cr_assert_eq(n, 0);
    sr_optim_state_free(n, names, ts);
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){p[0], p[1], g[0], z2, z3, one, two}, 7);
}

/* ---- end to end ---- */

/* loss = sum((x - target)^2), with backward into x.grad. */
static double quadratic_loss(sr_tensor *x, sr_tensor *target)
{
    sr_tensor *d = sr_sub(x, target), *sq = sr_mul(d, d), *loss = sr_sum(sq);
    cr_assert(loss, "%s", sr_last_error());
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    double v = sr_tensor_item(loss);
    unref_all((sr_tensor *[]){d, sq, loss}, 3);
    return v;
}

Test(optim, adam_minimises_a_quadratic)
{
    sr_tensor *x = tu_tensor(SR_F32, 1, SHAPE(3), VALS(2, -3, 0.5), SR_REQUIRES_GRAD);
    sr_tensor *target = tu_tensor(SR_F32, 1, SHAPE(3), VALS(-1, 1, 0.25), 0);
    sr_optim *o = adam_over(&x, 1);
    double first = 0, last = 0;
    for (int it = 0; it < 300; it++) {
        cr_assert_eq(sr_optim_zero_grad(o, true), 0);
        last = quadratic_loss(x, target);
        if (it == 0)
            first = last;
        cr_assert_eq(sr_optim_step(o), 0, "%s", sr_last_error());
    }
    cr_assert(last < 1e-3 * first, "loss went from %g to %g", first, last);
    tu_expect(x, VALS(-1, 1, 0.25), 3, 0.05, 0, "x near the minimum");
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){x, target}, 2);
}

/* Exported state is a snapshot: the next step does not change it. */
Test(optim, exported_state_is_a_snapshot)
{
    sr_tensor *p = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), 0), *g = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 1), 0);
    sr_optim *o = adam_over(&p, 1);
    cr_assert_eq(sr_optim_step_grads(o, &g), 0);
    size_t n;
    char **names;
    sr_tensor **ts;
    cr_assert_eq(sr_optim_state_export(o, &n, &names, &ts), 0);
    cr_assert_eq(sr_optim_step_grads(o, &g), 0);
    cr_assert_str_eq(names[0], "0.step");
    cr_assert_eq(sr_tensor_item(ts[0]), 1.0, "the exported step count moved with the optimizer");
    tu_expect(ts[1], VALS(0.1, 0.1), 2, 1e-15, 0, "exp_avg as exported after step 1");
    sr_optim_state_free(n, names, ts);
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){p, g}, 2);
}

/* Rprop f32: grad * prev = 1e-60 underflows to 0 in f32, as torch computes
 * it, so the step size stays (torch 1.13: p = 0.98, step_size = 0.01). */
Test(optim, rprop_f32_product_underflows_like_torch)
{
    sr_tensor *p = tu_tensor(SR_F32, 1, SHAPE(1), VALS(1), 0), *g = tu_tensor(SR_F32, 1, SHAPE(1), VALS(1e-30), 0);
    sr_optim *o;
    cr_assert_eq(sr_optim_create(SR_OPTIM_RPROP, NULL, &p, 1, &o), 0);
    cr_assert_eq(sr_optim_step_grads(o, &g), 0);
    cr_assert_eq(sr_optim_step_grads(o, &g), 0);
    tu_expect(p, VALS(0.9800000190734863), 1, 0, 0, "p after two steps");
    sr_optim_destroy(o);
    unref_all((sr_tensor *[]){p, g}, 2);
}

/* ---- Adam's f32 loops against a plain double loop ---- */

#define FN 42   /* elements: [6, 7], not a multiple of a vector */
#define FSTEPS 4

static double f32_param0(int j) { return (double)(float)(2 * sin(0.37 * j + 0.1)); }

/* Large gradients first, then small ones, so that amsgrad's maximum differs
 * from exp_avg_sq. */
static double f32_grad_at(int s, int j) { return (double)(float)((s == 0 ? 3.0 : 0.4) * cos(0.7 * j + s)); }

/* torch's Adam / AdamW update (1.13, single tensor) in double, per element. */
static void adam_reference(const sr_optim_opts *op, bool adamw, double *p)
{
    double m[FN] = {0}, v[FN] = {0}, mx[FN] = {0};
    for (int s = 0; s < FSTEPS; s++) {
        double step = s + 1, b1 = op->betas[0], b2 = op->betas[1];
        double step_size = op->lr / (1 - pow(b1, step)), bc2_sqrt = sqrt(1 - pow(b2, step));
        for (int j = 0; j < FN; j++) {
            double g = op->maximize ? -f32_grad_at(s, j) : f32_grad_at(s, j);
            if (adamw)
                p[j] *= 1 - op->lr * op->weight_decay;
            else
                g += op->weight_decay * p[j];
            m[j] = b1 * m[j] + (1 - b1) * g;
            v[j] = b2 * v[j] + (1 - b2) * g * g;
            mx[j] = fmax(mx[j], v[j]);
            p[j] -= step_size * m[j] / (sqrt(op->amsgrad ? mx[j] : v[j]) / bc2_sqrt + op->eps);
        }
    }
}

/* Every combination of Adam / AdamW, weight decay, amsgrad and maximize, over
 * a few steps with betas, eps and lr large enough that each term shows. */
Test(optim, adam_f32_matches_a_double_loop)
{
    double p0[FN], gv[FN];
    for (int j = 0; j < FN; j++)
        p0[j] = f32_param0(j);
    for (int c = 0; c < 16; c++) {
        bool adamw = c & 1;
        sr_optim_opts op;
        cr_assert_eq(sr_optim_opts_default(adamw ? SR_OPTIM_ADAMW : SR_OPTIM_ADAM, &op), 0);
        op.lr = 0.05, op.betas[0] = 0.8, op.betas[1] = 0.9, op.eps = 1e-3;
        op.weight_decay = c & 2 ? 0.1 : 0, op.amsgrad = c & 4, op.maximize = c & 8;
        sr_tensor *p = tu_tensor(SR_F32, 2, SHAPE(6, 7), p0, 0);
        sr_optim *o;
        cr_assert_eq(sr_optim_create(adamw ? SR_OPTIM_ADAMW : SR_OPTIM_ADAM, &op, &p, 1, &o), 0, "%s",
                     sr_last_error());
        for (int s = 0; s < FSTEPS; s++) {
            for (int j = 0; j < FN; j++)
                gv[j] = f32_grad_at(s, j);
            sr_tensor *g = tu_tensor(SR_F32, 2, SHAPE(6, 7), gv, 0);
            cr_assert_eq(sr_optim_step_grads(o, &g), 0, "%s", sr_last_error());
            sr_tensor_unref(g);
        }
        double want[FN];
        memcpy(want, p0, sizeof(want));
        adam_reference(sr_optim_options(o), adamw, want); /* the options in force (AdamW's default wd) */
        char what[128];
        snprintf(what, sizeof(what), "%s wd %g amsgrad %d maximize %d after %d steps", adamw ? "AdamW" : "Adam",
                 sr_optim_options(o)->weight_decay, op.amsgrad, op.maximize, FSTEPS);
        tu_expect(p, want, FN, 1e-6, 1e-6, what);
        sr_optim_destroy(o);
        sr_tensor_unref(p);
    }
}
