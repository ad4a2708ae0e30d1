// Internal to src/hk/io (the only code that includes hdf5.h): owning handles, checked opens,
// attribute and type helpers. Every failure becomes an hk::Error of one line,
// "<file>: <object path>: <what was expected, what was found>".
#pragma once

#include <hdf5.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hk::io::detail {

// Debian's HDF5 is built without thread safety: every entry point of src/hk/io that calls
// HDF5 holds this lock, so hk_forward can prefetch the next input chunk on another thread.
std::recursive_mutex& h5_mutex();

// Turns off HDF5's own error-stack printing (once per process); every entry point calls it.
void init();

// The most specific message on HDF5's error stack, or "" (the stack is cleared).
std::string h5_reason();

// Replaces line breaks and other control characters so that a message stays one line.
std::string one_line(const std::string& s, size_t max_len = 200);

[[noreturn]] void fail(const std::string& file, const std::string& object, const std::string& what);
// As fail(), appending HDF5's reason for the failure when it gave one.
[[noreturn]] void fail_h5(const std::string& file, const std::string& object, const std::string& what);

// Makes a closed temporary file durable (fsync) and then visible under `path` (rename): "" on
// success, else why not (one line). rename() alone may expose a file whose data is not on disk.
std::string durable_rename(const std::string& temp, const std::string& path);

// Starts the kernel's write-back of a file being written (sync_file_range, SYNC_FILE_RANGE_WRITE:
// asynchronous, best effort), so that the fsync of the commit finds most of the data on disk
// already instead of writing it all then. Opened on the temporary file once it exists; every
// failure only means the commit's fsync does the whole work.
class WriteBack {
 public:
  WriteBack() = default;
  explicit WriteBack(const std::string& path);
  ~WriteBack();
  WriteBack(const WriteBack&) = delete;
  WriteBack& operator=(const WriteBack&) = delete;
  void start() const noexcept;  // write-back of every dirty page of the file

 private:
  int fd_ = -1;
};

// The kernel's write-back of byte ranges of a file, started on a thread of its own:
// sync_file_range(SYNC_FILE_RANGE_WRITE) waits when the device's request queue is full (measured
// on the GPU machine's disk: one 64 MiB chunk's write in ten took 80-90 ms instead of 25), and the
// writer of the next chunk should not. Requests left when it is destroyed are dropped (the
// caller's fsync writes everything anyway).
class WriteBackQueue {
 public:
  explicit WriteBackQueue(int fd);
  ~WriteBackQueue();
  WriteBackQueue(const WriteBackQueue&) = delete;
  WriteBackQueue& operator=(const WriteBackQueue&) = delete;
  void request(uint64_t begin, uint64_t bytes);

 private:
  int fd_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, uint64_t>> q_;
  bool stop_ = false;
  std::thread t_;
};

// Rows of a contiguous, allocated dataset written with pwrite at the dataset's file offset, past
// HDF5 and its lock: another thread's HDF5 read proceeds while a chunk is written (hk_forward's
// reader and writer), and HDF5's copy through its own buffers is skipped. Each write then starts
// the kernel's write-back of its byte range (as WriteBack). The dataset must be float32 in the
// byte order of the host (native_float_is_f32le) with fill-never, early allocation, and HDF5 must
// never write its raw data itself.
class RawRows {
 public:
  // `file`, `object`: for messages; `path`: the file to open (the temporary output file); `dset`
  // the float32 dataset of shape `dims` [rows, positions, elements] (its offset is read here).
  // `mapped`: each write reserves its byte range (fallocate: blocks allocated, the file extended,
  // never shrunk) and copies into a shared mapping of it instead of calling pwrite. Buffered
  // writes to one file take its inode lock, so the ranks of a job writing one file through
  // pwrite copy one at a time; copies into a mapping of disjoint ranges run side by side. A file
  // system without fallocate gets pwrite.
  RawRows(const std::string& file, const std::string& object, const std::string& path, hid_t dset,
          const std::vector<int64_t>& dims, bool mapped = false);
  ~RawRows();
  RawRows(const RawRows&) = delete;
  RawRows& operator=(const RawRows&) = delete;
  // Rows [b0, b0 + nb) from `data`; throws hk::Error (one line: the rows and the system's reason).
  // With `lengths`, only the first lengths[i] positions of row i are written: the rest of the row
  // must be zero in `data`, and stays a never-written range of the new file, which reads as
  // zeros. Full rows and the valid prefix after them are written in one call.
  void write(int64_t b0, int64_t nb, const void* data, const int32_t* lengths = nullptr) const;
  // fsync (when `sync`) and close: "" on success, else why not.
  std::string finish(bool sync);

 private:
  void write_range(uint64_t begin, uint64_t bytes, const char* p, int64_t b0, int64_t nb) const;
  bool copy_mapped(uint64_t begin, uint64_t bytes, const char* p, int64_t b0, int64_t nb) const;

  std::string file_, object_;
  int fd_ = -1;
  uint64_t offset_ = 0, row_bytes_ = 0, position_bytes_ = 0;
  int positions_ = 0;
  bool mapped_ = false;
  mutable bool no_fallocate_ = false;        // mapped: the file system refused fallocate, pwrite instead
  int write_back_ = 0;                       // HK_WRITE_BACK: 0 async, 1 inline, 2 off
  std::unique_ptr<WriteBackQueue> queue_;  // async: the write-back requests
};

// The file offset of a contiguous dataset's allocated raw data; fails (hk::Error) otherwise.
uint64_t contiguous_offset(hid_t dset, const std::string& file, const std::string& object);
// Whether a float in memory has the bytes of H5T_IEEE_F32LE (RawRows writes memory as it is).
bool native_float_is_f32le();

std::string shape_string(const std::vector<int64_t>& dims);
std::string index_string(const std::vector<int64_t>& index);

// Owns one identifier and closes it with the right H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false when HDF5 reported a failure (e.g. a flush that did not reach disk).
  bool close() {
    if (id_ < 0) return true;
    const herr_t st = closer_(id_);
    id_ = H5I_INVALID_HID;
    return st >= 0;
  }
  void reset() { close(); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

Handle file_handle(hid_t id);
Handle group_handle(hid_t id);
Handle dataset_handle(hid_t id);
Handle attribute_handle(hid_t id);
Handle dataspace_handle(hid_t id);
Handle type_handle(hid_t id);
Handle plist_handle(hid_t id);

// Opens an existing file read-only (or read-write). Distinguishes a missing file, something
// that is not HDF5 and a damaged HDF5 file in the message.
Handle open_file(const std::string& path, bool writable = false);
// File access list for files hk writes (object format of HDF5 1.8).
Handle file_creation_access();
// File creation properties: the root group without timestamps (as every object hk creates), so
// the same content gives the same bytes whatever the clock.
Handle file_creation_props();
// Creates (truncates) a file.
Handle create_file(const std::string& path);

enum class ObjectKind { none, group, dataset, other };
// What `path` (absolute, e.g. "/model/layers/0") names in `file`; none when any component is missing.
ObjectKind object_kind(hid_t file, const std::string& path);
const char* kind_name(ObjectKind k);

// Opens a group / dataset, failing with "expected a group, found a dataset" and the like.
Handle open_group(hid_t file, const std::string& file_path, const std::string& path);
Handle open_dataset(hid_t file, const std::string& file_path, const std::string& path,
                    const std::string& expected_what, hid_t dapl = H5P_DEFAULT);
// Creates or opens the group at `path`, making missing parents.
Handle require_group(hid_t file, const std::string& file_path, const std::string& path);

// The current dimensions of a dataset.
std::vector<int64_t> dataset_dims(hid_t dset, const std::string& file_path, const std::string& path);

// "float32", "float16", "int64", "uint8", "string", "bool (enum)", "compound", ...
std::string describe_type(hid_t type);

// Float layouts the contract accepts; `other` covers every other type.
enum class FloatKind { f16, f32, f64, other };
FloatKind float_kind(hid_t type);
// An IEEE binary16 type in the machine's byte order (HDF5 has no predefined one).
hid_t half_type();  // owned by this module: do not close

// Attributes of an object, as the contract reads them. Each accepts a scalar or a one-element
// dataspace and fails naming `object` and the attribute.
bool has_attribute(hid_t obj, const std::string& name);
std::string read_string_attribute(hid_t obj, const std::string& file, const std::string& object,
                                  const std::string& name);
int64_t read_int_attribute(hid_t obj, const std::string& file, const std::string& object,
                           const std::string& name);
double read_float_attribute(hid_t obj, const std::string& file, const std::string& object,
                            const std::string& name);

void write_string_attribute(hid_t obj, const std::string& file, const std::string& object,
                            const std::string& name, const std::string& value);
void write_int_attribute(hid_t obj, const std::string& file, const std::string& object,
                         const std::string& name, int64_t value);
void write_float_attribute(hid_t obj, const std::string& file, const std::string& object,
                           const std::string& name, double value);

// Selects rows [b0, b0 + nb) of the leading dimension of a dataset of rank `dims.size()`;
// returns the file dataspace with that selection.
Handle select_rows(hid_t dset, const std::vector<int64_t>& dims, int64_t b0, int64_t nb,
                   const std::string& file, const std::string& object);
// Chunk dimensions near `target_bytes` for a dataset of `dims` (each >= 1): whole trailing
// dimensions first, so that a batch row is one or a few contiguous chunks.
std::vector<hsize_t> chunk_dims(const std::vector<int64_t>& dims, size_t element_bytes,
                                size_t target_bytes = size_t(1) << 20);
// A dataset creation list: chunked when `chunk` is not empty, and without object timestamps
// so that the same content always gives the same bytes (reproducible generated files).
Handle dataset_creation(const std::vector<hsize_t>& chunk = {});
// A dataset access list whose chunk cache holds `bytes`, so that batch slices which cut
// through chunks do not read or write a chunk more than once.
Handle chunk_cache_access(size_t bytes);
Handle simple_space(const std::vector<int64_t>& dims, const std::string& file,
                    const std::string& object);

}  // namespace hk::io::detail
