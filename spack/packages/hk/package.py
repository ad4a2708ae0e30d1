# Spack recipe for hk, kept in hk's own repository (spack/, registered by ../../../spack.yaml).
import os
import re

from spack.package import *

try:  # Spack >= 1.0: the build systems live in the builtin package repository
    from spack_repo.builtin.build_systems.cmake import CMakePackage, generator
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.x: spack.package exports them
    pass

# This file sits at <repository>/spack/packages/hk/package.py.
_REPOSITORY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


class Hk(CMakePackage, CudaPackage):
    """Transformer-encoder forward pass on HDF5 inputs as fast as the hardware allows: a C++
    library (hk::hk) and the hk_forward / hk_generate tools, with a CUDA backend (cuBLASLt,
    flash and cuDNN attention, CUDA graphs) for NVIDIA A100/H100/H200 and a portable Kokkos
    backend for CPUs."""

    # Fetching clones the checkout this recipe ships in; `spack develop` (see spack.yaml)
    # builds the working tree in place instead.
    git = "file://" + _REPOSITORY

    version("main", branch="main")

    # cuda and cuda_arch come from CudaPackage.
    variant("mpi", default=False, description="Batch-scale runs over MPI (option HK_ENABLE_MPI)")
    variant("tests", default=False, description="Build the test suite (ctest; label gpu needs a GPU)")
    variant("perf", default=False, description="Build the Google Benchmark suites hk_bench_host / hk_bench_cuda")

    generator("ninja")

    depends_on("c", type="build")  # FindHDF5 test-compiles C
    depends_on("cxx", type="build")
    depends_on("cmake@3.24:", type="build")
    depends_on("ninja", type="build")

    depends_on("hdf5@1.10:")  # the C API only (src/hk/io)
    depends_on("kokkos@3.4:")
    depends_on("kokkos-kernels@3.4:")
    depends_on("cli11@2:", type="build")  # header-only, used by the tools
    depends_on("fmt", type="build")  # required at configure time; no hk library links it
    depends_on("nlohmann-json@3:", type="build")  # header-only: the tune cache, hk_forward --trace
    depends_on("googletest", when="+tests")
    depends_on("benchmark@1.6:", when="+perf")  # random interleaving of repetitions
    depends_on("mpi", when="+mpi")
    # The MPI build writes one output file through parallel HDF5 (collective hyperslab writes).
    depends_on("hdf5+mpi", when="+mpi")
    depends_on("hdf5~mpi", when="~mpi")

    with when("+cuda"):
        depends_on("cuda@13:")  # what hk is built and tested with (cuBLASLt 13)
        depends_on("cudnn@9:")  # the cuDNN attention route; the GPU nodes run cuDNN 9.14
        conflicts("cuda_arch=none", msg="hk's CUDA backend needs cuda_arch (e.g. 80,90)")
        for _arch in CudaPackage.cuda_arch_values:
            _number = re.match(r"\d+", _arch)
            if _number and int(_number.group()) < 80:
                conflicts(f"cuda_arch={_arch}", msg="hk's CUDA kernels need sm_80 or newer")
        del _arch, _number

    # The Kokkos backend runs on Kokkos' host execution spaces; on GPUs hk runs its CUDA backend.
    conflicts("^kokkos+cuda", msg="hk's Kokkos backend is built for host execution spaces only")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("HK_ENABLE_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define_from_variant("HK_ENABLE_MPI", "mpi"),
            self.define_from_variant("HK_BUILD_TESTS", "tests"),
            self.define_from_variant("HK_BUILD_PERF", "perf"),
            self.define("HK_BUILD_APPS", True),
            # Kokkos_ROOT selects the Kokkos-package branch of cmake/HkKokkos.cmake.
            self.define("Kokkos_ROOT", spec["kokkos"].prefix),
            self.define("KokkosKernels_ROOT", spec["kokkos-kernels"].prefix),
            self.define("HDF5_ROOT", spec["hdf5"].prefix),
            # Spack's compiler wrapper adds the spec's target flags; no second -march.
            self.define("HK_KOKKOS_HOST_ARCH", ""),
        ]
        if spec.satisfies("+cuda"):
            cudnn = find_libraries("libcudnn", root=spec["cudnn"].prefix, shared=True, recursive=True)
            if not cudnn:
                raise InstallError(f"no libcudnn under {spec['cudnn'].prefix}")
            args += [
                self.define_from_variant("HK_CUDA_ARCHITECTURES", "cuda_arch"),
                # Otherwise the top level prefers /usr/local/cuda/bin/nvcc when it exists.
                self.define("CMAKE_CUDA_COMPILER", spec["cuda"].prefix.bin.nvcc),
                self.define("CUDAToolkit_ROOT", spec["cuda"].prefix),
                self.define("HK_CUDNN_LIBRARY", cudnn[0]),
                self.define("HK_CUDNN_INCLUDE_DIR", spec["cudnn"].prefix.include),
            ]
        return args
