#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Across hosts: the raw Open MPI floor (mpi_floor) and shmrpc's
# cross-host benches, 2 ranks on 2 pretend hosts of this machine, over each
# BTL in turn, in one run (docs/PERFORMANCE.md, "Across hosts (Open MPI)").
#
#   bench/mpi_bench.sh [--json] [BUILD_DIR]        (./dev bench-mpi [--json])
#
# BUILD_DIR defaults to build-release. MPI_BENCH_BTLS (default
# "self,tcp self,vader") lists the BTLs. Every bench of RPC_BENCHES that is
# built runs as
#   mpirun -n 2 -x SHMRPC_HOSTS=2 --mca btl BTL BUILD_DIR/bench/NAME [--json]
# one that is not built is skipped with a note. The mpirun flags for this
# machine (root, oversubscription, no binding, loopback) come from
# tests/mpi/mpirun_env.sh. Exit status: 1 if a bench failed, else 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

RPC_BENCHES=(bench_mpi_rpc)
json=()
build=
for a in "$@"; do
  case "$a" in
    --json) json=(--json) ;;
    -*) echo "mpi_bench: unknown option '$a' (usage: mpi_bench.sh [--json] [BUILD_DIR])" >&2; exit 2 ;;
    *) [ -z "$build" ] || { echo "mpi_bench: one BUILD_DIR only ('$build', '$a')" >&2; exit 2; }
       build=$a ;;
  esac
done
build=${build:-build-release}
[ -x "$build/bench/mpi_floor" ] ||
  { echo "mpi_bench: $build/bench/mpi_floor is not built (Open MPI missing? meson option mpi)" >&2; exit 1; }

. "$here/../tests/mpi/mpirun_env.sh"
# A bench that hangs ends the job instead of the run.
launch=("${MPIRUN_BASE[@]}" --timeout 900 -n 2)

# The machine and its load, for the record (human-readable output: stderr
# under --json, as the benches do).
say() { if [ ${#json[@]} -gt 0 ]; then echo "$@" >&2; else echo "$@"; fi; }
say "# mpi_bench: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores," \
    "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC')"

status=0
for btl in ${MPI_BENCH_BTLS:-self,tcp self,vader}; do
  "${launch[@]}" --mca btl "$btl" "$build/bench/mpi_floor" "${json[@]}" ||
    { echo "mpi_bench: mpi_floor over $btl failed (status $?)" >&2; status=1; }
  for b in "${RPC_BENCHES[@]}"; do
    if [ ! -x "$build/bench/$b" ]; then
      say "# mpi_bench: $b is not built yet: skipped"
      continue
    fi
    "${launch[@]}" -x SHMRPC_HOSTS=2 --mca btl "$btl" "$build/bench/$b" "${json[@]}" ||
      { echo "mpi_bench: $b over $btl failed (status $?)" >&2; status=1; }
  done
done
exit $status
