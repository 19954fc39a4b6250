#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Golden values for the tensor/autograd tests, computed with PyTorch.

Run by hand with Debian's python3-torch (not needed by the C tests):
    apt-get install -y python3-torch
    /usr/bin/python3 tests/golden/make_golden.py > tests/golden/golden.txt

Every case has inputs, an expression and the expected output(s) and input
gradients. A case with one output backpropagates loss = sum(out * w), with
w[j] = cos(0.37 j) in the output's dtype (so gradients are not all ones). A
case with several outputs (multi-root) backpropagates all of them at once,
each with gradient 1. tests/tensor/test_tensor_golden.c builds the same expressions
in C, by case name, and compares.

File format, one record per line:
    case NAME
    in INDEX DTYPE REQUIRES_GRAD NDIM SHAPE... : VALUES...
    out DTYPE NDIM SHAPE... : VALUES...
    grad INDEX NDIM SHAPE... : VALUES...      (inputs that require grad)
    end
"""
import math
import sys

import torch

G = torch.Generator().manual_seed(20240611)
DT = {torch.float64: "f64", torch.float32: "f32", torch.int64: "i64"}


def rnd(shape, lo=-1.0, hi=1.0, dt=torch.float64):
    return (torch.rand(shape, generator=G, dtype=torch.float64) * (hi - lo) + lo).to(dt)


def pos(shape, dt=torch.float64):
    return rnd(shape, 0.5, 2.0, dt)


def tgt(values):
    return torch.tensor(values, dtype=torch.int64)


CASES = []


def case(name, inputs, fn):
    CASES.append((name, inputs, fn))


def f(x):
    return repr(float(x)) if x.dtype == torch.float64 else ("%.9g" % float(x))


def vals(t):
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.int64:
        return " ".join(str(int(v)) for v in t)
    return " ".join(f(v) for v in t)


def shape(t):
    return " ".join([str(t.dim())] + [str(s) for s in t.shape])


def weights(out):
    n = out.numel()
    w = torch.tensor([math.cos(0.37 * j) for j in range(n)], dtype=torch.float64)
    return w.to(out.dtype).reshape(out.shape)


def emit(name, inputs, fn, w):
    ins = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*ins)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) == 1:
        (outs[0] * weights(outs[0])).sum().backward()
    else:
        torch.autograd.backward(outs)
    w("case %s\n" % name)
    for i, t in enumerate(ins):
        w("in %d %s %d %s : %s\n" % (i, DT[t.dtype], int(t.requires_grad), shape(t), vals(t)))
    for o in outs:
        w("out %s %s : %s\n" % (DT[o.dtype], shape(o), vals(o)))
    for i, t in enumerate(ins):
        if t.requires_grad:
            g = t.grad if t.grad is not None else torch.zeros_like(t)
            w("grad %d %s : %s\n" % (i, shape(g), vals(g)))
    w("end\n")


# elementwise, with broadcasting
case("add_bcast", [rnd((2, 3)), rnd((3,))], lambda a, b: a + b)
case("add_bcast_both", [rnd((2, 1, 3)), rnd((4, 1))], lambda a, b: a + b)
case("sub_bcast", [rnd((3, 1)), rnd((1, 4))], lambda a, b: a - b)
case("mul_bcast", [rnd((2, 3)), rnd((2, 1))], lambda a, b: a * b)
case("mul_self", [rnd((3,))], lambda a: a * a)
case("div_bcast", [rnd((2, 3)), pos((3,))], lambda a, b: a / b)
case("pow_tensor", [pos((2, 3)), rnd((3,))], lambda a, b: a ** b)
case("neg", [rnd((2, 2))], lambda a: -a)
case("scalar_ops", [rnd((2, 3))], lambda a: ((a + 2.0) - 0.5) * 3.0 / 4.0)
case("pow_scalar", [pos((4,))], lambda a: a ** 2.5)
case("pow_scalar_int", [rnd((4,))], lambda a: a ** 3)
for op in ["exp", "sin", "cos", "tanh", "relu", "sigmoid"]:
    case("unary_" + op, [rnd((2, 3))], getattr(torch, op))
case("unary_log", [pos((2, 3))], torch.log)
case("unary_sqrt", [pos((2, 3))], torch.sqrt)
# linear algebra
case("matmul_1d1d", [rnd((4,)), rnd((4,))], torch.matmul)
case("matmul_2d1d", [rnd((3, 4)), rnd((4,))], torch.matmul)
case("matmul_1d2d", [rnd((4,)), rnd((4, 3))], torch.matmul)
case("matmul_2d2d", [rnd((3, 4)), rnd((4, 2))], torch.matmul)
case("matmul_3d2d", [rnd((2, 3, 4)), rnd((4, 5))], torch.matmul)
case("matmul_bcast", [rnd((2, 1, 3, 4)), rnd((3, 4, 2))], torch.matmul)
case("matmul_1d3d", [rnd((4,)), rnd((2, 4, 3))], torch.matmul)
case("matmul_3d1d", [rnd((2, 3, 4)), rnd((4,))], torch.matmul)
case("mm", [rnd((3, 4)), rnd((4, 5))], torch.mm)
case("mm_transposed", [rnd((4, 3)), rnd((5, 4))], lambda a, b: torch.mm(a.t(), b.t()))
case("bmm", [rnd((2, 3, 4)), rnd((2, 4, 5))], torch.bmm)
# reductions
case("sum_all", [rnd((2, 3))], torch.sum)
case("sum_dim", [rnd((2, 3, 4))], lambda a: a.sum(1))
case("sum_dim_keep", [rnd((2, 3))], lambda a: a.sum(0, keepdim=True))
case("mean_all", [rnd((2, 3))], torch.mean)
case("mean_dim", [rnd((2, 3, 4))], lambda a: a.mean(-1))
case("mean_dim_keep", [rnd((3, 4))], lambda a: a.mean(1, keepdim=True))
# views and joins
case("view", [rnd((2, 6))], lambda a: a.view(3, 4) * a.view(3, 4))
case("reshape_copy", [rnd((3, 4))], lambda a: a.t().reshape(12))
case("transpose", [rnd((2, 3, 4))], lambda a: a.transpose(0, 2))
case("t", [rnd((3, 4))], lambda a: a.t())
case("permute", [rnd((2, 3, 4))], lambda a: a.permute(2, 0, 1))
case("narrow", [rnd((3, 5))], lambda a: a.narrow(1, 1, 3))
case("squeeze_unsqueeze", [rnd((3, 1, 2))], lambda a: a.squeeze(1).unsqueeze(0) * 2.0)
case("expand", [rnd((3, 1))], lambda a: a.expand(2, 3, 4))
case("stack", [rnd((2, 3)), rnd((2, 3)), rnd((2, 3))], lambda a, b, c: torch.stack([a, b * 2.0, c], 1))
case("cat", [rnd((2, 3)), rnd((2, 1))], lambda a, b: torch.cat([a, b], 1))
case("chunk", [rnd((5, 2))], lambda a: torch.cat([c * (i + 1) for i, c in enumerate(a.chunk(3, 0))], 0))
case("split", [rnd((7,))], lambda a: torch.cat([s.exp() if i == 0 else s * 2.0 for i, s in enumerate(a.split(3))]))
case("split_unused", [rnd((6,))], lambda a: a.split(2)[1] * 3.0)
case("clone", [rnd((2, 3))], lambda a: a.clone() * a)
case("contiguous", [rnd((3, 4))], lambda a: a.t().contiguous())
# losses
case("mse_loss", [rnd((3, 4)), rnd((3, 4))], torch.nn.functional.mse_loss)
case("log_softmax_1", [rnd((3, 5), -3, 3)], lambda a: torch.log_softmax(a, 1))
case("log_softmax_0", [rnd((3, 5), -3, 3)], lambda a: torch.log_softmax(a, 0))
case("softmax", [rnd((2, 4), -3, 3)], lambda a: torch.softmax(a, -1))
case("nll_loss", [rnd((4, 5)), tgt([1, 0, 4, -100])],
     lambda a, t: torch.nn.functional.nll_loss(torch.log_softmax(a, 1), t))
case("nll_loss_1d", [rnd((5,)), tgt(3)], lambda a, t: torch.nn.functional.nll_loss(torch.log_softmax(a, 0), t))
case("cross_entropy", [rnd((4, 5), -2, 2), tgt([2, 4, 0, 1])], torch.nn.functional.cross_entropy)
case("cross_entropy_1d", [rnd((5,), -2, 2), tgt(2)], torch.nn.functional.cross_entropy)
# f32
case("f32_add_bcast", [rnd((2, 3), dt=torch.float32), rnd((3,), dt=torch.float32)], lambda a, b: a + b)
case("f32_matmul", [rnd((3, 4), dt=torch.float32), rnd((4, 2), dt=torch.float32)], torch.matmul)
case("f32_log_softmax", [rnd((3, 4), -3, 3, dt=torch.float32)], lambda a: torch.log_softmax(a, 1))
case("f32_mse_loss", [rnd((5,), dt=torch.float32), rnd((5,), dt=torch.float32)], torch.nn.functional.mse_loss)
# compositions
case("mlp", [rnd((4, 3)), rnd((3, 5)), rnd((5,)), rnd((5, 2)), rnd((2,)), tgt([0, 1, 1, 0])],
     lambda x, w1, b1, w2, b2, t: torch.nn.functional.cross_entropy(torch.relu(x @ w1 + b1) @ w2 + b2, t))
# PyTorch's dist_autograd test_backward_multiple_roots, locally: four scalar
# roots; grad t1 = 1 + t2 - sin(t1) + 1/t2, grad t2 = 1 + t1 - t1/t2^2.
case("multi_root", [rnd((3, 3), 0.2, 1.0), rnd((3, 3), 0.2, 1.0)],
     lambda t1, t2: [(t1 + t2).sum(), (t1 * t2).sum(), torch.cos(t1).sum(), (t1 / t2).sum()])

# convolution layers (appended, so the cases above keep their inputs)
F = torch.nn.functional
case("conv2d_basic", [rnd((2, 3, 5, 6)), rnd((4, 3, 3, 3)), rnd((4,))], F.conv2d)
case("conv2d_stride2_pad1", [rnd((2, 2, 7, 6)), rnd((3, 2, 3, 3)), rnd((3,))],
     lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1))
case("conv2d_dilation2", [rnd((1, 2, 7, 7)), rnd((2, 2, 3, 2)), rnd((2,))],
     lambda x, w, b: F.conv2d(x, w, b, padding=(1, 2), dilation=2))
case("conv2d_groups2", [rnd((2, 4, 5, 5)), rnd((6, 2, 3, 3)), rnd((6,))],
     lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2))
case("conv2d_nobias_odd", [rnd((3, 1, 5, 7)), rnd((2, 1, 2, 3))], lambda x, w: F.conv2d(x, w, stride=(1, 2)))
case("f32_conv2d", [rnd((2, 3, 6, 6), dt=torch.float32), rnd((4, 3, 3, 3), dt=torch.float32),
                    rnd((4,), dt=torch.float32)], lambda x, w, b: F.conv2d(x, w, b, padding=1))
case("max_pool2d", [rnd((2, 3, 6, 7))], lambda x: F.max_pool2d(x, 2))
case("max_pool2d_pad", [rnd((1, 2, 7, 5))], lambda x: F.max_pool2d(x, 3, stride=2, padding=1))
case("avg_pool2d", [rnd((2, 2, 6, 6))], lambda x: F.avg_pool2d(x, 2))
case("avg_pool2d_pad", [rnd((1, 2, 7, 5))], lambda x: F.avg_pool2d(x, 3, stride=2, padding=1))
case("f32_max_pool2d", [rnd((2, 2, 5, 5), dt=torch.float32)], lambda x: F.max_pool2d(x, 2))
case("f32_avg_pool2d", [rnd((2, 2, 5, 5), dt=torch.float32)], lambda x: F.avg_pool2d(x, 3, stride=2, padding=1))
case("flatten", [rnd((2, 3, 4, 5))], lambda x: torch.flatten(x, 1) * torch.flatten(x, 1, 2).reshape(2, 60))
case("layer_norm", [rnd((2, 3, 4, 5)), rnd((4, 5)), rnd((4, 5))], lambda x, w, b: F.layer_norm(x, (4, 5), w, b))
case("layer_norm_chw", [rnd((2, 3, 4, 5), -3, 3)], lambda x: F.layer_norm(x, (3, 4, 5)))
case("f32_layer_norm", [rnd((3, 8), dt=torch.float32), rnd((8,), dt=torch.float32), rnd((8,), dt=torch.float32)],
     lambda x, w, b: F.layer_norm(x, (8,), w, b))
case("cnn", [rnd((2, 1, 8, 8)), rnd((4, 1, 3, 3)), rnd((4,)), rnd((3, 64)), rnd((3,)), tgt([2, 0])],
     lambda x, w1, b1, w2, b2, t: F.cross_entropy(
         F.linear(torch.flatten(F.max_pool2d(torch.relu(F.conv2d(x, w1, b1, padding=1)), 2), 1), w2, b2), t))

# conv2d's fast paths (appended): the direct forward (few input channels; f32
# blocks of 32 columns, so width 37 takes two), an odd channel count, batch
# 1; the backward as a convolution of dY (16 input channels), odd widths
f32 = torch.float32
case("f32_conv2d_direct", [rnd((1, 1, 5, 37), dt=f32), rnd((3, 1, 3, 3), dt=f32), rnd((3,), dt=f32)],
     lambda x, w, b: F.conv2d(x, w, b, padding=1))
case("f32_conv2d_direct_c3", [rnd((2, 3, 6, 9), dt=f32), rnd((5, 3, 3, 3), dt=f32), rnd((5,), dt=f32)],
     lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(0, 1)))
case("f32_conv2d_by_conv", [rnd((2, 16, 5, 7), dt=f32), rnd((3, 16, 3, 3), dt=f32), rnd((3,), dt=f32)],
     lambda x, w, b: F.conv2d(x, w, b, padding=1))
case("f32_conv2d_by_conv_pad", [rnd((1, 16, 4, 6), dt=f32), rnd((2, 16, 2, 3), dt=f32)],
     lambda x, w: F.conv2d(x, w, padding=(1, 2)))


def main():
    w = sys.stdout.write
    w("# generated by tests/golden/make_golden.py with torch %s; do not edit\n" % torch.__version__)
    for name, inputs, fn in CASES:
        emit(name, inputs, fn, w)


if __name__ == "__main__":
    main()
