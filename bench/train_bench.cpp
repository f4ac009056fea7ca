// Training throughput benchmark: samples/s of full data-parallel training steps (forward, backward,
// bucketed gradient allreduce, optimizer) for a config's model at its batch size, with a breakdown
// of where a step's time goes. Runs alone or under mpirun (throughput is then global).
//
//   build/bench/train_bench --config configs/mnist.json [--threads 1] [--steps 100] [--reps 5]
//   mpirun -np 2 build/bench/train_bench --config configs/mnist.json
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
#include "distributed/reducer.h"
#include "distributed/world.h"
#include "layers/build.h"
#include "optim/optimizer.h"
#include "trainer/config.h"

using namespace dptrain;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"training-step throughput of a config's model on random inputs"};
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = 1, steps = 100, reps = 5, warmup = 20;
  int64_t batch = 0;
  app.add_option("--config", config_path, "config whose model, batch size and distributed settings are used")
      ->required();
  app.add_option("--set", overrides, "config override key.path=JSON (repeatable)")->take_all()->expected(1);
  app.add_option("--threads", threads, "CPU threads per rank");
  app.add_option("--batch", batch, "batch size per rank (default: the config's)");
  app.add_option("--steps", steps, "steps per timed repetition");
  app.add_option("--reps", reps, "timed repetitions");
  app.add_option("--warmup", warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);
  distributed::World world(&argc, &argv);

  try {
    Json json = trainer::read_json_file(config_path);
    for (const std::string& assignment : overrides) trainer::apply_override(json, assignment);
    const trainer::Config config = trainer::parse_config(json);
    if (batch == 0) batch = config.data.batch_size;
    omp_set_num_threads(threads);
    Eigen::setNbThreads(threads);

    auto model = layers::build_sequential(config.model.layers, config.model.input_shape, config.seed);
    optim::Adam optimizer(model->named_parameters(), {});
    distributed::Communicator comm(MPI_COMM_WORLD);
    distributed::GradientReducer reducer(
        comm, model->named_parameters(),
        {config.distributed.fusion_threshold_mb, config.distributed.first_bucket_mb, config.distributed.overlap,
         distributed::parse_compression(config.distributed.compression), /*gradients_prescaled=*/true});
    Shape input_shape{batch};
    input_shape.insert(input_shape.end(), config.model.input_shape.begin(), config.model.input_shape.end());
    Rng rng(1 + world.rank());
    Tensor x = Tensor::empty(input_shape);
    for (float& v : x.values()) v = rng.uniform(-1.0f, 2.0f);
    std::vector<int32_t> labels(batch);
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(10));

    double forward_s = 0, backward_s = 0, reduce_s = 0, optimizer_s = 0;
    int64_t step_index = 0;
    auto step = [&] {
      const auto t0 = Clock::now();
      optimizer.zero_grad();
      Tensor loss = ops::cross_entropy(model->forward(x), labels);
      const auto t1 = Clock::now();
      reducer.prepare(step_index++);
      loss.backward(1.0f / static_cast<float>(world.size()));  // averaging folded in, as in the trainer
      const auto t2 = Clock::now();
      reducer.finish();
      const auto t3 = Clock::now();
      optimizer.step(1e-3f);
      const auto t4 = Clock::now();
      forward_s += std::chrono::duration<double>(t1 - t0).count();
      backward_s += std::chrono::duration<double>(t2 - t1).count();
      reduce_s += std::chrono::duration<double>(t3 - t2).count();
      optimizer_s += std::chrono::duration<double>(t4 - t3).count();
    };
    for (int i = 0; i < warmup; ++i) step();
    const std::size_t fresh_before = storage_stats().fresh_allocations;
    forward_s = backward_s = reduce_s = optimizer_s = 0;
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
      comm.barrier("benchmark barrier");
      const auto start = Clock::now();
      for (int i = 0; i < steps; ++i) step();
      comm.barrier("benchmark barrier");
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      rates.push_back(static_cast<double>(steps) * batch * world.size() / seconds);
      if (world.is_root()) std::printf("rep %d: %.0f samples/s\n", r, rates.back());
    }
    std::sort(rates.begin(), rates.end());
    const double total = forward_s + backward_s + reduce_s + optimizer_s;
    if (world.is_root()) {
      std::printf("%s, %d rank(s) x batch %lld, %d thread(s) per rank: median %.0f samples/s [min %.0f, max %.0f]\n",
                  config_path.c_str(), world.size(), static_cast<long long>(batch), threads, rates[rates.size() / 2],
                  rates.front(), rates.back());
      std::printf("rank 0, per step %.2f ms: forward %.0f%%, backward %.0f%%, allreduce wait %.0f%%, optimizer %.0f%%;"
                  " tensor buffers allocated in timed steps: %zu\n",
                  1e3 * total / (reps * steps), 100 * forward_s / total, 100 * backward_s / total,
                  100 * reduce_s / total, 100 * optimizer_s / total, storage_stats().fresh_allocations - fresh_before);
      std::printf("RESULT {\"bench\": \"train\", \"config\": \"%s\", \"ranks\": %d, \"batch\": %lld, \"threads\": %d, "
                  "\"samples_per_sec\": %.1f}\n",
                  config_path.c_str(), world.size(), static_cast<long long>(batch), threads, rates[rates.size() / 2]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: error on rank %d: %s\n", world.rank(), e.what());
    world.abort(1);
  }
  return 0;
}
