// Allreduce benchmark: our gradient reduction (GradientReducer: fused buckets, finiteness check,
// optional fp16/bf16 compression; averaging is folded into backward as in the trainer) against a raw in-place
// MPI_Allreduce of the same bytes, in the same run. Sizes: the MNIST CNN's gradients and synthetic 4 KiB ..
// 64 MiB.
//
//   mpirun -np 2 build/bench/allreduce_bench [--min-kib 4] [--max-mib 64] [--seconds 0.3]
//                                            [--shared-memory true]
//
// Each cell repeats until --seconds have passed (at least 5 times) and reports the median time of
// batches; the time is the max over ranks. Ratio = raw time / our time (>= 1 means we are faster);
// "no-chk" is the same reduction with distributed.check_finite off (in shared memory the check is
// part of the sums, so the two should match; through MPI it is a pass of its own). Ours reduces the
// trainer's way: where the ranks share a host, in shared memory (--shared-memory false: through MPI).
// Rank 0 ends with one "RESULT {json}" line per row.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cli_checks.h"
#include "core/error.h"
#include "core/parameters.h"
#include "distributed/mpi_communicator.h"
#include "distributed/reducer.h"
#include "distributed/world.h"

using namespace dptrain;
using namespace dptrain::distributed;

namespace {

// Median over `reps` batches of the per-call time (seconds), max over ranks.
template <typename F>
double time_call(F call, double seconds) {
  call();  // warm-up (first-touch, connection set-up)
  int per_batch = 1;
  for (;;) {  // size a batch to ~seconds/10, agreed by all ranks
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < per_batch; ++i) call();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (dt > seconds / 10 || per_batch > 100000) break;
    per_batch *= 2;
  }
  std::vector<double> samples;
  for (int rep = 0; rep < 9; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < per_batch; ++i) call();
    double dt = (MPI_Wtime() - t0) / per_batch;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    samples.push_back(dt);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

struct Row {
  std::string name;
  std::vector<int64_t> tensor_sizes;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradient reduction vs raw MPI_Allreduce"};
  double min_kib = 4, max_mib = 64, seconds = 0.3, fusion_mb = 4;
  app.add_option("--min-kib", min_kib, "smallest synthetic size")
      ->check(bench::at_least(0, true))
      ->capture_default_str();
  app.add_option("--max-mib", max_mib, "largest synthetic size")
      ->check(bench::at_least(0, true))
      ->capture_default_str();
  app.add_option("--seconds", seconds, "time per cell")
      ->check(bench::at_least(0, true))
      ->capture_default_str();
  app.add_option("--fusion-mb", fusion_mb, "distributed.fusion_threshold_mb for our reducer")
      ->check(bench::at_least(0))
      ->capture_default_str();
  bool shared_memory = true;
  app.add_option("--shared-memory", shared_memory, "distributed.shared_memory for our reducer");
  CLI11_PARSE(app, argc, argv);
  World world(&argc, &argv);
  MpiCommunicator comm(world, {}, shared_memory);

  struct Result {
    std::string what;
    double bytes, raw_s, ours_s, unchecked_s, fp16_s, bf16_s;
  };
  std::vector<Result> results;
  std::vector<Row> rows;
  // The MNIST CNN's parameters, in registration order (8 tensors, 121,930 floats).
  rows.push_back({"mnist_cnn", {32 * 9, 32, 64 * 32 * 9, 64, 64 * 1600, 64, 10 * 64, 10}});
  for (double bytes = min_kib * 1024; bytes <= max_mib * (1 << 20); bytes *= 4)
    rows.push_back({"synthetic", {static_cast<int64_t>(bytes / 4)}});

  if (world.is_root()) {
    if (world.size() == 1)
      std::fprintf(stderr,
                   "allreduce_bench: warning: one rank, so nothing crosses between processes and the times "
                   "are copies; run it under mpirun -np 2 or more\n");
    std::printf(
        "np %d, fusion threshold %g MiB, ours %s; times are per reduction (max over ranks), median of 9;\n"
        "ratio = raw us / ours us (above 1: ours faster); fp16/32, bf16/32 = that encoding's time / "
        "fp32's (below 1: it saves time)\n",
        world.size(), fusion_mb,
        shared_memory ? "in shared memory where the ranks share a host" : "through MPI");
    std::printf("%-10s %12s %10s %10s %10s %9s %13s %10s %9s %8s\n", "what", "bytes", "raw us", "raw GB/s",
                "ours us", "ratio", "ratio no-chk", "fp16 us", "fp16/32", "bf16/32");
  }
  for (const Row& row : rows) {
    std::vector<NamedTensor> tensors;
    int64_t total = 0;
    for (std::size_t i = 0; i < row.tensor_sizes.size(); ++i) {
      Tensor t = Tensor::full({row.tensor_sizes[i]}, 0.001f * (world.rank() + 1), true);
      tensors.push_back({"p" + std::to_string(i), t});
      total += row.tensor_sizes[i];
    }
    const FlatParameters params(tensors, Device::cpu(), [&](std::size_t bytes) {
      return comm.allocate_reduction_buffer(bytes, Device::cpu());
    });
    std::vector<float> raw(total, 0.001f);
    const double raw_s = time_call(
        [&] {
          DPTRAIN_CHECK(MPI_Allreduce(MPI_IN_PLACE, raw.data(), total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) ==
                            MPI_SUCCESS,
                        "MPI_Allreduce of ", total, " floats failed");
        },
        seconds);
    // As the trainer runs it: gradients pre-divided by N in backward (free), so finish() only sums
    // and checks that every average is finite.
    auto reduce_with = [&](const std::string& encoding, bool check_finite = true) {
      GradientReducer reducer(comm, params,
                              {.fusion_threshold_mb = fusion_mb,
                               .first_bucket_mb = 1,
                               .overlap = false,
                               .encoding = encoding,
                               .check_finite = check_finite});
      return time_call(
          [&] {
            reducer.prepare(0);
            reducer.finish();
          },
          seconds);
    };
    const double ours_s = reduce_with("none");
    const double unchecked_s = reduce_with("none", /*check_finite=*/false);
    const double fp16_s = reduce_with("fp16");
    const double bf16_s = reduce_with("bf16");
    if (world.is_root()) {
      const double bytes = 4.0 * total;
      std::printf("%-10s %12.0f %10.1f %10.2f %10.1f %9.3f %13.3f %10.1f %9.2f %8.2f\n", row.name.c_str(),
                  bytes, raw_s * 1e6, bytes / raw_s / 1e9, ours_s * 1e6, raw_s / ours_s, raw_s / unchecked_s,
                  fp16_s * 1e6, fp16_s / ours_s, bf16_s / ours_s);
      results.push_back({row.name, bytes, raw_s, ours_s, unchecked_s, fp16_s, bf16_s});
      std::fflush(stdout);
    }
  }
  // One line per row for scripts (bench/scaling_model fits latency and bandwidth to these).
  for (const Result& r : results)
    std::printf(
        "RESULT {\"bench\": \"allreduce\", \"ranks\": %d, \"what\": \"%s\", \"bytes\": %.0f, \"raw_s\": "
        "%.4g, "
        "\"ours_s\": %.4g, \"ours_unchecked_s\": %.4g, \"fp16_s\": %.4g, \"bf16_s\": %.4g}\n",
        world.size(), r.what.c_str(), r.bytes, r.raw_s, r.ours_s, r.unchecked_s, r.fp16_s, r.bf16_s);
  return 0;
}
