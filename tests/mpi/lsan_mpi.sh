#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The leak check under mpirun (sanitizer build): lsan_mpi makes shmrpc's MPI
# calls over TCP and over shared memory with 4 ranks; under tests/lsan.supp
# (LSAN_OPTIONS, set for every test) Open MPI's own leaks must be suppressed,
# while a leak of ours (lsan_mpi leak) must still be reported.
#   lsan_mpi.sh LSAN_MPI
set -uo pipefail
prog=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
. "$(dirname "$0")/mpirun_env.sh"
case "${LSAN_OPTIONS:-}" in
  *suppressions=*) ;;
  *) echo "lsan_mpi: LSAN_OPTIONS names no suppressions file (run it through meson test)"; exit 1 ;;
esac

# vader without its single-copy mechanism (CMA, process_vm_readv), which a
# container without CAP_SYS_PTRACE refuses (mpirun_env.sh).
for btl in self,tcp self,vader; do
  extra=()
  [ "$btl" = self,tcp ] || extra=(--mca btl_vader_single_copy_mechanism none)
  if ! "${MPIRUN_BASE[@]}" --timeout 120 --mca btl "$btl" "${extra[@]}" -n 4 "$prog" > "$out" 2>&1 ||
     grep -q 'LeakSanitizer' "$out"; then
    cat "$out"
    echo "lsan_mpi: over $btl, a leak was reported (or the job failed) with the suppressions of tests/lsan.supp"
    exit 1
  fi
  echo "lsan_mpi: over $btl, MPI_Init_thread .. MPI_Finalize: no leak reported"
done

"${MPIRUN[@]}" --timeout 120 -n 2 "$prog" leak > "$out" 2>&1
if ! grep -q 'in leaked_by_lsan_mpi' "$out"; then
  cat "$out"
  echo "lsan_mpi: a leak of our own was not reported: a suppression of tests/lsan.supp hides it"
  exit 1
fi
echo "lsan_mpi: a leak of our own is still reported"
