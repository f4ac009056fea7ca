// Console output, metrics.jsonl and the timeline file.
#include "trainer/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_replacement.h"
#include "core/timeline.h"
#include "data/registry.h"
#include "trainer/progress.h"

namespace dptrain::trainer {
namespace {

std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1e6) {
    std::snprintf(text, sizeof text, "%.2f MB", bytes / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.1f kB", bytes / 1e3);
  }
  return text;
}

}  // namespace

void print_summary(const Config& config, const RunSummary& s) {
  std::printf(
      "dptrain: %d rank(s) on %d host(s), %d thread(s) per rank%s; parameters identical on %d rank(s) "
      "(checksum "
      "%016llx)\n",
      s.ranks, s.hosts, s.threads, s.device == "cpu" ? "" : (", device " + s.device).c_str(), s.ranks,
      static_cast<unsigned long long>(s.parameters_checksum));
  std::printf("model: %lld parameters\n%s", static_cast<long long>(s.parameters),
              s.model_description.c_str());
  const std::string named = data::dataset_format(config.data.dataset).source;
  const std::string source = named.empty() ? config.data.dir : named;
  std::printf("data: %s, %lld training and %lld test samples; batch %lld per rank (%lld global)",
              source.c_str(), static_cast<long long>(s.train_samples), static_cast<long long>(s.test_samples),
              static_cast<long long>(config.data.batch_size), static_cast<long long>(s.global_batch));
  std::printf(", %lld steps per epoch\n", static_cast<long long>(s.steps_per_epoch));
  if (!s.loader.empty()) std::printf("loader: %s\n", s.loader.c_str());
  if (!s.gradient_sync.empty()) {
    const std::size_t end_of_line = s.gradient_sync.find('\n');
    std::printf(
        "gradients: %s; lr %g scaled to %g\n%s", s.gradient_sync.substr(0, end_of_line).c_str(),
        config.optimizer.lr, s.scaled_lr,
        end_of_line == std::string::npos ? "" : (s.gradient_sync.substr(end_of_line + 1) + "\n").c_str());
  }
  const bool sharded = config.distributed.shard_optimizer && s.ranks > 1;
  char clipping[96] = "";
  if (config.optimizer.max_grad_norm > 0)
    std::snprintf(clipping, sizeof clipping, "; gradients clipped to a global norm of %g",
                  config.optimizer.max_grad_norm);
  std::printf("optimizer: %s, state %s per rank%s%s\n", s.optimizer.c_str(),
              format_bytes(static_cast<double>(s.optimizer_state_bytes)).c_str(),
              sharded ? (" (sharded over " + std::to_string(s.ranks) + " ranks: " +
                         format_bytes(static_cast<double>(s.optimizer_state_bytes_all)) + " in all)")
                            .c_str()
                      : "",
              clipping);
  const CheckpointConfig& k = config.checkpoint;
  std::string every;
  if (k.every_steps > 0) every = std::to_string(k.every_steps) + " step(s)";
  if (k.every_epochs > 0)
    every += (every.empty() ? "" : " and ") + std::to_string(k.every_epochs) + " epoch(s)";
  std::printf("checkpoints: %s, %s%s, %s kept\n", k.dir.c_str(), every.empty() ? "" : "every ",
              every.empty() ? "at the end only" : (every + " and at the end").c_str(),
              k.keep > 0 ? ("newest " + std::to_string(k.keep)).c_str() : "all");
  if (s.already_complete)
    std::printf("dptrain: training already complete at step %lld; nothing to do\n",
                static_cast<long long>(s.global_step));
  std::fflush(stdout);
}

void print_run_end(const Config& config, const std::vector<EpochMetrics>& epochs, double seconds) {
  if (epochs.empty()) return;
  const EpochMetrics& last = epochs.back();
  const bool accuracy = config.model.loss != LossKind::kMse;
  const auto better = [&](const EpochMetrics& a, const EpochMetrics& b) {
    return accuracy ? a.test_accuracy > b.test_accuracy : a.test_loss < b.test_loss;
  };
  const EpochMetrics* best = &epochs.front();
  for (const EpochMetrics& m : epochs)
    if (better(m, *best)) best = &m;
  char figures[160];
  if (accuracy)
    std::snprintf(figures, sizeof figures,
                  "test acc %.2f%% (loss %.4f) after epoch %lld, best %.2f%% after epoch %lld",
                  100 * last.test_accuracy, last.test_loss, static_cast<long long>(last.epoch),
                  100 * best->test_accuracy, static_cast<long long>(best->epoch));
  else
    std::snprintf(figures, sizeof figures, "test loss %.6g after epoch %lld, lowest %.6g after epoch %lld",
                  last.test_loss, static_cast<long long>(last.epoch), best->test_loss,
                  static_cast<long long>(best->epoch));
  std::printf("done: %zu epoch(s) to step %lld in %s; %s\n", epochs.size(), static_cast<long long>(last.step),
              clock_text(seconds).c_str(), figures);
}

void print_epoch(const Config& config, int ranks, const EpochMetrics& m) {
  // A signal's stop prints no epoch line: an epoch cut short here ended at training.max_steps.
  const std::string resumed =
      (m.first_sample > 0 ? " (resumed at sample " + std::to_string(m.first_sample) + ")" : std::string()) +
      (m.stopped_early ? " (cut short: training.max_steps " + std::to_string(m.step) + " reached)" : "");
  if (config.model.loss == LossKind::kMse) {
    std::printf("epoch %lld: train loss %.6g | test loss %.6g | %.0f samples/s (%.0f per rank), %.2f s%s\n",
                static_cast<long long>(m.epoch), m.train_loss, m.test_loss, m.samples_per_sec,
                m.samples_per_sec_per_rank, m.epoch_seconds, resumed.c_str());
  } else {
    std::printf(
        "epoch %lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f samples/s (%.0f per "
        "rank), %.1f "
        "s%s\n",
        static_cast<long long>(m.epoch), m.train_loss, 100 * m.train_accuracy, m.test_loss,
        100 * m.test_accuracy, m.samples_per_sec, m.samples_per_sec_per_rank, m.epoch_seconds,
        resumed.c_str());
  }
  const StepTimes& t = m.step_times;
  std::printf(
      "  per step %.2f ms: data %.2f | compute %.2f | communication not overlapped %.2f | optimizer %.2f | "
      "other "
      "%.2f (mean of %d rank(s))%s; optimizer state %s per rank, peak RSS %s (largest rank)\n",
      1e3 * t.total, 1e3 * t.data, 1e3 * t.compute, 1e3 * t.communication, 1e3 * t.optimizer,
      1e3 * (t.total - t.data - t.compute - t.communication - t.optimizer), ranks,
      ranks > 1 ? ("; gradients " + format_bytes(m.gradient_bytes_per_step) + " per step per rank").c_str()
                : "",
      format_bytes(static_cast<double>(m.optimizer_state_bytes)).c_str(),
      format_bytes(static_cast<double>(m.peak_resident_bytes)).c_str());
  if (m.clipping) {
    const ClippingStats& c = *m.clipping;
    std::printf("  gradient norm before clipping: mean %.4g, max %.4g; %lld of %lld step(s) clipped to %g\n",
                c.norm_mean(), c.norm_max, static_cast<long long>(c.clipped_steps),
                static_cast<long long>(c.steps), config.optimizer.max_grad_norm);
  }
  std::fflush(stdout);
}

void print_evaluation(const Config& config, int ranks, const std::string& checkpoint, const Evaluation& e) {
  if (config.model.loss == LossKind::kMse) {
    std::printf("evaluation of %s: test loss %.6g (%lld samples, %d rank(s))\n", checkpoint.c_str(), e.loss,
                static_cast<long long>(e.samples), ranks);
  } else {
    std::printf("evaluation of %s: test loss %.4f, accuracy %.2f%% (%lld of %lld correct, %d rank(s))\n",
                checkpoint.c_str(), e.loss, 100 * e.accuracy, static_cast<long long>(e.correct),
                static_cast<long long>(e.samples), ranks);
  }
  std::fflush(stdout);
}

namespace {

// Keeps the lines of `path` up to `step` and says how many it dropped. Resumed from an earlier step
// than the last line's (a checkpoint every few steps, a kill between an epoch's line and its
// checkpoint, a rollback with --resume PATH), the run writes those epochs' lines again: kept, each
// epoch would have two (PyTorch's SummaryWriter purge_step does the same for its event files).
void drop_lines_past(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;  // none yet: the run before wrote no line
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::vector<std::string> kept;
  int64_t dropped = 0, torn = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const Json entry = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!entry.is_object() || !entry.contains("step") || !entry["step"].is_number_integer()) {
      ++torn;  // cut short by a kill mid-write
    } else if (entry["step"].get<int64_t>() <= step) {
      kept.push_back(std::move(line));
    } else {
      ++dropped;
    }
  }
  // A last line without its newline (a kill mid-write) would have the next line appended to it.
  if (dropped == 0 && torn == 0 && (text.empty() || text.back() == '\n')) return;
  FileReplacement replacement(path);
  for (const std::string& line : kept) replacement.out() << line << '\n';
  replacement.commit();
  if (dropped > 0)
    std::printf(
        "dptrain: %s: dropped %lld line(s) past step %lld, of the run before the resume: those "
        "epochs come again\n",
        path.c_str(), static_cast<long long>(dropped), static_cast<long long>(step));
  if (torn > 0)
    std::printf("dptrain: %s: dropped %lld line(s) that are not whole (a kill while one was written)\n",
                path.c_str(), static_cast<long long>(torn));
}

}  // namespace

MetricsLog::MetricsLog(const Config& config, bool writer, std::optional<int64_t> resumed_at_step) {
  if (!writer) return;
  std::filesystem::create_directories(config.output_dir);
  const std::string path = config.output_dir + "/metrics.jsonl";
  if (resumed_at_step) drop_lines_past(path, *resumed_at_step);
  out_.open(path, resumed_at_step ? std::ios::app : std::ios::trunc);
  DPTRAIN_CHECK(out_, path, ": cannot open for writing (check output_dir)");
}

void MetricsLog::write(const EpochMetrics& m, int ranks) {
  if (!out_.is_open()) return;
  Json line = {{"epoch", m.epoch},
               {"step", m.step},
               {"train_loss", m.train_loss},
               {"train_accuracy", m.train_accuracy},
               {"test_loss", m.test_loss},
               {"test_accuracy", m.test_accuracy},
               {"samples_per_sec", m.samples_per_sec},
               {"samples_per_sec_per_rank", m.samples_per_sec_per_rank},
               {"epoch_seconds", m.epoch_seconds},
               {"lr", m.lr},
               {"world_size", ranks},
               {"gradient_bytes_per_step", m.gradient_bytes_per_step},
               {"optimizer_state_bytes_per_rank", m.optimizer_state_bytes},
               {"peak_resident_bytes", m.peak_resident_bytes}};
  if (m.stopped_early) line["stopped_early"] = "max_steps";
  if (m.first_sample > 0) line["resumed_at_sample"] = m.first_sample;
  if (m.clipping) {
    line["gradient_norm_mean"] = m.clipping->norm_mean();
    line["gradient_norm_max"] = m.clipping->norm_max;
    line["clipped_steps"] = m.clipping->clipped_steps;
  }
  const StepTimes& t = m.step_times;
  line["step_ms"] = {{"data", 1e3 * t.data},
                     {"compute", 1e3 * t.compute},
                     {"communication", 1e3 * t.communication},
                     {"optimizer", 1e3 * t.optimizer},
                     {"total", 1e3 * t.total}};
  out_ << line.dump() << '\n';
  out_.flush();
}

void write_timeline(distributed::Communicator& comm, const std::string& path_text) {
  const std::vector<std::string> tracks =
      comm.gather_to_root(timeline::take_events_json(comm.rank()), "gather of timeline events");
  if (comm.rank() != 0) return;
  const std::filesystem::path path(path_text);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::trunc);
  DPTRAIN_CHECK(out, path.string(), ": cannot open for writing (config key distributed.timeline)");
  out << R"({"displayTimeUnit":"ms","traceEvents":[)";
  for (std::size_t r = 0; r < tracks.size(); ++r) out << (r ? "," : "") << tracks[r];
  out << "]}\n";
  DPTRAIN_CHECK(out.good(), path.string(), ": write failed (disk full?)");
  std::printf("timeline: %s (%.1f MB; open it in https://ui.perfetto.dev or chrome://tracing)\n",
              path.c_str(), static_cast<double>(out.tellp()) / 1e6);
  std::fflush(stdout);
}

}  // namespace dptrain::trainer
