#include "cublaslt_api.hpp"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "hk/error.hpp"

#ifndef HK_CUBLASLT_DIR
#define HK_CUBLASLT_DIR ""
#endif

namespace hk::cuda::lt {

namespace {

std::string soname() { return "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR); }

Api load() {
  const std::string name = soname();
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = lib ? "" : ::dlerror();
  if (!lib && std::string(HK_CUBLASLT_DIR).size() > 0) {
    const std::string path = std::string(HK_CUBLASLT_DIR) + "/" + name;
    lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) why += std::string("; ") + ::dlerror();
  }
  if (!lib) throw Error("cuda backend: cannot load cuBLASLt (" + name + "): " + why);
  // Never closed: the handles and plans made through it live until the process ends.
  Api a{};
  auto get = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol));
    if (!fn) throw Error("cuda backend: " + name + " has no " + symbol + " (a cuBLASLt older than the one built against?)");
  };
  get(a.Create, "cublasLtCreate");
  get(a.Destroy, "cublasLtDestroy");
  get(a.GetVersion, "cublasLtGetVersion");
  get(a.GetStatusString, "cublasLtGetStatusString");
  get(a.Matmul, "cublasLtMatmul");
  get(a.MatmulDescCreate, "cublasLtMatmulDescCreate");
  get(a.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  get(a.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  get(a.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  get(a.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  get(a.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  get(a.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  get(a.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  get(a.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  get(a.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(a.MatmulAlgoCheck, "cublasLtMatmulAlgoCheck");
  get(a.MatmulAlgoConfigGetAttribute, "cublasLtMatmulAlgoConfigGetAttribute");
  get(a.MatmulAlgoInit, "cublasLtMatmulAlgoInit");
  get(a.MatmulAlgoCapGetAttribute, "cublasLtMatmulAlgoCapGetAttribute");
  get(a.MatmulAlgoConfigSetAttribute, "cublasLtMatmulAlgoConfigSetAttribute");
  return a;
}

}  // namespace

bool loaded() {
  void* lib = ::dlopen(soname().c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
  if (!lib) return false;
  ::dlclose(lib);  // NOLOAD took a reference
  return true;
}

const Api& api() {
  static const Api a = load();  // a failed load throws, and the next call tries again
  return a;
}

}  // namespace hk::cuda::lt
