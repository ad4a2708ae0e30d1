// The HDF5 file contract of FORMAT.md: models, inputs and outputs.
#pragma once

#include "hk/io/dtype.hpp"
#include "hk/io/finite.hpp"
#include "hk/io/input_file.hpp"
#include "hk/io/model_file.hpp"
#include "hk/io/output_file.hpp"

#include <string>

namespace hk::io {
// "1.10.8": the HDF5 library this build runs with.
std::string hdf5_library_version();
}  // namespace hk::io
