#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_conv's workloads in PyTorch, one thread, on this machine.

    /usr/bin/python3 bench/compare/torch_conv.py [--quick]

Needs Debian's python3-torch (PyTorch 1.13); it is not a build or test
dependency of shmrpc. The same shapes as bench/bench_conv.c, f32, batch 64:
  conv1  F.conv2d([64, 1, 28, 28], [32, 1, 3, 3], padding=1), forward + backward
  conv2  F.conv2d([64, 32, 14, 14], [64, 32, 3, 3], padding=1), forward + backward
  pool   F.max_pool2d([64, 32, 28, 28], 2), forward + backward
  norm   F.layer_norm([64, 32, 28, 28], [32, 28, 28], weight, bias), forward + backward
  step   the CNN's forward, cross_entropy and backward: Conv2d(1, 32, 3, p=1),
         ReLU, MaxPool2d(2), Conv2d(32, 64, 3, p=1), ReLU, MaxPool2d(2),
         Flatten, Linear(3136, 10)
Each figure is the wall-clock p50/p99 and the p50 of the process's CPU
time (KEY_cpu), which a loaded machine distorts least. Backward gets a
gradient of ones (conv1, conv2, pool, norm), made once, and the inputs'
.grad are cleared before each run (as bench_conv does). Besides its human
lines it prints one "torch-fig KEY p50_ns X p99_ns Y" line per figure, which
bench_conv reads when it runs this script (bench_util.h).
"""
import argparse
import sys

from rpc_common import percentiles

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_conv.py: python3-torch is not installed (apt-get install python3-torch)")
import time


def timed(fn, n, warmup):
    """p50 and p99 of the wall-clock time, and the p50 of the process's CPU time, in ns."""
    for _ in range(warmup):
        fn()
    lat, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        fn()
        lat.append(time.perf_counter_ns() - t0)
        cpu.append(time.process_time_ns() - c0)
    return percentiles(lat) + (percentiles(cpu)[0],)


def conv_case(x_shape, w_shape):
    x = torch.randn(x_shape, requires_grad=True)
    w = torch.randn(w_shape, requires_grad=True)
    b = torch.randn(w_shape[0], requires_grad=True)
    gy = torch.ones_like(F.conv2d(x, w, b, padding=1))

    def run():
        x.grad = w.grad = b.grad = None
        F.conv2d(x, w, b, padding=1).backward(gy)
    return run


def pool_case():
    x = torch.randn(64, 32, 28, 28, requires_grad=True)
    gy = torch.ones_like(F.max_pool2d(x, 2))

    def run():
        x.grad = None
        F.max_pool2d(x, 2).backward(gy)
    return run


def norm_case():
    x = torch.randn(64, 32, 28, 28, requires_grad=True)
    w = torch.randn(32, 28, 28, requires_grad=True)
    b = torch.randn(32, 28, 28, requires_grad=True)
    gy = torch.ones_like(x)

    def run():
        x.grad = w.grad = b.grad = None
        F.layer_norm(x, (32, 28, 28), w, b).backward(gy)
    return run


def step_case():
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Flatten(), torch.nn.Linear(3136, 10))
    x = torch.randn(64, 1, 28, 28)
    t = torch.randint(0, 10, (64,))

    def run():
        m.zero_grad(set_to_none=True)
        F.cross_entropy(m(x), t).backward()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = 5 if args.quick else 30
    print(f"# PyTorch {torch.__version__} one thread, f32, batch 64, this machine")
    cases = {"conv1": conv_case((64, 1, 28, 28), (32, 1, 3, 3)),
             "conv2": conv_case((64, 32, 14, 14), (64, 32, 3, 3)),
             "pool": pool_case(), "norm": norm_case(), "step": step_case()}
    for key, fn in cases.items():
        p50, p99, cpu = timed(fn, n, warmup=3)
        print(f"torch {key}: p50 {p50 / 1e6:.2f} ms p99 {p99 / 1e6:.2f} ms, CPU p50 {cpu / 1e6:.2f} ms")
        print(f"torch-fig {key} p50_ns {p50:.0f} p99_ns {p99:.0f}")
        print(f"torch-fig {key}_cpu p50_ns {cpu:.0f}")


if __name__ == "__main__":
    main()
