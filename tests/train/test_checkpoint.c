/* SPDX-License-Identifier: MIT */
/* Checkpoints: round trips, metadata, restore_into, every kind of damage,
 * and crashes of a writer at each phase of a save.
 *
 * Each test works in a directory of its own under /tmp, made by the suite's
 * init and removed (with everything in it) by its fini. A crash is a forked
 * child stopped by the test hook at a chosen phase: it reports on a pipe
 * and blocks in pause() until the parent SIGKILLs it, so nothing sleeps. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/checkpoint_impl.h"
#include "checkpoint/format.h"
#include "checkpoint/io.h"
#include "bounded.h"
#include "common.h"
#include "shmrpc/checkpoint.h"
#include "tensor_util.h"

static char g_dir[64];
static char g_path[128]; /* g_dir/ck.bin */

static void remove_dir(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(dirfd(d), de->d_name, 0);
    if (d)
        closedir(d);
    rmdir(g_dir);
}

static void setup(void)
{
    strcpy(g_dir, "/tmp/sr-ckpt-XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp: %s", strerror(errno));
    snprintf(g_path, sizeof(g_path), "%s/ck.bin", g_dir);
}

static void teardown(void)
{
    remove_dir();
    sr_test_no_leaks();
}

TestSuite(ckpt, .init = setup, .fini = teardown);
TestSuite(ckpt_corrupt, .init = setup, .fini = teardown);
TestSuite(ckpt_crash, .init = setup, .fini = teardown);

/* ---- helpers ---- */

/* Names in g_dir, sorted, joined with spaces: "ck.bin" when clean. */
static const char *dir_listing(void)
{
    static char buf[1024];
    struct dirent **list;
    int n = scandir(g_dir, &list, NULL, alphasort);
    cr_assert(n >= 0);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i]->d_name, ".") && strcmp(list[i]->d_name, ".."))
            snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%s", buf[0] ? " " : "", list[i]->d_name);
        free(list[i]);
    }
    free(list);
    return buf;
}

static uint8_t *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "fopen %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    uint8_t *buf = malloc(*len ? *len : 1);
    cr_assert(fread(buf, 1, *len, f) == *len);
    fclose(f);
    return buf;
}

static void write_whole(const char *path, const uint8_t *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert(fwrite(buf, 1, len, f) == len);
    fclose(f);
}

static void expect_error(const char *frag1, const char *frag2)
{
    const char *e = sr_last_error();
    cr_assert(strstr(e, frag1), "error '%s' lacks '%s'", e, frag1);
    if (frag2)
        cr_assert(strstr(e, frag2), "error '%s' lacks '%s'", e, frag2);
}

/* The load fails with err, names the file and says frag. */
static void expect_load_fails(const char *path, int err, const char *frag)
{
    sr_checkpoint *c = (sr_checkpoint *)1;
    int rc = sr_checkpoint_load(path, &c);
    cr_assert_eq(rc, err, "load: %d (%s), expected %d; %s", rc, sr_strerror(rc), err, sr_last_error());
    cr_assert_null(c);
    expect_error(path, frag);
}

/* The "basic" checkpoint of generation g: three tensors and two metadata
 * entries whose values all depend on g. */
static const char *const basic_names[] = {"fc1.weight", "fc1.bias", "optim.step_counts"};
static const char *const basic_meta[] = {"step", "epoch"};

static int save_basic(const char *path, int g)
{
    sr_tensor *ts[3] = {
        tu_tensor(SR_F32, 2, SHAPE(2, 3), VALS(g, g + 1, g + 2, g + 3, g + 4, g + 5), 0),
        tu_tensor(SR_F64, 1, SHAPE(3), VALS(-g, 0.5 * g, 1e300), 0),
        tu_tensor(SR_I64, 2, SHAPE(2, 2), VALS(g, (double)(1LL << 40), -7, 0), 0),
    };
    int64_t meta[2] = {1000 * g, g};
    int rc = sr_checkpoint_save(path, 3, basic_names, ts, 2, basic_meta, meta);
    for (int i = 0; i < 3; i++)
        sr_tensor_unref(ts[i]);
    return rc;
}

static void expect_basic(const sr_checkpoint *c, int g)
{
    cr_assert_eq(sr_checkpoint_count(c), 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert_str_eq(sr_checkpoint_name(c, i), basic_names[i]);
    sr_tensor *w = sr_checkpoint_tensor(c, "fc1.weight"), *b = sr_checkpoint_tensor(c, "fc1.bias"),
              *s = sr_checkpoint_tensor(c, "optim.step_counts");
    tu_expect_shape(w, 2, SHAPE(2, 3), "weight");
    cr_assert_eq(sr_tensor_dtype(w), SR_F32);
    tu_expect(w, VALS(g, g + 1, g + 2, g + 3, g + 4, g + 5), 6, 0, 0, "weight");
    cr_assert_eq(sr_tensor_dtype(b), SR_F64);
    tu_expect(b, VALS(-g, 0.5 * g, 1e300), 3, 0, 0, "bias");
    cr_assert_eq(sr_tensor_dtype(s), SR_I64);
    tu_expect(s, VALS(g, (double)(1LL << 40), -7, 0), 4, 0, 0, "steps");
    int64_t v;
    cr_assert_eq(sr_checkpoint_meta(c, "step", &v), 0);
    cr_assert_eq(v, 1000 * g);
    cr_assert_eq(sr_checkpoint_meta(c, "epoch", &v), 0);
    cr_assert_eq(v, g);
}

static void expect_basic_file(const char *path, int g)
{
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(path, &c), 0, "%s", sr_last_error());
    expect_basic(c, g);
    sr_checkpoint_destroy(c);
}

/* ---- round trips ---- */

Test(ckpt, round_trip_dtypes_and_shapes)
{
    const char *names[] = {"f32", "f64", "i64", "scalar", "empty", "empty_i64", "ones", "rank8"};
    sr_tensor *ts[] = {
        tu_tensor(SR_F32, 2, SHAPE(2, 3), VALS(1.5, -2, 3, 4, 5, 6.25), 0),
        tu_tensor(SR_F64, 1, SHAPE(4), VALS(1e-300, -0.0, 3.141592653589793, 1e300), 0),
        tu_tensor(SR_I64, 3, SHAPE(2, 1, 2), VALS(-1, 2, (double)(1LL << 52), -(double)(1LL << 52)), 0),
        sr_scalar_tensor(SR_F64, 42.5, 0),
        sr_zeros(SR_F32, 2, SHAPE(0, 5), 0),
        sr_zeros(SR_I64, 1, SHAPE(0), 0),
        sr_ones(SR_F32, 3, SHAPE(1, 1, 1), 0),
        sr_arange(SR_F64, 0, 8, 1, 0),
    };
    sr_tensor *r8 = sr_view(ts[7], 8, SHAPE(1, 2, 1, 2, 1, 2, 1, 1));
    sr_tensor_unref(ts[7]);
    ts[7] = r8;
    cr_assert_eq(sr_checkpoint_save(g_path, 8, names, ts, 0, NULL, NULL), 0, "%s", sr_last_error());
    cr_assert_str_eq(dir_listing(), "ck.bin", "no temporary file is left behind");

    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_count(c), 8);
    cr_assert_null(sr_checkpoint_name(c, 8));
    for (size_t i = 0; i < 8; i++) {
        cr_assert_str_eq(sr_checkpoint_name(c, i), names[i], "saved order is kept");
        sr_tensor *t = sr_checkpoint_tensor(c, names[i]);
        cr_assert(t, "%s", sr_last_error());
        cr_assert_eq(sr_tensor_dtype(t), sr_tensor_dtype(ts[i]), "%s dtype", names[i]);
        tu_expect_shape(t, sr_tensor_ndim(ts[i]), sr_tensor_shape(ts[i]), names[i]);
        double want[16], got[16];
        size_t n = sr_tensor_numel(t);
        cr_assert_eq(sr_tensor_to_f64(ts[i], want, 16), 0);
        cr_assert_eq(sr_tensor_to_f64(t, got, 16), 0);
        cr_assert_arr_eq(got, want, n * sizeof(double), "%s values", names[i]);
        cr_assert(!sr_tensor_requires_grad(t));
    }
    sr_tensor *sc = sr_tensor_ref(sr_checkpoint_tensor(c, "scalar"));
    cr_assert_eq(sr_tensor_ndim(sc), 0);
    cr_assert_eq(sr_tensor_item(sc), 42.5);
    sr_checkpoint_destroy(c);
    cr_assert_eq(sr_tensor_item(sc), 42.5, "a tensor referenced outlives its checkpoint");
    sr_tensor_unref(sc);
    for (size_t i = 0; i < 8; i++)
        sr_tensor_unref(ts[i]);
}

Test(ckpt, non_contiguous_views_are_saved_row_major)
{
    sr_tensor *base = tu_tensor(SR_F32, 2, SHAPE(3, 4), VALS(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), SR_REQUIRES_GRAD);
    sr_tensor *tr = sr_t(base);            /* [4, 3], strides [1, 4] */
    sr_tensor *nar = sr_narrow(base, 1, 1, 2); /* [3, 2], strides [4, 1] */
    cr_assert(!sr_tensor_is_contiguous(tr) && !sr_tensor_is_contiguous(nar));
    const char *names[] = {"t", "narrow"};
    sr_tensor *ts[] = {tr, nar};
    cr_assert_eq(sr_checkpoint_save(g_path, 2, names, ts, 0, NULL, NULL), 0, "%s", sr_last_error());

    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    sr_tensor *a = sr_checkpoint_tensor(c, "t"), *b = sr_checkpoint_tensor(c, "narrow");
    tu_expect_shape(a, 2, SHAPE(4, 3), "t");
    tu_expect(a, VALS(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11), 12, 0, 0, "t");
    tu_expect_shape(b, 2, SHAPE(3, 2), "narrow");
    tu_expect(b, VALS(1, 2, 5, 6, 9, 10), 6, 0, 0, "narrow");
    cr_assert(sr_tensor_is_contiguous(a) && sr_tensor_is_contiguous(b));
    sr_checkpoint_destroy(c);
    sr_tensor_unref(tr);
    sr_tensor_unref(nar);
    sr_tensor_unref(base);
}

Test(ckpt, metadata)
{
    const char *mn[] = {"step", "epoch", "min", "max", "neg"};
    int64_t mv[] = {12345, 7, INT64_MIN, INT64_MAX, -1};
    cr_assert_eq(sr_checkpoint_save(g_path, 0, NULL, NULL, 5, mn, mv), 0, "%s", sr_last_error());
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_count(c), 0);
    cr_assert_eq(sr_checkpoint_meta_count(c), 5);
    for (size_t i = 0; i < 5; i++) {
        int64_t v = 0;
        cr_assert_str_eq(sr_checkpoint_meta_name(c, i), mn[i]);
        cr_assert_eq(sr_checkpoint_meta(c, mn[i], &v), 0);
        cr_assert_eq(v, mv[i], "%s", mn[i]);
    }
    cr_assert_null(sr_checkpoint_meta_name(c, 5));
    int64_t v = 99;
    cr_assert_eq(sr_checkpoint_meta(c, "lr", &v), -ENOENT);
    expect_error("sr_checkpoint_meta", "no metadata 'lr'");
    cr_assert_eq(v, 99);
    cr_assert_null(sr_checkpoint_tensor(c, "step"), "tensors and metadata are separate namespaces");
    expect_error("sr_checkpoint_tensor", "no tensor 'step'");
    sr_checkpoint_destroy(c);
}

Test(ckpt, overwrite_replaces_the_old_checkpoint)
{
    cr_assert_eq(save_basic(g_path, 1), 0, "%s", sr_last_error());
    expect_basic_file(g_path, 1);
    cr_assert_eq(save_basic(g_path, 2), 0, "%s", sr_last_error());
    expect_basic_file(g_path, 2);
    /* A smaller file over a larger one: nothing of the old one survives. */
    sr_tensor *one = sr_ones(SR_F32, 1, SHAPE(1), 0);
    const char *nm[] = {"only"};
    cr_assert_eq(sr_checkpoint_save(g_path, 1, nm, &one, 0, NULL, NULL), 0, "%s", sr_last_error());
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_count(c), 1);
    cr_assert_eq(sr_checkpoint_meta_count(c), 0);
    sr_checkpoint_destroy(c);
    sr_tensor_unref(one);
    cr_assert_str_eq(dir_listing(), "ck.bin");
}

Test(ckpt, relative_path_in_the_current_directory)
{
    char cwd[4096];
    cr_assert(getcwd(cwd, sizeof(cwd)));
    cr_assert_eq(chdir(g_dir), 0);
    cr_assert_eq(save_basic("rel.bin", 3), 0, "%s", sr_last_error());
    expect_basic_file("rel.bin", 3);
    cr_assert_eq(chdir(cwd), 0);
    cr_assert_str_eq(dir_listing(), "rel.bin");
}

/* Many tensors (more than the ring's depth) and one over several write
 * chunks: slots are reused and a tensor spans several requests. */
Test(ckpt, many_tensors_and_a_large_one)
{
    enum { N = 100 };
    char names[N][16];
    const char *nm[N];
    sr_tensor *ts[N];
    for (int i = 0; i < N - 1; i++) {
        snprintf(names[i], sizeof(names[i]), "p%d", i);
        ts[i] = sr_full(SR_F64, 1, SHAPE(i % 7 + 1), i, 0);
    }
    snprintf(names[N - 1], sizeof(names[N - 1]), "big");
    int64_t big = (int64_t)(SR__CKPT_CHUNK / 8) * 2 + 3; /* f64: two chunks and a bit */
    ts[N - 1] = sr_arange(SR_F64, 0, (double)big, 1, 0);
    for (int i = 0; i < N; i++)
        nm[i] = names[i];
    cr_assert_eq(sr_checkpoint_save(g_path, N, nm, ts, 0, NULL, NULL), 0, "%s", sr_last_error());
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    for (int i = 0; i < N - 1; i++) {
        sr_tensor *t = sr_checkpoint_tensor(c, nm[i]);
        cr_assert_eq(sr_tensor_numel(t), (size_t)(i % 7 + 1));
        cr_assert_eq(((const double *)sr_tensor_data(t))[0], i);
    }
    sr_tensor *t = sr_checkpoint_tensor(c, "big");
    const double *d = sr_tensor_data(t);
    for (int64_t i = 0; i < big; i++)
        if (d[i] != (double)i)
            cr_assert_fail("big[%lld] = %g", (long long)i, d[i]);
    sr_checkpoint_destroy(c);
    for (int i = 0; i < N; i++)
        sr_tensor_unref(ts[i]);
}

/* The plain-syscall fallback writes the same bytes as io_uring. */
Test(ckpt, sync_fallback_writes_identical_bytes)
{
    char other[192];
    snprintf(other, sizeof(other), "%s/sync.bin", g_dir);
    cr_assert_eq(save_basic(g_path, 4), 0, "%s", sr_last_error());
    setenv("SHMRPC_CKPT_IO", "sync", 1);
    cr_assert_eq(save_basic(other, 4), 0, "%s", sr_last_error());
    unsetenv("SHMRPC_CKPT_IO");
    size_t la, lb;
    uint8_t *a = read_whole(g_path, &la), *b = read_whole(other, &lb);
    cr_assert_eq(la, lb);
    cr_assert_arr_eq(a, b, la);
    cr_assert_eq(la % SR__CKPT_ALIGN, 0, "data ends padded to 64 bytes");
    free(a);
    free(b);
    expect_basic_file(other, 4);
}

/* ---- errors of the API ---- */

Test(ckpt, missing_file_is_enoent_naming_it)
{
    char p[192];
    snprintf(p, sizeof(p), "%s/nope.bin", g_dir);
    expect_load_fails(p, -ENOENT, "No such file");
}

/* ---- files that are not regular: answered at once, never a hang ---- */

static int load_g_path(void)
{
    sr_checkpoint *c = NULL;
    int rc = sr_checkpoint_load(g_path, &c);
    sr_checkpoint_destroy(c);
    return rc;
}

Test(ckpt, load_of_a_fifo_is_refused_at_once)
{
    cr_assert_eq(mkfifo(g_path, 0600), 0, "mkfifo: %s", strerror(errno));
    struct bounded b = run_bounded(load_g_path, "loading a FIFO");
    cr_assert_eq(b.rc, -EINVAL, "load of a FIFO: %d: %s", b.rc, b.err);
    cr_assert(strstr(b.err, g_path) && strstr(b.err, "is a FIFO, not a regular file"), "error: %s", b.err);
    /* A directory too: refused by what it is, naming the path. */
    cr_assert_eq(unlink(g_path), 0);
    cr_assert_eq(mkdir(g_path, 0700), 0);
    expect_load_fails(g_path, -EINVAL, "is a directory, not a regular file");
    cr_assert_eq(rmdir(g_path), 0);
}

/* The temporary name carries the saver's pid: the child puts a FIFO there. */
static int save_with_a_fifo_at_the_tmp_name(void)
{
    char tmp[192];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", g_path, (int)getpid());
    if (mkfifo(tmp, 0600))
        return sr_errorf(-errno, "mkfifo %s: %s", tmp, strerror(errno));
    int rc = save_basic(g_path, 1);
    char err[512];
    snprintf(err, sizeof(err), "%s", sr_last_error());
    struct stat st;
    if (lstat(tmp, &st) || !S_ISFIFO(st.st_mode))
        return sr_errorf(-EPROTO, "the FIFO at %s was replaced or removed (save gave %d: %s)", tmp, rc, err);
    if (!rc || access(g_path, F_OK) == 0)
        return sr_errorf(-EPROTO, "the save gave %d and left %s %s", rc, g_path,
                         access(g_path, F_OK) ? "absent" : "present");
    return sr_errorf(rc, "%s", err);
}

Test(ckpt, save_with_a_fifo_at_its_temporary_name_is_refused_at_once)
{
    struct bounded b = run_bounded(save_with_a_fifo_at_the_tmp_name, "saving past a FIFO");
    cr_assert_eq(b.rc, -EINVAL, "save: %d: %s", b.rc, b.err);
    cr_assert(strstr(b.err, ".tmp.") && strstr(b.err, "is a FIFO, not a regular file"), "error: %s", b.err);
    /* This process's own temporary name is free: its save works. */
    cr_assert_eq(save_basic(g_path, 2), 0, "%s", sr_last_error());
    expect_basic_file(g_path, 2);
}

Test(ckpt, save_rejects_bad_arguments)
{
    sr_tensor *a = sr_ones(SR_F32, 1, SHAPE(2), 0);
    sr_tensor *ts[] = {a, a};
    const char *dup[] = {"w", "w"}, *empty[] = {"w", ""};
    cr_assert_eq(sr_checkpoint_save(g_path, 2, dup, ts, 0, NULL, NULL), -EINVAL);
    expect_error("sr_checkpoint_save", "tensor name 'w' appears twice");
    cr_assert_eq(sr_checkpoint_save(g_path, 2, empty, ts, 0, NULL, NULL), -EINVAL);
    expect_error("sr_checkpoint_save", "tensor name 1 is empty");
    sr_tensor *nul[] = {a, NULL};
    const char *ok[] = {"a", "b"};
    cr_assert_eq(sr_checkpoint_save(g_path, 2, ok, nul, 0, NULL, NULL), -EINVAL);
    expect_error("tensor 1 ('b') is NULL", NULL);
    char longname[SR_CHECKPOINT_NAME_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    const char *lng[] = {longname};
    cr_assert_eq(sr_checkpoint_save(g_path, 1, lng, ts, 0, NULL, NULL), -EINVAL);
    expect_error("longer than SR_CHECKPOINT_NAME_MAX", NULL);
    int64_t mv[] = {1, 2};
    cr_assert_eq(sr_checkpoint_save(g_path, 0, NULL, NULL, 2, dup, mv), -EINVAL);
    expect_error("metadata name 'w' appears twice", NULL);
    char dirpath[192];
    snprintf(dirpath, sizeof(dirpath), "%s/", g_dir);
    cr_assert_eq(sr_checkpoint_save(dirpath, 1, ok, ts, 0, NULL, NULL), -EINVAL);
    expect_error("names a directory", NULL);
    cr_assert_eq(sr_checkpoint_save(NULL, 1, ok, ts, 0, NULL, NULL), -EINVAL);
    char nodir[192];
    snprintf(nodir, sizeof(nodir), "%s/missing/ck.bin", g_dir);
    cr_assert_eq(sr_checkpoint_save(nodir, 1, ok, ts, 0, NULL, NULL), -ENOENT);
    expect_error("opening directory", "/missing");
    cr_assert_str_eq(dir_listing(), "", "a failed save leaves nothing");
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(NULL, &c), -EINVAL);
    cr_assert_eq(sr_checkpoint_load(g_path, NULL), -EINVAL);
    sr_tensor_unref(a);
}

/* A write that fails half-way (the file-size limit stands in for a full
 * disk) is reported naming the file, and leaves the old checkpoint and no
 * temporary file; with io_uring and with the fallback. */
static void failed_write_leaves_the_old_file(void)
{
    cr_assert_eq(save_basic(g_path, 1), 0, "%s", sr_last_error());
    struct rlimit lim = {2048, 2048};
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    sr_tensor *big = sr_zeros(SR_F64, 1, SHAPE(1024), 0);
    const char *nm[] = {"big"};
    cr_assert_eq(sr_checkpoint_save(g_path, 1, nm, &big, 0, NULL, NULL), -EFBIG);
    expect_error("sr_checkpoint_save: writing", ".tmp.");
    cr_assert_str_eq(dir_listing(), "ck.bin");
    expect_basic_file(g_path, 1);
    sr_tensor_unref(big);
}

Test(ckpt, failed_write_leaves_the_old_file)
{
    failed_write_leaves_the_old_file();
}

Test(ckpt, failed_write_leaves_the_old_file_sync)
{
    setenv("SHMRPC_CKPT_IO", "sync", 1);
    failed_write_leaves_the_old_file();
}

/* Threads of one process saving one path take turns on the temporary
 * file; every save succeeds and the survivor is one of them, whole. */
static void *save_loop(void *arg)
{
    intptr_t g = (intptr_t)arg;
    for (int i = 0; i < 20; i++)
        if (save_basic(g_path, (int)g))
            return (void *)1;
    return NULL;
}

Test(ckpt, threads_saving_one_path)
{
    pthread_t th[3];
    for (intptr_t i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, save_loop, (void *)(i + 1)), 0);
    for (int i = 0; i < 3; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        cr_assert_null(ret, "a save failed: %s", sr_last_error());
    }
    cr_assert_str_eq(dir_listing(), "ck.bin");
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    int64_t g;
    cr_assert_eq(sr_checkpoint_meta(c, "epoch", &g), 0);
    cr_assert(g >= 1 && g <= 3);
    expect_basic(c, (int)g);
    sr_checkpoint_destroy(c);
}

/* ---- restore_into ---- */

Test(ckpt, restore_into_copies_in_place)
{
    cr_assert_eq(save_basic(g_path, 5), 0, "%s", sr_last_error());
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());
    /* A leaf that requires grad, and a transposed view of a [3, 2] base. */
    sr_tensor *w = sr_zeros(SR_F32, 2, SHAPE(2, 3), SR_REQUIRES_GRAD);
    sr_tensor *bbase = sr_zeros(SR_F64, 2, SHAPE(3, 1), 0);
    sr_tensor *b = sr_view(bbase, 1, SHAPE(3));
    sr_tensor *s = sr_zeros(SR_I64, 2, SHAPE(2, 2), 0);
    sr_tensor *sv = sr_t(s);
    const void *wdata = sr_tensor_data(w);
    sr_tensor *dst[] = {w, b, sv};
    const char *nm[] = {"fc1.weight", "fc1.bias", "optim.step_counts"};
    cr_assert_eq(sr_checkpoint_restore_into(c, 3, nm, dst), 0, "%s", sr_last_error());
    cr_assert_eq(sr_tensor_data(w), wdata, "in place");
    tu_expect(w, VALS(5, 6, 7, 8, 9, 10), 6, 0, 0, "w");
    cr_assert(sr_tensor_requires_grad(w) && !sr_tensor_grad_fn_name(w), "still a leaf");
    tu_expect(bbase, VALS(-5, 2.5, 1e300), 3, 0, 0, "b through its base");
    tu_expect(s, VALS(5, -7, (double)(1LL << 40), 0), 4, 0, 0, "s (restored through its transpose)");
    sr_tensor *dsts[] = {w, b, s, sv, bbase};
    for (int i = 0; i < 5; i++)
        sr_tensor_unref(dsts[i]);
    sr_checkpoint_destroy(c);
}

Test(ckpt, restore_into_mismatch_changes_nothing)
{
    sr_tensor *w = sr_zeros(SR_F32, 2, SHAPE(128, 784), 0);
    const char *nm[] = {"fc1.weight", "fc1.bias"};
    sr_tensor *src[] = {w, w};
    cr_assert_eq(sr_checkpoint_save(g_path, 1, nm, src, 0, NULL, NULL), 0, "%s", sr_last_error());
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(g_path, &c), 0, "%s", sr_last_error());

    sr_tensor *small = sr_full(SR_F32, 2, SHAPE(64, 784), 3, 0);
    cr_assert_eq(sr_checkpoint_restore_into(c, 1, nm, &small), -EINVAL);
    cr_assert_str_eq(sr_last_error(), "sr_checkpoint_restore_into: 'fc1.weight' has shape [128, 784] in the "
                                      "checkpoint, [64, 784] in the model");
    sr_tensor *f64 = sr_full(SR_F64, 2, SHAPE(128, 784), 3, 0);
    cr_assert_eq(sr_checkpoint_restore_into(c, 1, nm, &f64), -EINVAL);
    expect_error("'fc1.weight' is f32 in the checkpoint, f64 in the model", NULL);
    /* A good first pair and a missing second: the first is not copied. */
    sr_tensor *good = sr_full(SR_F32, 2, SHAPE(128, 784), 3, 0);
    sr_tensor *dst[] = {good, good};
    cr_assert_eq(sr_checkpoint_restore_into(c, 2, nm, dst), -ENOENT);
    expect_error("has no tensor 'fc1.bias'", g_path);
    cr_assert_eq(((const float *)sr_tensor_data(good))[0], 3.0f, "nothing copied before the check failed");
    /* A view of a parameter made with grad mode on is not a leaf. */
    sr_tensor *param = sr_zeros(SR_F32, 2, SHAPE(128, 784), SR_REQUIRES_GRAD);
    sr_tensor *view = sr_view(param, 2, SHAPE(128, 784));
    cr_assert_eq(sr_checkpoint_restore_into(c, 1, nm, &view), -EPERM);
    expect_error("'fc1.weight' in the model is a non-leaf that requires grad", NULL);
    sr_tensor_unref(view);
    sr_tensor_unref(param);
    sr_tensor_unref(small);
    sr_tensor_unref(f64);
    sr_tensor_unref(good);
    sr_tensor_unref(w);
    sr_checkpoint_destroy(c);
}

/* ---- damaged files ---- */

/* The basic checkpoint, read into memory. */
static uint8_t *basic_image(size_t *len, sr__ckpt_header *h)
{
    cr_assert_eq(save_basic(g_path, 1), 0, "%s", sr_last_error());
    uint8_t *img = read_whole(g_path, len);
    sr__ckpt_get_header(img, h);
    return img;
}

static uint8_t *entry_at(uint8_t *img, size_t i)
{
    return img + SR__CKPT_HEADER_SIZE + i * SR__CKPT_ENTRY_SIZE;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Write img (resealed when asked) over the checkpoint and expect the load
 * to fail with -EBADMSG saying frag. */
static void expect_damage(uint8_t *img, size_t len, bool reseal, const char *frag)
{
    if (reseal)
        sr__ckpt_reseal(img, len);
    write_whole(g_path, img, len);
    expect_load_fails(g_path, -EBADMSG, frag);
}

Test(ckpt_corrupt, flipped_data_byte_is_a_checksum_error)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    for (size_t i = 0; i < 3; i++) {
        sr__ckpt_entry e;
        sr__ckpt_get_entry(entry_at(img, i), &e);
        size_t at = (size_t)(e.offset + e.nbytes / 2);
        img[at] ^= 0x10;
        char frag[128];
        snprintf(frag, sizeof(frag), "tensor '%s' checksum mismatch", basic_names[i]);
        expect_damage(img, len, false, frag);
        img[at] ^= 0x10;
    }
    write_whole(g_path, img, len);
    expect_basic_file(g_path, 1);
    free(img);
}

Test(ckpt_corrupt, flipped_header_or_toc_byte)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    img[SR__CKPT_H_FILE_SIZE] ^= 1;
    expect_damage(img, len, false, "header checksum mismatch");
    img[SR__CKPT_H_FILE_SIZE] ^= 1;
    img[SR__CKPT_HEADER_SIZE + h.toc_size - 1] ^= 1; /* last byte of the name table */
    expect_damage(img, len, false, "table of contents checksum mismatch");
    free(img);
}

Test(ckpt_corrupt, truncated_anywhere)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    sr__ckpt_entry last;
    sr__ckpt_get_entry(entry_at(img, 2), &last);
    size_t cuts[] = {0, 1, 63, 64, 64 + (size_t)h.toc_size / 2, (size_t)h.data_offset, (size_t)h.data_offset + 5,
                     (size_t)(last.offset + last.nbytes - 1), len - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        write_whole(g_path, img, cuts[i]);
        expect_load_fails(g_path, -EBADMSG, "truncated");
    }
    write_whole(g_path, img, 0);
    expect_load_fails(g_path, -EBADMSG, "truncated: header needs 64 bytes, file has 0");
    write_whole(g_path, img, 100);
    char want[128];
    snprintf(want, sizeof(want), "truncated: table of contents needs %llu bytes, file has 100",
             (unsigned long long)(64 + h.toc_size));
    expect_load_fails(g_path, -EBADMSG, want);
    free(img);
}

Test(ckpt_corrupt, bad_magic_and_version)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    img[0] = 'X';
    expect_damage(img, len, true, "not a shmrpc checkpoint (bad magic)");
    img[0] = 'S';
    put_u32(img + SR__CKPT_H_VERSION, 2);
    expect_damage(img, len, true, "unsupported format version 2 (this build reads version 1)");
    put_u32(img + SR__CKPT_H_VERSION, 1);
    put_u32(img + SR__CKPT_H_FLAGS, 4);
    expect_damage(img, len, true, "flags 0x00000004");
    free(img);
}

/* Forged files whose checksums are right: each rule is still checked. */
Test(ckpt_corrupt, offsets_past_the_end)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    uint8_t *copy = malloc(len);

    memcpy(copy, img, len);
    put_u64(copy + SR__CKPT_H_TOC_SIZE, 1ull << 40);
    expect_damage(copy, len, true, "truncated: table of contents needs 1099511627840 bytes");
    memcpy(copy, img, len);
    put_u64(copy + SR__CKPT_H_TOC_SIZE, UINT64_MAX - 10);
    expect_damage(copy, len, true, "truncated: table of contents needs");

    memcpy(copy, img, len);
    put_u64(entry_at(copy, 2) + SR__CKPT_E_OFFSET, (uint64_t)len + 64 * 10);
    expect_damage(copy, len, true, "truncated: tensor 'optim.step_counts' needs 32 bytes at offset");
    memcpy(copy, img, len);
    put_u64(entry_at(copy, 2) + SR__CKPT_E_OFFSET, UINT64_MAX - 63); /* offset + nbytes wraps */
    expect_damage(copy, len, true, "tensor 'optim.step_counts' needs 32 bytes at offset 18446744073709551552");
    memcpy(copy, img, len);
    put_u32(entry_at(copy, 1) + SR__CKPT_E_NAME_OFF, 1u << 30);
    expect_damage(copy, len, true, "tensor 1 name at [1073741824, ");
    memcpy(copy, img, len);
    put_u32(copy + SR__CKPT_H_NTENSORS, 1u << 30);
    expect_damage(copy, len, true, "tensors and 2 metadata entries need");
    free(copy);
    free(img);
}

Test(ckpt_corrupt, bad_entries)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    uint8_t *copy = malloc(len);
    struct {
        size_t entry, field;
        uint64_t value;
        bool wide;
        const char *frag;
    } cases[] = {
        {0, SR__CKPT_E_DTYPE, 3, false, "tensor 'fc1.weight' has unknown dtype 3"},
        {0, SR__CKPT_E_NDIM, 9, false, "tensor 'fc1.weight' has 9 dims, at most 8"},
        {0, SR__CKPT_E_SHAPE + 8, (uint64_t)-3, true, "bad size -3 in slot 1"},
        {0, SR__CKPT_E_SHAPE + 16, 1, true, "bad size 1 in slot 2"},
        {0, SR__CKPT_E_SHAPE, 1ull << 62, true, "too large to address"},
        {1, SR__CKPT_E_NBYTES, 16, true, "tensor 'fc1.bias' has 16 bytes, its shape and dtype need 24"},
        {1, SR__CKPT_E_OFFSET, h.data_offset + 8, true, "bad data offset"},
        {2, SR__CKPT_E_OFFSET, h.data_offset, true, "bad data offset"}, /* overlaps fc1.weight */
        {1, SR__CKPT_E_NAME_LEN, 0, false, "tensor 1 has a name of 0 bytes"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, img, len);
        uint8_t *p = entry_at(copy, cases[i].entry) + cases[i].field;
        if (cases[i].wide)
            put_u64(p, cases[i].value);
        else
            put_u32(p, (uint32_t)cases[i].value);
        expect_damage(copy, len, true, cases[i].frag);
    }
    /* Name 1 made equal to name 0 ("fc1.weight" is 10 bytes from 0). */
    memcpy(copy, img, len);
    put_u32(entry_at(copy, 1) + SR__CKPT_E_NAME_OFF, 0);
    put_u32(entry_at(copy, 1) + SR__CKPT_E_NAME_LEN, 10);
    expect_damage(copy, len, true, "tensor name 'fc1.weight' appears twice");
    /* A NUL inside a name. */
    memcpy(copy, img, len);
    uint8_t *table = copy + SR__CKPT_HEADER_SIZE + 3 * SR__CKPT_ENTRY_SIZE + 2 * SR__CKPT_META_SIZE;
    table[2] = 0;
    expect_damage(copy, len, true, "tensor 0 name contains a NUL byte");
    /* Bytes appended after the end. */
    uint8_t *longer = calloc(1, len + 64);
    memcpy(longer, img, len);
    expect_damage(longer, len + 64, false, "trailing bytes");
    free(longer);
    free(copy);
    free(img);
}

/* Every single-byte change of a file either fails the load with -EBADMSG
 * or (a padding byte, which carries nothing) loads the original values. */
Test(ckpt_corrupt, every_byte_flipped)
{
    size_t len;
    sr__ckpt_header h;
    uint8_t *img = basic_image(&len, &h);
    size_t failed = 0;
    for (size_t i = 0; i < len; i++) {
        img[i] ^= 0x5a;
        write_whole(g_path, img, len);
        img[i] ^= 0x5a;
        sr_checkpoint *c;
        int rc = sr_checkpoint_load(g_path, &c);
        if (rc == 0) {
            expect_basic(c, 1);
            sr_checkpoint_destroy(c);
        } else if (rc != -EBADMSG) {
            cr_assert_fail("byte %zu: %d %s", i, rc, sr_last_error());
        } else {
            failed++;
        }
    }
    size_t padding = (size_t)(h.data_offset - 64 - h.toc_size);
    for (size_t i = 0; i < 3; i++) {
        sr__ckpt_entry e;
        sr__ckpt_get_entry(entry_at(img, i), &e);
        padding += (size_t)(sr__ckpt_align(e.nbytes) - e.nbytes);
    }
    cr_assert_eq(failed, len - padding, "every byte but the padding is checked");
    free(img);
}

/* ---- crashes ---- */

static int g_stop_phase, g_report_fd;

static void stop_hook(int phase, const char *tmp_path)
{
    (void)tmp_path;
    if (phase != g_stop_phase)
        return;
    char b = (char)phase;
    if (write(g_report_fd, &b, 1) != 1)
        _exit(3);
    for (;;)
        pause(); /* until the parent's SIGKILL */
}

/* Fork a child that saves generation g and stops at phase; returns once it
 * is stopped there, with its pid. */
static pid_t writer_stopped_at(int phase, int g)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        g_stop_phase = phase;
        g_report_fd = fds[1];
        sr__ckpt_test_hook = stop_hook;
        save_basic(g_path, g);
        _exit(2); /* the hook never returned: only an error gets here */
    }
    close(fds[1]);
    char b;
    ssize_t n = read(fds[0], &b, 1);
    close(fds[0]);
    cr_assert_eq(n, 1, "the writer did not reach phase %d", phase);
    return pid;
}

static void kill_writer(pid_t pid)
{
    int st;
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

Test(ckpt_crash, killed_at_each_phase_leaves_a_loadable_checkpoint)
{
    for (int phase = SR__CKPT_TMP_CREATED; phase < SR__CKPT_NPHASES; phase++) {
        cr_assert_eq(save_basic(g_path, 1), 0, "%s", sr_last_error());
        pid_t pid = writer_stopped_at(phase, 2);
        kill_writer(pid);
        char tmp[64];
        snprintf(tmp, sizeof(tmp), "ck.bin ck.bin.tmp.%d", (int)pid);
        if (phase < SR__CKPT_RENAMED) {
            cr_assert_str_eq(dir_listing(), tmp, "phase %d: the dead writer's file is still there", phase);
            expect_basic_file(g_path, 1); /* the old checkpoint, intact */
        } else {
            cr_assert_str_eq(dir_listing(), "ck.bin");
            expect_basic_file(g_path, 2); /* renamed: the new one, complete */
        }
        /* The next save succeeds and removes what the crash left. */
        cr_assert_eq(save_basic(g_path, 3), 0, "phase %d: %s", phase, sr_last_error());
        cr_assert_str_eq(dir_listing(), "ck.bin", "phase %d", phase);
        expect_basic_file(g_path, 3);
    }
}

Test(ckpt_crash, a_live_writers_file_is_left_alone)
{
    cr_assert_eq(save_basic(g_path, 1), 0, "%s", sr_last_error());
    pid_t pid = writer_stopped_at(SR__CKPT_HALF_WRITTEN, 2);
    char listing[64];
    snprintf(listing, sizeof(listing), "ck.bin ck.bin.tmp.%d", (int)pid);
    /* Its lock tells this save that the file is in use, not stale. */
    cr_assert_eq(save_basic(g_path, 3), 0, "%s", sr_last_error());
    cr_assert_str_eq(dir_listing(), listing);
    expect_basic_file(g_path, 3);
    kill_writer(pid);
    cr_assert_eq(save_basic(g_path, 4), 0, "%s", sr_last_error());
    cr_assert_str_eq(dir_listing(), "ck.bin");
}

/* A restarted job loads before it saves: the load removes what a writer
 * killed mid-save left (its pid exited and was reaped), and keeps the file
 * of a writer still filling it (its lock). */
Test(ckpt_crash, a_load_removes_a_dead_writers_file_and_keeps_a_live_ones)
{
    cr_assert_eq(save_basic(g_path, 1), 0, "%s", sr_last_error());
    /* The live one first: the dead one's save would clean its file up. */
    pid_t live = writer_stopped_at(SR__CKPT_HALF_WRITTEN, 3);
    pid_t dead = writer_stopped_at(SR__CKPT_HALF_WRITTEN, 2);
    kill_writer(dead);
    char names[2][32], before[96], after[96], last[96];
    snprintf(names[0], sizeof(names[0]), "ck.bin.tmp.%d", (int)dead);
    snprintf(names[1], sizeof(names[1]), "ck.bin.tmp.%d", (int)live);
    int first = strcmp(names[0], names[1]) > 0; /* dir_listing sorts */
    snprintf(before, sizeof(before), "ck.bin %s %s", names[first], names[!first]);
    snprintf(last, sizeof(last), "%s", dir_listing());
    sr_checkpoint *c = NULL;
    int rc = sr_checkpoint_load(g_path, &c);
    sr_checkpoint_destroy(c);
    snprintf(after, sizeof(after), "%s", dir_listing());
    kill_writer(live); /* before any assertion: it would outlive the test */
    cr_assert_str_eq(last, before);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
    snprintf(before, sizeof(before), "ck.bin %s", names[1]);
    cr_assert_str_eq(after, before, "the load left the dead writer's file (pid %d), or removed the live one's",
                     (int)dead);
    expect_basic_file(g_path, 1);
    cr_assert_str_eq(dir_listing(), "ck.bin", "the load left the file of the writer killed last");
}

Test(ckpt_crash, stale_files_of_a_reused_pid_and_others)
{
    char p[192];
    /* Stale files: our own pid (a restarted job that got the same pid) and
     * another dead writer's; files that only look alike are not touched. */
    const char *files[] = {"ck.bin.tmp.%d", "ck.bin.tmp.999999999", "ck.bin.tmp.12x", "other.bin.tmp.1"};
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof(name), files[i], (int)getpid());
        snprintf(p, sizeof(p), "%s/%s", g_dir, name);
        write_whole(p, (const uint8_t *)"junk junk", 9);
    }
    cr_assert_eq(save_basic(g_path, 6), 0, "%s", sr_last_error());
    cr_assert_str_eq(dir_listing(), "ck.bin ck.bin.tmp.12x other.bin.tmp.1");
    expect_basic_file(g_path, 6);
}
