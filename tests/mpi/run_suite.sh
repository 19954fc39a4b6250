#!/bin/sh
# run_suite.sh HOSTS PROGRAM [ARGS...]: an MPI suite runner (tests/mpi) as
# `mpirun -n 4` with every rank on this machine split into HOSTS pretend
# hosts (SHMRPC_HOSTS, issue 13), MPI traffic over TCP on loopback.
# SRT_NP overrides the rank count. CI runs as root, hence the two
# OMPI_ALLOW_RUN_AS_ROOT variables; 2 cores, hence --oversubscribe and no
# binding.
set -eu
hosts=$1
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -n "${SRT_NP:-4}" --oversubscribe --bind-to none \
    --mca btl self,tcp --mca btl_tcp_if_include lo \
    -x SHMRPC_HOSTS="$hosts" "$@"
