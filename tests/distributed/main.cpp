// main() of distributed_tests: starts MPI through dptrain::distributed::World, runs every test on
// every rank, and exits non-zero on all ranks if any rank saw a failure. Only rank 0 keeps gtest's
// printer; the other ranks print just their failures, prefixed with their rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "distributed/mpi_check.h"
#include "distributed/world.h"

namespace dptrain::distributed::test {
namespace {
World* g_world = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stderr);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    std::fflush(stderr);
  }

 private:
  int rank_;
};
}  // namespace

World& world() {
  return *g_world;
}

}  // namespace dptrain::distributed::test

int main(int argc, char** argv) {
  dptrain::distributed::World world(&argc, &argv);
  dptrain::distributed::test::g_world = &world;
  ::testing::InitGoogleTest(&argc, argv);
  // Test order must be the same on every rank: every test runs collectives.
  GTEST_FLAG_SET(shuffle, false);
  if (world.rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new dptrain::distributed::test::RankFailurePrinter(world.rank()));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  DPTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (failed && world.rank() == 0 && world.size() > 1)
    std::fprintf(stderr, "distributed_tests: a failure on at least one rank (see [rank N] lines)\n");
  return failed;
}
