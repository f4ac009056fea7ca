// MPI start-up and shutdown.
#include "distributed/world.h"

#include <cstdlib>

#include "core/error.h"

namespace dptrain::distributed {
namespace {
int g_rank = 0;
}

int current_rank() { return g_rank; }

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  detail::throw_error(file, line, detail::concat(call, " failed on rank ", g_rank, ": ", std::string(text, length)));
}

World::World(int* argc, char*** argv) {
  int provided = 0;
  // FUNNELED: only the main thread talks to MPI; the watchdog and compute threads never do.
  DPTRAIN_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  // Return codes instead of MPI's default abort-on-error, so every failure becomes a located Error.
  DPTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  DPTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  DPTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  g_rank = rank_;
  MPI_Comm local;
  DPTRAIN_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  DPTRAIN_MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  DPTRAIN_MPI_CHECK(MPI_Comm_size(local, &local_size_));
  DPTRAIN_MPI_CHECK(MPI_Comm_free(&local));
}

World::~World() { MPI_Finalize(); }

void World::abort(int exit_code) const {
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
  // A world of one needs no abort (and Open MPI's singleton abort prints a page of noise).
  MPI_Finalize();
  std::exit(exit_code);
}

}  // namespace dptrain::distributed
