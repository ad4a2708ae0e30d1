#!/usr/bin/env bash
# Per-kernel profile of hk's tuned forward for a few cases, with Nsight Compute (ncu), for the
# roofline account of perf/RESULTS.md: which kernels a forward runs, how long each takes, how
# many DRAM bytes it moves and how busy the SMs and memory are.
#
# Usage: perf/device/profile.sh <pkg-bin-dir> <cases.csv> <work-dir> <out-file> [case ...]
#   (default cases: 2 6). For each case: one hk_bench_cuda run without ncu fills a tune cache
#   (the tuned plan is chosen by measurement), then a run under ncu with the same cache makes the
#   same choices without measuring; ncu records the first forward's kernels (the warm-up forward of
#   the cached plan: exactly the plan's kernels, eagerly launched) and the table lists them in
#   launch order. ncu serialises kernels and flushes caches between them, so the sum of the
#   durations is an upper bound of the graph-replayed forward, not its time.
# Environment: HK_PROFILE_KERNELS (kernels to record per case, default 60), NCU (the ncu
#   executable, default PATH then /usr/local/cuda/bin/ncu), HK_PROFILE_STALLS=1: also the issue
#   rate, active warps, tensor-pipe use and the warp stall reasons of each kernel (a second table:
#   the four largest reasons in warp cycles per issued instruction); HK_PROFILE_SOURCE=<kernel regex>
#   (HK_PROFILE_SOURCE_COUNT launches, default 2): per-SASS-instruction counters of those kernels
#   (source-<case>.csv next to the output, an opcode summary in it); HK_PROFILE_MEMORY=1: a table of
#   the memory units' use (L1 / shared, L2, DRAM; shared-memory wavefronts). The tensor column is the
#   mma.sync (HMMA) pipe: sm_90 wgmma kernels (cuBLASLt's nvjet ones) may show little there.
#   HK_PROFILE_SKIP=N: leave out the first N kernel launches (ncu --launch-skip), e.g. the kernels of
#   the first forward, which still writes the packed copy of x that the plan then drops (the pack
#   gather's row then shows the replayed forward's bytes).
set -u
bin=$1 cases=$2 work=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)  # ncu_tables.py lives beside this script
shift 4
list=("$@")
[ ${#list[@]} -eq 0 ] && list=(2 6)
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
mkdir -p "$work"
: > "$out"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread
reasons="long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait barrier lg_throttle not_selected dispatch_stall no_instruction branch_resolving membar drain tex_throttle"
if [ "${HK_PROFILE_STALLS:-0}" = 1 ]; then
  metrics=$metrics,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  for r in $reasons; do metrics=$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
fi
rc_all=0
for c in "${list[@]}"; do
  cache=$work/tune-$c
  mkdir -p "$cache"
  echo "==== case $c" >> "$out"
  "$bin/hk_bench_cuda" --cases "$cases" --only "$c" --tune on --tune-cache "$cache" --reps 20 \
    --benchmark_format=console > "$work/plain-$c.log" 2>&1 || { echo "bench failed (case $c)" >> "$out"; rc_all=1; continue; }
  grep -E "forward/case" "$work/plain-$c.log" | head -2 >> "$out"
  # The first forward of the second engine the bench makes reads the cache; the first engine's
  # first forward reads it too (the cache was filled above): no candidate is measured.
  timeout 300 "$ncu" --clock-control none --target-processes all --launch-skip "${HK_PROFILE_SKIP:-0}" --launch-count "${HK_PROFILE_KERNELS:-60}" \
    --metrics "$metrics" --csv --print-units base \
    "$bin/hk_bench_cuda" --cases "$cases" --only "$c" --tune on --tune-cache "$cache" --reps 1 \
    > "$work/ncu-$c.csv" 2> "$work/ncu-$c.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "ncu exit $rc (case $c): $(tail -3 "$work/ncu-$c.err" | tr '\n' ' ')" >> "$out"
    rc_all=1
  fi
  python3 "$here/ncu_tables.py" kernels "$work/ncu-$c.csv" >> "$out"
  # HK_PROFILE_MEMORY=1: a second ncu pass over the same kernels with the memory units' use: L1 /
  # shared memory, L2 and DRAM throughput (% of peak), the shared-memory wavefronts per SM cycle
  # (the LSU data pipe serves one per cycle) and the bank conflicts among them. Its own pass: a
  # metric this ncu lacks fails that pass only.
  if [ "${HK_PROFILE_MEMORY:-0}" = 1 ]; then
    mem=l1tex__throughput.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.sum
    timeout 300 "$ncu" --clock-control none --target-processes all --launch-skip "${HK_PROFILE_SKIP:-0}" --launch-count "${HK_PROFILE_KERNELS:-60}" \
      --metrics "$mem" --csv --print-units base \
      "$bin/hk_bench_cuda" --cases "$cases" --only "$c" --tune on --tune-cache "$cache" --reps 1 \
      > "$work/ncu-mem-$c.csv" 2> "$work/ncu-mem-$c.err" ||
      echo "ncu memory pass exit $? (case $c): $(tail -3 "$work/ncu-mem-$c.err" | tr '\n' ' ')" >> "$out"
    python3 "$here/ncu_tables.py" memory "$work/ncu-mem-$c.csv" >> "$out"
  fi
  # HK_PROFILE_SOURCE=<kernel-name regex>: the first launch of each kernel the regex names, with
  # ncu's source counters (per SASS instruction: executions and warp-stall samples), exported as
  # CSV next to $out (source-<case>-<n>.csv, the raw rows) and summarised per opcode in $out.
  if [ -n "${HK_PROFILE_SOURCE:-}" ]; then
    rep=$work/src-$c
    rm -f "$rep.ncu-rep"
    timeout 300 "$ncu" --clock-control none --target-processes all --kernel-name "regex:${HK_PROFILE_SOURCE}" \
      --launch-count "${HK_PROFILE_SOURCE_COUNT:-2}" --section SourceCounters --section InstructionStats \
      --section WarpStateStats -o "$rep" \
      "$bin/hk_bench_cuda" --cases "$cases" --only "$c" --tune on --tune-cache "$cache" --reps 1 \
      > "$work/src-$c.log" 2>&1 || echo "ncu source run exit $? (case $c): $(tail -3 "$work/src-$c.log" | tr '\n' ' ')" >> "$out"
    dir=$(dirname "$out")
    "$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$dir/source-$c.csv" 2> "$work/src-$c.err" ||
      echo "ncu --page source failed (case $c): $(tail -2 "$work/src-$c.err" | tr '\n' ' ')" >> "$out"
    "$ncu" --import "$rep.ncu-rep" --page details --print-details all > "$dir/source-$c-details.txt" 2>&1 || true
    python3 - "$dir/source-$c.csv" >> "$out" <<'PY'
import csv, sys, collections
try:
    text = open(sys.argv[1]).read().splitlines()
except OSError:
    sys.exit(0)
# One table per kernel: a header line starting with "Address" or '"Address"' begins each.
tables, cur = [], None
for line in text:
    if line.lstrip('"').startswith("Address") or line.startswith('"#"') or line.startswith('"Source"'):
        cur = [line]
        tables.append(cur)
    elif cur is not None and line.strip():
        cur.append(line)
for ti, t in enumerate(tables):
    rows = list(csv.DictReader(t))
    if not rows:
        continue
    cols = rows[0].keys()
    src = next((k for k in cols if k.strip().lower() == "source"), None)
    ex = next((k for k in cols if "instructions executed" in k.lower() and "predicated" not in k.lower()), None)
    smp = next((k for k in cols if "warp stall sampling (all" in k.lower()), None)
    if src is None or ex is None:
        print("\nsource table %d: columns %s" % (ti, ", ".join(list(cols)[:12])))
        continue
    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0
    by_op = collections.defaultdict(lambda: [0.0, 0.0, 0])
    tot_e = tot_s = 0.0
    for r in rows:
        op = r[src].strip().split(" ")[0]
        if op.startswith("@"):
            op = r[src].strip().split(" ")[1] if len(r[src].split(" ")) > 1 else op
        op = op.split(".")[0]
        e, s_ = num(r[ex]), num(r[smp]) if smp else 0.0
        by_op[op][0] += e; by_op[op][1] += s_; by_op[op][2] += 1
        tot_e += e; tot_s += s_
    print("\nsource table %d: %d SASS instructions, %.3g warp-level instructions executed, %.3g stall samples" %
          (ti, len(rows), tot_e, tot_s))
    print("| opcode | static | executed % | stall samples % |")
    print("|---|---|---|---|")
    for op, (e, s_, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:25]:
        print("| %s | %d | %.1f | %.1f |" % (op, n, 100 * e / max(tot_e, 1), 100 * s_ / max(tot_s, 1)))
PY
  fi
done
exit $rc_all
