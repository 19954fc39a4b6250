# SPDX-License-Identifier: MIT
# mpirun on one machine as CI runs it: root, no hostfile, 2 cores, maybe
# no network but loopback. Sourced by bash scripts (tests/mpi, bench/mpi_bench.sh):
#   . tests/mpi/mpirun_env.sh
#   "${MPIRUN[@]}" -n 4 -x SHMRPC_HOSTS=2 prog ...          # MPI over TCP on loopback
#   "${MPIRUN_BASE[@]}" --mca btl self,vader -n 2 prog ...  # choose the BTL yourself
# The exports make a plain `mpirun` behave the same; the flags in MPIRUN say
# it again on the command line, where the reader of a log sees it. Measured
# with Open MPI 4.1.4 (Debian 12); each line says what fails without it.

# Root: mpirun refuses to start ("mpirun has detected an attempt to run as
# root") unless both are set. CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Without a hostfile the slots are the cores: `mpirun -n 4` on 2 cores stops
# with "There are not enough slots available in the system".
export OMPI_MCA_rmaps_base_oversubscribe=1

# mpirun binds each rank to a core when ranks <= cores (-n 2 on 2 cores:
# rank 0 on core 0, rank 1 on core 1); a rank's progress thread, executors
# and main thread would then share one core. Let the kernel schedule them.
export OMPI_MCA_hwloc_base_binding_policy=none

# The TCP BTL ignores 127.0.0.0/8 by default (btl_tcp_if_exclude): in a
# container whose only interface is lo, `--mca btl self,tcp` fails with "At
# least one pair of MPI processes are unable to reach each other". Loopback
# is also where the pretend hosts of SHMRPC_HOSTS talk.
export OMPI_MCA_btl_tcp_if_include=lo

# Not set here: in a container without CAP_SYS_PTRACE, vader's single-copy
# transfers (CMA, process_vm_readv) fail with "Read -1, expected N, errno =
# 1"; `--mca btl_vader_single_copy_mechanism none` copies through its shared
# buffers instead (slower: the 64 MiB floor of bench/mpi_floor). The tests
# use TCP, where it does not matter.

# AddressSanitizer builds: Open MPI leaks in MPI_Init/MPI_Finalize, from
# components it dlclose()s at MPI_Finalize. The fast unwinder stops at their
# first frame (no frame pointers), which LeakSanitizer then cannot name, so
# the suppressions of tests/lsan.supp (leak:libmpi.so) only match with the
# full unwinder. It costs about 0.7 s per MPI_Init of 4 ranks under ASan.
if [ -n "${LSAN_OPTIONS:-}" ]; then
  export LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0"
fi

# MPIRUN_BASE: everything but the BTL. MPIRUN: MPI over TCP on loopback
# (mpirun refuses an MCA parameter given twice on its command line, so to
# choose another BTL start from MPIRUN_BASE).
# Add `--timeout SECONDS` to bound a whole job (mpirun then aborts it and
# exits non-zero).
MPIRUN_BASE=(mpirun --oversubscribe --bind-to none)
MPIRUN=("${MPIRUN_BASE[@]}" --mca btl self,tcp)
