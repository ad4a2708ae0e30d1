#!/usr/bin/env python3
"""Tests of the performance-regression tools. One ctest entry per mode:

  test_regress.py compare             comparator verdicts and exit codes on recorded/derived JSON
  test_regress.py runner BENCH_HOST   run.py end to end with the real hk_bench_host (case 2)
  test_regress.py plot                plot.py numbers and PNG (exit 77 without matplotlib)

testdata/host_baseline.json and testdata/peers_cpu.json are real recordings (hk_bench_host and
perf/peers.py on the development VM); the host_*.json variants are derived from the first by
testdata/make_testdata.py; the CUDA-named documents below are constructed in this file.
Each check prints one line; exit 0 when all pass.
"""
import contextlib
import copy
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "testdata")
sys.path.insert(0, HERE)
import benchjson  # noqa: E402
import compare  # noqa: E402
import run  # noqa: E402

results = []


def check(ok, name, detail=""):
    results.append((bool(ok), name, "" if ok else detail))


def report():
    for ok, name, detail in results:
        print(("%-4s %s  %s" % ("ok" if ok else "FAIL", name, detail)).rstrip())
    failed = sum(1 for ok, _, _ in results if not ok)
    print("%s: %d check(s), %d failed" % ("FAIL" if failed else "PASS", len(results), failed))
    return 1 if failed else 0


def run_compare(args):
    """compare.main(args) -> (exit status, printed text)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = compare.main(args)
    return rc, buf.getvalue()


def verdicts(text):
    """{benchmark key: verdict} from compare's table."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+/\S+)\s+.*\s(ok|REGRESSION|faster|missing|new|ERROR)\b", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def write(tmp, name, doc):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def gb_entry(name, ms, rep, reps, **extra):
    e = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": reps,
         "repetition_index": rep, "threads": 1, "iterations": 1, "real_time": ms, "cpu_time": ms,
         "time_unit": "ms"}
    e.update(extra)
    return e


def cuda_doc(times, slug="cuda-nvidia-h200-fast", label="NVIDIA H200 (sm_90, 132 SMs)"):
    """A constructed hk_bench_cuda run: {case: [ms per repetition]}."""
    benches = []
    for case, reps in times.items():
        name = "forward/case:%d/B:64/S:128/D:128/H:4/fast/iterations:1/manual_time" % case
        benches += [gb_entry(name, ms, i, len(reps), label=label, TFLOPs=1.0) for i, ms in enumerate(reps)]
    return {"format": "hk-perf-run", "version": 1, "slug": slug, "precision": "fast",
            "device": {"kind": "cuda", "name": "NVIDIA H200"}, "build": {"git": "0" * 40},
            "google_benchmark": {"context": {}, "benchmarks": benches}}


def test_compare():
    base = os.path.join(DATA, "host_baseline.json")
    rc, out = run_compare([os.path.join(DATA, "host_unchanged.json"), "--baseline", base])
    check(rc == 0 and set(verdicts(out).values()) == {"ok"}, "unchanged run passes (exit 0, all ok)", out)
    rc, out = run_compare([os.path.join(DATA, "host_noise.json"), "--baseline", base])
    check(rc == 0 and set(verdicts(out).values()) == {"ok"}, "run slower inside its observed noise passes", out)
    rc0, out0 = run_compare([os.path.join(DATA, "host_noise.json"), "--baseline", base, "--k", "0"])
    check(rc0 == 1 and "REGRESSION" in verdicts(out0).values(),
          "same run with the floor alone (k=0) fails: the noise term is what lets it pass", out0)
    rc, out = run_compare([os.path.join(DATA, "host_slowed.json"), "--baseline", base])
    v = verdicts(out)
    check(rc == 1, "run with case 4 slowed 30% exits 1", "exit %d" % rc)
    check([k for k, x in v.items() if x == "REGRESSION"] == ["case4/B64/S128/D64/H4/F64/L4/causal"],
          "only case 4 is flagged REGRESSION, with its change in the table",
          out if "+30.0%" not in out else str(v))
    check("summary: 3 compared, 1 regression(s)" in out and "-> FAIL" in out, "summary line names the regression", out)

    with tempfile.TemporaryDirectory() as tmp:
        # Quiet device (1% spread): the 5% floor rules; 6% is a regression, 4% is not.
        reps = [1.00, 1.005, 1.01, 0.995, 1.0]
        b = write(tmp, "b.json", cuda_doc({1: reps, 2: [2 * x for x in reps]}))
        r6 = write(tmp, "r6.json", cuda_doc({1: [1.06 * x for x in reps], 2: [2.08 * x for x in reps]}))
        rc, out = run_compare([r6, "--baseline", b])
        v = verdicts(out)
        check(rc == 1 and v.get("forward/case:1/B:64/S:128/D:128/H:4/fast") == "REGRESSION"
              and v.get("forward/case:2/B:64/S:128/D:128/H:4/fast") == "ok",
              "quiet device: +6% is a regression, +4% is not (floor 5%)", out)
        check("iterations:1" not in out and "manual_time" not in out, "CUDA benchmark keys lose /iterations:1/manual_time", out)
        check(benchjson.case_of("forward/case:12/B:128/S:128/D:256/H:8/fast") == 12
              and benchjson.case_of("case6/B64_of_10000/S128/D128/H4/F128/L4/causal") == 6
              and benchjson.precision_of("forward/case:1/B:64/S:128/D:128/H:4/fp32") == "fp32",
              "case number and precision read from both suites' names")

        fast = write(tmp, "fast.json", cuda_doc({1: [0.5 * x for x in reps], 2: [2 * x for x in reps]}))
        rc, out = run_compare([fast, "--baseline", b])
        check(rc == 0 and verdicts(out).get("forward/case:1/B:64/S:128/D:128/H:4/fast") == "faster"
              and "--update-baseline" in out, "2x faster: verdict faster, exit 0, baseline update suggested", out)

        missing = write(tmp, "missing.json", cuda_doc({1: reps}))
        rc, out = run_compare([missing, "--baseline", b])
        check(rc == 1 and verdicts(out).get("forward/case:2/B:64/S:128/D:128/H:4/fast") == "missing",
              "a benchmark absent from the run fails as missing", out)
        rc, _ = run_compare([missing, "--baseline", b, "--allow-missing"])
        check(rc == 0, "--allow-missing accepts it", "exit %d" % rc)
        newer = write(tmp, "new.json", cuda_doc({1: reps, 2: [2 * x for x in reps], 3: reps}))
        rc, out = run_compare([newer, "--baseline", b])
        check(rc == 0 and verdicts(out).get("forward/case:3/B:64/S:128/D:128/H:4/fast") == "new",
              "a benchmark the baseline lacks is listed as new, exit 0", out)

        doc = cuda_doc({1: reps, 2: [2 * x for x in reps]})
        doc["google_benchmark"]["benchmarks"][5].update(error_occurred=True, error_message="out of memory")
        err = write(tmp, "err.json", doc)
        rc, out = run_compare([err, "--baseline", b])
        check(rc == 1 and verdicts(out).get("forward/case:2/B:64/S:128/D:128/H:4/fast") == "ERROR"
              and "out of memory" in out, "a benchmark that errored fails with its message", out)

        other = write(tmp, "other.json", cuda_doc({1: reps, 2: reps}, slug="cuda-nvidia-a100-sxm4-80gb-fast"))
        rc, out = run_compare([other, "--baseline", b])
        check(rc == 2 and "slug" in out, "a baseline of another device is refused (exit 2)", out)
        rc, _ = run_compare([other, "--baseline", b, "--force"])
        check(rc in (0, 1), "--force compares across devices", "exit %d" % rc)
        rc, out = run_compare([b, "--baseline-dir", os.path.join(tmp, "none")])
        check(rc == 3 and "no baseline" in out, "no baseline for the device: exit 3 with the command to record one", out)

        one = write(tmp, "one.json", cuda_doc({1: [1.0], 2: [2.0]}))
        rc, out = run_compare([one, "--baseline", one])
        check(rc == 0 and "single repetition: floor only" in out, "single repetitions fall back to the floor", out)

        # --benchmark_report_aggregates_only: median and cv aggregates stand in for repetitions.
        agg = cuda_doc({})
        name = "forward/case:1/B:64/S:128/D:128/H:4/fast/iterations:1/manual_time"
        agg["google_benchmark"]["benchmarks"] = [
            dict(gb_entry(name + "_median", 1.10, 0, 5), run_name=name, run_type="aggregate", aggregate_name="median"),
            dict(gb_entry(name + "_cv", 0.04, 0, 5), run_name=name, run_type="aggregate", aggregate_name="cv"),
        ]
        aggp = write(tmp, "agg.json", agg)
        s = benchjson.summary(benchjson.samples(benchjson.load(aggp))["forward/case:1/B:64/S:128/D:128/H:4/fast"])
        check(abs(s[0] - 1.10) < 1e-12 and abs(s[1] - 0.08) < 1e-12, "aggregates only: median and 2 x cv", str(s))

        bad = os.path.join(tmp, "bad.json")
        open(bad, "w").write("{not json")
        rc, out = run_compare([bad, "--baseline", b])
        check(rc == 2, "unreadable run JSON: exit 2", out)

        # run.py --from-json: wraps a bare Google Benchmark file, names the device from the
        # engine's label, records and compares against a baseline it made.
        bare = write(tmp, "bare.json", cuda_doc({1: reps, 2: [2 * x for x in reps]})["google_benchmark"])
        results_dir, baselines = os.path.join(tmp, "results"), os.path.join(tmp, "baselines")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = run.main(["--from-json", bare, "--kind", "cuda", "--results-dir", results_dir,
                           "--baseline-dir", baselines, "--update-baseline", "--git-hash", "abc123"])
        made = os.path.join(baselines, "cuda-nvidia-h200-fast.json")
        check(rc == 0 and os.path.isfile(made), "run.py --from-json --update-baseline writes baselines/cuda-nvidia-h200-fast.json",
              buf.getvalue())
        if os.path.isfile(made):
            d = benchjson.load(made)
            check(d["device"]["name"] == "NVIDIA H200" and d["build"]["git"] == "abc123" and d["precision"] == "fast"
                  and d["date"], "wrapped run records device, build, precision and date", json.dumps(d)[:300])
            with contextlib.redirect_stdout(io.StringIO()):
                rc = run.main(["--from-json", r6, "--kind", "cuda", "--results-dir", results_dir,
                               "--baseline-dir", baselines, "--compare", "--git-hash", "def456"])
            check(rc == 1, "run.py --compare exits 1 on the +6% run", "exit %d" % rc)
    check(run.slugify("NVIDIA H200") == "nvidia-h200"
          and run.slugify("AMD EPYC 7763 64-Core Processor") == "amd-epyc-7763-64-core-processor",
          "device slugs")


def test_runner(bench):
    """run.py with the real hk_bench_host on case 2, then the comparator on what it recorded."""
    with tempfile.TemporaryDirectory() as tmp:
        results_dir, baselines = os.path.join(tmp, "results"), os.path.join(tmp, "baselines")
        cmd = [sys.executable, os.path.join(HERE, "run.py"), "--bench", bench, "--only", "2", "--repetitions", "3",
               "--results-dir", results_dir, "--baseline-dir", baselines, "--update-baseline",
               "--", "--benchmark_min_time=0.05"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        check(p.returncode == 0, "run.py runs hk_bench_host (case 2, 3 repetitions) and records it", p.stdout + p.stderr)
        files = [os.path.join(dp, f) for dp, _, fs in os.walk(results_dir) for f in fs]
        check(len(files) == 1, "one result file under results/<slug>/", str(files))
        if len(files) != 1:
            return
        doc = benchjson.load(files[0])
        s = benchjson.samples(doc)
        check(list(s) == ["case2/B1/S128/D128/H4/F128/L4/causal"] and len(s[list(s)[0]]["ms"]) == 3,
              "the recording holds case 2 with 3 repetitions", str({k: v["ms"] for k, v in s.items()}))
        check(doc["device"]["kind"] == "host" and doc["device"]["name"] and doc["slug"].startswith("host-")
              and doc["slug"].endswith("-fp32"), "device identity: CPU model, slug host-<cpu>-fp32", str(doc["device"]))
        check(doc["build"].get("build_type") not in (None, "", "unknown") and doc["build"].get("git"),
              "build identity: git commit and build type from the build tree", str(doc["build"]))
        rc, out = run_compare([files[0], "--baseline-dir", baselines])
        check(rc == 0, "the run compared with itself as the baseline passes", out)
        # The same recording against a baseline 4x faster than it: far beyond any noise.
        fast = copy.deepcopy(doc)
        for b in fast["google_benchmark"]["benchmarks"]:
            b["real_time"] /= 4.0
        rc, out = run_compare([files[0], "--baseline", write(tmp, "fast_base.json", fast)])
        check(rc == 1 and "REGRESSION" in out, "against a 4x faster baseline it is a regression", out)


def test_plot():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIP: no matplotlib (Debian: python3-matplotlib)")
        return 77
    import plot

    hk = benchjson.load(os.path.join(DATA, "host_baseline.json"))
    peers = json.load(open(os.path.join(DATA, "peers_cpu.json")))
    cases, series = plot.speedups(hk, peers)
    hk_ms = {benchjson.case_of(k): benchjson.summary(s)[0] for k, s in benchjson.samples(hk).items()}
    eager = {r["case"]: r["eager"]["ms"] for r in peers["cases"]}
    check(cases == [2, 4, 9], "recorded files share cases 2, 4, 9", str(cases))
    check(set(series) == {"hk fp32", "sdpa_eager"}, "series: hk fp32 and sdpa_eager (no compiled peer on CPU)", str(list(series)))
    check(all(abs(series["hk fp32"][c] - eager[c] / hk_ms[c]) < 1e-9 for c in cases),
          "hk speedup = eager ms / hk median ms", str(series.get("hk fp32")))

    constructed_peers = {"cases": [
        {"case": 1, "eager": {"ms": 2.0, "ok": True}, "sdpa_eager": {"ms": 1.0, "ok": True}, "compiled_ms": 0.17},
        {"case": 2, "eager": {"ms": 1.8, "ok": True}, "sdpa_eager": {"ms": 0.9, "ok": False}, "compiled_ms": None},
        {"case": 3, "eager": {"ms": 5.0, "ok": False}, "compiled_ms": 1.0}]}
    cases, series = plot.speedups(cuda_doc({1: [0.1, 0.1, 0.1], 2: [0.2, 0.2, 0.2]}), constructed_peers)
    check(cases == [1, 2] and abs(series["hk fast"][1] - 20.0) < 1e-9 and abs(series["compiled"][1] - 2.0 / 0.17) < 1e-9
          and 2 not in series.get("sdpa_eager", {}) and 3 not in series.get("compiled", {}),
          "CUDA names: hk fast series; failed-accuracy peers and eager are left out", str(series))

    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "speedup.png")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = plot.main(["--hk", os.path.join(DATA, "host_baseline.json"), "--peers",
                            os.path.join(DATA, "peers_cpu.json"), "--out", png])
        text = buf.getvalue()
        ok = rc == 0 and os.path.isfile(png)
        head = open(png, "rb").read(24) if ok else b""
        check(ok and head[:8] == b"\x89PNG\r\n\x1a\n", "plot.py writes a PNG", text)
        if ok:
            w, h = struct.unpack(">II", head[16:24])
            check(w >= 600 and h >= 400, "PNG is %dx%d" % (w, h))
        check(re.search(r"^\s+2\s+%.2fx" % (eager[2] / hk_ms[2]), text, re.M) is not None and "gmean" in text,
              "printed table carries the plotted speedups and geometric means", text)
        rc = plot.main(["--hk", os.path.join(DATA, "host_baseline.json"), "--peers", os.path.join(tmp, "none.json"),
                        "--out", png])
        check(rc == 2, "missing peers file: exit 2")
    return None


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "compare"
    if mode == "compare":
        test_compare()
    elif mode == "runner":
        if len(sys.argv) < 3:
            print("usage: test_regress.py runner PATH/hk_bench_host")
            return 2
        test_runner(sys.argv[2])
    elif mode == "plot":
        if test_plot() == 77:
            return 77
    else:
        print("unknown mode %s" % mode)
        return 2
    return report()


if __name__ == "__main__":
    sys.exit(main())
