#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run bench_rref's workloads with torch.distributed.rpc (TensorPipe) on this
machine, and print the ratios to shmrpc when bench_rref's output is given.

    /usr/bin/python3 bench/compare/torch_rref.py [--ours bench_rref.log] [--quick]

Needs Debian's python3-torch (PyTorch 1.13); it is not a build or test
dependency of shmrpc. Three workers, as in bench/bench_rref.c (w0 measures,
w1 owns, w2 is the second user):
  noop       rpc_sync of a no-op function to w1
  remote     rpc.remote(w1, noop).to_here(), the RRef dropped each time
  fork       rpc_sync(w2, take, args=(rref,)): w2's UserRRef must be confirmed
             by w1 (fork request, ack) before take runs
  proxy      rref.rpc_sync().noop() on an object owned by w1
Besides its human lines it prints one "torch-fig KEY p50_ns X p99_ns Y" line
per figure, which bench_rref reads when it runs this script (bench_util.h).
"""
import argparse
import os
import re
import sys
import time

from rpc_common import import_torch, percentiles, timed as _timed


def timed(fn, n):
    return _timed(fn, n, warmup=max(10, n // 10))

torch, rpc, mp = import_torch("torch_rref.py")


def noop():
    return None


def take(rref):
    return None


def two_ones():
    return torch.ones(2)


class Thing:
    def noop(self):
        return None






def driver(quick):
    n = 200 if quick else 2000
    res = {"noop": timed(lambda: rpc.rpc_sync("w1", noop), n)}
    res["remote"] = timed(lambda: rpc.remote("w1", noop).to_here(), n)
    value = rpc.remote("w1", two_ones)
    value.to_here()
    res["fork"] = timed(lambda: rpc.rpc_sync("w2", take, args=(value,)), n)
    thing = rpc.remote("w1", Thing)
    res["proxy"] = timed(lambda: thing.rpc_sync().noop(), n)
    return res


def worker(rank, world, quick, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29527"
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=300)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        queue.put(driver(quick))
    rpc.shutdown()


def ours_from(path):
    """Pick our p50s out of bench_rref's output."""
    text = open(path).read()
    ours = {}
    for key, label in (("noop", r"rpc_sync noop"), ("remote", r"remote\+to_here"), ("fork", r"fork user->user"),
                       ("proxy", r"proxy rpc_sync")):
        m = re.search(label + r"\s*\|\s*p50\s+(\d+) ns", text)
        if m:
            ours[key] = float(m.group(1))
    return ours


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="bench_rref output to compare with")
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(worker, args=(3, args.quick, queue), nprocs=3, join=True)
    res = queue.get()
    ours = ours_from(args.ours) if args.ours else {}
    print(f"# PyTorch {torch.__version__} torch.distributed.rpc (TensorPipe), 3 workers, this machine")
    for key in ("noop", "remote", "fork", "proxy"):
        p50, p99 = res[key]
        line = f"torch {key:7s} | p50 {p50 / 1e3:9.1f} us p99 {p99 / 1e3:9.1f} us | {p50 / res['noop'][0]:.2f}x its noop"
        if key in ours:
            line += f" | shmrpc p50 {ours[key] / 1e3:.2f} us: {p50 / ours[key]:.0f}x faster"
        print(line)
    # The figure lines bench_rref reads (bench_util.h, bench_torch_run).
    for key in ("noop", "remote", "fork", "proxy"):
        print(f"torch-fig {key} p50_ns {res[key][0]:.0f} p99_ns {res[key][1]:.0f}")


if __name__ == "__main__":
    main()
