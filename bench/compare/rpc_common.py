# SPDX-License-Identifier: MIT
"""Shared by the torch comparison scripts: importing torch, timing loops."""
import sys
import time


def import_torch(script):
    """torch, torch.distributed.rpc and torch.multiprocessing, or exit saying how to get them."""
    try:
        import torch
        import torch.distributed.rpc as rpc
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit(f"{script}: python3-torch is not installed (apt-get install python3-torch)")
    return torch, rpc, mp


def percentiles(samples):
    s = sorted(samples)
    return s[len(s) // 2], s[min(len(s) - 1, len(s) * 99 // 100)]


def timed(fn, n, warmup=0):
    """p50 and p99 in ns of n calls of fn, after warmup calls."""
    for _ in range(warmup):
        fn()
    lat = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        lat.append(time.perf_counter_ns() - t0)
    return percentiles(lat)


FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path, magic):
    """The array in one gzip-compressed IDX file (Debian's dataset-fashion-mnist):
    uint8 [N, rows * cols] for magic 0x803 (images), [N] for 0x801 (labels)."""
    import gzip
    import struct

    import numpy as np

    with gzip.open(path, "rb") as f:
        data = f.read()
    got, n = struct.unpack(">II", data[:8])
    if got != magic:
        sys.exit(f"{path}: magic 0x{got:08x}, expected 0x{magic:08x}")
    if magic == 0x803:
        rows, cols = struct.unpack(">II", data[8:16])
        body = np.frombuffer(data, dtype=np.uint8, offset=16)
        if body.size != n * rows * cols:
            sys.exit(f"{path}: {body.size} pixel bytes, expected {n} x {rows} x {cols}")
        return body.reshape(n, rows * cols).copy()  # writable: torch.from_numpy warns on read-only arrays
    body = np.frombuffer(data, dtype=np.uint8, offset=8)
    if body.size != n:
        sys.exit(f"{path}: {body.size} labels, expected {n}")
    return body.astype(np.int64)


def load_fashion_mnist(train, directory=FASHION_MNIST_DIR):
    """(images uint8 [N, 784], labels int64 [N]) of the train (60000) or test (10000) set."""
    import os

    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), 0x801)
    if len(images) != len(labels):
        sys.exit(f"{directory}: {len(images)} images but {len(labels)} labels")
    return images, labels
