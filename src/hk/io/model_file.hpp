// The /model group of FORMAT.md: read_model validates everything (attributes, every parameter
// dataset's presence, shape, type and finiteness) before returning; write_model writes it.
#pragma once

#include <string>

#include "hk/io/dtype.hpp"
#include "hk/model.hpp"

namespace hk::io {

inline constexpr const char* kModelFormat = "hk-transformer";
inline constexpr int kModelFormatVersion = 1;

// Throws hk::Error "<file>: <object path>: <expected, found>" on any departure from FORMAT.md.
Model read_model(const std::string& path);

// create: a new file (replacing any file at `path`); append: add to an existing HDF5 file.
enum class WriteMode { create, append };

struct ModelWriteOptions {
  DType dtype = DType::float32;  // element type of every parameter dataset
  bool write_eps = true;         // eps is optional in the contract (default 1e-5)
};

void write_model(const std::string& path, const Model& model, const ModelWriteOptions& options = {},
                 WriteMode mode = WriteMode::create);

}  // namespace hk::io
