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
#   the four largest reasons in warp cycles per issued instruction). The tensor column is the
#   mma.sync (HMMA) pipe: sm_90 wgmma kernels (cuBLASLt's nvjet ones) may show little there.
set -u
bin=$1 cases=$2 work=$3 out=$4
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
  timeout 300 "$ncu" --clock-control none --target-processes all --launch-count "${HK_PROFILE_KERNELS:-60}" \
    --metrics "$metrics" --csv --print-units base \
    "$bin/hk_bench_cuda" --cases "$cases" --only "$c" --tune on --tune-cache "$cache" --reps 1 \
    > "$work/ncu-$c.csv" 2> "$work/ncu-$c.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "ncu exit $rc (case $c): $(tail -3 "$work/ncu-$c.err" | tr '\n' ' ')" >> "$out"
    rc_all=1
  fi
  python3 - "$work/ncu-$c.csv" >> "$out" <<'PY'
import csv, sys
rows = {}
order = []
text = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
if start is None:
    print("no ncu rows"); sys.exit(0)
for r in csv.DictReader(text[start:]):
    key = r["ID"]
    if key not in rows:
        rows[key] = {"name": r.get("Kernel Name", "?")}
        order.append(key)
    try:
        rows[key][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        rows[key][r["Metric Name"]] = r["Metric Value"]
print("| # | kernel | us | DRAM MB | SM % | mem % | grid | regs |")
print("|---|---|---|---|---|---|---|---|")
total = 0.0
for k in order:
    d = rows[k]
    t = d.get("gpu__time_duration.sum", 0.0) / 1e3
    total += t
    mb = (d.get("dram__bytes_read.sum", 0.0) + d.get("dram__bytes_write.sum", 0.0)) / 1e6
    name = d["name"]
    name = name if len(name) < 70 else name[:67] + "..."
    print("| %s | %s | %.2f | %.2f | %.0f | %.0f | %s | %s |" % (
        k, name, t, mb, d.get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.0),
        d.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", 0.0),
        int(d.get("launch__grid_size", 0) or 0), int(d.get("launch__registers_per_thread", 0) or 0)))
print("\nsum of recorded kernel durations: %.1f us (%d kernels)" % (total, len(order)))
stall = "smsp__average_warps_issue_stalled_"
if any(m.startswith(stall) for d in rows.values() for m in d):
    print("\n| # | kernel | issue % | warps active % | HMMA pipe % | largest stalls (warp cycles per issued instruction) |")
    print("|---|---|---|---|---|---|")
    for k in order:
        d = rows[k]
        st = sorted(((v, m[len(stall):].replace("_per_issue_active.ratio", "")) for m, v in d.items()
                     if m.startswith(stall) and isinstance(v, float)), reverse=True)[:4]
        name = d["name"] if len(d["name"]) < 50 else d["name"][:47] + "..."
        def pct(m):  # a metric ncu reports as text (n/a) prints as it is
            v = d.get(m, "-")
            return "%.0f" % v if isinstance(v, float) else str(v)
        print("| %s | %s | %s | %s | %s | %s |" % (
            k, name, pct("smsp__issue_active.avg.pct_of_peak_sustained_active"),
            pct("sm__warps_active.avg.pct_of_peak_sustained_active"),
            pct("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
            ", ".join("%s %.1f" % (n, v) for v, n in st)))
PY
done
exit $rc_all
