// The /output group of FORMAT.md: y float32 [B, S, D] plus attributes saying how it was made.
// An OutputFile writes into "<path>.tmp.<pid>" beside the final path and only commit() renames
// it into place (atomically), so a run that fails leaves no output and any previous output
// untouched: the destructor of an uncommitted OutputFile deletes the temporary file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hk/io/input_file.hpp"

namespace hk::io {

class OutputFile {
 public:
  // y is contiguous and written without HDF5's buffers (no chunk cache: no memory beyond the
  // caller's rows), from one thread, in order.
  OutputFile(const std::string& path, int64_t B, int S, int D);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& path() const;       // the final path
  const std::string& temp_path() const;  // where the data goes until commit()

  // A string attribute of /output (precision, backend, device, program, version, input_file, ...).
  void set_attribute(const std::string& name, const std::string& value);
  // Rows [b0, b0 + nb) of y, written in order: b0 must be the first row not yet written. With
  // `lengths`, positions s >= lengths[i] of row i are FORMAT.md's padding, zero in y: they are not
  // written, and read back as zeros from the new file (about half the bytes for lengths uniform
  // in 1..S).
  void write(int64_t b0, int64_t nb, const float* y, const int32_t* lengths = nullptr);
  // Requires every row written; flushes, closes, syncs and renames onto the final path.
  void commit();
  bool committed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  void create();
};

// A whole output file, validated (/output/y float32 rank 3): for tests and tools.
struct OutputData {
  int64_t B = 0;
  int S = 0, D = 0;
  std::vector<float> y;
  std::map<std::string, std::string> attributes;  // the string attributes of /output
};
OutputData read_output(const std::string& path);

}  // namespace hk::io
