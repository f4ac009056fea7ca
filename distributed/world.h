// The MPI world of this process: start-up, rank, size, local rank, and a stop that takes every
// rank down. (MPI itself stays in the .cpp files: distributed/mpi_check.h.)
#pragma once

#include <string>

namespace dptrain::distributed {

// The MPI library this binary was built against, "Open MPI 4.1.4" (before or without MPI_Init).
std::string mpi_library_built_against();

class World {
 public:
  // Initialises MPI (works without mpirun too: a singleton world of one).
  World(int* argc, char*** argv);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among the processes on this host
  int local_size() const { return local_size_; }
  int hosts() const { return hosts_; }  // hosts the ranks run on (by shared memory: a node)
  bool is_root() const { return rank_ == 0; }

  // Rank 0's `text` on every rank (e.g. the config: rank 0 reads and validates it, so errors are
  // reported once and the other ranks need no copy of the file).
  std::string broadcast_from_root(const std::string& text) const;

  // Ends the whole job from any rank: no rank is left waiting in a collective.
  [[noreturn]] void abort(int exit_code) const;
  // Prints "<program>: error on rank R: <what>" as one line and ends the job (abort). A rank other
  // than 0 first gives rank 0 a moment to do so: an error that every rank meets alike (a model that
  // cannot be built, a bad flag) then prints once, not once per rank with Open MPI's abort banner
  // between, while an error of one rank still ends a job whose other ranks wait on it.
  [[noreturn]] void exit_with_error(const char* program, const char* what, int exit_code = 1) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, hosts_ = 1;
};

}  // namespace dptrain::distributed
