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
