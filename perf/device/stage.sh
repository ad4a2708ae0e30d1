#!/usr/bin/env bash
# Builds hk with the CUDA backend here and packs what the GPU machine needs into
# stage/hk-stage.tar.xz: executables under bin/, the non-system shared libraries they load
# under lib/ (found through an $ORIGIN/../lib rpath), the Python peers/reference scripts and
# the case table. The CUDA libraries (cuBLASLt, cuDNN) come from the GPU machine itself.
# HK_DEVICE_MPI=ON: an MPI build, and Open MPI's runtime under mpi/ (see pack_mpi_runtime).
# HK_DEVICE_STAGE: the output folder (default stage/). HK_STAGE_SKIP: executables left out.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${HK_DEVICE_BUILD:-$root/build-device}
stage=${HK_DEVICE_STAGE:-$root/stage}
# HK_AB_BASE (see below) may be relative to the caller's directory.
if [ -n "${HK_AB_BASE:-}" ]; then HK_AB_BASE=$(realpath "$HK_AB_BASE"); fi
# HK_AB_EXTRA="label=path ...": more builds for the same A/B (see below); paths as HK_AB_BASE.
ab_extra=()
for e in ${HK_AB_EXTRA:-}; do
  label=${e%%=*}
  [[ "$e" == *=* && "$label" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "stage: HK_AB_EXTRA entries are label=path with a label of [A-Za-z0-9_-]: $e" >&2; exit 2; }
  ab_extra+=("$label=$(realpath "${e#*=}")")
done
cd "$root"

# Open MPI's runtime for a GPU machine that has none (HK_DEVICE_MPI=ON), under pkg/mpi: the
# launcher (orterun, as mpirun and mpiexec), the MCA plugins, help texts and parameter files, PMIx's
# plugins and help texts, and env.sh, which moves the install directories compiled into the
# libraries (Debian's) there through the OPAL_* / PMIX_* overrides. Their libraries join pkg/lib.
# Plugins for fabrics one node does not use (UCX, libfabric, verbs, PSM, netlink) and the
# OpenSHMEM ones stay behind with their libraries: the package stays small, and nothing is left
# that fails to load there.
pack_mpi_runtime() {
  local pkg=$1 mpi=$1/mpi f
  local plugins datadir sysconf pmix_lib missing
  command -v orterun >/dev/null && command -v ompi_info >/dev/null ||
    { echo "stage: HK_DEVICE_MPI=ON needs Open MPI here (openmpi-bin)" >&2; return 1; }
  ompi_path() { ompi_info --path "$1" --parsable | cut -d: -f3-; }
  plugins=$(ompi_path pkglibdir) datadir=$(ompi_path pkgdatadir) sysconf=$(ompi_path sysconfdir)
  pmix_lib=$(ldd "$plugins/mca_pmix_ext3x.so" | awk '/libpmix\.so/{print $3}')
  pmix_lib=$(dirname "$(readlink -f "$pmix_lib")")
  mkdir -p "$mpi/bin" "$mpi/lib/openmpi3" "$mpi/share" "$mpi/etc" "$mpi/pmix/lib/pmix" "$mpi/pmix/share" "$mpi/hwloc"
  cp "$(readlink -f "$(command -v orterun)")" "$mpi/bin/orterun"
  ln -s orterun "$mpi/bin/mpirun" && ln -s orterun "$mpi/bin/mpiexec"
  cp "$(readlink -f "$(command -v orted)")" "$(readlink -f "$(command -v ompi_info)")" "$mpi/bin/"
  for f in "$plugins"/*.so; do
    case ${f##*/} in
      *_ucx.so | *_ofi.so | *_openib.so | *_psm.so | *_psm2.so | *_netlink.so) ;;
      mca_atomic_* | mca_memheap_* | mca_scoll_* | mca_spml_* | mca_sshmem_*) ;;
      *) cp "$f" "$mpi/lib/openmpi3/" ;;
    esac
  done
  # Help texts and parameter sets (not the compiler wrappers' data: no compiler travels).
  mkdir -p "$mpi/share/openmpi" && cp -r "$datadir"/help-*.txt "$datadir"/amca-param-sets "$mpi/share/openmpi/"
  cp "$sysconf"/openmpi-mca-params.conf "$sysconf"/openmpi-default-hostfile "$mpi/etc/"
  cp "$pmix_lib"/pmix/*.so "$mpi/pmix/lib/pmix/"
  cp -r "$pmix_lib/../share/pmix" "$mpi/pmix/share/pmix"
  # Libraries of all of it not yet in pkg/lib (libpmix, libmunge, libmca_common_*, ...).
  for f in "$mpi"/bin/orterun "$mpi"/bin/orted "$mpi"/bin/ompi_info "$mpi"/lib/openmpi3/*.so "$mpi"/pmix/lib/pmix/*.so; do
    ldd "$f" | awk '/=> \//{print $3}'
  done | sort -u | grep -Ev "$system_libs" | while IFS= read -r f; do
    [ -e "$pkg/lib/${f##*/}" ] || cp -L "$f" "$pkg/lib/"
  done
  missing=$(ldd "$mpi"/bin/* "$mpi"/lib/openmpi3/*.so "$mpi"/pmix/lib/pmix/*.so 2>/dev/null | grep 'not found' || true)
  [ -z "$missing" ] || { echo "stage: unresolved libraries in the MPI runtime: $missing" >&2; return 1; }
  cat > "$mpi/env.sh" <<'ENV'
# Open MPI from the hk stage (perf/device/stage.sh, HK_DEVICE_MPI=ON). Source it from bash (or set
# HK_MPI_HOME to this folder first); then mpirun runs hk's MPI build on a machine with no Open MPI.
hk_mpi=${HK_MPI_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
hk_pkg=$(dirname "$hk_mpi")
# The libraries carry Debian's install directories; these move every one of them here.
export OPAL_PREFIX=$hk_mpi OPAL_EXEC_PREFIX=$hk_mpi OPAL_BINDIR=$hk_mpi/bin OPAL_SBINDIR=$hk_mpi/bin
export OPAL_LIBEXECDIR=$hk_mpi/bin OPAL_LIBDIR=$hk_pkg/lib OPAL_PKGLIBDIR=$hk_mpi/lib/openmpi3
export OPAL_DATAROOTDIR=$hk_mpi/share OPAL_DATADIR=$hk_mpi/share OPAL_PKGDATADIR=$hk_mpi/share/openmpi
export OPAL_SYSCONFDIR=$hk_mpi/etc
export OMPI_MCA_mca_base_component_path=$hk_mpi/lib/openmpi3
export PMIX_PREFIX=$hk_mpi/pmix PMIX_EXEC_PREFIX=$hk_mpi/pmix PMIX_BINDIR=$hk_mpi/bin PMIX_LIBDIR=$hk_pkg/lib
export PMIX_PKGLIBDIR=$hk_mpi/pmix/lib/pmix PMIX_DATAROOTDIR=$hk_mpi/pmix/share PMIX_DATADIR=$hk_mpi/pmix/share
export PMIX_PKGDATADIR=$hk_mpi/pmix/share/pmix PMIX_SYSCONFDIR=$hk_mpi/pmix/share
export PMIX_MCA_mca_base_component_path=$hk_mpi/pmix/lib/pmix
# hwloc's own plugins (PCI, OpenCL, ...) stay behind; an empty folder gives the same topology
# discovery everywhere.
export HWLOC_PLUGINS_PATH=$hk_mpi/hwloc
# One node, no ssh there: the isolated launcher starts the ranks itself. Commands run as root.
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PATH=$hk_mpi/bin:$hk_pkg/bin${PATH:+:$PATH}
export LD_LIBRARY_PATH=$hk_pkg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset hk_mpi hk_pkg
ENV
  echo "stage: Open MPI runtime $(du -sh "$mpi" | cut -f1) under pkg/mpi (source mpi/env.sh)"
}

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHK_ENABLE_CUDA=ON \
  -DHK_BUILD_TESTS=ON -DHK_BUILD_PERF=ON -DHK_ENABLE_MPI=${HK_DEVICE_MPI:-OFF} \
  -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' -DCMAKE_BUILD_WITH_INSTALL_RPATH=OFF >/dev/null
cmake --build "$build" -j"${HK_JOBS:-2}"

rm -rf "$stage" && mkdir -p "$stage/pkg/bin" "$stage/pkg/lib" "$stage/pkg/share"
# Every executable the device script may run, less those named in HK_STAGE_SKIP (space-separated
# names, e.g. the host-only test programs, when the stage would not fit a device call's 64 MiB).
while IFS= read -r exe; do
  [[ " ${HK_STAGE_SKIP:-} " == *" ${exe##*/} "* ]] && continue
  cp "$exe" "$stage/pkg/bin/"
done < <(find "$build/apps" "$build/test" "$build/perf" -maxdepth 3 -type f -executable \
           \( -name 'hk_*' -o -name 'test_*' \) ! -name '*.so' 2>/dev/null)
# Their non-system libraries (the GPU machine has its own libc, libstdc++, CUDA and cuDNN).
system_libs='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas[^/]*|libcudnn[^/]*|libnvrtc[^/]*)\.so'
for exe in "$stage"/pkg/bin/*; do
  ldd "$exe" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | grep -Ev "$system_libs" |
  while IFS= read -r lib; do cp -L "$lib" "$stage/pkg/lib/"; done
# CUPTI for hk_bench_cuda --timeline: loaded at run time (so ldd does not list it), the toolkit's own.
if [ -x "$stage/pkg/bin/hk_bench_cuda" ]; then
  cupti=$(ls /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 2>/dev/null | head -1 || true)
  [ -n "$cupti" ] && cp -L "$cupti" "$stage/pkg/lib/"
fi
cp apps/hk_reference.py perf/peers.py perf/device/summarize.py "$stage/pkg/share/" 2>/dev/null || true
[ -f perf/device/sanitize.sh ] && cp perf/device/sanitize.sh "$stage/pkg/share/"
[ -f perf/device/profile.sh ] && cp perf/device/profile.sh perf/device/ncu_tables.py "$stage/pkg/share/"
mkdir -p "$stage/pkg/share/regress/baselines" && cp perf/regress/*.py "$stage/pkg/share/regress/" &&
  cp perf/regress/baselines/*.json "$stage/pkg/share/regress/baselines/" 2>/dev/null || true
cp ../shared/spec/cases.csv "$stage/pkg/share/cases.csv"
# The commit the stage was built from (run.sh records it with the regression run).
{ git rev-parse HEAD; [ -n "$(git status --porcelain --untracked-files=no)" ] && echo dirty; } > "$stage/pkg/share/git-hash.txt" 2>/dev/null || true
cp -r data "$stage/pkg/share/data"
if [ "${HK_DEVICE_MPI:-OFF}" = ON ]; then pack_mpi_runtime "$stage/pkg"; fi
# HK_AB_BASE=path/to/an/earlier/hk_bench_cuda: carried (stripped, xz) for run.sh's ab_builds phase,
# a same-run A/B of two builds where no knob switches the change.
if [ -n "${HK_AB_BASE:-}" ]; then
  strip -o "$stage/pkg/bin/hk_bench_cuda_base" "$HK_AB_BASE"
fi
# HK_AB_EXTRA: further builds measured in the same rounds, as hk_bench_cuda_x_<label> (~4 MB each
# in the archive: leave test programs out with HK_STAGE_SKIP to keep the carried tree under 64 MiB).
for e in ${ab_extra[@]+"${ab_extra[@]}"}; do
  strip -o "$stage/pkg/bin/hk_bench_cuda_x_${e%%=*}" "${e#*=}"
done
tar -C "$stage" -cJf "$stage/hk-stage.tar.xz" pkg
rm -rf "$stage/pkg"
ls -la "$stage"
echo "stage: $(du -sh "$stage/hk-stage.tar.xz" | cut -f1) (carry 'stage' with the device run)"
