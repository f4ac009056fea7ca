// Training throughput benchmark: samples/s of the trainer's own training step (data, forward,
// backward, bucketed gradient averaging, optimizer; trainer/train.cpp) for a config, with where a
// step's time goes. Runs alone or under mpirun (throughput is then global). Needs the config's data.
//
//   build/bench/train_bench --config configs/mnist.json [--threads 1] [--steps 100] [--reps 5]
//   mpirun -np 2 build/bench/train_bench --config configs/mnist.json --set distributed.compression=fp16
//   build/bench/train_bench --config configs/mnist.json --set device=cuda --batch 1024 --profile-ops
//
// The last line is "RESULT {json}" for scripts (scripts/scaling.sh, bench/*.sh).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cli_checks.h"
#include "bench/op_profile.h"
#include "core/error.h"
#include "distributed/world.h"
#include "trainer/config.h"
#include "trainer/run.h"

using namespace dptrain;

int main(int argc, char** argv) {
  CLI::App app{"samples/s and step-time breakdown of the trainer's training step for a config"};
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = 1;
  int64_t batch = 0;
  trainer::BenchmarkOptions options{
      .warmup_steps = 20, .timed_steps = 100, .repetitions = 5, .before_timed_steps = {}};
  app.add_option("--config", config_path, "config whose model, data, batch and distributed settings are used")
      ->required();
  app.add_option("--set", overrides, "config override key.path=JSON (repeatable)")->take_all()->expected(1);
  app.add_option("--threads", threads, "CPU threads per rank (0: cores / ranks on this host)")
      ->check(bench::at_least(0))
      ->capture_default_str();
  app.add_option("--batch", batch, "batch size per rank (0: the config's data.batch_size)")
      ->check(bench::at_least(0))
      ->capture_default_str();
  app.add_option("--steps", options.timed_steps, "steps per timed repetition")
      ->check(bench::at_least(1))
      ->capture_default_str();
  app.add_option("--reps", options.repetitions, "timed repetitions (the median one counts)")
      ->check(bench::at_least(1))
      ->capture_default_str();
  app.add_option("--warmup", options.warmup_steps, "untimed steps first")
      ->check(bench::at_least(0))
      ->capture_default_str();
  bool profile_ops = false;
  app.add_flag("--profile-ops", profile_ops,
               "time every kernel of the timed steps and print where the time goes (rank 0; on a GPU the "
               "device is synchronized around each op)");
  CLI11_PARSE(app, argc, argv);
  distributed::World world(&argc, &argv);

  try {
    Json json = trainer::read_json_file(config_path);
    for (const std::string& assignment : overrides) trainer::apply_override(json, assignment);
    json["threads"] = threads;
    if (batch > 0) json["data"]["batch_size"] = batch;
    json["output_dir"] = "/tmp/dptrain_train_bench";  // nothing is written there but the timeline, if asked
    const trainer::Config config = trainer::parse_config(json);
    bench::OpProfile profile;
    if (profile_ops) {
      bench::profile_kernels(config, world, profile);
      options.before_timed_steps = [&] { profile.reset(); };
    }
    const trainer::BenchmarkResult r = trainer::benchmark(config, world, options);

    if (world.is_root()) {
      for (std::size_t i = 0; i < r.samples_per_sec_by_repetition.size(); ++i)
        std::printf("rep %zu: %.0f samples/s\n", i, r.samples_per_sec_by_repetition[i]);
      const trainer::StepTimes& t = r.step_times;
      const auto ms = [](double s) { return 1e3 * s; };
      std::printf(
          "%s, %d rank(s) x batch %lld, %d thread(s) per rank, compression %s, fusion %g MiB: median %.0f "
          "samples/s\n",
          config_path.c_str(), world.size(), static_cast<long long>(config.data.batch_size), threads,
          config.distributed.compression.c_str(), config.distributed.fusion_threshold_mb, r.samples_per_sec);
      std::printf(
          "per step %.2f ms (mean of %d rank(s)): data %.2f, compute %.2f, communication not overlapped "
          "%.2f, "
          "optimizer %.2f; tensor buffers allocated in timed steps: %lld\n",
          ms(t.total), world.size(), ms(t.data), ms(t.compute), ms(t.communication), ms(t.optimizer),
          static_cast<long long>(r.tensor_allocations));
      std::printf("%.2f MFLOP per sample (3 x forward's multiply-adds x 2): %.1f GFLOP/s per rank\n",
                  r.training_flops_per_sample / 1e6,
                  r.training_flops_per_sample * r.samples_per_sec / world.size() / 1e9);
      const int64_t timed_steps = options.timed_steps * options.repetitions;
      if (profile_ops) profile.print(timed_steps, t.total * static_cast<double>(timed_steps), 0);
      Json result = {{"bench", "train"},
                     {"config", config_path},
                     {"model", config.model.architecture.empty() ? "layers" : config.model.architecture},
                     {"ranks", world.size()},
                     {"batch", config.data.batch_size},
                     {"threads", threads},
                     {"compression", config.distributed.compression},
                     {"fusion_threshold_mb", config.distributed.fusion_threshold_mb},
                     {"overlap", config.distributed.overlap},
                     {"parameters", r.parameters},
                     {"samples_per_sec", r.samples_per_sec},
                     {"bucket_bytes", r.bucket_bytes},
                     {"backward_fraction", r.backward_fraction},
                     {"training_flops_per_sample", r.training_flops_per_sample},
                     {"step_ms",
                      {{"data", ms(t.data)},
                       {"compute", ms(t.compute)},
                       {"communication", ms(t.communication)},
                       {"optimizer", ms(t.optimizer)},
                       {"total", ms(t.total)}}},
                     {"cpu_ms_per_step", ms(r.cpu_seconds_per_step)}};
      if (profile_ops) result["profile"] = profile.summary(timed_steps);
      std::printf("RESULT %s\n", result.dump().c_str());
    }
  } catch (const std::exception& e) {
    world.exit_with_error("train_bench", e.what());
  }
  return 0;
}
