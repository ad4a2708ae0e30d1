// Writes the seed corpus of the contract fuzzer with the project's own writers: tiny valid
// files of each kind (model+input, fp16 weights and x, no lengths, output) and two broken ones
// (a NaN in x, a truncated file), so that fuzzing starts from inside every reader's paths.
// usage: hk_fuzz_make_corpus <dir>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "hk/io/io.hpp"
#include "hk/synthetic.hpp"

namespace {

hk::ModelConfig tiny() {
  hk::ModelConfig c;
  c.d_model = 4;
  c.n_heads = 2;
  c.n_layers = 1;
  c.ffn_dim = 4;
  c.causal = true;
  return c;
}

void model_and_input(const std::string& path, hk::io::DType w, hk::io::DType xt, bool lengths, float poison = 0.0f) {
  const hk::ModelConfig c = tiny();
  hk::io::ModelWriteOptions mo;
  mo.dtype = w;
  hk::io::write_model(path, hk::synthetic_model(c, 3, true), mo, hk::io::WriteMode::create);
  const int B = 2, S = 3;
  std::vector<float> x = hk::synthetic_input(B, S, c.d_model, 3);
  if (poison != 0.0f) x[5] = poison;
  const std::vector<int32_t> len = {1, S};
  hk::io::write_input(path, B, S, c.d_model, x.data(), lengths ? len.data() : nullptr, xt, hk::io::WriteMode::append);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir);
  using hk::io::DType;
  model_and_input((dir / "model_input_f32.h5").string(), DType::float32, DType::float32, true);
  model_and_input((dir / "model_input_f16.h5").string(), DType::float16, DType::float16, true);
  model_and_input((dir / "model_input_nolengths.h5").string(), DType::float64, DType::float32, false);
  model_and_input((dir / "bad_nan_x.h5").string(), DType::float32, DType::float32, true,
                  std::numeric_limits<float>::quiet_NaN());
  {  // the first 4 KiB of a valid file: a superblock whose objects lie past the end
    const std::string full = (dir / "model_input_f32.h5").string(), cut = (dir / "truncated.h5").string();
    std::filesystem::copy_file(full, cut, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(cut, 4096);
  }
  {
    const std::string out = (dir / "output.h5").string();
    std::vector<float> y(2 * 3 * 4, 0.5f);
    hk::io::OutputFile f(out, 2, 3, 4);
    f.set_attribute("precision", "fp32");
    f.write(0, 2, y.data());
    f.commit();
  }
  return 0;
}
