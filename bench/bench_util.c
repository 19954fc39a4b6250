/* SPDX-License-Identifier: MIT */
/* Benchmark helpers. See bench_util.h. */
#include "bench_util.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLICE_NS (100ll * 1000000) /* futex sleeps are bounded, then re-checked */

static bool smoke; /* --smoke given (bench_cli_parse) */

int64_t bench_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t bench_process_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bench_lat bench_lat_of(int64_t *samples, size_t n)
{
    qsort(samples, n, sizeof(*samples), cmp_i64);
    return (bench_lat){.p50 = samples[n / 2], .p99 = samples[n * 99 / 100]};
}

double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void *bench_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void bench_shared_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

static void futex_wait_slice(_Atomic uint32_t *w, uint32_t val)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = SLICE_NS};
    syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

int bench_barrier_wait(bench_barrier *b, uint32_t n, int64_t timeout_ns)
{
    /* acquire: pairs with the release increment of gen that ended the previous generation */
    uint32_t gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    /* acq_rel: the last arrival must see every earlier arrival's writes, which
     * it then publishes with its release increment of gen */
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) + 1 == n) {
        /* relaxed: nobody arrives for the next generation before gen moves (below) */
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        /* release: pairs with the waiters' acquire loads of gen */
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        syscall(SYS_futex, &b->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        return 0;
    }
    int64_t deadline = bench_now_ns() + timeout_ns;
    /* acquire: pairs with the last arrival's release increment of gen */
    while (atomic_load_explicit(&b->gen, memory_order_acquire) == gen) {
        if (bench_now_ns() > deadline)
            return -ETIMEDOUT;
        futex_wait_slice(&b->gen, gen);
    }
    return 0;
}

void bench_rounds_add(bench_rounds *r, bench_lat ours, bench_lat floor)
{
    if (r->n >= BENCH_MAX_ROUNDS)
        return;
    r->ours[r->n] = ours;
    r->floor[r->n] = floor;
    r->n++;
}

bench_summary bench_summarize(const bench_rounds *r)
{
    double o50[BENCH_MAX_ROUNDS], o99[BENCH_MAX_ROUNDS], f50[BENCH_MAX_ROUNDS], f99[BENCH_MAX_ROUNDS];
    double r50[BENCH_MAX_ROUNDS], r99[BENCH_MAX_ROUNDS];
    int n = r->n;
    for (int i = 0; i < n; i++) {
        o50[i] = (double)r->ours[i].p50;
        o99[i] = (double)r->ours[i].p99;
        f50[i] = (double)r->floor[i].p50;
        f99[i] = (double)r->floor[i].p99;
        r50[i] = f50[i] > 0 ? o50[i] / f50[i] : 0;
        r99[i] = f99[i] > 0 ? o99[i] / f99[i] : 0;
    }
    if (n == 0)
        return (bench_summary){0};
    return (bench_summary){.ours50 = bench_median(o50, n), .ours99 = bench_median(o99, n),
                           .floor50 = bench_median(f50, n), .floor99 = bench_median(f99, n),
                           .ratio50 = bench_median(r50, n), .ratio99 = bench_median(r99, n)};
}

int bench_print(const char *name, const char *config, const char *floor_name, const bench_summary *s,
                double target, const char *extra)
{
    return bench_print_torch(name, config, floor_name, s, target, extra, NULL, NULL);
}

int bench_print_torch(const char *name, const char *config, const char *floor_name, const bench_summary *s,
                      double target, const char *extra, const bench_torch *t, const char *key)
{
    if (smoke) /* no verdict on figures that are not measurements */
        target = 0;
    int met = target <= 0 || s->ratio50 <= target;
    printf("%-16s | %-38s | p50 %7.0f ns p99 %7.0f ns | floor %-9s p50 %7.0f ns p99 %7.0f ns | ratio p50 %4.2f p99 %4.2f",
           name, config, s->ours50, s->ours99, floor_name, s->floor50, s->floor99, s->ratio50, s->ratio99);
    if (target > 0)
        printf(" | target p50 <= %.1fx %s", target, met ? "met" : "NOT met");
    if (extra)
        printf(" | %s", extra);
    printf("\n");
    fflush(stdout);
    bench_rec r;
    bench_rec_begin(&r, name);
    bench_rec_str(&r, "config", config);
    bench_rec_num(&r, "p50_ns", s->ours50);
    bench_rec_num(&r, "p99_ns", s->ours99);
    bench_rec_str(&r, "floor", floor_name);
    bench_rec_num(&r, "floor_p50_ns", s->floor50);
    bench_rec_num(&r, "floor_p99_ns", s->floor99);
    bench_rec_num(&r, "ratio_p50", s->ratio50);
    bench_rec_num(&r, "ratio_p99", s->ratio99);
    if (target > 0) {
        bench_rec_num(&r, "target_ratio_p50", target);
        bench_rec_bool(&r, "target_met", met);
    }
    if (extra)
        bench_rec_str(&r, "extra", extra);
    if (t)
        bench_rec_torch(&r, t, key);
    bench_rec_emit(&r);
    return met;
}

/* ---- command line ---- */

static const char *bench_prog = "bench";
static int json_fd = -1; /* the real stdout under --json; -1 otherwise */

bool bench_smoke_on(void) { return smoke; }

const char *bench_verdict(bool met) { return smoke ? "not judged (--smoke)" : met ? "met" : "NOT met"; }

static void cli_usage(const bench_cli *c, FILE *f)
{
    fprintf(f, "usage: %s [--json] [--help]%s", c->prog, c->smoke_what ? " [--smoke]" : "");
    for (int i = 0; c->flags[i]; i++)
        fprintf(f, " [%s]", c->flags[i]);
    for (int i = 0; c->opts[i]; i++)
        fprintf(f, " [%s VALUE]", c->opts[i]);
    if (c->names[0])
        fprintf(f, " [NAME...]");
    fprintf(f, "\n");
    if (c->names[0]) {
        fprintf(f, "  NAMEs (default: all):");
        for (int i = 0; c->names[i]; i++)
            fprintf(f, " %s", c->names[i]);
        fprintf(f, "\n");
    }
    fprintf(f, "  --json  the figures as JSON Lines on stdout (docs/PERFORMANCE.md); the report goes to stderr\n");
    if (c->smoke_what)
        fprintf(f, "  --smoke a quick check that every workload runs (%s, no PyTorch, no target verdicts);\n"
                   "          its figures are not measurements\n", c->smoke_what);
    if (c->usage)
        fprintf(f, "%s\n", c->usage);
}

static void cli_refuse(const bench_cli *c, const char *arg, const char *why)
{
    fprintf(stderr, "%s: %s '%s' (", c->prog, why, arg);
    if (c->names[0]) {
        fprintf(stderr, "names:");
        for (int i = 0; c->names[i]; i++)
            fprintf(stderr, " %s", c->names[i]);
    } else {
        fprintf(stderr, "it takes no names");
    }
    fprintf(stderr, "; options: --json --help%s", c->smoke_what ? " --smoke" : "");
    for (int i = 0; c->flags[i]; i++)
        fprintf(stderr, " %s", c->flags[i]);
    for (int i = 0; c->opts[i]; i++)
        fprintf(stderr, " %s VALUE", c->opts[i]);
    fprintf(stderr, ")\n");
    exit(2);
}

static int index_of(const char *const *list, const char *s)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s))
            return i;
    return -1;
}

void bench_cli_parse(bench_cli *c, int argc, char **argv)
{
    bench_prog = c->prog;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int k;
        if (!strcmp(a, "--json")) {
            c->json = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_usage(c, stdout);
            exit(0);
        } else if (c->smoke_what && !strcmp(a, "--smoke")) {
            c->smoke = smoke = true;
        } else if ((k = index_of(c->flags, a)) >= 0) {
            c->flag[k] = true;
        } else if ((k = index_of(c->opts, a)) >= 0) {
            if (i + 1 >= argc)
                cli_refuse(c, a, "missing the value of");
            c->opt[k] = argv[++i];
        } else if (a[0] != '-' && (k = index_of(c->names, a)) >= 0) {
            c->named[k] = c->any_name = true;
        } else {
            cli_refuse(c, a, a[0] == '-' ? "unknown option" : "unknown name");
        }
    }
    if (c->json) {
        /* JSON on the real stdout; everything printed for humans (ours, our
         * forked workers', the PyTorch scripts') on stderr. */
        fflush(stdout);
        json_fd = dup(STDOUT_FILENO);
        if (json_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
            fprintf(stderr, "%s: --json: %s\n", c->prog, strerror(errno));
            exit(1);
        }
    }
    if (smoke)
        printf("# %s --smoke: %s; a check that every workload runs: the figures below are not measurements\n",
               c->prog, c->smoke_what);
}

bool bench_cli_wants(const bench_cli *c, const char *name)
{
    int k = index_of(c->names, name);
    return k >= 0 && (!c->any_name || c->named[k]);
}

long long bench_cli_int(const bench_cli *c, const char *opt, const char *value, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (end == value || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "%s: %s '%s' is not a whole number in [%lld, %lld]\n", c->prog, opt, value, lo, hi);
        exit(2);
    }
    return v;
}

/* ---- JSON Lines ---- */

bool bench_json_on(void) { return json_fd >= 0; }

static void rec_add(bench_rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rec_add(bench_rec *r, const char *fmt, ...)
{
    if (r->len >= sizeof(r->buf))
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->buf + r->len, sizeof(r->buf) - r->len, fmt, ap);
    va_end(ap);
    r->len = n < 0 ? sizeof(r->buf) : r->len + (size_t)n;
}

static void rec_string(bench_rec *r, const char *s)
{
    rec_add(r, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            rec_add(r, "\\%c", ch);
        else if (ch < 0x20)
            rec_add(r, "\\u%04x", ch);
        else
            rec_add(r, "%c", ch);
    }
    rec_add(r, "\"");
}

static void rec_key(bench_rec *r, const char *key)
{
    rec_add(r, ", ");
    rec_string(r, key);
    rec_add(r, ": ");
}

void bench_rec_begin(bench_rec *r, const char *name)
{
    r->len = 0;
    rec_add(r, "{\"bench\": ");
    rec_string(r, bench_prog);
    rec_key(r, "name");
    rec_string(r, name);
}

void bench_rec_num(bench_rec *r, const char *key, double v)
{
    rec_key(r, key);
    if (isfinite(v))
        rec_add(r, "%.10g", v);
    else
        rec_add(r, "null");
}

void bench_rec_str(bench_rec *r, const char *key, const char *s)
{
    rec_key(r, key);
    if (s)
        rec_string(r, s);
    else
        rec_add(r, "null");
}

void bench_rec_bool(bench_rec *r, const char *key, bool b)
{
    rec_key(r, key);
    rec_add(r, b ? "true" : "false");
}

void bench_rec_emit(bench_rec *r)
{
    rec_add(r, "}\n");
    if (json_fd < 0)
        return;
    if (r->len >= sizeof(r->buf)) {
        fprintf(stderr, "%s: a JSON record outgrew %zu bytes; dropped\n", bench_prog, sizeof(r->buf));
        return;
    }
    size_t off = 0;
    while (off < r->len) {
        ssize_t n = write(json_fd, r->buf + off, r->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
}

/* ---- PyTorch ---- */

static void torch_fig_line(bench_torch *t, char *line)
{
    char *save = NULL, *tok = strtok_r(line + strlen("torch-fig"), " \t\n", &save);
    if (!tok || t->n >= BENCH_TORCH_FIGS)
        return;
    bench_torch_fig *f = &t->fig[t->n++];
    snprintf(f->key, sizeof(f->key), "%s", tok);
    f->p50_ns = f->p99_ns = f->per_s = NAN;
    char *field;
    while ((field = strtok_r(NULL, " \t\n", &save)) && (tok = strtok_r(NULL, " \t\n", &save))) {
        double v = strtod(tok, NULL);
        if (!strcmp(field, "p50_ns"))
            f->p50_ns = v;
        else if (!strcmp(field, "p99_ns"))
            f->p99_ns = v;
        else if (!strcmp(field, "per_s"))
            f->per_s = v;
    }
}

void bench_torch_run(bench_torch *t, const char *script, const char *args, const char *skip_why)
{
    memset(t, 0, sizeof(*t));
    if (smoke)
        skip_why = "--smoke";
    if (skip_why) {
        snprintf(t->why, sizeof(t->why), "%s", skip_why);
        return;
    }
    const char *py = getenv("BENCH_PYTHON") ? getenv("BENCH_PYTHON") : "/usr/bin/python3";
    char cmd[2048], line[1024];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' %s 2>&1", py, script, args);
    fflush(stdout);
    fflush(stderr);
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(t->why, sizeof(t->why), "could not run %s: %s", py, strerror(errno));
        return;
    }
    bool missing = false;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "torch-fig ", 10)) {
            torch_fig_line(t, line);
            continue;
        }
        if (!strncmp(line, "# PyTorch ", 10))
            sscanf(line + 10, "%63s", t->version);
        if (strstr(line, "python3-torch is not installed") || strstr(line, "No module named 'torch'"))
            missing = true;
        fputs(line, stdout);
    }
    int st = pclose(f);
    t->measured = t->n > 0 && st == 0;
    if (t->measured)
        return;
    if (missing)
        snprintf(t->why, sizeof(t->why), "torch not installed (apt-get install python3-torch)");
    else if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        snprintf(t->why, sizeof(t->why), "%s exited with status %d", script,
                 st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    else
        snprintf(t->why, sizeof(t->why), "%s printed no figures", script);
    t->n = 0;
}

const bench_torch_fig *bench_torch_get(const bench_torch *t, const char *key)
{
    for (int i = 0; t->measured && i < t->n; i++)
        if (!strcmp(t->fig[i].key, key))
            return &t->fig[i];
    return NULL;
}

const char *bench_torch_vs(const bench_torch *t, const char *key, double ours_ns, char *buf, size_t len)
{
    const bench_torch_fig *f = bench_torch_get(t, key);
    if (f && isfinite(f->p50_ns) && ours_ns > 0)
        snprintf(buf, len, "PyTorch p50 %.0f us (this run): %.0fx faster", f->p50_ns / 1e3, f->p50_ns / ours_ns);
    else
        snprintf(buf, len, "PyTorch: %s", f ? "no p50 in its output" : t->measured ? "no such figure" : t->why);
    return buf;
}

void bench_rec_torch(bench_rec *r, const bench_torch *t, const char *key)
{
    const bench_torch_fig *f = bench_torch_get(t, key);
    if (!f) {
        bench_rec_str(r, "torch", t->measured ? "no such figure" : t->why);
        return;
    }
    if (isfinite(f->p50_ns))
        bench_rec_num(r, "torch_p50_ns", f->p50_ns);
    if (isfinite(f->p99_ns))
        bench_rec_num(r, "torch_p99_ns", f->p99_ns);
    if (isfinite(f->per_s))
        bench_rec_num(r, "torch_per_s", f->per_s);
    if (t->version[0])
        bench_rec_str(r, "torch_version", t->version);
}
