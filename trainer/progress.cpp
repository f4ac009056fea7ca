// Progress bar and log lines, and where each belongs.
#include "trainer/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dptrain::trainer {
namespace {

std::string accuracy_text(double accuracy) {
  if (accuracy < 0) return "";
  char text[32];
  std::snprintf(text, sizeof text, " acc %.2f%%", 100.0 * accuracy);
  return text;
}

bool any_env(std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(),
                     [](const char* name) { return std::getenv(name) != nullptr; });
}

bool is_terminal_device(const std::string& path) {
  return path.starts_with("/dev/pts/") || path.starts_with("/dev/tty");
}

// Where the launcher that started this process (its parent: mpirun, or orted on remote hosts)
// writes: a launcher gives its ranks a pseudo-terminal whatever its own stdout is.
bool launcher_writes_to_terminal() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces and parentheses): state, ppid, ...
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  char state = 0;
  long parent = 0;
  if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &parent) != 2 || parent <= 1) return false;
  char target[256];
  const std::string link = "/proc/" + std::to_string(parent) + "/fd/1";
  const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;  // not ours to read (another user's launcher): assume a log
  return is_terminal_device(std::string(target, static_cast<std::size_t>(n)));
}

// ", 0:07 elapsed, 1:23 left": the steps left at the epoch's mean step time so far.
std::string time_text(int64_t done, const ProgressClock& clock) {
  const double left = static_cast<double>(clock.steps_left) * clock.epoch_seconds / static_cast<double>(done);
  return ", " + clock_text(clock.run_seconds) + " elapsed, " + clock_text(left) + " left";
}

}  // namespace

std::string clock_text(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  return text;
}

int64_t run_steps_left(int64_t steps, int64_t done, int64_t epochs_after, int64_t steps_per_epoch,
                       int64_t max_steps, int64_t global_step) {
  int64_t left = steps - done + epochs_after * steps_per_epoch;
  if (max_steps > 0) left = std::min(left, max_steps - global_step);
  return std::max<int64_t>(left, 0);
}

ProgressMode resolve_progress_mode(ProgressMode configured) {
  if (configured != ProgressMode::kAuto) return configured;
  if (!isatty(STDOUT_FILENO)) return ProgressMode::kLines;
  // Batch systems keep the output in files, whatever terminal the job itself sees.
  if (any_env({"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID"})) return ProgressMode::kLines;
  const bool under_mpi_launcher =
      any_env({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MPI_LOCALRANKID"});
  if (under_mpi_launcher && !launcher_writes_to_terminal()) return ProgressMode::kLines;
  return ProgressMode::kBar;
}

Progress::Progress(bool enabled, ProgressMode mode, int64_t log_every_steps)
    : enabled_(enabled),
      mode_(enabled ? resolve_progress_mode(mode) : ProgressMode::kOff),
      log_every_steps_(log_every_steps) {}

void Progress::begin_epoch(int64_t epoch, int64_t epochs, int64_t steps) {
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = steps;
}

bool Progress::due(int64_t step) const {
  const int64_t done = step + 1;
  if (mode_ == ProgressMode::kBar)
    return done == steps_ || std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
  if (mode_ == ProgressMode::kLines) return done % log_every_steps_ == 0 || done == steps_;
  return false;
}

void Progress::update(int64_t step, double loss, double accuracy, double samples_per_sec,
                      double gradient_norm, const ProgressClock& clock) {
  const int64_t done = step + 1;
  char norm[48] = "";
  if (gradient_norm >= 0) std::snprintf(norm, sizeof norm, " grad norm %.4g", gradient_norm);
  if (mode_ == ProgressMode::kBar) {
    const auto now = std::chrono::steady_clock::now();
    if (done != steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(steps_, 1));
    std::string bar(filled, '=');
    if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
    std::printf("\repoch %lld/%lld [%s] %lld/%lld loss %.4f%s%s %.0f samples/s%s ",
                static_cast<long long>(epoch_), static_cast<long long>(epochs_), bar.c_str(),
                static_cast<long long>(done), static_cast<long long>(steps_), loss,
                accuracy_text(accuracy).c_str(), norm, samples_per_sec, time_text(done, clock).c_str());
    std::fflush(stdout);
  } else if (mode_ == ProgressMode::kLines && (done % log_every_steps_ == 0 || done == steps_)) {
    std::printf("epoch %lld/%lld step %lld/%lld loss %.4f%s%s %.0f samples/s%s\n",
                static_cast<long long>(epoch_), static_cast<long long>(epochs_), static_cast<long long>(done),
                static_cast<long long>(steps_), loss, accuracy_text(accuracy).c_str(), norm, samples_per_sec,
                time_text(done, clock).c_str());
    std::fflush(stdout);
  }
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  std::printf("%s%s\n", mode_ == ProgressMode::kBar ? "\r\x1b[K" : "", line.c_str());
  std::fflush(stdout);
  last_draw_ = {};  // redraw the bar at the next update
}

void Progress::end_epoch() {
  if (mode_ == ProgressMode::kBar) std::printf("\n");
}

}  // namespace dptrain::trainer
