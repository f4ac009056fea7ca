// MPI start-up and shutdown.
#include "distributed/world.h"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
#include "distributed/mpi_check.h"

// AddressSanitizer builds (GCC says so with __SANITIZE_ADDRESS__, clang with __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define DPTRAIN_LEAK_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DPTRAIN_LEAK_SANITIZER 1
#endif
#endif
#ifdef DPTRAIN_LEAK_SANITIZER
#include <sanitizer/lsan_interface.h>
#endif

namespace dptrain::distributed {
namespace {
int g_rank = 0;

// Open MPI keeps what MPI_Init allocates until the process ends (tests/lsan.supp names its libraries
// for LeakSanitizer). One block comes from glibc's vasprintf, which keeps no frame pointer: the
// fast unwinder stops there, so no suppression can see that Open MPI asked for it, and the tests
// had to record every allocation's stack with the slow unwinder, which made the sanitizer build's
// end-to-end runs twice as long (resnet20's kill-and-resume case 26 s against 14). What this thread
// allocates inside MPI_Init is Open MPI's; LeakSanitizer is told to leave it out.
int init_mpi(int* argc, char*** argv, int* provided) {
#ifdef DPTRAIN_LEAK_SANITIZER
  const __lsan::ScopedDisabler allocations_of_mpi_init;
#endif
  return MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, provided);
}
}  // namespace

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  const std::string why = MPI_Error_string(code, text, &length) == MPI_SUCCESS
                              ? std::string(text, static_cast<std::size_t>(length))
                              : "MPI error code " + std::to_string(code);
  detail::throw_error(file, line, detail::concat(call, " failed on rank ", g_rank, ": ", why));
}

namespace {
// At the end nothing can be thrown any more (a destructor, an abort): a failure is said on stderr.
void finalize_mpi() {
  if (MPI_Finalize() != MPI_SUCCESS)
    std::fprintf(stderr,
                 "dptrain: warning: MPI_Finalize failed on rank %d; its peers may not have ended cleanly\n",
                 g_rank);
}
}  // namespace

World::World(int* argc, char*** argv) {
  // The communication thread shares its rank's core with the compute thread (on CPUs a rank is one
  // core), and inside a collective Open MPI polls for the peer's data: without yielding, a wait took
  // half the core from the backward pass it was meant to overlap. The user's setting (environment,
  // mpirun -mca) wins; other MPI libraries ignore the variable.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  int provided = 0;
  // SERIALIZED: the main thread and the communication thread call MPI, never at the same time.
  DPTRAIN_MPI_CHECK(init_mpi(argc, argv, &provided));
  DPTRAIN_CHECK(provided >= MPI_THREAD_SERIALIZED,
                "this MPI library does not support MPI_THREAD_SERIALIZED, "
                "which the overlapped gradient reduction needs");
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
  const int first_on_host = local_rank_ == 0 ? 1 : 0;
  DPTRAIN_MPI_CHECK(MPI_Allreduce(&first_on_host, &hosts_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
}

std::string mpi_library_built_against() {
#if defined(OMPI_MAJOR_VERSION)
  return "Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." + std::to_string(OMPI_MINOR_VERSION) + "." +
         std::to_string(OMPI_RELEASE_VERSION);
#else
  return "an MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION) + " library";
#endif
}

World::~World() {
  finalize_mpi();
}

std::string World::broadcast_from_root(const std::string& text) const {
  if (size_ == 1) return text;
  int64_t length = static_cast<int64_t>(text.size());
  DPTRAIN_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
  std::string out = rank_ == 0 ? text : std::string(static_cast<std::size_t>(length), '\0');
  DPTRAIN_CHECK(length <= INT32_MAX, "broadcast of ", length, " bytes exceeds MPI's int count");
  DPTRAIN_MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(length), MPI_CHAR, 0, MPI_COMM_WORLD));
  return out;
}

void World::exit_with_error(const char* program, const char* what, int exit_code) const {
  // Open MPI takes every rank down within about a second of rank 0's MPI_Abort on one host.
  constexpr std::chrono::seconds kRootFirst{2};
  if (size_ > 1 && rank_ != 0) {
    // The job is ending: Open MPI's SIGTERM ends this rank as it is, not through a stop handler
    // that would announce a checkpoint.
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGINT, SIG_DFL);
    std::this_thread::sleep_for(kRootFirst);
  }
  std::fprintf(stderr, "%s: error on rank %d: %s\n", program, rank_, what);
  std::fflush(stderr);
  abort(exit_code);
}

void World::abort(int exit_code) const {
  if (size_ > 1) {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    // Returned: the abort failed. MPI_Finalize would wait for the peers; this rank at least ends.
    std::fprintf(stderr, "dptrain: MPI_Abort failed on rank %d; this rank exits alone\n", rank_);
    std::_Exit(exit_code);
  }
  // A world of one needs no abort (and Open MPI's singleton abort prints a page of noise).
  finalize_mpi();
  std::exit(exit_code);
}

}  // namespace dptrain::distributed
