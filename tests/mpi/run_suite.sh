#!/bin/bash
# SPDX-License-Identifier: MIT
# run_suite.sh HOSTS PROGRAM [ARGS...]: an MPI suite runner (tests/mpi) as
# `mpirun -n 4` with every rank on this machine, split into HOSTS pretend
# hosts (SHMRPC_HOSTS), MPI over TCP on loopback, with CI's flags
# and environment (mpirun_env.sh: root, 2 cores, the sanitizer's unwinder).
# SRT_NP overrides the rank count.
set -eu
. "$(dirname "$0")/mpirun_env.sh"
hosts=$1
shift
exec "${MPIRUN[@]}" -n "${SRT_NP:-4}" -x SHMRPC_HOSTS="$hosts" "$@"
