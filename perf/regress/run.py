#!/usr/bin/env python3
"""Runs hk's Google Benchmark suite with repetitions and stores the result with what was
measured: the device (GPU name and driver, or CPU model), the build (git commit, dirty tree,
build type), the date, host and command. Optionally compares it with the device's baseline.

  run.py --bench build/perf/cuda/hk_bench_cuda [--repetitions 5] [--only 1,2,6] [--compare]
  run.py --bench build/perf/host/hk_bench_host --filter '^case(2|4)/' --repetitions 3
  run.py --from-json bench_hk.json --kind cuda --update-baseline   (wrap an existing result)

Results go to <results-dir>/<slug>/<UTC date>-<commit>.json, the slug being
<kind>-<device>-<precision> (e.g. cuda-nvidia-h200-fast); the baseline of a device is
perf/regress/baselines/<slug>.json. Arguments after `--` go to the benchmark binary.
Exit: the benchmark's failure (its status), else compare.py's status with --compare, else 0.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import benchjson  # noqa: E402
import compare  # noqa: E402

DEFAULT_PRECISION = {"cuda": "fast", "host": "fp32"}


def slugify(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def output_of(cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_identity(index):
    """name, driver, memory, max SM clock of the GPU the benchmark will use, from nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    target = visible[index] if index < len(visible) and visible[index] else str(index)
    line = output_of(["nvidia-smi", "-i", target, "--query-gpu=name,driver_version,memory.total,clocks.max.sm,uuid",
                      "--format=csv,noheader"])
    if not line:
        return {}
    f = [x.strip() for x in line.split(",")]
    keys = ("name", "driver", "memory", "max_sm_clock", "uuid")
    return dict(zip(keys, f))


def cpu_identity():
    model, count = "", 0
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = model or line.split(":", 1)[1].strip()
                count += 1
    except OSError:
        pass
    return {"name": model or "unknown cpu", "logical_cpus": count or os.cpu_count()}


def find_cmake_cache(binary):
    d = os.path.dirname(os.path.abspath(binary))
    for _ in range(5):
        if os.path.isfile(os.path.join(d, "CMakeCache.txt")):
            return os.path.join(d, "CMakeCache.txt")
        d = os.path.dirname(d)
    return None


def build_identity(binary, args, kind):
    info = {"git": args.git_hash or os.environ.get("HK_GIT_HASH") or "", "dirty": None, "build_type": args.build_type}
    if not info["git"]:
        info["git"] = output_of(["git", "-C", REPO, "rev-parse", "HEAD"]) or "unknown"
        if info["git"] != "unknown":
            info["dirty"] = bool(output_of(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"]))
    cache = find_cmake_cache(binary) if binary else None
    if cache:
        wanted = {"CMAKE_BUILD_TYPE": "build_type", "CMAKE_CXX_COMPILER": "cxx_compiler"}
        wanted.update({"HK_CUDA_ARCHITECTURES": "cuda_architectures"} if kind == "cuda" else
                      {"HK_KOKKOS_HOST_ARCH": "host_arch"})
        for line in open(cache):
            m = re.match(r"(\w+):\w+=(.*)", line)
            if m and m.group(1) in wanted and not info.get(wanted[m.group(1)]):
                info[wanted[m.group(1)]] = m.group(2)
        info["cmake_cache"] = cache
    info["build_type"] = info.get("build_type") or "unknown"
    return info


def bench_command(args, kind, out_json):
    cmd = [args.bench]
    if kind == "cuda":
        cmd += ["--cases", args.cases, "--precision", args.precision]
        if args.only:
            cmd += ["--only", args.only]
    else:
        cmd += ["--hk_cases=" + args.cases, "--hk_precision=" + args.precision]
    flt = args.filter
    if kind == "host" and args.only:
        flt = "^case(%s)/" % "|".join(c.strip() for c in args.only.split(","))
    if flt:
        cmd.append("--benchmark_filter=" + flt)
    cmd += ["--benchmark_repetitions=%d" % args.repetitions,
            # Repetitions of different benchmarks interleaved: slow drift (clocks, heat, a
            # neighbour's job) spreads over all cases instead of landing on one.
            "--benchmark_enable_random_interleaving=true",
            "--benchmark_out=" + out_json, "--benchmark_out_format=json", "--benchmark_format=console"]
    return cmd + args.bench_args


def parse_args(argv):
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bench", help="hk_bench_cuda or hk_bench_host")
    src.add_argument("--from-json", help="wrap an existing Google Benchmark JSON instead of running")
    ap.add_argument("--kind", choices=("cuda", "host"), help="default: from the binary's name")
    ap.add_argument("--cases", default=os.path.join(REPO, "data", "cases.csv"))
    ap.add_argument("--precision", help="fast|fp32 (default: fast for cuda, fp32 for host)")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--only", help="comma-separated case numbers")
    ap.add_argument("--filter", help="--benchmark_filter regex")
    ap.add_argument("--device-index", type=int, default=0, help="CUDA device ordinal the benchmark uses")
    ap.add_argument("--device-name", help="override the detected device name")
    ap.add_argument("--git-hash", help="commit of the build (default: $HK_GIT_HASH, else git of this checkout)")
    ap.add_argument("--build-type", help="default: CMAKE_BUILD_TYPE of the binary's build tree")
    ap.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--baseline-dir", default=compare.DEFAULT_BASELINES)
    ap.add_argument("--compare", action="store_true", help="compare with <baseline-dir>/<slug>.json")
    ap.add_argument("--update-baseline", action="store_true", help="make this run the device's baseline")
    ap.add_argument("--floor", type=float, default=0.05)
    ap.add_argument("--k", type=float, default=1.0)
    a = ap.parse_args(argv)
    a.bench_args = extra
    if a.repetitions < 1:
        ap.error("--repetitions must be at least 1")
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    source = args.bench or args.from_json
    kind = args.kind or ("cuda" if "cuda" in os.path.basename(source) else "host" if "host" in os.path.basename(source) else None)
    if kind is None:
        print("run: cannot tell cuda from host for %s: pass --kind" % source)
        return 2
    args.precision = args.precision or DEFAULT_PRECISION[kind]

    rc = 0
    if args.bench:
        if not os.path.isfile(args.cases):
            print("run: no cases file %s (--cases)" % args.cases)
            return 2
        tmp = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
        tmp.close()
        cmd = bench_command(args, kind, tmp.name)
        print("run: " + " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            print("run: %s exited with %d" % (os.path.basename(args.bench), rc))
            if rc == 77:
                print("run: (77: no usable device)")
        try:
            with open(tmp.name) as f:
                gb = json.load(f)
        except (OSError, ValueError):
            gb = None
        os.unlink(tmp.name)
        if gb is None or not gb.get("benchmarks"):
            print("run: the benchmark wrote no results")
            return rc or 1
    else:
        try:
            gb = benchjson.load(args.from_json)["google_benchmark"]
        except benchjson.BenchJsonError as e:
            print("run: %s" % e)
            return 2
        if args.filter:  # as --benchmark_filter would have: keep the matching benchmarks only
            gb = dict(gb, benchmarks=[b for b in gb.get("benchmarks", [])
                                      if re.search(args.filter, b.get("run_name") or b.get("name", ""))])
            if not gb["benchmarks"]:
                print("run: no benchmark of %s matches --filter %s" % (args.from_json, args.filter))
                return 2

    device = {"kind": kind}
    if args.bench:
        device.update(gpu_identity(args.device_index) if kind == "cuda" else cpu_identity())
    labels = [b.get("label") for b in gb["benchmarks"] if b.get("label")]
    if labels:
        device["label"] = labels[0]  # the engine's own description (GPU, SMs / Kokkos backend)
    if args.device_name:
        device["name"] = args.device_name
    if not device.get("name"):
        # No nvidia-smi (or a wrapped file): the engine's label starts with the device name.
        device["name"] = re.split(r"[(,;:]", device.get("label", ""))[0].strip() or "unknown " + kind
    device_slug = slugify(device["name"])
    slug = "%s-%s-%s" % (kind, device_slug, args.precision)

    doc = {
        "format": benchjson.FORMAT, "version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "slug": slug,
        "device": device,
        "precision": args.precision,
        "build": build_identity(args.bench, args, kind),
        "repetitions": args.repetitions if args.bench else None,
        "command": cmd if args.bench else ["(wrapped) " + os.path.abspath(args.from_json)],
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "google_benchmark": gb,
    }
    out_dir = os.path.join(args.results_dir, slug)
    os.makedirs(out_dir, exist_ok=True)
    stamp = doc["date"].replace("-", "").replace(":", "").replace("+0000", "Z")
    out = os.path.join(out_dir, "%s-%s.json" % (stamp, (doc["build"]["git"] or "unknown")[:10]))
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(out + ".tmp", out)
    print("run: wrote %s (%d benchmark entries; device %s; build %s %s)"
          % (out, len(gb["benchmarks"]), device["name"], doc["build"]["git"][:10], doc["build"]["build_type"]))
    if rc != 0:
        return rc

    if args.compare:
        baseline = os.path.join(args.baseline_dir, slug + ".json")
        rc = compare.main([out, "--baseline", baseline, "--floor", str(args.floor), "--k", str(args.k)]) \
            if os.path.exists(baseline) else compare.main([out, "--baseline-dir", args.baseline_dir])
    if args.update_baseline:
        os.makedirs(args.baseline_dir, exist_ok=True)
        dest = os.path.join(args.baseline_dir, slug + ".json")
        shutil.copyfile(out, dest)
        print("run: %s is now the baseline of %s" % (dest, slug))
    return rc


if __name__ == "__main__":
    sys.exit(main())
