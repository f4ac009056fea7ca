// Progress bar and log lines.
#include "trainer/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace dptrain::trainer {
namespace {
std::string accuracy_text(double accuracy) {
  if (accuracy < 0) return "";
  char text[32];
  std::snprintf(text, sizeof text, " acc %.2f%%", 100.0 * accuracy);
  return text;
}
}  // namespace

Progress::Progress(bool enabled, int64_t log_every_steps)
    : enabled_(enabled), terminal_(enabled && isatty(STDOUT_FILENO)), log_every_steps_(log_every_steps) {}

void Progress::begin_epoch(int64_t epoch, int64_t epochs, int64_t steps) {
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = steps;
}

void Progress::update(int64_t step, double loss, double accuracy, double samples_per_sec) {
  if (!enabled_) return;
  const int64_t done = step + 1;
  if (terminal_) {
    const auto now = std::chrono::steady_clock::now();
    if (done != steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(steps_, 1));
    std::string bar(filled, '=');
    if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
    std::printf("\repoch %lld/%lld [%s] %lld/%lld loss %.4f%s %.0f samples/s ",
                static_cast<long long>(epoch_), static_cast<long long>(epochs_), bar.c_str(),
                static_cast<long long>(done), static_cast<long long>(steps_), loss,
                accuracy_text(accuracy).c_str(), samples_per_sec);
    std::fflush(stdout);
  } else if (done % log_every_steps_ == 0 || done == steps_) {
    std::printf("epoch %lld/%lld step %lld/%lld loss %.4f%s %.0f samples/s\n", static_cast<long long>(epoch_),
                static_cast<long long>(epochs_), static_cast<long long>(done), static_cast<long long>(steps_),
                loss, accuracy_text(accuracy).c_str(), samples_per_sec);
    std::fflush(stdout);
  }
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  std::printf("%s%s\n", terminal_ ? "\r\x1b[K" : "", line.c_str());
  std::fflush(stdout);
  last_draw_ = {};  // redraw the bar at the next update
}

void Progress::end_epoch() {
  if (terminal_) std::printf("\n");
}

}  // namespace dptrain::trainer
