#!/usr/bin/env python3
"""Per-case speedup of hk and of the PyTorch peers over the eager fp32 baseline, as a PNG, from
the JSON of one run: hk's benchmark JSON (run.py output or bare Google Benchmark JSON of
hk_bench_cuda / hk_bench_host) and perf/peers.py's JSON measured beside it.

  plot.py --hk results/cuda-nvidia-h200-fast/....json --peers peers.json --out speedup.png

Speedup = eager ms / ms, on a log axis (1 = eager). Series: hk (one per precision in the file),
"compiled" (the faster of torch.compile + CUDA graph and max-autotune, when peers.py ran them)
and "sdpa_eager" (the strong forward, not compiled). The numbers plotted are printed as a table
with geometric means. Exit 2 on unreadable input or no case common to both files.
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchjson  # noqa: E402


def hk_series(doc):
    """{label: {case: median ms}}; one series per precision found in the benchmark names."""
    out = {}
    default_precision = doc.get("precision")
    for key, s in benchjson.samples(doc).items():
        case = benchjson.case_of(key)
        med, _, _ = benchjson.summary(s)
        if case is None or med is None or s["error"]:
            continue
        p = benchjson.precision_of(key) or default_precision
        out.setdefault("hk" + (" " + p if p else ""), {})[case] = med
    return out


def peer_series(doc):
    """{"eager": {case: ms}, "compiled": {...}, "sdpa_eager": {...}} from perf/peers.py JSON;
    only measurements that passed their accuracy check."""
    out = {"eager": {}, "compiled": {}, "sdpa_eager": {}}
    for r in doc.get("cases", []):
        c = int(r["case"])
        for name in ("eager", "sdpa_eager"):
            m = r.get(name)
            if isinstance(m, dict) and m.get("ok", True) and m.get("ms"):
                out[name][c] = float(m["ms"])
        if r.get("compiled_ms"):
            out["compiled"][c] = float(r["compiled_ms"])
    return out


def gmean(values):
    v = [x for x in values if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def speedups(hk_doc, peers_doc):
    """(cases, {series: {case: speedup}}) over the cases with an eager time and an hk time."""
    hk, peers = hk_series(hk_doc), peer_series(peers_doc)
    eager = peers["eager"]
    series = {}
    for label, times in list(hk.items()) + [("compiled", peers["compiled"]), ("sdpa_eager", peers["sdpa_eager"])]:
        sp = {c: eager[c] / t for c, t in times.items() if c in eager and t > 0}
        if sp:
            series[label] = sp
    hk_cases = set().union(*(set(v) for k, v in series.items() if k.startswith("hk"))) if series else set()
    return sorted(hk_cases), series


def table(cases, series):
    labels = list(series)
    lines = ["case  " + "  ".join("%12s" % l for l in labels)]
    for c in cases:
        lines.append("%4d  " % c + "  ".join("%11.2fx" % series[l][c] if c in series[l] else "%12s" % "-" for l in labels))
    lines.append("gmean " + "  ".join(("%11.2fx" % gmean([series[l][c] for c in cases if c in series[l]]))
                                        if gmean([series[l][c] for c in cases if c in series[l]]) else "%12s" % "-"
                                        for l in labels))
    return "\n".join(lines)


def plot(cases, series, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    labels = list(series)
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cases) + 2.5), 4.5), dpi=120)
    for i, label in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j, c in enumerate(cases) if c in series[label]]
        ys = [series[label][c] for c in cases if c in series[label]]
        g = gmean(ys)
        # Bars grow from 1 (eager): up when faster, down when slower.
        ax.bar(xs, [y - 1.0 for y in ys], width, bottom=1.0, label="%s (gmean %.2fx)" % (label, g) if g else label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    every = [v for label in labels for v in series[label].values()]
    ax.set_ylim(min(every + [1.0]) / 1.3, max(every + [1.0]) * 1.3)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%gx" % v))
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([str(c) for c in cases])
    ax.set_xlabel("case (cases.csv)")
    ax.set_ylabel("speedup over eager fp32 (x, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hk", required=True, help="hk benchmark JSON")
    ap.add_argument("--peers", required=True, help="perf/peers.py JSON")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", help="default: device and date of the two files")
    a = ap.parse_args(argv)
    try:
        hk_doc = benchjson.load(a.hk)
        with open(a.peers) as f:
            peers_doc = json.load(f)
    except (benchjson.BenchJsonError, OSError, ValueError) as e:
        print("plot: %s" % e)
        return 2
    cases, series = speedups(hk_doc, peers_doc)
    if not cases:
        print("plot: no case has both an hk time and an eager time")
        return 2
    title = a.title or "hk vs PyTorch peers: hk on %s (%s)\npeers: torch %s on %s" % (
        hk_doc.get("device", {}).get("name", "?"), (hk_doc.get("date") or "")[:10],
        peers_doc.get("torch", "?"), peers_doc.get("device", "?"))
    print(table(cases, series))
    plot(cases, series, a.out, title)
    print("plot: wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
