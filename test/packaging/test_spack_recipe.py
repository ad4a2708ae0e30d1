#!/usr/bin/env python3
"""Checks the Spack recipe (spack/packages/hk/package.py) and environment (spack.yaml) against
the CMake build they drive, without Spack: the recipe is imported through spack_stub.py, a test
harness that records directives (see its docstring for what it does not model).

Checks: the variants; cmake_args() for several specs maps each variant onto an option the
top-level CMakeLists.txt really declares (and with a value its logic compares against); every
other -D it passes is declared somewhere in the CMake sources or is a find-module hint; every
find_package() in the CMake sources has a dependency in the recipe; the cuda_arch conflicts; an
option announced but not yet in CMake (HK_ENABLE_MPI) is refused by a conflict until it exists;
spack.yaml parses, names ./spack, hk with +cuda cuda_arch=80,90 and the dependencies, develops
this checkout, and its hk spec hits no conflict. Sensitivity checks feed each rule a broken
input and require it to complain.

Usage: test_spack_recipe.py [repository root]   (exit 0: all checks pass)
"""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spack_stub  # noqa: E402

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", ".."))
RECIPE = os.path.join(ROOT, "spack", "packages", "hk", "package.py")

# Options each variant maps onto (the contract between recipe and CMakeLists.txt).
VARIANT_OPTIONS = {"cuda": "HK_ENABLE_CUDA", "cuda_arch": "HK_CUDA_ARCHITECTURES", "mpi": "HK_ENABLE_MPI",
                   "tests": "HK_BUILD_TESTS", "perf": "HK_BUILD_PERF"}
# Options agreed with other work but not yet declared: allowed only while the recipe refuses them.
ANNOUNCED_OPTIONS = {"HK_ENABLE_MPI": "+mpi"}
# -D names that are not hk's own options: find-module / package hints and CMake's variables.
HINTS = {"HDF5_ROOT": "FindHDF5 hint", "CUDAToolkit_ROOT": "FindCUDAToolkit hint",
         "CMAKE_CUDA_COMPILER": "CMake's CUDA compiler"}
# CMake package names -> Spack package names (None: provided by the system or another dependency).
CMAKE_TO_SPACK = {"HDF5": "hdf5", "CLI11": "cli11", "fmt": "fmt", "GTest": "googletest",
                  "benchmark": "benchmark", "CUDAToolkit": "cuda", "Kokkos": "kokkos",
                  "KokkosKernels": "kokkos-kernels", "MPI": "mpi", "nlohmann_json": "nlohmann-json",
                  "spdlog": "spdlog", "Threads": None,
                  "BLAS": None}  # only on HkKokkos.cmake's system-Kokkos path, which Kokkos_ROOT skips
ENV_REQUIRED = ["cuda", "cudnn", "hdf5", "kokkos", "kokkos-kernels", "googletest", "benchmark", "cli11",
                "fmt", "nlohmann-json"]

results = []


def check(ok, name, detail=""):
    results.append((bool(ok), name, detail))
    return bool(ok)


# ---- CMake sources -------------------------------------------------------------------------------


def strip_cmake_comments(text):
    out = []
    for line in text.splitlines():
        in_quote = False
        for i, c in enumerate(line):
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                in_quote = not in_quote
            elif c == "#" and not in_quote:
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def cmake_files(root):
    skip = {".git", "consumer", "spack"}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirs[:] = [d for d in dirs if d not in skip and not (rel == "." and (d.startswith("build") or d == "stage"))]
        for f in files:
            if f == "CMakeLists.txt" or f.endswith(".cmake"):
                yield os.path.join(dirpath, f)


def declared_options(text):
    """Names made user-settable: option(), set(... CACHE ...), find_library/path/program."""
    names = set(re.findall(r"\boption\s*\(\s*(\w+)", text))
    names |= set(re.findall(r"\bset\s*\(\s*(\w+)\s+[^)]*?\bCACHE\b", text, re.S))
    names |= set(re.findall(r"\bfind_(?:library|path|program|file)\s*\(\s*(\w+)", text))
    return names


def option_values(text, name):
    """String values the CMake logic compares `name` against (e.g. ON/OFF for HK_ENABLE_CUDA)."""
    return set(re.findall(r"\b%s\s+STREQUAL\s+\"(\w+)\"" % re.escape(name), text))


def parse_defines(args):
    out = {}
    for a in args:
        if not a:
            continue
        m = re.fullmatch(r"-D([\w.-]+):(\w+)=(.*)", a, re.S)
        if not m:
            raise ValueError("not a -DNAME:TYPE=VALUE argument: %r" % a)
        out[m.group(1)] = (m.group(2), m.group(3))
    return out


def undeclared(defines, top_options, tree_options, hkkokkos_text):
    """-D names that nothing in the CMake sources reads. Returns [(name, why)]."""
    bad = []
    for name in defines:
        if name in VARIANT_OPTIONS.values():
            if name not in top_options and name not in ANNOUNCED_OPTIONS:
                bad.append((name, "variant option not declared in the top-level CMakeLists.txt"))
        elif name.startswith("HK_"):
            if name not in tree_options:
                bad.append((name, "not declared in any CMake file"))
        elif name in ("Kokkos_ROOT", "KokkosKernels_ROOT"):
            if not re.search(r"\b%s\b" % name.split("_")[0], hkkokkos_text) or "Kokkos_ROOT" not in hkkokkos_text:
                bad.append((name, "cmake/HkKokkos.cmake does not read it"))
        elif name not in HINTS:
            bad.append((name, "unknown -D (neither an hk option nor a known hint)"))
    return bad


def pending_rule(top_options, recipe_conflicts):
    """An announced option must be refused by a conflict while CMake lacks it, and the conflict
    must go once CMake has it. Returns [problem]."""
    problems = []
    for option, value in ANNOUNCED_OPTIONS.items():
        refused = any(c["args"] and c["args"][0] == value and not c["when"] for c in recipe_conflicts)
        if option not in top_options and not refused:
            problems.append("%s is not in CMakeLists.txt yet but the recipe accepts %s" % (option, value))
        if option in top_options and refused:
            problems.append("%s now exists in CMakeLists.txt: drop the recipe's conflicts(%r)" % (option, value))
    return problems


# ---- the recipe ------------------------------------------------------------------------------------


def make_prefixes(tmp):
    """Dependency prefixes, cuDNN with a library file for find_libraries to find."""
    pre = {n: os.path.join(tmp, n) for n in ("kokkos", "kokkos-kernels", "hdf5", "cuda", "cudnn", "mpi")}
    os.makedirs(os.path.join(pre["cudnn"], "lib"))
    open(os.path.join(pre["cudnn"], "lib", "libcudnn.so"), "w").close()
    return pre


def make_spec(variants, pre, kokkos_cuda=False, cudnn_prefix=None):
    deps = {n: spack_stub.Spec(n, prefix=p) for n, p in pre.items()}
    deps["kokkos"] = spack_stub.Spec("kokkos", {"cuda": kokkos_cuda}, prefix=pre["kokkos"])
    if cudnn_prefix:
        deps["cudnn"] = spack_stub.Spec("cudnn", prefix=cudnn_prefix)
    return spack_stub.Spec("hk", variants, deps)


def active_conflicts(spec, conflicts_list):
    hits = []
    for c in conflicts_list:
        cond = c["args"][0]
        if spec.satisfies(cond) and (not c["when"] or spec.satisfies(c["when"])):
            hits.append(cond)
    return hits


def spec_tokens(spec_string):
    """'hk@=main +cuda cuda_arch=80,90 ~mpi' -> (name, {variant: value})."""
    parts = spec_string.split()
    name = re.match(r"[\w-]+", parts[0]).group()
    variants = {}
    for tok in re.findall(r"[+~][\w-]+|[\w-]+=[\w.,-]+", " ".join([parts[0][len(name):]] + parts[1:])):
        if tok[0] in "+~":
            variants[tok[1:]] = tok[0] == "+"
        else:
            k, v = tok.split("=", 1)
            variants[k] = tuple(v.split(",")) if "," in v or k == "cuda_arch" else v
    return name, variants


def main():
    top_text = strip_cmake_comments(open(os.path.join(ROOT, "CMakeLists.txt")).read())
    top_options = declared_options(top_text)
    tree_text = "\n".join(strip_cmake_comments(open(f).read()) for f in cmake_files(ROOT))
    tree_options = declared_options(tree_text)
    hkkokkos_text = open(os.path.join(ROOT, "cmake", "HkKokkos.cmake")).read()

    # The recipe imports under both layouts of Spack's package API.
    loaded = {}
    for with_repo in (False, True):
        try:
            loaded[with_repo] = spack_stub.load_recipe(RECIPE, with_repo)
            check(True, "recipe imports (%s)" % ("spack_repo.builtin build systems, Spack >= 1.0" if with_repo
                                                  else "spack.package build systems, Spack 0.x"))
        except Exception as e:  # report, keep checking with what loaded
            check(False, "recipe imports (with_spack_repo=%s)" % with_repo, "%s: %s" % (type(e).__name__, e))
    if not loaded:
        return report()
    module, recipe, base = loaded.get(True) or loaded.get(False)
    Hk = module.Hk
    check(Hk.__mro__[1].__name__ == "CMakePackage" and any(b.__name__ == "CudaPackage" for b in Hk.__mro__),
          "Hk derives from CMakePackage and CudaPackage")

    variants = {d["args"][0]: d for d in base + recipe if d["kind"] == "variant"}
    for name, default in (("cuda", False), ("mpi", False), ("tests", False), ("perf", False)):
        v = variants.get(name)
        check(v is not None and v["kwargs"].get("default") is default, "variant %s (default %s)" % (name, default))
    check("cuda_arch" in variants and variants["cuda_arch"]["when"] == "+cuda", "variant cuda_arch (when +cuda, from CudaPackage)")
    versions = [d["args"][0] for d in recipe if d["kind"] == "version"]
    check("main" in versions, "version main", "versions %s" % versions)
    check(getattr(Hk, "git", "") == "file://" + ROOT, "git fetches this checkout", getattr(Hk, "git", None))

    deps = {re.match(r"[\w-]+", d["args"][0]).group(): d for d in recipe if d["kind"] == "depends_on"}
    conflicts_list = [d for d in recipe if d["kind"] == "conflicts"]

    with tempfile.TemporaryDirectory() as tmp:
        pre = make_prefixes(tmp)
        cases = [
            ("~cuda ~mpi ~tests ~perf", {"cuda": False, "mpi": False, "tests": False, "perf": False, "build_type": "Release"}),
            ("+cuda cuda_arch=80,90 +tests +perf", {"cuda": True, "cuda_arch": ("80", "90"), "mpi": False,
                                                    "tests": True, "perf": True, "build_type": "Release"}),
            ("+cuda cuda_arch=90 ~tests", {"cuda": True, "cuda_arch": ("90",), "mpi": False, "tests": False,
                                           "perf": False, "build_type": "Release"}),
        ]
        cuda_values = option_values(top_text, "HK_ENABLE_CUDA")
        for label, var in cases:
            spec = make_spec(var, pre)
            pkg = Hk(spec)
            try:
                d = parse_defines(pkg.cmake_args())
            except Exception as e:
                check(False, "cmake_args() for %s" % label, "%s: %s" % (type(e).__name__, e))
                continue
            want = {
                "HK_ENABLE_CUDA": ("STRING", "ON" if var["cuda"] else "OFF"),
                "HK_BUILD_TESTS": ("BOOL", "ON" if var["tests"] else "OFF"),
                "HK_BUILD_PERF": ("BOOL", "ON" if var["perf"] else "OFF"),
                "HK_ENABLE_MPI": ("BOOL", "ON" if var["mpi"] else "OFF"),
                "Kokkos_ROOT": ("STRING", pre["kokkos"]),
                "KokkosKernels_ROOT": ("STRING", pre["kokkos-kernels"]),
            }
            if var["cuda"]:
                want["HK_CUDA_ARCHITECTURES"] = ("STRING", ";".join(var["cuda_arch"]))
                want["CMAKE_CUDA_COMPILER"] = ("STRING", os.path.join(pre["cuda"], "bin", "nvcc"))
                want["HK_CUDNN_LIBRARY"] = ("STRING", os.path.join(pre["cudnn"], "lib", "libcudnn.so"))
            wrong = ["%s=%s (want %s)" % (k, d.get(k), v) for k, v in want.items() if d.get(k) != v]
            check(not wrong, "cmake_args() %s: variants map onto options" % label, "; ".join(wrong))
            if not var["cuda"]:
                check("HK_CUDA_ARCHITECTURES" not in d, "cmake_args() %s: no CUDA architectures" % label)
            bad = undeclared(d, top_options, tree_options, hkkokkos_text)
            check(not bad, "cmake_args() %s: every -D is read by the CMake sources" % label,
                  "; ".join("%s: %s" % b for b in bad))
            check(d["HK_ENABLE_CUDA"][1] in cuda_values, "cmake_args() %s: HK_ENABLE_CUDA value is one CMakeLists.txt tests" % label,
                  "%s not in %s" % (d["HK_ENABLE_CUDA"][1], sorted(cuda_values)))
            check(not active_conflicts(spec, conflicts_list), "spec %s hits no conflict" % label,
                  str(active_conflicts(spec, conflicts_list)))

        # Variant options present in the top level (announced ones excepted, see pending_rule).
        missing = [o for o in VARIANT_OPTIONS.values() if o not in top_options and o not in ANNOUNCED_OPTIONS]
        check(not missing, "variant options declared in the top-level CMakeLists.txt", ", ".join(missing))
        problems = pending_rule(top_options, conflicts_list)
        check(not problems, "announced options (%s) refused until CMake declares them" % ", ".join(ANNOUNCED_OPTIONS),
              "; ".join(problems))

        # Conflicts: old architectures, no architecture, a CUDA Kokkos, MPI (until implemented).
        base_var = {"cuda": True, "cuda_arch": ("70",), "mpi": False, "tests": False, "perf": False}
        check(active_conflicts(make_spec(base_var, pre), conflicts_list), "cuda_arch=70 conflicts (sm_80 or newer)")
        check(active_conflicts(make_spec(dict(base_var, cuda_arch=("none",)), pre), conflicts_list), "cuda_arch=none conflicts")
        check(not active_conflicts(make_spec(dict(base_var, cuda_arch=("80", "90a")), pre), conflicts_list),
              "cuda_arch=80,90a accepted")
        check(active_conflicts(make_spec(dict(base_var, cuda_arch=("90",)), pre, kokkos_cuda=True), conflicts_list),
              "^kokkos+cuda conflicts")
        mpi_spec = make_spec(dict(base_var, cuda_arch=("90",), mpi=True), pre)
        if "HK_ENABLE_MPI" in top_options:
            mpi_args = Hk(mpi_spec).cmake_args()
            check(not active_conflicts(mpi_spec, conflicts_list) and
                  any("HK_ENABLE_MPI" in a and a.rstrip().endswith("ON") for a in mpi_args),
                  "+mpi accepted and mapped to HK_ENABLE_MPI=ON", str([a for a in mpi_args if "MPI" in a]))
        else:
            check(active_conflicts(mpi_spec, conflicts_list), "+mpi conflicts while HK_ENABLE_MPI is not implemented")

        # cuDNN missing from its prefix: a clear install error, not a bad path.
        empty = os.path.join(tmp, "cudnn-empty")
        os.makedirs(empty)
        try:
            Hk(make_spec(dict(base_var, cuda_arch=("90",)), pre, cudnn_prefix=empty)).cmake_args()
            check(False, "cuDNN prefix without libcudnn raises InstallError")
        except spack_stub.InstallError:
            check(True, "cuDNN prefix without libcudnn raises InstallError")

    # Every find_package() of the CMake sources is a recipe dependency.
    found = sorted(set(re.findall(r"\bfind_package\s*\(\s*(\w+)", tree_text)) - {"hk"})
    unmapped = [p for p in found if p not in CMAKE_TO_SPACK]
    check(not unmapped, "every find_package() name is known to this test", ", ".join(unmapped))
    lacking = [p for p in found if CMAKE_TO_SPACK.get(p) and CMAKE_TO_SPACK[p] not in deps]
    check(not lacking, "every find_package() has a depends_on (%s)" % ", ".join(found),
          ", ".join("%s -> %s" % (p, CMAKE_TO_SPACK[p]) for p in lacking))
    check("cudnn" in deps and deps["cudnn"]["when"] == "+cuda", "cudnn is a dependency when +cuda")

    check_environment(Hk, recipe, base, deps, conflicts_list)
    sensitivity(top_options, tree_options, hkkokkos_text, top_text, conflicts_list)
    return report()


def check_environment(Hk, recipe, base, deps, conflicts_list):
    try:
        import yaml
    except ImportError:
        check(False, "spack.yaml: python3-yaml is installed", "apt-get install python3-yaml")
        return
    path = os.path.join(ROOT, "spack.yaml")
    try:
        env = yaml.safe_load(open(path))["spack"]
    except Exception as e:
        check(False, "spack.yaml parses", "%s: %s" % (type(e).__name__, e))
        return
    check(True, "spack.yaml parses")
    repos = env.get("repos", [])
    check(repos == ["./spack"] or "./spack" in repos, "spack.yaml repos names ./spack", str(repos))
    repo_dir = os.path.normpath(os.path.join(ROOT, "./spack"))
    try:
        namespace = yaml.safe_load(open(os.path.join(repo_dir, "repo.yaml")))["repo"]["namespace"]
    except Exception as e:
        namespace = None
        check(False, "spack/repo.yaml has a namespace", str(e))
    else:
        check(bool(namespace), "spack/repo.yaml has a namespace", namespace)
    check(os.path.isfile(os.path.join(repo_dir, "packages", "hk", "package.py")), "./spack holds packages/hk/package.py")

    raw_specs = env.get("specs", [])
    odd = [s for s in raw_specs if not isinstance(s, str)]
    check(not odd, "spack.yaml specs are all strings (quote specs holding ': ')", str(odd))
    specs = [s for s in raw_specs if isinstance(s, str)]
    names = {}
    for s in specs:
        name, var = spec_tokens(s)
        names[name] = (s, var)
    check("hk" in names, "spack.yaml specs include hk", str(specs))
    if "hk" in names:
        s, var = names["hk"]
        check(var.get("cuda") is True and set(var.get("cuda_arch", ())) == {"80", "90"},
              "hk spec: +cuda cuda_arch=80,90", s)
        declared = {d["args"][0] for d in base + recipe if d["kind"] == "variant"}
        unknown = [v for v in var if v not in declared]
        check(not unknown, "hk spec: every variant is declared by the recipe", ", ".join(unknown))
        kokkos_var = names.get("kokkos", ("", {}))[1]
        spec = spack_stub.Spec("hk", var, {"kokkos": spack_stub.Spec("kokkos", {"cuda": kokkos_var.get("cuda", False)})})
        hits = active_conflicts(spec, conflicts_list)
        check(not hits, "hk spec (with the environment's kokkos) hits no conflict", str(hits))
    absent = [n for n in ENV_REQUIRED if n not in names]
    check(not absent, "spack.yaml specs name %s" % ", ".join(ENV_REQUIRED), "missing: " + ", ".join(absent))
    recipe_deps = [n for n in deps if n not in ("c", "cxx", "cmake", "ninja", "mpi")]
    not_in_env = [n for n in recipe_deps if n not in names]
    check(not not_in_env, "every library the recipe depends on is a root spec of the environment", ", ".join(not_in_env))
    dev = (env.get("develop") or {}).get("hk") or {}
    dev_path = os.path.normpath(os.path.join(ROOT, dev.get("path", "<none>")))
    check(dev_path == ROOT, "spack.yaml develops hk from this checkout", "%s -> %s" % (dev.get("path"), dev_path))
    dev_version = re.search(r"@=?([\w.]+)", dev.get("spec", ""))
    versions = [d["args"][0] for d in recipe if d["kind"] == "version"]
    check(dev_version and dev_version.group(1) in versions, "develop spec names a version the recipe has", dev.get("spec"))


def sensitivity(top_options, tree_options, hkkokkos_text, top_text, conflicts_list):
    """Each rule above, fed a broken input, must complain."""
    bad = undeclared({"HK_ENABLE_FOO": ("BOOL", "ON"), "HK_BUILD_TESTS": ("BOOL", "ON")}, top_options,
                     tree_options, hkkokkos_text)
    check([b[0] for b in bad] == ["HK_ENABLE_FOO"], "sensitivity: an undeclared HK_ option is reported", str(bad))
    bad = undeclared({"Foo_ROOT": ("STRING", "/x")}, top_options, tree_options, hkkokkos_text)
    check(bad and bad[0][0] == "Foo_ROOT", "sensitivity: an unknown hint is reported", str(bad))
    check("TRUE" not in option_values(top_text, "HK_ENABLE_CUDA"), "sensitivity: HK_ENABLE_CUDA=TRUE would be rejected")
    without = [c for c in conflicts_list if c["args"][0] != "+mpi"]
    refusing = without + [{"args": ["+mpi"], "kwargs": {}, "when": None}]
    check(pending_rule(top_options, without) if "HK_ENABLE_MPI" not in top_options else
          pending_rule(top_options, refusing),
          "sensitivity: the announced-option rule fires when recipe and CMake disagree")


def report():
    width = max(len(n) for _, n, _ in results)
    for ok, name, detail in results:
        print(("%-4s %-*s %s" % ("ok" if ok else "FAIL", width, name, detail if (detail and not ok) else "")).rstrip())
    failed = sum(1 for ok, _, _ in results if not ok)
    print("%s: %d check(s), %d failed" % ("PASS" if not failed else "FAIL", len(results), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
