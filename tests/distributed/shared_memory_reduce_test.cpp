// Reductions in shared memory (distributed/shared_memory_reduce.h), through the MPI communicator's
// reduction buffers: results against closed forms and against a rank-order sum of every rank's input
// gathered with plain MPI; elements beside the reduced range untouched on every rank; the path taken
// counted (shared_memory_collectives), never assumed; disagreeing ranks stopped with one message.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "distributed/mpi_communicator.h"
#include "mpi_test_env.h"

namespace dptrain::distributed {
namespace {

constexpr float kUntouched = -7.0f;

template <typename T>
std::span<T> elements_of(const StoragePtr& memory) {
  return {memory->as<T>(), memory->bytes() / sizeof(T)};
}

// Rank r's value at element i: (r + 1) * (i % 97 + 1); over N ranks the sum is N (N + 1) / 2 * (i % 97 + 1).
template <typename T>
void fill_ramp(std::span<T> values, int r) {
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<T>((r + 1) * static_cast<int>(i % 97 + 1));
}

// Sizes around a split into cache lines per rank, and offsets that start off a line.
TEST(SharedMemoryReduce, AllreduceSumsAndAveragesExactlyAndLeavesTheRestAlone) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  const std::size_t capacity = (std::size_t{1} << 20) + 64;
  StoragePtr memory = comm.allocate_reduction_buffer(capacity * sizeof(float), Device::cpu());
  ASSERT_GE(memory->bytes(), capacity * sizeof(float));
  EXPECT_EQ(comm.reduces_in_shared_memory(memory->data()), N > 1);
  const std::span<float> all = elements_of<float>(memory);
  uint64_t collectives = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{63},
                        std::size_t{1000}, std::size_t{1} << 20}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{3}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        std::fill(all.begin(), all.end(), kUntouched);
        const std::span<float> values = all.subspan(offset, n);
        fill_ramp(values, r);
        comm.allreduce(values, op, "test allreduce in shared memory");
        ++collectives;
        std::size_t wrong = 0, touched = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float k = static_cast<float>(i % 97 + 1);
          wrong += values[i] != (op == ReduceOp::kSum ? static_cast<float>(N * (N + 1) / 2) * k
                                                      : static_cast<float>((N + 1) / 2.0) * k);
        }
        for (std::size_t i = 0; i < all.size(); ++i)
          touched += (i < offset || i >= offset + n) && all[i] != kUntouched;
        EXPECT_EQ(wrong, 0u) << n << " elements at " << offset
                             << (op == ReduceOp::kSum ? ", sum" : ", average");
        EXPECT_EQ(touched, 0u) << n << " elements at " << offset << ": elements outside them changed";
        // The peers write into this rank's buffer: nobody may run ahead before all are done.
        ASSERT_TRUE(test::all_ranks(wrong == 0 && touched == 0));
      }
    }
  }
  EXPECT_EQ(comm.shared_memory_collectives(), N > 1 ? collectives : 0u);
}

// Random floats: the result is every rank's input added in rank order, bit for bit (for two ranks
// a + b, what MPI_Allreduce gives as well: checked against it on an ordinary buffer).
TEST(SharedMemoryReduce, FloatsAreAddedInRankOrderAndMatchMpiOnTwoRanks) {
  MpiCommunicator comm(test::world());
  const int N = comm.size();
  const std::size_t n = 100'003;
  StoragePtr memory = comm.allocate_reduction_buffer(n * sizeof(float), Device::cpu());
  const std::span<float> shared = elements_of<float>(memory).first(n);
  std::mt19937 random(1234u + static_cast<unsigned>(comm.rank()));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : shared) v = normal(random);
  std::vector<float> ordinary(shared.begin(), shared.end());
  const std::vector<float> inputs = test::gather_all(shared);
  Pending pending = comm.start_allreduce(shared, ReduceOp::kSum, "test random allreduce");
  comm.wait(pending);
  comm.allreduce(std::span<float>(ordinary), ReduceOp::kSum, "test random allreduce through MPI");
  std::size_t not_rank_order = 0, not_mpi = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float sum = inputs[i];
    for (int q = 1; q < N; ++q) sum += inputs[static_cast<std::size_t>(q) * n + i];
    not_rank_order += std::memcmp(&sum, &shared[i], sizeof sum) != 0;
    not_mpi += std::memcmp(&ordinary[i], &shared[i], sizeof sum) != 0;
  }
  EXPECT_EQ(not_rank_order, 0u);
  if (N <= 2) {
    EXPECT_EQ(not_mpi, 0u);
  }
  EXPECT_EQ(comm.shared_memory_collectives(), N > 1 ? 1u : 0u);
}

// Buckets in flight at once on the communication thread, as the reducer starts them in backward.
TEST(SharedMemoryReduce, StartedAllreducesOfSeveralBucketsCompleteInOrder) {
  MpiCommunicator comm(test::world());
  const int N = comm.size();
  const std::vector<std::size_t> buckets = {1000, 4096, 17, 250'000};
  std::size_t total = 0;
  for (std::size_t b : buckets) total += b;
  StoragePtr memory = comm.allocate_reduction_buffer(total * sizeof(double), Device::cpu());
  std::span<double> rest = elements_of<double>(memory);
  std::vector<std::span<double>> spans;
  std::vector<Pending> pending;
  for (std::size_t b : buckets) {
    spans.push_back(rest.first(b));
    rest = rest.subspan(b);
    fill_ramp(spans.back(), comm.rank());
    pending.push_back(comm.start_allreduce(spans.back(), ReduceOp::kAverage, "test bucket"));
  }
  for (Pending& p : pending) comm.wait(p);
  for (const std::span<double>& values : spans) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < values.size(); ++i)
      wrong += values[i] != (N + 1) / 2.0 * static_cast<double>(i % 97 + 1);
    EXPECT_EQ(wrong, 0u) << values.size() << " elements";
  }
  EXPECT_EQ(comm.shared_memory_collectives(), N > 1 ? buckets.size() : 0u);
}

// Halves sum in half precision (small integers: exact in fp16 and bf16), the compression's path.
TEST(SharedMemoryReduce, HalvesSumInHalfPrecision) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  const std::size_t n = 3001;
  StoragePtr memory = comm.allocate_reduction_buffer(n * sizeof(uint16_t), Device::cpu());
  const std::span<uint16_t> halves = elements_of<uint16_t>(memory).first(n);
  for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    const bool fp16 = format == HalfFormat::kFp16;
    for (std::size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((r + 1) * static_cast<int>(i % 5 + 1));
      halves[i] = fp16 ? float_to_half(v) : float_to_bfloat16(v);
    }
    comm.allreduce_half(halves, format, "test half allreduce");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += (fp16 ? half_to_float(halves[i]) : bfloat16_to_float(halves[i])) !=
               static_cast<float>(N * (N + 1) / 2 * static_cast<int>(i % 5 + 1));
    EXPECT_EQ(wrong, 0u) << (fp16 ? "fp16" : "bf16");
  }
  EXPECT_EQ(comm.shared_memory_collectives(), N > 1 ? 2u : 0u);
}

// Chunk r holds the sum on rank r; this rank's other chunks keep its own values.
TEST(SharedMemoryReduce, ReduceScatterSumsThisRanksChunkOnly) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  const std::size_t chunk = 1001, n = chunk * static_cast<std::size_t>(N);
  StoragePtr memory = comm.allocate_reduction_buffer(n * sizeof(float), Device::cpu());
  const std::span<float> values = elements_of<float>(memory).first(n);
  fill_ramp(values, r);
  comm.reduce_scatter(values, ReduceOp::kSum, "test reduce-scatter in shared memory");
  std::size_t wrong = 0, changed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float k = static_cast<float>(i % 97 + 1);
    if (i / chunk == static_cast<std::size_t>(r))
      wrong += values[i] != static_cast<float>(N * (N + 1) / 2) * k;
    else
      changed += values[i] != static_cast<float>(r + 1) * k;
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(changed, 0u);
  EXPECT_EQ(comm.shared_memory_collectives(), N > 1 ? 1u : 0u);
}

// The fp32 sum that tests its result for Inf and NaN as it makes it (the reducer then skips its own
// pass over the gradients). Every rank gets the same answer, whichever rank's chunk the culprit lies
// in: finite sums, the largest included, say finite; a NaN or an infinity from one rank, and finite
// addends whose sum overflows, say not. Memory outside the segment and a world of one leave the test
// to the caller (nullopt).
TEST(SharedMemoryReduce, SumTellsEveryRankWhetherTheResultIsFinite) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  const std::size_t n = 1000;
  StoragePtr memory = comm.allocate_reduction_buffer(n * sizeof(float), Device::cpu());
  const std::span<float> values = elements_of<float>(memory).first(n);
  std::vector<float> ordinary(n);
  bool finite = false;
  EXPECT_FALSE(comm.start_sum_testing_finite(ordinary, &finite, "test ordinary memory", {}, true));
  if (N == 1) {
    EXPECT_FALSE(comm.start_sum_testing_finite(values, &finite, "test world of one", {}, true));
    return;
  }
  constexpr float kInf = std::numeric_limits<float>::infinity(), kMax = std::numeric_limits<float>::max();
  struct Case {
    const char* name;
    std::size_t at;
    float value;
    int on_rank;  // -1: every rank
    bool finite;
  };
  const Case cases[] = {
      {"finite addends", 0, 1.0f, 0, true},
      {"the largest finite sums", n - 1, kMax / static_cast<float>(N) / 2, -1, true},
      {"NaN from the last rank in rank 0's chunk", 0, std::numeric_limits<float>::quiet_NaN(), N - 1, false},
      {"inf from rank 0 in the last rank's chunk", n - 1, kInf, 0, false},
      {"-inf from the last rank mid-buffer", n / 2, -kInf, N - 1, false},
      {"finite addends whose sum overflows", n - 1, kMax / 1.5f, -1, false},
  };
  uint64_t collectives = 0;
  for (const Case& c : cases)
    for (bool synchronous : {true, false}) {
      fill_ramp(values, r);
      if (c.on_rank < 0 || c.on_rank == r) values[c.at] = c.value;
      finite = !c.finite;
      std::optional<Pending> started =
          comm.start_sum_testing_finite(values, &finite, "test sum testing finite", {}, synchronous);
      ASSERT_TRUE(started) << c.name;
      EXPECT_EQ(started->active(), !synchronous) << c.name;
      comm.wait(*started);
      ++collectives;
      EXPECT_EQ(finite, c.finite) << c.name << (synchronous ? ", synchronous" : ", started") << ", rank "
                                  << r;
      const std::size_t other = c.at == 0 ? n - 1 : 0;
      EXPECT_EQ(values[other], static_cast<float>(N * (N + 1) / 2 * static_cast<int>(other % 97 + 1)))
          << c.name;
      ASSERT_TRUE(test::all_ranks(finite == c.finite));
    }
  EXPECT_EQ(comm.shared_memory_collectives(), collectives);
}

// All-gathers in place of floats and of 2-byte elements, several in flight, from an offset inside the
// buffer: every rank ends with every rank's chunk, and the elements around them are untouched.
TEST(SharedMemoryReduce, AllgatherGivesEveryRankEveryChunk) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  const std::size_t chunk = 1001, begin = 5, n = chunk * static_cast<std::size_t>(N);
  StoragePtr floats_memory = comm.allocate_reduction_buffer((n + 2 * begin) * sizeof(float), Device::cpu());
  StoragePtr halves_memory = comm.allocate_reduction_buffer(n * sizeof(uint16_t), Device::cpu());
  const std::span<float> floats = elements_of<float>(floats_memory);
  const std::span<uint16_t> halves = elements_of<uint16_t>(halves_memory);
  // Chunk q holds rank q's values (q + 1) * 1000 + i; the others' chunks hold garbage on this rank.
  const auto owned_value = [&](int q, std::size_t i) { return static_cast<float>((q + 1) * 1000 + i % 997); };
  std::fill(floats.begin(), floats.end(), kUntouched);
  for (int q = 0; q < N; ++q)
    for (std::size_t i = 0; i < chunk; ++i) {
      const std::size_t at = static_cast<std::size_t>(q) * chunk + i;
      floats[begin + at] = q == r ? owned_value(q, i) : -1.0f;
      halves[at] = static_cast<uint16_t>(q == r ? q * 7 + i % 5 : 0xffff);
    }
  std::vector<Pending> pending;
  pending.push_back(comm.start_allgather_in_place(floats.subspan(begin, n), "test all-gather of floats"));
  pending.push_back(comm.start_allgather_in_place(halves, "test all-gather of halves"));
  for (Pending& p : pending) comm.wait(p);
  std::size_t wrong = 0;
  for (int q = 0; q < N; ++q)
    for (std::size_t i = 0; i < chunk; ++i) {
      const std::size_t at = static_cast<std::size_t>(q) * chunk + i;
      wrong += floats[begin + at] != owned_value(q, i);
      wrong += halves[at] != static_cast<uint16_t>(q * 7 + i % 5);
    }
  EXPECT_EQ(wrong, 0u);
  for (std::size_t i = 0; i < begin; ++i) {
    EXPECT_EQ(floats[i], kUntouched);
    EXPECT_EQ(floats[begin + n + i], kUntouched);
  }
  EXPECT_EQ(comm.shared_memory_collectives(), N > 1 ? 2u : 0u);
}

// What the segment does not reduce (integer maxima) and memory it did not hand out go through MPI.
TEST(SharedMemoryReduce, OtherTypesAndOtherMemoryGoThroughMpi) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  StoragePtr memory = comm.allocate_reduction_buffer(64 * sizeof(int32_t), Device::cpu());
  const std::span<int32_t> flags = elements_of<int32_t>(memory);
  std::fill(flags.begin(), flags.end(), r);
  comm.allreduce(flags, ReduceOp::kMax, "test maximum");
  EXPECT_EQ(flags[0], N - 1);
  EXPECT_EQ(flags[63], N - 1);
  std::vector<float> ordinary(100);
  fill_ramp(std::span<float>(ordinary), r);
  comm.allreduce(std::span<float>(ordinary), ReduceOp::kSum, "test ordinary memory");
  EXPECT_EQ(ordinary[99], static_cast<float>(N * (N + 1) / 2 * (99 % 97 + 1)));
  EXPECT_FALSE(comm.reduces_in_shared_memory(ordinary.data()));
  EXPECT_EQ(comm.shared_memory_collectives(), 0u);
}

// distributed.shared_memory = false: ordinary memory, every collective through MPI, same results.
TEST(SharedMemoryReduce, TurnedOffTheBufferIsOrdinaryMemory) {
  MpiCommunicator comm(test::world(), {}, /*shared_memory=*/false);
  const int N = comm.size();
  StoragePtr memory = comm.allocate_reduction_buffer(1000 * sizeof(float), Device::cpu());
  EXPECT_FALSE(comm.reduces_in_shared_memory(memory->data()));
  const std::span<float> values = elements_of<float>(memory);
  fill_ramp(values, comm.rank());
  comm.allreduce(values, ReduceOp::kSum, "test allreduce through MPI");
  EXPECT_EQ(values[999], static_cast<float>(N * (N + 1) / 2 * (999 % 97 + 1)));
  EXPECT_EQ(comm.shared_memory_collectives(), 0u);
}

// Ranks that reduce different ranges all stop, each naming both sides, instead of reading garbage.
TEST(SharedMemoryReduce, RanksThatDisagreeOnACollectiveAllStop) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  if (N == 1) GTEST_SKIP() << "needs two ranks to disagree (ctest distributed_np2 and _np4 run it)";
  StoragePtr memory = comm.allocate_reduction_buffer(64 * sizeof(float), Device::cpu());
  const std::span<float> values = elements_of<float>(memory).first(16 + static_cast<std::size_t>(r));
  test_util::expect_error(
      [&] { comm.allreduce(values, ReduceOp::kSum, "test mismatched allreduce"); },
      {"ranks disagree on test mismatched allreduce", "an allreduce of " + std::to_string(16 + r) + " f32",
       "every rank must issue the same collectives in the same order"},
      /*one_line=*/true);
}

}  // namespace
}  // namespace dptrain::distributed
