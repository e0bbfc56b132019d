#!/usr/bin/env bash
# Builds the project with sanitizers and runs the tests under them.
#   tools/sanitize.sh address   ASan + UBSan, build-asan/: every unit and mpi test
#   tools/sanitize.sh core      ASan + UBSan, build-asan-core/: nn/'s and comm/'s own tests (the
#                               layers against the reference, finite differences, the network's
#                               buffer reuse, the optimizers; the ring, hierarchical allreduce,
#                               gradient reducer, batch-norm sums, device gradients, stall
#                               checks), which link nothing else, so only comm/ and nn/ are
#                               compiled: CI's sanitized stage (about 4 minutes on two cores)
#   tools/sanitize.sh thread    TSan, build-tsan/: the tests that run threads (comm thread, data
#                               threads, trainer); oneDNN's OpenMP is not instrumented, so the
#                               pure-compute tests stay out of this build's run
#   tools/sanitize.sh emulator  ASan + UBSan, build-asan-emu/: the CUDA backend's kernels and host
#                               code under the CUDA emulator (tests/cuda_emu; needs the toolkit's
#                               headers), so out-of-bounds kernel accesses and leaks show
# Extra arguments go to ctest (e.g. -R allreduce).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: tools/sanitize.sh address|core|thread|emulator [ctest args]}; shift
case $kind in
  address) dir=build-asan ;;
  core) dir=build-asan-core ;;
  thread) dir=build-tsan ;;
  emulator) dir=build-asan-emu ;;
  *) echo "sanitize.sh: unknown sanitizer '$kind' (address, core, thread or emulator)" >&2; exit 2 ;;
esac
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if [[ $kind == emulator ]]; then
  # Only the emulator's targets: the real cuda/ library (nvcc) is neither needed nor sanitized.
  cmake -S . -B $dir -G Ninja -DRT_SANITIZE=address -DRT_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
  cmake --build $dir --target cuda_emu_tests
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $dir -R "^emu" -L unit --output-on-failure "$@"
  exit
fi
# cuDNN/cuBLAS are not built with sanitizers and the GPU tests can only skip here: CPU code only.
# -O1 -g1 (line tables) as the sanitizers' own docs advise: symbolized stacks at half -O2 -g's
# compile time, which dominates this build.
sanitizer=$kind
[[ $kind == core ]] && sanitizer=address
cmake -S . -B $dir -G Ninja -DRT_SANITIZE=$sanitizer -DRT_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# 4 ranks where the program's code paths differ from 1-3 (see below).
not_np4="gradient_reducer|agreement|bn_sync|loss_scale|trainer_device|device_grads|fault_.*|device_grads_fail-.*"
# The Python-only tests have no code of ours to check (autoaugment_torchvision's C++ side is
# data/autoaugment, under test in test_data_autoaugment); torch_weights_se is agreement with
# PyTorch, as torch_weights (32 s here). The whole SE networks' finite differences (47 s here,
# last to finish) run the reference backend's gate, which RefGradcheck.ChannelGate and the other
# SeResNet tests reach here.
python_etc="costmodel|gpu_bench_table|doc_table|plot_metrics|bench_torch_gpu|autoaugment_torchvision|torch_weights_se"
python_etc+="|SeResNet.WholeNetworkGradientMatchesFiniteDifferences"
if [[ $kind == core ]]; then
  # These programs link nn/ or comm/ alone (rt_core_tests), so the rest of the tree is not built;
  # the tests of programs not built are not listed under a label.
  cmake --build $dir --target rt_core_tests
  ASAN_OPTIONS=detect_leaks=1 OMP_WAIT_POLICY=passive ctest --test-dir $dir -L unit -j2 --output-on-failure \
    -E "^($python_etc)$" "$@"
  # tests/mpi's programs of rt_core_tests carry the label core (tests/mpi/CMakeLists.txt); the
  # registry's GoogleTest cases (mpi: a singleton MPI) cannot take a second label through
  # gtest_discover_tests, so they go by name.
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir $dir -L core -j2 --output-on-failure \
    -E "_np[58]$|^test_mpi_($not_np4)_np4$" "$@"
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir $dir -R "^(AllreducerRegistry|HierarchicalPlacement)\." --output-on-failure "$@"
  exit
fi
cmake --build $dir
if [[ $kind == address ]]; then
  # Leaks are checked where we own the whole process; OpenMPI's components are dlclose()d at
  # MPI_Finalize, so its init-time allocations show up as unsymbolizable leaks under mpirun.
  # Two at a time, their OpenMP threads sleeping when idle: a process starting and checking its
  # leaks takes a third of a second here, time a second test can use. With spinning threads two
  # processes on two cores took 2-9x as long in the OpenMP-heavy tests; sleeping, the two
  # OpenMP-heaviest pairs took 31 s against 34 s one at a time.
  # Not $python_etc, for the reasons given above.
  ASAN_OPTIONS=detect_leaks=1 OMP_WAIT_POLICY=passive ctest --test-dir $dir -L unit -j2 --output-on-failure \
    -E "^($python_etc)$" "$@"
  # The emulated-cluster smoke test and the GPU bundle's script test exercise scripts and
  # namespaces, not our code: not here. Nor torch_weights, whose point is agreement with PyTorch
  # (the code it reaches, checkpoints, weights files, --weights and --eval, is under test here in
  # trainer_checkpoint, test_mpi_trainer_resume and test_mpi_trainer_cli), and was 110 s of this stage.
  # Nor 5 and 8 ranks: on two cores they add scheduling, not code paths, to 1-3 ranks (one, odd,
  # even; the plain run keeps them), and were a third of this stage's time; 4 ranks only for the
  # allreduce, whose hierarchical form then has nodes of two ranks each.
  # Two at a time: much of these tests is mpirun start-up and waiting (234 s against 265 s).
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir $dir -L mpi -j2 --output-on-failure \
    -E "cluster_smoke|bundle_gpu_deps|torch_weights|_np[58]$|^test_mpi_($not_np4)_np4$" "$@"
else
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tools/tsan.supp"
  ctest --test-dir $dir -L mpi -E "fault|cluster_smoke" --output-on-failure "$@"
  ctest --test-dir $dir -L unit -R "^(data|trainer)_" --output-on-failure "$@"
fi
