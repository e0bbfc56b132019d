#!/usr/bin/env bash
# Gathers into .gpu-deps/ (git-ignored; carried to a GPU machine beside the tree) what
# tools/gpu_check.sh needs there beyond the CUDA toolkit, CMake, ninja and Python, none of which
# can be installed on such a machine:
#   googletest/  GoogleTest's source (Debian's googletest package), built there for the GPU tests;
#   openmpi/     a relocatable Open MPI (Debian 12's, with its PMIx, hwloc and libevent): the
#                headers and libraries the GPU build's comm/ links, and mpirun for the tests that
#                run the ring allreduce on device buffers under `mpirun -np 2`;
#   yaml-cpp/    yaml-cpp (headers, library, CMake package), for trainer_cuda's configuration.
# All come from this machine's packages (tools/setup.sh installs them). Open MPI is copied into
# the layout its install prefix implies, so that OPAL_PREFIX (and PMIX_PREFIX) relocate it
# whole; openmpi/env.sh sets those, PATH and LD_LIBRARY_PATH. Components whose libraries are not
# in the bundle (InfiniBand, libfabric, UCX) are left out: single-node runs use shared memory.
#
#   tools/bundle_gpu_deps.sh [dest]     (default .gpu-deps; about 19 MiB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.gpu-deps}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
sys=/usr/lib/$multiarch
die() { echo "bundle_gpu_deps: $*" >&2; exit 1; }

[ -f /usr/src/googletest/CMakeLists.txt ] || die "no /usr/src/googletest (apt-get install googletest)"
command -v ompi_info >/dev/null || die "no Open MPI here (tools/setup.sh installs it)"
[ "$(ompi_info --parsable --path prefix | cut -d: -f3)" = /usr ] || die "expected Debian's Open MPI (prefix /usr)"
ompi_lib=$(ompi_info --parsable --path libdir | cut -d: -f3)       # .../openmpi/lib
ompi_pkglib=$(ompi_info --parsable --path pkglibdir | cut -d: -f3) # .../openmpi/lib/openmpi3
ompi_inc=$(ompi_info --parsable --path incdir | cut -d: -f3)
ompi_data=$(ompi_info --parsable --path pkgdatadir | cut -d: -f3)  # /usr/share/openmpi
pmix=$sys/pmix2
[ -f "$pmix/lib/libpmix.so.2" ] || die "no PMIx at $pmix (Debian's libpmix2)"
[ -f "$sys/cmake/yaml-cpp/yaml-cpp-config.cmake" ] || die "no yaml-cpp CMake package (libyaml-cpp-dev)"

mkdir -p "$dest"
rm -rf "$dest/googletest" "$dest/openmpi" "$dest/yaml-cpp"
cp -r /usr/src/googletest "$dest/googletest"
# yaml-cpp's CMake package finds its files relative to itself: the /usr layout, moved.
y=$dest/yaml-cpp
mkdir -p "$y/include" "$y/lib/$multiarch/cmake"
cp -r /usr/include/yaml-cpp "$y/include/"
cp -r "$sys/cmake/yaml-cpp" "$y/lib/$multiarch/cmake/"
cp -a "$sys"/libyaml-cpp.so* "$y/lib/$multiarch/"

p=$dest/openmpi  # stands for /usr
at() { echo "$p${1#/usr}"; }
for d in "$p/bin" "$(at "$ompi_lib")" "$(at "$ompi_pkglib")" "$(at "$ompi_inc")" "$(at "$ompi_data")" \
         "$(at "$pmix")"; do
  mkdir -p "$(dirname "$d")"
done
mkdir -p "$p/bin" "$(at "$ompi_pkglib")"
# The launcher and the compiler wrapper (mpicxx reads share/openmpi/*-wrapper-data.txt).
cp -L /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper /usr/bin/ompi_info "$p/bin/"
for l in mpirun mpiexec; do ln -sf orterun "$p/bin/$l"; done
for l in mpicc mpicxx mpic++; do ln -sf opal_wrapper "$p/bin/$l"; done
cp -rL "$ompi_inc" "$(at "$ompi_inc")"
cp -r "$ompi_data" "$(at "$ompi_data")"
cp -r "$pmix" "$(at "$pmix")"
rm -rf "$(at "$pmix")/include" "$(at "$pmix")/lib/libpmix.a"
# Shared libraries into the wrapper's libdir: libmpi.so there is what `mpicxx -lmpi` links.
libs=(libmpi.so.40 libopen-pal.so.40 libopen-rte.so.40 libhwloc.so.15 libevent_core-2.1.so.7
      libevent_pthreads-2.1.so.7 libudev.so.1 libz.so.1 libmca_common_sm.so.40
      libmpi_cxx.so.40 libmunge.so.2)
for l in "${libs[@]}"; do
  f=$(readlink -f "$sys/$l") || die "no $sys/$l"
  cp "$f" "$(at "$ompi_lib")/$l"
done
ln -sf libmpi.so.40 "$(at "$ompi_lib")/libmpi.so"
ln -sf libmpi_cxx.so.40 "$(at "$ompi_lib")/libmpi_cxx.so"
ln -sf ../../pmix2/lib/libpmix.so.2 "$(at "$ompi_lib")/libpmix.so.2"
# Components: only those whose libraries are all in the bundle or the C runtime.
have=" ${libs[*]} libpmix.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2 linux-vdso.so.1 "
kept=0 dropped=()
for c in "$ompi_pkglib"/*.so; do
  ok=1
  for need in $(objdump -p "$c" | awk '/NEEDED/ {print $2}'); do
    [[ $have == *" $need "* ]] || { ok=0; break; }
  done
  if [ $ok = 1 ]; then cp "$c" "$(at "$ompi_pkglib")/"; kept=$((kept + 1)); else dropped+=("$(basename "$c" .so)"); fi
done

# Whatever the bundle runs must find every library it needs in the bundle or in the C and C++
# runtimes every machine has (Debian's libpmix needs libmunge, for one).
base=" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2 libstdc++.so.6 libgcc_s.so.1 "
bundled=" $(find "$p" -name '*.so*' -printf '%f ') "
missing=$(find "$p" -type f \( -name '*.so*' -o -path "$p/bin/*" \) -exec objdump -p {} + 2>/dev/null |
          awk '/NEEDED/ {print $2}' | sort -u | while read -r n; do
            [[ $base$bundled == *" $n "* ]] || echo "$n"; done)
[ -z "$missing" ] || die "bundled Open MPI needs libraries left out of it: $(echo $missing)"

cat >"$p/env.sh" <<'EOF'
# Source to use this bundled Open MPI: it relocates from /usr to this folder.
_rt_mpi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$_rt_mpi
# Debian's PMIx keeps absolute paths: each one it needs is named.
_rt_pmix=$_rt_mpi/lib/MULTIARCH/pmix2
export PMIX_PREFIX=$_rt_pmix PMIX_LIBDIR=$_rt_pmix/lib PMIX_PKGLIBDIR=$_rt_pmix/lib/pmix
export PMIX_DATADIR=$_rt_pmix/share PMIX_PKGDATADIR=$_rt_pmix/share/pmix
export PATH=$_rt_mpi/bin:$PATH
export LD_LIBRARY_PATH=$_rt_mpi/lib/MULTIARCH/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Components left out of the bundle are not looked for; shared memory and TCP carry the messages.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_mca_base_component_show_load_errors=0
# Containers (GPU machines often are one) commonly forbid reading another process's memory, which
# shared memory's single-copy path needs: copy through the shared segment instead.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
unset _rt_mpi _rt_pmix
EOF
sed -i "s|MULTIARCH|$multiarch|g" "$p/env.sh"
echo "bundle_gpu_deps: $dest: googletest, yaml-cpp, Open MPI $(ompi_info --version | head -1 | grep -oE "[0-9.]+$") " \
     "($kept components; left out: ${dropped[*]:-none}); $(du -sh "$dest" | cut -f1)"
