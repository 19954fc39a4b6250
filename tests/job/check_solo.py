#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A program started without a launcher (docs/LAUNCHER.md, "Without a launcher").

  check_solo.py SOLO_PROG

SOLO_PROG (tests/helpers/solo_prog.c) runs with no SHMRPC_*, Open MPI or
PMIx variable in its environment:
  - none at all: a one-worker job, one warning line on stderr saying how to
    start N workers, exit status 0;
  - SHMRPC_WORLD_SIZE=1: the same job, nothing on stderr;
  - SHMRPC_WORLD_SIZE=3: sr_init refuses, naming shmrun and sr_spawn; exit 1.
Each run is bounded by a timeout.
"""
import os
import subprocess
import sys

JOB_OUT = "rank 0 of 1\nsquare(7) on worker0 = 49\na call to rank 1: -EINVAL\n"


def run(prog, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHMRPC_", "OMPI_", "PMIX_"))}
    env.update(extra)
    try:
        return subprocess.run([prog], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        fail("%s with %s did not exit within 60 s" % (prog, extra or "no launcher variable"))


def fail(msg):
    print("check_solo: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def expect(p, what, status, out, err_lines, err_has):
    report = "%s: exit %d\nstdout:\n%s\nstderr:\n%s" % (what, p.returncode, p.stdout, p.stderr)
    if p.returncode != status:
        fail("expected exit status %d. %s" % (status, report))
    if out is not None and p.stdout != out:
        fail("expected stdout %r. %s" % (out, report))
    lines = p.stderr.splitlines()
    if len(lines) != err_lines:
        fail("expected %d line(s) on stderr. %s" % (err_lines, report))
    for s in err_has:
        if s not in p.stderr:
            fail("expected %r on stderr. %s" % (s, report))
    print("%s: exit %d, stderr %r" % (what, p.returncode, p.stderr.strip()))


def main():
    prog = sys.argv[1]
    name = os.path.basename(prog)
    expect(run(prog, {}), "no launcher", 0, JOB_OUT, 1,
           ["warning: not started by shmrun, sr_spawn or mpirun", "one-worker job",
            "'shmrun -n N %s'" % name])
    expect(run(prog, {"SHMRPC_WORLD_SIZE": "1"}), "SHMRPC_WORLD_SIZE=1", 0, JOB_OUT, 0, [])
    expect(run(prog, {"SHMRPC_WORLD_SIZE": "3"}), "SHMRPC_WORLD_SIZE=3", 1, "", 1,
           ["sr_init: ", "SHMRPC_FD is not set", "shmrun", "sr_spawn"])
    print("check_solo: ok")


main()
