#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Golden values for the local optimizers, computed with torch.optim.

Run by hand with Debian's python3-torch (not needed by the C tests):
    apt-get install -y python3-torch
    /usr/bin/python3 tests/golden/make_optim_golden.py > tests/golden/optim_golden.txt

Every case builds one optimizer (torch's single-tensor implementations,
foreach=False) over two parameters, p0 [2, 3] and p1 [4], and runs two steps
with different gradients; a gradient may be missing (None) in a step. It
records the parameters after each step and the state after the last one.
tests/train/test_optim.c builds the same optimizer in C and compares.

File format, one record per line:
    case NAME
    kind KIND                              (torch's class name)
    opt NAME VALUE...                      (keyword arguments given; bools 0/1)
    param INDEX DTYPE NDIM SHAPE... : VALUES...
    grad STEP INDEX NDIM SHAPE... : VALUES...   (no line: no gradient)
    after STEP INDEX NDIM SHAPE... : VALUES...
    state INDEX KEY NDIM SHAPE... : VALUES...   (after the last step; ints as 0-d)
    end
"""
import sys

import torch

G = torch.Generator().manual_seed(20261124)
DT = {torch.float64: "f64", torch.float32: "f32"}
STEPS = 2


def rnd(shape):
    return torch.rand(shape, generator=G, dtype=torch.float64) * 2.0 - 1.0


# Fixed inputs shared by every case (converted to the case's dtype). Step 2's
# gradient has an exact zero and some signs flipped against step 1's (Rprop).
P = [rnd((2, 3)), rnd((4,))]
GRADS = [[rnd((2, 3)), rnd((4,))], [rnd((2, 3)), rnd((4,))]]
GRADS[1][0][0, 1] = 0.0

CASES = [
    # name, class, kwargs, dtype, missing gradients {(step, index)}
    ("sgd_plain", "SGD", dict(lr=0.1), torch.float64, ()),
    ("sgd_momentum", "SGD", dict(lr=0.1, momentum=0.9), torch.float64, {(1, 1)}),
    ("sgd_dampening_wd", "SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01), torch.float64, ()),
    ("sgd_nesterov_wd", "SGD", dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05), torch.float64, ()),
    ("sgd_maximize", "SGD", dict(lr=0.1, momentum=0.5, maximize=True), torch.float64, ()),
    ("sgd_nesterov_f32", "SGD", dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05), torch.float32, ()),
    ("adam_default", "Adam", dict(), torch.float64, ()),
    ("adam_wd_amsgrad", "Adam", dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True),
     torch.float64, {(1, 1)}),
    ("adam_maximize", "Adam", dict(lr=0.01, maximize=True), torch.float64, ()),
    ("adam_amsgrad_f32", "Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1), torch.float32, ()),
    ("adamw_default", "AdamW", dict(), torch.float64, ()),
    ("adamw_amsgrad", "AdamW", dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.1, amsgrad=True), torch.float64,
     {(2, 0)}),
    ("adamw_maximize_f32", "AdamW", dict(lr=0.01, maximize=True), torch.float32, ()),
    ("adagrad_default", "Adagrad", dict(), torch.float64, ()),
    ("adagrad_lr_decay", "Adagrad", dict(lr=0.1, lr_decay=0.5, weight_decay=0.1, initial_accumulator_value=0.2,
                                         eps=1e-6), torch.float64, {(1, 1)}),
    ("adagrad_maximize_f32", "Adagrad", dict(lr=0.1, lr_decay=0.5, maximize=True), torch.float32, ()),
    ("rmsprop_default", "RMSprop", dict(), torch.float64, ()),
    ("rmsprop_centered_momentum", "RMSprop", dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.7,
                                                  centered=True), torch.float64, {(1, 1)}),
    ("rmsprop_momentum", "RMSprop", dict(lr=0.02, momentum=0.9), torch.float64, ()),
    ("rmsprop_centered_maximize_f32", "RMSprop", dict(lr=0.01, centered=True, maximize=True), torch.float32, ()),
    ("adadelta_default", "Adadelta", dict(), torch.float64, ()),
    ("adadelta_wd_maximize", "Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True),
     torch.float64, {(1, 1)}),
    ("adadelta_f32", "Adadelta", dict(), torch.float32, ()),
    ("adamax_default", "Adamax", dict(), torch.float64, ()),
    ("adamax_wd_maximize", "Adamax", dict(lr=0.01, betas=(0.7, 0.9), eps=1e-6, weight_decay=0.1, maximize=True),
     torch.float64, ()),
    ("adamax_f32", "Adamax", dict(lr=0.01), torch.float32, {(1, 1)}),
    ("rprop_default", "Rprop", dict(), torch.float64, ()),
    # step sizes 0.05 * 1.5 and 0.05 * 0.3 both hit the clamp
    ("rprop_clamp_maximize", "Rprop", dict(lr=0.05, etas=(0.3, 1.5), step_sizes=(0.02, 0.06), maximize=True),
     torch.float64, {(1, 1)}),
    ("rprop_f32", "Rprop", dict(lr=0.05, etas=(0.3, 1.5)), torch.float32, ()),
]


def f(x, dt):
    return repr(float(x)) if dt == torch.float64 else ("%.9g" % float(x))


def shaped(t, dt):
    dims = " ".join([str(t.dim())] + [str(s) for s in t.shape])
    return "%s : %s" % (dims, " ".join(f(v, dt) for v in t.detach().contiguous().reshape(-1)))


def opt_line(k, v):
    vals = v if isinstance(v, tuple) else (v,)
    return "opt %s %s\n" % (k, " ".join(str(int(x)) if isinstance(x, bool) else repr(float(x)) for x in vals))


def emit(w, name, cls, kwargs, dt, missing):
    params = [p.clone().to(dt).requires_grad_(True) for p in P]
    opt = getattr(torch.optim, cls)(params, foreach=False, **kwargs)
    w("case %s\nkind %s\n" % (name, cls))
    for k, v in kwargs.items():
        w(opt_line(k, v))
    for i, p in enumerate(params):
        w("param %d %s %s\n" % (i, DT[dt], shaped(p, dt)))
    for step in range(1, STEPS + 1):
        for i, p in enumerate(params):
            p.grad = None if (step, i) in missing else GRADS[step - 1][i].to(dt)
            if p.grad is not None:
                w("grad %d %d %s\n" % (step, i, shaped(p.grad, dt)))
        opt.step()
        for i, p in enumerate(params):
            w("after %d %d %s\n" % (step, i, shaped(p, dt)))
    for i, p in enumerate(params):
        for key, v in opt.state[p].items():
            if v is None:
                continue
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                w("state %d %s %s\n" % (i, key, shaped(v, dt)))
            else:
                w("state %d %s 0 : %s\n" % (i, key, repr(float(v))))
    w("end\n")


def main():
    w = sys.stdout.write
    w("# generated by tests/golden/make_optim_golden.py with torch %s; do not edit\n" % torch.__version__)
    for c in CASES:
        emit(w, *c)


if __name__ == "__main__":
    main()
