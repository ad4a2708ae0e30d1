// The processes of one hk_forward job. Under mpirun / srun in an MPI build, MPI_COMM_WORLD;
// otherwise (no MPI at build time, or started without a launcher) one process, every member
// answering as for a world of one. hk_forward talks to MPI only through this class.
#pragma once

#include <cstdint>
#include <string>

#include "hk/build_config.hpp"

#if HK_HAVE_MPI
#include <mpi.h>
#endif

namespace hk::app {

// What the launcher said in the environment, readable before MPI is initialised.
struct LaunchInfo {
  bool launched = false;  // started by mpirun / mpiexec / srun (a world that may hold other processes)
  int rank = 0, size = 1;  // -1 / 0 when the launcher does not say before MPI_Init
  int local_rank = -1;     // OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID; -1 unknown
  std::string size_from;   // the variable `size` came from, for messages
};
// HK_MPI=0 forces a single process, HK_MPI=1 forces MPI initialisation.
LaunchInfo launch_info();

// Thrown after Job::agree reported a failure: every rank leaves with this exit code.
struct AgreedFailure {
  int code = 1;
};

class Job {
 public:
  // Initialises MPI when the build has it and a launcher started the process; throws hk::Error
  // when a launcher started several copies of a build without MPI (they would each run the
  // whole job and race on one output). Call once, before any thread is started.
  explicit Job(int* argc, char*** argv);
  ~Job();  // MPI_Finalize
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  bool mpi() const { return mpi_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among the processes of this node
  int local_size() const { return local_size_; }  // processes of this job on this node

  int64_t min(int64_t v) const;
  int64_t max(int64_t v) const;
  double max(double v) const;
  void barrier() const;

  // Agreement on a failure of any rank: every rank passes its own error ("" for none); all get
  // back the error of the lowest failing rank ("" when none failed), and rank 0 has printed it
  // as hk_forward's one error line (with "(rank r of N)" when N > 1) before anyone returns.
  std::string agree(const std::string& local_error, const char* program) const;

  // Prints "program: error: what (rank r of N)" and ends the whole job with `code` (MPI_Abort;
  // std::_Exit in a single process). Safe from any thread.
  [[noreturn]] void abort(const char* program, const std::string& what, int code) const;

#if HK_HAVE_MPI
  MPI_Comm comm() const { return MPI_COMM_WORLD; }
#endif

 private:
  bool mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace hk::app
