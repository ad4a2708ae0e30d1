// Fuzz target of the HDF5 file contract (FORMAT.md): arbitrary bytes as a file, through every
// reader hk_forward uses (read_model, InputFile with and without a model, every x slice) and the
// output reader. Any hk::Error is a correct answer; a crash, hang, leak or sanitizer report is a
// bug. Built as a libFuzzer target (HK_BUILD_FUZZ=ON with clang) and, with replay_main.cpp, as
// a plain program that replays the committed corpus under ctest.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "hk/error.hpp"
#include "hk/io/io.hpp"

namespace {

// One scratch file per process, rewritten for each input (HDF5 reads files by name).
const std::string& scratch_path() {
  static const std::string p = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/hk_fuzz_contract." + std::to_string(::getpid()) + ".h5";
  }();
  return p;
}

bool write_file(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

// Reads x in bounded pieces (the first, a middle and the last slice, <= 256 Ki floats each): a
// header may claim any size, and a read of unallocated chunks costs time without new paths.
void read_some(hk::io::InputFile& in) {
  const int64_t per_seq = int64_t(in.seq_len()) * in.d_model();
  if (per_seq <= 0 || per_seq > (int64_t(1) << 18)) return;
  const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(in.batch(), (int64_t(1) << 18) / per_seq));
  std::vector<float> x(size_t(nb * per_seq));
  std::vector<int32_t> len(static_cast<size_t>(nb));
  const int64_t last = std::max<int64_t>(0, in.batch() - nb);
  for (const int64_t b0 : {int64_t(0), last / 2, last})
    in.read(b0, std::min(nb, in.batch() - b0), x.data(), len.data());
}

template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const hk::Error&) {
    // the contract's answer to a bad file
  } catch (const std::bad_alloc&) {
    // a claimed size beyond memory, refused by the allocator rather than by a check: acceptable
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  if (!write_file(path, data, size)) return 0;
  bool have_model = false;
  hk::ModelConfig config;
  expect_clean([&] {
    config = hk::io::read_model(path).config;
    have_model = true;
  });
  expect_clean([&] {
    hk::io::InputFile in(path);
    read_some(in);
  });
  if (have_model)
    expect_clean([&] {
      hk::io::InputFile in(path, config);
      read_some(in);
    });
  expect_clean([&] { (void)hk::io::read_output(path); });
  ::unlink(path.c_str());
  return 0;
}
