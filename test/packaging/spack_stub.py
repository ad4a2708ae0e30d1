"""A test harness standing in for the few parts of Spack's package API that spack/packages/hk/
package.py touches, so the recipe can be imported and its cmake_args() evaluated without Spack.

It is NOT Spack and proves nothing about how Spack itself concretizes or builds: directives are
only recorded into lists, specs are plain dictionaries, and `satisfies` understands the handful
of spec tokens the recipe uses (+v, ~v, v=a,b, ^dep and a dependency's own +v/~v). The CMake
define helpers follow Spack's documented output format (-DNAME:BOOL=ON, -DNAME:STRING=a;b).
"""
import contextlib
import importlib.util
import os
import re
import sys
import types

# ---- directive recording ----------------------------------------------------------------------

_records = []  # every directive call since the last reset, in order
_when_stack = []


def _record(kind, *args, **kwargs):
    when = kwargs.pop("when", None)
    conditions = list(_when_stack) + ([when] if when else [])
    _records.append({"kind": kind, "args": args, "kwargs": kwargs, "when": " ".join(conditions) or None})


def _directive(kind):
    def directive(*args, **kwargs):
        _record(kind, *args, **kwargs)

    directive.__name__ = kind
    return directive


version = _directive("version")
variant = _directive("variant")
depends_on = _directive("depends_on")
conflicts = _directive("conflicts")
requires = _directive("requires")
generator = _directive("generator")
maintainers = _directive("maintainers")
license = _directive("license")
patch = _directive("patch")


@contextlib.contextmanager
def when(condition):
    _when_stack.append(condition)
    try:
        yield
    finally:
        _when_stack.pop()


class InstallError(Exception):
    pass


# ---- specs --------------------------------------------------------------------------------------


class Prefix(str):
    """Like Spack's Prefix: attribute access appends a path component."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Prefix(os.path.join(self, name))


class VariantValue:
    def __init__(self, value):
        self.value = value


class Spec:
    """name, {variant: value} (bool, str or tuple for multi-valued), {dependency: Spec}, prefix."""

    def __init__(self, name, variants=None, deps=None, prefix="/nonexistent"):
        self.name = name
        self._variants = dict(variants or {})
        self.variants = {k: VariantValue(v) for k, v in self._variants.items()}
        self.deps = dict(deps or {})
        self.prefix = Prefix(prefix)

    def __getitem__(self, name):
        if name not in self.deps:
            raise KeyError("spec %s has no dependency %s" % (self.name, name))
        return self.deps[name]

    def _token(self, tok):
        if tok.startswith("+") or tok.startswith("~"):
            v = tok[1:]
            have = self._variants.get(v)
            return (have is True) if tok[0] == "+" else (have is False)
        m = re.fullmatch(r"([\w-]+)=([\w.,-]+)", tok)
        if m:
            have = self._variants.get(m.group(1))
            want = tuple(m.group(2).split(","))
            if isinstance(have, tuple):
                return set(want) <= set(have)
            return have is not None and str(have) in want
        if tok.startswith("@") or tok == self.name:
            return True  # versions are not modelled
        raise ValueError("spack_stub: spec token %r is not understood" % tok)

    def satisfies(self, condition):
        """A space-separated conjunction; '^dep+v~w' tokens test a dependency."""
        for part in re.findall(r"\^[\w-]+[^\s^]*|[^\s^]+", condition.strip()):
            if part.startswith("^"):
                m = re.match(r"\^([\w-]+)(.*)", part)
                dep = self.deps.get(m.group(1))
                if dep is None:
                    return False
                rest = re.findall(r"[+~][\w-]+|[\w-]+=[\w.,-]+|@[\w.:=-]+", m.group(2))
                if not all(dep._token(t) for t in rest):
                    return False
            elif not self._token(part):
                return False
        return True


# ---- build-system base classes ---------------------------------------------------------------------


def find_libraries(names, root, shared=True, recursive=False):
    """A real file search (like Spack's): paths of lib<name>.so (shared) or .a under root."""
    names = [names] if isinstance(names, str) else list(names)
    wanted = {n + (".so" if shared else ".a") for n in names}
    if recursive:
        dirs = [d for d, _, _ in os.walk(root)]
    else:
        dirs = [os.path.join(root, "lib"), os.path.join(root, "lib64")]
    return [os.path.join(d, f) for d in sorted(dirs) if os.path.isdir(d) for f in sorted(os.listdir(d)) if f in wanted]


class PackageBase:
    def __init__(self, spec):
        self.spec = spec


class CMakePackage(PackageBase):
    variant("build_type", default="Release", values=("Debug", "Release", "RelWithDebInfo", "MinSizeRel"))

    @staticmethod
    def define(cmake_var, value):
        if isinstance(value, bool):
            kind, text = "BOOL", "ON" if value else "OFF"
        elif isinstance(value, (list, tuple)):
            kind, text = "STRING", ";".join(str(v) for v in value)
        else:
            kind, text = "STRING", str(value)
        return "-D%s:%s=%s" % (cmake_var, kind, text)

    def define_from_variant(self, cmake_var, variant_name=None):
        variant_name = variant_name or cmake_var.lower()
        if variant_name not in self.spec.variants:
            return ""  # a conditional variant that is not active
        return self.define(cmake_var, self.spec.variants[variant_name].value)


class CudaPackage(PackageBase):
    # The architecture list of Spack's CudaPackage (a subset is enough for the recipe's loop).
    cuda_arch_values = ("50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89",
                        "90", "90a", "100", "100a", "120")
    variant("cuda", default=False)
    variant("cuda_arch", values=cuda_arch_values + ("none",), multi=True, when="+cuda")


BASE_DIRECTIVES = list(_records)  # declared by the base classes above (inherited by recipes)


# ---- loading a recipe --------------------------------------------------------------------------------


def _install_modules(with_spack_repo):
    names = ["version", "variant", "depends_on", "conflicts", "requires", "generator", "maintainers",
             "license", "patch", "when", "InstallError", "find_libraries"]
    package = types.ModuleType("spack.package")
    for n in names:
        setattr(package, n, globals()[n])
    if not with_spack_repo:  # Spack 0.x exports the build systems from spack.package
        package.CMakePackage = CMakePackage
        package.CudaPackage = CudaPackage
    package.__all__ = [n for n in vars(package) if not n.startswith("_")]
    spack = types.ModuleType("spack")
    spack.package = package
    sys.modules["spack"] = spack
    sys.modules["spack.package"] = package
    repo_modules = ["spack_repo", "spack_repo.builtin", "spack_repo.builtin.build_systems",
                    "spack_repo.builtin.build_systems.cmake", "spack_repo.builtin.build_systems.cuda"]
    for name in repo_modules:
        sys.modules.pop(name, None)
    if with_spack_repo:  # Spack >= 1.0 layout
        for name in repo_modules:
            sys.modules[name] = types.ModuleType(name)
        sys.modules["spack_repo.builtin.build_systems.cmake"].CMakePackage = CMakePackage
        sys.modules["spack_repo.builtin.build_systems.cmake"].generator = generator
        sys.modules["spack_repo.builtin.build_systems.cuda"].CudaPackage = CudaPackage


def load_recipe(path, with_spack_repo):
    """Imports package.py; returns (module, recipe directives, base-class directives)."""
    _install_modules(with_spack_repo)
    del _records[:]
    spec = importlib.util.spec_from_file_location("hk_recipe_%d" % int(with_spack_repo), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, list(_records), list(BASE_DIRECTIVES)
