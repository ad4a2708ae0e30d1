#include "hk/io/dtype.hpp"

#include "hk/error.hpp"

namespace hk::io {

const char* to_string(DType t) {
  switch (t) {
    case DType::float16: return "float16";
    case DType::float32: return "float32";
    case DType::float64: return "float64";
  }
  return "?";
}

DType dtype_from_string(const std::string& s) {
  if (s == "float16") return DType::float16;
  if (s == "float32") return DType::float32;
  if (s == "float64") return DType::float64;
  throw Error("unknown element type '" + s + "' (expected float16, float32 or float64)");
}

}  // namespace hk::io
