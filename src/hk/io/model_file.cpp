#include "hk/io/model_file.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>

#include "hk/error.hpp"
#include "hk/io/h5_detail.hpp"

namespace hk::io {

using namespace detail;

namespace {

std::string dataset_path(const std::string& parameter_name) {
  std::string p = "/model/" + parameter_name;
  for (char& c : p)
    if (c == '.') c = '/';
  return p;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// [i, j] of the flat index `i` in a row-major array of `shape`.
std::vector<int64_t> unflatten(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
  return idx;
}

const char* nonfinite_name(double v) { return std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf"); }

ModelConfig read_config(hid_t group, const std::string& path) {
  const std::string obj = "/model";
  const std::string format = read_string_attribute(group, path, obj, "format");
  if (format != kModelFormat)
    fail(path, obj, std::string("attribute 'format': expected \"") + kModelFormat + "\", found \"" +
                        one_line(format, 60) + "\"");
  const int64_t version = read_int_attribute(group, path, obj, "format_version");
  if (version != kModelFormatVersion)
    fail(path, obj, "attribute 'format_version': expected " + std::to_string(kModelFormatVersion) +
                        ", found " + std::to_string(version));
  auto positive = [&](const char* name) {
    const int64_t v = read_int_attribute(group, path, obj, name);
    if (v < 1 || v > std::numeric_limits<int32_t>::max())
      fail(path, obj, std::string("attribute '") + name + "': expected an integer in 1.." +
                          std::to_string(std::numeric_limits<int32_t>::max()) + ", found " + std::to_string(v));
    return int(v);
  };
  ModelConfig c;
  c.d_model = positive("d_model");
  c.n_heads = positive("n_heads");
  c.n_layers = positive("n_layers");
  c.ffn_dim = positive("ffn_dim");
  const int64_t causal = read_int_attribute(group, path, obj, "causal");
  if (causal != 0 && causal != 1)
    fail(path, obj, "attribute 'causal': expected 0 or 1, found " + std::to_string(causal));
  c.causal = causal == 1;
  if (has_attribute(group, "eps")) {
    c.eps = read_float_attribute(group, path, obj, "eps");
    if (!std::isfinite(c.eps) || c.eps <= 0)
      fail(path, obj, "attribute 'eps': expected a positive finite float, found " + std::to_string(c.eps));
  }
  c.validate(path + ": " + obj);  // D % H, L >= 1, sizes that would overflow
  return c;
}

struct OpenParameter {
  ParameterRef ref;
  std::string path;
  Handle dset;
  FloatKind kind;
};

}  // namespace

Model read_model(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  Handle file = open_file(path);
  Handle group = open_group(file.get(), path, "/model");
  const ModelConfig c = read_config(group.get(), path);

  // The layer count must match the file, or a 5-layer file read as 4 layers would silently give
  // a different function. This also bounds the allocation below by what the file really holds.
  {
    Handle layers = open_group(file.get(), path, "/model/layers");
    H5G_info_t info;
    if (H5Gget_info(layers.get(), &info) < 0) fail_h5(path, "/model/layers", "cannot list its members");
    if (info.nlinks != hsize_t(c.n_layers))
      fail(path, "/model/layers", "expected " + std::to_string(c.n_layers) + " layer groups (n_layers), found " +
                                      std::to_string(info.nlinks) + " members");
  }

  Model m;
  m.config = c;
  m.layers.resize(size_t(c.n_layers));

  // Pass 1: every dataset present with the exact shape and a float type, before reading any data.
  std::vector<OpenParameter> params;
  for (ParameterRef& ref : m.parameters()) {
    OpenParameter p{ref, dataset_path(ref.name), {}, FloatKind::other};
    const std::string expected = "a float16/32/64 dataset of shape " + shape_string(ref.shape);
    p.dset = open_dataset(file.get(), path, p.path, expected);
    const std::vector<int64_t> dims = dataset_dims(p.dset.get(), path, p.path);
    if (dims != ref.shape)
      fail(path, p.path, "expected shape " + shape_string(ref.shape) + ", found " + shape_string(dims));
    Handle type = type_handle(H5Dget_type(p.dset.get()));
    if (!type.valid()) fail_h5(path, p.path, "cannot read its type");
    p.kind = float_kind(type.get());
    if (p.kind == FloatKind::other)
      fail(path, p.path, "expected float16, float32 or float64, found " + describe_type(type.get()));
    params.push_back(std::move(p));
  }

  // Pass 2: read (HDF5 converts float32/64 to double exactly; float16 is converted here) and
  // refuse NaN/Inf.
  std::vector<uint16_t> half;
  for (OpenParameter& p : params) {
    const int64_t n = element_count(p.ref.shape);
    std::vector<double>& v = *p.ref.values;
    v.resize(size_t(n));
    herr_t st;
    if (p.kind == FloatKind::f16) {
      half.resize(size_t(n));
      st = H5Dread(p.dset.get(), half_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, half.data());
      if (st >= 0)
        for (int64_t i = 0; i < n; ++i) v[size_t(i)] = half_to_double(half[size_t(i)]);
    } else {
      st = H5Dread(p.dset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    }
    if (st < 0) fail_h5(path, p.path, "expected readable data, found a read error (truncated or damaged file?)");
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[size_t(i)]))
        fail(path, p.path, std::string("expected finite values, found ") + nonfinite_name(v[size_t(i)]) +
                               " at " + index_string(unflatten(i, p.ref.shape)));
    p.dset.close();
  }
  return m;
}

void write_model(const std::string& path, const Model& model, const ModelWriteOptions& options,
                 WriteMode mode) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  model.config.validate(path + ": /model");
  Handle file = mode == WriteMode::create ? create_file(path) : open_file(path, /*writable=*/true);
  const ObjectKind existing = object_kind(file.get(), "/model");
  if (existing != ObjectKind::none)
    fail(path, "/model", std::string("expected no /model yet (writing a new model), found ") + kind_name(existing));
  Handle group = require_group(file.get(), path, "/model");
  const std::string obj = "/model";
  const ModelConfig& c = model.config;
  write_string_attribute(group.get(), path, obj, "format", kModelFormat);
  write_int_attribute(group.get(), path, obj, "format_version", kModelFormatVersion);
  write_int_attribute(group.get(), path, obj, "d_model", c.d_model);
  write_int_attribute(group.get(), path, obj, "n_heads", c.n_heads);
  write_int_attribute(group.get(), path, obj, "n_layers", c.n_layers);
  write_int_attribute(group.get(), path, obj, "ffn_dim", c.ffn_dim);
  write_int_attribute(group.get(), path, obj, "causal", c.causal ? 1 : 0);
  if (options.write_eps) write_float_attribute(group.get(), path, obj, "eps", c.eps);
  group.close();

  const hid_t file_type = options.dtype == DType::float16   ? half_type()
                          : options.dtype == DType::float32 ? H5T_IEEE_F32LE
                                                            : H5T_IEEE_F64LE;
  Handle dcpl = dataset_creation();
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  // parameters() only hands out pointers to the parameter vectors; nothing is modified here.
  for (const ParameterRef& ref : const_cast<Model&>(model).parameters()) {
    const std::string dpath = dataset_path(ref.name);
    const int64_t n = element_count(ref.shape);
    if (int64_t(ref.values->size()) != n)
      fail(path, dpath, "cannot write: the model holds " + std::to_string(ref.values->size()) +
                            " values, expected " + std::to_string(n) + " for shape " + shape_string(ref.shape));
    Handle space = simple_space(ref.shape, path, dpath);
    require_group(file.get(), path, dpath.substr(0, dpath.rfind('/')));
    Handle dset = dataset_handle(
        H5Dcreate2(file.get(), dpath.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    if (!dset.valid()) fail_h5(path, dpath, "cannot create the dataset");
    herr_t st;
    if (options.dtype == DType::float16) {
      f16.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) f16[size_t(i)] = double_to_half((*ref.values)[size_t(i)]);
      st = H5Dwrite(dset.get(), half_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, f16.data());
    } else if (options.dtype == DType::float32) {
      f32.assign(ref.values->begin(), ref.values->end());
      st = H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f32.data());
    } else {
      st = H5Dwrite(dset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, ref.values->data());
    }
    if (st < 0) fail_h5(path, dpath, "cannot write the data (disk full?)");
  }
  dcpl.close();
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0 || !file.close())
    fail_h5(path, "/", "cannot flush and close the file (disk full?)");
}

}  // namespace hk::io
