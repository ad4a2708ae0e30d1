#!/usr/bin/env bash
# The device script: on the GPU machine, in one call, runs the GPU tests, the sanitizers, the
# accuracy check against the PyTorch reference and the benchmarks (hk and the PyTorch peers in
# the same run), and leaves its results in $OUT/results.tgz (plus summary.md and status.txt):
#   env.txt          device, driver, library versions, measured copy bandwidth and GEMM rate
#   tests.log        GPU test programs, one section each
#   sanitizer.log    compute-sanitizer memcheck / racecheck / initcheck / synccheck (sanitize.sh)
#   accuracy.log     hk_forward vs the float64 PyTorch reference per case (HK_ACCURACY_CASES: a subset)
#   bench_hk.json    Google Benchmark JSON of hk's forward per case, tuned with a fresh tune cache (random
#                    lengths; HK_BENCH_ARGS="--tune both" adds the untuned engine, default "--tune on")
#   plans.txt        each benchmarked case's plan as it ran (kernels, GEMM algorithms, decisions with times)
#   bench_full.json  the same, tuned, every sequence at full length (phase bench_full); its plans in
#                    plans_full.txt
#   bench_nopack.json  tuned with HK_PACK=0: the dense plans, for the padding-free gain (phase bench_nopack)
#   bench_nopdl.json   tuned with HK_PDL=0: ordinary launches, for the programmatic-launch gain (phase bench_nopdl)
#   ab.txt           phase ab: one knob's values side by side on chosen cases (HK_AB, HK_AB_CASES)
#   ab_builds.txt    phase ab_builds: the staged hk_bench_cuda against an earlier build carried by stage.sh
#                    (HK_AB_BASE) and any further ones (HK_AB_EXTRA, columns x_<label>), alternating, three
#                    rounds, fresh tune caches, on the cases of HK_AB_CASES
#                    (HK_AB_ARGS: more hk_bench_cuda arguments for both builds, e.g. "--lengths full")
#   timeline.md      phase timeline: per case the kernels of the replayed forward as the GPU ran them (CUPTI
#                    activity records: duration, start, end, the time each adds to the span), tuned, random
#                    lengths (HK_TIMELINE_CASES, default all; HK_TIMELINE_ARGS e.g. "--lengths full")
#   bench_qkvlt.json   tuned with HK_QKV_GEMM=cublaslt: the QKV projection on cuBLASLt only, for the own
#                      kernel's gain (phase bench_qkvlt)
#   e2e.txt          case 6 file in, file out: hk_forward vs hk_io_baseline (read + write only), PASS/FAIL vs 1.3x;
#                    HK_E2E_ALT_ENV="VAR=value ...;VAR=value ..." adds variants of hk_forward to the same loop
#                    (each with its own median)
#   lt-search.txt    phase lt_search: cuBLASLt configurations beyond the heuristic's, timed per GEMM (hk_lt_search)
#   multigpu.txt     phase multigpu: scaling over the GPUs under mpirun, bit identity (multi_gpu.sh)
#   peers.json       PyTorch peers (eager fp32, compiled) per case
#   regress/         perf/regress run JSON (device identity, build, date) + the per-case plot
#   summary.md       the tables for perf/RESULTS.md
# Usage: perf/device/run.sh [phase ...]   phases: env tests sanitize accuracy bench bench_full
#        bench_nopack bench_nopdl bench_qkvlt ab ab_builds timeline lt_search e2e profile peers regress summary (default:
#        all but profile, ab, ab_builds, timeline and lt_search; always run in this order). profile: ncu per-kernel tables (perf/device/profile.sh; HK_PROFILE_CASES;
#        HK_PROFILE_SOURCE=<kernel regex>: per-SASS-instruction counters, source-<case>.csv).
#        multigpu (not in the default list; runs after profile): a stage with HK_DEVICE_MPI=ON,
#        perf/device/multi_gpu.sh (HK_MGPU_* knobs).
#        Needs stage/hk-stage.tar.xz from perf/device/stage.sh (carry 'stage').
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
FINAL=${OUT:-/tmp/hk-out}
mkdir -p "$FINAL"
OUT=/tmp/hk-results  # everything lands here first; packed into $FINAL/results.tgz at the end
# A fresh result folder per call, unless HK_KEEP_RESULTS=1: then a call on a machine still warm
# from the previous one adds to its results (e.g. the peers and the summary after the benchmarks).
[ "${HK_KEEP_RESULTS:-0}" = 1 ] || rm -rf "$OUT"
mkdir -p "$OUT"
pkg=/tmp/hk-pkg
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(env tests sanitize accuracy bench bench_full bench_nopack bench_nopdl bench_qkvlt e2e peers regress summary)
want() { local p; for p in "${phases[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
t0=$(date +%s)
# Packs what is there so far, so a run stopped at its time limit still returns its results.
checkpoint() { tar -C "$OUT" -czf "$FINAL/results.tgz" . 2>/dev/null; }
stamp() { checkpoint; echo "[$(( $(date +%s) - t0 ))s] $*"; }

if [ ! -d "$pkg/bin" ]; then
  mkdir -p /tmp/hk-unpack && tar -xJf "$root/stage/hk-stage.tar.xz" -C /tmp/hk-unpack && mv /tmp/hk-unpack/pkg "$pkg"
fi
export PATH="$pkg/bin:$PATH"
export LD_LIBRARY_PATH="$pkg/lib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
share=$pkg/share
work=/tmp/hk-work && mkdir -p "$work"
declare -A status

if want env; then
  stamp "env"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    nvcc --version 2>/dev/null | tail -1
    ldconfig -p | grep -E 'libcudnn\.so|libcublasLt\.so' || true
    python3 - <<'PY'
import torch, time
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
d = torch.device("cuda")
a = torch.empty(2 * 1024**3 // 4, dtype=torch.float32, device=d); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(True), torch.cuda.Event(True); torch.cuda.synchronize()
ts = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); print("copy_bandwidth_TBps %.3f" % (2 * a.numel() * 4 / (ts[5] * 1e-3) / 1e12))
del a, b
n = 8192
x = torch.randn(n, n, device=d, dtype=torch.float16); y = torch.randn(n, n, device=d, dtype=torch.float16)
for _ in range(3): x @ y
torch.cuda.synchronize(); ts = []
for _ in range(10):
    s.record(); x @ y; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); print("gemm_fp16_TFLOPs %.1f" % (2 * n**3 / (ts[5] * 1e-3) / 1e12))
PY
    for exe in "$pkg"/bin/*; do
      missing=$(ldd "$exe" 2>/dev/null | grep 'not found')
      [ -n "$missing" ] && echo "MISSING LIBS for $(basename "$exe"): $missing"
    done
    ldd "$pkg/bin/hk_forward" 2>/dev/null | grep -E 'cudnn|cublas|hdf5|kokkos'
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
fi

if want tests; then
  stamp "tests"
  : > "$OUT/tests.log"
  # HK_TESTS="test_a test_b": run only these programs (default: every GPU test and the goldens).
  if [ -z "${HK_TESTS:-}" ] || [[ " $HK_TESTS " == *" hk_golden_test "* ]]; then
    # The goldens through the CUDA engine (the data directory travels in the package).
    echo "=== hk_golden_test cuda" >> "$OUT/tests.log"
    HK_DATA_DIR="$share/data" timeout 200 hk_golden_test cuda >> "$OUT/tests.log" 2>&1
    status[golden_cuda]=$?
    stamp "  golden cuda rc=${status[golden_cuda]}"
  fi
  for t in "$pkg"/bin/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    case $name in test_tune) continue;; esac  # host-only (runs cmake); CI runs it
    if [ -n "${HK_TESTS:-}" ] && [[ " $HK_TESTS " != *" $name "* ]]; then continue; fi
    echo "=== $name" >> "$OUT/tests.log"
    s=$(date +%s)
    # Per-program limit (HK_TEST_TIMEOUT overrides all): test_post_attn_fused checks ~1000 chain
    # configurations against float64 references on the host (225 s on the H200 machine with
    # HK_TEST_NO_TIMING=1, more with its timing table).
    case $name in
      test_post_attn_fused) limit=${HK_TEST_TIMEOUT:-420} ;;
      *) limit=${HK_TEST_TIMEOUT:-200} ;;
    esac
    (cd "$share" && timeout "$limit" "$t") >> "$OUT/tests.log" 2>&1
    rc=$?
    status[$name]=$rc
    echo "=== $name rc=$rc ($(( $(date +%s) - s ))s)" >> "$OUT/tests.log"
    stamp "  $name rc=$rc"
  done
fi

if want sanitize && [ -x "$share/sanitize.sh" ]; then
  stamp "sanitize (sanitize.sh)"
  HK_SAN_BUDGET=${HK_SAN_BUDGET:-360} "$share/sanitize.sh" "$pkg/bin" "$work/san" "$OUT/sanitizer.log" 2>&1 | tail -30
  status[sanitize]=${PIPESTATUS[0]}
fi

if want accuracy; then
  stamp "accuracy"
  : > "$OUT/accuracy.log"
  # Every case of cases.csv at full size except the very large ones (batch scaled down so the
  # float64 PyTorch reference stays quick), fast and fp32 precision.
  # HK_ACCURACY_CASES="11 12 13": only those cases (default: all).
  while IFS=, read -r c B S D H F L causal note; do
    [ "$c" = case ] && continue
    if [ -n "${HK_ACCURACY_CASES:-}" ] && [[ " $HK_ACCURACY_CASES " != *" $c "* ]]; then continue; fi
    nb=$B
    [ $(( B * S )) -gt 16384 ] && nb=$(( 16384 / S ))
    [ "$nb" -lt 1 ] && nb=1
    hk_generate --cases "$share/cases.csv" --case "$c" --batch "$nb" --seed $((100 + c)) --output "$work/acc$c.h5" >> "$OUT/accuracy.log" 2>&1
    python3 "$share/hk_reference.py" --input "$work/acc$c.h5" --output "$work/ref$c.h5" --device cuda >> "$OUT/accuracy.log" 2>&1
    # fast: what hk_forward picks for this (short) file -- its own kernels only where they cover
    # the model (HK_LIBRARIES=auto); fast-libs: the same with cuBLASLt routes allowed (what a long
    # job or the Engine API without a job size runs); fast-pieces: each chunk computed in pieces
    # of 7 sequences (--engine-batch: what a GPU with little free memory gets), a tail included.
    for v in fast fast-libs fast-pieces fp32; do
      prec=${v%-*}
      libs=auto; [ $v = fast-libs ] && libs=all
      pieces=(); [ $v = fast-pieces ] && pieces=(--engine-batch 7)
      HK_LIBRARIES=$libs hk_forward --backend cuda --precision $prec "${pieces[@]}" --input "$work/acc$c.h5" --output "$work/out$c-$v.h5" --quiet >> "$OUT/accuracy.log" 2>&1
      extra=""; [ $prec = fp32 ] && extra="--atol 1e-4 --rtol 0"
      echo "--- case $c (B=$nb) $v" >> "$OUT/accuracy.log"
      python3 "$share/hk_reference.py" --compare "$work/out$c-$v.h5" --reference "$work/ref$c.h5" $extra >> "$OUT/accuracy.log" 2>&1
      rc=$?
      status["accuracy-case$c-$v"]=$rc
    done
    # Programmatic dependent launch (HK_PDL) changes when kernels start, never what they compute:
    # the same plan (decisions from one tune cache) with and without it must give the same bits.
    for pdl in 1 0; do
      HK_PDL=$pdl HK_TUNE_CACHE="$work/tune-pdl" hk_forward --backend cuda --input "$work/acc$c.h5" \
        --output "$work/out$c-pdl$pdl.h5" --quiet >> "$OUT/accuracy.log" 2>&1
    done
    if cmp -s "$work/out$c-pdl1.h5" "$work/out$c-pdl0.h5"; then
      echo "--- case $c HK_PDL=1 vs HK_PDL=0: identical bits PASS" >> "$OUT/accuracy.log"
      status["pdl-identity-case$c"]=0
    else
      echo "--- case $c HK_PDL=1 vs HK_PDL=0: outputs differ FAIL" >> "$OUT/accuracy.log"
      status["pdl-identity-case$c"]=1
    fi
    stamp "  case $c"
  done < "$share/cases.csv"
fi

# The timed phases need the GPU to themselves: a process left on it (a sanitizer's target stopped
# at its limit) would time-slice with every benchmark. Such a process of this package is ended;
# anything else is named in the status, so the numbers of this call are known to be shared.
gpu_alone() {
  local apps
  apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null)
  [ -z "$apps" ] && return 0
  echo "$apps" | while IFS=', ' read -r pid name; do
    case $name in *hk_*|*compute-sanitizer*|*/tmp/hk-pkg/*) kill -KILL "$pid" 2>/dev/null ;; esac
  done
  sleep 2
  stamp "GPU not idle before the timed phases: $(echo "$apps" | tr '\n' ';')"
  apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null)
  if [ -n "$apps" ]; then
    echo "other processes on the GPU during the timed phases: $apps" >> "$OUT/gpu-shared.txt"
    status[gpu_alone]=1
  fi
}
for p in bench bench_full bench_nopack bench_nopdl bench_qkvlt ab ab_builds timeline lt_search e2e peers; do
  want "$p" && { gpu_alone; break; }
done

if want bench; then
  stamp "bench"
  if [ -x "$pkg/bin/hk_bench_cuda" ]; then
    (cd "$share" && hk_bench_cuda --benchmark_format=console --benchmark_out="$OUT/bench_hk.json" \
       --benchmark_out_format=json --plans "$OUT/plans.txt" ${HK_BENCH_ARGS:---tune on}) 2>&1 | tail -40
  else
    echo "hk_bench_cuda not built"
  fi
fi

if want bench_full; then
  stamp "bench_full"
  (cd "$share" && hk_bench_cuda --tune on --tune-cache "$work/tune-full" --lengths full \
     --benchmark_format=console --benchmark_out="$OUT/bench_full.json" --benchmark_out_format=json \
     --plans "$OUT/plans_full.txt" ${HK_BENCH_FULL_ARGS:-}) 2>&1 | tail -20
fi

if want bench_nopack; then
  stamp "bench_nopack"
  (cd "$share" && HK_PACK=0 hk_bench_cuda --tune on --tune-cache "$work/tune-nopack" \
     --benchmark_format=console --benchmark_out="$OUT/bench_nopack.json" --benchmark_out_format=json \
     ${HK_BENCH_NOPACK_ARGS:-}) 2>&1 | tail -20
fi

if want bench_nopdl; then
  stamp "bench_nopdl"
  (cd "$share" && HK_PDL=0 hk_bench_cuda --tune on --tune-cache "$work/tune-nopdl" \
     --benchmark_format=console --benchmark_out="$OUT/bench_nopdl.json" --benchmark_out_format=json \
     ${HK_BENCH_NOPDL_ARGS:-}) 2>&1 | tail -20
fi

if want bench_qkvlt; then
  stamp "bench_qkvlt"
  (cd "$share" && HK_QKV_GEMM=cublaslt hk_bench_cuda --tune on --tune-cache "$work/tune-qkvlt" \
     --benchmark_format=console --benchmark_out="$OUT/bench_qkvlt.json" --benchmark_out_format=json \
     ${HK_BENCH_QKVLT_ARGS:-}) 2>&1 | tail -20
fi

# The first benchmark of a hk_bench_cuda JSON report (a file, or stdin with -): its median in ms
# (real_time), with "with_startup": also the first forward's start-up (tuning included) in ms.
bench_ms() {
  python3 -c '
import json, sys
src = sys.stdin if sys.argv[1] == "-" else open(sys.argv[1])
b = json.load(src)["benchmarks"][0]
print("%.4f" % b["real_time"] + (" (start-up %.0f ms)" % b["startup_ms"] if sys.argv[2:] == ["with_startup"] else ""))
' "$@" 2>/dev/null || echo failed
}

if want ab; then
  stamp "ab"
  # A/B of one knob in the same run: HK_AB="KNOB=v1,v2,..." on the cases of HK_AB_CASES (tuned,
  # one tune cache per value, the knob set for the whole process); ab.txt lists each case's median.
  # HK_AB_ROUNDS=N: N rounds, the order of the values reversed every other round.
  # HK_AB_SHARED_CACHE=1: one tune cache per case for every value (the first run tunes, the others
  # take its decisions), for a knob whose own decision the value pins: everything else stays equal.
  # HK_AB_ARGS: more hk_bench_cuda arguments for every value (e.g. "--lengths full"); HK_AB_TAG: a
  # suffix for this A/B's files (ab-<tag>.txt), so that two A/Bs of one call keep theirs apart.
  ab_knob=${HK_AB%%=*}
  ab_vals=${HK_AB#*=}
  ab_tag=${HK_AB_TAG:+-$HK_AB_TAG}
  {
    echo "A/B of $ab_knob (tuned, ${HK_AB_ARGS:-random lengths}, median ms per forward; hk_bench_cuda --only C;" \
         "${HK_AB_ROUNDS:-1} round(s)$([ "${HK_AB_SHARED_CACHE:-0}" = 1 ] && echo ', one tune cache per case'))"
    for c in ${HK_AB_CASES:-1 2 6}; do
      for round in $(seq 1 "${HK_AB_ROUNDS:-1}"); do
        line="case $c"
        [ "${HK_AB_ROUNDS:-1}" -gt 1 ] && line="$line round $round"
        vals=${ab_vals//,/ }
        [ $((round % 2)) -eq 0 ] && vals=$(echo $vals | tr ' ' '\n' | tac | tr '\n' ' ')
        for v in $vals; do
          cache="$work/ab-$v"; [ "${HK_AB_SHARED_CACHE:-0}" = 1 ] && cache="$work/ab-shared-$c"
          (cd "$share" && env "$ab_knob=$v" hk_bench_cuda --only "$c" --tune on --tune-cache "$cache$ab_tag" \
             ${HK_AB_ARGS:-} --plans "$OUT/ab$ab_tag-plans-$c-$v.txt" \
             --benchmark_format=json --benchmark_out="$OUT/ab$ab_tag-$c-$v.json" --benchmark_out_format=json) >/dev/null 2>&1
          ms=$(bench_ms "$OUT/ab$ab_tag-$c-$v.json")
          line="$line  $v $ms"
        done
        echo "$line"
      done
    done
  } 2>&1 | tee "$OUT/ab$ab_tag.txt"
fi

if want ab_builds; then
  stamp "ab_builds"
  # Two builds side by side in one run (a change no knob switches): base = the build stage.sh was given
  # as HK_AB_BASE, new = the staged one; tuned, random lengths, median ms per forward, the order of the
  # two swapped from round to round; each build's plans of round 1 in abb-plans-<case>-<base|new>.txt.
  if [ -x "$pkg/bin/hk_bench_cuda_base" ]; then
    # The builds: base, the extra ones (stage.sh HK_AB_EXTRA: hk_bench_cuda_x_<label>), new; rounds 1
    # and 3 in that order, round 2 reversed.
    variants=(base)
    for b in "$pkg"/bin/hk_bench_cuda_x_*; do [ -x "$b" ] && variants+=("x_${b##*/hk_bench_cuda_x_}"); done
    variants+=(new)
    {
      echo "A/B of ${#variants[@]} builds (${variants[*]}; tuned, ${HK_AB_ARGS:-random lengths}, median ms per forward and the first forward's start-up; three rounds, alternating)"
      for c in ${HK_AB_CASES:-2}; do
        for round in 1 2 3; do
          line="case $c round $round"
          order=("${variants[@]}")
          if [ $((round % 2)) -eq 0 ]; then
            order=(); for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[$i]}"); done
          fi
          for v in "${order[@]}"; do
            bin=hk_bench_cuda; [ "$v" != new ] && bin=hk_bench_cuda_$v
            plans=(); [ "$round" = 1 ] && plans=(--plans "$OUT/abb-plans-$c-$v.txt")
            ms=$(cd "$share" && "$bin" --only "$c" --tune on --tune-cache "$work/abb-$v-$c-$round" ${HK_AB_ARGS:-} \
                   ${plans[@]+"${plans[@]}"} --benchmark_format=json 2>/dev/null | bench_ms - with_startup)
            line="$line  $v $ms"
          done
          echo "$line"
        done
      done
    } 2>&1 | tee "$OUT/ab_builds.txt"
  else
    echo "ab_builds: no base build in the stage (stage.sh with HK_AB_BASE=path/to/hk_bench_cuda)"
  fi
fi

if want timeline; then
  stamp "timeline"
  # Its own process: kernel tracing is on for the whole run (tuning included), so both medians the
  # table gives are traced; what tracing costs shows against the bench phase's untraced medians.
  (cd "$share" && hk_bench_cuda --tune on --tune-cache "$work/tune-timeline" --timeline "$OUT/timeline.md" \
     ${HK_TIMELINE_CASES:+--only "$HK_TIMELINE_CASES"} ${HK_TIMELINE_ARGS:-} --benchmark_format=console) 2>&1 | tail -20
  [ -f "$OUT/timeline.md" ] && grep -E '^(====|no timeline|kernel sequence|median span|event-timed)' "$OUT/timeline.md" | head -60
fi

if want lt_search; then
  stamp "lt_search"
  # Not in the default list: cuBLASLt configurations beyond its heuristic's list, timed against it
  # per GEMM of the case plans (perf/cuda/lt_search.cpp; HK_LT_SEARCH_ARGS e.g. "--only c8 --max 200").
  # shellcheck disable=SC2086
  timeout "${HK_LT_SEARCH_TIMEOUT:-240}" hk_lt_search ${HK_LT_SEARCH_ARGS:-} > "$OUT/lt-search.txt" 2>&1
  status[lt_search]=$?
  grep -E '^(hk_lt_search|==|  heuristic|  configurations|  fastest|summary)' "$OUT/lt-search.txt" | tail -150
fi

if want e2e; then
  stamp "e2e"
  # Case 6 end to end (file in, file out) against only reading the input and writing an output of
  # the same shape through hk's HDF5 layer (hk_io_baseline: y = x, no compute), in the same chunks
  # (the chunk hk_forward's warm-up reports). Target: hk_forward within 1.3x of the baseline, both
  # as process wall times (CUDA start-up, the forked validation and the model count: the user
  # waits for them). One warm-up each (input in the page cache, tune cache filled), then
  # alternating runs, medians. Each run removes its output. Without a GPU, a dry run of the
  # plumbing: HK_E2E_BACKEND=kokkos HK_E2E_CASE_ARGS='--batch 64'.
  e2e_backend=${HK_E2E_BACKEND:-cuda}
  e2e_runs=${HK_E2E_RUNS:-5}
  e2e_in=$work/case6.h5
  e2e_out=$work/case6-out.h5
  e2e_txt=$OUT/e2e.txt
  e2e_fail=0
  export HK_TUNE_CACHE=$work/tune-e2e
  ms_now() { echo $(( $(date +%s%N) / 1000000 )); }
  # Runs "$@" (output to $work/e2e-run.log), appends that output to e2e.txt, sets e2e_ms.
  e2e_time() {
    local s rc
    s=$(ms_now)
    timeout 200 "$@" > "$work/e2e-run.log" 2>&1
    rc=$?
    e2e_end=$(ms_now)
    e2e_ms=$(( e2e_end - s ))
    sed 's/^/    /' "$work/e2e-run.log" >> "$e2e_txt"
    # hk_forward's --stats line carries its clock's start and its last line (unix seconds): the
    # process's time before run() (exec, loading, static set-up) and after it (exit, teardown).
    awk -v s="$s" -v e="$e2e_end" '/stats:.*t0_unix=/ {
        for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "    process: %.0f ms before its clock, %.0f ms after its stats line\n", v["t0_unix"] * 1000 - s, e - v["stats_unix"] * 1000
      }' "$work/e2e-run.log" >> "$e2e_txt"
    rm -f "$e2e_out"
    if [ $rc -ne 0 ]; then
      echo "  FAILED rc=$rc: $*" >> "$e2e_txt"
      e2e_fail=$rc
    fi
    return $rc
  }
  median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
  {
    echo "e2e: case 6, hk_forward --backend $e2e_backend vs hk_io_baseline; target ratio <= 1.3"
    echo "work dir: $(df -hT "$work" | awk 'NR==2 {print $1, $2, $5 " free"}')"
    echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"
  } > "$e2e_txt"
  rm -f "$e2e_in" "$e2e_out"
  e2e_time hk_generate --cases "$share/cases.csv" --case 6 ${HK_E2E_CASE_ARGS:-} --output "$e2e_in"
  echo "generate: ${e2e_ms} ms, $(stat -c %s "$e2e_in" 2>/dev/null || echo 0) bytes" >> "$e2e_txt"
  stamp "  generated case 6 in ${e2e_ms} ms"
  fwd=(hk_forward --backend "$e2e_backend" --input "$e2e_in" --output "$e2e_out" --stats)
  e2e_chunk=""
  if [ $e2e_fail -eq 0 ]; then
    echo "warm-up hk_forward:" >> "$e2e_txt"
    e2e_time "${fwd[@]}"
    echo "  ${e2e_ms} ms" >> "$e2e_txt"
    e2e_chunk=$(grep -o ' chunk=[0-9]*' "$work/e2e-run.log" | head -1 | cut -d= -f2)
    base=(hk_io_baseline --input "$e2e_in" --output "$e2e_out" ${e2e_chunk:+--chunk "$e2e_chunk"})
    echo "warm-up hk_io_baseline (chunk ${e2e_chunk:-whole batch}):" >> "$e2e_txt"
    e2e_time "${base[@]}"
    echo "  ${e2e_ms} ms" >> "$e2e_txt"
  fi
  # HK_E2E_ALT_ENV: variants of hk_forward, separated by ';', each space-separated VAR=value,
  # each warmed up once, then run in the same loop after each default run with its own median
  # (side-by-side A/B). The target uses the default; a failing variant is reported and dropped.
  IFS=';' read -r -a alts <<< "${HK_E2E_ALT_ENV:-}"
  base_ms=() fwd_ms=()
  declare -A alt_ms=() alt_dead=()
  # One variant run: its output and time go to e2e.txt; a failure does not touch e2e_fail.
  alt_run() {
    local keep=$e2e_fail
    read -r -a alt_env <<< "$1"
    e2e_time env "${alt_env[@]}" "${fwd[@]}"
    local rc=$?
    e2e_fail=$keep
    return $rc
  }
  for a in "${alts[@]}"; do
    [ -n "${a// /}" ] || continue
    [ $e2e_fail -eq 0 ] || break
    echo "warm-up hk_forward ($a):" >> "$e2e_txt"
    if alt_run "$a"; then
      echo "  ${e2e_ms} ms" >> "$e2e_txt"
    else
      alt_dead[$a]=1
      echo "  variant dropped: it failed" >> "$e2e_txt"
    fi
  done
  for (( i = 1; i <= e2e_runs && e2e_fail == 0; i++ )); do
    echo "run $i hk_io_baseline:" >> "$e2e_txt"
    e2e_time "${base[@]}" && base_ms+=("$e2e_ms") && echo "  ${e2e_ms} ms" >> "$e2e_txt"
    echo "run $i hk_forward:" >> "$e2e_txt"
    e2e_time "${fwd[@]}" && fwd_ms+=("$e2e_ms") && echo "  ${e2e_ms} ms" >> "$e2e_txt"
    for a in "${alts[@]}"; do
      [ -n "${a// /}" ] && [ -z "${alt_dead[$a]:-}" ] && [ $e2e_fail -eq 0 ] || continue
      echo "run $i hk_forward ($a):" >> "$e2e_txt"
      if alt_run "$a"; then
        alt_ms[$a]+="$e2e_ms "
        echo "  ${e2e_ms} ms" >> "$e2e_txt"
      else
        alt_dead[$a]=1
        echo "  variant dropped: it failed" >> "$e2e_txt"
      fi
    done
  done
  # Where the rest goes (not part of the ratio): the process start alone (loading the CUDA
  # libraries), and one run without the forked validation.
  if [ $e2e_fail -eq 0 ]; then
    for i in 1 2 3; do
      s=$(ms_now); hk_forward --version > /dev/null 2>&1; echo "diagnostic: hk_forward --version $(( $(ms_now) - s )) ms" >> "$e2e_txt"
    done
    echo "diagnostic: hk_forward --no-fork-validate:" >> "$e2e_txt"
    e2e_time "${fwd[@]}" --no-fork-validate && echo "  ${e2e_ms} ms" >> "$e2e_txt"
    # Timelines (hk_forward --trace) of a default run and of each HK_E2E_TRACE_ENVS setting
    # (space-separated VAR=value, e.g. "HK_PACK=0 HK_GRAPH=0"): the JSON files and a text form.
    trace_envs=(default ${HK_E2E_TRACE_ENVS:-})
    for te in "${trace_envs[@]}"; do
      tag=${te//[^A-Za-z0-9]/_}
      echo "diagnostic: traced run ($te):" >> "$e2e_txt"
      if [ "$te" = default ]; then
        e2e_time "${fwd[@]}" --trace "$OUT/e2e-trace-$tag.json"
      else
        e2e_time env "$te" "${fwd[@]}" --trace "$OUT/e2e-trace-$tag.json"
      fi
      echo "  ${e2e_ms} ms" >> "$e2e_txt"
      [ -f "$OUT/e2e-trace-$tag.json" ] &&
        python3 "$root/perf/device/trace_summary.py" "$OUT/e2e-trace-$tag.json" > "$OUT/e2e-trace-$tag.txt" 2>&1
    done
  fi
  rm -f "$e2e_in" "$e2e_out"
  if [ $e2e_fail -eq 0 ] && [ ${#base_ms[@]} -gt 0 ] && [ ${#fwd_ms[@]} -gt 0 ]; then
    mb=$(median "${base_ms[@]}")
    mf=$(median "${fwd_ms[@]}")
    {
      echo "hk_io_baseline ms: ${base_ms[*]}  median $mb"
      echo "hk_forward     ms: ${fwd_ms[*]}  median $mf"
      for a in "${alts[@]}"; do
        [ -n "${alt_ms[$a]:-}" ] || continue
        read -r -a v <<< "${alt_ms[$a]}"
        ma=$(median "${v[@]}")
        echo "hk_forward ($a) ms: ${v[*]}  median $ma  ratio to the baseline $(awk -v x="$ma" -v b="$mb" 'BEGIN { printf "%.3f", (b > 0 ? x / b : 1e9) }')"
      done
      awk -v f="$mf" -v b="$mb" 'BEGIN {
        r = b > 0 ? f / b : 1e9
        printf "ratio hk_forward / hk_io_baseline = %.3f (target <= 1.3)\n", r
        printf "%s e2e: case 6 end to end %.3f s vs I/O only %.3f s\n", (r <= 1.3 ? "PASS" : "FAIL"), f / 1000, b / 1000
      }'
    } >> "$e2e_txt"
    grep -q '^PASS' "$e2e_txt"
    status[e2e-target]=$?
  else
    echo "FAIL e2e: a command failed (rc=$e2e_fail), no ratio" >> "$e2e_txt"
    status[e2e-target]=1
  fi
  status[e2e-run]=$e2e_fail
  unset HK_TUNE_CACHE
  cat "$e2e_txt"
fi

if want profile && [ -x "$root/perf/device/profile.sh" ]; then
  stamp "profile"
  # Not in the default list: ncu per-kernel table of the tuned forward (roofline account).
  # The tree's script (it travels with the call), not the stage's copy.
  # shellcheck disable=SC2086
  "$root/perf/device/profile.sh" "$pkg/bin" "$share/cases.csv" "$work/prof" "$OUT/profile.md" ${HK_PROFILE_CASES:-2 6} 2>&1 | tail -5
  status[profile]=${PIPESTATUS[0]}
  tail -60 "$OUT/profile.md"
fi

if want multigpu; then
  stamp "multigpu (multi_gpu.sh)"
  HK_PKG=$pkg OUT=$OUT "$root/perf/device/multi_gpu.sh" 2>&1 | tail -40
  status[multigpu]=${PIPESTATUS[0]}
  cp "$OUT/multigpu.txt" "$FINAL/" 2>/dev/null
fi

if want peers; then
  stamp "peers"
  python3 "$share/peers.py" --cases "$share/cases.csv" --json "$OUT/peers.json" ${HK_PEERS_ARGS:-} 2>&1 | tail -30
fi

if want regress; then
  stamp "regress"
  # The tuned run of the bench phase, wrapped with device identity, build and date, compared with
  # the committed baseline of this device (perf/regress/baselines: exit 1 on a regression, 3 when
  # the device has none), and the plot of per-case speedups of hk and the peers over eager. To make
  # a run the new baseline: run.py --from-json ... --update-baseline, then commit the file.
  mkdir -p "$OUT/regress"
  if [ -f "$OUT/bench_hk.json" ]; then
    before=$(date +%s)
    python3 "$share/regress/run.py" --from-json "$OUT/bench_hk.json" --kind cuda --filter '/tuned/' \
      --git-hash "${HK_GIT_HASH:-$(head -1 "$share/git-hash.txt" 2>/dev/null || echo unknown)}" --build-type Release \
      --results-dir "$OUT/regress" --baseline-dir "$share/regress/baselines" --compare 2>&1 | tail -30
    status[regress]=${PIPESTATUS[0]}
    run_json=$(find "$OUT"/regress -name '*.json' -newermt "@$before" 2>/dev/null | head -1)
    [ -f "$OUT/peers.json" ] && [ -n "$run_json" ] && python3 "$share/regress/plot.py" --hk "$run_json" \
      --peers "$OUT/peers.json" --out "$OUT/regress/speedups.png" 2>&1 | tail -5
  fi
fi

if want summary; then
  stamp "summary"
  {
    echo "## Random lengths (MODEL.md), tuned"
    # By the label hk_bench_cuda gives each run (tuned / untuned), which --tune env runs do not
    # carry in their names.
    python3 "$root/perf/device/summarize.py" --env "$OUT/env.txt" --hk "$OUT/bench_hk.json" --peers "$OUT/peers.json" \
      --cases "$share/cases.csv" --label ', tuned$'
    echo; echo "## Random lengths, untuned (HK_TUNE=0)"
    python3 "$root/perf/device/summarize.py" --env "$OUT/env.txt" --hk "$OUT/bench_hk.json" --peers "$OUT/peers.json" \
      --cases "$share/cases.csv" --label ', untuned$'
    if [ -f "$OUT/bench_nopack.json" ]; then
      echo; echo "## Random lengths, tuned, HK_PACK=0 (dense plans)"
      python3 "$root/perf/device/summarize.py" --env "$OUT/env.txt" --hk "$OUT/bench_nopack.json" --peers "$OUT/peers.json" \
        --cases "$share/cases.csv"
    fi
    if [ -f "$OUT/bench_nopdl.json" ]; then
      echo; echo "## Random lengths, tuned, HK_PDL=0 (ordinary kernel launches)"
      python3 "$root/perf/device/summarize.py" --env "$OUT/env.txt" --hk "$OUT/bench_nopdl.json" --peers "$OUT/peers.json" \
        --cases "$share/cases.csv"
    fi
    if [ -f "$OUT/bench_qkvlt.json" ]; then
      echo; echo "## Random lengths, tuned, HK_QKV_GEMM=cublaslt (the QKV projection on cuBLASLt only)"
      python3 "$root/perf/device/summarize.py" --env "$OUT/env.txt" --hk "$OUT/bench_qkvlt.json" --peers "$OUT/peers.json" \
        --cases "$share/cases.csv"
    fi
    if [ -f "$OUT/bench_full.json" ]; then
      echo; echo "## Every sequence at full length, tuned (the peers compute the dense problem either way)"
      python3 "$root/perf/device/summarize.py" --env "$OUT/env.txt" --hk "$OUT/bench_full.json" --peers "$OUT/peers.json" \
        --cases "$share/cases.csv" --lengths full
    fi
  } > "$OUT/summary.md" 2>&1
  cat "$OUT/summary.md"
fi

{
echo
echo "status:"
for k in "${!status[@]}"; do
  v=${status[$k]}
  case "$v" in 0) ;; 77) echo "  SKIP $k";; *) echo "  FAIL $k (rc=$v)";; esac
done | sort
echo "total $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$FINAL/status.txt"
cp "$OUT/summary.md" "$FINAL/" 2>/dev/null
tar -C "$OUT" -czf "$FINAL/results.tgz" . && ls -la "$FINAL"
