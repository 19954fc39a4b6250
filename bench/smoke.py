#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One smoke test of the suite `bench` (bench/meson.build): runs a bench as
./dev bench does, but in its quick mode (--smoke, or the bench's own small
options), and fails when it

  * exits with a non-zero status or is killed by a signal,
  * writes anything to stderr: the benches print their errors there, and the
    library its warnings and errors (a leak report, a refused argument); a
    run that went well writes its report to stdout only,
  * says on stdout that something failed ("FAILED", "WRONG": the words the
    benches use for a failure they report and go on after),
  * or never prints EXPECT (the line that says it ran in its quick mode), so
    that a run that did nothing is not taken for one that passed.

A bench that prints "PROG: skipped" (bench_train without Fashion-MNIST) is
reported as skipped (exit 77). The BENCH_* knobs and SHMRPC_LOG_LEVEL of the
caller's environment are dropped, so that no debugging output is read as an
error. The figures a smoke run prints are not measurements: nothing here
looks at them.

    smoke.py EXPECT CMD [ARG...]
"""
import os
import re
import selectors
import subprocess
import sys

FAILED = re.compile(r"\b(FAILED|WRONG)\b")
SKIPPED = re.compile(r"^\S+: skipped\b")


def run(cmd):
    """Runs cmd, echoing its stdout and stderr as they come; returns the
    exit status and the lines of each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_") and k != "SHMRPC_LOG_LEVEL"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, ("out", sys.stdout))
    sel.register(p.stderr, selectors.EVENT_READ, ("err", sys.stderr))
    got = {"out": b"", "err": b""}
    while sel.get_map():
        for key, _ in sel.select():
            data = os.read(key.fileobj.fileno(), 65536)
            name, echo = key.data
            if not data:
                sel.unregister(key.fileobj)
                continue
            got[name] += data
            echo.write(data.decode(errors="replace"))
            echo.flush()
    rc = p.wait()
    return rc, *(got[k].decode(errors="replace").splitlines() for k in ("out", "err"))


def main():
    if len(sys.argv) < 3:
        print("usage: smoke.py EXPECT CMD [ARG...]", file=sys.stderr)
        return 2
    expect, cmd = sys.argv[1], sys.argv[2:]
    rc, out, err = run(cmd)
    why = []
    if rc < 0:
        why.append(f"killed by signal {-rc}")
    elif rc:
        why.append(f"exit status {rc}")
    why += [f"on stderr: {line.strip()[:300]}" for line in err if line.strip()][:5]
    why += [f"a failure reported: {line.strip()[:300]}" for line in out if FAILED.search(line)][:5]
    if not why and any(SKIPPED.match(line) for line in out):
        print(f"smoke: skipped: {' '.join(cmd)}")
        return 77
    if not any(expect in line for line in out + err):
        why.append(f"it never printed '{expect}' (did it run its quick mode?)")
    if why:
        print(f"smoke: FAILED: {' '.join(cmd)}", file=sys.stderr)
        for w in why:
            print(f"smoke:   {w}", file=sys.stderr)
        return 1
    print(f"smoke: ok: {' '.join(cmd)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
