#include "hk/io/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>

#include "hk/error.hpp"
#include "hk/io/h5_detail.hpp"

namespace hk::io {

using namespace detail;

struct OutputFile::Impl {
  std::string path, temp;
  Handle file, group, y;
  std::vector<int64_t> dims;
  int64_t next_row = 0;
  bool committed = false;
  // y's rows written past HDF5 (the usual case), or through H5Dwrite where memory floats are not
  // the file's little-endian float32, with the write-back started after each chunk.
  std::unique_ptr<RawRows> raw;
  std::unique_ptr<WriteBack> write_back;

  ~Impl() {
    if (committed) return;
    raw.reset();
    y.close();
    group.close();
    file.close();
    ::unlink(temp.c_str());  // a failed run leaves nothing behind
  }
};

OutputFile::OutputFile(const std::string& path, int64_t B, int S, int D) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  if (B < 1 || S < 1 || D < 1)
    fail(path, "/output/y", "expected B, S and D >= 1, found [" + std::to_string(B) + ", " + std::to_string(S) +
                                ", " + std::to_string(D) + "]");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail(path, "/", "expected a file path for the output, found a directory");
  // From here on impl_ exists, so any failure below removes the temporary file.
  impl_ = std::make_unique<Impl>();
  impl_->path = path;
  impl_->temp = path + ".tmp." + std::to_string(::getpid());
  impl_->dims = {B, S, D};
  try {
    create();
  } catch (...) {
    impl_.reset();  // under the lock: closes the handles and deletes the temporary file
    throw;
  }
}

void OutputFile::create() {
  Impl& m = *impl_;
  const std::string& path = m.path;
  Handle fapl = file_creation_access();
  const hid_t f = H5Fcreate(m.temp.c_str(), H5F_ACC_TRUNC, file_creation_props().get(), fapl.get());
  if (f < 0) {
    const int err = errno;
    fail_h5(path, "/", "cannot create the temporary output file " + m.temp + " (" + std::strerror(err) + ")");
  }
  m.file = file_handle(f);
  m.group = require_group(m.file.get(), path, "/output");
  Handle space = simple_space(m.dims, path, "/output/y");
  // Contiguous, allocated now, never filled (every element is written before commit): the rows of
  // a chunk are one byte range of the file, written without HDF5 (RawRows).
  Handle dcpl = dataset_creation();
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  m.y = dataset_handle(
      H5Dcreate2(m.group.get(), "y", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!m.y.valid()) fail_h5(path, "/output/y", "cannot create the dataset");
  if (native_float_is_f32le()) {
    m.raw = std::make_unique<RawRows>(path, "/output/y", m.temp, m.y.get(), m.dims);
  } else {
    m.write_back = std::make_unique<WriteBack>(m.temp);
  }
}

OutputFile::~OutputFile() {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  impl_.reset();
}

const std::string& OutputFile::path() const { return impl_->path; }
const std::string& OutputFile::temp_path() const { return impl_->temp; }
bool OutputFile::committed() const { return impl_->committed; }

void OutputFile::set_attribute(const std::string& name, const std::string& value) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  Impl& m = *impl_;
  if (m.committed) throw Error(m.path + ": /output: already committed, cannot set attribute '" + name + "'");
  write_string_attribute(m.group.get(), m.path, "/output", name, value);
}

void OutputFile::write(int64_t b0, int64_t nb, const float* y, const int32_t* lengths) {
  Impl& m = *impl_;
  if (m.committed) throw Error(m.path + ": /output/y: already committed, cannot write");
  if (b0 != m.next_row)
    fail(m.path, "/output/y", "rows are written in order: expected b0 = " + std::to_string(m.next_row) +
                                  ", found " + std::to_string(b0));
  if (nb < 0 || b0 > m.dims[0] - nb)
    fail(m.path, "/output/y", "rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                  ") requested, expected a range inside [0, " + std::to_string(m.dims[0]) + ")");
  if (nb == 0) return;
  if (m.raw) {
    m.raw->write(b0, nb, y, lengths);  // without the HDF5 lock: a read of the next chunk goes on meanwhile
  } else {
    std::unique_lock<std::recursive_mutex> lock(h5_mutex());
    init();
    Handle fspace = select_rows(m.y.get(), m.dims, b0, nb, m.path, "/output/y");
    Handle mspace = simple_space({nb, m.dims[1], m.dims[2]}, m.path, "/output/y");
    if (H5Dwrite(m.y.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, y) < 0)
      fail_h5(m.path, "/output/y", "cannot write rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                       ") (disk full?)");
    // The write-back request may wait for the device queue: not under the HDF5 lock. Every HDF5
    // handle of this call is closed first (the lock guards their release too).
    fspace.close();
    mspace.close();
    lock.unlock();
    m.write_back->start();
  }
  m.next_row = b0 + nb;
}

void OutputFile::commit() {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  Impl& m = *impl_;
  if (m.committed) return;
  if (m.next_row != m.dims[0])
    fail(m.path, "/output/y", "expected all " + std::to_string(m.dims[0]) + " rows written before commit, found " +
                                  std::to_string(m.next_row));
  // The rows first, synced on their own descriptor (a write-back error is reported to a
  // descriptor open when it happens), then HDF5's metadata; the rename's fsync then has little left.
  if (m.raw) {
    const std::string why = m.raw->finish(/*sync=*/true);
    if (!why.empty()) fail(m.path, "/output/y", why);
  }
  const bool closed = m.y.close() && m.group.close() && H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) >= 0 &&
                      m.file.close();
  if (!closed) fail_h5(m.path, "/", "cannot flush and close the temporary output file " + m.temp + " (disk full?)");
  m.write_back.reset();
  const std::string why = durable_rename(m.temp, m.path);
  if (!why.empty()) fail(m.path, "/", why);
  m.committed = true;
}

OutputData read_output(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  Handle file = open_file(path);
  Handle group = open_group(file.get(), path, "/output");
  Handle y = open_dataset(file.get(), path, "/output/y", "a float32 dataset of shape [B, S, D]");
  const std::vector<int64_t> dims = dataset_dims(y.get(), path, "/output/y");
  if (dims.size() != 3) fail(path, "/output/y", "expected rank 3 [B, S, D], found shape " + shape_string(dims));
  Handle type = type_handle(H5Dget_type(y.get()));
  if (float_kind(type.get()) != FloatKind::f32)
    fail(path, "/output/y", "expected float32, found " + describe_type(type.get()));
  if (dims[1] > std::numeric_limits<int32_t>::max() || dims[2] > std::numeric_limits<int32_t>::max())
    fail(path, "/output/y", "expected S and D below 2^31, found shape " + shape_string(dims));
  OutputData out;
  out.B = dims[0];
  out.S = int(dims[1]);
  out.D = int(dims[2]);
  out.y.resize(size_t(out.B * out.S * out.D));
  if (!out.y.empty() && H5Dread(y.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.y.data()) < 0)
    fail_h5(path, "/output/y", "expected readable data, found a read error (truncated or damaged file?)");

  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Aiterate2(group.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names) < 0)
    fail_h5(path, "/output", "cannot list its attributes");
  for (const std::string& name : names) {
    Handle a = attribute_handle(H5Aopen(group.get(), name.c_str(), H5P_DEFAULT));
    Handle t = type_handle(a.valid() ? H5Aget_type(a.get()) : H5I_INVALID_HID);
    if (!t.valid()) fail_h5(path, "/output", "attribute '" + name + "': cannot be opened");
    const H5T_class_t cls = H5Tget_class(t.get());
    if (cls == H5T_STRING) out.attributes[name] = read_string_attribute(group.get(), path, "/output", name);
    else if (cls == H5T_INTEGER) out.attributes[name] = std::to_string(read_int_attribute(group.get(), path, "/output", name));
    else if (cls == H5T_FLOAT) out.attributes[name] = std::to_string(read_float_attribute(group.get(), path, "/output", name));
  }
  return out;
}

}  // namespace hk::io
