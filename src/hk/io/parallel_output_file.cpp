#include "hk/io/parallel_output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "hk/error.hpp"
#include "hk/io/h5_detail.hpp"
#include "hk/tune/knobs.hpp"

namespace hk::io {

using namespace detail;

namespace {

// Rank 0's string on every rank.
std::string broadcast(const std::string& s, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  long long n = rank == 0 ? (long long)s.size() : 0;
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
  std::string out = rank == 0 ? s : std::string(size_t(n), '\0');
  if (n > 0) MPI_Bcast(out.data(), int(n), MPI_CHAR, 0, comm);
  return out;
}

// True on every rank when `ok` is true on every rank.
bool all_ok(bool ok, MPI_Comm comm) {
  int local = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm);
  return all == 1;
}

// The lowest rank whose `err` (an errno value) is not 0 and that err, on every rank; {-1, 0} when
// every rank passed 0.
std::pair<int, int> first_failure(int err, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int mine = err != 0 ? rank : size, low = size;
  MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, comm);
  if (low == size) return {-1, 0};
  int code = err;
  MPI_Bcast(&code, 1, MPI_INT, low, comm);
  return {low, code};
}

// errno of opening `path` with `flags` (0: opened, and closed again).
int open_errno(const std::string& path, int flags) {
  errno = 0;
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return errno != 0 ? errno : EIO;
  ::close(fd);
  return 0;
}

}  // namespace

struct ParallelOutputFile::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  std::string path, temp;
  Handle file, group, y, dxpl;
  std::vector<int64_t> dims;
  int64_t rows_written = 0;  // by this rank
  std::string mode;          // HK_MPIIO_WRITE
  std::unique_ptr<WriteBack> write_back;  // this rank's request to start the disk write after each chunk
  std::unique_ptr<RawRows> raw;           // "posix", "mmap": this rank's rows written past HDF5 and MPI-IO
  bool independent = false;  // no write rounds: a rank writes its rows alone, empty writes are skipped
  bool committed = false;

  // Collective: the handles are closed by every rank together.
  ~Impl() {
    if (committed) return;
    raw.reset();
    y.close();
    group.close();
    file.close();
    if (rank == 0 && !temp.empty()) ::unlink(temp.c_str());
  }
};

const std::vector<std::string>& ParallelOutputFile::write_modes() {
  static const std::vector<std::string> modes = {"posix", "mmap", "independent", "collective", "individual"};
  return modes;
}

ParallelOutputFile::ParallelOutputFile(const std::string& path, int64_t B, int S, int D, MPI_Comm comm) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  if (B < 1 || S < 1 || D < 1)
    fail(path, "/output/y", "expected B, S and D >= 1, found [" + std::to_string(B) + ", " + std::to_string(S) +
                                ", " + std::to_string(D) + "]");
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  struct stat st;
  const bool is_dir = rank == 0 && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (!all_ok(!is_dir, comm)) fail(path, "/", "expected a file path for the output, found a directory");
  // The write mode (HK_MPIIO_WRITE), agreed: rank 0's value, so that every rank makes the same calls.
  // Unset: "independent" (measured faster than "posix" with 2 ranks on one node, perf/RESULTS.md).
  std::string mode;
  if (rank == 0) {
    try {
      mode = tune::knob_choice("HK_MPIIO_WRITE", write_modes());
      if (mode.empty()) mode = "independent";
    } catch (const Error& e) {
      mode = std::string("!") + e.what();  // every rank fails with rank 0's message
    }
  }
  mode = broadcast(mode, comm);
  if (mode[0] == '!') throw Error(mode.substr(1));
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.mode = mode;
  m.comm = comm;
  m.rank = rank;
  m.path = path;
  m.temp = path + ".tmp." + broadcast(std::to_string(::getpid()), comm);
  m.dims = {B, S, D};
  // Every rank opens the temporary file on its own first (rank 0 creates it, then the others open
  // it): a rank that cannot (a node with another view of the directory, a read-only mount,
  // permissions) would otherwise fail inside the collective MPI-IO create while the other ranks
  // wait there for it (the job hung, the file left behind). The first failing rank and its reason
  // reach every rank, which all throw the same CollectiveError; rank 0 removes what it created.
  {
    auto [who, code] = first_failure(rank == 0 ? open_errno(m.temp, O_WRONLY | O_CREAT | O_TRUNC) : 0, comm);
    if (who < 0) std::tie(who, code) = first_failure(rank == 0 ? 0 : open_errno(m.temp, O_WRONLY), comm);
    if (who >= 0) {
      if (rank == 0 && who != 0) ::unlink(m.temp.c_str());
      m.temp.clear();
      int size = 1;
      MPI_Comm_size(comm, &size);
      impl_.reset();
      try {
        fail(path, "/", "cannot create the temporary output file " + path + ".tmp.*" +
                            (size > 1 ? " on rank " + std::to_string(who) : std::string()) + " (" + std::strerror(code) + ")");
      } catch (const Error& e) {
        throw CollectiveError(e.what());  // every rank, the same message: the job reports it once
      }
    }
  }
  try {
    Handle fapl = file_creation_access();
    if (H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL) < 0)
      fail_h5(path, "/", "cannot select the MPI-IO file driver");
    errno = 0;
    const hid_t f = H5Fcreate(m.temp.c_str(), H5F_ACC_TRUNC, file_creation_props().get(), fapl.get());
    const int err = errno;
    if (!all_ok(f >= 0, comm)) {
      if (f >= 0) H5Fclose(f);  // collective: every rank that opened it closes it
      // m.temp stays: rank 0 created the file above, and the catch below removes it.
      fail_h5(path, "/", std::string("cannot create the temporary output file ") + path + ".tmp.* (" +
                             (err ? std::strerror(err) : "failed on some rank") + ")");
    }
    m.file = file_handle(f);
    m.write_back = std::make_unique<WriteBack>(m.temp);
    m.group = require_group(m.file.get(), path, "/output");
    Handle space = simple_space(m.dims, path, "/output/y");
    // Contiguous: each rank's rows are one byte range of the file, which MPI-IO aggregates best;
    // no fill (every element is written before commit) and space allocated at creation, as
    // parallel HDF5 requires.
    Handle dcpl = dataset_creation();
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    m.y = dataset_handle(
        H5Dcreate2(m.group.get(), "y", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    if (!m.y.valid()) fail_h5(path, "/output/y", "cannot create the dataset");
    m.dxpl = plist_handle(H5Pcreate(H5P_DATASET_XFER));
    const bool raw = m.mode == "posix" || m.mode == "mmap";
    m.independent = m.mode == "independent" || raw;
    if (raw) {
      std::string why;  // agreed: a rank that cannot write makes every rank fail here
      try {
        if (!native_float_is_f32le())
          fail(path, "/output/y", "HK_MPIIO_WRITE=" + m.mode + " writes memory floats as they are: expected "
                                  "little-endian float32 on this host, found another layout (use independent)");
        m.raw = std::make_unique<RawRows>(path, "/output/y", m.temp, m.y.get(), m.dims, m.mode == "mmap");
      } catch (const Error& e) {
        why = e.what();
      }
      if (!all_ok(why.empty(), comm))
        throw Error(why.empty() ? path + ": /output/y: cannot open the temporary output file on some rank" : why);
    }
  } catch (...) {
    impl_.reset();  // collective close (every rank reaches this together) and removal
    throw;
  }
}

ParallelOutputFile::~ParallelOutputFile() {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  impl_.reset();
}

const std::string& ParallelOutputFile::path() const { return impl_->path; }
const std::string& ParallelOutputFile::temp_path() const { return impl_->temp; }
bool ParallelOutputFile::committed() const { return impl_->committed; }

void ParallelOutputFile::discard() noexcept {
  if (impl_ && !impl_->committed && !impl_->temp.empty()) ::unlink(impl_->temp.c_str());
}

void ParallelOutputFile::set_attribute(const std::string& name, const std::string& value) {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  Impl& m = *impl_;
  if (m.committed) throw Error(m.path + ": /output: already committed, cannot set attribute '" + name + "'");
  write_string_attribute(m.group.get(), m.path, "/output", name, broadcast(value, m.comm));
}

void ParallelOutputFile::write(int64_t b0, int64_t nb, const float* y, const int32_t* lengths) {
  Impl& m = *impl_;
  if (m.committed) throw Error(m.path + ": /output/y: already committed, cannot write");
  if (nb < 0 || b0 < 0 || b0 > m.dims[0] - nb)
    fail(m.path, "/output/y", "rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                  ") requested, expected a range inside [0, " + std::to_string(m.dims[0]) + ")");
  if (nb == 0 && m.independent) return;
  if (m.raw) {  // no HDF5 call and not the HDF5 lock: the reader's HDF5 read goes on meanwhile
    m.raw->write(b0, nb, y, lengths);
    m.rows_written += nb;
    return;
  }
  std::unique_lock<std::recursive_mutex> lock(h5_mutex());
  init();
  Handle fspace, mspace;
  if (nb > 0) {
    fspace = select_rows(m.y.get(), m.dims, b0, nb, m.path, "/output/y");
    mspace = simple_space({nb, m.dims[1], m.dims[2]}, m.path, "/output/y");
  } else {
    // No rows from this rank in this collective call: empty selections on both sides.
    fspace = dataspace_handle(H5Dget_space(m.y.get()));
    mspace = simple_space({1, m.dims[1], m.dims[2]}, m.path, "/output/y");
    if (!fspace.valid() || H5Sselect_none(fspace.get()) < 0 || H5Sselect_none(mspace.get()) < 0)
      fail_h5(m.path, "/output/y", "cannot make an empty selection");
  }
  static const float kNone = 0.0f;
  if (H5Dwrite(m.y.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), m.dxpl.get(), nb > 0 ? y : &kNone) < 0)
    fail_h5(m.path, "/output/y", "cannot write rows [" + std::to_string(b0) + ", " + std::to_string(b0 + nb) +
                                     ") (disk full?)");
  m.rows_written += nb;
  fspace.close();  // HDF5 handles are released under the lock, the write-back request outside it
  mspace.close();
  lock.unlock();
  if (nb > 0) m.write_back->start();
}

void ParallelOutputFile::commit() {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  init();
  Impl& m = *impl_;
  if (m.committed) return;
  long long mine = m.rows_written, total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, m.comm);
  if (total != m.dims[0])
    fail(m.path, "/output/y", "expected all " + std::to_string(m.dims[0]) + " rows written before commit, found " +
                                  std::to_string(total));
  // posix, mmap: each rank's rows on disk (its own fsync: the ranks may not share a page cache when the
  // mode was asked for across nodes). Then the collective flush and close (MPI_File_sync + close
  // underneath), then one rank makes it durable and visible.
  std::string raw_why = m.raw ? m.raw->finish(/*sync=*/true) : "";
  if (!all_ok(raw_why.empty(), m.comm))
    fail(m.path, "/output/y", raw_why.empty() ? "cannot sync the rows written on some rank" : raw_why);
  m.dxpl.close();
  m.write_back.reset();
  const bool closed = m.y.close() && m.group.close() && H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) >= 0 &&
                      m.file.close();
  if (!all_ok(closed, m.comm))
    fail_h5(m.path, "/", "cannot flush and close the temporary output file " + m.temp + " (disk full?)");
  std::string why;
  if (m.rank == 0) why = durable_rename(m.temp, m.path);
  why = broadcast(why, m.comm);
  if (!why.empty()) {
    if (m.rank == 0) ::unlink(m.temp.c_str());
    m.temp.clear();
    fail(m.path, "/", why);
  }
  m.committed = true;
}

}  // namespace hk::io
