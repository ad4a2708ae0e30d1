// The /output group of FORMAT.md written by several MPI processes into one file through
// parallel HDF5 (the MPI-IO file driver). Built only with MPI (HK_HAVE_MPI; target hk_io_mpi).
//
// As OutputFile: the data goes to "<path>.tmp.<pid of rank 0>" beside the final path, and
// commit() renames it into place only after every rank has written its rows and the file is
// closed, so a failed or killed job never leaves a file under the final name.
//
// Every member function except path(), temp_path() and discard() is collective over the
// communicator: all ranks call it, in the same order. write() is one collective hyperslab write
// in which each rank passes its own rows (or none); the rows of the ranks may lie anywhere.
// HK_MPIIO_WRITE (rank 0's value counts) picks how: independent (the default) or posix: write()
// is then not collective, a rank writes its
// rows alone and nb = 0 does nothing (a chunk is one contiguous byte range, which two-phase
// aggregation only reshuffles); posix writes them with pwrite past HDF5 and MPI-IO (RawRows),
// independent through parallel HDF5. collective (two-phase MPI-IO) or individual (collective HDF5
// call, each rank's own MPI-IO write underneath) make write() collective.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hk::io {

class ParallelOutputFile {
 public:
  // The values HK_MPIIO_WRITE takes.
  static const std::vector<std::string>& write_modes();

  ParallelOutputFile(const std::string& path, int64_t B, int S, int D, MPI_Comm comm);
  ~ParallelOutputFile();
  ParallelOutputFile(const ParallelOutputFile&) = delete;
  ParallelOutputFile& operator=(const ParallelOutputFile&) = delete;

  const std::string& path() const;
  const std::string& temp_path() const;

  // A string attribute of /output; rank 0's value is the one written (attributes must be the
  // same on every rank in parallel HDF5).
  void set_attribute(const std::string& name, const std::string& value);
  // Rows [b0, b0 + nb) of y from this rank; nb = 0 takes part in the collective write with no data.
  // `lengths` (optional): as OutputFile::write, padded positions left unwritten (posix mode; the
  // MPI-IO and mmap modes write whole rows).
  void write(int64_t b0, int64_t nb, const float* y, const int32_t* lengths = nullptr);
  // Requires all B rows written (summed over the ranks); closes, syncs, and rank 0 renames the
  // file onto the final path. Every rank returns (or throws) after the rename.
  void commit();
  bool committed() const;

  // Not collective: removes the temporary name now (a rank about to call MPI_Abort, whose
  // peers cannot close the file with it). Never throws.
  void discard() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hk::io
