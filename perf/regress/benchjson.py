"""Reading hk's benchmark results: Google Benchmark JSON, bare or wrapped by run.py.

A wrapped run ("format": "hk-perf-run") holds the identity of what was measured next to the
Google Benchmark output:
  {"format": "hk-perf-run", "version": 1, "date": ISO-8601 UTC, "host": ..., "slug": ...,
   "device": {"kind": "cuda"|"host", "name": ..., ...}, "precision": ...,
   "build": {"git": ..., "dirty": bool, "build_type": ..., ...}, "command": [...],
   "google_benchmark": {"context": {...}, "benchmarks": [...]}}

Each benchmark is keyed by its run name without the decorations Google Benchmark appends
(/manual_time, /iterations:N, /repeats:N), e.g. "forward/case:1/B:64/S:128/D:128/H:4/fast"
(hk_bench_cuda) or "case1/B64/S128/D128/H4/F128/L4/causal" (hk_bench_host).
"""
import json
import re
import statistics

FORMAT = "hk-perf-run"
_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
_DECORATION = re.compile(r"^(manual_time|real_time|process_time|iterations:\d+|repeats:\d+)$")


class BenchJsonError(Exception):
    pass


def load(path):
    """Returns the wrapped document (a bare Google Benchmark file gets an empty identity)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise BenchJsonError("%s: %s" % (path, e))
    if not isinstance(doc, dict):
        raise BenchJsonError("%s: not a JSON object" % path)
    if doc.get("format") == FORMAT:
        if not isinstance(doc.get("google_benchmark", {}).get("benchmarks"), list):
            raise BenchJsonError("%s: no google_benchmark.benchmarks list" % path)
        return doc
    if isinstance(doc.get("benchmarks"), list):
        return {"format": FORMAT, "version": 1, "device": {}, "build": {}, "google_benchmark": doc}
    raise BenchJsonError("%s: neither a Google Benchmark JSON nor an %s file" % (path, FORMAT))


def key_of(name):
    return "/".join(p for p in name.split("/") if not _DECORATION.match(p))


def case_of(key):
    """The case number of cases.csv a benchmark key names ("case:3" or "case3"), or None."""
    m = re.search(r"(?:^|/)case:?(\d+)(?:/|$)", key)
    return int(m.group(1)) if m else None


def precision_of(key):
    for p in ("fast", "fp32", "reference"):
        if key.endswith("/" + p) or ("/" + p + "/") in key:
            return p
    return None


def samples(doc):
    """key -> {"ms": [one time per repetition], "median_agg": ms or None, "cv": or None,
    "error": message or None, "counters": {...}, "label": ...}, in the file's order."""
    out = {}
    for b in doc["google_benchmark"]["benchmarks"]:
        name = b.get("run_name") or b.get("name", "")
        if b.get("run_type") == "aggregate":
            name = b.get("run_name") or re.sub(r"_(mean|median|stddev|cv)$", "", name)
        key = key_of(name)
        s = out.setdefault(key, {"ms": [], "median_agg": None, "cv": None, "error": None, "counters": {},
                                 "label": b.get("label", "")})
        if b.get("error_occurred"):
            s["error"] = b.get("error_message", "error")
            continue
        unit = _UNIT_MS.get(b.get("time_unit", "ns"))
        if unit is None:
            raise BenchJsonError("%s: unknown time_unit %r" % (key, b.get("time_unit")))
        if b.get("run_type") == "aggregate":
            agg = b.get("aggregate_name")
            if agg == "median":
                s["median_agg"] = b["real_time"] * unit
            elif agg == "cv":
                s["cv"] = b["real_time"]  # Google Benchmark stores cv as a fraction in real_time
            continue
        s["ms"].append(b["real_time"] * unit)
        if not s["counters"]:
            s["counters"] = {k: v for k, v in b.items() if isinstance(v, (int, float)) and k not in (
                "family_index", "per_family_instance_index", "repetitions", "repetition_index", "threads",
                "iterations", "real_time", "cpu_time")}
    return out


def summary(s):
    """(median ms, relative spread or None, repetitions) of one key's samples.

    spread = (max - min) / median over the repetitions: the width of the noise this run showed.
    With aggregates only (--benchmark_report_aggregates_only), 2 * cv stands in for it.
    """
    if s["ms"]:
        med = statistics.median(s["ms"])
        n = len(s["ms"])
        spread = (max(s["ms"]) - min(s["ms"])) / med if n >= 2 and med > 0 else None
        return med, spread, n
    if s["median_agg"] is not None:
        return s["median_agg"], (2.0 * s["cv"] if s["cv"] is not None else None), 0
    return None, None, 0
