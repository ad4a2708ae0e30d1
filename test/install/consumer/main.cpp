// A downstream program built against an installed hk: makes a synthetic model, runs the Kokkos
// backend's float64 forward on a small padded batch, and checks what any correct forward must
// give (MODEL.md): finite valid rows, exactly zero padded rows, the same answer twice.
// Exit 0 when every check passes; each check prints one line.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hk/build_config.hpp"
#include "hk/engine.hpp"
#include "hk/synthetic.hpp"
#include "kokkos/backend.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main() {
  check(std::strcmp(HK_VERSION, HK_PACKAGE_VERSION) == 0,
        std::string("build_config.hpp version ") + HK_VERSION + " == package version " + HK_PACKAGE_VERSION);
  check(HK_HAVE_CUDA == HK_PACKAGE_HAVE_CUDA, "build_config.hpp HK_HAVE_CUDA matches the package's hk_HAVE_CUDA");
  check(hk::kokkos::backend().name() == "kokkos", "kokkos/backend.hpp names the kokkos backend");

  // D=32, H=4 (head_dim 8), F=48 != D, L=2, causal; lengths S, partial, 1 and 0 (all padded).
  hk::ModelConfig cfg;
  cfg.d_model = 32;
  cfg.n_heads = 4;
  cfg.ffn_dim = 48;
  cfg.n_layers = 2;
  cfg.causal = true;
  const int B = 4, S = 9, D = cfg.d_model;
  const hk::Model model = hk::synthetic_model(cfg, 11);
  const std::vector<float> x = hk::synthetic_input(B, S, D, 12);
  const std::vector<int32_t> lengths = {S, 5, 1, 0};

  hk::EngineOptions o;
  o.backend = "kokkos";
  o.precision = hk::Precision::reference;
  o.max_batch = B;
  o.seq_len = S;
  try {
    auto engine = hk::make_engine(model, o);
    check(engine->backend() == "kokkos", "make_engine gives the kokkos backend (" + engine->device() + ")");
    check(engine->precision() == hk::Precision::reference, "engine precision is reference");

    std::vector<float> y(x.size(), std::nanf("")), y2(x.size(), std::nanf(""));
    engine->forward(x.data(), lengths.data(), B, y.data());
    engine->forward(x.data(), lengths.data(), B, y2.data());

    int nonfinite = 0, padded_nonzero = 0, valid_rows_nonzero = 0, valid_rows = 0;
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < S; ++s) {
        const float* row = &y[(size_t(b) * S + s) * D];
        bool any = false;
        for (int d = 0; d < D; ++d) {
          if (!std::isfinite(row[d])) ++nonfinite;
          if (row[d] != 0.0f) any = true;
          if (s >= lengths[b] && row[d] != 0.0f) ++padded_nonzero;
        }
        if (s < lengths[b]) {
          ++valid_rows;
          valid_rows_nonzero += any ? 1 : 0;
        }
      }
    check(nonfinite == 0, "every output element finite (" + std::to_string(nonfinite) + " not)");
    check(padded_nonzero == 0, "padded positions exactly zero (" + std::to_string(padded_nonzero) + " not)");
    // The final LayerNorm (weight 1, bias 0) gives zero-mean unit-variance rows: never all zero.
    check(valid_rows_nonzero == valid_rows,
          "valid rows carry values (" + std::to_string(valid_rows_nonzero) + "/" + std::to_string(valid_rows) + ")");
    check(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0, "a second forward gives the same bits");
  } catch (const std::exception& e) {
    check(false, std::string("forward threw: ") + e.what());
  }

  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
