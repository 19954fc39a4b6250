#!/usr/bin/env python3
"""Packaging hygiene checks, run by meson test.

  check_packaging.py pkgconfig BUILD_DIR SOURCE_DIR HAVE_BLAS
      The generated shmrpc.pc (installed form, meson-private/) and
      shmrpc-uninstalled.pc: `pkg-config --cflags` carries no OpenBLAS include
      path, OpenBLAS is not in Requires.private (pkg-config would hand its
      Cflags to every user), and, when the library uses it, its link flags are
      in Libs.private (`--static` links it). No public header includes cblas.h.

  check_packaging.py subproject SOURCE_DIR
      A host project in a temporary directory uses shmrpc as a meson
      subproject (subprojects/shmrpc is a symlink to SOURCE_DIR). Its own
      source has a warning that -Werror would turn into an error. The host is
      configured with werror off; no compile command of the build (the host's
      nor shmrpc's own) may carry -Werror; the host builds, and runs a matmul.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print("check_packaging: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if p.returncode != 0:
        fail("%s exited with %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-4000:]))
    return p.stdout


def pkgconfig(build, source, have_blas):
    blas_cflags = subprocess.run(["pkg-config", "--cflags-only-I", "openblas"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True).stdout.split()
    checked = 0
    for sub, name in (("meson-private", "shmrpc"), ("meson-uninstalled", "shmrpc-uninstalled")):
        d = os.path.join(build, sub)
        pc = os.path.join(d, name + ".pc")
        if not os.path.exists(pc):
            fail("%s was not generated" % pc)
        text = open(pc).read()
        env = dict(os.environ, PKG_CONFIG_PATH=d)
        cflags = run(["pkg-config", "--cflags", name], env=env)
        print("%s: pkg-config --cflags: %s" % (pc, cflags.strip()))
        if "openblas" in cflags.lower() or any(f in cflags.split() for f in blas_cflags):
            fail("%s: `pkg-config --cflags %s` carries OpenBLAS's include path: %s" % (pc, name, cflags.strip()))
        for line in text.splitlines():
            if line.startswith("Requires") and "openblas" in line:
                fail("%s: OpenBLAS in %s (its Cflags reach every user)" % (pc, line))
        static = run(["pkg-config", "--libs", "--static", name], env=env)
        if have_blas and "-lopenblas" not in static.split():
            fail("%s: the library links OpenBLAS but `pkg-config --libs --static` lacks -lopenblas: %s"
                 % (pc, static.strip()))
        checked += 1
    inc = os.path.join(source, "lib", "include", "shmrpc")
    for h in sorted(os.listdir(inc)):
        if re.search(r"#\s*include\s*[<\"]cblas\.h", open(os.path.join(inc, h)).read()):
            fail("public header %s includes cblas.h" % h)
    print("check_packaging: %d .pc files clean; no public header includes cblas.h" % checked)


HOST_MESON = """project('host', 'c', default_options: ['warning_level=2', 'werror=false', 'buildtype=plain'])
shmrpc = dependency('shmrpc', fallback: ['shmrpc', 'shmrpc_dep'])
executable('host', 'host.c', dependencies: shmrpc)
"""

HOST_C = r"""#include <stdio.h>
#include <shmrpc/shmrpc.h>

int main(void)
{
    int unused_on_purpose; /* -Wunused-variable: an error only under -Werror */
    int64_t shape[2] = {2, 2};
    sr_tensor *a = sr_full(SR_F64, 2, shape, 1.0, 0), *b = sr_full(SR_F64, 2, shape, 2.0, 0);
    sr_tensor *c = a && b ? sr_mm(a, b) : NULL;
    double v = c ? sr_tensor_item(sr_sum(c)) : 0;
    printf("host: matmul via %s, sum %g\n", sr_matmul_backend(), v);
    return v == 16.0 ? 0 : 1;
}
"""


def subproject(source):
    tmp = tempfile.mkdtemp(prefix="shmrpc-host-")
    try:
        os.mkdir(os.path.join(tmp, "subprojects"))
        os.symlink(os.path.abspath(source), os.path.join(tmp, "subprojects", "shmrpc"))
        open(os.path.join(tmp, "meson.build"), "w").write(HOST_MESON)
        open(os.path.join(tmp, "host.c"), "w").write(HOST_C)
        b = os.path.join(tmp, "build")
        env = {k: v for k, v in os.environ.items() if k not in ("CFLAGS", "LDFLAGS")}
        run(["meson", "setup", b, tmp], env=env)
        cmds = json.load(open(os.path.join(b, "compile_commands.json")))
        werror = [c["file"] for c in cmds if re.search(r"(^|\s)-Werror(\s|$)", c["command"])]
        if werror:
            fail("built as a subproject, shmrpc forces -Werror on %d files, e.g. %s" % (len(werror), werror[0]))
        if not any(c["file"].endswith("host.c") for c in cmds):
            fail("the host's own file is not in compile_commands.json")
        out = run(["ninja", "-C", b, "host"], env=env)
        if "unused_on_purpose" not in out:
            fail("the host's warning was not printed (the check would prove nothing):\n" + out[-2000:])
        print(run([os.path.join(b, "host")]).strip())
        print("check_packaging: the host built with its warning and no -Werror anywhere (%d compile commands)"
              % len(cmds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "pkgconfig":
        pkgconfig(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
    elif len(sys.argv) == 3 and sys.argv[1] == "subproject":
        subproject(sys.argv[2])
    else:
        print("usage: check_packaging.py pkgconfig BUILD SOURCE HAVE_BLAS | subproject SOURCE", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
