#!/usr/bin/env bash
# Builds hk with the CUDA backend here and packs what the GPU machine needs into
# stage/hk-stage.tar.xz: executables under bin/, the non-system shared libraries they load
# under lib/ (found through an $ORIGIN/../lib rpath), the Python peers/reference scripts and
# the case table. The CUDA libraries (cuBLASLt, cuDNN) come from the GPU machine itself.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${HK_DEVICE_BUILD:-$root/build-device}
stage=$root/stage
cd "$root"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHK_ENABLE_CUDA=ON \
  -DHK_BUILD_TESTS=ON -DHK_BUILD_PERF=ON -DHK_ENABLE_MPI=${HK_DEVICE_MPI:-OFF} \
  -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' -DCMAKE_BUILD_WITH_INSTALL_RPATH=OFF >/dev/null
cmake --build "$build" -j"${HK_JOBS:-2}"

rm -rf "$stage" && mkdir -p "$stage/pkg/bin" "$stage/pkg/lib" "$stage/pkg/share"
# Every executable the device script may run.
while IFS= read -r exe; do
  cp "$exe" "$stage/pkg/bin/"
done < <(find "$build/apps" "$build/test" "$build/perf" -maxdepth 3 -type f -executable \
           \( -name 'hk_*' -o -name 'test_*' \) ! -name '*.so' 2>/dev/null)
# Their non-system libraries (the GPU machine has its own libc, libstdc++, CUDA and cuDNN).
for exe in "$stage"/pkg/bin/*; do
  ldd "$exe" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas[^/]*|libcudnn[^/]*|libnvrtc[^/]*)\.so' |
  while IFS= read -r lib; do cp -L "$lib" "$stage/pkg/lib/"; done
cp apps/hk_reference.py perf/peers.py perf/device/summarize.py "$stage/pkg/share/" 2>/dev/null || true
[ -f perf/device/sanitize.sh ] && cp perf/device/sanitize.sh "$stage/pkg/share/"
[ -f perf/device/profile.sh ] && cp perf/device/profile.sh "$stage/pkg/share/"
mkdir -p "$stage/pkg/share/regress" && cp perf/regress/*.py "$stage/pkg/share/regress/"
cp ../shared/spec/cases.csv "$stage/pkg/share/cases.csv"
# The commit the stage was built from (run.sh records it with the regression run).
{ git rev-parse HEAD; [ -n "$(git status --porcelain --untracked-files=no)" ] && echo dirty; } > "$stage/pkg/share/git-hash.txt" 2>/dev/null || true
cp -r data "$stage/pkg/share/data"
tar -C "$stage" -cJf "$stage/hk-stage.tar.xz" pkg
rm -rf "$stage/pkg"
ls -la "$stage"
echo "stage: $(du -sh "$stage/hk-stage.tar.xz" | cut -f1) (carry 'stage' with the device run)"
