#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run bench_rpc's workloads with torch.distributed.rpc (TensorPipe) on this
machine, and print the ratios to shmrpc when bench_rpc's output is given.

    /usr/bin/python3 bench/compare/torch_rpc.py [--ours bench_rpc.log] [--quick]

Needs Debian's python3-torch (PyTorch 1.13); it is not a build or test
dependency of shmrpc. Workloads, as in bench/bench_rpc.c:
  noop       rpc_sync of a no-op Python function, p50/p99 round trip
  add        rpc_sync(torch.add) on two 2-element tensors
  pipeline   rpc_async no-op calls, up to 1024 in flight, calls/s
  fanin      N callers (1, 2, 4, 8) -> one callee, p50 and total calls/s
Besides its human lines it prints one "torch-fig KEY FIELD VALUE ..." line
per figure, which bench_rpc reads when it runs this script (bench_util.h).
  remote     remote() + to_here()
  tensor     rpc_sync(torch.add) of tensors from 4 B to 256 MiB
"""
import argparse
import os
import re
import statistics
import sys
import time

from rpc_common import import_torch, percentiles, timed

torch, rpc, mp = import_torch("torch_rpc.py")


def noop():
    return None






def driver(quick):
    res = {}
    n = 300 if quick else 3000
    for _ in range(100):
        rpc.rpc_sync("w1", noop)
    res["noop"] = timed(lambda: rpc.rpc_sync("w1", noop), n)
    a, b = torch.ones(2), torch.ones(2)
    res["add"] = timed(lambda: rpc.rpc_sync("w1", torch.add, args=(a, b)), n)
    res["remote"] = timed(lambda: rpc.remote("w1", noop).to_here(), n // 3)
    calls = 2000 if quick else 20000
    t0 = time.perf_counter()
    window = []
    for _ in range(calls):
        if len(window) >= 1024:
            window.pop(0).wait()
        window.append(rpc.rpc_async("w1", noop))
    for f in window:
        f.wait()
    res["pipeline"] = calls / (time.perf_counter() - t0)
    sizes = [4, 4 << 10, 1 << 20, 64 << 20] + ([] if quick else [256 << 20])
    for size in sizes:
        x = torch.ones(max(1, size // 4))
        rpc.rpc_sync("w1", torch.add, args=(x, 1.0))
        reps = 3 if size >= (64 << 20) else 30
        res[f"tensor {size}"] = timed(lambda: rpc.rpc_sync("w1", torch.add, args=(x, 1.0)), reps)
    return res


def worker(rank, world, quick, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29517"
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=300)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        queue.put(driver(quick))
    rpc.shutdown()


def fanin_worker(rank, world, quick, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29518"
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=300)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank > 0:
        n = 200 if quick else 1000
        t0 = time.perf_counter()
        p50, _ = timed(lambda: rpc.rpc_sync("w0", noop), n)
        queue.put((rank, p50, n / (time.perf_counter() - t0)))
    rpc.shutdown()


def run(fn, world, quick):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(fn, args=(world, quick, queue), nprocs=world, join=True)
    return [queue.get() for _ in range(queue.qsize())] if fn is fanin_worker else queue.get()


def ours_from(path):
    """Pick our figures out of bench_rpc's output."""
    text = open(path).read()
    ours = {}
    m = re.search(r"rpc_sync noop\s+hot.*?p50\s+(\d+) ns", text)
    if m:
        ours["noop"] = float(m.group(1))
    m = re.search(r"pipelined.*?\| ([\d.]+) calls/s", text)
    if m:
        ours["pipeline"] = float(m.group(1))
    for m in re.finditer(r"rpc_sync add tensor\s+(\d+) B.*?p50\s+(\d+) ns", text):
        ours[f"tensor {m.group(1)}"] = float(m.group(2))
    m = re.search(r"remote\+to_here.*?p50\s+(\d+) ns", text)
    if m:
        ours["remote"] = float(m.group(1))
    return ours


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="bench_rpc output to compare with")
    ap.add_argument("--quick", action="store_true", help="fewer iterations, no 256 MiB tensor")
    ap.add_argument("--no-fanin", action="store_true", help="skip the fan-in jobs (4 more PyTorch jobs)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    res = run(worker, 2, args.quick)
    ours = ours_from(args.ours) if args.ours else {}
    print(f"# PyTorch {torch.__version__} torch.distributed.rpc (TensorPipe), 2 workers, this machine")
    for key in ("noop", "add", "remote"):
        p50, p99 = res[key]
        line = f"torch rpc_sync {key:8s} | p50 {p50 / 1e3:9.1f} us p99 {p99 / 1e3:9.1f} us"
        if key in ours:
            line += f" | shmrpc p50 {ours[key] / 1e3:.2f} us: {p50 / ours[key]:.0f}x faster"
        print(line)
    line = f"torch rpc_async noop pipelined | {res['pipeline']:.0f} calls/s"
    if "pipeline" in ours:
        line += f" | shmrpc {ours['pipeline']:.0f} calls/s: {ours['pipeline'] / res['pipeline']:.0f}x"
    print(line)
    for key in sorted((k for k in res if k.startswith("tensor")), key=lambda k: int(k.split()[1])):
        p50, _ = res[key]
        line = f"torch rpc_sync add {key:16s} B | p50 {p50 / 1e6:9.3f} ms"
        if key in ours:
            line += f" | shmrpc {ours[key] / 1e6:.3f} ms: {p50 / ours[key]:.0f}x faster"
        print(line)
    # The figure lines bench_rpc reads (bench_util.h, bench_torch_run).
    for key in ("noop", "add", "remote"):
        print(f"torch-fig {key} p50_ns {res[key][0]:.0f} p99_ns {res[key][1]:.0f}")
    print(f"torch-fig pipeline per_s {res['pipeline']:.1f}")
    for key in (k for k in res if k.startswith("tensor")):
        print(f"torch-fig tensor{key.split()[1]} p50_ns {res[key][0]:.0f} p99_ns {res[key][1]:.0f}")
    sys.stdout.flush()
    fanins = () if args.no_fanin else (1, 2, 4, 8)
    for n in fanins:
        rows = run(fanin_worker, n + 1, args.quick)
        p50 = statistics.median(r[1] for r in rows)
        total = sum(r[2] for r in rows)
        print(f"torch rpc_sync noop fan-in | {n} callers -> 1 | p50 {p50 / 1e3:.1f} us | {total:.0f} calls/s total")
        print(f"torch-fig fanin{n} p50_ns {p50:.0f} per_s {total:.1f}")


if __name__ == "__main__":
    main()
