/* SPDX-License-Identifier: MIT */
/* Tensors: factories, views, copy-on-write, descriptors, in-place ops, errors. */
#include <errno.h>
#include <stdlib.h>

#include "heap.h"
#include "desc.h"
#include "tensor_impl.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(cow);
LEAK_CHECKED_SUITE(desc);
LEAK_CHECKED_SUITE(errors);
LEAK_CHECKED_SUITE(factory);
LEAK_CHECKED_SUITE(i64);
LEAK_CHECKED_SUITE(inplace);
LEAK_CHECKED_SUITE(view);

Test(factory, zeros_ones_full_eye_arange)
{
    sr_tensor *z = sr_zeros(SR_F32, 2, SHAPE(2, 3), 0), *o = sr_ones(SR_I64, 1, SHAPE(4), 0);
    sr_tensor *f = sr_full(SR_F64, 2, SHAPE(1, 2), -2.5, 0), *e = sr_eye(SR_F64, 2, 3, 0);
    tu_expect(z, VALS(0, 0, 0, 0, 0, 0), 6, 0, 0, "zeros");
    tu_expect(o, VALS(1, 1, 1, 1), 4, 0, 0, "ones");
    tu_expect(f, VALS(-2.5, -2.5), 2, 0, 0, "full");
    tu_expect(e, VALS(1, 0, 0, 0, 1, 0), 6, 0, 0, "eye");
    cr_assert_eq(sr_tensor_dtype(z), SR_F32);
    cr_assert_eq(sr_tensor_dtype(o), SR_I64);
    sr_tensor *a = sr_arange(SR_F64, 1, 2, 0.25, 0), *b = sr_arange(SR_I64, 5, 0, -2, 0);
    tu_expect(a, VALS(1, 1.25, 1.5, 1.75), 4, 0, 0, "arange");
    tu_expect(b, VALS(5, 3, 1), 3, 0, 0, "arange down");
    sr_tensor *s = sr_scalar_tensor(SR_F32, 3.5, 0);
    tu_expect_shape(s, 0, NULL, "scalar");
    cr_assert_eq(sr_tensor_item(s), 3.5);
    sr_tensor *ts[] = {z, o, f, e, a, b, s};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        sr_tensor_unref(ts[i]);
}

Test(factory, from_data_copies)
{
    double d[3] = {1, 2, 3};
    sr_tensor *t = sr_from_data(SR_F64, 1, SHAPE(3), d, 0);
    d[0] = 100;
    tu_expect(t, VALS(1, 2, 3), 3, 0, 0, "from_data");
    sr_tensor_unref(t);
}

Test(factory, rand_is_seeded_and_in_range)
{
    double x[64], y[64];
    sr_manual_seed(7);
    sr_tensor *a = sr_rand(SR_F64, 1, SHAPE(64), 0);
    sr_manual_seed(7);
    sr_tensor *b = sr_rand(SR_F64, 1, SHAPE(64), 0);
    sr_tensor *c = sr_rand(SR_F64, 1, SHAPE(64), 0);
    sr_tensor_to_f64(a, x, 64);
    sr_tensor_to_f64(b, y, 64);
    cr_assert_arr_eq(x, y, sizeof(x), "same seed, same values");
    for (int i = 0; i < 64; i++)
        cr_assert(x[i] >= 0 && x[i] < 1, "rand value %g out of [0, 1)", x[i]);
    sr_tensor_to_f64(c, y, 64);
    cr_assert(memcmp(x, y, sizeof(x)), "the stream moves on");
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    sr_tensor_unref(c);
}

Test(factory, randn_moments)
{
    enum { N = 20000 };
    static double x[N];
    sr_manual_seed(11);
    sr_tensor *t = sr_randn(SR_F32, 2, SHAPE(100, 200), 0);
    cr_assert_eq(sr_tensor_to_f64(t, x, N), 0);
    double m = 0, v = 0;
    for (int i = 0; i < N; i++)
        m += x[i] / N;
    for (int i = 0; i < N; i++)
        v += (x[i] - m) * (x[i] - m) / N;
    cr_assert(fabs(m) < 0.03 && fabs(v - 1) < 0.05, "randn mean %g variance %g", m, v);
    sr_tensor_unref(t);
}

Test(factory, bad_arguments)
{
    cr_assert_null(sr_zeros(SR_F32, 9, SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1), 0));
    tu_expect_error("ndim", "sr_zeros", "ndim 9");
    cr_assert_null(sr_ones(SR_F64, 2, SHAPE(2, -1), 0));
    tu_expect_error("negative", "sr_ones", "negative size -1");
    cr_assert_null(sr_zeros((sr_dtype)9, 1, SHAPE(2), 0));
    tu_expect_error("dtype", "unknown dtype 9", NULL);
    cr_assert_null(sr_ones(SR_I64, 1, SHAPE(2), SR_REQUIRES_GRAD));
    tu_expect_error("i64 grad", "floating point", NULL);
    cr_assert_null(sr_rand(SR_I64, 1, SHAPE(2), 0));
    cr_assert(isnan(sr_tensor_item(NULL)));
}

Test(view, transpose_and_narrow_alias_their_base)
{
    sr_tensor *a = tu_tensor(SR_F64, 2, SHAPE(2, 3), VALS(0, 1, 2, 3, 4, 5), 0);
    sr_tensor *t = sr_t(a);
    tu_expect_shape(t, 2, SHAPE(3, 2), "t");
    tu_expect(t, VALS(0, 3, 1, 4, 2, 5), 6, 0, 0, "t values");
    cr_assert(sr_tensor_shares_storage(a, t));
    cr_assert(!sr_tensor_is_contiguous(t));
    sr_tensor *col = sr_narrow(t, 1, 1, 1); /* a[1, :] seen as a column */
    cr_assert_eq(sr_fill_(col, 9), 0, "%s", sr_last_error());
    tu_expect(a, VALS(0, 1, 2, 9, 9, 9), 6, 0, 0, "write through a view reaches the base");
    sr_tensor_unref(col);
    sr_tensor_unref(t);
    sr_tensor_unref(a);
}

Test(view, view_reshape_and_errors)
{
    sr_tensor *a = tu_tensor(SR_F64, 2, SHAPE(3, 4), VALS(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), 0);
    sr_tensor *v = sr_view(a, 3, SHAPE(2, -1, 3));
    tu_expect_shape(v, 3, SHAPE(2, 2, 3), "view -1");
    cr_assert(sr_tensor_shares_storage(a, v));
    sr_tensor *t = sr_t(a);
    cr_assert_null(sr_view(t, 1, SHAPE(12)));
    tu_expect_error("view of a transpose", "sr_view", "Use sr_reshape");
    sr_tensor *r = sr_reshape(t, 1, SHAPE(12));
    cr_assert(!sr_tensor_shares_storage(r, a), "reshape of a transpose copies");
    tu_expect(r, VALS(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11), 12, 0, 0, "reshape copy");
    sr_tensor *ok = sr_reshape(a, 2, SHAPE(6, 2));
    cr_assert(sr_tensor_shares_storage(ok, a), "reshape of a contiguous tensor is a view");
    cr_assert_null(sr_reshape(a, 2, SHAPE(5, -1)));
    tu_expect_error("bad reshape", "sr_reshape", "invalid for input of size 12");
    sr_tensor *ts[] = {a, v, t, r, ok};
    for (int i = 0; i < 5; i++)
        sr_tensor_unref(ts[i]);
}

Test(view, squeeze_unsqueeze_expand_permute)
{
    sr_tensor *a = tu_tensor(SR_F64, 2, SHAPE(3, 1), VALS(1, 2, 3), 0);
    sr_tensor *e = sr_expand(a, 3, SHAPE(2, -1, 4));
    tu_expect_shape(e, 3, SHAPE(2, 3, 4), "expand");
    cr_assert_eq(sr_tensor_strides(e)[0], 0);
    cr_assert_eq(sr_tensor_strides(e)[2], 0);
    cr_assert_null(sr_expand(a, 2, SHAPE(2, 2)));
    tu_expect_error("expand", "sr_expand", "[3, 1]");
    sr_tensor *s = sr_squeeze(a, 1), *u = sr_unsqueeze(s, 0), *p = sr_permute(e, (const int[]){2, 0, 1});
    tu_expect_shape(s, 1, SHAPE(3), "squeeze");
    tu_expect_shape(u, 2, SHAPE(1, 3), "unsqueeze");
    tu_expect_shape(p, 3, SHAPE(4, 2, 3), "permute");
    sr_tensor *ts[] = {a, e, s, u, p};
    for (int i = 0; i < 5; i++)
        sr_tensor_unref(ts[i]);
}

Test(view, split_and_chunk_pieces)
{
    sr_tensor *a = sr_arange(SR_F64, 0, 7, 1, 0), *pieces[8];
    cr_assert_eq(sr_split(a, 3, 0, NULL), 3);
    int n = sr_chunk(a, 3, 0, pieces);
    cr_assert_eq(n, 3, "chunk(7, 3): %d pieces", n);
    tu_expect(pieces[2], VALS(6), 1, 0, 0, "last chunk");
    for (int i = 0; i < n; i++)
        sr_tensor_unref(pieces[i]);
    sr_tensor *b = sr_arange(SR_F64, 0, 6, 1, 0);
    n = sr_chunk(b, 4, 0, pieces); /* ceil(6/4) = 2 per piece: 3 pieces, as torch.chunk */
    cr_assert_eq(n, 3);
    cr_assert(sr_tensor_shares_storage(pieces[1], b));
    for (int i = 0; i < n; i++)
        sr_tensor_unref(pieces[i]);
    cr_assert_eq(sr_chunk(b, 0, 0, pieces), -EINVAL);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
}

Test(view, to_f64_reads_any_layout_and_dtype)
{
    sr_tensor *a = tu_tensor(SR_F32, 2, SHAPE(2, 3), VALS(1, 2, 3, 4, 5, 6), 0);
    sr_tensor *t = sr_t(a);
    double out[6];
    cr_assert_eq(sr_tensor_to_f64(t, out, 6), 0);
    cr_assert_arr_eq(out, (VALS(1, 4, 2, 5, 3, 6)), sizeof(out));
    cr_assert_eq(sr_tensor_to_f64(t, out, 5), -EINVAL);
    sr_tensor_unref(t);
    sr_tensor_unref(a);
}

/* A second holder of the block, as a message in flight or another worker:
 * one more storage object adopting one more block reference. */
static sr_tensor *second_holder(sr_tensor *t)
{
    struct sr_storage *s = sr__storage_new(sr__block_ref(t->storage->block));
    sr_tensor *u = sr__tensor_wrap(s, t->dtype, t->ndim, t->shape, t->strides, t->offset);
    sr__storage_unref(s);
    return u;
}

Test(cow, write_with_two_holders_copies_first)
{
    sr_tensor *t = sr_ones(SR_F64, 1, SHAPE(4), 0);
    sr_tensor *u = second_holder(t);
    sr_block *shared = t->storage->block;
    cr_assert_eq(sr__block_refcount(shared), 2);
    cr_assert_eq(sr_add_scalar_(t, 1), 0, "%s", sr_last_error());
    cr_assert_neq(t->storage->block, shared, "the writer moved to a private copy");
    tu_expect(t, VALS(2, 2, 2, 2), 4, 0, 0, "writer sees its write");
    tu_expect(u, VALS(1, 1, 1, 1), 4, 0, 0, "the other holder does not");
    cr_assert_eq(sr__block_refcount(shared), 1);
    cr_assert_eq(sr_fill_(u, 5), 0);
    cr_assert_eq(u->storage->block, shared, "a sole holder writes in place");
    tu_expect(t, VALS(2, 2, 2, 2), 4, 0, 0, "and the first one does not see that");
    sr_tensor_unref(t);
    sr_tensor_unref(u);
}

Test(cow, local_views_still_alias_after_a_copy)
{
    sr_tensor *t = sr_zeros(SR_F32, 2, SHAPE(2, 2), 0);
    sr_tensor *row = sr_narrow(t, 0, 1, 1);
    sr_tensor *other = second_holder(t);
    cr_assert_eq(sr_fill_(row, 7), 0);
    tu_expect(t, VALS(0, 0, 7, 7), 4, 0, 0, "the base sees the view's write");
    tu_expect(other, VALS(0, 0, 0, 0), 4, 0, 0, "the other holder keeps the old values");
    cr_assert_eq(t->storage, row->storage);
    float *p = sr_tensor_mutable_data(t); /* sole holder now: no copy */
    cr_assert(p);
    p[0] = 3;
    tu_expect(row, VALS(7, 7), 2, 0, 0, "row");
    tu_expect(t, VALS(3, 0, 7, 7), 4, 0, 0, "mutable_data writes in place");
    sr_tensor_unref(row);
    sr_tensor_unref(t);
    sr_tensor_unref(other);
}

Test(cow, gradient_accumulation_copies_a_shared_grad)
{
    sr_tensor *w = sr_ones(SR_F64, 1, SHAPE(3), SR_REQUIRES_GRAD);
    sr_tensor *loss = sr_sum(w);
    cr_assert_eq(sr_backward(loss, true), 0, "%s", sr_last_error());
    sr_tensor *sent = second_holder(sr_tensor_grad(w)); /* e.g. the grad went to another worker */
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(w), VALS(2, 2, 2), 3, 0, 0, "accumulated");
    tu_expect(sent, VALS(1, 1, 1), 3, 0, 0, "the shared copy is untouched");
    sr_tensor_unref(sent);
    sr_tensor_unref(loss);
    sr_tensor_unref(w);
}

Test(inplace, arithmetic_and_broadcast)
{
    sr_tensor *t = tu_tensor(SR_F64, 2, SHAPE(2, 2), VALS(1, 2, 3, 4), 0);
    sr_tensor *r = tu_tensor(SR_F64, 1, SHAPE(2), VALS(10, 20), 0);
    cr_assert_eq(sr_add_(t, r, -0.5), 0);
    tu_expect(t, VALS(-4, -8, -2, -6), 4, 0, 0, "add_ alpha");
    cr_assert_eq(sr_mul_(t, r), 0);
    tu_expect(t, VALS(-40, -160, -20, -120), 4, 0, 0, "mul_");
    cr_assert_eq(sr_mul_scalar_(t, 0.5), 0);
    cr_assert_eq(sr_add_scalar_(t, 100), 0);
    tu_expect(t, VALS(80, 20, 90, 40), 4, 0, 0, "scalar_");
    cr_assert_eq(sr_addcmul_(t, r, r, 0.01), 0);
    tu_expect(t, VALS(81, 24, 91, 44), 4, 0, 0, "addcmul_");
    cr_assert_eq(sr_addcdiv_(t, r, r, 2), 0);
    tu_expect(t, VALS(83, 26, 93, 46), 4, 0, 0, "addcdiv_");
    cr_assert_eq(sr_add_(r, t, 1), -EINVAL, "a [2, 2] operand cannot update a [2] tensor");
    tu_expect_error("add_", "sr_add_", "shape [2, 2] cannot be broadcast to [2]");
    sr_tensor *i = sr_zeros(SR_I64, 1, SHAPE(2), 0);
    cr_assert_eq(sr_fill_(i, 0.5), -EINVAL);
    cr_assert_eq(sr_copy_(i, r), 0, "copy_ converts dtypes");
    tu_expect(i, VALS(10, 20), 2, 0, 0, "copy_");
    sr_tensor_unref(i);
    sr_tensor_unref(t);
    sr_tensor_unref(r);
}

Test(inplace, leaf_requiring_grad_only_under_no_grad)
{
    sr_tensor *w = sr_ones(SR_F32, 1, SHAPE(2), SR_REQUIRES_GRAD);
    cr_assert_eq(sr_mul_scalar_(w, 2), -EPERM);
    tu_expect_error("leaf", "sr_mul_scalar_", "a leaf Variable that requires grad");
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_mul_scalar_(w, 2), 0, "%s", sr_last_error());
    sr_no_grad_exit(prev);
    cr_assert(sr_is_grad_enabled());
    tu_expect(w, VALS(2, 2), 2, 0, 0, "updated under no_grad");
    sr_tensor_unref(w);
}

Test(i64, integer_arithmetic_is_exact)
{
    int64_t big[2] = {((int64_t)1 << 60) + 1, 3};
    sr_tensor *a = sr_from_data(SR_I64, 1, SHAPE(2), big, 0);
    sr_tensor *s = sr_add(a, a), *m = sr_mul_scalar(a, 2), *n = sr_neg(a), *sum = sr_sum(a);
    const int64_t *sp = sr_tensor_data(s), *mp = sr_tensor_data(m), *np = sr_tensor_data(n);
    cr_assert_eq(sp[0], ((int64_t)1 << 61) + 2);
    cr_assert_eq(mp[0], ((int64_t)1 << 61) + 2);
    cr_assert_eq(np[0], -(((int64_t)1 << 60) + 1));
    cr_assert_eq(*(const int64_t *)sr_tensor_data(sum), ((int64_t)1 << 60) + 4);
    cr_assert_null(sr_exp(a));
    tu_expect_error("exp i64", "sr_exp", "i64");
    cr_assert_null(sr_mul_scalar(a, 0.5));
    tu_expect_error("i64 scalar", "not an integer", NULL);
    sr_tensor *ts[] = {a, s, m, n, sum};
    for (int i = 0; i < 5; i++)
        sr_tensor_unref(ts[i]);
}

Test(errors, ops_name_themselves_and_both_shapes)
{
    sr_tensor *a = sr_ones(SR_F32, 2, SHAPE(2, 3), 0), *b = sr_ones(SR_F32, 1, SHAPE(4), 0);
    sr_tensor *d = sr_ones(SR_F64, 2, SHAPE(2, 3), 0);
    cr_assert_null(sr_add(a, b));
    cr_assert_str_eq(sr_last_error(), "sr_add: shapes [2, 3] and [4] cannot be broadcast");
    cr_assert_null(sr_mul(a, d));
    cr_assert_str_eq(sr_last_error(), "sr_mul: dtypes f32 and f64 do not match");
    cr_assert_null(sr_mm(a, a));
    cr_assert_str_eq(sr_last_error(), "sr_mm: shapes [2, 3] and [2, 3] cannot be multiplied");
    cr_assert_null(sr_matmul(a, b));
    cr_assert_str_eq(sr_last_error(), "sr_matmul: shapes [2, 3] and [4] cannot be multiplied");
    cr_assert_null(sr_bmm(a, a));
    tu_expect_error("bmm", "sr_bmm: expected 3-D tensors", "[2, 3]");
    cr_assert_null(sr_cat((sr_tensor *[]){a, d}, 2, 0));
    tu_expect_error("cat", "sr_cat", "dtypes f32 and f64");
    cr_assert_null(sr_sum_dim(a, 2, false));
    tu_expect_error("dim", "sr_sum_dim", "dimension 2 is out of range");
    /* a NULL operand (an earlier failure) propagates and keeps the first error */
    cr_assert_null(sr_sum(sr_add(a, b)));
    cr_assert_str_eq(sr_last_error(), "sr_add: shapes [2, 3] and [4] cannot be broadcast");
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    sr_tensor_unref(d);
}

static struct sr_tensor_desc good_desc(void)
{
    struct sr_tensor_desc d = {.magic = SR_TENSOR_DESC_MAGIC, .dtype = SR_F32, .ndim = 2, .offset = 1, .block = 64};
    d.shape[0] = 2, d.shape[1] = 3;
    d.strides[0] = 3, d.strides[1] = 1;
    return d;
}

Test(desc, private_storage_cannot_travel)
{
    sr_tensor *t = sr_ones(SR_F32, 1, SHAPE(2), 0);
    struct sr_tensor_desc d;
    cr_assert_eq(sr__tensor_to_desc(t, &d), -EINVAL);
    tu_expect_error("to_desc", "sr__tensor_to_desc", "shared heap");
    cr_assert_eq(sr__block_refcount(t->storage->block), 1, "a failed to_desc takes no reference");
    sr_tensor_unref(t);
}

Test(desc, validation_rejects_every_malformed_field)
{
    struct sr_tensor_desc d = good_desc();
    cr_assert_eq(sr__tensor_desc_check(&d, 7 * 4), 0, "%s", sr_last_error());
    cr_assert_eq(sr__tensor_desc_check(&d, 6 * 4), -EINVAL, "one element short");
    tu_expect_error("extent", "sr__tensor_from_desc", "reaches past its 24-byte block");
    struct {
        const char *what, *msg;
    } bad[] = {
        {"magic", "bad magic"},          {"dtype", "unknown dtype"},         {"ndim", "ndim 9 exceeds 8"},
        {"shape", "negative size"},      {"stride", "stride 1 is negative"}, {"offset", "offset -1 is negative"},
        {"past ndim", "past ndim"},      {"flags", "unknown flags"},         {"grad i64", "cannot require grad"},
        {"overflow", "reaches past"},
        /* a dimension of size 1: the extent never multiplies its stride */
        {"byte stride", "stride 0 (4611686018427387903 elements of 4 bytes) overflows a byte offset"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        d = good_desc();
        switch (i) {
        case 0: d.magic = 1; break;
        case 1: d.dtype = 7; break;
        case 2: d.ndim = 9; break;
        case 3: d.shape[1] = -3; break;
        case 4: d.strides[1] = -1; break;
        case 5: d.offset = -1; break;
        case 6: d.shape[5] = 2; break;
        case 7: d.flags = 0x80; break;
        case 8: d.dtype = SR_I64, d.flags = SR_DESC_REQUIRES_GRAD; break;
        case 9: d.strides[0] = INT64_MAX / 8; break;
        case 10: d.shape[0] = 1, d.strides[0] = INT64_MAX / 2; break;
        }
        cr_assert_eq(sr__tensor_desc_check(&d, 1 << 20), -EINVAL, "%s accepted", bad[i].what);
        tu_expect_error(bad[i].what, bad[i].msg, NULL);
        sr_tensor *t = NULL;
        cr_assert_eq(sr__tensor_from_desc(&d, &t), -EINVAL, "%s accepted by from_desc", bad[i].what);
        cr_assert_null(t);
    }
    d = good_desc();
    sr_tensor *t = NULL;
    cr_assert_eq(sr__tensor_from_desc(&d, &t), -EINVAL, "no shared heap: the offset names no block");
    tu_expect_error("no heap", "sr__tensor_from_desc: block offset 64", NULL);
    cr_assert_null(t);
}
