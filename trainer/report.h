// What a run tells its user: rank 0's start-up summary, each epoch's line and step breakdown, the
// evaluation of a checkpoint, the metrics JSONL file, and the Chrome-trace timeline of every rank.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "distributed/communicator.h"
#include "trainer/config.h"
#include "trainer/run_types.h"

namespace dptrain::trainer {

// Facts about a run gathered at start-up, for its summary.
struct RunSummary {
  int ranks = 1, hosts = 1, threads = 1;
  std::string device;
  uint64_t parameters_checksum = 0;
  int64_t parameters = 0;
  std::string model_description;
  int64_t train_samples = 0, test_samples = 0;
  int64_t global_batch = 0, steps_per_epoch = 0;
  std::string loader;         // workers, read-ahead and augmentation of the training split
  std::string gradient_sync;  // its description, line by line ("" when there is nothing to say)
  double scaled_lr = 0;
  std::string optimizer;                  // its name
  int64_t optimizer_state_bytes = 0;      // on this rank
  int64_t optimizer_state_bytes_all = 0;  // the whole state (over the ranks, when sharded)
  bool already_complete = false;
  int64_t global_step = 0;
};

void print_summary(const Config& config, const RunSummary& summary);
void print_epoch(const Config& config, int ranks, const EpochMetrics& m);
// The run's last line before its weights: epochs, last step and wall time, the last test figures and
// the best of them (highest accuracy, or lowest loss without one). Nothing for no epoch.
void print_run_end(const Config& config, const std::vector<EpochMetrics>& epochs, double seconds);
void print_evaluation(const Config& config, int ranks, const std::string& checkpoint, const Evaluation& e);

// metrics.jsonl in output_dir: one line per (partial) epoch; rank 0 writes, other ranks hold none.
class MetricsLog {
 public:
  // A resumed run (`resumed_at_step`: the step it goes on from) continues the file of the run it
  // resumes, less that run's lines past the step (and any torn line): those epochs come again. Else
  // the file starts empty.
  MetricsLog(const Config& config, bool writer, std::optional<int64_t> resumed_at_step);
  void write(const EpochMetrics& m, int ranks);

 private:
  std::ofstream out_;
};

// Rank 0 gathers every rank's timeline events and writes one Chrome-trace file at `path`, a process
// track per rank. Every rank calls it.
void write_timeline(distributed::Communicator& comm, const std::string& path);

}  // namespace dptrain::trainer
