/* SPDX-License-Identifier: MIT */
/* nn.h module state (state_dict / load_state_dict) and checkpoint.h's save
 * and load of a module by name: names, ownership, the checks before any copy
 * and the errors naming the parameter. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shmrpc/checkpoint.h"
#include "shmrpc/nn.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(module_state);

/* A small CNN: conv(1->4, 3) relu pool flatten linear(4*3*3 -> 5). */
static sr_module *cnn(uint64_t seed, int64_t channels)
{
    sr_layer_spec l[] = {SR_CONV2D(1, channels, 3, 1, 0), SR_RELU(), SR_MAX_POOL2D(2, 2), SR_FLATTEN(),
                         SR_LINEAR(channels * 9, 5)};
    sr_generator g;
    sr_generator_init(&g, seed);
    sr_module *m = NULL;
    cr_assert_eq(sr_sequential_create(l, 5, SR_F32, &g, &m), 0, "%s", sr_last_error());
    return m;
}

static bool same_values(sr_tensor *a, sr_tensor *b)
{
    size_t n = sr_tensor_numel(a);
    if (n != sr_tensor_numel(b))
        return false;
    double *x = calloc(n, sizeof(*x)), *y = calloc(n, sizeof(*y));
    cr_assert(x && y);
    cr_assert_eq(sr_tensor_to_f64(a, x, n), 0);
    cr_assert_eq(sr_tensor_to_f64(b, y, n), 0);
    bool same = !memcmp(x, y, n * sizeof(*x));
    free(x), free(y);
    return same;
}

static bool same_params(sr_module *a, sr_module *b)
{
    size_t na, nb;
    sr_tensor *const *pa, *const *pb;
    sr_module_params(a, &na, &pa, NULL);
    sr_module_params(b, &nb, &pb, NULL);
    bool same = na == nb;
    for (size_t i = 0; same && i < na; i++)
        same = same_values(pa[i], pb[i]);
    return same;
}

Test(module_state, names_with_prefix_and_references_that_outlive_the_module)
{
    sr_module *m = cnn(1, 4);
    size_t n;
    char **names;
    sr_tensor **ts;
    cr_assert_eq(sr_module_state_dict(m, "stage0.", &n, &names, &ts), 0, "%s", sr_last_error());
    cr_assert_eq(n, 4);
    const char *want[] = {"stage0.0.weight", "stage0.0.bias", "stage0.4.weight", "stage0.4.bias"};
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(names[i], want[i]);
        cr_assert_eq(ts[i], sr_module_param(m, want[i] + strlen("stage0.")), "the parameter itself, not a copy");
    }
    sr_module_destroy(m);
    cr_assert_eq(sr_tensor_shape(ts[0])[0], 4, "the references outlive the module");
    sr_module_state_free(n, names, ts);
    sr_module_state_free(0, NULL, NULL);
}

Test(module_state, load_copies_a_state_into_another_module)
{
    sr_module *a = cnn(1, 4), *b = cnn(2, 4);
    cr_assert(!same_params(a, b), "two seeds, two initialisations");
    size_t n;
    char **names;
    sr_tensor **ts;
    cr_assert_eq(sr_module_state_dict(a, NULL, &n, &names, &ts), 0);
    cr_assert_eq(sr_module_load_state_dict(b, n, (const char *const *)names, ts, true), 0, "%s", sr_last_error());
    cr_assert(same_params(a, b));
    cr_assert(sr_tensor_requires_grad(sr_module_param(b, "0.weight")), "still a parameter");
    cr_assert(sr_tensor_is_leaf(sr_module_param(b, "0.weight")), "loaded without history");
    sr_module_state_free(n, names, ts);
    sr_module_destroy(a);
    sr_module_destroy(b);
}

/* Each bad state is refused before anything is copied, naming the key. */
static void expect_refused(sr_module *m, size_t n, const char *const *names, sr_tensor *const *ts, bool strict,
                           int code, const char *words)
{
    sr_module *before = cnn(3, 4);
    int rc = sr_module_load_state_dict(m, n, names, ts, strict);
    cr_assert_eq(rc, code, "got %d: %s", rc, sr_last_error());
    cr_assert(strstr(sr_last_error(), words), "'%s' lacks '%s'", sr_last_error(), words);
    cr_assert(same_params(m, before), "nothing copied");
    sr_module_destroy(before);
}

Test(module_state, load_checks_names_shapes_and_dtypes_first)
{
    sr_module *m = cnn(3, 4), *wide = cnn(4, 8);
    sr_tensor *const *p, *const *pw;
    const char *const *names;
    sr_module_params(m, NULL, &p, &names);
    sr_module_params(wide, NULL, &pw, NULL);
    sr_tensor *f64 = sr_zeros(SR_F64, 1, (const int64_t[]){4}, 0);
    /* the first entry fits, the second not: the first must not be copied */
    sr_module *other = cnn(5, 4);
    sr_tensor *const *po;
    sr_module_params(other, NULL, &po, NULL);
    sr_tensor *shape_bad[] = {po[2], pw[0]};
    const char *n01[] = {"4.weight", "0.weight"}, *n03[] = {"4.bias", "0.bias"};
    expect_refused(m, 2, n01, shape_bad, false, -EINVAL, "'0.weight' has shape [8, 1, 3, 3] in the state");
    sr_tensor *zb = sr_zeros(SR_F32, 1, (const int64_t[]){5}, 0);
    sr_tensor *dtype_bad2[] = {zb, f64};
    expect_refused(m, 2, n03, dtype_bad2, false, -EINVAL, "'0.bias' is f64 in the state, f32 in the module");
    const char *unexpected[] = {"0.weight", "7.weight"};
    sr_tensor *two[] = {p[0], p[2]};
    expect_refused(m, 2, unexpected, two, false, -ENOENT, "unexpected key '7.weight'");
    const char *twice[] = {"0.bias", "0.bias"};
    sr_tensor *b2[] = {p[1], p[1]};
    expect_refused(m, 2, twice, b2, false, -EINVAL, "'0.bias' is given twice");
    expect_refused(m, 2, names, p, true, -ENOENT, "missing key '4.weight'");
    cr_assert_eq(sr_module_load_state_dict(m, 2, names, p, false), 0, "not strict: a part may be loaded");
    cr_assert_eq(sr_module_load_state_dict(NULL, 0, NULL, NULL, true), -EINVAL);
    sr_tensor_unref(f64);
    sr_tensor_unref(zb);
    sr_module_destroy(m);
    sr_module_destroy(wide);
    sr_module_destroy(other);
}

Test(module_state, checkpoint_saves_and_loads_a_module_by_name)
{
    char dir[] = "/tmp/sr-mstate-XXXXXX", path[64];
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof(path), "%s/m.ckpt", dir);
    sr_module *a = cnn(1, 4), *b = cnn(2, 4), *wide = cnn(2, 8);
    const char *meta[] = {"step"};
    int64_t step = 7;
    cr_assert_eq(sr_checkpoint_save_module(path, "enc.", a, 1, meta, &step), 0, "%s", sr_last_error());
    sr_checkpoint *c = NULL;
    cr_assert_eq(sr_checkpoint_load(path, &c), 0, "%s", sr_last_error());
    cr_assert_str_eq(sr_checkpoint_name(c, 0), "enc.0.weight");
    cr_assert_eq(sr_checkpoint_load_module(c, "dec.", b), -ENOENT, "another prefix names nothing");
    cr_assert(strstr(sr_last_error(), "'dec.0.weight'"), "%s", sr_last_error());
    int rc = sr_checkpoint_load_module(c, "enc.", wide);
    cr_assert_eq(rc, -EINVAL, "%s", sr_last_error());
    cr_assert(strstr(sr_last_error(), "'enc.0.weight' has shape [4, 1, 3, 3] in the checkpoint"), "%s",
              sr_last_error());
    cr_assert(!same_params(a, b));
    cr_assert_eq(sr_checkpoint_load_module(c, "enc.", b), 0, "%s", sr_last_error());
    cr_assert(same_params(a, b));
    sr_checkpoint_destroy(c);
    unlink(path);
    rmdir(dir);
    sr_module_destroy(a);
    sr_module_destroy(b);
    sr_module_destroy(wide);
}
