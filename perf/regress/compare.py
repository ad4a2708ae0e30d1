#!/usr/bin/env python3
"""Compares a benchmark run with a baseline of the same device and says whether it regressed.

Rule, per benchmark (repetitions of Google Benchmark; each hk_bench_cuda repetition is itself
the median of hundreds of CUDA-event-timed forwards):
  change    = median(run) / median(baseline) - 1
  spread    = the larger of the two runs' (max - min) / median over their repetitions
  threshold = max(floor, k * spread)              (defaults: floor 5%, k 1.0)
  REGRESSION when change > threshold, "faster" when change < -threshold, else ok.
So a quiet device is held to the floor, and a noisy one (a shared CPU) must slow down by more
than the noise it showed before a change counts. A benchmark that errored, or that the baseline
has and the run lacks, also fails the comparison; one the baseline lacks is listed as new.

Usage: compare.py RUN.json [--baseline FILE | --baseline-dir DIR] [--floor 0.05] [--k 1.0]
                  [--allow-missing] [--markdown] [--force]
Exit: 0 no regression, 1 regression / error / missing benchmark, 2 bad input or a baseline
from another device or precision (unless --force), 3 no baseline for this device.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchjson  # noqa: E402

DEFAULT_BASELINES = os.path.join(HERE, "baselines")


def compare(base_doc, run_doc, floor=0.05, k=1.0):
    """Rows of the comparison, in the baseline's order then new benchmarks."""
    base, run = benchjson.samples(base_doc), benchjson.samples(run_doc)
    rows = []
    for key in list(base) + [k_ for k_ in run if k_ not in base]:
        b, r = base.get(key), run.get(key)
        row = {"key": key, "base_ms": None, "run_ms": None, "change": None, "spread": None,
               "threshold": None, "reps": (0, 0), "verdict": "ok", "note": ""}
        if b is not None:
            row["base_ms"], b_spread, nb = benchjson.summary(b)
        if r is not None:
            row["run_ms"], r_spread, nr = benchjson.summary(r)
        if r is not None and r["error"]:
            row.update(verdict="ERROR", note=r["error"])
        elif b is None:
            row["verdict"] = "new"
        elif r is None or row["run_ms"] is None:
            row["verdict"] = "missing"
        elif row["base_ms"] is None:
            row.update(verdict="new", note="baseline has no time")
        else:
            row["reps"] = (nb, nr)
            spreads = [s for s in (b_spread, r_spread) if s is not None]
            row["spread"] = max(spreads) if spreads else None
            row["threshold"] = max(floor, k * row["spread"]) if spreads else floor
            if not spreads:
                row["note"] = "single repetition: floor only"
            row["change"] = row["run_ms"] / row["base_ms"] - 1.0
            if row["change"] > row["threshold"]:
                row["verdict"] = "REGRESSION"
            elif row["change"] < -row["threshold"]:
                row["verdict"] = "faster"
        rows.append(row)
    return rows


def identity(doc):
    d, b = doc.get("device", {}), doc.get("build", {})
    parts = [d.get("name") or "unknown device", doc.get("precision") or "",
             (b.get("git") or "")[:10] + ("+dirty" if b.get("dirty") else ""), b.get("build_type") or "",
             doc.get("date") or ""]
    return ", ".join(p for p in parts if p)


def render(rows, base_doc, run_doc, floor, k, markdown=False):
    pct = lambda v: "-" if v is None else "%+.1f%%" % (100 * v)
    pct0 = lambda v: "-" if v is None else "%.1f%%" % (100 * v)
    ms = lambda v: "-" if v is None else "%.4f" % v
    head = ("benchmark", "baseline ms", "run ms", "change", "spread", "threshold", "reps", "verdict")
    body = [(r["key"], ms(r["base_ms"]), ms(r["run_ms"]), pct(r["change"]), pct0(r["spread"]),
             pct0(r["threshold"]), "%d/%d" % r["reps"], r["verdict"] + (" (%s)" % r["note"] if r["note"] else ""))
            for r in rows]
    lines = ["run:      " + identity(run_doc), "baseline: " + identity(base_doc),
             "rule:     REGRESSION when the run's median is slower than the baseline's by more than "
             "max(%.1f%%, %.2f x spread); spread = (max - min) / median of the repetitions, larger of "
             "the two" % (100 * floor, k), ""]
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        lines += ["| " + " | ".join(row) + " |" for row in body]
    else:
        w = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
        fmt = lambda row: "  ".join(v.ljust(w[i]) if i in (0, 7) else v.rjust(w[i]) for i, v in enumerate(row)).rstrip()
        lines.append(fmt(head))
        lines.append("-" * len(fmt(head)))
        lines += [fmt(row) for row in body]
    return "\n".join(lines)


def verdict_counts(rows):
    counts = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return counts


def baseline_path(run_doc, baseline_dir):
    slug = run_doc.get("slug")
    return os.path.join(baseline_dir, slug + ".json") if slug else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="run JSON (run.py output, or bare Google Benchmark JSON)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--baseline", help="baseline JSON (default: <baseline-dir>/<run's slug>.json)")
    g.add_argument("--baseline-dir", default=DEFAULT_BASELINES)
    ap.add_argument("--floor", type=float, default=0.05, help="smallest threshold, a fraction (default 0.05)")
    ap.add_argument("--k", type=float, default=1.0, help="threshold = max(floor, k * spread) (default 1.0)")
    ap.add_argument("--allow-missing", action="store_true", help="a benchmark absent from the run is not a failure")
    ap.add_argument("--markdown", action="store_true", help="a markdown table")
    ap.add_argument("--force", action="store_true", help="compare even across devices or precisions")
    a = ap.parse_args(argv)
    try:
        run_doc = benchjson.load(a.run)
        path = a.baseline or baseline_path(run_doc, a.baseline_dir)
        if path is None:
            print("compare: %s carries no device slug (a bare Google Benchmark file): pass --baseline" % a.run)
            return 2
        if not os.path.exists(path):
            print("compare: no baseline %s for this device; record one with "
                  "`run.py --from-json %s --update-baseline`" % (path, a.run))
            return 3
        base_doc = benchjson.load(path)
    except benchjson.BenchJsonError as e:
        print("compare: %s" % e)
        return 2
    for field in ("slug", "precision"):
        rv, bv = run_doc.get(field), base_doc.get(field)
        if rv and bv and rv != bv and not a.force:
            print("compare: the run's %s is %r but the baseline's is %r (--force to compare anyway)" % (field, rv, bv))
            return 2
    rows = compare(base_doc, run_doc, a.floor, a.k)
    print(render(rows, base_doc, run_doc, a.floor, a.k, a.markdown))
    c = verdict_counts(rows)
    failing = c.get("REGRESSION", 0) + c.get("ERROR", 0) + (0 if a.allow_missing else c.get("missing", 0))
    compared = sum(1 for r in rows if r["change"] is not None)
    print("\nsummary: %d compared, %d regression(s), %d error(s), %d faster, %d missing, %d new -> %s"
          % (compared, c.get("REGRESSION", 0), c.get("ERROR", 0), c.get("faster", 0), c.get("missing", 0),
             c.get("new", 0), "FAIL" if failing else "PASS"))
    if c.get("faster") and not failing:
        print("(faster beyond noise: consider `run.py --from-json %s --update-baseline`)" % a.run)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
