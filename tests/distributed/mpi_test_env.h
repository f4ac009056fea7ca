// Shared helpers for the MPI test executable: the process's World (created in main.cpp before any
// test runs) and raw-MPI reference collectives, so that tests of the Communicator and of the code
// built on it can check results with plain MPI calls that do not go through the code under test.
//
// Every test in this executable runs on all ranks in the same order. A test must issue the same
// collectives on every rank whatever its assertions find: use EXPECT_* after the first collective,
// and ASSERT_* / GTEST_SKIP() only on conditions that are identical on all ranks (e.g. world size).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/parameters.h"
#include "core/tensor.h"
#include "distributed/communicator.h"
#include "distributed/mpi_check.h"
#include "distributed/reducer.h"
#include "distributed/world.h"
#include "tests/test_util.h"

namespace dptrain::distributed::test {

World& world();  // defined in main.cpp

inline int rank() {
  return world().rank();
}
inline int size() {
  return world().size();
}

// Rank 0's copy of `values`, obtained with a plain MPI_Bcast (not the Communicator under test).
inline std::vector<float> root_copy(std::span<const float> values) {
  std::vector<float> out(values.begin(), values.end());
  DPTRAIN_MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(out.size()), MPI_FLOAT, 0, MPI_COMM_WORLD));
  return out;
}

// Every rank's copy of `values`, concatenated in rank order, with a plain MPI_Allgather.
inline std::vector<float> gather_all(std::span<const float> values) {
  std::vector<float> out(values.size() * static_cast<std::size_t>(size()));
  DPTRAIN_MPI_CHECK(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_FLOAT, out.data(),
                                  static_cast<int>(values.size()), MPI_FLOAT, MPI_COMM_WORLD));
  return out;
}

// True on every rank iff `local` is true on every rank.
inline bool all_ranks(bool local) {
  int v = local ? 1 : 0;
  DPTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return v == 1;
}

using test_util::bitwise_equal;

// A communicator of this process alone, whatever the world's size: every collective leaves its
// buffers as they are, as the MPI communicator of a world of one does.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool accepts(Device device) const override { return device.is_host(); }
  void wait(Pending& pending) override { pending.take(); }
  void barrier(const std::string&) override {}
  std::vector<std::string> gather_to_root(const std::string& mine, const std::string&) override {
    return {mine};
  }

  Pending start_allreduce_elements(void*, std::size_t, DataType, ReduceOp, std::string,
                                   std::string) override {
    return {};
  }
  void allreduce_elements(void*, std::size_t, DataType, ReduceOp, const std::string&) override {}
  void broadcast_elements(void*, std::size_t, DataType, int, const std::string&) override {}
  void allgather_elements(const void* send, void* recv, std::size_t count, DataType type,
                          const std::string&) override {
    std::memcpy(recv, send, count * element_size(type));
  }
  Pending start_reduce_scatter_elements(void*, std::size_t, DataType, ReduceOp, std::string,
                                        std::string) override {
    return {};
  }
  Pending start_allgather_in_place_elements(void*, std::size_t, DataType, std::string, std::string) override {
    return {};
  }
};

// A gradient reducer over `parameters` moved into flat buffers of their own (the trainer's layout).
// With `in_reduction_buffer` the gradients live where the trainer puts them: in the communicator's
// reduction buffer (shared memory for ranks on one host); otherwise in ordinary memory, through MPI.
struct TestReducer {
  TestReducer(Communicator& comm, std::vector<NamedTensor> parameters, ReducerOptions options,
              bool in_reduction_buffer = false)
      : flat(std::move(parameters), Device::cpu(),
             in_reduction_buffer ? BufferAllocator([&comm](std::size_t bytes) {
               return comm.allocate_reduction_buffer(bytes, Device::cpu());
             })
                                 : BufferAllocator{}),
        reducer(comm, flat, options) {}
  FlatParameters flat;
  GradientReducer reducer;
};

}  // namespace dptrain::distributed::test
