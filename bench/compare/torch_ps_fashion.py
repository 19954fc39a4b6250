#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_train's training with PyTorch RPC: the parameter-server pattern of
PyTorch's official RPC tutorial (rpc_param_server_tutorial), on Fashion-MNIST.

    /usr/bin/python3 bench/compare/torch_ps_fashion.py [--configs 1,3s] [--concurrent] [--seed S]

Needs Debian's python3-torch (PyTorch 1.13; torchvision is not needed: the
IDX files of dataset-fashion-mnist are read with gzip and numpy). Same job
as bench/bench_train.c:
  - a parameter server ("ps", rank 0) holds an MLP 784-128-10
    (nn.Sequential(Linear, ReLU, Linear), torch's default initialisation);
  - each trainer takes its share of one shuffled epoch of the 60000 training
    images, in batches of 64, and per batch: inside a dist_autograd context,
    rpc_sync to the ps for the forward, cross_entropy locally,
    dist_autograd.backward, DistributedOptimizer(SGD, lr 0.05).step;
  - after the epoch, the ps measures the accuracy on the 10000 test images.
Configurations:
  1    one trainer
  3s   three trainers serialised by a lock on the ps: the forward RPC takes it,
       an RPC after the optimizer step releases it (PyTorch's only working form)
  3    three concurrent trainers, with --concurrent only: in PyTorch 1.13 one
       trainer's step modifies the weights in place while another's backward
       still needs them, and the backward fails ("modified by an inplace
       operation", pytorch/tutorials#2095, pytorch/examples#877)
Every process runs torch with one thread (torch.set_num_threads(1)).

Output, one machine-readable line per configuration (bench_train parses it):
  torch_ps trainers=1 mode=single step_p50_ms=1.502 samples_per_s=40300 test_acc=0.8121 epoch_s=1.489
and, for reference, PyTorch's local step with no RPC:
  torch_local step_p50_ms=0.490
A step is the forward RPC, the loss, the backward and the optimizer step (and
the lock's release RPC when serialised); building the batch is outside it.
samples/s is the epoch's samples over the time from the first trainer's start
to the last trainer's end (batch building included).
"""
import argparse
import os
import socket
import sys
import threading
import time

from rpc_common import import_torch, load_fashion_mnist, percentiles

torch, rpc, mp = import_torch("torch_ps_fashion.py")
import numpy as np  # noqa: E402  (after torch's import check)
import torch.distributed.autograd as dist_autograd  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.optim import DistributedOptimizer  # noqa: E402

BATCH = 64
LR = 0.05

# ---- the parameter server's side (module globals of the ps process) ----
MODEL = None
LOCK = threading.Lock()


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def ps_forward(x):
    return MODEL(x)


def ps_forward_locked(x):
    LOCK.acquire()  # released by ps_release, from another RPC, after the step
    return MODEL(x)


def ps_release():
    LOCK.release()


def ps_param_rrefs():
    return [rpc.RRef(p) for p in MODEL.parameters()]


def accuracy(model, images, labels):
    with torch.no_grad():
        x = torch.from_numpy(images).float().div_(255)
        pred = model(x).argmax(dim=1)
        return (pred == torch.from_numpy(labels)).double().mean().item()


def batch(images, labels, idx):
    return torch.from_numpy(images[idx]).float().div_(255), torch.from_numpy(labels[idx])


# ---- the trainers ----
def train(rank, ntrainers, locked, seed):
    images, labels = load_fashion_mnist(True)
    perm = np.random.default_rng(seed).permutation(len(images))
    share = perm[(rank - 1) * len(perm) // ntrainers: rank * len(perm) // ntrainers]
    opt = DistributedOptimizer(torch.optim.SGD, rpc.rpc_sync("ps", ps_param_rrefs), lr=LR)
    fwd = ps_forward_locked if locked else ps_forward
    lat, losses = [], []
    start = time.monotonic_ns()  # CLOCK_MONOTONIC: comparable across the processes
    for b in range(0, len(share), BATCH):
        x, y = batch(images, labels, share[b:b + BATCH])
        t0 = time.perf_counter_ns()
        with dist_autograd.context() as cid:
            out = rpc.rpc_sync("ps", fwd, args=(x,))
            loss = F.cross_entropy(out, y)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
        if locked:
            rpc.rpc_sync("ps", ps_release)
        lat.append(time.perf_counter_ns() - t0)
        losses.append(loss.item())
    return lat, start, time.monotonic_ns(), len(share), losses


def worker(rank, world, locked, seed, port, queue):
    global MODEL
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if rank == 0:
        MODEL = make_model(seed)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=600)
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)
    result = None
    try:
        if rank > 0:
            result = ("trainer",) + train(rank, world - 1, locked, seed)
    except Exception as e:  # reported, then the job still shuts down
        result = ("error", f"trainer{rank}: {type(e).__name__}: {str(e).splitlines()[0]}")
    rpc.shutdown()
    if rank == 0:
        images, labels = load_fashion_mnist(False)
        result = ("ps", accuracy(MODEL, images, labels))
    queue.put(result)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(ntrainers, mode, seed):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    world = ntrainers + 1
    mp.spawn(worker, args=(world, mode == "serialised", seed, free_port(), queue), nprocs=world, join=True)
    rows = [queue.get() for _ in range(world)]
    errors = [r[1] for r in rows if r[0] == "error"]
    if errors:
        err = errors[0].split(" [")[0].replace(" ", "_")  # up to the tensor's description
        print(f"torch_ps trainers={ntrainers} mode={mode} error={err}", flush=True)
        return
    acc = next(r[1] for r in rows if r[0] == "ps")
    trainers = [r for r in rows if r[0] == "trainer"]
    lat = [x for r in trainers for x in r[1]]
    secs = (max(r[3] for r in trainers) - min(r[2] for r in trainers)) / 1e9
    samples = sum(r[4] for r in trainers)
    p50, _ = percentiles(lat)
    print(f"torch_ps trainers={ntrainers} mode={mode} step_p50_ms={p50 / 1e6:.3f} "
          f"samples_per_s={samples / secs:.0f} test_acc={acc:.4f} epoch_s={secs:.3f}", flush=True)


def local_step_p50(seed, steps=300):
    """PyTorch's own step with no RPC (one thread): forward, loss, backward, SGD."""
    images, labels = load_fashion_mnist(True)
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    perm = np.random.default_rng(seed).permutation(len(images))
    lat = []
    for s in range(steps):
        x, y = batch(images, labels, perm[s * BATCH:(s + 1) * BATCH])
        t0 = time.perf_counter_ns()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        lat.append(time.perf_counter_ns() - t0)
    return percentiles(lat[steps // 10:])[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="1,3s", help="comma-separated: 1 (one trainer), 3s (three serialised)")
    ap.add_argument("--concurrent", action="store_true", help="also try three unserialised trainers (fails in 1.13)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# PyTorch {torch.__version__} torch.distributed.rpc (TensorPipe), parameter server + trainers, "
          f"MLP 784-128-10, batch {BATCH}, SGD lr {LR}, one epoch of Fashion-MNIST, 1 thread per process", flush=True)
    print(f"torch_local step_p50_ms={local_step_p50(args.seed) / 1e6:.3f}", flush=True)
    configs = [c for c in args.configs.split(",") if c]
    if args.concurrent:
        configs.append("3")
    for c in configs:
        n = int(c.rstrip("s"))
        mode = "serialised" if c.endswith("s") else ("single" if n == 1 else "concurrent")
        run_config(n, mode, args.seed)


if __name__ == "__main__":
    main()
