// cuBLASLt through entry points loaded at run time (dlopen) instead of a link-time dependency.
//
// Why: libcublasLt is about half a gigabyte, and loading it (mapping, relocating and
// initialising it) costs a CUDA process about 0.05-0.1 s before main() runs. Loaded on first
// use instead, by the engine's constructor, it is loaded on the thread that builds the engine,
// which hk_forward runs beside its first reads; programs that never make a CUDA engine never load
// it. The library is the one this build compiled against: libcublasLt.so.<CUBLAS_VER_MAJOR>
// through the dynamic linker's search (LD_LIBRARY_PATH, ld.so.cache), then the toolkit's library
// directory of the build.
#pragma once

#include <cublasLt.h>

namespace hk::cuda::lt {

struct Api {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtGetVersion) GetVersion;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) MatmulAlgoConfigGetAttribute;
  decltype(&::cublasLtMatmulAlgoCheck) MatmulAlgoCheck;
  // Configurations beyond the heuristic's list (hk_lt_search): an algorithm id's capabilities and
  // a configuration set field by field.
  decltype(&::cublasLtMatmulAlgoInit) MatmulAlgoInit;
  decltype(&::cublasLtMatmulAlgoCapGetAttribute) MatmulAlgoCapGetAttribute;
  decltype(&::cublasLtMatmulAlgoConfigSetAttribute) MatmulAlgoConfigSetAttribute;
};

// The entry points, loaded once (thread-safe). Throws hk::Error naming the library and the
// loader's reason when it cannot be loaded or lacks an entry point.
const Api& api();

// Whether this process has cuBLASLt loaded (by api() or by anything else), without loading it.
bool loaded();

}  // namespace hk::cuda::lt
