#!/usr/bin/env python3
"""Builds the per-case results table (markdown) from one device run.

Inputs: env.txt (measured copy bandwidth and fp16 GEMM rate), Google Benchmark JSON of hk's
forward, the peers JSON of perf/peers.py, and cases.csv. For each case: hk / eager / compiled
milliseconds, speedup over eager, ratio to the compiled peer, achieved TB/s and TFLOP/s and the
fraction of the roofline floor, plus geometric means.

Floors count every position as a token (the dense B*S problem), weights read once in fp16, x read
and y written once in fp32: bytes / measured copy bandwidth and flops / measured GEMM rate; the
larger of the two is the floor. The valid-token floor counts only the work of valid tokens
(expected values for lengths U{1..S}, or S with --lengths full): what a padding-free forward
must still do.
"""
import argparse
import csv
import json
import math
import re
import sys


def read_env(path):
    bw, rate = 4.3e12, 757e12  # ENVIRONMENT.md's measurements, used when env.txt lacks them
    try:
        for line in open(path):
            if line.startswith("copy_bandwidth_TBps"):
                bw = float(line.split()[1]) * 1e12
            if line.startswith("gemm_fp16_TFLOPs"):
                rate = float(line.split()[1]) * 1e12
    except OSError:
        pass
    return bw, rate


def case_cost(row, valid_only=False, full=False):
    """flops and bytes of a case: the dense B*S problem, or (valid_only) the valid tokens only,
    with MODEL.md's lengths U{1..S} (expected values) unless `full` (every length S). Valid-only:
    x read for valid tokens, y written whole (its padded rows are zeros), attention over len^2."""
    B, S, D, H, F, L = (int(row[k]) for k in ("B", "S", "D", "H", "F", "L"))
    causal = int(row["causal"]) != 0
    if valid_only and not full:
        mean_len, mean_len2 = (S + 1) / 2.0, (S + 1) * (2 * S + 1) / 6.0
    else:
        mean_len, mean_len2 = float(S), float(S) * S
    T = B * (mean_len if valid_only else S)
    gemm = L * 2.0 * T * (4 * D * D + 2 * D * F)
    attn = L * 4.0 * B * (mean_len2 if valid_only else S * S) * D * (0.5 if causal else 1.0)
    bytes_ = 4.0 * T * D + 4.0 * B * S * D + L * 2.0 * (4 * D * D + 2 * D * F)
    return gemm + attn, bytes_


def hk_times(path, match=None, exclude=None, label=None):
    """case -> median ms, from Google Benchmark JSON (names carry 'case<N>' or 'case:N'); only
    benchmarks whose name matches `match` and not `exclude`, and whose label matches `label`
    (regexes) when given."""
    out = {}
    try:
        data = json.load(open(path))
    except (OSError, ValueError):
        return out
    for b in data.get("benchmarks", []):
        name = b.get("name", "")
        m = re.search(r"case[:_/ ]?(\d+)", name)
        if not m or (match and not re.search(match, name)) or (exclude and re.search(exclude, name)):
            continue
        if label and not re.search(label, b.get("label", "")):
            continue
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        ms = b["real_time"] * unit
        c = int(m.group(1))
        # prefer the median aggregate when repetitions were run
        if c not in out or b.get("aggregate_name") == "median":
            out[c] = ms
    return out


def peer_times(path):
    """case -> {'eager': ms, 'compiled': ms} from perf/peers.py JSON."""
    out = {}
    try:
        data = json.load(open(path))
    except (OSError, ValueError):
        return out
    rows = data.get("cases", data if isinstance(data, list) else [])
    for r in rows:
        c = int(r["case"])
        e = r.get("eager")
        e = e.get("ms") if isinstance(e, dict) and e.get("ok", True) else e
        out[c] = {"eager": e, "compiled": r.get("compiled_ms")}
    return out


def gmean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", required=True)
    ap.add_argument("--hk", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--match", help="use only hk benchmarks whose name matches this regex (e.g. /tuned)")
    ap.add_argument("--exclude", help="skip hk benchmarks whose name matches this regex (e.g. /full)")
    ap.add_argument("--label", help="use only hk benchmarks whose label matches this regex (e.g. ', tuned$': "
                                    "hk_bench_cuda labels each run tuned or untuned, whatever its name)")
    ap.add_argument("--lengths", choices=("random", "full"), default="random",
                    help="the lengths the hk benchmarks ran with (for the valid-token floor)")
    a = ap.parse_args()
    bw, rate = read_env(a.env)
    hk, peers = hk_times(a.hk, a.match, a.exclude, a.label), peer_times(a.peers)
    print(f"Ceilings: copy {bw/1e12:.2f} TB/s, fp16 GEMM {rate/1e12:.0f} TFLOP/s (measured in this run)\n")
    print("| case | B,S,D,H,F | hk ms | eager ms | compiled ms | hk vs eager | hk vs compiled | TB/s | TFLOP/s | "
          "floor ms | % of floor | valid-token floor ms | % of it |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    sp_e, sp_c = [], []
    for row in csv.DictReader(open(a.cases)):
        c = int(row["case"])
        flops, bytes_ = case_cost(row)
        floor = max(bytes_ / bw, flops / rate) * 1e3
        vf, vb = case_cost(row, valid_only=True, full=a.lengths == "full")
        vfloor = max(vb / bw, vf / rate) * 1e3
        t = hk.get(c)
        p = peers.get(c, {})
        e, comp = p.get("eager"), p.get("compiled")
        f = lambda v, fmt="%.3f": (fmt % v) if v else "-"
        se = e / t if (t and e) else None
        sc = comp / t if (t and comp) else None
        if se: sp_e.append(se)
        if sc: sp_c.append(sc)
        print(f"| {c} | {row['B']},{row['S']},{row['D']},{row['H']},{row['F']} | {f(t)} | {f(e)} | {f(comp)} | "
              f"{f(se, '%.2fx')} | {f(sc, '%.2fx')} | {f(bytes_ / (t * 1e-3) / 1e12 if t else None, '%.2f')} | "
              f"{f(flops / (t * 1e-3) / 1e12 if t else None, '%.1f')} | {floor:.4f} | "
              f"{f(100 * floor / t if t else None, '%.1f%%')} | {vfloor:.4f} | "
              f"{f(100 * vfloor / t if t else None, '%.1f%%')} |")
    comp_vs_eager = [peers[c]["eager"] / peers[c]["compiled"] for c in peers
                     if peers[c].get("eager") and peers[c].get("compiled")]
    print(f"\nGeometric means: hk vs eager {gmean(sp_e):.2f}x, hk vs compiled {gmean(sp_c):.2f}x, "
          f"compiled vs eager {gmean(comp_vs_eager):.2f}x  ({len(sp_e)} cases with hk and eager)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
