#!/usr/bin/env bash
# Runs perf/slurm/*.sbatch as plain bash on this host (their #SBATCH lines are comments), with
# the environment Slurm would give them, on the Kokkos backend. Checks their own logic (argument
# handling, file selection, skip/resume, exit codes, locating the checkout from
# SLURM_SUBMIT_DIR), not Slurm itself: no scheduler runs here.
#
#   test_slurm_scripts.sh REPO HK_FORWARD HK_GENERATE [HK_BENCH_HOST] [PYTHON]
set -u
repo=$1
forward=$2
generate=$3
bench=${4:-}
python=${5:-/usr/bin/python3}
slurm=$repo/perf/slurm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0

check() {  # check NAME COMMAND...: passes when COMMAND succeeds
  local name=$1
  shift
  checks=$((checks + 1))
  if "$@"; then
    echo "ok   $name"
  else
    echo "FAIL $name"
    failures=$((failures + 1))
  fi
}
status_is() {  # status_is WANT LOG COMMAND...: runs COMMAND (output to LOG), compares its exit status
  local want=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1
  local got=$?
  [ "$got" -eq "$want" ] || { echo "     exit $got, wanted $want; log:"; sed 's/^/     | /' "$log"; return 1; }
}

# An install-like prefix holding the tools (what HK_PREFIX points at).
mkdir -p "$tmp/prefix/bin" "$tmp/in" "$tmp/out"
ln -s "$forward" "$tmp/prefix/bin/hk_forward"
export HK_PREFIX=$tmp/prefix

# ---- forward.sbatch -----------------------------------------------------------------------------
check "forward.sbatch without arguments: usage, exit 2" status_is 2 "$tmp/f0.log" bash "$slurm/forward.sbatch"
# Outside an allocation (no SLURM_JOB_ID) the script runs hk_forward directly; srun inside a real
# allocation is covered by test/slurm (a throwaway single-node cluster).
check "forward.sbatch runs the sample (exit 0, output written)" \
  status_is 0 "$tmp/f1.log" env -u SLURM_JOB_ID bash "$slurm/forward.sbatch" "$repo/data/sample.h5" "$tmp/f1.h5" --backend kokkos
check "forward.sbatch output exists" test -s "$tmp/f1.h5"
check "forward.sbatch passes extra options through (--precision reference)" \
  status_is 0 "$tmp/f2.log" bash "$slurm/forward.sbatch" "$repo/data/sample.h5" "$tmp/f2.h5" --backend kokkos --precision reference
check "forward.sbatch reports a failing run with its exit status" \
  status_is 1 "$tmp/f3.log" bash "$slurm/forward.sbatch" "$tmp/absent.h5" "$tmp/f3.h5" --backend kokkos
check "forward.sbatch without hk_forward: exit 2" status_is 2 "$tmp/f4.log" env HK_PREFIX="$tmp/none" bash "$slurm/forward.sbatch" a b

# ---- array.sbatch ---------------------------------------------------------------------------------
for i in 1 2 3 4 5; do
  "$generate" --batch 2 --seq 6 --d-model 16 --heads 2 --ffn 24 --layers 1 --seed "$i" --quiet --output "$tmp/in/x$i.h5" \
    || echo "hk_generate failed for x$i"
done
{ for i in 1 2 3; do echo "$tmp/in/x$i.h5"; done; echo; for i in 4 5; do echo "$tmp/in/x$i.h5"; done; } >"$tmp/list.txt"
export HK_FILES_PER_TASK=2 HK_FORWARD_ARGS="--backend kokkos"
check "array.sbatch outside an array task: refuses" status_is 1 "$tmp/a0.log" bash "$slurm/array.sbatch" "$tmp/list.txt" "$tmp/out"
for t in 0 1 2; do
  check "array task $t of 3 (2 files each, blank line ignored): exit 0" \
    status_is 0 "$tmp/a$t.log" env SLURM_ARRAY_TASK_ID=$t SLURM_ARRAY_JOB_ID=200 bash "$slurm/array.sbatch" "$tmp/list.txt" "$tmp/out"
done
check "array tasks wrote x1..x5.out.h5" bash -c 'for i in 1 2 3 4 5; do test -s "$0/x$i.out.h5" || exit 1; done' "$tmp/out"
check "task 2 took only x5" bash -c 'grep -q "x5.h5 -> " "$0" && ! grep -q "x4.h5 -> " "$0"' "$tmp/a2.log"
check "array task beyond the list: nothing to do, exit 0" \
  status_is 0 "$tmp/a3.log" env SLURM_ARRAY_TASK_ID=3 bash "$slurm/array.sbatch" "$tmp/list.txt" "$tmp/out"
check "resubmitted task 0 skips finished outputs" \
  bash -c 'SLURM_ARRAY_TASK_ID=0 bash "$0/array.sbatch" "$1/list.txt" "$1/out" >"$1/a4.log" 2>&1 && [ "$(grep -c "skip" "$1/a4.log")" -eq 2 ]' "$slurm" "$tmp"
echo "not an HDF5 file" >"$tmp/in/bad.h5"
printf '%s\n%s\n' "$tmp/in/bad.h5" "$tmp/in/x1.h5" >"$tmp/list_bad.txt"
check "a task with a bad input fails after running its other files" \
  bash -c 'SLURM_ARRAY_TASK_ID=0 bash "$0/array.sbatch" "$1/list_bad.txt" "$1/out2" >"$1/a5.log" 2>&1; rc=$?; [ $rc -ne 0 ] && test -s "$1/out2/x1.out.h5" && ! test -e "$1/out2/bad.out.h5" && grep -q "1 of 2 failed" "$1/a5.log"' "$slurm" "$tmp"
mkdir -p "$tmp/in/other" && cp "$tmp/in/x1.h5" "$tmp/in/other/x1.h5"
printf '%s\n%s\n' "$tmp/in/x1.h5" "$tmp/in/other/x1.h5" >"$tmp/list_dup.txt"
check "repeated input names (colliding outputs) are refused: exit 2" \
  status_is 2 "$tmp/a6.log" env SLURM_ARRAY_TASK_ID=0 bash "$slurm/array.sbatch" "$tmp/list_dup.txt" "$tmp/out3"
unset HK_FILES_PER_TASK HK_FORWARD_ARGS

# ---- regress.sbatch (with hk_bench_host standing in for hk_bench_cuda) -------------------------
if [ -n "$bench" ]; then
  # Slurm runs a copy of the script from its spool directory: the checkout must come from
  # SLURM_SUBMIT_DIR.
  mkdir -p "$tmp/spool" && cp "$slurm/regress.sbatch" "$tmp/spool/slurm_script"
  run_regress() {
    env SLURM_JOB_ID=300 SLURM_SUBMIT_DIR="$repo" HK_BENCH="$bench" HK_KIND=host HK_ONLY=2 HK_REPETITIONS=2 \
      HK_BENCH_ARGS="--benchmark_min_time=0.02" HK_RESULTS="$tmp/results" HK_PYTHON="$python" "$@" \
      bash "$tmp/spool/slurm_script"
  }
  check "regress.sbatch with no baseline for the device: exit 3" status_is 3 "$tmp/r0.log" run_regress HK_BASELINES="$tmp/base"
  check "regress.sbatch HK_UPDATE_BASELINE=1 records one: exit 0" \
    status_is 0 "$tmp/r1.log" run_regress HK_BASELINES="$tmp/base" HK_UPDATE_BASELINE=1
  base=$(find "$tmp/base" -name '*.json' | head -1)
  scale() {  # scale FACTOR OUT: the recorded baseline with every time multiplied
    "$python" - "$base" "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for b in d["google_benchmark"]["benchmarks"]:
    b["real_time"] *= float(sys.argv[2])
json.dump(d, open(sys.argv[3], "w"))
PY
  }
  mkdir -p "$tmp/slow" "$tmp/fast"
  if [ -n "$base" ]; then
    scale 4.0 "$tmp/slow/$(basename "$base")"
    scale 0.25 "$tmp/fast/$(basename "$base")"
  fi
  check "regress.sbatch against a 4x slower baseline: no regression, exit 0" \
    status_is 0 "$tmp/r2.log" run_regress HK_BASELINES="$tmp/slow"
  check "regress.sbatch against a 4x faster baseline: REGRESSION, exit 1" \
    status_is 1 "$tmp/r3.log" run_regress HK_BASELINES="$tmp/fast"
  check "regress.sbatch names the regression in its log" grep -q "REGRESSION" "$tmp/r3.log"
  check "regress.sbatch without a benchmark binary: exit 2" \
    status_is 2 "$tmp/r4.log" run_regress HK_BASELINES="$tmp/base" HK_BENCH="$tmp/none"
else
  echo "skip regress.sbatch checks: no hk_bench_host given"
fi

echo "$([ $failures -eq 0 ] && echo PASS || echo FAIL): $checks check(s), $failures failed"
[ $failures -eq 0 ]
