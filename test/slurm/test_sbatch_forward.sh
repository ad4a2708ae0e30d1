#!/usr/bin/env bash
# The Slurm batch scripts of perf/slurm run for real: a throwaway single-node cluster
# (slurm_cluster.sh) gets perf/slurm/forward.sbatch on one input and perf/slurm/array.sbatch as a
# two-task array over two more; every job must end COMPLETED with exit code 0, and every output
# must equal, object for object and bit for bit, what the same hk_forward binary writes when run
# directly with the same options (Kokkos backend: no GPU is needed).
#
#   test_sbatch_forward.sh HK_FORWARD HK_GENERATE SOURCE_DIR
#
# Exit 0 pass, 1 fail, 77 skipped (only when Slurm's or munge's daemons are not installed).
# Must run as root (slurm_cluster.sh says why), as CI does. Every daemon is stopped and every
# temporary file removed on every path out of this script.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 HK_FORWARD HK_GENERATE SOURCE_DIR" >&2
  exit 2
fi
hk_forward=$(realpath "$1")
hk_generate=$(realpath "$2")
src=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
export PATH=$PATH:/usr/sbin

for tool in slurmctld slurmd munged; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (Debian packages slurm-wlm and munge)"
    exit 77
  fi
done

t0=$(date +%s%N)
log() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '[%d.%d s] %s\n' $(( ms / 1000 )) $(( ms % 1000 / 100 )) "$*"; }

work=$(mktemp -d /tmp/hk-slurm-test.XXXXXX)
cluster=$(mktemp -d /tmp/hk-slurm-cluster.XXXXXX)
failed=0
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ $status -ne 0 ] || [ $failed -ne 0 ]; then
    # What the jobs and the daemons said, before both go.
    for f in "$work"/*.out "$cluster"/log/*.log; do
      [ -f "$f" ] && { echo "---- $f (last 30 lines)"; tail -n 30 "$f"; }
    done
  fi
  "$here/slurm_cluster.sh" stop "$cluster" || echo "warning: stopping the cluster failed" >&2
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

check() {  # check NAME STATUS DETAIL: STATUS 0 passes
  if [ "$2" -eq 0 ]; then
    printf '  %-58s ok\n' "$1"
  else
    printf '  %-58s FAIL  %s\n' "$1" "$3"
    failed=$(( failed + 1 ))
  fi
}

# ---- the cluster
log "starting a single-node cluster in $cluster"
status=0
"$here/slurm_cluster.sh" start "$cluster" >/dev/null || status=$?
if [ $status -eq 77 ]; then
  echo "SKIP: Slurm or munge tools missing"
  exit 77
fi
[ $status -eq 0 ] || { echo "FAIL: the cluster did not start"; exit 1; }
export SLURM_CONF=$cluster/etc/slurm.conf
log "cluster up: $(sinfo -h -N -o '%N %T %c CPUs %m MB %G') (Slurm $(sinfo -V | awk '{print $2}'))"

# ---- inputs, and the direct runs the jobs are compared with
# One thread for OpenBLAS in both the direct runs and the jobs (sbatch passes this environment on),
# so that the two differ only in how they were launched.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
gen() { "$hk_generate" --quiet --batch 3 --seq 12 --d-model 32 --heads 4 --ffn 48 --layers 2 "$@"; }
gen --seed 11 --causal 1 --output "$work/fwd.h5"
mkdir -p "$work/in" "$work/arrayout"
gen --seed 12 --causal 0 --output "$work/in/a.h5"
gen --seed 13 --causal 1 --nontrivial-ln --output "$work/in/b.h5"
printf '%s\n' "$work/in/a.h5" "$work/in/b.h5" > "$work/inputs.txt"

fwd_args=(--backend kokkos --precision fp32)
array_args="--backend kokkos"   # the default precision (fast; fp32 on this backend)

# ---- submit both, then wait for both
export HK_FORWARD=$hk_forward
common=(--parsable --chdir="$work" --cpus-per-task=1 --mem=512M --time=5)
fwd_id=$(sbatch "${common[@]}" --output="$work/forward-%j.out" \
           "$src/perf/slurm/forward.sbatch" "$work/fwd.h5" "$work/fwd.slurm.h5" "${fwd_args[@]}")
array_id=$(HK_FORWARD_ARGS=$array_args HK_FILES_PER_TASK=1 \
           sbatch "${common[@]}" --array=0-1 --output="$work/array-%A_%a.out" \
           "$src/perf/slurm/array.sbatch" "$work/inputs.txt" "$work/arrayout")
fwd_id=${fwd_id%%;*}
array_id=${array_id%%;*}
log "submitted forward.sbatch as job $fwd_id, array.sbatch as job $array_id (tasks 0-1)"

# Direct runs while the jobs queue and run: same binary, same options, same input paths (the
# input path is recorded in the output's attributes).
"$hk_forward" --quiet --input "$work/fwd.h5" --output "$work/fwd.direct.h5" "${fwd_args[@]}"
mkdir -p "$work/direct"
for n in a b; do
  # shellcheck disable=SC2086
  "$hk_forward" --quiet --input "$work/in/$n.h5" --output "$work/direct/$n.out.h5" $array_args
done

# JobState of every job/array task of these ids: "id state exitcode" lines.
job_states() {
  local id
  for id in "$@"; do
    scontrol -o show job "$id" 2>/dev/null |
      sed -n 's/^JobId=\([0-9]*\) .*\bJobState=\([A-Z_]*\) .*\bExitCode=\([0-9:]*\) .*/\1 \2 \3/p' || true
  done
}
deadline=$(( $(date +%s) + 90 ))
while :; do
  states=$(job_states "$fwd_id" "$array_id")
  # Three records (the job and two array tasks), none of them still in flight.
  if [ "$(grep -c . <<< "$states")" -ge 3 ] &&
     ! grep -qE ' (PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|REQUEUED|RESIZING|SIGNALING|STAGE_OUT) ' <<< "$states"; then
    break
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "FAIL: jobs not finished after 90 s:"; echo "$states"
    for id in "$fwd_id" "$array_id"; do scontrol -o show job "$id" 2>&1 | grep -oE '(JobId|JobState|Reason)=[^ ]*' || true; done
    exit 1
  fi
  sleep 0.2
done
log "jobs finished"
while read -r line; do echo "  job $line"; done <<< "$states"

# compare A B: exit 0 when both files hold the same objects with equal attributes and, for
# datasets, equal dtype, shape and bytes; 1 when they differ; 2 when one cannot be read.
# (Not h5diff: hdf5-tools is not among the CI packages; python3-h5py is.)
compare() {
  "$python" - "$1" "$2" <<'EOF'
import sys

import h5py
import numpy as np


def walk(path):
    objs = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            attrs = {k: (str(np.asarray(v).dtype), np.asarray(v).tobytes()) for k, v in obj.attrs.items()}
            if isinstance(obj, h5py.Dataset):
                objs[name] = ("dataset", str(obj.dtype), obj.shape, np.asarray(obj[()]).tobytes(), attrs)
            else:
                objs[name] = ("group", attrs)
        visit("/", f)
        f.visititems(visit)
    return objs


try:
    a, b = walk(sys.argv[1]), walk(sys.argv[2])
except Exception as e:  # a missing or unreadable file
    print(f"    cannot read: {str(e).split(' (')[0]}")
    sys.exit(2)
if "output/y" not in a:
    print(f"    no /output/y in {sys.argv[1]}")
    sys.exit(2)
problems = []
for name in sorted(set(a) | set(b)):
    if name not in a or name not in b:
        problems.append(f"{name}: only in {sys.argv[1] if name in a else sys.argv[2]}")
    elif a[name] != b[name]:
        problems.append(f"{name}: differs")
for p in problems:
    print("   ", p)
sys.exit(1 if problems else 0)
EOF
}

echo "checks:"
# forward.sbatch
fwd_state=$(job_states "$fwd_id" | awk '{print $2, $3}')
st=0; [ "$fwd_state" = "COMPLETED 0:0" ] || st=1
check "forward.sbatch job $fwd_id COMPLETED, exit 0:0" $st "$fwd_state"
st=0; grep -q '^hk-forward: exit 0 after' "$work/forward-$fwd_id.out" 2>/dev/null || st=1
check "forward.sbatch log reports hk_forward exit 0" $st "$(tail -n 3 "$work/forward-$fwd_id.out" 2>/dev/null)"
# The script's own #SBATCH --gres=gpu:1 reached the job (the cluster's GPU is a stand-in).
st=0; scontrol -o show job "$fwd_id" 2>/dev/null | grep -q '\bTresPerNode=gres:gpu:1\b' || st=1
check "forward.sbatch job was given its #SBATCH --gres=gpu:1" $st "$(scontrol -o show job "$fwd_id" 2>&1 | grep -o 'TresPerNode=[^ ]*')"
st=0; grep -q 'CUDA_VISIBLE_DEVICES=0$' "$work/forward-$fwd_id.out" 2>/dev/null || st=1
check "forward.sbatch job saw CUDA_VISIBLE_DEVICES=0" $st "$(head -n 1 "$work/forward-$fwd_id.out" 2>/dev/null)"
st=0; out=$(compare "$work/fwd.slurm.h5" "$work/fwd.direct.h5" 2>&1) || st=$?
check "forward.sbatch output == direct hk_forward (bit for bit)" $st "$out"

# array.sbatch: each task's record is found by its ArrayTaskId.
for task in 0 1; do
  st_line=$(scontrol -o show job "$array_id" 2>/dev/null | grep -E "\bArrayTaskId=$task\b" |
            sed -n 's/.*\bJobState=\([A-Z_]*\) .*\bExitCode=\([0-9:]*\) .*/\1 \2/p' || true)
  st=0; [ "$st_line" = "COMPLETED 0:0" ] || st=1
  check "array.sbatch task $task COMPLETED, exit 0:0" $st "$st_line"
  st=0; grep -q "^hk-array: task $task done, 0 of 1 failed" "$work/array-${array_id}_$task.out" 2>/dev/null || st=1
  check "array.sbatch task $task log reports 0 of 1 failed" $st "$(tail -n 3 "$work/array-${array_id}_$task.out" 2>/dev/null)"
done
for n in a b; do
  st=0; out=$(compare "$work/arrayout/$n.out.h5" "$work/direct/$n.out.h5" 2>&1) || st=$?
  check "array.sbatch output $n.out.h5 == direct hk_forward (bit for bit)" $st "$out"
done
# The comparison itself must see a difference where there is one.
st=0; compare "$work/direct/a.out.h5" "$work/direct/b.out.h5" >/dev/null 2>&1 || st=$?
[ $st -eq 1 ] && st=0 || st=1
check "comparison tells two different outputs apart" $st "it did not"

log "done: $failed check(s) failed"
[ $failed -eq 0 ]
