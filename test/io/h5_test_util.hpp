// Test helpers: scratch directories, a known-good model+input file, and direct HDF5 C API edits
// that break one thing at a time (the bad files of FORMAT.md), so that the tests need no Python.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hk/error.hpp"
#include "hk/io/io.hpp"
#include "hk/synthetic.hpp"

namespace hk::test {

// A fresh directory under the system temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("hk_test." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& dir() const { return dir_; }
  // Names of every entry in the directory (to check that nothing was left behind).
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  std::filesystem::path dir_;
};

inline ModelConfig small_config(bool causal = true) {
  ModelConfig c;
  c.d_model = 8;
  c.n_heads = 2;
  c.n_layers = 2;
  c.ffn_dim = 12;
  c.causal = causal;
  return c;
}

constexpr int kB = 3, kS = 5;

// Model (float32 weights) and input (x float32, lengths {2, 0, 5}) in one file.
inline void write_good_file(const std::string& path, io::DType weights = io::DType::float32,
                            io::DType x_type = io::DType::float32, bool with_lengths = true) {
  const ModelConfig c = small_config();
  const Model m = synthetic_model(c, 7, /*nontrivial_ln=*/true);
  io::ModelWriteOptions mo;
  mo.dtype = weights;
  io::write_model(path, m, mo, io::WriteMode::create);
  const std::vector<float> x = synthetic_input(kB, kS, c.d_model, 7);
  const std::vector<int32_t> len = {2, 0, 5};
  io::write_input(path, kB, kS, c.d_model, x.data(), with_lengths ? len.data() : nullptr, x_type,
                  io::WriteMode::append);
}

// The message of the hk::Error `f` throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-hk exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no hk::Error was thrown";
  return "";
}

// FORMAT.md: one line, "<file>: <object path>: <expected, found>", and the key phrase.
#define HK_EXPECT_FILE_ERROR(msg, file, object, phrase)                                     \
  do {                                                                                      \
    const std::string m_ = (msg);                                                           \
    EXPECT_EQ(m_.find('\n'), std::string::npos) << "not one line: " << m_;                 \
    EXPECT_EQ(m_.rfind(std::string(file) + ": " + (object) + ": ", 0), 0u)                  \
        << "does not start with '" << (file) << ": " << (object) << ": ': " << m_;          \
    EXPECT_NE(m_.find(phrase), std::string::npos) << "lacks '" << (phrase) << "': " << m_; \
  } while (0)

// ---- direct edits with the HDF5 C API -------------------------------------------------------

class RawFile {
 public:
  explicit RawFile(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    id_ = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (id_ < 0) ADD_FAILURE() << "cannot open " << path;
  }
  ~RawFile() {
    if (id_ >= 0) H5Fclose(id_);
  }
  hid_t id() const { return id_; }

 private:
  hid_t id_ = -1;
};

inline void remove_link(const std::string& file, const std::string& object) {
  RawFile f(file);
  ASSERT_GE(H5Ldelete(f.id(), object.c_str(), H5P_DEFAULT), 0) << object;
}

inline void remove_attribute(const std::string& file, const std::string& object, const std::string& name) {
  RawFile f(file);
  ASSERT_GE(H5Adelete_by_name(f.id(), object.c_str(), name.c_str(), H5P_DEFAULT), 0) << name;
}

// Replaces attribute `name` of `object` by a scalar of `file_type` holding `value` (written from
// memory type `mem_type`).
inline void set_attribute(const std::string& file, const std::string& object, const std::string& name,
                          hid_t file_type, hid_t mem_type, const void* value) {
  RawFile f(file);
  const hid_t obj = H5Oopen(f.id(), object.c_str(), H5P_DEFAULT);
  ASSERT_GE(obj, 0);
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  EXPECT_GE(H5Awrite(a, mem_type, value), 0);
  H5Aclose(a);
  H5Sclose(space);
  H5Oclose(obj);
}

inline void set_int_attribute(const std::string& file, const std::string& object, const std::string& name,
                              int64_t v, hid_t file_type = H5T_STD_I64LE) {
  set_attribute(file, object, name, file_type, H5T_NATIVE_INT64, &v);
}

inline void set_double_attribute(const std::string& file, const std::string& object, const std::string& name,
                                 double v, hid_t file_type = H5T_IEEE_F64LE) {
  set_attribute(file, object, name, file_type, H5T_NATIVE_DOUBLE, &v);
}

// Fixed-length (as numpy bytes) or variable-length (as a Python str) string.
inline void set_string_attribute(const std::string& file, const std::string& object, const std::string& name,
                                 const std::string& v, bool variable = true) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  if (variable) {
    H5Tset_size(t, H5T_VARIABLE);
    const char* p = v.c_str();
    set_attribute(file, object, name, t, t, &p);
  } else {
    H5Tset_size(t, v.size());
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    set_attribute(file, object, name, t, t, v.data());
  }
  H5Tclose(t);
}

// The enum h5py writes for a numpy bool.
inline void set_bool_attribute(const std::string& file, const std::string& object, const std::string& name, bool v) {
  const hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
  int8_t f = 0, tr = 1;
  H5Tenum_insert(t, "FALSE", &f);
  H5Tenum_insert(t, "TRUE", &tr);
  int8_t value = v ? 1 : 0;
  set_attribute(file, object, name, t, t, &value);
  H5Tclose(t);
}

// Replaces dataset `object` by one of `file_type` and `dims`, filled from `values` (converted
// by HDF5 from double) or left unwritten when `values` is empty; chunked when `chunk` is given.
inline void replace_dataset(const std::string& file, const std::string& object, hid_t file_type,
                            const std::vector<hsize_t>& dims, const std::vector<double>& values = {},
                            const std::vector<hsize_t>& chunk = {}) {
  RawFile f(file);
  if (H5Lexists(f.id(), object.c_str(), H5P_DEFAULT) > 0) H5Ldelete(f.id(), object.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  const hid_t space = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (!chunk.empty()) H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
  const hid_t d = H5Dcreate2(f.id(), object.c_str(), file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0) << object;
  if (!values.empty()) EXPECT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
}

// Overwrites element `flat` of dataset `object` with the raw bytes `raw` of the dataset's own type.
inline void poke_raw(const std::string& file, const std::string& object, hsize_t flat, const void* raw) {
  RawFile f(file);
  const hid_t d = H5Dopen2(f.id(), object.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0) << object;
  const hid_t space = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), coord(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  for (int k = rank - 1; k >= 0; --k) {
    coord[size_t(k)] = flat % dims[size_t(k)];
    flat /= dims[size_t(k)];
  }
  H5Sselect_elements(space, H5S_SELECT_SET, 1, coord.data());
  const hsize_t one = 1;
  const hid_t mem = H5Screate_simple(1, &one, nullptr);
  const hid_t type = H5Dget_type(d);
  EXPECT_GE(H5Dwrite(d, type, mem, space, H5P_DEFAULT, raw), 0);
  H5Tclose(type);
  H5Sclose(mem);
  H5Sclose(space);
  H5Dclose(d);
}

inline void poke_float(const std::string& file, const std::string& object, hsize_t flat, float v) {
  poke_raw(file, object, flat, &v);
}

// Rewrites /input/x of `path` with the deflate filter (chunks of `chunk_rows` sequences, the
// same float32 values): readers then have to decode it.
inline void deflate_x(const std::string& path, hsize_t chunk_rows) {
  RawFile f(path);
  const hid_t d = H5Dopen2(f.id(), "/input/x", H5P_DEFAULT);
  ASSERT_GE(d, 0);
  const hid_t space = H5Dget_space(d);
  hsize_t dims[3] = {0, 0, 0};
  ASSERT_EQ(H5Sget_simple_extent_dims(space, dims, nullptr), 3);
  std::vector<float> x(size_t(dims[0] * dims[1] * dims[2]));
  ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), 0);
  H5Dclose(d);
  ASSERT_GE(H5Ldelete(f.id(), "/input/x", H5P_DEFAULT), 0);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk[3] = {chunk_rows, dims[1], dims[2]};
  H5Pset_chunk(dcpl, 3, chunk);
  ASSERT_GE(H5Pset_deflate(dcpl, 1), 0);
  const hid_t nd = H5Dcreate2(f.id(), "/input/x", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(nd, 0);
  EXPECT_GE(H5Dwrite(nd, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), 0);
  H5Dclose(nd);
  H5Pclose(dcpl);
  H5Sclose(space);
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace hk::test
