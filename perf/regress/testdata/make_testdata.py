#!/usr/bin/env python3
"""Derives the comparator's test inputs from host_baseline.json, a real hk_bench_host run
(cases 2, 4, 9; 5 repetitions; recorded with run.py on a shared 2-core development VM, hence its
large spreads). Deterministic; rerun after re-recording the baseline:

  host_unchanged.json  the same repetitions in another order: every change is 0
  host_noise.json      every case slower by 60% of its own observed spread (case 2 +27%,
                       case 4 +15%, case 9 +21%): inside the noise, but beyond the 5% floor
  host_slowed.json     case 4 30% slower (all its repetitions x 1.30), the others unchanged
"""
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import benchjson  # noqa: E402


def derive(base, scale_of_key, reorder=False, date=None):
    doc = copy.deepcopy(base)
    doc["date"] = date or doc["date"]
    doc["build"] = dict(doc["build"], note="derived by testdata/make_testdata.py")
    benches = doc["google_benchmark"]["benchmarks"]
    for b in benches:
        if b.get("run_type") == "aggregate":
            continue
        f = scale_of_key(benchjson.key_of(b["run_name"]))
        b["real_time"] *= f
        b["cpu_time"] *= f
    # Aggregates are not re-derived: the comparator reads the repetitions.
    doc["google_benchmark"]["benchmarks"] = [b for b in benches if b.get("run_type") != "aggregate"]
    if reorder:
        doc["google_benchmark"]["benchmarks"].reverse()
    return doc


def main():
    base = benchjson.load(os.path.join(HERE, "host_baseline.json"))
    spread = {k: benchjson.summary(s)[1] for k, s in benchjson.samples(base).items()}
    out = {
        "host_unchanged.json": derive(base, lambda k: 1.0, reorder=True, date="2026-11-29T14:00:00+00:00"),
        "host_noise.json": derive(base, lambda k: 1.0 + 0.6 * spread[k], date="2026-11-29T14:10:00+00:00"),
        "host_slowed.json": derive(base, lambda k: 1.30 if k.startswith("case4/") else 1.0,
                                   date="2026-11-29T14:20:00+00:00"),
    }
    for name, doc in out.items():
        with open(os.path.join(HERE, name), "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", name)


if __name__ == "__main__":
    main()
