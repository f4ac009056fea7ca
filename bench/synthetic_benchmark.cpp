// Horovod's pytorch_synthetic_benchmark.py in this trainer: a named model (torchvision's ResNets,
// resnet20) trained with SGD on one fixed batch of random images per rank, timed as Horovod times it
// (warm-up batches, then iterations of several batches each), through the trainer's own step
// (forward, backward, bucketed allreduce, optimizer). As in Horovod's, the batch is made once and
// stays where the model runs (on a GPU: no upload per step; the first warm-up batch loads it);
// --data-path gathers and uploads it through the loader every step instead, the same math. Prints
// img/sec per rank per iteration, their mean +- 1.96 standard deviations, and the total over the
// ranks; the last line is RESULT {json}.
//
//   build/bench/synthetic_benchmark --model resnet50 --batch-size 32
//   build/bench/synthetic_benchmark --model resnet50 --batch-size 64 --device cuda --data-path
//   mpirun -np 2 build/bench/synthetic_benchmark --model resnet18 --input-shape 3,64,64 --threads 1
//   ... --set distributed.sync_batchnorm=true --set device=cuda   (any config key)
//   ... --profile-ops [--gemm-gflops 145]   (where the timed steps' time goes, per op and conv shape,
//                                            with FLOP/s and their share of a GEMM's; rank 0; on a
//                                            GPU each op synchronized: slower steps, exact shares)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cli_checks.h"
#include "bench/op_profile.h"
#include "core/backend.h"
#include "core/error.h"
#include "distributed/world.h"
#include "trainer/config.h"
#include "trainer/run.h"
#include "trainer/threads.h"

using namespace dptrain;

namespace {

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      shape.push_back(std::stoll(item));
    } catch (const std::exception&) {
      DPTRAIN_FAIL("--input-shape '", text, "': expected C,H,W, e.g. 3,224,224");
    }
  }
  DPTRAIN_CHECK(shape.size() == 3, "--input-shape '", text, "': expected C,H,W, e.g. 3,224,224");
  return shape;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Horovod's synthetic benchmark: img/sec of a ResNet's training step on random data"};
  std::string model = "resnet50", input_shape = "3,224,224", device = "cpu";
  int64_t batch = 32, classes = 1000, warmup = 10, per_iter = 10, iters = 10;
  int threads = 0;
  std::vector<std::string> overrides;
  app.add_option("--model", model, "resnet18 | resnet34 | resnet50 | resnet20")->capture_default_str();
  app.add_option("--batch-size", batch, "input batch size per rank")->capture_default_str();
  app.add_option("--input-shape", input_shape, "C,H,W of the random images")->capture_default_str();
  app.add_option("--num-classes", classes, "outputs of the model (labels are random in [0, classes))")
      ->capture_default_str();
  app.add_option("--num-warmup-batches", warmup, "batches before timing")
      ->check(bench::at_least(0))
      ->capture_default_str();
  app.add_option("--num-batches-per-iter", per_iter, "batches per timed iteration")
      ->check(bench::at_least(1))
      ->capture_default_str();
  app.add_option("--num-iters", iters, "timed iterations (the median one is img_per_sec_median)")
      ->check(bench::at_least(1))
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads per rank (0: cores / ranks on this host)")
      ->capture_default_str();
  app.add_option("--device", device, "cpu | cuda | auto")->capture_default_str();
  bool data_path = false;
  app.add_flag("--data-path", data_path,
               "load every step's batch through the trainer's loader (gather, and upload to a GPU) instead "
               "of keeping the first one where the model runs, as Horovod's benchmark does");
  bool profile_ops = false;
  double gemm_gflops = 0;
  app.add_flag("--profile-ops", profile_ops,
               "time every kernel of the timed steps and print where the time goes (on a GPU the device "
               "is synchronized around each op)");
  app.add_option("--gemm-gflops", gemm_gflops,
                 "with --profile-ops: a large GEMM's GFLOP/s on one core (bench/machine_probe gemm), to "
                 "compare each op with");
  app.add_option("--set", overrides, "config override key.path=JSON (repeatable)")->take_all()->expected(1);
  CLI11_PARSE(app, argc, argv);
  distributed::World world(&argc, &argv);

  try {
    const std::vector<int64_t> shape = parse_shape(input_shape);
    // Horovod's setup: SGD with lr 0.01 (momentum as the usual recipe), one batch per rank repeated.
    Json json = {{"seed", 42},
                 {"output_dir", "/tmp/dptrain_synthetic_benchmark"},
                 {"threads", threads},
                 {"device", device},
                 {"data",
                  {{"dataset", "synthetic"},
                   {"batch_size", batch},
                   {"shuffle", false},
                   {"synthetic", {{"samples", batch * world.size()}, {"test_samples", 1}}}}},
                 {"model", {{"architecture", model}, {"num_classes", classes}, {"input_shape", shape}}},
                 {"optimizer", {{"type", "sgd"}, {"lr", 0.01}, {"momentum", 0.9}, {"lr_scaling", "none"}}},
                 {"training", {{"progress", "off"}}}};
    for (const std::string& assignment : overrides) trainer::apply_override(json, assignment);
    const trainer::Config config = trainer::parse_config(json);
    const char* unit = config.device == trainer::DeviceKind::kCpu ? "CPU" : "device";
    // What the run will use where --threads leaves it to the machine (0), as the trainer resolves it.
    const int threads_used = trainer::threads_for_this_process(threads, world.local_size());
    if (world.is_root()) {
      std::printf("Model: %s\nBatch size: %lld\nNumber of %ss: %d (threads per process: %d)\n", model.c_str(),
                  static_cast<long long>(batch), unit, world.size(), threads_used);
      if (config.device == trainer::DeviceKind::kCpu)
        std::printf("CPU kernels built for: %s (%d floats a vector)\n", cpu_vector_isa(),
                    cpu_vector_floats());
      std::printf("Running warmup...\n");
      std::fflush(stdout);
    }
    bench::OpProfile profile;
    if (profile_ops) {
      bench::profile_kernels(config, world, profile);
    }
    const trainer::BenchmarkResult r = trainer::benchmark(config, world,
                                                          {.warmup_steps = warmup,
                                                           .timed_steps = per_iter,
                                                           .repetitions = iters,
                                                           .before_timed_steps = [&] { profile.reset(); },
                                                           .fixed_batch = !data_path});
    if (world.is_root()) {
      std::printf("Running benchmark...\n");
      std::vector<double> per_rank;
      for (std::size_t i = 0; i < r.samples_per_sec_by_repetition.size(); ++i) {
        per_rank.push_back(r.samples_per_sec_by_repetition[i] / world.size());
        std::printf("Iter #%zu: %.1f img/sec per %s\n", i, per_rank.back(), unit);
      }
      const double n = static_cast<double>(per_rank.size());
      const double mean = std::accumulate(per_rank.begin(), per_rank.end(), 0.0) / n;
      double variance = 0;
      for (double v : per_rank) variance += (v - mean) * (v - mean) / n;
      const double spread = 1.96 * std::sqrt(variance);  // Horovod's "+-": 1.96 population std
      std::printf("Img/sec per %s: %.1f +-%.1f\n", unit, mean, spread);
      std::printf("Total img/sec on %d %s(s): %.1f +-%.1f\n", world.size(), unit, world.size() * mean,
                  world.size() * spread);
      Json result = {{"bench", "synthetic"},
                     {"model", model},
                     {"batch", batch},
                     {"ranks", world.size()},
                     {"threads", threads_used},
                     {"cpu_vector_isa", cpu_vector_isa()},
                     {"input_shape", shape},
                     {"parameters", r.parameters},
                     {"img_per_sec", per_rank},
                     {"img_per_sec_mean", mean},
                     {"img_per_sec_median", trainer::median(per_rank)},
                     {"total_img_per_sec", world.size() * mean},
                     {"step_ms",
                      {{"data", 1e3 * r.step_times.data},
                       {"compute", 1e3 * r.step_times.compute},
                       {"communication", 1e3 * r.step_times.communication},
                       {"optimizer", 1e3 * r.step_times.optimizer},
                       {"total", 1e3 * r.step_times.total}}},
                     {"cpu_ms_per_step", 1e3 * r.cpu_seconds_per_step},
                     {"data_path", data_path},
                     {"mean_loss", r.mean_loss}};
      if (profile_ops) {
        profile.print(per_iter * iters, r.step_times.total * per_iter * iters, gemm_gflops * 1e9);
        result["profile"] = profile.summary(per_iter * iters);
      }
      std::printf("RESULT %s\n", result.dump().c_str());
    }
  } catch (const std::exception& e) {
    world.exit_with_error("synthetic_benchmark", e.what());
  }
  return 0;
}
