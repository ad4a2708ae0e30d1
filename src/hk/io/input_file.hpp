// The /input group of FORMAT.md: x [B, S, D] float32/float16, optional lengths [B] of any
// integer type with values in 0..S. Opening validates shapes, types and every length; x is read
// in batch slices (hyperslabs) and each slice is checked for NaN/Inf as it is read, so that
// inputs larger than memory stream and nothing is ever computed on a non-finite value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hk/config.hpp"
#include "hk/io/dtype.hpp"
#include "hk/io/model_file.hpp"

namespace hk::io {

// Default HDF5 chunk cache of one dataset hk reads or writes in batch slices; a smaller one
// (hk_forward --mem-cap) bounds memory at the cost of re-reading chunks cut by a slice.
inline constexpr size_t kDefaultChunkCacheBytes = size_t(64) << 20;

class InputFile {
 public:
  // Any D.
  explicit InputFile(const std::string& path);
  // D must equal model.d_model. `chunk_cache_bytes`: the chunk cache of x.
  InputFile(const std::string& path, const ModelConfig& model, size_t chunk_cache_bytes = kDefaultChunkCacheBytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const;
  int64_t batch() const;    // B
  int seq_len() const;      // S
  int d_model() const;      // D
  bool has_lengths() const;
  DType x_type() const;     // float32 or float16

  // Sequences [b0, b0 + nb): x [nb, S, D] as float32 and lengths [nb] (all S when the file
  // has none; `lengths` may be null). Throws hk::Error naming the first NaN/Inf of the slice.
  // One thread at a time (the HDF5 calls hold hk::io's lock; the checks after them do not).
  void read(int64_t b0, int64_t nb, float* x, int32_t* lengths);
  // The valid positions of sequences [b0, b0 + nb): the sum of their lengths (nb * S without
  // lengths). Reads only /input/lengths.
  int64_t valid_tokens(int64_t b0, int64_t nb);

  // Walks the storage of sequences [b0, b0 + nb) of x without reading the values, where reading
  // them would do nothing else with the file: x stored without filters, chunked (every chunk the
  // slice touches is looked up in the chunk index, and its extent must lie inside the file with
  // the size of an unfiltered chunk) or contiguous (its extent must lie inside the file). Returns
  // false, having done nothing, when x has filters (decoding is where a damaged file can crash
  // the library: only reading it checks that) or compact storage. Throws hk::Error naming x for
  // an index entry that points outside the file. Neither values nor lengths are checked.
  bool probe(int64_t b0, int64_t nb);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes /input/x (as `x_type`, chunked) and, when `lengths` is not null, /input/lengths
// (int32). x is [B, S, D] float32 in memory.
void write_input(const std::string& path, int64_t B, int S, int D, const float* x,
                 const int32_t* lengths, DType x_type = DType::float32,
                 WriteMode mode = WriteMode::create);

}  // namespace hk::io
