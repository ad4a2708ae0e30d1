#!/usr/bin/env bash
# Multi-GPU scaling of hk_forward under mpirun, one rank per GPU (each rank takes GPU
# local_rank % gpus). Case 6 of cases.csv with N x PER sequences (the "big" file, N = the GPUs of
# this machine) and with PER sequences (the "small" file):
#   bit identity    the N-rank output of the big file equals the 1-rank output of the same file
#                   (/output/y byte for byte, /output/lengths where present, batch_chunk)
#   strong scaling  the big file on 1 rank and on N ranks: efficiency T1(big) / (N * TN(big))
#   weak scaling    PER sequences per rank: 1 rank on the small file, N ranks on the big file:
#                   efficiency T1(small) / TN(big); the target is >= 90%
# A time is the job's wall time as hk_forward reports it (--stats wall_s of the slowest rank:
# validation, engine setup, read, compute, write, commit), the median of HK_MGPU_REPS runs (the run
# in the middle by that time; the lower middle one for an even count); the table
# also gives mpirun's wall time (process start, MPI and CUDA initialisation on top) and the
# compute and I/O busy times of the slowest rank (they overlap: read and write run beside compute).
# Every run pins --chunk, so that the chunk grid (and so the bits) does not follow free device
# memory, and shares one tune cache that a 1-rank run of each file fills first, so that every
# rank makes the same measured choices.
#
# Usage: perf/device/multi_gpu.sh    writes $OUT/multigpu.txt (table, PASS/FAIL) and
#        $OUT/multigpu.log (every run's output). Exit 0: PASS, 1: FAIL, 2: could not run.
# Environment (defaults in brackets):
#   HK_PKG              the unpacked stage: bin/, lib/, share/cases.csv, mpi/env.sh [/tmp/hk-pkg]
#   HK_MGPU_BACKEND     cuda, or kokkos to check the plumbing on a machine without GPUs [cuda]
#   HK_MGPU_RANKS       N [the GPUs nvidia-smi -L lists; 2 for kokkos]
#   HK_MGPU_PER_RANK    sequences per rank [10000, case 6's batch]
#   HK_MGPU_CASE        row of cases.csv [6]
#   HK_MGPU_CHUNK       --chunk of every run [1000]
#   HK_MGPU_PRECISION   --precision [fast]
#   HK_MGPU_REPS        timed runs of each configuration, the median counts [5]
#   HK_MGPU_TARGET      weak-scaling efficiency target [0.90]
#   HK_MGPU_TRACE       set: every run also writes its timeline (hk_forward --trace) to
#                       $OUT/mgpu-trace-<run>[.rank<k>].json
#   HK_MGPU_WRITE_MODES the N-rank runs repeat under each HK_MPIIO_WRITE mode listed
#                       [independent posix collective]; the verdict takes the mode with the fastest median
#   HK_MGPU_MPIRUN_ARGS mpirun options [--bind-to none: a rank's reader, writer and compute
#                       threads must not share one core, and the host BLAS thread count (the
#                       kokkos backend's bits) must not follow the binding]
#   HK_MGPU_WORK        scratch folder, removed at the end [/tmp/hk-mgpu]
#   HK_MGPU_FORWARD_ARGS  extra hk_forward options for every run, 1- and N-rank alike
#                       (e.g. --no-fork-validate, to tell the validation child's share apart) []
set -u
pkg=${HK_PKG:-/tmp/hk-pkg}
OUT=${OUT:-/tmp/hk-out}
backend=${HK_MGPU_BACKEND:-cuda}
per=${HK_MGPU_PER_RANK:-10000}
case_row=${HK_MGPU_CASE:-6}
chunk=${HK_MGPU_CHUNK:-1000}
precision=${HK_MGPU_PRECISION:-fast}
reps=${HK_MGPU_REPS:-5}
target=${HK_MGPU_TARGET:-0.90}
mpirun_args=${HK_MGPU_MPIRUN_ARGS:---bind-to none}
work=${HK_MGPU_WORK:-/tmp/hk-mgpu}
modes=${HK_MGPU_WRITE_MODES:-independent posix collective}
txt=$OUT/multigpu.txt
log=$OUT/multigpu.log
mkdir -p "$OUT"
: > "$log"

fail_setup() {
  echo "multigpu: $*" | tee -a "$log"
  { echo "# hk_forward multi-GPU scaling"; echo "could not run: $*"; echo "RESULT: FAIL"; } > "$txt"
  exit 2
}

# The packed Open MPI (stage.sh with HK_DEVICE_MPI=ON); else an mpirun already on the PATH.
if [ -f "$pkg/mpi/env.sh" ]; then
  # shellcheck source=/dev/null
  . "$pkg/mpi/env.sh"
fi
export PATH="$pkg/bin:$PATH"
command -v mpirun >/dev/null || fail_setup "no mpirun (stage with HK_DEVICE_MPI=ON)"
command -v hk_forward >/dev/null && command -v hk_generate >/dev/null || fail_setup "hk_forward / hk_generate not found in $pkg/bin"
hk_forward --version | grep -q 'MPI yes' || fail_setup "hk_forward was built without MPI: $(hk_forward --version)"
cases=$pkg/share/cases.csv
[ -f "$cases" ] || fail_setup "$cases missing"

gpus=0
if [ "$backend" = cuda ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "$gpus" -ge 1 ] || fail_setup "backend cuda but nvidia-smi -L lists no GPU"
fi
n=${HK_MGPU_RANKS:-$([ "$backend" = cuda ] && echo "$gpus" || echo 2)}
big=$((n * per))

rm -rf "$work" && mkdir -p "$work/logs" || fail_setup "cannot create $work"
export HK_TUNE_CACHE=$work/tune
mkdir -p "$HK_TUNE_CACHE"

{
  echo "multigpu: backend $backend, N=$n (GPUs listed: $gpus), case $case_row, $per sequences per rank, chunk $chunk, precision $precision, $reps timed run(s) each"
  echo "mpirun: $(command -v mpirun) ($(mpirun --version 2>&1 | head -1)), options: $mpirun_args"
  hk_forward --version
  [ "$backend" = cuda ] && nvidia-smi -L
} 2>&1 | tee -a "$log"

for b in "$per" "$big"; do
  [ -f "$work/in$b.h5" ] && continue
  hk_generate --cases "$cases" --case "$case_row" --batch "$b" --seed 600 --output "$work/in$b.h5" >> "$log" 2>&1 ||
    fail_setup "hk_generate --batch $b failed (see multigpu.log)"
done

# The GPUs that run compute processes, sampled while a run is going on (one process: killing it
# ends the sampling).
gpu_sampler() {
  while :; do
    nvidia-smi --query-compute-apps=gpu_bus_id --format=csv,noheader >> "$1" 2>/dev/null
    sleep 0.5
  done
}

# run LABEL RANKS BATCH OUTPUT [WRITE_MODE]: one mpirun of hk_forward; its log and mpirun's wall
# time in logs/.
run() {
  local label=$1 np=$2 b=$3 output=$4 mode=${5:-collective} rc t0 t1 sampler=""
  if [ "$backend" = cuda ] && [ "$np" -gt 1 ]; then
    gpu_sampler "$work/logs/$label.gpus" &
    sampler=$!
  fi
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  HK_MPIIO_WRITE=$mode timeout "${HK_MGPU_RUN_TIMEOUT:-300}" mpirun --allow-run-as-root --oversubscribe \
    -x HK_MPIIO_WRITE $mpirun_args -np "$np" \
    hk_forward --backend "$backend" --precision "$precision" --chunk "$chunk" --stats ${HK_MGPU_FORWARD_ARGS:-} \
    --input "$work/in$b.h5" --output "$output" ${HK_MGPU_TRACE:+--trace "$OUT/mgpu-trace-$label.json"} \
    > "$work/logs/$label.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
  fi
  echo "rc=$rc mpirun_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" > "$work/logs/$label.time"
  { echo "=== $label: $np rank(s), B=$b, rc=$rc"; cat "$work/logs/$label.log"; } >> "$log"
  echo "  $label rc=$rc ($(cut -d' ' -f2 "$work/logs/$label.time"))"
  return $rc
}

# The disk under the work directory, written directly (no page cache) and synced: the floor of
# every run's commit, which must put all of y on it.
disk_line=$(dd if=/dev/zero of="$work/dd.bin" bs=64M count=16 oflag=direct conv=fsync 2>&1 | tail -1)
rm -f "$work/dd.bin"
echo "disk (dd 1 GiB, oflag=direct, fsync): $disk_line" | tee -a "$log"

# Untimed: fill the tune cache (each file's chunks, one process), load the files into the page
# cache. The big file's 1-rank output is the bit reference.
run warm_small 1 "$per" "$work/warm_small.h5" || true
run ref 1 "$big" "$work/ref.h5" || true
rm -f "$work/warm_small.h5"
for r in $(seq 1 "$reps"); do
  run "small1.r$r" 1 "$per" "$work/small1.h5"
  rm -f "$work/small1.h5"
  run "big1.r$r" 1 "$big" "$work/big1.r$r.h5"
  for m in $modes; do
    run "bigN-$m.r$r" "$n" "$big" "$work/bigN-$m.r$r.h5" "$m"
  done
done

python3 - "$work" "$n" "$per" "$big" "$reps" "$target" "$backend" "$case_row" "$chunk" "$precision" "$gpus" "$modes" > "$txt" <<'PY'
import glob, os, re, sys
import numpy as np
import h5py

work, n, per, big, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
target, backend, case_row, chunk, precision, gpus = float(sys.argv[6]), sys.argv[7], sys.argv[8], sys.argv[9], sys.argv[10], int(sys.argv[11])
modes = sys.argv[12].split()
logs = os.path.join(work, "logs")

def parse(label):
    """The run's ranks' --stats lines, mpirun's wall time and exit status (None if it failed)."""
    t = open(os.path.join(logs, label + ".time")).read()
    rc = int(re.search(r"rc=(-?\d+)", t).group(1))
    wall = float(re.search(r"mpirun_s=([0-9.]+)", t).group(1))
    ranks = []
    for line in open(os.path.join(logs, label + ".log"), errors="replace"):
        if "hk_forward: stats:" in line:
            ranks.append({k: float(v) for k, v in re.findall(r"(\w+)=(-?[0-9.]+)", line.split("stats:", 1)[1])})
    if rc != 0 or not ranks:
        return None
    slowest = max(ranks, key=lambda s: s["wall_s"])
    return {"rc": rc, "mpirun_s": wall, "ranks": ranks, "wall_s": slowest["wall_s"], "slowest": slowest,
            "compute_max": max(s["compute_s"] for s in ranks), "label": label}

def median_run(prefix):
    runs = []
    for r in range(1, reps + 1):
        try:
            p = parse("%s.r%d" % (prefix, r))
        except (OSError, AttributeError):
            p = None
        if p:
            runs.append(p)
    runs.sort(key=lambda p: p["wall_s"])
    return (runs[(len(runs) - 1) // 2] if runs else None), len(runs)

def attr(f, name):
    v = f["/output"].attrs.get(name)
    return v.decode() if isinstance(v, bytes) else (None if v is None else str(v))

def same_output(a_path, b_path, ranks):
    """Empty string when b holds a's /output bit for bit (written by `ranks` ranks), else what differs."""
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        ya, yb = a["/output/y"], b["/output/y"]
        if ya.shape != yb.shape or ya.dtype != yb.dtype:
            return "y shape/type %s %s vs %s %s" % (ya.shape, ya.dtype, yb.shape, yb.dtype)
        step = max(1, (256 << 20) // max(1, ya[0:1].nbytes))
        for b0 in range(0, ya.shape[0], step):
            xa, xb = ya[b0:b0 + step], yb[b0:b0 + step]
            if xa.tobytes() != xb.tobytes():
                diff = np.flatnonzero(xa.view(np.uint32).ravel() != xb.view(np.uint32).ravel())
                i = np.unravel_index(diff[0], xa.shape)
                return "y differs in %d element(s) of sequences %d.., the first at [%d, %d, %d]" % (
                    diff.size, b0, b0 + i[0], i[1], i[2])
        la, lb = "/output/lengths" in a, "/output/lengths" in b
        if la != lb or (la and not np.array_equal(a["/output/lengths"][...], b["/output/lengths"][...])):
            return "/output/lengths differs"
        if attr(a, "batch_chunk") != attr(b, "batch_chunk"):
            return "batch_chunk %s vs %s" % (attr(a, "batch_chunk"), attr(b, "batch_chunk"))
        if attr(b, "ranks") != str(ranks):
            return "written by %s rank(s), expected %d" % (attr(b, "ranks"), ranks)
    return ""

small1, ns = median_run("small1")
big1, nb1 = median_run("big1")
byMode = {m: median_run("bigN-" + m) for m in modes}
measured = [m for m in modes if byMode[m][0]]
best_mode = min(measured, key=lambda m: byMode[m][0]["wall_s"]) if measured else modes[0]
bigN, nbN = byMode[best_mode]

print("# hk_forward multi-GPU scaling")
print("backend %s, precision %s, case %s, chunk %s, N = %d rank(s)%s, median of %d run(s) each" % (
    backend, precision, case_row, chunk, n, (" on %d GPU(s)" % gpus) if backend == "cuda" else "", reps))
print("times in s: wall = hk_forward's wall time of the slowest rank; mpirun = the whole command; compute/read/write/")
print("validate = that rank's busy time in each (they overlap); shares are of its wall time")
print()
hdr = "%-34s %5s %9s %7s %7s %7s %7s %7s %7s %7s %7s %7s %6s %9s" % (
    "run", "ranks", "sequences", "wall", "mpirun", "setup", "compute", "read", "write", "commit", "validate",
    "comp%", "io%", "Mtokens/s")
print(hdr)
print("-" * len(hdr))
tokens_per_seq = None
try:
    with h5py.File(os.path.join(work, "in%d.h5" % per), "r") as f:
        tokens_per_seq = f["/input/x"].shape[1]
except Exception:
    pass
rows = [("1 rank, small (weak base)", small1, per, ns), ("1 rank, big (strong base)", big1, big, nb1)]
rows += [("%d ranks, big, %s writes" % (n, m), byMode[m][0], big, byMode[m][1]) for m in modes]
for name, p, b, ok in rows:
    if p is None:
        print("%-34s %5s %9d   failed in every run (multigpu.log)" % (name, "", b))
        continue
    s = p["slowest"]
    io = s["read_s"] + s["write_s"]
    mt = (b * tokens_per_seq / p["wall_s"] / 1e6) if tokens_per_seq and p["wall_s"] > 0 else float("nan")
    nan = float("nan")
    print("%-34s %5d %9d %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %6.0f%% %5.0f%% %9.2f" % (
        name, len(p["ranks"]), b, p["wall_s"], p["mpirun_s"], s.get("setup_s", nan), s["compute_s"], s["read_s"],
        s["write_s"], s.get("commit_s", nan), s.get("validate_s", nan), 100 * s["compute_s"] / p["wall_s"],
        100 * io / p["wall_s"], mt))
print()

ok = True
print("N-rank figures below: the fastest write mode, %s" % best_mode)
if big1 and bigN:
    sp = big1["wall_s"] / bigN["wall_s"]
    print("strong scaling (big file, 1 -> %d ranks): speedup %.2fx, efficiency %.1f%% (mpirun times: %.1f%%; compute only: %.1f%%)" % (
        n, sp, 100 * sp / n, 100 * big1["mpirun_s"] / (n * bigN["mpirun_s"]),
        100 * big1["compute_max"] / (n * bigN["compute_max"]) if bigN["compute_max"] > 0 else float("nan")))
else:
    print("strong scaling: not measured (a configuration failed)")
if small1 and bigN:
    weak = small1["wall_s"] / bigN["wall_s"]
    verdict = "PASS" if weak >= target else "FAIL"
    ok &= weak >= target
    print("weak scaling (%d sequences per rank, 1 -> %d ranks): efficiency %.1f%% (mpirun times: %.1f%%; compute only: %.1f%%); target >= %.0f%%: %s" % (
        per, n, 100 * weak, 100 * small1["mpirun_s"] / bigN["mpirun_s"],
        100 * small1["compute_max"] / bigN["compute_max"] if bigN["compute_max"] > 0 else float("nan"), 100 * target, verdict))
else:
    ok = False
    print("weak scaling: not measured (a configuration failed): FAIL")

gpu_files = sorted(glob.glob(os.path.join(logs, "bigN-*.r*.gpus")))
if gpu_files:
    used = set()
    for g in gpu_files:
        used |= {l.strip() for l in open(g) if l.strip()}
    print("GPUs running compute processes during the %d-rank runs: %d of %d (%s)" % (
        n, len(used), gpus, ", ".join(sorted(used)) or "none seen"))

ref = os.path.join(work, "ref.h5")
problems = []
compared = 0
if not os.path.exists(ref):
    problems.append("no 1-rank reference output")
for r in range(1, reps + 1):
    for kind, ranks in [("big1", 1)] + [("bigN-" + m, n) for m in modes]:
        path = os.path.join(work, "%s.r%d.h5" % (kind, r))
        if not os.path.exists(path):
            problems.append("%s.r%d: no output" % (kind, r))
        elif os.path.exists(ref):
            compared += 1
            why = same_output(ref, path, ranks)
            if why:
                problems.append("%s.r%d: %s" % (kind, r, why))
bits_ok = not problems and compared > 0
ok &= bits_ok
print("bit identity (%d-rank and 1-rank reruns vs the 1-rank output of the big file, /output/y byte for byte, %d file(s)): %s" % (
    n, compared, "PASS" if bits_ok else "FAIL"))
for p in problems:
    print("  " + p)
print("RESULT: %s" % ("PASS" if ok else "FAIL"))
PY
rc=$?
echo "disk (dd 1 GiB, oflag=direct, fsync): $disk_line" >> "$txt"
echo "hk_forward extra options: ${HK_MGPU_FORWARD_ARGS:-(none)}" >> "$txt"
cat "$txt"
rm -rf "$work"
[ $rc -eq 0 ] || exit 2
grep -q '^RESULT: PASS' "$txt" && exit 0
exit 1
