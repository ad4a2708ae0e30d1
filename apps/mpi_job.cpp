#include "mpi_job.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "app_common.hpp"
#include "hk/error.hpp"

namespace hk::app {

namespace {

// The integer value of the first of `names` that is set, or `fallback`.
int env_int(std::initializer_list<const char*> names, int fallback, std::string* which = nullptr) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) {
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (end && *end == '\0' && x >= 0 && x < (1L << 30)) {
        if (which) *which = n;
        return int(x);
      }
    }
  return fallback;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace

LaunchInfo launch_info() {
  LaunchInfo li;
  // Open MPI's mpirun, PMIx (srun --mpi=pmix, Open MPI 4+), PMI-1/2 (MPICH's hydra, srun --mpi=pmi2),
  // and a Slurm step of several tasks.
  li.launched = env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK") ||
                env_set("PMI_SIZE") || env_int({"SLURM_STEP_NUM_TASKS"}, 1) > 1;
  li.rank = env_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}, li.launched ? -1 : 0);
  li.size = env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}, li.launched ? 0 : 1, &li.size_from);
  li.local_rank = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}, -1);
  if (const char* f = std::getenv("HK_MPI"); f && *f) li.launched = std::string(f) != "0";
  if (!li.launched) {
    li.rank = 0;
    li.size = 1;
  }
  return li;
}

Job::Job(int* argc, char*** argv) {
  const LaunchInfo li = launch_info();
#if HK_HAVE_MPI
  if (li.launched) {
    int provided = 0;
    // MULTIPLE: the writer thread makes the collective writes and the failing thread calls
    // MPI_Abort while another may be inside MPI.
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed");
    mpi_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      // Every rank gets the same answer from the same library: all stop with the same line.
      MPI_Finalize();
      mpi_ = false;
      throw Error("the MPI library does not provide MPI_THREAD_MULTIPLE (the output is written from a "
                  "writer thread while other threads may call MPI); rebuild against an MPI with thread support");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The processes sharing this node's memory; the launcher's local rank when it gives one
    // (the GPU a rank uses follows it).
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    if (li.local_rank >= 0) local_rank_ = li.local_rank;
    return;
  }
#else
  (void)argc;
  (void)argv;
  if (li.launched && li.size > 1)
    throw Error("started as " + std::to_string(li.size) + " processes (" + li.size_from +
                "), but this hk_forward was built without MPI (HK_ENABLE_MPI): each would run the whole job; "
                "run one process, or build with MPI");
#endif
  rank_ = 0;
  size_ = 1;
  local_rank_ = li.local_rank >= 0 ? li.local_rank : 0;
}

Job::~Job() {
#if HK_HAVE_MPI
  if (mpi_) MPI_Finalize();
#endif
}

#if HK_HAVE_MPI
namespace {
int64_t allreduce(int64_t v, MPI_Op op) {
  long long in = v, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_LONG_LONG, op, MPI_COMM_WORLD);
  return out;
}
}  // namespace
#endif

int64_t Job::min(int64_t v) const {
#if HK_HAVE_MPI
  if (mpi_) return allreduce(v, MPI_MIN);
#endif
  return v;
}

int64_t Job::max(int64_t v) const {
#if HK_HAVE_MPI
  if (mpi_) return allreduce(v, MPI_MAX);
#endif
  return v;
}

double Job::max(double v) const {
#if HK_HAVE_MPI
  if (mpi_) {
    double out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }
#endif
  return v;
}

void Job::barrier() const {
#if HK_HAVE_MPI
  if (mpi_) MPI_Barrier(MPI_COMM_WORLD);
#endif
}

std::string Job::agree(const std::string& local_error, const char* program) const {
  std::string err = local_error;
  int failed_rank = err.empty() ? size_ : rank_;
#if HK_HAVE_MPI
  if (mpi_) {
    int first = 0;
    MPI_Allreduce(&failed_rank, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    failed_rank = first;
    if (failed_rank < size_) {
      long long n = rank_ == failed_rank ? (long long)err.size() : 0;
      MPI_Bcast(&n, 1, MPI_LONG_LONG, failed_rank, MPI_COMM_WORLD);
      if (rank_ != failed_rank) err.assign(size_t(n), '\0');
      if (n > 0) MPI_Bcast(err.data(), int(n), MPI_CHAR, failed_rank, MPI_COMM_WORLD);
    }
  }
#endif
  if (failed_rank >= size_) return "";
  if (err.empty()) err = "failed without a message";
  if (rank_ == 0) {
    const std::string where = size_ > 1 ? " (rank " + std::to_string(failed_rank) + " of " + std::to_string(size_) + ")" : "";
    report_error(program, err + where);
    std::fflush(stderr);
  }
  barrier();  // printed before any rank goes on to exit or abort
  return err;
}

void Job::abort(const char* program, const std::string& what, int code) const {
  const std::string where = size_ > 1 ? " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")" : "";
  report_error(program, what + where);
  std::fflush(stderr);
  std::fflush(stdout);
#if HK_HAVE_MPI
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

}  // namespace hk::app
