#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""demo_pipeline's training with PyTorch RPC: the pattern of PyTorch's
tutorial "Distributed Pipeline Parallelism Using RPC", on CPU, on
Fashion-MNIST.

    /usr/bin/python3 bench/compare/torch_pipeline.py [--stages S] [--workers W]
                     [--splits 1,2,4,8] [--batches N] [--epochs E] [--seed S]

Needs Debian's python3-torch (PyTorch 1.13; the IDX files of
dataset-fashion-mnist are read with gzip and numpy). The same job as
bench/demo_pipeline.c:
  - the CNN Conv2d(1, 32, 3, p 1)-LayerNorm([32, 28, 28])-ReLU-MaxPool2d(2)-
    Conv2d(32, 64, 3, p 1)-LayerNorm([64, 14, 14])-ReLU-MaxPool2d(2)-Flatten-
    Linear(3136, 10), built whole from the seed (torch.manual_seed) and split
    into the same layer ranges, stage s on worker s mod W + 1 ("worker1"..
    "workerW"; W defaults to S: a stage per worker), each an nn.Module
    created there with rpc.remote and held through an RRef;
  - the master ("master", rank 0) holds the data; per batch of 64, inside a
    dist_autograd context, it cuts the batch into --splits micro-batches and
    for each one chains stage.remote().forward(x_rref) through the stages,
    ending with an rpc_async to the last one (each stage fetches its input
    with to_here and runs under its worker's lock: the tutorial's lock, shared
    by the stages of a worker that holds several, as demo_pipeline's stages
    of one worker share one thread); it joins the
    outputs with torch.cat(wait_all), computes the cross-entropy and runs
    dist_autograd.backward and DistributedOptimizer(Adam, lr 1e-3).step;
  - the data order of an epoch is a permutation drawn from (seed, epoch).
The streams of the seed differ from shmrpc's, so the initial weights and the
data order differ: the same seed policy, not the same numbers.
Every process runs torch with one thread (torch.set_num_threads(1)).

With --batches N (default 30): for each number of splits, N batches after 3
warm-up ones; one machine-readable line each:
  torch_pipeline stages=2 workers=2 splits=4 batch=64 batches=30 samples_per_s=123
With --epochs E instead: E epochs, then the accuracy on the 10000 test images:
  torch_pipeline_train stages=2 workers=2 splits=4 epochs=2 test_acc=0.8912 train_s=600.1 samples_per_s=200
"""
import argparse
import os
import socket
import threading
import time

from rpc_common import import_torch, load_fashion_mnist

torch, rpc, mp = import_torch("torch_pipeline.py")
import numpy as np  # noqa: E402  (after torch's import check)
import torch.distributed.autograd as dist_autograd  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.optim import DistributedOptimizer  # noqa: E402
from torch.distributed.rpc import RRef  # noqa: E402

BATCH = 64
LR = 1e-3
WARMUP = 3
# Layer ranges of each split, as demo_pipeline's BOUNDS.
BOUNDS = {2: [0, 4, 10], 3: [0, 4, 5, 10], 4: [0, 2, 4, 5, 10]}


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.LayerNorm([32, 28, 28]), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.LayerNorm([64, 14, 14]), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 10))


# One forward at a time in a worker, whichever of its stages it runs.
WORKER_LOCK = threading.Lock()


class Stage(nn.Module):
    """Layers [lo, hi) of the model built whole from the seed (the tutorial's Shard)."""

    def __init__(self, seed, lo, hi):
        super().__init__()
        torch.set_num_threads(1)
        self.seq = make_model(seed)[lo:hi]
        self._lock = WORKER_LOCK

    def forward(self, x_rref):
        x = x_rref.to_here()
        with self._lock:
            return self.seq(x)

    def parameter_rrefs(self):
        return [RRef(p) for p in self.parameters()]


class Pipeline(nn.Module):
    def __init__(self, stages, workers, splits, seed):
        super().__init__()
        b = BOUNDS[stages]
        self.stages = [rpc.remote(f"worker{s % workers + 1}", Stage, args=(seed, b[s], b[s + 1]))
                       for s in range(stages)]
        self.splits = splits

    def forward(self, xs):
        futs = []
        for x in xs.chunk(self.splits, dim=0):
            ref = RRef(x)
            for st in self.stages[:-1]:
                ref = st.remote().forward(ref)
            futs.append(self.stages[-1].rpc_async().forward(ref))
        return torch.cat(torch.futures.wait_all(futs))

    def parameter_rrefs(self):
        return [r for st in self.stages for r in st.remote().parameter_rrefs().to_here()]


def epoch_order(seed, epoch, n):
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch(images, labels, idx):
    x = torch.from_numpy(images[idx].astype(np.float32) / 255.0).view(-1, 1, 28, 28)
    return x, torch.from_numpy(labels[idx])


def step(model, opt, x, y):
    with dist_autograd.context() as ctx:
        loss = F.cross_entropy(model(x), y)
        dist_autograd.backward(ctx, [loss])
        opt.step(ctx)
    return loss.item()


def make(stages, workers, splits, seed):
    model = Pipeline(stages, workers, splits, seed)
    return model, DistributedOptimizer(torch.optim.Adam, model.parameter_rrefs(), lr=LR)


def bench(args, images, labels):
    for splits in args.splits:
        model, opt = make(args.stages, args.workers, splits, args.seed)
        perm = epoch_order(args.seed, 0, len(images))
        t0 = 0.0
        for b in range(WARMUP + args.batches):
            if b == WARMUP:
                t0 = time.monotonic()
            step(model, opt, *batch(images, labels, perm[b * BATCH:(b + 1) * BATCH]))
        secs = time.monotonic() - t0
        print(f"torch_pipeline stages={args.stages} workers={args.workers} splits={splits} batch={BATCH} "
              f"batches={args.batches} samples_per_s={args.batches * BATCH / secs:.0f}", flush=True)


def train(args, images, labels):
    splits = args.splits[0]
    model, opt = make(args.stages, args.workers, splits, args.seed)
    nb = (len(images) + BATCH - 1) // BATCH
    t0, samples = time.monotonic(), 0
    for e in range(args.epochs):
        perm = epoch_order(args.seed, e, len(images))
        for b in range(nb):
            x, y = batch(images, labels, perm[b * BATCH:(b + 1) * BATCH])
            loss = step(model, opt, x, y)
            samples += len(y)
            if b % 100 == 0:
                print(f"# epoch {e + 1} batch {b}/{nb} loss {loss:.4f}", flush=True)
    secs = time.monotonic() - t0
    test_x, test_y = load_fashion_mnist(False)
    correct = 0
    with torch.no_grad():
        for at in range(0, len(test_x), 1000):
            x, y = batch(test_x, test_y, np.arange(at, min(at + 1000, len(test_x))))
            correct += (model(x).argmax(1) == y).sum().item()
    print(f"torch_pipeline_train stages={args.stages} workers={args.workers} splits={splits} epochs={args.epochs} "
          f"test_acc={correct / len(test_x):.4f} train_s={secs:.1f} samples_per_s={samples / secs:.0f}", flush=True)


def worker(rank, world, port, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # 128 threads, as the tutorial's run_worker: each forward call holds an
    # RPC thread while it waits in to_here, so a worker that holds two stages
    # (--workers) has 2 x splits of them waiting at once; with 16, 8 splits
    # could take every thread and leave none to answer the fetches the
    # waiting calls need (the job then hangs until rpc_timeout).
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=128, rpc_timeout=600)
    rpc.init_rpc("master" if rank == 0 else f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank == 0:
        images, labels = load_fashion_mnist(True)
        (train if args.epochs else bench)(args, images, labels)
    rpc.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=2, choices=[2, 3, 4])
    ap.add_argument("--workers", type=int, default=0, help="stage workers, 2 to S (default S)")
    ap.add_argument("--splits", default="1,2,4,8", help="comma-separated micro-batches per batch")
    ap.add_argument("--batches", type=int, default=30, help="timed batches per number of splits")
    ap.add_argument("--epochs", type=int, default=0, help="train E epochs (the first --splits) and test instead")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.splits = [int(s) for s in args.splits.split(",") if s]
    args.workers = args.workers or args.stages
    if not 2 <= args.workers <= args.stages:
        ap.error(f"--workers takes 2 to --stages ({args.stages}), got {args.workers}")
    torch.set_num_threads(1)
    print(f"# PyTorch {torch.__version__} torch.distributed.rpc (TensorPipe), pipeline of {args.stages} stages on {args.workers} workers, "
          f"CNN with layer norm, batch {BATCH}, Adam lr {LR}, 1 thread per process", flush=True)
    mp.spawn(worker, args=(args.workers + 1, free_port(), args), nprocs=args.workers + 1, join=True)


if __name__ == "__main__":
    main()
