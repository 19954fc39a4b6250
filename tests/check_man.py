#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The shmrun man page is installed and complete.

    check_man.py MESON BUILD_DIR SHMRUN

Runs `meson install --tags man` of BUILD_DIR into a temporary DESTDIR and
checks that it put shmrun.1 under <mandir>/man1, identical to the built
page; that the page names every long option `shmrun --help` prints; and,
when groff is installed, that groff renders it without a warning.
Exit 0 when all hold, 1 with one line per problem otherwise.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def main():
    meson, build, shmrun = sys.argv[1:4]
    problems = []
    with tempfile.TemporaryDirectory(prefix="shmrun-man-") as dest:
        run = subprocess.run([meson, "install", "-C", build, "--no-rebuild", "--quiet", "--tags", "man",
                              "--destdir", dest], capture_output=True, text=True)
        if run.returncode:
            print(f"meson install failed ({run.returncode}):\n{run.stdout}{run.stderr}")
            return 1
        found = [os.path.join(d, f) for d, _, files in os.walk(dest) for f in files]
        pages = [p for p in found if p.endswith(os.path.join("man1", "shmrun.1"))]
        if len(pages) != 1:
            print(f"meson install put no man1/shmrun.1 under DESTDIR; it installed: {found}")
            return 1
        with open(pages[0]) as f:
            page = f.read()
        with open(os.path.join(build, "launcher", "shmrun.1")) as f:
            if f.read() != page:
                problems.append("the installed page differs from the built one")
    if "@VERSION@" in page:
        problems.append("the version was not substituted")
    text = page.replace("\\-", "-")
    usage = subprocess.run([shmrun, "--help"], capture_output=True, text=True, check=True).stdout
    for opt in sorted(set(re.findall(r"--[a-z][a-z-]*", usage))):
        if not re.search(re.escape(opt) + r"(?![a-z-])", text):
            problems.append(f"the man page does not document {opt}")
    if "EXAMPLES" not in page:
        problems.append("the man page has no EXAMPLES section")
    if shutil.which("groff"):
        g = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=page, capture_output=True, text=True)
        if g.returncode or g.stderr:
            problems.append(f"groff warns: {g.stderr.strip()}")
    for p in problems:
        print(p)
    return 1 if problems else 0


sys.exit(main())
