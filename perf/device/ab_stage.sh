#!/usr/bin/env bash
# Stages a revision for run.sh's ab_builds phase against another one, in one step:
#   perf/device/ab_stage.sh <base-rev> [<new-rev> [<extra-rev> ...]]
# builds hk_bench_cuda at <base-rev> in the build folder (HK_DEVICE_BUILD, default build-device),
# keeps a copy, builds each <extra-rev> likewise (measured in the same rounds as x_<name>, the name
# from the revision as given, characters outside [A-Za-z0-9_-] as '_'), builds <new-rev> (default:
# the revision checked out now) and runs stage.sh with HK_AB_BASE / HK_AB_EXTRA set to the copies
# (HK_STAGE_SKIP, HK_DEVICE_MPI and the rest pass through). The same build folder serves every
# build, so only the files that differ between them are compiled again. Each extra build adds ~4 MB
# to the archive: skip test programs (HK_STAGE_SKIP) so that tree and stage stay under 64 MiB.
# Needs a clean work tree (it checks revisions out); it returns to the revision it started on,
# also when a build fails. Then, on the GPU machine: HK_AB_CASES="..." perf/device/run.sh ab_builds.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
[ $# -ge 1 ] || { echo "usage: $0 <base-rev> [<new-rev> [<extra-rev> ...]]" >&2; exit 2; }
base_rev=$(git rev-parse --verify "$1^{commit}")
start=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
new_rev=$(git rev-parse --verify "${2:-HEAD}^{commit}")
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "ab_stage: the work tree has changes; commit or stash them first" >&2
  exit 1
fi
build=${HK_DEVICE_BUILD:-$root/build-device}
[ -f "$build/CMakeCache.txt" ] || { echo "ab_stage: no configured build in $build (see stage.sh)" >&2; exit 1; }
base_dir=$(mktemp -d)  # the base (and extra) binaries; stage.sh packs stripped copies, so they go at exit
base_bin=$base_dir/hk_bench_cuda_base
trap 'git checkout -q "$start"; rm -rf "$base_dir"' EXIT

echo "ab_stage: base $(git log --oneline -1 "$base_rev")"
git checkout -q "$base_rev"
cmake --build "$build" -j"$(nproc)" --target hk_bench_cuda
cp "$build/perf/cuda/hk_bench_cuda" "$base_bin"

extra=()
for rev in "${@:3}"; do
  r=$(git rev-parse --verify "$rev^{commit}")
  label=$(printf '%s' "$rev" | tr -c 'A-Za-z0-9_-' '_')
  echo "ab_stage: extra x_$label $(git log --oneline -1 "$r")"
  git checkout -q "$r"
  cmake --build "$build" -j"$(nproc)" --target hk_bench_cuda
  cp "$build/perf/cuda/hk_bench_cuda" "$base_dir/hk_bench_cuda_x_$label"
  extra+=("$label=$base_dir/hk_bench_cuda_x_$label")
done

echo "ab_stage: new $(git log --oneline -1 "$new_rev")"
git checkout -q "$new_rev"
HK_AB_BASE=$base_bin HK_AB_EXTRA="${extra[*]}" HK_DEVICE_BUILD=$build perf/device/stage.sh
echo "ab_stage: staged $(git rev-parse --short "$new_rev") with base $(git rev-parse --short "$base_rev")"
