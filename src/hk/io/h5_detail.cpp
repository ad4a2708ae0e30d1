#include "hk/io/h5_detail.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "hk/error.hpp"
#include "hk/io/dtype.hpp"
#include "hk/io/io.hpp"
#include "hk/tune/knobs.hpp"

namespace hk::io::detail {

std::recursive_mutex& h5_mutex() {
  static std::recursive_mutex m;
  return m;
}

void init() {
  // Before the library's first use: no atexit handler of its own. Its handler closes files
  // still open at exit, and after a failed close (a full disk) that second close crashes
  // (libhdf5 1.10.8); every file hk opens is closed by its own handles.
  static const bool no_atexit = [] { return H5dont_atexit() >= 0; }();
  (void)no_atexit;
  // Per call, not once: in a thread-safe HDF5 build the automatic printing is per thread.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {
herr_t innermost(unsigned n, const H5E_error2_t* err, void* data) {
  if (n == 0 && err->desc && *err->desc) *static_cast<std::string*>(data) = err->desc;
  return 0;
}
}  // namespace

std::string h5_reason() {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());  // callers may be outside it
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason;
}

std::string one_line(const std::string& s, size_t max_len) {
  std::string out;
  out.reserve(std::min(s.size(), max_len));
  for (char c : s) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? ' ' : c;
  }
  return out;
}

void fail(const std::string& file, const std::string& object, const std::string& what) {
  {
    std::lock_guard<std::recursive_mutex> lock(h5_mutex());  // callers may be outside it
    H5Eclear2(H5E_DEFAULT);
  }
  throw Error(one_line(file + ": " + object + ": " + what, 1000));
}

void fail_h5(const std::string& file, const std::string& object, const std::string& what) {
  const std::string reason = h5_reason();
  fail(file, object, reason.empty() ? what : what + " (HDF5: " + reason + ")");
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string index_string(const std::vector<int64_t>& index) { return shape_string(index); }

Handle file_handle(hid_t id) { return Handle(id, H5Fclose); }
Handle group_handle(hid_t id) { return Handle(id, H5Gclose); }
Handle dataset_handle(hid_t id) { return Handle(id, H5Dclose); }
Handle attribute_handle(hid_t id) { return Handle(id, H5Aclose); }
Handle dataspace_handle(hid_t id) { return Handle(id, H5Sclose); }
Handle type_handle(hid_t id) { return Handle(id, H5Tclose); }
Handle plist_handle(hid_t id) { return Handle(id, H5Pclose); }

Handle open_file(const std::string& path, bool writable) {
  init();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    fail(path, "/", std::string("expected an HDF5 file, found none (") + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) fail(path, "/", "expected an HDF5 file, found a directory");
  if (::access(path.c_str(), writable ? (R_OK | W_OK) : R_OK) != 0)
    fail(path, "/", std::string("expected a readable HDF5 file, found one that cannot be opened (") +
                        std::strerror(errno) + ")");
  const htri_t is = H5Fis_hdf5(path.c_str());
  if (is == 0)
    fail(path, "/", "expected an HDF5 file, found a " + std::to_string(int64_t(st.st_size)) +
                        "-byte file without the HDF5 signature");
  if (is < 0) fail_h5(path, "/", "expected an HDF5 file, found one that cannot be read");
  const hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) fail_h5(path, "/", "expected a readable HDF5 file, found a damaged or truncated one");
  return file_handle(id);
}

Handle file_creation_access() {
  Handle fapl = plist_handle(H5Pcreate(H5P_FILE_ACCESS));
  // The 1.8 object format: compact groups (a fraction of the bytes of the 1.6 symbol tables for
  // a model's ~20 small groups per layer), readable by every HDF5 since 1.8 and by h5py.
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  return fapl;
}

std::string durable_rename(const std::string& temp, const std::string& path) {
  const int fd = ::open(temp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return "cannot sync the temporary output file " + temp + " (" + std::strerror(err) + ")";
  }
  ::close(fd);
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    return "cannot move the temporary output file " + temp + " into place (" + std::strerror(errno) + ")";
  return "";
}

WriteBack::WriteBack(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}

WriteBack::~WriteBack() {
  if (fd_ >= 0) ::close(fd_);
}

void WriteBack::start() const noexcept {
  if (fd_ >= 0) ::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
}

WriteBackQueue::WriteBackQueue(int fd) : fd_(fd) {
  t_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !q_.empty(); });
      if (stop_) return;
      const auto [begin, bytes] = q_.front();
      q_.pop_front();
      lock.unlock();
      ::sync_file_range(fd_, off_t(begin), off_t(bytes), SYNC_FILE_RANGE_WRITE);  // best effort
      lock.lock();
    }
  });
}

WriteBackQueue::~WriteBackQueue() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  t_.join();
}

void WriteBackQueue::request(uint64_t begin, uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(m_);
    q_.emplace_back(begin, bytes);
  }
  cv_.notify_all();
}

RawRows::RawRows(const std::string& file, const std::string& object, const std::string& path, hid_t dset,
                 const std::vector<int64_t>& dims, bool mapped)
    : file_(file),
      object_(object),
      offset_(contiguous_offset(dset, file, object)),
      row_bytes_(uint64_t(dims[1]) * uint64_t(dims[2]) * sizeof(float)),
      position_bytes_(uint64_t(dims[2]) * sizeof(float)),
      positions_(int(dims[1])),
      mapped_(mapped) {
  const std::string wb = tune::knob_choice("HK_WRITE_BACK", {"async", "inline", "off"});
  write_back_ = wb == "inline" ? 1 : wb == "off" ? 2 : 0;
  fd_ = ::open(path.c_str(), (mapped ? O_RDWR : O_WRONLY) | O_CLOEXEC);  // a shared mapping needs read access
  const int err = errno;
  if (fd_ < 0) fail(file, object, "cannot open the temporary output file " + path + " for writing (" + std::strerror(err) + ")");
  try {
    if (write_back_ == 0) queue_ = std::make_unique<WriteBackQueue>(fd_);
  } catch (...) {
    ::close(fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

RawRows::~RawRows() {
  queue_.reset();  // before the descriptor it uses
  if (fd_ >= 0) ::close(fd_);
}

void RawRows::write(int64_t b0, int64_t nb, const void* data, const int32_t* lengths) const {
  const char* p = static_cast<const char*>(data);
  const uint64_t begin = offset_ + uint64_t(b0) * row_bytes_;
  if (!lengths) {
    write_range(begin, uint64_t(nb) * row_bytes_, p, b0, nb);
  } else {
    for (int64_t i = 0; i < nb;) {
      // Rows i..j-1 full, then row j's valid prefix: one contiguous byte range.
      int64_t j = i;
      while (j + 1 < nb && lengths[j] >= positions_) ++j;
      const uint64_t bytes =
          uint64_t(j - i) * row_bytes_ + uint64_t(std::clamp(lengths[j], 0, positions_)) * position_bytes_;
      if (bytes > 0) write_range(begin + uint64_t(i) * row_bytes_, bytes, p + uint64_t(i) * row_bytes_, b0, nb);
      i = j + 1;
    }
  }
  if (queue_) queue_->request(begin, uint64_t(nb) * row_bytes_);
  else if (write_back_ == 1) ::sync_file_range(fd_, off_t(begin), off_t(uint64_t(nb) * row_bytes_), SYNC_FILE_RANGE_WRITE);
}

bool RawRows::copy_mapped(uint64_t begin, uint64_t bytes, const char* p, int64_t b0, int64_t nb) const {
  const auto failed = [&](const char* what, int err) {
    fail(file_, object_, "cannot write rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) + ") (" + what +
                             ": " + std::strerror(err) + ")");
  };
  if (no_fallocate_) return false;
  // The blocks first: a page of the mapping whose block cannot be allocated would end the
  // process with SIGBUS when written; this way a full disk is an error here. The range itself
  // (the file grows to hold it), then the whole pages around it without changing the size (a
  // page may span several blocks, some of them a neighbour's rows).
  static const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t start = begin / page * page, len = bytes + (begin - start);
  const uint64_t whole = (len + page - 1) / page * page;
  if (::fallocate(fd_, 0, off_t(begin), off_t(bytes)) != 0 ||
      ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, off_t(start), off_t(whole)) != 0) {
    const int err = errno;
    if (err == EOPNOTSUPP || err == ENOSYS) {
      no_fallocate_ = true;  // pwrite from now on
      return false;
    }
    failed("fallocate", err);
  }
  void* m = ::mmap(nullptr, size_t(len), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, off_t(start));
  if (m == MAP_FAILED) failed("mmap", errno);
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
  // The pages wholly inside the range in one call, not one fault each (advice only; the partial
  // first and last pages, shared with a neighbour's rows, fault as the copy reaches them).
  const uint64_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
  if (last > first) ::madvise(static_cast<char*>(m) + (first - start), size_t(last - first), MADV_POPULATE_WRITE);
  std::memcpy(static_cast<char*>(m) + (begin - start), p, size_t(bytes));
  ::munmap(m, size_t(len));  // the pages stay dirty in the page cache, written back as pwrite's are
  return true;
}

void RawRows::write_range(uint64_t begin, uint64_t bytes, const char* p, int64_t b0, int64_t nb) const {
  if (mapped_ && copy_mapped(begin, bytes, p, b0, nb)) return;
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t w = ::pwrite(fd_, p + done, size_t(std::min<uint64_t>(bytes - done, uint64_t(1) << 30)),
                               off_t(begin + done));
    const int err = errno;
    if (w < 0 && err == EINTR) continue;
    if (w <= 0)
      fail(file_, object_, "cannot write rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) + ") (" +
                               (w < 0 ? std::strerror(err) : "no progress") + ")");
    done += uint64_t(w);
  }
}

std::string RawRows::finish(bool sync) {
  if (fd_ < 0) return "";
  queue_.reset();  // its requests still queued are dropped: the fsync below writes everything
  std::string why;
  if (sync && ::fsync(fd_) != 0) {
    const int err = errno;
    why = std::string("cannot sync the rows written (") + std::strerror(err) + ")";
  }
  if (::close(fd_) != 0 && why.empty()) {
    const int err = errno;
    why = std::string("cannot close the output file (") + std::strerror(err) + ")";
  }
  fd_ = -1;
  return why;
}

uint64_t contiguous_offset(hid_t dset, const std::string& file, const std::string& object) {
  const haddr_t a = H5Dget_offset(dset);
  if (a == HADDR_UNDEF) fail_h5(file, object, "cannot locate the dataset's data in the file");
  return uint64_t(a);
}

bool native_float_is_f32le() { return H5Tequal(H5T_NATIVE_FLOAT, H5T_IEEE_F32LE) > 0; }

Handle file_creation_props() {
  Handle fcpl = plist_handle(H5Pcreate(H5P_FILE_CREATE));
  H5Pset_obj_track_times(fcpl.get(), 0);
  return fcpl;
}

Handle create_file(const std::string& path) {
  init();
  Handle fapl = file_creation_access();
  Handle fcpl = file_creation_props();
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  if (id < 0) {
    const int err = errno;
    fail_h5(path, "/", std::string("cannot create the file (") + std::strerror(err) + ")");
  }
  return file_handle(id);
}

ObjectKind object_kind(hid_t file, const std::string& path) {
  // H5Lexists needs every parent to exist, so walk the components from the root.
  std::string prefix;
  size_t pos = 1;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    prefix = path.substr(0, next);
    const htri_t e = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return ObjectKind::none;
    }
    pos = next + 1;
  }
  const hid_t obj = H5Oopen(file, path.c_str(), H5P_DEFAULT);
  if (obj < 0) {  // a dangling soft or external link
    H5Eclear2(H5E_DEFAULT);
    return ObjectKind::none;
  }
  const H5I_type_t t = H5Iget_type(obj);
  H5Oclose(obj);
  if (t == H5I_GROUP) return ObjectKind::group;
  if (t == H5I_DATASET) return ObjectKind::dataset;
  return ObjectKind::other;
}

const char* kind_name(ObjectKind k) {
  switch (k) {
    case ObjectKind::none: return "no such object";
    case ObjectKind::group: return "a group";
    case ObjectKind::dataset: return "a dataset";
    case ObjectKind::other: return "a named datatype";
  }
  return "?";
}

Handle open_group(hid_t file, const std::string& file_path, const std::string& path) {
  const ObjectKind k = object_kind(file, path);
  if (k != ObjectKind::group)
    fail(file_path, path, std::string("expected a group, found ") + kind_name(k));
  const hid_t id = H5Gopen2(file, path.c_str(), H5P_DEFAULT);
  if (id < 0) fail_h5(file_path, path, "expected a group that can be opened, found one that cannot");
  return group_handle(id);
}

Handle open_dataset(hid_t file, const std::string& file_path, const std::string& path,
                    const std::string& expected_what, hid_t dapl) {
  const ObjectKind k = object_kind(file, path);
  if (k != ObjectKind::dataset)
    fail(file_path, path, "expected " + expected_what + ", found " + kind_name(k));
  const hid_t id = H5Dopen2(file, path.c_str(), dapl);
  if (id < 0) fail_h5(file_path, path, "expected a dataset that can be opened, found one that cannot");
  return dataset_handle(id);
}

Handle require_group(hid_t file, const std::string& file_path, const std::string& path) {
  const ObjectKind k = object_kind(file, path);
  if (k == ObjectKind::group) return open_group(file, file_path, path);
  if (k != ObjectKind::none)
    fail(file_path, path, std::string("cannot create a group: the path holds ") + kind_name(k));
  // Parents first, each with the same creation properties (HDF5's intermediate-group creation
  // would give them timestamps).
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) require_group(file, file_path, path.substr(0, slash));
  Handle gcpl = plist_handle(H5Pcreate(H5P_GROUP_CREATE));
  H5Pset_obj_track_times(gcpl.get(), 0);
  const hid_t id = H5Gcreate2(file, path.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT);
  if (id < 0) fail_h5(file_path, path, "cannot create the group");
  return group_handle(id);
}

std::vector<int64_t> dataset_dims(hid_t dset, const std::string& file_path, const std::string& path) {
  Handle space = dataspace_handle(H5Dget_space(dset));
  if (!space.valid()) fail_h5(file_path, path, "cannot read the dataspace");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) fail_h5(file_path, path, "cannot read the dataspace");
  std::vector<hsize_t> d(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), d.data(), nullptr) < 0)
    fail_h5(file_path, path, "cannot read the dataspace");
  std::vector<int64_t> out(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    // HDF5 dimensions are unsigned 64-bit: one beyond int64 can only be a damaged or hostile file.
    if (d[i] > hsize_t(INT64_MAX)) fail(file_path, path, "expected dimensions below 2^63, found " + std::to_string(d[i]));
    out[i] = int64_t(d[i]);
  }
  return out;
}

namespace {
bool fields_are(hid_t t, size_t spos, size_t epos, size_t esize, size_t mpos, size_t msize, size_t ebias) {
  size_t s, ep, es, mp, ms;
  if (H5Tget_fields(t, &s, &ep, &es, &mp, &ms) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return s == spos && ep == epos && es == esize && mp == mpos && ms == msize && H5Tget_ebias(t) == ebias;
}

bool is_h5py_bool(hid_t t) {
  if (H5Tget_class(t) != H5T_ENUM || H5Tget_nmembers(t) != 2) return false;
  bool ok = true;
  for (unsigned i = 0; i < 2; ++i) {
    char* name = H5Tget_member_name(t, i);
    if (!name) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    ok = ok && std::strcmp(name, i == 0 ? "FALSE" : "TRUE") == 0;
    H5free_memory(name);
  }
  return ok;
}
}  // namespace

FloatKind float_kind(hid_t type) {
  if (H5Tget_class(type) != H5T_FLOAT) return FloatKind::other;
  switch (H5Tget_size(type)) {
    case 2: return fields_are(type, 15, 10, 5, 0, 10, 15) ? FloatKind::f16 : FloatKind::other;
    case 4: return fields_are(type, 31, 23, 8, 0, 23, 127) ? FloatKind::f32 : FloatKind::other;
    case 8: return fields_are(type, 63, 52, 11, 0, 52, 1023) ? FloatKind::f64 : FloatKind::other;
    default: return FloatKind::other;
  }
}

std::string describe_type(hid_t type) {
  const size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT:
      switch (float_kind(type)) {
        case FloatKind::f16: return "float16";
        case FloatKind::f32: return "float32";
        case FloatKind::f64: return "float64";
        default: return std::to_string(bits) + "-bit float of a non-IEEE layout";
      }
    case H5T_STRING: return "a string";
    case H5T_ENUM: return is_h5py_bool(type) ? "bool (enum)" : "an enum";
    case H5T_COMPOUND: return "a compound type";
    case H5T_ARRAY: return "an array type";
    case H5T_VLEN: return "a variable-length sequence";
    case H5T_REFERENCE: return "a reference";
    case H5T_OPAQUE: return "an opaque type";
    case H5T_BITFIELD: return "a bitfield";
    case H5T_TIME: return "a time type";
    default: return "an unknown type";
  }
}

hid_t half_type() {
  static const hid_t t = [] {
    const hid_t h = H5Tcopy(H5T_NATIVE_FLOAT);
    H5Tset_fields(h, 15, 10, 5, 0, 10);
    H5Tset_size(h, 2);
    H5Tset_ebias(h, 15);
    H5Tlock(h);
    return h;
  }();
  return t;
}

bool has_attribute(hid_t obj, const std::string& name) {
  const htri_t e = H5Aexists(obj, name.c_str());
  if (e < 0) H5Eclear2(H5E_DEFAULT);
  return e > 0;
}

namespace {
// Opens attribute `name`, checks it holds exactly one element and returns it with its type.
struct ScalarAttr {
  Handle attr, type;
};

ScalarAttr open_scalar_attribute(hid_t obj, const std::string& file, const std::string& object,
                                 const std::string& name, const std::string& expected) {
  const std::string what = "attribute '" + name + "': ";
  if (!has_attribute(obj, name)) fail(file, object, what + "expected " + expected + ", found none (missing attribute)");
  ScalarAttr a;
  a.attr = attribute_handle(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  if (!a.attr.valid()) fail_h5(file, object, what + "cannot be opened");
  Handle space = dataspace_handle(H5Aget_space(a.attr.get()));
  const H5S_class_t cls = H5Sget_simple_extent_type(space.get());
  if (cls == H5S_NULL) fail(file, object, what + "expected " + expected + ", found an empty (null) attribute");
  if (cls == H5S_SIMPLE && H5Sget_simple_extent_npoints(space.get()) != 1) {
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> d(rank > 0 ? size_t(rank) : 0);
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
    std::vector<int64_t> dims(d.begin(), d.end());
    fail(file, object, what + "expected a scalar, found shape " + shape_string(dims));
  }
  a.type = type_handle(H5Aget_type(a.attr.get()));
  if (!a.type.valid()) fail_h5(file, object, what + "cannot read its type");
  return a;
}
}  // namespace

std::string read_string_attribute(hid_t obj, const std::string& file, const std::string& object,
                                  const std::string& name) {
  ScalarAttr a = open_scalar_attribute(obj, file, object, name, "a string");
  const std::string what = "attribute '" + name + "': ";
  if (H5Tget_class(a.type.get()) != H5T_STRING)
    fail(file, object, what + "expected a string, found " + describe_type(a.type.get()));
  if (H5Tis_variable_str(a.type.get()) > 0) {
    Handle mem = type_handle(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(a.type.get()));
    char* p = nullptr;
    if (H5Aread(a.attr.get(), mem.get(), &p) < 0) fail_h5(file, object, what + "cannot be read");
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  const size_t n = H5Tget_size(a.type.get());
  std::string buf(n, '\0');
  if (n > 0 && H5Aread(a.attr.get(), a.type.get(), &buf[0]) < 0) fail_h5(file, object, what + "cannot be read");
  buf.resize(std::strlen(buf.c_str()));
  if (H5Tget_strpad(a.type.get()) == H5T_STR_SPACEPAD)
    while (!buf.empty() && buf.back() == ' ') buf.pop_back();
  return buf;
}

int64_t read_int_attribute(hid_t obj, const std::string& file, const std::string& object,
                           const std::string& name) {
  ScalarAttr a = open_scalar_attribute(obj, file, object, name, "an integer");
  const std::string what = "attribute '" + name + "': ";
  const H5T_class_t cls = H5Tget_class(a.type.get());
  if (cls == H5T_INTEGER) {
    int64_t v = 0;  // HDF5 converts any integer width; out-of-range unsigned values saturate
    if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, &v) < 0) fail_h5(file, object, what + "cannot be read");
    return v;
  }
  if (is_h5py_bool(a.type.get())) {  // h5py writes Python/numpy bools as an int8 enum
    Handle native = type_handle(H5Tget_native_type(a.type.get(), H5T_DIR_DEFAULT));
    unsigned char raw[16] = {0};
    if (!native.valid() || H5Tget_size(native.get()) > sizeof raw ||
        H5Aread(a.attr.get(), native.get(), raw) < 0)
      fail_h5(file, object, what + "cannot be read");
    for (size_t i = 0; i < H5Tget_size(native.get()); ++i)
      if (raw[i]) return 1;
    return 0;
  }
  fail(file, object, what + "expected an integer, found " + describe_type(a.type.get()));
}

double read_float_attribute(hid_t obj, const std::string& file, const std::string& object,
                            const std::string& name) {
  ScalarAttr a = open_scalar_attribute(obj, file, object, name, "a float");
  const std::string what = "attribute '" + name + "': ";
  const FloatKind k = float_kind(a.type.get());
  if (k == FloatKind::f16) {
    uint16_t h = 0;
    if (H5Aread(a.attr.get(), half_type(), &h) < 0) fail_h5(file, object, what + "cannot be read");
    return half_to_double(h);
  }
  if (k == FloatKind::other)
    fail(file, object, what + "expected a float, found " + describe_type(a.type.get()));
  double v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, &v) < 0) fail_h5(file, object, what + "cannot be read");
  return v;
}

namespace {
Handle replace_attribute(hid_t obj, const std::string& file, const std::string& object,
                         const std::string& name, hid_t type) {
  if (has_attribute(obj, name) && H5Adelete(obj, name.c_str()) < 0)
    fail_h5(file, object, "attribute '" + name + "': cannot replace it");
  Handle space = dataspace_handle(H5Screate(H5S_SCALAR));
  Handle attr = attribute_handle(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) fail_h5(file, object, "attribute '" + name + "': cannot create it");
  return attr;
}
}  // namespace

void write_string_attribute(hid_t obj, const std::string& file, const std::string& object,
                            const std::string& name, const std::string& value) {
  // Variable-length UTF-8, as h5py writes a Python str.
  Handle type = type_handle(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Handle attr = replace_attribute(obj, file, object, name, type.get());
  const char* p = value.c_str();
  if (H5Awrite(attr.get(), type.get(), &p) < 0) fail_h5(file, object, "attribute '" + name + "': cannot write it");
}

void write_int_attribute(hid_t obj, const std::string& file, const std::string& object,
                         const std::string& name, int64_t value) {
  Handle attr = replace_attribute(obj, file, object, name, H5T_STD_I64LE);
  if (H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    fail_h5(file, object, "attribute '" + name + "': cannot write it");
}

void write_float_attribute(hid_t obj, const std::string& file, const std::string& object,
                           const std::string& name, double value) {
  Handle attr = replace_attribute(obj, file, object, name, H5T_IEEE_F64LE);
  if (H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value) < 0)
    fail_h5(file, object, "attribute '" + name + "': cannot write it");
}

std::vector<hsize_t> chunk_dims(const std::vector<int64_t>& dims, size_t element_bytes, size_t target_bytes) {
  std::vector<hsize_t> c(dims.size(), 1);
  size_t budget = std::max<size_t>(1, target_bytes / element_bytes);  // elements per chunk
  for (size_t i = dims.size(); i-- > 0;) {
    const size_t take = std::min<size_t>(size_t(std::max<int64_t>(dims[i], 1)), budget);
    c[i] = take;
    budget = std::max<size_t>(1, budget / take);
    if (take < size_t(dims[i])) break;  // the leading dimensions stay at 1
  }
  return c;
}

Handle dataset_creation(const std::vector<hsize_t>& chunk) {
  Handle dcpl = plist_handle(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_obj_track_times(dcpl.get(), 0);
  if (!chunk.empty()) H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data());
  return dcpl;
}

Handle chunk_cache_access(size_t bytes) {
  Handle dapl = plist_handle(H5Pcreate(H5P_DATASET_ACCESS));
  // 12421 slots: a prime well above the chunk count a cache of this size can hold.
  H5Pset_chunk_cache(dapl.get(), 12421, bytes, 1.0);
  return dapl;
}

Handle simple_space(const std::vector<int64_t>& dims, const std::string& file, const std::string& object) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  Handle s = dataspace_handle(H5Screate_simple(int(d.size()), d.data(), nullptr));
  if (!s.valid()) fail_h5(file, object, "cannot create a dataspace of shape " + shape_string(dims));
  return s;
}

Handle select_rows(hid_t dset, const std::vector<int64_t>& dims, int64_t b0, int64_t nb,
                   const std::string& file, const std::string& object) {
  if (b0 < 0 || nb < 0 || b0 + nb > dims.at(0))
    fail(file, object, "rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                           ") requested, expected a range inside [0, " + std::to_string(dims[0]) + ")");
  Handle space = dataspace_handle(H5Dget_space(dset));
  if (!space.valid()) fail_h5(file, object, "cannot read the dataspace");
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = hsize_t(b0);
  count[0] = hsize_t(nb);
  if (H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
    fail_h5(file, object, "cannot select rows");
  return space;
}

}  // namespace hk::io::detail

namespace hk::io {
std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  detail::init();
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}
}  // namespace hk::io
