#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""SHMRPC_LOG_LEVEL on whole jobs (shmrpc/log.h, docs/API.md "Logging").

  check_log.py SHMRUN LOG_PROG

  - debug says what a hang needs: each worker's attach and the end of the
    start barrier, every call that timed out (to whom, after how long),
    every peer that is gone, and each step and wave of sr_shutdown; info
    says none of it;
  - a bad SHMRPC_LOG_LEVEL is reported once per job: by shmrun (its workers
    stay quiet), and by rank 0 of an sr_spawn job.
Each run is bounded by a timeout.
"""
import os
import re
import subprocess
import sys


def fail(msg):
    print("check_log: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def run(argv, level):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHMRPC_", "OMPI_", "PMIX_"))}
    env["SHMRPC_LOG_LEVEL"] = level
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        fail("%s did not exit within 120 s" % " ".join(argv))
    if p.returncode != 0:
        fail("SHMRPC_LOG_LEVEL=%s %s: exit %d\nstderr:\n%s" % (level, " ".join(argv), p.returncode, p.stderr))
    return p.stderr


def want(err, pattern, what, count=None):
    n = len(re.findall(pattern, err, re.M))
    if (count is None and n == 0) or (count is not None and n != count):
        fail("%s: expected %s line(s) matching %r, found %d; stderr:\n%s"
             % (what, "some" if count is None else count, pattern, n, err))


def main():
    shmrun, prog = sys.argv[1], sys.argv[2]
    plain = [shmrun, "-n", "2", "--", prog, "plain"]
    err = run(plain, "debug")
    for r in (0, 1):
        who = r"^worker%d \(rank %d\): debug: " % (r, r)
        want(err, who + r"attach: rank %d is in segment '.*'; waiting for the other workers" % r, "attach")
        want(err, who + r"attach: every worker is in segment", "start barrier")
        want(err, who + r"sr_shutdown: waiting for the other workers to reach shutdown$", "shutdown barrier")
        want(err, who + r"sr_shutdown: waiting for the leader to declare quiescence$", "quiescence")
    w0 = r"^worker0 \(rank 0\): debug: "
    want(err, w0 + r"call 0x[0-9a-f]+ to worker1 \(rank 1\) timed out after 50 ms", "timeout", 1)
    want(err, w0 + r"sr_shutdown: wave 1: \d+ messages sent, \d+ handled, job-wide$", "wave")
    want(err, w0 + r"sr_shutdown: two equal waves: the job is quiescent$", "quiescence", 1)
    print("debug, plain job: %d lines" % len(err.splitlines()))

    err = run(plain, "info")
    want(err, r"debug:", "info level", 0)
    want(err, r"^worker0 \(rank 0\): info: attached to segment", "info level")

    err = run([shmrun, "-n", "3", "--max-workers", "4", "--", prog, "leave"], "debug")
    want(err, r"^worker0 \(rank 0\): debug: worker2 \(rank 2\) is gone: the worker .*left the job", "peer gone")
    print("debug, elastic job: rank 2's departure logged by rank 0")

    bad = r"warning: SHMRPC_LOG_LEVEL='verbose' is not one of error, warn, info, debug; using warn$"
    err = run([shmrun, "-n", "3", "--", prog, "plain"], "verbose")
    want(err, bad, "bad level under shmrun", 1)
    want(err, r"^shmrun: " + bad, "bad level under shmrun, reported by shmrun", 1)
    err = run([prog, "spawn"], "verbose")
    want(err, bad, "bad level under sr_spawn", 1)
    want(err, r"^worker0 \(rank 0\): " + bad, "bad level under sr_spawn, reported by rank 0", 1)
    print("a bad level: one warning per job (shmrun's; rank 0's under sr_spawn)")
    print("check_log: ok")


main()
