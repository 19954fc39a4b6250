/* SPDX-License-Identifier: MIT */
/* Values and their wire codec, in one process: round trips of every kind,
 * refcounts and object destructors, equality, the error paths with their
 * messages, and the decoder's robustness against truncated, corrupted and
 * random buffers (it must answer 0 or -EBADMSG, never crash, never leak: the
 * ASan build checks the last two). */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "heap.h"
#include "codec.h"
#include "inflight.h"
#include "value_internal.h"
#include "segment.h"
#include "shmrpc/rref.h"
#include "shmrpc/tensor.h"
#include "desc.h" /* sr__tensor_block */
#include "module.h" /* the module table, for codec_unwind */
#include "tensor_util.h"

LEAK_CHECKED_SUITE(value);

/* ---- helpers ------------------------------------------------------------- */

static uint8_t *encode(size_t n, sr_value *const *vals, int self_call, size_t *len)
{
    int64_t size = sr__codec_size(n, vals, self_call);
    cr_assert_gt(size, 0, "sr__codec_size: %s", sr_last_error());
    uint8_t *buf = malloc((size_t)size);
    cr_assert_not_null(buf);
    int64_t wrote = sr__codec_encode(n, vals, self_call, buf, (size_t)size);
    cr_assert_eq(wrote, size, "encode wrote %lld bytes, size said %lld (%s)", (long long)wrote,
                 (long long)size, sr_last_error());
    *len = (size_t)size;
    return buf;
}

/* Encode v alone, decode it, and hand back the decoded value (a new reference). */
static sr_value *round_trip(sr_value *v, int self_call)
{
    size_t len;
    uint8_t *buf = encode(1, &v, self_call, &len);
    sr_value *list = NULL;
    int rc = sr__codec_decode(buf, len, &list);
    cr_assert_eq(rc, 0, "decode of an encoded %s failed: %s", sr_kind_name(sr_value_type(v)), sr_last_error());
    free(buf);
    cr_assert_eq(sr_value_type(list), SR_KIND_LIST);
    cr_assert_eq(sr_value_list_len(list), 1);
    sr_value *out = sr_value_ref(sr_value_list_at(list, 0));
    sr_value_unref(list);
    return out;
}

static void assert_round_trips(sr_value *v)
{
    char repr[96];
    cr_assert_not_null(v, "constructor failed: %s", sr_last_error());
    sr_value *back = round_trip(v, 0);
    cr_assert(sr_value_equal(v, back), "%s did not survive the round trip (got %s)",
              sr__value_repr(v, repr, sizeof(repr)), sr__value_repr(back, (char[96]){0}, 96));
    sr_value_unref(back);
    sr_value_unref(v);
}

static int destroyed;
static void count_destroy(void *p) { (void)p; __atomic_fetch_add(&destroyed, 1, __ATOMIC_RELAXED); }

static void assert_error_mentions(const char *what)
{
    cr_assert(strstr(sr_last_error(), what), "expected the error to mention \"%s\", got \"%s\"", what,
              sr_last_error());
}

static void put32(uint8_t *p, uint32_t x)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

/* ---- round trips ----------------------------------------------------------- */

Test(value, scalars_round_trip)
{
    assert_round_trips(sr_none());
    assert_round_trips(sr_bool(true));
    assert_round_trips(sr_bool(false));
    const int64_t ints[] = {0, 1, -1, 42, INT64_MIN, INT64_MAX, (int64_t)0x0102030405060708};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        assert_round_trips(sr_int(ints[i]));
    const double ds[] = {0.0, 1.5, -1e300, DBL_MAX, DBL_MIN / 4, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof(ds) / sizeof(ds[0]); i++)
        assert_round_trips(sr_double(ds[i]));
}

Test(value, doubles_keep_their_exact_bits)
{
    const double ds[] = {-0.0, NAN, -NAN, DBL_MIN / 3, 0.1};
    for (size_t i = 0; i < sizeof(ds) / sizeof(ds[0]); i++) {
        sr_value *v = sr_double(ds[i]);
        sr_value *back = round_trip(v, 0);
        double a = sr_value_double(v), b = sr_value_double(back);
        cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0, "double %d changed its bits in transit", (int)i);
        sr_value_unref(back);
        sr_value_unref(v);
    }
}

Test(value, strings_and_bytes_round_trip)
{
    assert_round_trips(sr_str(""));
    assert_round_trips(sr_str("abc"));
    size_t big = 100000;
    char *s = malloc(big + 1);
    cr_assert_not_null(s);
    for (size_t i = 0; i < big; i++)
        s[i] = (char)('a' + i % 26);
    s[big] = 0;
    sr_value *v = sr_str(s);
    cr_assert_eq(strlen(sr_value_str(v)), big);
    assert_round_trips(v);
    free(s);

    uint8_t all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    v = sr_bytes(all, sizeof(all));
    size_t n = 0;
    cr_assert_eq(memcmp(sr_value_bytes(v, &n), all, sizeof(all)), 0);
    cr_assert_eq(n, sizeof(all));
    assert_round_trips(v);
    assert_round_trips(sr_bytes(NULL, 0));
}

static sr_value *nest(int depth, sr_value *leaf)
{
    sr_value *v = leaf;
    for (int i = 0; i < depth; i++) {
        sr_value *outer = sr_list(1, &v);
        cr_assert_not_null(outer, "nesting level %d: %s", i + 1, sr_last_error());
        sr_value_unref(v);
        v = outer;
    }
    return v;
}

Test(value, nested_lists_round_trip)
{
    sr_value *shared = sr_str("shared");
    sr_value *inner2[] = {sr_none(), sr_bool(true), shared};
    sr_value *l2 = sr_list(3, inner2);
    sr_value *empty = sr_list(0, NULL);
    sr_value *inner1[] = {sr_str("x"), empty, l2, shared};
    sr_value *l1 = sr_list(4, inner1);
    sr_value *top[] = {sr_int(1), l1, sr_bytes("\0\1", 2)};
    sr_value *list = sr_list(3, top);
    cr_assert_not_null(list, "%s", sr_last_error());
    for (int i = 0; i < 2; i++)
        sr_value_unref(inner2[i]);
    sr_value_unref(inner1[0]);
    sr_value_unref(empty);
    sr_value_unref(l2);
    sr_value_unref(l1);
    sr_value_unref(shared);
    sr_value_unref(top[0]);
    sr_value_unref(top[2]);
    cr_assert_eq(sr_value_list_len(sr_value_list_at(list, 1)), 4);
    assert_round_trips(list);

    /* The deepest nesting the codec carries. */
    assert_round_trips(nest(SR_CODEC_MAX_DEPTH, sr_int(7)));
}

Test(value, encoding_is_little_endian_and_exactly_sized)
{
    sr_value *vals[] = {sr_int(0x0102030405060708), sr_str("ab")};
    size_t len;
    uint8_t *buf = encode(2, vals, 0, &len);
    const uint8_t expect[] = {2, 0, 0, 0,                                  /* count */
                              SR_KIND_INT, 8, 7, 6, 5, 4, 3, 2, 1,          /* int64 LE */
                              SR_KIND_STR, 2, 0, 0, 0, 'a', 'b'};          /* u32 len, no NUL */
    cr_assert_eq(len, sizeof(expect));
    cr_assert_eq(memcmp(buf, expect, len), 0, "the wire layout changed");
    free(buf);
    for (int i = 0; i < 2; i++)
        sr_value_unref(vals[i]);
}

Test(value, empty_argument_list_round_trips)
{
    size_t len;
    uint8_t *buf = encode(0, NULL, 0, &len);
    cr_assert_eq(len, 4);
    sr_value *list = NULL;
    cr_assert_eq(sr__codec_decode(buf, len, &list), 0, "%s", sr_last_error());
    cr_assert_eq(sr_value_list_len(list), 0);
    sr_value_unref(list);
    free(buf);
}

/* ---- accessors, equality, repr -------------------------------------------- */

Test(value, accessors_answer_only_for_their_kind)
{
    sr_value *i = sr_int(5), *s = sr_str("five"), *d = sr_double(2.5);
    cr_assert_eq(sr_value_int(s), 0);
    cr_assert_null(sr_value_str(i));
    cr_assert_eq(sr_value_double(i), 5.0, "ints convert to double");
    cr_assert_eq(sr_value_double(d), 2.5);
    cr_assert_eq(sr_value_int(d), 0, "doubles do not convert to int");
    cr_assert_not(sr_value_bool(i));
    size_t n = 99;
    cr_assert_null(sr_value_bytes(s, &n));
    cr_assert_eq(n, 0);
    cr_assert_null(sr_value_list_at(i, 0));
    sr_value *l = sr_list(1, &i);
    cr_assert_eq(sr_value_list_at(l, 0), i, "a list holds the very item it was given");
    cr_assert_null(sr_value_list_at(l, 1), "an index past the end is NULL");
    cr_assert_null(sr_value_object(l));
    cr_assert_str_eq(sr_kind_name(SR_KIND_TENSOR), "tensor");
    cr_assert_str_eq(sr_kind_name(sr_value_type(l)), "list");
    cr_assert_str_eq(sr_kind_name((sr_kind)99), "unknown");
    sr_value_unref(l);
    sr_value_unref(i);
    sr_value_unref(s);
    sr_value_unref(d);
}

static bool eq_and_free(sr_value *a, sr_value *b)
{
    bool r = sr_value_equal(a, b), r2 = sr_value_equal(b, a);
    cr_assert_eq(r, r2, "equality is not symmetric");
    sr_value_unref(a);
    sr_value_unref(b);
    return r;
}

Test(value, equality_is_deep_and_kind_strict)
{
    cr_assert(eq_and_free(sr_int(3), sr_int(3)));
    cr_assert_not(eq_and_free(sr_int(3), sr_int(4)));
    cr_assert_not(eq_and_free(sr_int(1), sr_double(1.0)), "an int never equals a double");
    cr_assert_not(eq_and_free(sr_int(0), sr_bool(false)));
    cr_assert(eq_and_free(sr_none(), sr_none()));
    cr_assert(eq_and_free(sr_double(0.0), sr_double(-0.0)));
    cr_assert(eq_and_free(sr_double(NAN), sr_double(NAN)), "a NaN value equals its copy");
    cr_assert(eq_and_free(sr_str("ab"), sr_str("ab")));
    cr_assert_not(eq_and_free(sr_str("ab"), sr_str("abc")));
    cr_assert_not(eq_and_free(sr_str("ab"), sr_bytes("ab", 2)), "str and bytes differ");
    cr_assert(eq_and_free(sr_bytes("a\0b", 3), sr_bytes("a\0b", 3)));
    cr_assert_not(eq_and_free(sr_bytes("a\0b", 3), sr_bytes("a\0c", 3)), "bytes compare past a NUL");

    sr_value *x[] = {sr_int(1), sr_str("two")}, *y[] = {sr_int(1), sr_str("two")}, *z[] = {sr_int(1), sr_str("tw0")};
    sr_value *lx = sr_list(2, x), *ly = sr_list(2, y), *lz = sr_list(2, z), *short_ = sr_list(1, x);
    cr_assert(sr_value_equal(lx, ly));
    cr_assert_not(sr_value_equal(lx, lz), "a difference deep in a list is seen");
    cr_assert_not(sr_value_equal(lx, short_));
    cr_assert(eq_and_free(nest(5, sr_value_ref(lx)), nest(5, sr_value_ref(ly))));
    cr_assert_not(eq_and_free(nest(5, sr_value_ref(lx)), nest(5, sr_value_ref(lz))));
    cr_assert_not(eq_and_free(nest(5, sr_value_ref(lx)), nest(4, sr_value_ref(lx))));
    for (int i = 0; i < 2; i++) {
        sr_value_unref(x[i]);
        sr_value_unref(y[i]);
        sr_value_unref(z[i]);
    }
    sr_value_unref(lx);
    sr_value_unref(ly);
    sr_value_unref(lz);
    sr_value_unref(short_);

    int a, b;
    cr_assert(eq_and_free(sr_object(&a, NULL, "T"), sr_object(&a, NULL, "T")), "objects compare by identity");
    cr_assert_not(eq_and_free(sr_object(&a, NULL, "T"), sr_object(&b, NULL, "T")));
    cr_assert(sr_value_equal(NULL, NULL));
    sr_value *n = sr_none();
    cr_assert_not(sr_value_equal(n, NULL), "a value never equals NULL");
    sr_value_unref(n);
}

Test(value, repr_describes_the_value)
{
    char buf[96];
    struct {
        sr_value *v;
        const char *want;
    } cases[] = {
        {sr_int(5), "int 5"},
        {sr_str("abc"), "str 'abc'"},
        {sr_bool(true), "bool true"},
        {sr_none(), "none"},
        {sr_bytes("abcd", 4), "bytes of 4"},
        {sr_object(NULL, NULL, "Net"), "object of type 'Net'"},
        {sr_double(1.5), "double 1.5"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_str_eq(sr__value_repr(cases[i].v, buf, sizeof(buf)), cases[i].want);
        sr_value_unref(cases[i].v);
    }
    sr_value *items[] = {sr_none(), sr_none(), sr_none()};
    sr_value *l = sr_list(3, items);
    cr_assert_str_eq(sr__value_repr(l, buf, sizeof(buf)), "list of 3");
    sr_value_unref(l);
    for (int i = 0; i < 3; i++)
        sr_value_unref(items[i]);
    char tiny[6];
    sr_value *s = sr_str("a long string");
    cr_assert_str_eq(sr__value_repr(s, tiny, sizeof(tiny)), "str '", "repr truncates to the buffer");
    sr_value_unref(s);
}

/* ---- refcounts and objects ------------------------------------------------- */

Test(value, object_destructor_runs_once_after_the_last_reference)
{
    static int payload;
    destroyed = 0;
    sr_value *obj = sr_object(&payload, count_destroy, "Net");
    cr_assert_not_null(obj, "%s", sr_last_error());
    cr_assert_eq(sr_value_object(obj), &payload);
    cr_assert_str_eq(sr_value_object_type(obj), "Net");
    sr_value *pair[] = {obj, obj};
    sr_value *inner = sr_list(2, pair);
    sr_value *outer_items[] = {inner, obj};
    sr_value *outer = sr_list(2, outer_items);
    sr_value_unref(obj);
    cr_assert_eq(destroyed, 0, "the lists still hold the object");
    sr_value_unref(inner);
    cr_assert_eq(destroyed, 0, "outer still holds inner and the object");
    sr_value_unref(outer);
    cr_assert_eq(destroyed, 1, "the destructor runs exactly once, when the last reference goes");
}

struct hammer {
    sr_value *v;
    int rounds;
};

static void *hammer_refs(void *arg)
{
    struct hammer *h = arg;
    for (int i = 0; i < h->rounds; i++) {
        sr_value *mine = sr_value_ref(h->v);
        sr_value *items[] = {mine};
        sr_value *l = sr_list(1, items); /* a list takes and drops its own reference */
        sr_value_unref(l);
        sr_value_unref(mine);
    }
    return NULL;
}

Test(value, refcount_survives_threads)
{
    destroyed = 0;
    sr_value *obj = sr_object(NULL, count_destroy, "Shared");
    struct hammer h = {obj, 20000};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, hammer_refs, &h), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(destroyed, 0, "an object died while its creator still held it");
    sr_value_unref(obj);
    cr_assert_eq(destroyed, 1);
}

Test(value, self_call_passes_an_object_by_reference)
{
    destroyed = 0;
    sr_value *obj = sr_object(&destroyed, count_destroy, "Module");
    sr_value *items[] = {obj};
    sr_value *list = sr_list(1, items);
    sr_value *args[] = {sr_int(1), obj, list};
    size_t len;
    uint8_t *buf = encode(3, args, 1, &len);
    cr_assert_eq(sr__inflight_count(obj), 2, "the buffer holds one reference per occurrence");
    sr_value_unref(obj);
    sr_value_unref(list);
    sr_value_unref(args[0]);
    cr_assert_eq(destroyed, 0, "the encoded buffer keeps the object alive");

    sr_value *out = NULL;
    cr_assert_eq(sr__codec_decode(buf, len, &out), 0, "%s", sr_last_error());
    cr_assert_eq(sr_value_list_at(out, 1), obj, "a self-call hands over the same object, not a copy");
    cr_assert_eq(sr_value_list_at(sr_value_list_at(out, 2), 0), obj);
    cr_assert_eq(sr__inflight_count(obj), 0, "decoding claimed every reference the buffer held");
    sr_value *again = NULL;
    cr_assert_eq(sr__codec_decode(buf, len, &again), -EBADMSG, "a buffer's objects can be claimed only once");
    assert_error_mentions("not in flight");
    cr_assert_eq(destroyed, 0);
    sr_value_unref(out);
    cr_assert_eq(destroyed, 1, "the decoded value held the last references");
    free(buf);
}

Test(value, release_drops_the_references_of_an_undecoded_buffer)
{
    destroyed = 0;
    sr_value *obj = sr_object(NULL, count_destroy, "Module");
    sr_value *args[] = {obj, obj};
    size_t len;
    uint8_t *buf = encode(2, args, 1, &len);
    sr_value_unref(obj);
    cr_assert_eq(destroyed, 0);
    sr__codec_release(buf, len - 1); /* malformed: nothing is trusted, nothing dropped */
    cr_assert_eq(sr__inflight_count(obj), 2);
    sr__codec_release(buf, len);
    cr_assert_eq(destroyed, 1, "release dropped both references the buffer held");
    free(buf);
}

Test(value, object_cannot_be_sent_to_another_worker)
{
    destroyed = 0;
    sr_value *obj = sr_object(NULL, count_destroy, "ParameterServer");
    sr_value *inner = sr_list(1, &obj);
    sr_value *args[] = {sr_int(1), inner};
    uint8_t buf[128];
    cr_assert_eq(sr__codec_size(2, args, 0), -EINVAL);
    assert_error_mentions("'ParameterServer' is owner-local");
    cr_assert_eq(sr__codec_encode(2, args, 0, buf, sizeof(buf)), -EINVAL);
    assert_error_mentions("sr__codec_encode");
    cr_assert_eq(sr__inflight_count(obj), 0, "a failed encode holds no reference");
    sr_value_unref(args[0]);
    sr_value_unref(inner);
    sr_value_unref(obj);
    cr_assert_eq(destroyed, 1);
}

Test(value, failed_encode_gives_its_object_references_back)
{
    destroyed = 0;
    sr_value *obj = sr_object(NULL, count_destroy, "Net");
    uint8_t small[8];
    cr_assert_eq(sr__codec_encode(1, &obj, 1, small, sizeof(small)), -ENOSPC);
    assert_error_mentions("cannot hold");
    cr_assert_eq(sr__inflight_count(obj), 0);
    sr_value_unref(obj);
    cr_assert_eq(destroyed, 1);
}

/* ---- tensors ------------------------------------------------------------------ */

static void assert_bad(const uint8_t *buf, size_t len, const char *what)
{
    sr_value *out = (sr_value *)1;
    cr_assert_eq(sr__codec_decode(buf, len, &out), -EBADMSG, "expected -EBADMSG for: %s", what);
    cr_assert_null(out, "a failed decode leaves *out NULL");
    assert_error_mentions(what);
}


static sr_segment heap_seg; /* Criterion runs each test in its own process */

/* A one-worker segment whose heap this process attaches, so that tensors made
 * from now on live in the shared heap and can be encoded. */
static void heap_up(void)
{
    sr_segment_opts o = {.world_size = 1,
                         .size = sr__segment_fixed_size(1, SR_RING_SLOTS_DEFAULT) + (64u << 20),
                         .name = test_ns("value")};
    cr_assert_eq(sr__segment_create(&o, &heap_seg), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_attach(&heap_seg, 0), 0, "sr__heap_attach: %s", sr_last_error());
}

static void heap_down(void)
{
    sr__heap_detach();
    sr__segment_detach(&heap_seg, true);
}

/* A tensor of dt and shape holding 0.5, 1.5, 2.5, ... (i64: 0, 1, 2, ...). */
static sr_tensor *counting(sr_dtype dt, int nd, const int64_t *shape)
{
    sr_tensor *t = sr_empty(dt, nd, shape, 0);
    cr_assert_not_null(t, "%s", sr_last_error());
    size_t n = sr_tensor_numel(t);
    void *p = sr_tensor_mutable_data(t);
    for (size_t i = 0; i < n; i++) {
        if (dt == SR_F32)
            ((float *)p)[i] = (float)i + 0.5f;
        else if (dt == SR_F64)
            ((double *)p)[i] = (double)i + 0.5;
        else
            ((int64_t *)p)[i] = (int64_t)i;
    }
    return t;
}

static sr_block *block_of(const sr_tensor *t) { return sr__tensor_block(t); }

static sr_value *tensor_value_of(sr_tensor *t)
{
    cr_assert_not_null(t, "%s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t);
    cr_assert_not_null(v, "%s", sr_last_error());
    sr_tensor_unref(t);
    return v;
}

Test(value, tensor_equality_and_repr)
{
    sr_tensor *a = counting(SR_F32, 2, (int64_t[]){2, 3});
    sr_tensor *at = sr_t(a), *contig = sr_contiguous(at); /* a's transpose, in other storage */
    sr_tensor *tt = sr_t(contig);                          /* a's values through other strides */
    sr_tensor_unref(at);
    sr_value *va = tensor_value_of(sr_tensor_ref(a)), *vt = tensor_value_of(tt);
    cr_assert(sr_value_equal(va, vt), "equal elements through different strides are equal");
    sr_tensor_unref(contig);

    sr_value *other_dtype = tensor_value_of(counting(SR_F64, 2, (int64_t[]){2, 3}));
    cr_assert_not(sr_value_equal(va, other_dtype), "f32 and f64 tensors are never equal");
    sr_value *other_shape = tensor_value_of(counting(SR_F32, 2, (int64_t[]){3, 2}));
    cr_assert_not(sr_value_equal(va, other_shape), "[2, 3] and [3, 2] differ");
    sr_tensor *changed = sr_clone(a);
    ((float *)sr_tensor_mutable_data(changed))[5] = 99.0f;
    sr_value *vc = tensor_value_of(changed);
    cr_assert_not(sr_value_equal(va, vc), "the last element differs");

    sr_value *n1 = tensor_value_of(sr_full(SR_F64, 1, (int64_t[]){3}, NAN, 0));
    sr_value *n2 = tensor_value_of(sr_full(SR_F64, 1, (int64_t[]){3}, NAN, 0));
    cr_assert(sr_value_equal(n1, n2), "NaN elements equal NaN, as double values do");
    sr_value *i1 = tensor_value_of(counting(SR_I64, 1, (int64_t[]){4}));
    sr_value *i2 = tensor_value_of(counting(SR_I64, 1, (int64_t[]){4}));
    cr_assert(sr_value_equal(i1, i2));

    char buf[96];
    cr_assert_str_eq(sr__value_repr(va, buf, sizeof(buf)), "tensor f32[2, 3]");
    cr_assert_str_eq(sr__value_repr(i1, buf, sizeof(buf)), "tensor i64[4]");
    sr_value *scalar = tensor_value_of(sr_scalar_tensor(SR_F64, 1.0, 0));
    cr_assert_str_eq(sr__value_repr(scalar, buf, sizeof(buf)), "tensor f64[]");
    cr_assert_eq(sr_value_tensor(va), a, "the value holds the very tensor");
    sr_value *num = sr_int(1);
    cr_assert_null(sr_value_tensor(num), "an int is not a tensor");
    sr_value_unref(num);
    sr_value *all[] = {va, vt, other_dtype, other_shape, vc, n1, n2, i1, i2, scalar};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        sr_value_unref(all[i]);
    cr_assert_eq(sr__block_refcount(block_of(a)), 1, "the values dropped their tensor references");
    sr_tensor_unref(a);
}

Test(value, private_tensor_cannot_be_encoded)
{
    cr_assert_not(sr__heap_attached());
    destroyed = 0;
    sr_tensor *t = counting(SR_F32, 2, (int64_t[]){2, 3});
    sr_value *obj = sr_object(NULL, count_destroy, "Net");
    sr_value *args[] = {obj, tensor_value_of(sr_tensor_ref(t))};
    uint8_t buf[512];
    cr_assert_eq(sr__codec_size(2, args, 1), -EINVAL);
    assert_error_mentions("sr__codec_size: tensor f32[2, 3] cannot be sent: its storage is a private block, "
                          "not in the shared heap");
    cr_assert_eq(sr__codec_encode(2, args, 1, buf, sizeof(buf)), -EINVAL);
    assert_error_mentions("sr__codec_encode: tensor f32[2, 3] cannot be sent");
    cr_assert_eq(sr__inflight_count(obj), 0, "a failed encode holds no object reference");
    cr_assert_eq(sr__block_refcount(block_of(t)), 1, "a failed encode holds no block reference");
    sr_value_unref(args[0]);
    sr_value_unref(args[1]);
    sr_tensor_unref(t);
    cr_assert_eq(destroyed, 1);
}

/* Round trip of one tensor: the decoded tensor views the same block with the
 * same geometry, dtype and requires_grad, and holds its own reference. */
static void assert_tensor_round_trips(sr_tensor *t, const char *what)
{
    cr_assert_not_null(t, "%s: %s", what, sr_last_error());
    uint32_t refs = sr__block_refcount(block_of(t));
    sr_value *v = tensor_value_of(sr_tensor_ref(t));
    sr_value *back = round_trip(v, 0);
    sr_tensor *b = sr_value_tensor(back);
    cr_assert_not_null(b, "%s came back as %s", what, sr_kind_name(sr_value_type(back)));
    cr_assert(sr_value_equal(v, back), "%s changed in transit", what);
    cr_assert_eq(block_of(b), block_of(t), "%s: the decoded tensor views another block (a copy)", what);
    cr_assert_eq(sr_tensor_data(b), sr_tensor_data(t), "%s: same first element", what);
    cr_assert_eq(sr_tensor_ndim(b), sr_tensor_ndim(t));
    cr_assert_eq(memcmp(sr_tensor_strides(b), sr_tensor_strides(t), (size_t)sr_tensor_ndim(t) * 8), 0,
                 "%s: strides changed", what);
    cr_assert_eq(sr_tensor_requires_grad(b), sr_tensor_requires_grad(t), "%s: requires_grad changed", what);
    cr_assert(sr_tensor_is_leaf(b), "%s: a decoded tensor is a leaf", what);
    cr_assert_eq(sr__block_refcount(block_of(t)), refs + 1, "%s: the receiver holds exactly one more reference",
                 what);
    sr_value_unref(back);
    sr_value_unref(v);
    cr_assert_eq(sr__block_refcount(block_of(t)), refs, "%s: a reference leaked", what);
    sr_tensor_unref(t);
}

Test(value, tensor_values_round_trip_through_the_shared_heap)
{
    heap_up();
    sr_tensor *a = counting(SR_F32, 2, (int64_t[]){2, 3});
    cr_assert_neq(sr__block_to_off(block_of(a)), (uint64_t)-1, "a tensor made after attach is shared");
    assert_tensor_round_trips(sr_tensor_ref(a), "f32 [2, 3]");
    assert_tensor_round_trips(sr_t(a), "a transposed view");
    assert_tensor_round_trips(sr_narrow(a, 1, 1, 2), "a narrowed view with an offset");
    sr_tensor *row = sr_narrow(a, 0, 1, 1);
    assert_tensor_round_trips(sr_expand(row, 2, (int64_t[]){4, 3}), "a stride-0 expansion of a row");
    sr_tensor_unref(row);
    assert_tensor_round_trips(counting(SR_I64, 1, (int64_t[]){5}), "i64 [5]");
    assert_tensor_round_trips(sr_scalar_tensor(SR_F64, -2.5, 0), "a 0-d f64");
    assert_tensor_round_trips(sr_zeros(SR_F32, 2, (int64_t[]){0, 4}, 0), "an empty [0, 4]");
    assert_tensor_round_trips(sr_ones(SR_F64, 8, (int64_t[]){1, 2, 1, 2, 1, 2, 1, 2}, SR_REQUIRES_GRAD),
                              "an 8-d leaf that requires grad");
    /* Tensors among other kinds, and one tensor twice. */
    sr_value *ta = tensor_value_of(sr_tensor_ref(a));
    sr_value *inner[] = {ta, sr_str("x")};
    sr_value *items[] = {sr_int(1), ta, sr_list(2, inner)};
    assert_round_trips(sr_list(3, items));
    sr_value_unref(inner[1]);
    sr_value_unref(items[0]);
    sr_value_unref(items[2]);
    sr_value_unref(ta);
    cr_assert_eq(sr__block_refcount(block_of(a)), 1, "every reference taken in transit was dropped");
    sr_tensor_unref(a);
    heap_down();
}

Test(value, decoded_tensor_shares_bytes_until_either_side_writes)
{
    heap_up();
    sr_tensor *a = counting(SR_F32, 1, (int64_t[]){4});
    sr_block *blk = block_of(a);
    sr_value *va = tensor_value_of(sr_tensor_ref(a));
    size_t len;
    uint8_t *buf = encode(1, &va, 0, &len);
    sr_value_unref(va);
    cr_assert_eq(sr__block_refcount(blk), 2, "the descriptor holds the receiver's reference");
    sr_value *list = NULL;
    cr_assert_eq(sr__codec_decode(buf, len, &list), 0, "%s", sr_last_error());
    free(buf);
    sr_tensor *b = sr_value_tensor(sr_value_list_at(list, 0));
    cr_assert_eq(sr__block_refcount(blk), 2, "decoding swapped the descriptor's reference for the tensor's");
    cr_assert_eq(sr_tensor_data(b), sr_tensor_data(a), "zero-copy: both view the same bytes");

    cr_assert_eq(sr_fill_(b, 7.0), 0, "%s", sr_last_error());
    cr_assert_neq(sr_tensor_data(b), sr_tensor_data(a), "the receiver's write moved it to a private copy");
    cr_assert_eq(((const float *)sr_tensor_data(a))[3], 3.5f, "the sender's tensor is unchanged");
    cr_assert_eq(sr__block_refcount(blk), 1, "the receiver let go of the shared block");
    const void *before = sr_tensor_data(a);
    cr_assert_eq(sr_fill_(a, 1.0), 0, "%s", sr_last_error());
    cr_assert_eq(sr_tensor_data(a), before, "with the block to itself, the sender writes in place");
    cr_assert_eq(((const float *)sr_tensor_data(b))[0], 7.0f, "the receiver does not see the sender's write");
    sr_value_unref(list);
    sr_tensor_unref(a);
    heap_down();
}

Test(value, tensor_references_of_a_released_buffer_are_dropped_once)
{
    heap_up();
    sr_tensor *a = counting(SR_F64, 2, (int64_t[]){3, 3});
    sr_value *va = tensor_value_of(sr_tensor_ref(a)), *vt = tensor_value_of(sr_t(a));
    sr_value *args[] = {va, vt, sr_int(5)};
    size_t len;
    uint8_t *buf = encode(3, args, 0, &len);
    cr_assert_eq(sr__block_refcount(block_of(a)), 3, "one reference per descriptor");
    sr__codec_release(buf, len - 1); /* malformed: its references cannot be trusted, nothing is dropped */
    cr_assert_eq(sr__block_refcount(block_of(a)), 3);
    sr__codec_release(buf, len);
    cr_assert_eq(sr__block_refcount(block_of(a)), 1, "release dropped each descriptor's reference");

    uint8_t small[100];
    cr_assert_eq(sr__codec_encode(3, args, 0, small, sizeof(small)), -ENOSPC);
    cr_assert_eq(sr__block_refcount(block_of(a)), 1, "a failed encode holds no block reference");
    for (int i = 0; i < 3; i++)
        sr_value_unref(args[i]);
    free(buf);
    sr_tensor_unref(a);
    heap_down();
}

static void put64(uint8_t *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

/* Byte offsets in a buffer holding one tensor: count (4), tag (1), then the
 * descriptor's fields in struct order. */
enum { D_MAGIC = 5, D_DTYPE = 9, D_NDIM = 10, D_FLAGS = 11, D_OFFSET = 13, D_BLOCK = 21, D_SHAPE = 29,
       D_STRIDES = 29 + 8 * SR_MAX_DIMS };

Test(value, corrupted_tensor_descriptors_are_rejected_by_name)
{
    heap_up();
    sr_tensor *a = counting(SR_F32, 2, (int64_t[]){2, 3});
    sr_value *va = tensor_value_of(sr_tensor_ref(a));
    size_t len;
    uint8_t *buf = encode(1, &va, 0, &len);
    cr_assert_eq(len, 4 + 1 + 152);
    uint64_t off = sr__block_to_off(block_of(a));
    uint8_t *bad = malloc(len);
    struct {
        size_t at;
        uint64_t value;
        int bytes;
        const char *want;
    } cases[] = {
        {D_BLOCK, off + 64, 8, "offset 4: tensor descriptor (block offset"},
        {D_BLOCK, off + 1, 8, "sr__block_from_off"},
        {D_BLOCK, 0, 8, "sr__block_from_off"},
        {D_BLOCK, UINT64_MAX, 8, "sr__block_from_off"},
        {D_MAGIC, 0x12345678, 4, "bad magic 0x12345678"},
        {D_DTYPE, 7, 1, "dtype"},
        {D_NDIM, 9, 1, "ndim 9 exceeds 8"},
        {D_FLAGS, 4, 2, "unknown flags 0x4"},
        {D_SHAPE, 1000, 8, "reaches past its"},
        {D_STRIDES, (uint64_t)-1, 8, "stride 0 is negative"},
        {D_OFFSET, 1u << 20, 8, "reaches past its"},
        {D_SHAPE + 8 * 3, 1, 8, "past ndim 2 is not zero"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, buf, len);
        if (cases[i].bytes == 8)
            put64(bad + cases[i].at, cases[i].value);
        else if (cases[i].bytes == 4)
            put32(bad + cases[i].at, (uint32_t)cases[i].value);
        else if (cases[i].bytes == 2)
            bad[cases[i].at] = (uint8_t)cases[i].value, bad[cases[i].at + 1] = 0;
        else
            bad[cases[i].at] = (uint8_t)cases[i].value;
        assert_bad(bad, len, cases[i].want);
        cr_assert_eq(sr__block_refcount(block_of(a)), 2, "case %zu: a rejected buffer dropped a reference", i);
    }
    free(bad);
    sr__codec_release(buf, len);
    free(buf);
    sr_value_unref(va);
    cr_assert_eq(sr__block_refcount(block_of(a)), 1);
    sr_tensor_unref(a);
    heap_down();
}

/* The child decodes and writes "<rc> <message>" to the pipe. */
static void decode_in_child(int wfd, const uint8_t *buf, size_t len)
{
    sr_value *out = NULL;
    int rc = sr__codec_decode(buf, len, &out);
    char msg[600];
    int n = snprintf(msg, sizeof(msg), "%d %s", rc, sr_last_error());
    ssize_t w = write(wfd, msg, (size_t)n);
    _exit(w == n ? 0 : 1);
}

Test(value, object_decoded_in_another_process_is_rejected)
{
    sr__error_set_rank(3);
    sr_value *obj = sr_object(NULL, NULL, "Net");
    size_t len;
    uint8_t *buf = encode(1, &obj, 1, &len);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        decode_in_child(p[1], buf, len);
    close(p[1]);
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, 10000), 1, "the decoding child said nothing within 10 s");
    char msg[600] = {0};
    ssize_t n = read(p[0], msg, sizeof(msg) - 1);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(n > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed: %s", msg);
    cr_assert_eq(atoi(msg), -EBADMSG, "child: %s", msg);
    cr_assert(strstr(msg, "object of type 'Net' is owner-local and cannot leave worker 3"), "child: %s", msg);
    cr_assert(strstr(msg, "offset 4:"), "child: %s", msg);
    close(p[0]);
    sr__codec_release(buf, len);
    cr_assert_eq(sr__inflight_count(obj), 0);
    sr_value_unref(obj);
    free(buf);
    sr__error_set_rank(-1);
}

/* ---- error paths ------------------------------------------------------------ */

Test(value, constructors_reject_bad_arguments)
{
    cr_assert_null(sr_str(NULL));
    assert_error_mentions("sr_str: the string is NULL");
    cr_assert_null(sr_bytes(NULL, 3));
    assert_error_mentions("sr_bytes");
    cr_assert_null(sr_list(2, NULL));
    assert_error_mentions("sr_list");
    sr_value *one = sr_int(1);
    sr_value *items[] = {one, NULL};
    cr_assert_null(sr_list(2, items));
    assert_error_mentions("item 1 of 2 is NULL");
    sr_value_unref(one);
    cr_assert_null(sr_object(NULL, NULL, NULL));
    assert_error_mentions("sr_object");
    cr_assert_null(sr_value_from_tensor(NULL));
    assert_error_mentions("sr_value_from_tensor");

    sr_value *deep = nest(SR_VALUE_MAX_DEPTH, sr_none());
    cr_assert_null(sr_list(1, &deep), "a list may not nest deeper than %d", SR_VALUE_MAX_DEPTH);
    assert_error_mentions("nested");
    sr_value_unref(deep);
    sr_value_unref(NULL); /* a no-op */
}

Test(value, depth_over_the_codec_limit_is_refused_both_ways)
{
    sr_value *v = nest(SR_CODEC_MAX_DEPTH + 1, sr_int(1));
    cr_assert_eq(sr__codec_size(1, &v, 0), -EINVAL);
    assert_error_mentions("nested 33 deep");
    sr_value_unref(v);

    /* Hand-made: one value, 33 lists of one item each, then a none. */
    enum { LISTS = SR_CODEC_MAX_DEPTH + 1 };
    uint8_t buf[4 + LISTS * 5 + 1];
    put32(buf, 1);
    for (int i = 0; i < LISTS; i++) {
        buf[4 + i * 5] = SR_KIND_LIST;
        put32(buf + 4 + i * 5 + 1, 1);
    }
    buf[sizeof(buf) - 1] = SR_KIND_NONE;
    sr_value *out = NULL;
    cr_assert_eq(sr__codec_decode(buf, sizeof(buf), &out), -EBADMSG);
    char want[64];
    snprintf(want, sizeof(want), "offset %d: lists nested deeper than %d", 4 + SR_CODEC_MAX_DEPTH * 5,
             SR_CODEC_MAX_DEPTH);
    assert_error_mentions(want);
    cr_assert_null(out);
    /* One level less decodes. */
    buf[4 + (LISTS - 1) * 5] = SR_KIND_NONE;
    cr_assert_eq(sr__codec_decode(buf, 4 + (LISTS - 1) * 5 + 1, &out), 0, "%s", sr_last_error());
    sr_value_unref(out);
}

Test(value, decode_errors_name_the_offset_and_the_problem)
{
    uint8_t b[32] = {0};
    put32(b, 1);
    b[4] = SR_KIND_STR;
    put32(b + 5, 4000000);
    memcpy(b + 9, "abc", 3);
    assert_bad(b, 12, "sr__codec_decode: offset 5: string length 4000000 runs past the end (3 bytes left)");

    b[4] = 42;
    assert_bad(b, 12, "offset 4: unknown kind tag 42");

    b[4] = SR_KIND_LIST;
    put32(b + 5, 0xfffffff0u);
    assert_bad(b, 12, "offset 5: list length 4294967280 exceeds the limit");
    put32(b + 5, 1000);
    assert_bad(b, 12, "offset 5: list length 1000 runs past the end (3 bytes left)");

    b[4] = SR_KIND_INT;
    assert_bad(b, 8, "offset 5: int needs 8 bytes, 3 left");

    b[4] = SR_KIND_BOOL;
    b[5] = 2;
    assert_bad(b, 6, "offset 5: bool byte 0x2 is neither 0 nor 1");

    b[4] = SR_KIND_STR;
    put32(b + 5, 3);
    memcpy(b + 9, "a\0c", 3);
    assert_bad(b, 12, "offset 10: string of length 3 contains a NUL byte");

    b[4] = SR_KIND_NONE;
    assert_bad(b, 7, "offset 5: 2 trailing bytes after the last value");
    assert_bad(b, 3, "offset 0: value count needs 4 bytes, 3 left");
    assert_bad(NULL, 0, "offset 0: value count needs 4 bytes, 0 left");
    put32(b, 9);
    assert_bad(b, 5, "offset 0: value count 9 runs past the end (1 bytes left)");

    put32(b, 1);
    b[4] = SR_KIND_TENSOR;
    assert_bad(b, 5, "offset 5: tensor descriptor needs 152 bytes, 0 left");
    b[4] = SR_KIND_RREF;
    assert_bad(b, 5, "offset 5: rref value needs 22 bytes, 0 left");
    memset(b + 5, 0, 22); /* a whole RRef (with its owner's generation), but no RPC worker to own it */
    b[13] = 1;
    assert_bad(b, 27, "offset 4: an RRef can only be decoded by an initialised worker");
    b[4] = SR_KIND_MODULE + 3; /* a module kind no module registered (only RRefs have one) */
    assert_bad(b, 27, "offset 4: no module decodes kind tag 12");

    b[4] = SR_KIND_NONE;
    sr_value *out = NULL;
    cr_assert_eq(sr__codec_decode(b, 5, &out), 0, "%s", sr_last_error());
    cr_assert_eq(sr_value_type(sr_value_list_at(out, 0)), SR_KIND_NONE);
    sr_value_unref(out);
}

Test(value, encode_rejects_null_values_and_small_buffers)
{
    sr_value *args[] = {sr_int(1), NULL};
    cr_assert_eq(sr__codec_size(2, args, 0), -EINVAL);
    assert_error_mentions("value 1 of 2 is NULL");
    cr_assert_eq(sr__codec_size(2, NULL, 0), -EINVAL);
    uint8_t buf[13];
    cr_assert_eq(sr__codec_encode(1, args, 0, buf, 12), -ENOSPC);
    assert_error_mentions("a buffer of 12 bytes cannot hold the 13-byte encoding");
    cr_assert_eq(sr__codec_encode(1, args, 0, buf, 13), 13);
    sr_value_unref(args[0]);
}

/* ---- robustness ------------------------------------------------------------- */

struct fuzz {
    sr_value *obj;      /* the object the corpus holds, or NULL */
    uint32_t obj_refs;  /* in-flight references the pristine buffer holds */
    sr_block *blocks[2]; /* the tensor blocks the corpus names, or NULL */
    uint32_t block_refs[2]; /* their refcounts while the pristine buffer lives */
    size_t runs, decoded, rejected, failures;
    char first_failure[300];
};

static void fuzz_fail(struct fuzz *f, const char *fmt, size_t a, size_t b, int rc)
{
    if (!f->failures++)
        snprintf(f->first_failure, sizeof(f->first_failure), fmt, a, b, rc, sr_last_error());
}

/* After a candidate, the references its decode consumed (the pristine
 * buffer's, or another tracked block's if a corrupted offset named it) are
 * topped up again; a count above the pristine one is a leak. */
static void restore_block_refs(struct fuzz *f, size_t at, size_t val)
{
    for (int i = 0; i < 2 && f->blocks[i]; i++) {
        uint32_t now = sr__block_refcount(f->blocks[i]);
        if (now > f->block_refs[i])
            fuzz_fail(f, "candidate (%zu, %zu) left a tensor block with an extra reference (%d)", at, val,
                      (int)(now - f->block_refs[i]));
        for (; now < f->block_refs[i]; now++)
            sr__block_ref(f->blocks[i]);
    }
}

/* Decode one candidate. A success must re-encode to the very same bytes (the
 * encoding is canonical); afterwards the pristine buffer's object and block
 * references are topped up again, so every candidate sees the same state. */
static void fuzz_one(struct fuzz *f, const uint8_t *buf, size_t len, size_t at, size_t val)
{
    sr_value *out = NULL;
    int rc = sr__codec_decode(buf, len, &out);
    f->runs++;
    if (rc == -EBADMSG) {
        f->rejected++;
    } else if (rc != 0) {
        fuzz_fail(f, "candidate (%zu, %zu): rc %d: %s", at, val, rc);
    } else {
        f->decoded++;
        size_t n = sr_value_list_len(out);
        uint8_t *again = malloc(len + 1);
        int64_t w = sr__codec_encode(n, n ? sr__list_items(out) : NULL, 1, again, len + 1);
        if (w != (int64_t)len || memcmp(again, buf, len) != 0)
            fuzz_fail(f, "candidate (%zu, %zu) decoded but re-encoded differently (rc %d): %s", at, val, (int)w);
        if (w > 0)
            sr__codec_release(again, (size_t)w);
        free(again);
        sr_value_unref(out);
    }
    if (f->obj)
        while (sr__inflight_count(f->obj) < f->obj_refs)
            sr__inflight_add(sr_value_ref(f->obj));
    restore_block_refs(f, at, val);
}

static void fuzz_truncations(struct fuzz *f, const uint8_t *buf, size_t len)
{
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, buf, cut);
        size_t before = f->rejected;
        fuzz_one(f, copy, cut, cut, 0);
        if (f->rejected != before + 1)
            fuzz_fail(f, "truncation to %zu of %zu bytes was not rejected (%d)", cut, len, 0);
        free(copy);
    }
}

static void fuzz_flips(struct fuzz *f, const uint8_t *buf, size_t len)
{
    uint8_t *copy = malloc(len);
    for (size_t i = 0; i < len; i++) {
        const uint8_t vals[] = {buf[i] ^ 0x01, buf[i] ^ 0x80, buf[i] ^ 0xff, 0x00, 0x7f};
        for (size_t k = 0; k < sizeof(vals); k++) {
            if (vals[k] == buf[i])
                continue;
            memcpy(copy, buf, len);
            copy[i] = vals[k];
            fuzz_one(f, copy, len, i, vals[k]);
        }
    }
    free(copy);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random buffers biased towards structure: small counts, kind tags and
 * lengths are likely, so the decoder gets past the first few bytes. */
static void fuzz_random(struct fuzz *f, int count)
{
    uint64_t seed = 0x5eed5eed12345678ull;
    uint8_t buf[64];
    for (int r = 0; r < count; r++) {
        size_t len = rng_next(&seed) % sizeof(buf);
        for (size_t i = 0; i < len; i++) {
            uint64_t x = rng_next(&seed);
            buf[i] = (x & 3) ? (uint8_t)((x >> 8) % 11) : (uint8_t)(x >> 8);
        }
        if (len >= 4 && (rng_next(&seed) & 1))
            put32(buf, (uint32_t)(rng_next(&seed) % 4));
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, buf, len);
        fuzz_one(f, copy, len, (size_t)r, len);
        free(copy);
    }
}

/* Random but well-formed-looking encodings: plausible tags and payloads, with
 * a bool out of range, a NUL in a string or a length one off now and then. */
static void gen_value(uint8_t *buf, size_t *pos, size_t cap, int depth, uint64_t *seed)
{
    if (*pos + 16 > cap)
        return;
    uint64_t x = rng_next(seed);
    uint8_t tag = (x % 16 < 10) ? (uint8_t)(x % 16) : SR_KIND_LIST;
    buf[(*pos)++] = tag;
    size_t n = (x >> 8) % 6;
    switch (tag) {
    case SR_KIND_BOOL: buf[(*pos)++] = (uint8_t)((x >> 16) % 3); break;
    case SR_KIND_INT:
    case SR_KIND_DOUBLE:
        for (int i = 0; i < 8; i++)
            buf[(*pos)++] = (uint8_t)(rng_next(seed));
        break;
    case SR_KIND_STR:
    case SR_KIND_BYTES:
        put32(buf + *pos, (uint32_t)(n + ((x >> 20) % 17 == 0)));
        *pos += 4;
        for (size_t i = 0; i < n; i++)
            buf[(*pos)++] = (x >> 24) % 9 ? (uint8_t)('a' + i) : 0;
        break;
    case SR_KIND_LIST:
        put32(buf + *pos, (uint32_t)n);
        *pos += 4;
        for (size_t i = 0; i < n && depth < 40; i++)
            gen_value(buf, pos, cap, depth + 1, seed);
        break;
    default: break; /* none; tensor, object and rref get no payload: rejected */
    }
}

static void fuzz_structured(struct fuzz *f, int count)
{
    uint64_t seed = 0xfeedface0badcafeull;
    uint8_t buf[256];
    for (int r = 0; r < count; r++) {
        size_t n = rng_next(&seed) % 4, pos = 4;
        put32(buf, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            gen_value(buf, &pos, sizeof(buf), 0, &seed);
        if (rng_next(&seed) % 8 == 0 && pos < sizeof(buf))
            buf[pos++] = 0; /* a trailing byte */
        uint8_t *copy = malloc(pos);
        memcpy(copy, buf, pos);
        fuzz_one(f, copy, pos, (size_t)r, pos);
        free(copy);
    }
}

static void fuzz_report(const struct fuzz *f, const char *what)
{
    cr_assert_eq(f->failures, 0, "%s: %zu of %zu candidates misbehaved; first: %s", what, f->failures, f->runs,
                 f->first_failure);
    cr_assert_gt(f->decoded, 0, "%s: no candidate decoded, so the fuzz reached nothing", what);
    cr_assert_gt(f->rejected, 0, "%s: no candidate was rejected", what);
}

static sr_value *mixed_corpus(void)
{
    sr_value *deep = nest(3, sr_str("x"));
    sr_value *inner[] = {sr_int(1), deep, sr_list(0, NULL), sr_bytes("", 0)};
    sr_value *l = sr_list(4, inner);
    sr_value *items[] = {sr_none(), sr_bool(true), sr_bool(false), sr_int(-5), sr_int(INT64_MAX),
                         sr_double(-0.0), sr_double(NAN), sr_str("hello"), sr_str(""),
                         sr_bytes("\0\1\xff", 3), l};
    size_t n = sizeof(items) / sizeof(items[0]);
    sr_value *all = sr_list(n, items);
    for (size_t i = 0; i < n; i++)
        sr_value_unref(items[i]);
    for (size_t i = 0; i < 4; i++)
        sr_value_unref(inner[i]);
    return all;
}

Test(value, decoder_survives_truncation_and_byte_flips, .timeout = 120)
{
    sr_value *all = mixed_corpus();
    size_t len;
    uint8_t *buf = encode(sr_value_list_len(all), sr__list_items(all), 0, &len);
    struct fuzz f = {0};
    fuzz_truncations(&f, buf, len);
    fuzz_flips(&f, buf, len);
    fuzz_report(&f, "mixed corpus");
    free(buf);
    sr_value_unref(all);
}

Test(value, decoder_survives_corrupted_object_buffers, .timeout = 120)
{
    destroyed = 0;
    sr_value *obj = sr_object(NULL, count_destroy, "Net");
    sr_value *inner[] = {obj, sr_str("s")};
    sr_value *args[] = {sr_int(7), obj, sr_list(2, inner)};
    size_t len;
    uint8_t *buf = encode(3, args, 1, &len);
    struct fuzz f = {.obj = obj, .obj_refs = 2};
    fuzz_truncations(&f, buf, len);
    fuzz_flips(&f, buf, len);
    fuzz_report(&f, "object corpus");
    cr_assert_eq(sr__inflight_count(obj), 2, "fuzzing changed the pristine buffer's references");
    sr__codec_release(buf, len);
    free(buf);
    sr_value_unref(args[0]);
    sr_value_unref(args[2]);
    sr_value_unref(inner[1]);
    cr_assert_eq(destroyed, 0);
    sr_value_unref(obj);
    cr_assert_eq(destroyed, 1, "no reference leaked or was dropped twice under fuzzing");
}

/* Descriptors inside lists, next to other kinds: every corrupted block
 * offset, magic, dtype, shape or stride must be rejected (or, where it still
 * describes a view inside a live block, decode and re-encode to the same
 * bytes), and no reference may be lost or leaked. */
Test(value, decoder_survives_corrupted_tensor_buffers, .timeout = 120)
{
    heap_up();
    sr_tensor *a = counting(SR_F32, 2, (int64_t[]){2, 3}), *b = counting(SR_I64, 1, (int64_t[]){4});
    sr_value *ta = tensor_value_of(sr_tensor_ref(a)), *tt = tensor_value_of(sr_t(a));
    sr_value *tb = tensor_value_of(sr_tensor_ref(b));
    sr_value *inner[] = {tt, sr_int(3)};
    sr_value *args[] = {ta, sr_list(2, inner), tb, sr_str("s")};
    size_t len;
    uint8_t *buf = encode(4, args, 0, &len);
    for (int i = 0; i < 4; i++)
        sr_value_unref(args[i]);
    sr_value_unref(tt);
    sr_value_unref(inner[1]);
    cr_assert_eq(sr__block_refcount(block_of(a)), 3, "a's storage and two descriptors");
    cr_assert_eq(sr__block_refcount(block_of(b)), 2, "b's storage and one descriptor");
    /* A corrupted offset may name the other block, so one candidate can
     * consume up to three references of either block: hold three more, so
     * that no candidate frees a block that later ones still name. */
    struct fuzz f = {.blocks = {block_of(a), block_of(b)}};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++)
            sr__block_ref(f.blocks[i]);
        f.block_refs[i] = sr__block_refcount(f.blocks[i]);
    }
    fuzz_truncations(&f, buf, len);
    fuzz_flips(&f, buf, len);
    fuzz_report(&f, "tensor corpus");
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++)
            sr__block_unref(f.blocks[i]);
    cr_assert_eq(sr__block_refcount(block_of(a)), 3, "fuzzing changed the pristine buffer's references");
    sr__codec_release(buf, len);
    free(buf);
    cr_assert_eq(sr__block_refcount(block_of(a)), 1, "release left %u references: %s",
                 sr__block_refcount(block_of(a)), sr_last_error());
    cr_assert_eq(sr__block_refcount(block_of(b)), 1);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    heap_down();
}

Test(value, decoder_survives_random_buffers, .timeout = 120)
{
    struct fuzz f = {0};
    fuzz_random(&f, 3000);
    fuzz_report(&f, "random buffers");
    struct fuzz g = {0};
    fuzz_structured(&g, 3000);
    fuzz_report(&g, "structured random buffers");
}

/* ---- a failed encode after the tensor moved ------------------------------ */

/* Suite codec_unwind: an encode that fails after the tensor it encoded was
 * written in place (so moved to a copy) releases the block its descriptor
 * named, not the tensor's new one (fails with the old unwinding). */
LEAK_CHECKED_SUITE(codec_unwind);

/* A module value kind whose encode fails, after writing the tensor that was
 * encoded just before it in place, as another thread may: the descriptor's
 * block reference makes that write move the tensor to a copy, and the
 * unwinding must then drop the reference through the descriptor's block,
 * not through the tensor (whose block is now the copy). */
static sr_tensor *moved;

static int failing_encode(void *obj, int to, uint8_t *wire)
{
    (void)obj, (void)to;
    (void)wire;
    cr_assert_eq(sr_fill_(moved, 5), 0, "%s", sr_last_error());
    return -EIO;
}

static void nothing(void *obj) { (void)obj; }
static void nothing_unencode(void *obj, const uint8_t *wire) { (void)obj, (void)wire; }

static const sr_value_kind_ops failing_kind = {
    .name = "failing",
    .wire_size = 8,
    .encode = failing_encode,
    .unencode = nothing_unencode,
    .release = nothing,
};
static const sr_module failing_module = {.name = "failing", .value_kind = &failing_kind};

Test(codec_unwind, a_failed_encode_releases_the_block_it_referenced, .init = heap_up, .fini = heap_down)
{
    sr_heap_counters c0, c1, start, end;
    sr__heap_counters_get(&start);
    moved = sr_ones(SR_F32, 1, SHAPE(64), 0);
    sr_block *sent = sr__tensor_block(moved);
    /* This process is its own test: borrow the RRef kind's module slot. */
    int kind = SR_KIND_RREF, slot = -1;
    for (int id = 0; id < SR_MODULE_MAX; id++)
        if (sr__modules[id] && sr__modules[id]->value_kind == sr__value_kind(kind))
            slot = id;
    cr_assert_geq(slot, 0, "no module has the RRef kind %d", kind);
    const sr_module *saved = sr__modules[slot];
    sr__modules[slot] = &failing_module;
    static int token;
    sr_value *args[] = {sr_value_from_tensor(moved), sr__value_module(kind, &token)};
    cr_assert(args[0] && args[1]);
    int64_t size = sr__codec_size(2, args, 0);
    cr_assert_gt(size, 0, "%s", sr_last_error());
    uint8_t buf[512];
    cr_assert_leq(size, (int64_t)sizeof(buf));
    sr__heap_counters_get(&c0);
    cr_assert_eq(sr__codec_encode(2, args, 0, buf, sizeof(buf)), -EIO);
    sr__heap_counters_get(&c1);
    cr_assert_neq(sr__tensor_block(moved), sent, "the write moved the tensor to a copy");
    /* Made: the copy and sr_fill_'s scalar. Freed: the scalar and the block
     * that was sent (its last reference was the descriptor's). */
    cr_assert_eq(c1.allocs - c0.allocs, 2);
    cr_assert_eq(c1.local_frees - c0.local_frees, 2, "the unwinding freed the block that was sent");
    cr_assert_eq(sr__block_refcount(sr__tensor_block(moved)), 1, "and left the copy alone");
    tu_expect(moved, (double[64]){5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
                                  5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
                                  5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
              64, 0, 0, "the write");
    sr_value_unref(args[0]);
    sr_value_unref(args[1]);
    sr__modules[slot] = saved;
    sr_tensor_unref(moved);
    sr__heap_counters_get(&end);
    cr_assert_eq(end.allocs - start.allocs, end.local_frees - start.local_frees, "no block leaked");
}

/* The names renamed by the ownership convention (docs/API.md, "Ownership")
 * still work for one release, with their old ownership. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
Test(value, deprecated_names_keep_working)
{
    sr_tensor *t = sr_zeros(SR_F64, 1, (const int64_t[]){3}, 0);
    sr_value *a = sr_tensor_value(t), *b = sr_value_from_tensor(t);
    cr_assert(a && b && sr_value_tensor(a) == t && sr_value_equal(a, b), "%s", sr_last_error());
    sr_value_unref(a);
    sr_value_unref(b);
    sr_tensor_unref(t);
}
#pragma GCC diagnostic pop
