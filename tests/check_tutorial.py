#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The tutorial's printed outputs, checked against its programs.

  check_tutorial.py SHMRUN BUILD_TESTS_DIR DOC STEP    one step: run it, compare
  check_tutorial.py --show SHMRUN BUILD_TESTS_DIR DOC  every step, printed (./dev demo tutorial)

An expected-output block of DOC (docs/TUTORIAL.md) is a fenced block right
after the line `<!-- expected output -->`. Its first line is the command,
`$ shmrun -n N -- build/tests/tutorial_STEP [args]` (a trailing `# comment`
is dropped); the lines after it are what the program prints on stdout. Two
placeholders keep what varies from run to run out of the comparison:
  - a number in braces, `{3.8e-06}`, matches any number (the value shown is
    one run's: times, pids, float noise);
  - a line `...` matches any number of lines, none included.
The command runs as written, with SHMRUN for `shmrun` and BUILD_TESTS_DIR
for `build/tests`, bounded by a timeout; it must exit 0 (77, a skip, is
passed on: step 4 without its data set), print nothing on stderr, and its
stdout must match line by line. Every program in docs/tutorial/ must have
one block.
"""
import os
import re
import subprocess
import sys

MARKER = "<!-- expected output -->"
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def fail(msg):
    print("check_tutorial: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def blocks(doc):
    """{step: (command, [expected lines], line number)} of DOC's marked blocks."""
    lines = open(doc).read().split("\n")
    out = {}
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            fail("%s:%d: %s is not followed by a fenced block" % (doc, i + 1, MARKER))
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None or end == i + 2 or not lines[i + 2].startswith("$ "):
            fail("%s:%d: an expected-output block starts with '$ command' and ends with ```" % (doc, i + 2))
        cmd = lines[i + 2][2:].split("#")[0].split()
        m = [a for a in cmd if a.startswith("build/tests/tutorial_")]
        if not cmd or cmd[0] != "shmrun" or len(m) != 1:
            fail("%s:%d: '%s' does not run build/tests/tutorial_* under shmrun" % (doc, i + 3, lines[i + 2]))
        out[m[0][len("build/tests/tutorial_"):]] = (cmd, lines[i + 3:end], i + 3)
    return out


def pattern(line):
    parts = re.split(r"\{(" + NUMBER + r")\}", line)
    return "".join(re.escape(p) if k % 2 == 0 else NUMBER for k, p in enumerate(parts))


def matches(expected, got):
    """Line by line; '...' matches any run of lines."""
    rx = "".join(r"(?:.*\n)*?" if e == "..." else pattern(e) + r"\n" for e in expected)
    return re.fullmatch(rx, got) is not None


def run(shmrun, tests_dir, cmd):
    argv = [shmrun if a == "shmrun" else a.replace("build/tests", tests_dir, 1) for a in cmd]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        fail("%s did not exit within 240 s" % " ".join(cmd))


def check(shmrun, tests_dir, doc, step, show=False):
    found = blocks(doc)
    if step not in found:
        fail("%s has no expected-output block for tutorial_%s (see %s)" % (doc, step, __file__))
    cmd, expected, at = found[step]
    p = run(shmrun, tests_dir, cmd)
    if show:
        print("$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr, end="", flush=True)
    if p.returncode == 77:
        print("tutorial_%s skipped: %s" % (step, p.stdout.strip()))
        return 77
    if p.returncode != 0:
        fail("%s exited with %d\nstdout:\n%s\nstderr:\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    if p.stderr:
        fail("%s wrote on stderr:\n%s" % (" ".join(cmd), p.stderr))
    if not matches(expected, p.stdout):
        fail("the output of %s differs from %s:%d\nexpected:\n%s\ngot:\n%s"
             % (" ".join(cmd), doc, at, "\n".join(expected), p.stdout))
    print("tutorial_%s: the output matches %s:%d" % (step, os.path.basename(doc), at))
    return 0


def main():
    if sys.argv[1] == "--show":
        shmrun, tests_dir, doc = sys.argv[2:5]
        programs = sorted(f[:-2] for f in os.listdir(os.path.join(os.path.dirname(doc), "tutorial"))
                          if f.endswith(".c"))
        for step in programs:
            check(shmrun, tests_dir, doc, step, show=True)
            print()
        return 0
    shmrun, tests_dir, doc, step = sys.argv[1:5]
    return check(shmrun, tests_dir, doc, step)


sys.exit(main())
