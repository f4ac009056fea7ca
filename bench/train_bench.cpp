// Training throughput benchmark: samples/s of full training steps (forward, backward, optimizer)
// for a config's model at its batch size, with a breakdown of where a step's time goes.
//
//   build/bench/train_bench --config configs/mnist.json [--threads 1] [--steps 100] [--reps 5]
//
// Inputs are random (throughput does not depend on pixel values), so no dataset is needed.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/ops.h"
#include "core/storage.h"
#include "layers/build.h"
#include "optim/optimizer.h"
#include "trainer/config.h"

using namespace dptrain;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"training-step throughput of a config's model on random inputs"};
  std::string config_path;
  int threads = 1, steps = 100, reps = 5, warmup = 20;
  int64_t batch = 0;
  app.add_option("--config", config_path, "config whose model, optimizer and batch size are used")->required();
  app.add_option("--threads", threads, "CPU threads");
  app.add_option("--batch", batch, "batch size (default: the config's)");
  app.add_option("--steps", steps, "steps per timed repetition");
  app.add_option("--reps", reps, "timed repetitions");
  app.add_option("--warmup", warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);

  try {
    const trainer::Config config = trainer::parse_config(trainer::read_json_file(config_path));
    if (batch == 0) batch = config.data.batch_size;
    omp_set_num_threads(threads);
    Eigen::setNbThreads(threads);

    auto model = layers::build_sequential(config.model.layers, config.model.input_shape, config.seed);
    optim::Adam optimizer(model->named_parameters(), {});
    Shape input_shape{batch};
    input_shape.insert(input_shape.end(), config.model.input_shape.begin(), config.model.input_shape.end());
    Rng rng(1);
    Tensor x = Tensor::empty(input_shape);
    for (float& v : x.values()) v = rng.uniform(-1.0f, 2.0f);
    std::vector<int32_t> labels(batch);
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));

    double forward_s = 0, backward_s = 0, optimizer_s = 0;
    auto step = [&] {
      const auto t0 = Clock::now();
      optimizer.zero_grad();
      Tensor loss = ops::cross_entropy(model->forward(x), labels);
      const auto t1 = Clock::now();
      loss.backward();
      const auto t2 = Clock::now();
      optimizer.step(1e-3f);
      const auto t3 = Clock::now();
      forward_s += std::chrono::duration<double>(t1 - t0).count();
      backward_s += std::chrono::duration<double>(t2 - t1).count();
      optimizer_s += std::chrono::duration<double>(t3 - t2).count();
    };
    for (int i = 0; i < warmup; ++i) step();
    const std::size_t fresh_before = storage_stats().fresh_allocations;
    forward_s = backward_s = optimizer_s = 0;
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
      const auto start = Clock::now();
      for (int i = 0; i < steps; ++i) step();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      rates.push_back(steps * batch / seconds);
      std::printf("rep %d: %.0f samples/s\n", r, rates.back());
    }
    std::sort(rates.begin(), rates.end());
    const double total = forward_s + backward_s + optimizer_s;
    std::printf("model %s, batch %lld, %d thread(s): median %.0f samples/s [min %.0f, max %.0f]\n",
                config_path.c_str(), static_cast<long long>(batch), threads, rates[rates.size() / 2], rates.front(),
                rates.back());
    std::printf("per step %.2f ms: forward %.0f%%, backward %.0f%%, optimizer %.0f%%; tensor buffers allocated in "
                "timed steps: %zu\n",
                1e3 * total / (reps * steps), 100 * forward_s / total, 100 * backward_s / total,
                100 * optimizer_s / total, storage_stats().fresh_allocations - fresh_before);
    std::printf("RESULT {\"bench\": \"train\", \"config\": \"%s\", \"batch\": %lld, \"threads\": %d, "
                "\"samples_per_sec\": %.1f}\n",
                config_path.c_str(), static_cast<long long>(batch), threads, rates[rates.size() / 2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
