/* SPDX-License-Identifier: MIT */
// The C API used from C++: this program is compiled with
// g++ and with clang++ (-std=c++17 -Wall -Wextra -Wpedantic -Werror, see
// tests/meson.build) and run under shmrun with 3 workers by ./dev test.
//
//     shmrun -n 3 ./cxx_example_gxx
//
// Worker 0 drives; workers 1 and 2 serve. It uses the main macros and calls:
// SR_ARGS / SR_NOARGS, sr_rpc_sync, sr_rpc_async, sr_remote and the RRef
// helpers, and tensors as arguments and results. Every check that fails
// prints what it expected and what it got, and the program exits 1.
#include <shmrpc/shmrpc.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

// Owning handles: the C API's references released by RAII.
struct value_unref {
    void operator()(sr_value *v) const noexcept { sr_value_unref(v); }
};
struct tensor_unref {
    void operator()(sr_tensor *t) const noexcept { sr_tensor_unref(t); }
};
struct future_unref {
    void operator()(sr_future *f) const noexcept { sr_future_unref(f); }
};
struct rref_unref {
    void operator()(sr_rref *r) const noexcept { sr_rref_unref(r); }
};
using value_ptr = std::unique_ptr<sr_value, value_unref>;
using tensor_ptr = std::unique_ptr<sr_tensor, tensor_unref>;
using future_ptr = std::unique_ptr<sr_future, future_unref>;
using rref_ptr = std::unique_ptr<sr_rref, rref_unref>;

int failures = 0;

bool check(bool ok, const std::string &what)
{
    if (!ok) {
        std::fprintf(stderr, "cxx_example: FAILED: %s (last error: %s)\n", what.c_str(), sr_last_error());
        failures++;
    }
    return ok;
}

// axpy(x, a, y) = a * x + y, on tensors: a registered plain function.
int axpy(sr_call *c)
{
    if (sr_call_nargs(c) != 3)
        return sr_call_fail(c, -EINVAL, "axpy takes 3 arguments, got %zu", sr_call_nargs(c));
    sr_tensor *x = sr_value_tensor(sr_call_arg(c, 0));
    double a = sr_value_double(sr_call_arg(c, 1));
    sr_tensor *y = sr_value_tensor(sr_call_arg(c, 2));
    if (!x || !y)
        return sr_call_fail(c, -EINVAL, "axpy: x and y must be tensors");
    tensor_ptr ax(sr_mul_scalar(x, a));
    tensor_ptr r(ax ? sr_add(ax.get(), y) : nullptr);
    if (!r)
        return sr_call_fail(c, -EINVAL, "axpy: %s", sr_last_error());
    return sr_call_return(c, sr_value_from_tensor(r.get()));
}

// greet(name) = "hello <name> from <worker>"
int greet(sr_call *c)
{
    std::string s = std::string("hello ") + sr_value_str(sr_call_arg(c, 0)) + " from " + sr_worker_name(sr_rank());
    return sr_call_return(c, sr_str(s.c_str()));
}

// A captureless lambda is a plain function pointer: usable as an sr_fn.
const sr_fn rank_of_callee = [](sr_call *c) -> int { return sr_call_return(c, sr_int(sr_rank())); };

std::vector<double> values_of(sr_value *v)
{
    sr_tensor *t = sr_value_tensor(v);
    std::vector<double> out(t ? sr_tensor_numel(t) : 0);
    if (t && sr_tensor_to_f64(t, out.data(), out.size()) != 0)
        out.clear();
    return out;
}

void drive()
{
    const int64_t shape[] = {4};
    const float xs[] = {1, 2, 3, 4}, ys[] = {10, 20, 30, 40};
    tensor_ptr xt(sr_from_data(SR_F32, 1, shape, xs, 0)), yt(sr_from_data(SR_F32, 1, shape, ys, 0));
    value_ptr a(sr_double(2.0)), x(sr_value_from_tensor(xt.get())), y(sr_value_from_tensor(yt.get()));

    // rpc_sync with tensors: 2 * x + y on worker 1.
    sr_value *out = nullptr;
    if (check(sr_rpc_sync(1, "axpy", SR_ARGS(x.get(), a.get(), y.get()), 0, &out) == 0, "rpc_sync axpy")) {
        value_ptr r(out);
        check(values_of(r.get()) == std::vector<double>{12, 24, 36, 48}, "rpc_sync axpy result");
    }

    // rpc_async to both servers, then wait for the futures.
    value_ptr name(sr_str("cxx"));
    std::vector<future_ptr> fs;
    for (int to = 1; to <= 2; to++) {
        sr_future *f = nullptr;
        check(sr_rpc_async(to, "greet", SR_ARGS(name.get()), 0, &f) == 0, "rpc_async greet");
        fs.emplace_back(f);
    }
    for (int to = 1; to <= 2; to++) {
        sr_value *g = nullptr;
        if (!fs[to - 1] || !check(sr_future_wait(fs[to - 1].get(), &g) == 0, "future_wait greet"))
            continue;
        value_ptr gv(g);
        std::string want = std::string("hello cxx from ") + sr_worker_name(to);
        check(sr_value_str(gv.get()) && want == sr_value_str(gv.get()), "greet answer from " + want);
    }

    // No arguments, and a lambda as the function.
    if (check(sr_rpc_sync(2, "rank_of_callee", SR_NOARGS, 0, &out) == 0, "rpc_sync with SR_NOARGS")) {
        value_ptr r(out);
        check(sr_value_int(r.get()) == 2, "rank_of_callee on worker 2");
    }

    // remote: the result stays on worker 2; to_here fetches it, and a call
    // through the RRef runs on its owner with the RRef's value as argument 0.
    sr_rref *rr = nullptr;
    if (check(sr_remote(2, "axpy", SR_ARGS(x.get(), a.get(), y.get()), 0, &rr) == 0, "remote axpy")) {
        rref_ptr r(rr);
        check(sr_rref_owner(r.get()) == 2, "RRef owner is worker 2");
        if (check(sr_rref_to_here(r.get(), 0, &out) == 0, "to_here")) {
            value_ptr v(out);
            check(values_of(v.get()) == std::vector<double>{12, 24, 36, 48}, "to_here value");
        }
        value_ptr one(sr_double(1.0));
        if (check(sr_rref_rpc_sync(r.get(), "axpy", SR_ARGS(one.get(), y.get()), 0, &out) == 0,
                  "rref_rpc_sync axpy")) {
            value_ptr v(out);
            check(values_of(v.get()) == std::vector<double>{22, 44, 66, 88}, "axpy(1, rref, y)");
        }
    }

    // An error on the callee comes back with its text.
    check(sr_rpc_sync(1, "axpy", SR_ARGS(x.get()), 0, nullptr) == -SR_EREMOTE, "a failing remote call fails");
    check(std::string(sr_last_error()).find("axpy takes 3 arguments, got 1") != std::string::npos,
          "the remote error's text");
}

} // namespace

int main()
{
    if (sr_register("axpy", axpy) || sr_register("greet", greet) || sr_register("rank_of_callee", rank_of_callee))
        return std::fprintf(stderr, "cxx_example: sr_register: %s\n", sr_last_error()), 1;
    sr_init_opts opts{};
    opts.num_worker_threads = 2;
    if (sr_init(&opts))
        return std::fprintf(stderr, "cxx_example: sr_init: %s\n", sr_last_error()), 1;
    if (sr_world_size() < 3) {
        std::fprintf(stderr, "cxx_example: needs 3 workers (shmrun -n 3), got %d\n", sr_world_size());
        sr_shutdown(false, 0);
        return 1;
    }
    const int rank = sr_rank(); // sr_rank() is an error after sr_shutdown
    if (rank == 0)
        drive();
    if (sr_shutdown(true, 60)) {
        std::fprintf(stderr, "cxx_example: sr_shutdown: %s\n", sr_last_error());
        failures++;
    }
    if (rank == 0 && failures == 0)
        std::printf("cxx_example: every check passed\n");
    return failures ? 1 : 0;
}
