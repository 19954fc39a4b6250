#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run bench_dist_autograd's workloads with torch.distributed.autograd over
torch.distributed.rpc (TensorPipe) on this machine.

    /usr/bin/python3 bench/compare/torch_dist_autograd.py [--quick] [--only step|chain]

bench/bench_dist_autograd spawns this script in its own run and reads the
machine-readable lines ("torch-da <workload> p50_ns N p99_ns N n N"); the
"torch ..." lines are for people. Needs Debian's python3-torch (PyTorch
1.13); it is not a build or test dependency of shmrpc.

Workloads, as in bench/bench_dist_autograd.c:
  step      the example of PyTorch's distributed autograd design note (seed
            002): in a fresh context, t1, t2 = rand(3, 3, requires_grad);
            t3 = rpc_sync(w1, my_add, (t1, t2)); t4 = rand(3, 3,
            requires_grad); t5 = t3 * t4; loss = t5.sum();
            dist_autograd.backward(ctx, [loss]); get_gradients(ctx)
  step_add  the same with the builtin torch.add instead of the Python UDF
  rpc       rpc_sync(w1, my_add, (t1, t2)) outside any context: the call
            the step makes, without distributed autograd (the reference)
  chain     4 workers: w0 computes x * W0 and calls chain on w1, which
            multiplies by its W1 and calls w2, ... w3 returns; w0 sums and
            runs dist_autograd.backward, then get_gradients. Each Wk is a
            3x3 parameter of worker k that requires grad.
  chain_fwd the same nested calls outside any context (the reference)
"""
import argparse
import os
import sys

os.environ.setdefault("GLOG_minloglevel", "2")  # TensorPipe's shutdown INFO lines, one per worker

from rpc_common import import_torch, timed as _timed

torch, rpc, mp = import_torch("torch_dist_autograd.py")
import torch.distributed.autograd as dist_autograd  # noqa: E402

W = None  # this worker's parameter in the chain


def my_add(t1, t2):
    return torch.add(t1, t2)


def chain(x, k, last):
    y = x * W
    if k < last:
        return rpc.rpc_sync(f"w{k + 1}", chain, args=(y, k + 1, last))
    return y


def timed(fn, n):
    return _timed(fn, n, warmup=max(10, n // 10))


def step(fn):
    with dist_autograd.context() as cid:
        t1 = torch.rand((3, 3), requires_grad=True)
        t2 = torch.rand((3, 3), requires_grad=True)
        t3 = rpc.rpc_sync("w1", fn, args=(t1, t2))
        t4 = torch.rand((3, 3), requires_grad=True)
        t5 = torch.mul(t3, t4)
        loss = t5.sum()
        dist_autograd.backward(cid, [loss])
        grads = dist_autograd.get_gradients(cid)
    assert len(grads) == 3, grads


def step_driver(n):
    t1, t2 = torch.rand((3, 3), requires_grad=True), torch.rand((3, 3), requires_grad=True)
    return {
        "step": timed(lambda: step(my_add), n),
        "step_add": timed(lambda: step(torch.add), n),
        "rpc": timed(lambda: rpc.rpc_sync("w1", my_add, args=(t1, t2)), n),
    }


def chain_driver(n, world):
    x = torch.rand((3, 3))

    def backward_step():
        with dist_autograd.context() as cid:
            r = rpc.rpc_sync("w1", chain, args=(x * W, 1, world - 1))
            loss = r.sum()
            dist_autograd.backward(cid, [loss])
            grads = dist_autograd.get_gradients(cid)
        assert len(grads) == 1 and W in grads, grads

    return {
        "chain": timed(backward_step, n),
        "chain_fwd": timed(lambda: rpc.rpc_sync("w1", chain, args=(x * W, 1, world - 1)), n),
    }


def worker(rank, world, what, n, port, queue):
    global W
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    W = torch.rand((3, 3), requires_grad=True)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=300)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        queue.put(step_driver(n) if what == "step" else chain_driver(n, world))
    rpc.shutdown()


REFS = {"step": "rpc", "step_add": "rpc", "rpc": None, "chain": "chain_fwd", "chain_fwd": None}
LABELS = {"step": "seed-002 step (my_add UDF)", "step_add": "seed-002 step (torch.add)",
          "rpc": "rpc_sync(my_add), no context", "chain": "4-worker chain backward",
          "chain_fwd": "4-worker chain, no context"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--only", choices=("step", "chain"), help="one group of workloads")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    res = {}
    groups = [("step", 2, 29537), ("chain", 4, 29538)]
    for what, world, port in groups:
        if args.only and args.only != what:
            continue
        queue = ctx.Queue()
        n = (200 if args.quick else 2000) if what == "step" else (100 if args.quick else 1000)
        mp.spawn(worker, args=(world, what, n, port, queue), nprocs=world, join=True)
        res.update({key: (p50, p99, n) for key, (p50, p99) in queue.get().items()})
    print(f"# PyTorch {torch.__version__} torch.distributed.autograd over rpc (TensorPipe, 16 threads), "
          f"{os.cpu_count()} CPUs, one thread per worker")
    for key, (p50, p99, _) in res.items():
        line = f"torch {LABELS[key]:30s} | p50 {p50 / 1e3:9.1f} us p99 {p99 / 1e3:9.1f} us"
        ref = REFS[key]
        if ref in res:
            line += f" | {p50 / res[ref][0]:.2f}x {LABELS[ref]}"
        print(line)
    for key, (p50, p99, n) in res.items():
        print(f"torch-da {key} p50_ns {p50} p99_ns {p99} n {n}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
