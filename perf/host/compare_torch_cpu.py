#!/usr/bin/env python3
"""hk's Kokkos backend against PyTorch CPU eager fp32, side by side in one run, on this host.

Per case, alternating so that both sides see the same machine state: hk_bench_host (the
Kokkos backend's forward, fp32) and perf/peers.py --device cpu (the eager fp32 baseline
module and the eager "strong" forward, torch.set_num_threads(2)), same shapes, same B; hk runs
again after torch and the faster hk run counts, so both sides sample the same stretch of time.
Debian's torch runs its matmuls on OpenBLAS's own threads next to its OpenMP threads; on a
2-core host that oversubscription can cost it 3x, so torch runs twice per case, as installed
and with OPENBLAS_NUM_THREADS=1, and the comparison uses the faster of the two.
Batches follow hk_bench_host's rule for a small host (at most 8192 tokens per forward, 1024
when d_model > 256); the B used is in the table. Writes a markdown table with the date, the
machine (lscpu), the load average and the command line.

  compare_torch_cpu.py [--cases-only 1,2,4,9] [--bench build-kokkos/perf/host/hk_bench_host]
                       [--out perf/host/RESULTS-host.md] [--torch-python /usr/bin/python3]
                       [--min-time 2] [--target-seconds 3] [--threads 2]

Exit status: 0 when every case ran and passed peers.py's accuracy check, 1 otherwise.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
HK_REPETITIONS = 5
REPO = os.path.dirname(os.path.dirname(HERE))


def host_batch(c):
    """The B hk_bench_host runs for a case (keep in step with bench_host.cpp)."""
    tokens = 1024 if c["D"] > 256 else 8192
    return max(1, min(c["B"], tokens // c["S"]))


def read_cases(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    cases = []
    for r in rows:
        c = {k: int(r[k]) for k in ("case", "B", "S", "D", "H", "F", "L", "causal")}
        c["note"] = r.get("note", "")
        cases.append(c)
    return cases


def lscpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    fields = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    model = fields.get("Model name", "unknown CPU")
    return "%s, %s CPU(s), %s thread(s) per core, L2 %s, L3 %s" % (
        model, fields.get("CPU(s)", "?"), fields.get("Thread(s) per core", "?"),
        fields.get("L2 cache", "?"), fields.get("L3 cache", "?"))


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def git_state():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_hk(bench, case_id, min_time, tmpdir):
    out = os.path.join(tmpdir, "hk_case%d.json" % case_id)
    cmd = [bench, "--benchmark_filter=^case%d/" % case_id, "--benchmark_min_time=%g" % min_time,
           "--benchmark_repetitions=%d" % HK_REPETITIONS, "--benchmark_format=json",
           "--benchmark_out=%s" % out, "--benchmark_out_format=json"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        doc = json.load(f)
    reps = [b for b in doc["benchmarks"] if b.get("run_type") == "iteration"]
    if not reps:
        raise RuntimeError("hk_bench_host reported nothing for case %d" % case_id)
    # The fastest repetition: interference from other work on a shared host only adds time.
    b = min(reps, key=lambda r: r["real_time"])
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
    return {"ms": b["real_time"] * scale, "name": b["run_name"], "tokens_per_s": b.get("items_per_second"),
            "B": int(b.get("B", 0)), "device": b.get("label", "")}


# Runs peers.py as its own program with the torch thread count pinned first.
TORCH_DRIVER = r"""
import runpy, sys, torch
torch.set_num_threads(int(sys.argv[1]))
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_torch(python, threads, cases_csv, case_id, target_s, tmpdir, extra_env):
    out = os.path.join(tmpdir, "torch_case%d_%d.json" % (case_id, len(extra_env)))
    peers = os.path.join(REPO, "perf", "peers.py")
    if not os.path.exists(peers):
        raise RuntimeError("perf/peers.py not found")
    cmd = [python, "-c", TORCH_DRIVER, str(threads), peers, "--device", "cpu", "--skip-compile",
           "--cases", cases_csv, "--cases-only", str(case_id), "--json", out,
           "--target-seconds", str(target_s), "--min-reps", "5", "--max-seconds", "600",
           "--budget-seconds", "3600"]
    env = dict(os.environ)
    env.update(extra_env)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if not os.path.exists(out):
        raise RuntimeError("peers.py failed for case %d:\n%s%s" % (case_id, proc.stdout[-2000:],
                                                                  proc.stderr[-2000:]))
    with open(out) as f:
        doc = json.load(f)
    rec = doc["cases"][0]
    return {"eager": rec.get("eager"), "sdpa_eager": rec.get("sdpa_eager"), "torch": doc.get("torch"),
            "skipped": rec.get("skipped", {})}


def fmt(x, spec="%.2f"):
    return "-" if x is None else spec % x


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=os.path.join(REPO, "data", "cases.csv"))
    ap.add_argument("--cases-only", default="1,2,4,9")
    ap.add_argument("--bench", default=os.path.join(REPO, "build-kokkos", "perf", "host", "hk_bench_host"))
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS-host.md"))
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="hk: seconds per repetition (%d repetitions)" % HK_REPETITIONS)
    ap.add_argument("--target-seconds", type=float, default=3.0, help="torch: timing seconds per peer")
    args = ap.parse_args(argv)

    wanted = [int(t) for t in args.cases_only.split(",") if t.strip()]
    cases = {c["case"]: c for c in read_cases(args.cases)}
    missing = [w for w in wanted if w not in cases]
    if missing:
        raise SystemExit("compare_torch_cpu.py: cases %s not in %s" % (missing, args.cases))
    if not os.access(args.bench, os.X_OK):
        raise SystemExit("compare_torch_cpu.py: %s not built (ninja -C build-kokkos hk_bench_host)" % args.bench)

    command = " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = loadavg()
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="hk_compare_") as tmp:
        # peers.py gets the same shapes with hk's host batch sizes.
        scaled = os.path.join(tmp, "cases_host.csv")
        with open(scaled, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "B", "S", "D", "H", "F", "L", "causal", "note"])
            for c in cases.values():
                w.writerow([c["case"], host_batch(c), c["S"], c["D"], c["H"], c["F"], c["L"], c["causal"],
                            c["note"]])
        torch_version = "?"
        for cid in wanted:
            c = cases[cid]
            print("case %d: hk ..." % cid, flush=True)
            hk = run_hk(args.bench, cid, args.min_time, tmp)
            if hk["B"] != host_batch(c):
                raise SystemExit("compare_torch_cpu.py: hk_bench_host ran B=%d, expected %d"
                                 % (hk["B"], host_batch(c)))
            print("case %d: hk %.2f ms; torch ..." % (cid, hk["ms"]), flush=True)
            runs = []
            for extra in ({}, {"OPENBLAS_NUM_THREADS": "1"}):
                tr = run_torch(args.torch_python, args.threads, scaled, cid, args.target_seconds, tmp, extra)
                torch_version = tr["torch"] or torch_version
                if not tr["eager"] or not tr["eager"].get("ok"):
                    ok = False
                runs.append(tr)
                print("case %d: torch eager %s ms %s" % (cid, fmt(tr["eager"] and tr["eager"]["ms"]),
                                                       extra or "(as installed)"), flush=True)
            # hk again after torch: its time is the faster of the two runs around torch's.
            again = run_hk(args.bench, cid, args.min_time, tmp)
            if again["ms"] < hk["ms"]:
                hk = again
            print("case %d: hk %.2f ms (faster of before/after torch)" % (cid, hk["ms"]), flush=True)
            rows.append((c, hk, runs[0], runs[1]))
    load_after = loadavg()

    lines = []
    lines.append("# hk Kokkos backend vs PyTorch CPU eager fp32 (this host)")
    lines.append("")
    lines.append("- date: %s UTC" % started.strftime("%Y-%m-%d %H:%M"))
    lines.append("- machine: %s" % lscpu_model())
    lines.append("- load average before / after: %s / %s (the machine is shared; timings move with it)"
                 % (load_before, load_after))
    lines.append("- hk: %s, fp32, `%s`: the fastest of 2 x %d repetitions, run just before and just after "
                 "torch's (each the mean over >= %g s of forward() calls, manual timing)"
                 % (git_state(), os.path.relpath(args.bench, REPO), HK_REPETITIONS, args.min_time))
    lines.append("- hk device: %s" % (rows[0][1]["device"] if rows else "?"))
    lines.append("- torch %s, `perf/peers.py --device cpu --skip-compile`, torch.set_num_threads(%d): the "
                 "fastest single forward under torch.no_grad() (peers.py's min_ms; favours torch against "
                 "hk's fastest mean)" % (torch_version, args.threads))
    lines.append("- command: `%s`" % command)
    lines.append("")
    lines.append("| case | B (of) | S | D | H | F | L | causal | hk kokkos ms | torch eager ms | "
                 "torch eager ms, OPENBLAS_NUM_THREADS=1 | best eager / hk | best eager-sdpa ms | "
                 "hk tokens/s | eager max abs err |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def ms(r, key):
        v = r[key]
        return v["min_ms"] if v and v.get("ok") else None

    for c, hk, plain, single in rows:
        eager = [v for v in (ms(plain, "eager"), ms(single, "eager")) if v is not None]
        sdpa = [v for v in (ms(plain, "sdpa_eager"), ms(single, "sdpa_eager")) if v is not None]
        best = min(eager) if eager else None
        errs = [r["eager"]["max_abs_err"] for r in (plain, single) if r["eager"]]
        lines.append("| %d | %d (%d) | %d | %d | %d | %d | %d | %d | %.2f | %s | %s | %s | %s | %s | %s |" % (
            c["case"], hk["B"], c["B"], c["S"], c["D"], c["H"], c["F"], c["L"], c["causal"], hk["ms"],
            fmt(ms(plain, "eager")), fmt(ms(single, "eager")),
            fmt(best / hk["ms"] if best else None, "%.2fx"), fmt(min(sdpa) if sdpa else None),
            fmt(hk["tokens_per_s"], "%.0f"), fmt(max(errs) if errs else None, "%.1e")))
    lines.append("")
    lines.append("\"best eager / hk\" above 1 means hk is faster than the faster torch setup. A torch time "
                 "is '-' when that peer failed its accuracy check (max abs err <= 1e-4 against the "
                 "float64 reference). eager-sdpa is peers.py's fused-QKV forward run eagerly in fp32 "
                 "(torch 1.13 has no SDPA: its masked-softmax fallback).")
    lines.append("hk's GEMMs run on OpenBLAS threads (both cores); its LayerNorm, GELU and attention "
                 "kernels run on one thread (Kokkos Serial).")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    print("wrote %s" % args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
