// Checkpoint policy, writing, clean-up and the search for a resume point.
#include "trainer/checkpoint_policy.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/timeline.h"

namespace dptrain::trainer {

Checkpoints::Checkpoints(const CheckpointConfig& config, int rank, InjectedFault fault)
    : config_(config), rank_(rank), fault_(fault) {}

bool Checkpoints::due_after_step(int64_t global_step) const {
  return config_.every_steps > 0 && global_step % config_.every_steps == 0;
}

bool Checkpoints::due_at_epoch_end(int64_t epoch, int64_t global_step, bool stopped_early) const {
  const bool by_epoch = config_.every_epochs > 0 && epoch % config_.every_epochs == 0 && !stopped_early;
  return by_epoch || due_after_step(global_step);
}

std::string Checkpoints::save(const CheckpointData& data) {
  // Every rank counts the checkpoint as written, even where rank 0's write fails ("warn"): the
  // schedule of the collectives around checkpoints stays the same on all of them.
  last_written_step_ = data.position.global_step;
  if (rank_ != 0) return "";
  last_write_failed_ = true;
  timeline::Span span("checkpoint", "checkpoint");
  const auto start = std::chrono::steady_clock::now();
  const std::string path = config_.dir + "/" + checkpoint_file_name(data.position.global_step);
  std::size_t size = 0;
  try {
    const std::vector<char> bytes = encode_checkpoint(data);
    size = bytes.size();
    std::filesystem::create_directories(config_.dir);
    const bool die_midway = fault_.kills_checkpoint(rank_, data.position.global_step);
    write_file_durably(path, bytes, [&] {
      if (die_midway) std::raise(SIGKILL);
    });
  } catch (const std::exception& e) {
    if (config_.on_error == OnCheckpointError::kStop)
      DPTRAIN_FAIL("checkpoint of step ", data.position.global_step, ": ", e.what(),
                   " (checkpoint.on_error \"warn\" would keep training)");
    // Every rank goes on as if it had been written: the schedule stays the same on all of them.
    std::fprintf(stderr,
                 "dptrain: warning: checkpoint of step %lld not written: %s; training goes on "
                 "(checkpoint.on_error \"warn\") and the next checkpoint tries again\n",
                 static_cast<long long>(data.position.global_step), e.what());
    return "";
  }
  last_write_failed_ = false;
  try {
    prune_checkpoints(config_.dir, config_.keep);
  } catch (const std::exception& e) {
    // The new checkpoint is written: an old one left behind costs only disk space.
    std::fprintf(stderr, "dptrain: warning: %s\n", e.what());
  }
  char line[512];
  std::snprintf(line, sizeof line, "checkpoint: %s (%.2f MB, %.1f ms)", path.c_str(),
                static_cast<double>(size) / 1e6,
                1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return line;
}

std::string Checkpoints::clear_earlier() const {
  const std::vector<std::string> earlier = list_checkpoints(config_.dir),
                                 set_aside = list_set_aside(config_.dir);
  if (earlier.empty() && set_aside.empty()) return "";
  for (const std::string& path : earlier) remove_checkpoint(path);
  for (const std::string& path : set_aside) remove_checkpoint(path);
  return "dptrain: starting fresh: removed " + std::to_string(earlier.size()) + " checkpoint(s)" +
         (set_aside.empty() ? "" : " and " + std::to_string(set_aside.size()) + " set aside") +
         " of an earlier run from " + config_.dir + " (--resume auto continues one instead)";
}

std::string Checkpoints::set_aside_after(int64_t global_step) const {
  // One stamp for the whole resume: its files sort together, and a later rollback's never collide.
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  int64_t moved = 0;
  for (const std::string& path : list_checkpoints(config_.dir)) {
    const auto step = checkpoint_step_of(std::filesystem::path(path).filename().string());
    if (!step || *step <= global_step) continue;
    set_checkpoint_aside(path, stamp);
    ++moved;
  }
  if (moved == 0) return "";
  sync_directory(config_.dir);
  return "dptrain: set aside " + std::to_string(moved) + " checkpoint(s) past step " +
         std::to_string(global_step) + " in " + config_.dir + " as set-aside-" + stamp +
         "-ckpt-*: this run goes on from that step, and their higher steps would outrank its own (rename one "
         "back to resume from it; a fresh start removes them)";
}

std::optional<Checkpoint> Checkpoints::find(const std::string& which,
                                            const std::function<void(const Checkpoint&)>& accept) const {
  if (which != "auto") {
    Checkpoint c = read_checkpoint(which);
    accept(c);
    return c;
  }
  std::vector<std::string> rejected;
  std::optional<Checkpoint> found =
      newest_valid_checkpoint(config_.dir, accept, [&](const std::string& path, const std::string& reason) {
        std::fprintf(stderr, "dptrain: skipping checkpoint: %s\n", reason.c_str());
        rejected.push_back(path);
      });
  // Starting afresh would let the new run's checkpoints mix with these.
  DPTRAIN_CHECK(found || rejected.empty(), "--resume auto: none of the ", rejected.size(),
                " checkpoint(s) in ", config_.dir,
                " can be used (reasons above); move them away or set checkpoint.dir to start afresh");
  return found;
}

}  // namespace dptrain::trainer
