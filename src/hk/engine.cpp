#include "hk/engine.hpp"

#include "hk/build_config.hpp"
#include "hk/error.hpp"
#include "kokkos/backend.hpp"
#if HK_HAVE_CUDA
#include "cuda/backend.hpp"
#endif

namespace hk {

std::vector<const Backend*> backends() {
  std::vector<const Backend*> all;
#if HK_HAVE_CUDA
  all.push_back(&cuda::backend());
#endif
  all.push_back(&kokkos::backend());
  return all;
}

const Backend& select_backend(const std::string& name) {
  std::string known;
  for (const Backend* b : backends()) {
    known += (known.empty() ? "" : ", ") + b->name();
    if (name == "auto") {
      if (b->unavailable_reason().empty()) return *b;
      continue;
    }
    if (b->name() == name) {
      const std::string why = b->unavailable_reason();
      if (!why.empty()) throw Error("backend '" + b->name() + "' is not usable here: " + why);
      return *b;
    }
  }
  if (name == "auto") throw Error("no usable backend in this build");
  throw Error("unknown backend '" + name + "' (this build has: " + known + ")");
}

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  model.config.validate("model");
  if (options.max_batch < 1) throw Error("max_batch must be at least 1");
  if (options.seq_len < 1) throw Error("seq_len must be at least 1");
  return select_backend(options.backend).create(model, options);
}

}  // namespace hk
