#include "hk/io/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <system_error>
#include <vector>

#include "hk/error.hpp"
#include "hk/io/finite.hpp"
#include "hk/io/h5_detail.hpp"

namespace hk::io {

using namespace detail;

namespace {
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Consecutive rows [row, row + rows) of a slice (row 0 = its first sequence), stored from
// `offset` on in the file.
struct RawRun {
  int64_t row, rows;
  uint64_t offset;
};

// Reads the runs' rows into x ([nb, per_seq] floats, the slice of sequences [b0, b0 + nb)) with
// pread, in up to four parts of rows on as many threads for a large slice, each part checked for
// NaN/Inf right after it is read. Returns the index in x of the first non-finite element, or -1;
// throws hk::Error for a failed or short read (the first part's error first).
int64_t read_raw_rows(int fd, const std::string& path, int64_t b0, int64_t nb, int64_t per_seq,
                      const std::vector<RawRun>& runs, float* x) {
  const uint64_t row_bytes = uint64_t(per_seq) * sizeof(float);
  const int parts = nb * per_seq >= (int64_t(1) << 22) ? 4 : 1;
  const int64_t step = (nb + parts - 1) / parts;
  const auto part = [&](int64_t r0, int64_t r1) -> int64_t {  // rows [r0, r1) of the slice
    for (const RawRun& run : runs) {
      const int64_t a = std::max(r0, run.row), e = std::min(r1, run.row + run.rows);
      if (a >= e) continue;
      char* dst = reinterpret_cast<char*>(x + a * per_seq);
      uint64_t at = run.offset + uint64_t(a - run.row) * row_bytes, left = uint64_t(e - a) * row_bytes;
      while (left > 0) {
        const ssize_t got = ::pread(fd, dst, size_t(std::min<uint64_t>(left, uint64_t(1) << 30)), off_t(at));
        const int err = errno;
        if (got < 0 && err == EINTR) continue;
        if (got <= 0)
          fail(path, "/input/x", "expected readable data for sequences [" + std::to_string(b0) + ", " +
                                     std::to_string(b0 + nb) + "), found " +
                                     (got < 0 ? std::string("a read error (") + std::strerror(err) + ")"
                                              : std::string("the file ending early")) +
                                     " (truncated or damaged file?)");
        dst += got;
        at += uint64_t(got);
        left -= uint64_t(got);
      }
    }
    const int64_t i = first_nonfinite(x + r0 * per_seq, (r1 - r0) * per_seq);
    return i < 0 ? -1 : r0 * per_seq + i;
  };
  const int64_t count = (nb + step - 1) / step;
  std::vector<std::future<int64_t>> rest(static_cast<size_t>(count));  // joined by their destructors on every way out
  for (int64_t q = 1; q < count; ++q) {
    try {
      rest[size_t(q)] = std::async(std::launch::async, part, q * step, std::min(nb, (q + 1) * step));
    } catch (const std::system_error&) {
      // No thread to be had: that part runs on this thread below.
    }
  }
  int64_t found = part(0, std::min(nb, step));
  for (int64_t q = 1; q < count; ++q) {
    // A part's read error comes out here, in part order.
    const int64_t j = rest[size_t(q)].valid() ? rest[size_t(q)].get() : part(q * step, std::min(nb, (q + 1) * step));
    if (found < 0) found = j;
  }
  return found;
}
constexpr int64_t kLengthsBlock = int64_t(1) << 20;  // lengths validated in blocks: bounded memory
}  // namespace

struct InputFile::Impl {
  std::string path;
  Handle file, x, lengths;
  std::vector<int64_t> x_dims;
  int64_t B = 0;
  int S = 0, D = 0;
  FloatKind x_kind = FloatKind::f32;
  size_t cache_bytes = kDefaultChunkCacheBytes;
  std::vector<uint16_t> half;  // staging for float16 x (read() runs on one thread at a time)
  // probe(): how x is stored, found on first use. kind 0: not probed (filters, compact); 1:
  // chunked without filters; 2: contiguous.
  int probe_kind = -1;
  hsize_t chunk[3] = {0, 0, 0};
  hsize_t file_bytes = 0;
  size_t elem_bytes = 4;
  uint64_t contiguous_addr = 0;  // probe_kind 2: where x's bytes start
  void probe_layout();

  // Raw reads of x (read()): float32 in the host's byte order, stored without filters, either
  // contiguous or in chunks of whole rows ([k, S, D]), so that a slice is a few byte ranges of the
  // file, read with pread by several threads past HDF5 (whose reads run on one thread under
  // hk::io's lock) and checked by the same threads. 0: not decided yet; 1: raw; 2: HDF5.
  int raw_state = 0;
  int raw_fd = -1;
  bool decide_raw();
  ~Impl() {
    if (raw_fd >= 0) ::close(raw_fd);
  }

  void open(int expected_d);
  void validate_lengths();
};

void InputFile::Impl::open(int expected_d) {
  file = open_file(path);
  open_group(file.get(), path, "/input");
  const std::string xd = expected_d > 0 ? std::to_string(expected_d) : "D";
  const std::string shape = "[B, S, " + xd + "]";
  Handle dapl = chunk_cache_access(cache_bytes);
  x = open_dataset(file.get(), path, "/input/x", "a float32 or float16 dataset of shape " + shape, dapl.get());
  x_dims = dataset_dims(x.get(), path, "/input/x");
  if (x_dims.size() != 3)
    fail(path, "/input/x", "expected rank 3 " + shape + ", found shape " + shape_string(x_dims));
  Handle type = type_handle(H5Dget_type(x.get()));
  if (!type.valid()) fail_h5(path, "/input/x", "cannot read its type");
  x_kind = float_kind(type.get());
  if (x_kind != FloatKind::f32 && x_kind != FloatKind::f16)
    fail(path, "/input/x", "expected float32 or float16, found " + describe_type(type.get()));
  if (expected_d > 0 && x_dims[2] != expected_d)
    fail(path, "/input/x", "expected shape " + shape + " (d_model of the model), found " + shape_string(x_dims));
  if (x_dims[0] < 1 || x_dims[1] < 1 || x_dims[2] < 1)
    fail(path, "/input/x", "expected B, S and D >= 1, found shape " + shape_string(x_dims));
  if (x_dims[1] > kInt32Max || x_dims[2] > kInt32Max || x_dims[1] * x_dims[2] > kInt32Max)
    fail(path, "/input/x", "expected one sequence S * D to hold at most 2^31-1 elements, found shape " +
                               shape_string(x_dims));
  // B * S * D * 4 bytes must be addressable with 64-bit offsets.
  if (x_dims[0] > std::numeric_limits<int64_t>::max() / 4 / (x_dims[1] * x_dims[2]))
    fail(path, "/input/x", "expected B * S * D * 4 bytes to fit in 64 bits, found shape " +
                               shape_string(x_dims) + " (overflow)");
  B = x_dims[0];
  S = int(x_dims[1]);
  D = int(x_dims[2]);

  const ObjectKind lk = object_kind(file.get(), "/input/lengths");
  if (lk == ObjectKind::none) return;  // optional: every position valid
  lengths = open_dataset(file.get(), path, "/input/lengths", "an integer dataset of shape [B]");
  const std::vector<int64_t> ld = dataset_dims(lengths.get(), path, "/input/lengths");
  if (ld.size() != 1 || ld[0] != B)
    fail(path, "/input/lengths", "expected shape [" + std::to_string(B) + "] (one length per sequence of x), found " +
                                     shape_string(ld));
  Handle ltype = type_handle(H5Dget_type(lengths.get()));
  if (!ltype.valid()) fail_h5(path, "/input/lengths", "cannot read its type");
  if (H5Tget_class(ltype.get()) != H5T_INTEGER)
    fail(path, "/input/lengths", "expected an integer type, found " + describe_type(ltype.get()));
  validate_lengths();
}

void InputFile::Impl::validate_lengths() {
  std::vector<int64_t> buf;
  for (int64_t b0 = 0; b0 < B; b0 += kLengthsBlock) {
    const int64_t nb = std::min(kLengthsBlock, B - b0);
    buf.resize(size_t(nb));
    Handle fspace = select_rows(lengths.get(), {B}, b0, nb, path, "/input/lengths");
    Handle mspace = simple_space({nb}, path, "/input/lengths");
    // Any integer width converts to int64; unsigned values beyond int64 saturate and fail below.
    if (H5Dread(lengths.get(), H5T_NATIVE_INT64, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) < 0)
      fail_h5(path, "/input/lengths", "expected readable data, found a read error (truncated or damaged file?)");
    for (int64_t i = 0; i < nb; ++i)
      if (buf[size_t(i)] < 0 || buf[size_t(i)] > S)
        fail(path, "/input/lengths", "expected values in 0.." + std::to_string(S) + ", found " +
                                         std::to_string(buf[size_t(i)]) + " at [" + std::to_string(b0 + i) + "]");
  }
}

void InputFile::Impl::probe_layout() {
  probe_kind = 0;
  Handle dcpl = plist_handle(H5Dget_create_plist(x.get()));
  if (!dcpl.valid()) fail_h5(path, "/input/x", "cannot read its storage properties");
  const int nfilters = H5Pget_nfilters(dcpl.get());
  if (nfilters != 0) return;  // filtered (or unreadable): reading is the only check
  if (H5Fget_filesize(file.get(), &file_bytes) < 0) fail_h5(path, "/input/x", "cannot read the file's size");
  elem_bytes = x_kind == FloatKind::f16 ? 2 : 4;
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CHUNKED) {
    if (H5Pget_chunk(dcpl.get(), 3, chunk) != 3 || chunk[0] < 1 || chunk[1] < 1 || chunk[2] < 1)
      fail(path, "/input/x", "expected rank-3 chunks of at least one element, found an unreadable chunk shape");
    probe_kind = 1;
  } else if (layout == H5D_CONTIGUOUS) {
    const haddr_t a = H5Dget_offset(x.get());
    const hsize_t n = hsize_t(B) * hsize_t(S) * hsize_t(D) * elem_bytes;
    if (a == HADDR_UNDEF) return;  // not allocated: reads give the fill value, nothing to walk
    if (a > file_bytes || n > file_bytes - a)
      fail(path, "/input/x", "expected its data inside the file (" + std::to_string(file_bytes) +
                                 " bytes), found it at offset " + std::to_string(a) + " with " + std::to_string(n) +
                                 " bytes (damaged file?)");
    contiguous_addr = uint64_t(a);
    probe_kind = 2;
  }
}

bool InputFile::Impl::decide_raw() {
  if (raw_state != 0) return raw_state == 1;
  raw_state = 2;
  if (x_kind != FloatKind::f32) return false;
  Handle type = type_handle(H5Dget_type(x.get()));
  if (!type.valid() || H5Tequal(type.get(), H5T_NATIVE_FLOAT) <= 0) return false;  // another byte order
  // A user block shifts every address (and HDF5 before 1.14.4 reports chunk addresses without
  // it); data in external files is not in this one: HDF5 reads those.
  hsize_t user_block = 0;
  Handle fcpl = plist_handle(H5Fget_create_plist(file.get()));
  if (!fcpl.valid() || H5Pget_userblock(fcpl.get(), &user_block) < 0 || user_block != 0) return false;
  Handle dcpl = plist_handle(H5Dget_create_plist(x.get()));
  if (!dcpl.valid() || H5Pget_external_count(dcpl.get()) != 0) return false;
  if (probe_kind < 0) {
    try {
      probe_layout();
    } catch (const Error&) {
      probe_kind = -1;  // HDF5's read reports the damage; probe() still finds it
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  const bool whole_rows = probe_kind == 1 && chunk[1] == hsize_t(S) && chunk[2] == hsize_t(D);
  if (probe_kind == 2) {
    H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
    if (H5Dget_space_status(x.get(), &status) < 0 || status != H5D_SPACE_STATUS_ALLOCATED) return false;
  } else if (!whole_rows) {
    return false;
  }
  // The same file HDF5 has open (the name could have been replaced since), through the default
  // driver whose handle is a descriptor.
  Handle fapl = plist_handle(H5Fget_access_plist(file.get()));
  void* handle = nullptr;
  if (!fapl.valid() || H5Pget_driver(fapl.get()) != H5FD_SEC2 || H5Fget_vfd_handle(file.get(), fapl.get(), &handle) < 0 ||
      !handle)
    return false;
  raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw_fd < 0) return false;
  struct stat a {}, b {};
  if (::fstat(*static_cast<int*>(handle), &a) != 0 || ::fstat(raw_fd, &b) != 0 || a.st_dev != b.st_dev ||
      a.st_ino != b.st_ino) {
    ::close(raw_fd);
    raw_fd = -1;
    return false;
  }
  raw_state = 1;
  return true;
}

bool InputFile::probe(int64_t b0, int64_t nb) {
  Impl& m = *impl_;
  if (b0 < 0 || nb < 0 || b0 > m.B - nb)
    fail(m.path, "/input/x", "sequences [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                 ") requested, expected a range inside [0, " + std::to_string(m.B) + ")");
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  if (m.probe_kind < 0) m.probe_layout();  // a throw leaves kind 0 ("not probed") behind
  if (m.probe_kind == 0) return false;
  if (m.probe_kind == 2 || nb == 0) return true;
  // Every chunk whose rows meet [b0, b0 + nb), over all of S and D.
  const hsize_t full = m.chunk[0] * m.chunk[1] * m.chunk[2] * m.elem_bytes;
  const hsize_t dims[3] = {hsize_t(m.B), hsize_t(m.S), hsize_t(m.D)};
  hsize_t at[3];
  for (at[0] = hsize_t(b0) / m.chunk[0] * m.chunk[0]; at[0] < hsize_t(b0 + nb); at[0] += m.chunk[0])
    for (at[1] = 0; at[1] < dims[1]; at[1] += m.chunk[1])
      for (at[2] = 0; at[2] < dims[2]; at[2] += m.chunk[2]) {
        unsigned filters = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (H5Dget_chunk_info_by_coord(m.x.get(), at, &filters, &addr, &size) < 0)
          fail_h5(m.path, "/input/x", "expected a readable chunk index, found an error looking up the chunk at " +
                                          index_string({int64_t(at[0]), int64_t(at[1]), int64_t(at[2])}) +
                                          " (damaged file?)");
        if (addr == HADDR_UNDEF) continue;  // not written: reads give the fill value
        if (size != full || addr > m.file_bytes || size > m.file_bytes - addr)
          fail(m.path, "/input/x", "expected the chunk at " +
                                       index_string({int64_t(at[0]), int64_t(at[1]), int64_t(at[2])}) + " (" +
                                       std::to_string(full) + " bytes) inside the file (" +
                                       std::to_string(m.file_bytes) + " bytes), found " + std::to_string(size) +
                                       " bytes at offset " + std::to_string(addr) + " (damaged file?)");
      }
  return true;
}

InputFile::InputFile(const std::string& path) : InputFile(path, ModelConfig{}) {}

InputFile::InputFile(const std::string& path, const ModelConfig& model, size_t chunk_cache_bytes)
    : impl_(std::make_unique<Impl>()) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  impl_->path = path;
  impl_->cache_bytes = chunk_cache_bytes;
  try {
    impl_->open(model.d_model);
  } catch (...) {
    impl_.reset();  // close the handles under the lock
    throw;
  }
}

InputFile::~InputFile() {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  impl_.reset();
}

const std::string& InputFile::path() const { return impl_->path; }
int64_t InputFile::batch() const { return impl_->B; }
int InputFile::seq_len() const { return impl_->S; }
int InputFile::d_model() const { return impl_->D; }
bool InputFile::has_lengths() const { return impl_->lengths.valid(); }
DType InputFile::x_type() const { return impl_->x_kind == FloatKind::f16 ? DType::float16 : DType::float32; }

void InputFile::read(int64_t b0, int64_t nb, float* x, int32_t* lengths) {
  Impl& m = *impl_;
  if (b0 < 0 || nb < 0 || b0 > m.B - nb)
    fail(m.path, "/input/x", "sequences [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                 ") requested, expected a range inside [0, " + std::to_string(m.B) + ")");
  if (nb == 0) return;
  const int64_t per_seq = int64_t(m.S) * m.D;
  const int64_t n = nb * per_seq;
  std::vector<uint16_t>& half = m.half;
  half.resize(m.x_kind == FloatKind::f16 ? size_t(n) : 0);
  std::vector<int64_t> len(lengths && m.lengths.valid() ? size_t(nb) : 0);
  std::vector<RawRun> runs;  // raw: the file offsets of the slice's rows
  bool raw = false;
  {
    // HDF5 calls only under the lock: the conversions and checks below run beside another
    // thread's HDF5 calls (hk_forward's writer).
    std::lock_guard<std::recursive_mutex> lock(h5_mutex());
    init();
    const uint64_t row_bytes = uint64_t(per_seq) * sizeof(float);
    if (m.decide_raw()) {
      raw = true;
      if (m.probe_kind == 2) {
        runs.push_back({0, nb, m.contiguous_addr + uint64_t(b0) * row_bytes});
      } else {
        const int64_t k = int64_t(m.chunk[0]);
        for (int64_t c = b0 / k; raw && c * k < b0 + nb; ++c) {
          hsize_t at[3] = {hsize_t(c * k), 0, 0};
          unsigned filters = 0;
          haddr_t addr = HADDR_UNDEF;
          hsize_t size = 0;
          // An unwritten chunk (fill value) or anything unexpected: this slice through HDF5.
          hsize_t full = 0;
          if (__builtin_mul_overflow(hsize_t(k), hsize_t(row_bytes), &full) ||
              H5Dget_chunk_info_by_coord(m.x.get(), at, &filters, &addr, &size) < 0 || addr == HADDR_UNDEF ||
              filters != 0 || size != full || addr > m.file_bytes || size > m.file_bytes - addr) {
            H5Eclear2(H5E_DEFAULT);
            raw = false;
            break;
          }
          const int64_t first = std::max(b0, c * k), last = std::min(b0 + nb, (c + 1) * k);
          runs.push_back({first - b0, last - first, uint64_t(addr) + uint64_t(first - c * k) * row_bytes});
        }
      }
    }
    if (!raw) {
      Handle fspace = select_rows(m.x.get(), m.x_dims, b0, nb, m.path, "/input/x");
      // Same shape as the file selection: HDF5 then copies whole chunks instead of element runs.
      Handle mspace = simple_space({nb, m.S, m.D}, m.path, "/input/x");
      const herr_t st = m.x_kind == FloatKind::f16
                            ? H5Dread(m.x.get(), half_type(), mspace.get(), fspace.get(), H5P_DEFAULT, half.data())
                            : H5Dread(m.x.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, x);
      if (st < 0)
        fail_h5(m.path, "/input/x", "expected readable data for sequences [" + std::to_string(b0) + ", " +
                                        std::to_string(b0 + nb) + "), found a read error (truncated or damaged file?)");
    }
    if (!len.empty()) {
      Handle lf = select_rows(m.lengths.get(), {m.B}, b0, nb, m.path, "/input/lengths");
      Handle lm = simple_space({nb}, m.path, "/input/lengths");
      if (H5Dread(m.lengths.get(), H5T_NATIVE_INT64, lm.get(), lf.get(), H5P_DEFAULT, len.data()) < 0)
        fail_h5(m.path, "/input/lengths", "expected readable data, found a read error (truncated or damaged file?)");
    }
  }
  if (!half.empty())
    for (int64_t i = 0; i < n; ++i) x[i] = float(half_to_double(half[size_t(i)]));
  // Checked here, slice by slice, so that no backend ever sees a non-finite input (a large slice
  // by several threads: the check sits on hk_forward's reader path; raw reads check each part
  // right after reading it).
  const int64_t i = raw ? read_raw_rows(m.raw_fd, m.path, b0, nb, per_seq, runs, x)
                        : first_nonfinite_parallel(x, n);
  if (i >= 0) {
    const int64_t b = b0 + i / per_seq, s = (i / m.D) % m.S, d = i % m.D;
    fail(m.path, "/input/x", std::string("expected finite values, found ") +
                                 (std::isnan(x[i]) ? "NaN" : (x[i] > 0 ? "+Inf" : "-Inf")) + " at " +
                                 index_string({b, s, d}));
  }

  if (!lengths) return;
  if (len.empty()) {
    for (int64_t k = 0; k < nb; ++k) lengths[k] = m.S;
    return;
  }
  for (int64_t k = 0; k < nb; ++k) {
    // Validated when opened; checked again because the file could have changed since.
    if (len[size_t(k)] < 0 || len[size_t(k)] > m.S)
      fail(m.path, "/input/lengths", "expected values in 0.." + std::to_string(m.S) + ", found " +
                                         std::to_string(len[size_t(k)]) + " at [" + std::to_string(b0 + k) + "]");
    lengths[k] = int32_t(len[size_t(k)]);
  }
}

int64_t InputFile::valid_tokens(int64_t b0, int64_t nb) {
  Impl& m = *impl_;
  if (b0 < 0 || nb < 0 || b0 > m.B - nb)
    fail(m.path, "/input/lengths", "sequences [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                       ") requested, expected a range inside [0, " + std::to_string(m.B) + ")");
  if (!m.lengths.valid() || nb == 0) return nb * m.S;
  std::vector<int64_t> len(static_cast<size_t>(nb));
  {
    std::lock_guard<std::recursive_mutex> lock(h5_mutex());
    init();
    Handle lf = select_rows(m.lengths.get(), {m.B}, b0, nb, m.path, "/input/lengths");
    Handle lm = simple_space({nb}, m.path, "/input/lengths");
    if (H5Dread(m.lengths.get(), H5T_NATIVE_INT64, lm.get(), lf.get(), H5P_DEFAULT, len.data()) < 0)
      fail_h5(m.path, "/input/lengths", "expected readable data, found a read error (truncated or damaged file?)");
  }
  int64_t t = 0;
  for (const int64_t l : len) t += std::clamp<int64_t>(l, 0, m.S);  // read() reports values out of range
  return t;
}

void write_input(const std::string& path, int64_t B, int S, int D, const float* x, const int32_t* lengths,
                 DType x_type, WriteMode mode) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  if (B < 1 || S < 1 || D < 1)
    throw Error(path + ": /input/x: expected B, S and D >= 1, found [" + std::to_string(B) + ", " +
                std::to_string(S) + ", " + std::to_string(D) + "]");
  if (x_type == DType::float64)
    throw Error(path + ": /input/x: x is written as float32 or float16 (FORMAT.md), not float64");
  for (int64_t b = 0; lengths && b < B; ++b)
    if (lengths[b] < 0 || lengths[b] > S)
      throw Error(path + ": /input/lengths: expected values in 0.." + std::to_string(S) + ", found " +
                  std::to_string(lengths[b]) + " at [" + std::to_string(b) + "]");
  Handle file = mode == WriteMode::create ? create_file(path) : open_file(path, /*writable=*/true);
  const ObjectKind existing = object_kind(file.get(), "/input");
  if (existing != ObjectKind::none)
    fail(path, "/input", std::string("expected no /input yet (writing a new input), found ") + kind_name(existing));
  Handle group = require_group(file.get(), path, "/input");

  const std::vector<int64_t> dims = {B, S, D};
  const bool half = x_type == DType::float16;
  const size_t elt = half ? 2 : 4;
  {
    Handle space = simple_space(dims, path, "/input/x");
    Handle dcpl = dataset_creation(chunk_dims(dims, elt));
    Handle dset = dataset_handle(H5Dcreate2(group.get(), "x", half ? half_type() : H5T_IEEE_F32LE, space.get(),
                                            H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    if (!dset.valid()) fail_h5(path, "/input/x", "cannot create the dataset");
    herr_t st;
    if (half) {
      const int64_t n = B * S * D;
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[size_t(i)] = double_to_half(x[i]);
      st = H5Dwrite(dset.get(), half_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, h.data());
    } else {
      st = H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    }
    if (st < 0) fail_h5(path, "/input/x", "cannot write the data (disk full?)");
  }
  if (lengths) {
    Handle space = simple_space({B}, path, "/input/lengths");
    Handle dset = dataset_handle(
        H5Dcreate2(group.get(), "lengths", H5T_STD_I32LE, space.get(), H5P_DEFAULT, dataset_creation().get(), H5P_DEFAULT));
    if (!dset.valid()) fail_h5(path, "/input/lengths", "cannot create the dataset");
    if (H5Dwrite(dset.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, lengths) < 0)
      fail_h5(path, "/input/lengths", "cannot write the data (disk full?)");
  }
  group.close();
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0 || !file.close())
    fail_h5(path, "/", "cannot flush and close the file (disk full?)");
}

}  // namespace hk::io
