// Communicator collectives against closed forms: rank r contributes values that depend on r and the
// element index, so the sum over N ranks is known exactly (sum_{r<N} (r + 1) = N (N + 1) / 2, ...).
// Every value below is exactly representable, so results are compared with ==.
// Also: the MPI communicator of a world of one (ctest distributed_np1) turns every collective into a
// no-op, and the watchdog warns when a peer does not join a collective.
#include "distributed/communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"
#include "distributed/mpi_communicator.h"
#include "distributed/staged_communicator.h"
#include "mpi_test_env.h"

namespace dptrain::distributed {
namespace {

const std::vector<std::size_t> kSizes = {1, 1000, std::size_t{1} << 20};

// Rank r's value at element i: (r + 1) * (i % 97 + 1). Sum over ranks: N (N + 1) / 2 * (i % 97 + 1).
template <typename T>
std::vector<T> ramp(std::size_t n, int r) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>((r + 1) * static_cast<int>(i % 97 + 1));
  return v;
}

template <typename T>
void check_allreduce_ramp(Communicator& comm) {
  const int n_ranks = comm.size();
  for (std::size_t n : kSizes) {
    std::vector<T> sum = ramp<T>(n, comm.rank()), avg = sum;
    comm.allreduce(std::span<T>(sum), ReduceOp::kSum, "test sum");
    comm.allreduce(std::span<T>(avg), ReduceOp::kAverage, "test average");
    std::size_t bad_sum = 0, bad_avg = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double k = static_cast<double>(i % 97 + 1);
      bad_sum += sum[i] != static_cast<T>(n_ranks * (n_ranks + 1) / 2 * k);
      bad_avg += avg[i] != static_cast<T>((n_ranks + 1) / 2.0 * k);
    }
    EXPECT_EQ(bad_sum, 0u) << n << " elements, sum; e.g. [n-1] = " << sum[n - 1];
    EXPECT_EQ(bad_avg, 0u) << n << " elements, average; e.g. [n-1] = " << avg[n - 1];
  }
}

TEST(Communicator, RankAndSizeMatchMpi) {
  MpiCommunicator comm(test::world());
  EXPECT_EQ(comm.rank(), test::rank());
  EXPECT_EQ(comm.size(), test::size());
}

// ctest starts every rank on this one machine: one host, all ranks local to it (the Slurm test,
// tests/scripts/slurm_e2e.sh, checks two hosts through srun -N 2).
TEST(World, OneHostHoldsEveryRankWhenAllRunHere) {
  EXPECT_EQ(test::world().hosts(), 1);
  EXPECT_EQ(test::world().local_size(), test::size());
  EXPECT_EQ(test::world().local_rank(), test::rank());
}

// The communication thread shares a core with the compute thread: Open MPI must yield while it waits
// for a peer instead of polling (distributed/world.cpp), as its own control variable, read back
// through the MPI tool interface, says. distributed_np1 is the case that shows it: mpirun sets it
// by itself where ranks outnumber cores (--oversubscribe), a singleton only through World.
TEST(World, OpenMpiYieldsWhileWaiting) {
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int index = -1;
  ASSERT_EQ(MPI_T_cvar_get_index("mpi_yield_when_idle", &index), MPI_SUCCESS)
      << "Open MPI's control variable mpi_yield_when_idle";
  char name[256], description[1024];
  int name_length = sizeof name, description_length = sizeof description, verbosity = 0, binding = 0,
      scope = 0;
  MPI_Datatype type;
  MPI_T_enum enumtype;
  ASSERT_EQ(MPI_T_cvar_get_info(index, name, &name_length, &verbosity, &type, &enumtype, description,
                                &description_length, &binding, &scope),
            MPI_SUCCESS);
  int type_size = 0;
  ASSERT_EQ(MPI_Type_size(type, &type_size), MPI_SUCCESS);
  ASSERT_TRUE(type_size >= 1 && type_size <= 8) << type_size;  // an int or a bool
  MPI_T_cvar_handle handle;
  int count = 0;
  ASSERT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS);
  ASSERT_EQ(count, 1);
  uint64_t yield_when_idle = 0;  // little-endian: a narrower value lands in the low bytes
  EXPECT_EQ(MPI_T_cvar_read(handle, &yield_when_idle), MPI_SUCCESS);
  EXPECT_EQ(yield_when_idle, 1u);
  EXPECT_EQ(MPI_T_cvar_handle_free(&handle), MPI_SUCCESS);
  EXPECT_EQ(MPI_T_finalize(), MPI_SUCCESS);
}

TEST(Communicator, AllreduceFloatSumAndAverage) {
  MpiCommunicator comm(test::world());
  check_allreduce_ramp<float>(comm);
}

TEST(Communicator, AllreduceDoubleSumAndAverage) {
  MpiCommunicator comm(test::world());
  check_allreduce_ramp<double>(comm);
}

// int64 with values past 2^32: rank r sends (r << 40) + i; sum = (N (N - 1) / 2 << 40) + N i; the
// (integer) average is the sum / N = ((N - 1) 2^39) + i, exact for N = 1, 2, 4.
TEST(Communicator, AllreduceInt64SumAndAverage) {
  MpiCommunicator comm(test::world());
  const int64_t N = comm.size();
  for (std::size_t n : kSizes) {
    std::vector<int64_t> sum(n), avg(n);
    for (std::size_t i = 0; i < n; ++i)
      sum[i] = avg[i] = (int64_t{comm.rank()} << 40) + static_cast<int64_t>(i);
    comm.allreduce(std::span<int64_t>(sum), ReduceOp::kSum, "test int64 sum");
    comm.allreduce(std::span<int64_t>(avg), ReduceOp::kAverage, "test int64 average");
    std::size_t bad_sum = 0, bad_avg = 0;
    for (std::size_t i = 0; i < n; ++i) {
      bad_sum += sum[i] != ((N * (N - 1) / 2) << 40) + N * static_cast<int64_t>(i);
      bad_avg += avg[i] != (N * (N - 1) / 2 << 40) / N + static_cast<int64_t>(i);
    }
    EXPECT_EQ(bad_sum, 0u) << n << " elements";
    EXPECT_EQ(bad_avg, 0u) << n << " elements";
  }
}

// The asynchronous float path the gradient reducer uses: start_allreduce + wait, sum and average.
TEST(Communicator, StartAllreduceThenWait) {
  MpiCommunicator comm(test::world());
  const int N = comm.size();
  for (std::size_t n : kSizes) {
    std::vector<float> sum = ramp<float>(n, comm.rank()), avg = sum;
    Pending ps = comm.start_allreduce(std::span<float>(sum), ReduceOp::kSum, "test async sum");
    Pending pa = comm.start_allreduce(std::span<float>(avg), ReduceOp::kAverage, "test async average");
    EXPECT_EQ(ps.active(), N > 1);
    comm.wait(ps);
    comm.wait(pa);
    EXPECT_FALSE(ps.active());
    comm.wait(ps);  // waiting again is harmless
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float k = static_cast<float>(i % 97 + 1);
      bad += sum[i] != N * (N + 1) / 2 * k || avg[i] != (N + 1) / 2.0f * k;
    }
    EXPECT_EQ(bad, 0u) << n << " elements";
  }
}

// An empty synchronous call is still a fence: the collectives started before it have completed when it
// returns, although a late peer holds them up (rank 1 starts its side 300 ms after rank 0).
TEST(Communicator, AnEmptySynchronousCallWaitsForTheQueuedCollectives) {
  MpiCommunicator comm(test::world());
  const int N = comm.size();
  if (N == 1) GTEST_SKIP() << "needs a peer to be late: runs as ctest distributed_np2 and distributed_np4";
  for (const bool broadcast : {false, true}) {
    std::vector<float> sum(1000, static_cast<float>(comm.rank() + 1));
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Pending pending = comm.start_allreduce(std::span<float>(sum), ReduceOp::kSum, "test queued sum");
    std::vector<float> empty;
    if (broadcast) {
      comm.broadcast(std::span<float>(empty), 0, "test empty broadcast");
    } else {
      comm.allreduce(std::span<float>(empty), ReduceOp::kSum, "test empty allreduce");
    }
    // Read before the wait: the queued sum must be complete already.
    EXPECT_EQ(sum, std::vector<float>(1000, static_cast<float>(N * (N + 1) / 2)))
        << (broadcast ? "empty broadcast" : "empty allreduce") << " returned before the queued sum";
    comm.wait(pending);
  }
}

// The half-precision sum: rank r sends (r + 1) * 0.5 (exact in fp16 and bf16); the sum
// N (N + 1) / 4 is exact in both for N <= 4.
TEST(Communicator, StartAllreduceHalfSumsInHalfPrecision) {
  MpiCommunicator comm(test::world());
  const int N = comm.size();
  for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    const bool fp16 = format == HalfFormat::kFp16;
    const float mine = (comm.rank() + 1) * 0.5f;
    std::vector<uint16_t> buffer(1000, fp16 ? float_to_half(mine) : float_to_bfloat16(mine));
    Pending p = comm.start_allreduce_half(std::span<uint16_t>(buffer), format, "test half sum");
    comm.wait(p);
    std::size_t bad = 0;
    for (uint16_t h : buffer) bad += (fp16 ? half_to_float(h) : bfloat16_to_float(h)) != N * (N + 1) / 4.0f;
    EXPECT_EQ(bad, 0u) << (fp16 ? "fp16" : "bf16");
  }
}

TEST(Communicator, BroadcastFromRootZeroAndFromLastRank) {
  MpiCommunicator comm(test::world());
  for (int root : {0, comm.size() - 1}) {
    for (std::size_t n : kSizes) {
      std::vector<float> f(n, -1.0f);
      std::vector<int64_t> l(n, -1);
      if (comm.rank() == root)
        for (std::size_t i = 0; i < n; ++i) {
          f[i] = static_cast<float>(i % 1000) * 3 + 7 + root;
          l[i] = (int64_t{root + 1} << 36) + static_cast<int64_t>(i);
        }
      comm.broadcast(std::span<float>(f), root, "test broadcast float");
      comm.broadcast(std::span<int64_t>(l), root, "test broadcast int64");
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)
        bad += f[i] != static_cast<float>(i % 1000) * 3 + 7 + root ||
               l[i] != (int64_t{root + 1} << 36) + static_cast<int64_t>(i);
      EXPECT_EQ(bad, 0u) << "root " << root << ", " << n << " elements";
    }
  }
}

TEST(Communicator, AllgatherPlacesRankRAtOffsetRTimesCount) {
  MpiCommunicator comm(test::world());
  const int N = comm.size();
  for (std::size_t n : kSizes) {
    std::vector<int32_t> send(n);
    for (std::size_t i = 0; i < n; ++i) send[i] = comm.rank() * 10'000'000 + static_cast<int32_t>(i);
    std::vector<int32_t> recv(n * N, -1);
    comm.allgather(std::span<const int32_t>(send), std::span<int32_t>(recv), "test allgather");
    std::size_t bad = 0;
    for (int r = 0; r < N; ++r)
      for (std::size_t i = 0; i < n; ++i) bad += recv[r * n + i] != r * 10'000'000 + static_cast<int32_t>(i);
    EXPECT_EQ(bad, 0u) << n << " elements per rank";
  }
  // uint64 (the checksum path), one element.
  const uint64_t mine = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(comm.rank() + 1);
  std::vector<uint64_t> all(N);
  comm.allgather(std::span<const uint64_t>(&mine, 1), std::span<uint64_t>(all), "test allgather u64");
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(all[r], 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(r + 1));
  }
}

// Each rank's elements at offset rank x count on the root, and back; the MPI communicator's own
// gather and scatter and the broadcasts that other communicators use (gather_by_broadcasts) alike.
// The other ranks' receive buffers are not touched.
void expect_gather_and_scatter_by(
    const std::function<void(const int32_t*, int32_t*, std::size_t, int)>& gather,
    const std::function<void(const int32_t*, int32_t*, std::size_t, int)>& scatter, int rank, int ranks) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    for (int root = 0; root < ranks; ++root) {
      std::vector<int32_t> send(n);
      for (std::size_t i = 0; i < n; ++i) send[i] = rank * 10'000'000 + static_cast<int32_t>(i) + root;
      std::vector<int32_t> whole(n * ranks, -1);
      const std::vector<int32_t> sent = send;
      gather(send.data(), whole.data(), n, root);
      EXPECT_EQ(send, sent) << "gather changed what it sent";
      std::size_t bad = 0;
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < n; ++i)
          bad += whole[r * n + i] != (rank == root ? r * 10'000'000 + static_cast<int32_t>(i) + root : -1);
      EXPECT_EQ(bad, 0u) << "gather to root " << root << ", " << n << " elements a rank";
      // Back out, each rank's chunk doubled by the root, so that a copy of one's own elements fails.
      if (rank == root)
        for (int32_t& v : whole) v *= 2;
      std::vector<int32_t> mine(n, -1);
      scatter(whole.data(), mine.data(), n, root);
      bad = 0;
      for (std::size_t i = 0; i < n; ++i) bad += mine[i] != 2 * send[i];
      EXPECT_EQ(bad, 0u) << "scatter from root " << root << ", " << n << " elements a rank";
    }
  }
}

TEST(Communicator, GatherAndScatterPlaceRankRAtOffsetRTimesCountOnTheRoot) {
  MpiCommunicator comm(test::world());
  expect_gather_and_scatter_by(
      [&](const int32_t* send, int32_t* recv, std::size_t n, int root) {
        comm.gather(std::span<const int32_t>(send, n),
                    std::span<int32_t>(recv, comm.rank() == root ? n * comm.size() : 0), root, "test gather");
      },
      [&](const int32_t* send, int32_t* recv, std::size_t n, int root) {
        comm.scatter(std::span<const int32_t>(send, comm.rank() == root ? n * comm.size() : 0),
                     std::span<int32_t>(recv, n), root, "test scatter");
      },
      comm.rank(), comm.size());
  expect_gather_and_scatter_by(
      [&](const int32_t* send, int32_t* recv, std::size_t n, int root) {
        gather_by_broadcasts(comm, send, recv, n, DataType::kI32, root, "test gather by broadcasts");
      },
      [&](const int32_t* send, int32_t* recv, std::size_t n, int root) {
        scatter_by_broadcasts(comm, send, recv, n, DataType::kI32, root, "test scatter by broadcasts");
      },
      comm.rank(), comm.size());
}

// Checked before any MPI call: the root's whole buffer, and a root that is a rank. Each rank names
// itself the root, so that every rank throws and none is left in a collective.
TEST(Communicator, GatherAndScatterRejectWrongSizesAndRoots) {
  MpiCommunicator comm(test::world());
  std::vector<float> each(3), whole(3 * comm.size() + 1);
  const int self = comm.rank();
  test_util::expect_error(
      [&] { comm.gather(std::span<const float>(each), std::span<float>(whole), self, "bad gather"); },
      {"gather: ", std::to_string(whole.size()) + " elements on the root for 3 x "});
  test_util::expect_error(
      [&] { comm.scatter(std::span<const float>(whole), std::span<float>(each), self, "bad scatter"); },
      {"scatter: ", "elements on the root"});
  test_util::expect_error(
      [&] { comm.gather(std::span<const float>(each), std::span<float>(whole), comm.size(), "bad root"); },
      {"gather: root ", "is not a rank of"});
}

// Rank r's chunk after a reduce-scatter of ramps: the ramp's sum (average) over the ranks at those
// elements; the other chunks are not looked at (undefined). Then, the chunks gathered in place: every
// rank holds the allreduce's result everywhere.
template <typename T>
void check_reduce_scatter_ramp(Communicator& comm, bool asynchronous) {
  const int N = comm.size(), r = comm.rank();
  for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{1} << 18}) {
    const std::size_t n = chunk * static_cast<std::size_t>(N);
    std::vector<T> sum = ramp<T>(n, r), avg = sum;
    if (asynchronous) {
      Pending s = comm.start_reduce_scatter(std::span<T>(sum), ReduceOp::kSum, "test reduce-scatter sum");
      Pending a = comm.start_reduce_scatter(std::span<T>(avg), ReduceOp::kAverage, "test reduce-scatter avg");
      comm.wait(s);
      comm.wait(a);
    } else {
      comm.reduce_scatter(std::span<T>(sum), ReduceOp::kSum, "test reduce-scatter sum");
      comm.reduce_scatter(std::span<T>(avg), ReduceOp::kAverage, "test reduce-scatter avg");
    }
    const auto expected_sum = [&](std::size_t i) { return static_cast<T>(N * (N + 1) / 2 * (i % 97 + 1)); };
    const auto expected_avg = [&](std::size_t i) { return static_cast<T>((N + 1) / 2.0 * (i % 97 + 1)); };
    std::size_t bad_sum = 0, bad_avg = 0;
    for (std::size_t i = r * chunk; i < (r + 1) * chunk; ++i) {
      bad_sum += sum[i] != expected_sum(i);
      bad_avg += avg[i] != expected_avg(i);
    }
    EXPECT_EQ(bad_sum, 0u) << chunk << " elements per chunk, sum, rank " << r;
    EXPECT_EQ(bad_avg, 0u) << chunk << " elements per chunk, average, rank " << r;
    if (asynchronous) {
      Pending g = comm.start_allgather_in_place(std::span<T>(sum), "test allgather in place");
      comm.wait(g);
    } else {
      comm.allgather_in_place(std::span<T>(sum), "test allgather in place");
    }
    std::size_t bad_gathered = 0;
    for (std::size_t i = 0; i < n; ++i) bad_gathered += sum[i] != expected_sum(i);
    EXPECT_EQ(bad_gathered, 0u) << chunk << " elements per chunk, gathered, rank " << r;
  }
}

TEST(Communicator, ReduceScatterLeavesRankRTheReductionOfChunkR) {
  MpiCommunicator comm(test::world());
  check_reduce_scatter_ramp<float>(comm, false);
  check_reduce_scatter_ramp<double>(comm, true);
  check_reduce_scatter_ramp<int64_t>(comm, true);
}

// Half-precision chunks sum in half precision: small integers, exact in bf16 and fp16.
TEST(Communicator, HalfReduceScatterSums) {
  MpiCommunicator comm(test::world());
  const int N = comm.size(), r = comm.rank();
  const std::size_t chunk = 33, n = chunk * static_cast<std::size_t>(N);
  for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    const bool fp16 = format == HalfFormat::kFp16;
    std::vector<uint16_t> halves(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((r + 1) * static_cast<int>(i % 5 + 1));
      halves[i] = fp16 ? float_to_half(v) : float_to_bfloat16(v);
    }
    Pending pending =
        comm.start_reduce_scatter_half(std::span<uint16_t>(halves), format, "test half reduce-scatter");
    comm.wait(pending);
    for (std::size_t i = r * chunk; i < (r + 1) * chunk; ++i) {
      const float got = fp16 ? half_to_float(halves[i]) : bfloat16_to_float(halves[i]);
      EXPECT_EQ(got, static_cast<float>(N * (N + 1) / 2 * static_cast<int>(i % 5 + 1)))
          << i << (fp16 ? " fp16" : " bf16");
    }
  }
}

// A buffer that does not split into equal chunks is refused, naming the collective, before any MPI
// call and identically on every rank; on one rank every size splits.
TEST(Communicator, ReduceScatterAndAllgatherInPlaceNeedAMultipleOfTheRanks) {
  MpiCommunicator comm(test::world());
  std::vector<float> values(2 * comm.size() + 1, 1.0f);
  if (comm.size() == 1) {
    comm.reduce_scatter(std::span<float>(values), ReduceOp::kSum, "one rank");
    comm.allgather_in_place(std::span<float>(values), "one rank");
    EXPECT_EQ(values, std::vector<float>(3, 1.0f));
    return;
  }
  test_util::expect_error([&] { comm.reduce_scatter(std::span<float>(values), ReduceOp::kSum, "grads"); },
                          {"reduce-scatter of", "not a multiple of the ranks", "grads"});
  test_util::expect_error([&] { comm.allgather_in_place(std::span<float>(values), "params"); },
                          {"allgather of", "not a multiple of the ranks", "params"});
}

TEST(Communicator, AllgatherRejectsAWrongReceiveSize) {
  MpiCommunicator comm(test::world());
  std::vector<float> send(3), recv(3 * comm.size() + 1);
  // Checked before any MPI call, identically on every rank.
  EXPECT_THROW(comm.allgather(std::span<const float>(send), std::span<float>(recv), "bad allgather"), Error);
}

// Rank 0 arrives 300 ms late; nobody may leave the barrier before it arrives.
TEST(Communicator, BarrierWaitsForTheLastRank) {
  MpiCommunicator comm(test::world());
  comm.barrier("test barrier 1");
  const double t0 = MPI_Wtime();
  if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comm.barrier("test barrier 2");
  const double waited = MPI_Wtime() - t0;
  if (comm.size() > 1) {
    EXPECT_GE(waited, 0.2) << "rank " << comm.rank() << " left the barrier early";
  }
}

// A world of one: every collective is a no-op (values unchanged), allgather copies, nothing throws.
TEST(Communicator, WorldOfOneIsANoOp) {
  if (test::size() > 1) GTEST_SKIP() << "a world of one: runs as ctest distributed_np1";
  MpiCommunicator self(test::world());
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.rank(), 0);
  for (std::size_t n : kSizes) {
    const std::vector<float> original = ramp<float>(n, test::rank() + 5);
    std::vector<float> a = original, b = original, c = original, d = original;
    std::vector<double> e(n, 2.5);
    std::vector<int64_t> f(n, int64_t{1} << 50);
    EXPECT_NO_THROW(self.allreduce(std::span<float>(a), ReduceOp::kSum, "self sum"));
    EXPECT_NO_THROW(self.allreduce(std::span<float>(b), ReduceOp::kAverage, "self average"));
    EXPECT_NO_THROW(self.allreduce(std::span<double>(e), ReduceOp::kAverage, "self double"));
    EXPECT_NO_THROW(self.allreduce(std::span<int64_t>(f), ReduceOp::kAverage, "self int64"));
    EXPECT_NO_THROW(self.broadcast(std::span<float>(c), 0, "self broadcast"));
    Pending p = self.start_allreduce(std::span<float>(d), ReduceOp::kAverage, "self async");
    EXPECT_FALSE(p.active());
    EXPECT_NO_THROW(self.wait(p));
    std::vector<uint16_t> h(n, float_to_half(1.5f));
    Pending ph = self.start_allreduce_half(std::span<uint16_t>(h), HalfFormat::kFp16, "self half");
    EXPECT_FALSE(ph.active());
    EXPECT_NO_THROW(self.wait(ph));
    EXPECT_EQ(a, original);
    EXPECT_EQ(b, original);
    EXPECT_EQ(c, original);
    EXPECT_EQ(d, original);
    EXPECT_EQ(e, std::vector<double>(n, 2.5));
    EXPECT_EQ(f, std::vector<int64_t>(n, int64_t{1} << 50));
    EXPECT_EQ(h, std::vector<uint16_t>(n, float_to_half(1.5f)));
    std::vector<float> gathered(n, -1.0f);
    EXPECT_NO_THROW(
        self.allgather(std::span<const float>(original), std::span<float>(gathered), "self allgather"));
    EXPECT_EQ(gathered, original);
  }
  EXPECT_NO_THROW(self.barrier("self barrier"));
  std::vector<float> empty;
  EXPECT_NO_THROW(self.allreduce(std::span<float>(empty), ReduceOp::kSum, "self empty"));
  // Empty spans have null data: no memcpy of them (UBSan's nonnull check, in the sanitizer build).
  EXPECT_NO_THROW(self.allgather(std::span<const float>(), std::span<float>(), "self empty allgather"));
}

// The watchdog's warning: rank 0 joins a barrier 1.5 s late; the others, with warning_s = 0.5 and
// no abort, print "rank R has waited ... in <what>" once and then complete normally. (The abort
// ends the process, so it is tested end to end in trainer_e2e.sh, case stall.)
TEST(Communicator, WatchdogWarnsWhenAPeerIsLate) {
  if (test::size() == 1) GTEST_SKIP() << "needs a peer";
  MpiCommunicator comm(test::world(), StallPolicy{0.5, 0});
  comm.barrier("sync before the stall test");
  if (comm.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    comm.barrier("late barrier");
  } else {
    ::testing::internal::CaptureStderr();
    comm.barrier("barrier of watchdog test 9");
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("rank " + std::to_string(comm.rank()) + " has waited"), std::string::npos) << err;
    EXPECT_NE(err.find("barrier of watchdog test 9"), std::string::npos) << err;
    EXPECT_EQ(err.find("has waited", err.find("has waited") + 1), std::string::npos)
        << "warned twice: " << err;
  }
}

// The staged communicator (distributed.backend "mpi" on a GPU) copies each buffer of its device to
// the host, reduces it there and copies it back: here on the reference device, whose backend does
// those copies with the same interface as a GPU's, against the same closed forms.
// Device buffers (the reference backend's) reduce-scattered and gathered in place through the host.
TEST(StagedCommunicator, ReduceScattersAndGathersInPlace) {
  MpiCommunicator host(test::world());
  StagedCommunicator staged(host, Device::reference());
  const int N = staged.size(), r = staged.rank();
  for (std::size_t chunk : {std::size_t{1}, std::size_t{1000}}) {
    const std::size_t n = chunk * static_cast<std::size_t>(N);
    const Tensor t = Tensor::from_data({static_cast<int64_t>(n)}, ramp<float>(n, r)).to(Device::reference());
    Pending p =
        staged.start_reduce_scatter(std::span<float>(t.data_ptr(), n), ReduceOp::kAverage, "staged rs");
    staged.wait(p);
    const std::vector<float> scattered = t.to_vector();
    std::size_t bad = 0;
    for (std::size_t i = r * chunk; i < (r + 1) * chunk; ++i)
      bad += scattered[i] != (N + 1) / 2.0f * static_cast<float>(i % 97 + 1);
    EXPECT_EQ(bad, 0u) << chunk << " elements per chunk, rank " << r;
    staged.allgather_in_place(std::span<float>(t.data_ptr(), n), "staged allgather");
    const std::vector<float> gathered = t.to_vector();
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += gathered[i] != (N + 1) / 2.0f * static_cast<float>(i % 97 + 1);
    EXPECT_EQ(bad, 0u) << chunk << " elements per chunk, gathered, rank " << r;
  }
}

TEST(StagedCommunicator, ReducesBroadcastsAndGathersDeviceBuffers) {
  MpiCommunicator host(test::world());
  StagedCommunicator staged(host, Device::reference());
  EXPECT_TRUE(staged.accepts(Device::reference()));
  EXPECT_FALSE(staged.accepts(Device::cpu()));
  const int N = staged.size(), r = staged.rank();
  for (std::size_t n : kSizes) {
    const std::vector<float> mine = ramp<float>(n, r);
    const Tensor sum = Tensor::from_data({static_cast<int64_t>(n)}, mine).to(Device::reference());
    const Tensor avg = sum.clone();
    staged.allreduce(std::span<float>(sum.data_ptr(), n), ReduceOp::kSum, "staged sum");
    Pending p = staged.start_allreduce(std::span<float>(avg.data_ptr(), n), ReduceOp::kAverage, "staged avg");
    staged.wait(p);
    const std::vector<float> s = sum.to_vector(), a = avg.to_vector();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float k = static_cast<float>(i % 97 + 1);
      bad += s[i] != N * (N + 1) / 2 * k || a[i] != (N + 1) / 2.0f * k;
    }
    EXPECT_EQ(bad, 0u) << n << " elements";
    const Tensor b =
        Tensor::from_data({static_cast<int64_t>(n)}, ramp<float>(n, r + 10)).to(Device::reference());
    staged.broadcast(std::span<float>(b.data_ptr(), n), N - 1, "staged broadcast");
    EXPECT_EQ(b.to_vector(), ramp<float>(n, N - 1 + 10)) << n << " elements";
  }
  const Tensor one = Tensor::full({3}, static_cast<float>(r)).to(Device::reference());
  const Tensor all = Tensor::zeros({3 * N}, Device::reference());
  staged.allgather(std::span<const float>(one.data_ptr(), 3), std::span<float>(all.data_ptr(), 3 * N),
                   "gather");
  const std::vector<float> gathered = all.to_vector();
  for (int k = 0; k < N; ++k)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(gathered[k * 3 + i], static_cast<float>(k));
}

}  // namespace
}  // namespace dptrain::distributed
