#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Packaging hygiene checks, run by meson test.

  check_packaging.py pkgconfig BUILD_DIR SOURCE_DIR HAVE_BLAS
      The generated shmrpc.pc (installed form) and shmrpc-uninstalled.pc, in
      BUILD_DIR: `pkg-config --cflags` carries no OpenBLAS include
      path, OpenBLAS is not in Requires.private (pkg-config would hand its
      Cflags to every user), and, when the library uses it, its link flags are
      in Libs.private (`--static` links it). No public header includes cblas.h.

  check_packaging.py subproject SOURCE_DIR
      A host project in a temporary directory uses shmrpc as a meson
      subproject (subprojects/shmrpc is a symlink to SOURCE_DIR). Its own
      source has a warning that -Werror would turn into an error. The host is
      configured with werror off; no compile command of the build (the host's
      nor shmrpc's own) may carry -Werror; the host builds, and runs a matmul.

  check_packaging.py exports LIBSHMRPC_SO MAP [PLUGIN]
      The dynamic symbols libshmrpc.so defines (nm -D --defined-only) are the
      public API, sr_ names, and the names the version script MAP lists
      outside it; none is internal (sr__); each is under the version node,
      and the SONAME is libshmrpc.so.MAJOR-ish (the file's name up to its
      first version number). The MPI plug-in exports its entry alone.

  check_packaging.py needed PROGRAM
      A single-host program linked with libshmrpc.so: neither it nor
      anything it loads at start (ldd) is a library of Open MPI's.

  check_packaging.py install BUILD_DIR HAVE_MPI
      `meson install --destdir` into a temporary tree: the shared library
      with its SONAME link, the static library, the headers, shmrpc.pc
      without a library path of its own dependencies, the docs and examples
      under share/doc/shmrpc (and the MPI plug-in beside the library). A
      consumer is built from that tree with `pkg-config --static` against
      libshmrpc.a and runs a job; another against libshmrpc.so runs too.
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
    for name in ("shmrpc", "shmrpc-uninstalled"):
        d = build
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
            if line.startswith(("Requires:", "Requires.private:")) and "openblas" in line:
                fail("%s: OpenBLAS in %s (its Cflags reach every user; Requires.internal does not)" % (pc, line))
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


def symbols(path):
    out = run(["nm", "-D", "--defined-only", path])
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def map_globals(path):
    """The names a version script exports outside the sr_* pattern, and its nodes."""
    text = re.sub(r"/\*.*?\*/", "", open(path).read(), flags=re.S)
    nodes = re.findall(r"(\w+)\s*\{", text)
    extra = []
    for block in re.findall(r"global:(.*?)(?:local:|\})", text, flags=re.S):
        extra += [n.strip() for n in block.split(";") if n.strip() and n.strip() != "sr_*"]
    return extra, nodes


def exports(lib, mapfile, plugin):
    extra, nodes = map_globals(mapfile)
    syms = symbols(lib)
    bad, api = [], 0
    for s in syms:
        name, _, node = s.partition("@")
        node = node.lstrip("@")
        if name in nodes and not node:
            continue  # the version node's own symbol
        if node not in nodes:
            bad.append(s + " (not under the node " + "/".join(nodes) + ")")
        elif re.match(r"sr_[a-z0-9]", name):
            api += 1
        elif name not in extra:
            bad.append(s)
    if bad:
        fail("%s exports %d symbols outside the public API (sr_, or %s from %s):\n  %s"
             % (lib, len(bad), ", ".join(extra) or "nothing else", mapfile, "\n  ".join(bad[:40])))
    soname = re.search(r"SONAME\)\s+Library soname: \[(.*)\]", run(["readelf", "-d", lib]))
    want = re.match(r"(.*\.so\.\d+)", os.path.basename(lib))
    if not soname or not want or soname.group(1) != want.group(1):
        fail("%s: SONAME %s, expected %s" % (lib, soname and soname.group(1), want and want.group(1)))
    print("check_packaging: %s exports %d sr_ symbols, %s besides; SONAME %s"
          % (os.path.basename(lib), api, ", ".join(extra) or "nothing", soname.group(1)))
    if plugin:
        psyms = [s.split("@")[0] for s in symbols(plugin)]
        pbad = [s for s in psyms if s not in ("sr_mpi_plugin_entry", "SHMRPC_MPI_PLUGIN")]
        if pbad or "sr_mpi_plugin_entry" not in psyms:
            fail("%s exports %s, not its entry alone" % (plugin, ", ".join(psyms)))
        print("check_packaging: %s exports sr_mpi_plugin_entry alone" % os.path.basename(plugin))


MPI_LIBS = re.compile(r"libmpi|libopen-pal|libopen-rte|pmix|libshmrpc-mpi")


def needed(prog):
    direct = re.findall(r"NEEDED\)\s+Shared library: \[(.*)\]", run(["readelf", "-d", prog]))
    loaded = run(["ldd", prog])
    bad = [n for n in direct if MPI_LIBS.search(n)] + [l.strip() for l in loaded.splitlines() if MPI_LIBS.search(l)]
    if bad:
        fail("%s, a single-host program, links Open MPI:\n  %s" % (prog, "\n  ".join(bad)))
    print("check_packaging: %s needs %s; ldd lists %d objects, none of Open MPI's"
          % (os.path.basename(prog), ", ".join(direct), len(loaded.splitlines())))


CONSUMER_C = r"""#include <stdio.h>
#include <string.h>
#include <shmrpc/shmrpc.h>

static int twice(sr_call *c) { return sr_call_return(c, sr_int(2 * sr_value_int(sr_call_arg(c, 0)))); }

static int worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    if (sr_init(NULL))
        return fprintf(stderr, "consumer: sr_init: %s\n", sr_last_error()), 1;
    int ok = 1;
    if (rank == 0) {
        sr_value *x = sr_int(21), *y = NULL;
        int rc = sr_rpc_sync(1, "twice", SR_ARGS(x), 10000, &y);
        ok = !rc && sr_value_int(y) == 42;
        if (!ok)
            fprintf(stderr, "consumer: rpc %d: %s\n", rc, sr_last_error());
        sr_value_unref(x);
        sr_value_unref(y);
    }
    return sr_shutdown(true, 0) == 0 && ok ? 0 : 1;
}

int main(void)
{
    if (strcmp(sr_version(), SR_VERSION_STRING))
        return fprintf(stderr, "consumer: runs with %s, built against %s\n", sr_version(), SR_VERSION_STRING), 1;
    int64_t shape[2] = {2, 2};
    sr_tensor *a = sr_full(SR_F64, 2, shape, 1.0, 0), *b = sr_full(SR_F64, 2, shape, 2.0, 0);
    sr_tensor *c = a && b ? sr_mm(a, b) : NULL;
    double v = c ? sr_tensor_item(sr_sum(c)) : 0;
    sr_register("twice", twice);
    int rc = sr_spawn(2, worker, NULL, NULL);
    printf("consumer: shmrpc %s, matmul via %s, sum %g, job %d\n", sr_version(), sr_matmul_backend(), v, rc);
    return v == 16.0 && rc == 0 ? 0 : 1;
}
"""


def install(build, have_mpi):
    tmp = tempfile.mkdtemp(prefix="shmrpc-install-")
    try:
        dest = os.path.join(tmp, "dest")
        run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"])
        intro = json.load(open(os.path.join(build, "meson-info", "intro-buildoptions.json")))
        opt = {o["name"]: o["value"] for o in intro}
        prefix = dest + opt["prefix"]
        libdir = os.path.join(prefix, opt["libdir"])
        doc = os.path.join(prefix, opt["datadir"], "doc", "shmrpc")
        want = [os.path.join(libdir, f) for f in ("libshmrpc.so", "libshmrpc.so.0", "libshmrpc.a",
                                                  "pkgconfig/shmrpc.pc")]
        want += [os.path.join(prefix, opt["includedir"], "shmrpc", h) for h in ("shmrpc.h", "version.h")]
        want += [os.path.join(doc, f) for f in ("LICENSE", "CHANGELOG.md", "README.md", "API.md", "RELEASING.md",
                                                "examples/01_rpc.c")]
        if have_mpi:
            want.append(os.path.join(libdir, "libshmrpc-mpi.so"))
        missing = [w for w in want if not os.path.exists(w)]
        if missing:
            fail("meson install did not install:\n  " + "\n  ".join(missing))
        pc = open(os.path.join(libdir, "pkgconfig", "shmrpc.pc")).read()
        for line in pc.splitlines():
            if line.startswith("Libs") and re.search(r"-L(?!\$\{libdir\})", line):
                fail("shmrpc.pc has a library path of its own: " + line)
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
        pcargs = ["--define-variable=prefix=" + prefix, "shmrpc"]
        cflags = run(["pkg-config", "--cflags"] + pcargs, env=env).split()
        static = run(["pkg-config", "--libs", "--static"] + pcargs, env=env).split()
        shared = run(["pkg-config", "--libs"] + pcargs, env=env).split()
        src = os.path.join(tmp, "consumer.c")
        open(src, "w").write(CONSUMER_C)
        exe_static, exe_shared = os.path.join(tmp, "consumer-static"), os.path.join(tmp, "consumer-shared")
        static = ["-l:libshmrpc.a" if f == "-lshmrpc" else f for f in static]
        run(["cc", "-std=c11", src, "-o", exe_static] + cflags + static)
        run(["cc", "-std=c11", src, "-o", exe_shared, "-Wl,-rpath," + libdir] + cflags + shared)
        dyn = run(["readelf", "-d", exe_static])
        if "libshmrpc" in dyn:
            fail("the static consumer needs libshmrpc.so:\n" + dyn)
        if "[libshmrpc.so.0]" not in run(["readelf", "-d", exe_shared]):
            fail("the shared consumer does not need libshmrpc.so.0 (the SONAME)")
        needed(exe_static)
        print(run([exe_static]).strip())
        print(run([exe_shared]).strip())
        print("check_packaging: installed %d files checked; `pkg-config --static` links %s"
              % (len(want), " ".join(static)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "pkgconfig":
        pkgconfig(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
    elif len(sys.argv) == 3 and sys.argv[1] == "subproject":
        subproject(sys.argv[2])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "exports":
        exports(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else None)
    elif len(sys.argv) == 3 and sys.argv[1] == "needed":
        needed(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "install":
        install(sys.argv[2], sys.argv[3] == "1")
    else:
        print("usage: check_packaging.py pkgconfig BUILD SOURCE HAVE_BLAS | subproject SOURCE | "
              "exports LIB MAP [PLUGIN] | needed PROGRAM | install BUILD HAVE_MPI", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
