#!/usr/bin/env bash
# One kernel launch of a standalone GPU test program under Nsight Compute (full section set, source
# counters), for kernels the tuned forward does not pick (so perf/device/profile.sh never sees them).
#
# Usage: perf/device/profile_test.sh <pkg-bin-dir> <out-dir> <tag> <kernel regex> <launch skip> <program> [args]
#   The program's environment narrows what it runs (e.g. HK_TEST_TIMING_ONLY=1 HK_TEST_TIMING_CASE=6
#   HK_TEST_TIMING_MAP='q1h2b1]' for test_qkv_attention_fused). Writes <tag>.ncu-rep, <tag>-details.txt
#   (every section's table), <tag>-source.csv (per SASS instruction) and <tag>-ops.md (per opcode:
#   executed share and warp-stall sample share), and appends one line per step to <out-dir>/profile-test.log.
set -u
bin=$1 out=$2 tag=$3 regex=$4 skip=$5
shift 5
prog=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
mkdir -p "$out"
log=$out/profile-test.log
rep=$out/$tag
rm -f "$rep.ncu-rep"
timeout "${HK_PROFILE_TIMEOUT:-240}" "$ncu" --clock-control none --kernel-name "regex:$regex" --launch-skip "$skip" \
  --launch-count 1 --set full --import-source no -o "$rep" "$bin/$prog" "$@" > "$out/$tag-run.log" 2>&1
echo "$tag: ncu exit $? ($prog, kernel /$regex/, skip $skip)" >> "$log"
[ -f "$rep.ncu-rep" ] || exit 1
"$ncu" --import "$rep.ncu-rep" --page details --print-details all > "$out/$tag-details.txt" 2>&1
"$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$out/$tag-source.csv" 2> "$out/$tag-source.err"
python3 "$here/ncu_source_summary.py" "$out/$tag-source.csv" > "$out/$tag-ops.md" 2>&1 ||
  echo "$tag: no opcode summary" >> "$log"
echo "$tag: done" >> "$log"
