// Signal handlers that record a stop request, and the per-rank request the trainer sums over ranks.
#include "trainer/stop_signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <string_view>

#include "core/error.h"

namespace dptrain::trainer {
namespace {

// Written by the handler, which may run on any thread (MPI's and OpenMP's included): lock-free
// atomics are the only state a handler may touch.
std::atomic<int> first_signal{0};
std::atomic<int> interrupts{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_stop_signal(int signal) {
  if (signal == SIGINT && interrupts.fetch_add(1) >= 1) {
    constexpr char kLine[] = "dptrain: second SIGINT: stopping at once, without a checkpoint\n";
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, kLine, sizeof kLine - 1);
    ::_exit(kExitInterrupted);
  }
  int none = 0;
  if (!first_signal.compare_exchange_strong(none, signal)) return;
  // Said at once (write(2) is async-signal-safe; stdio is not): the stop itself waits for the step
  // every rank agrees on, and a user at a terminal should know the key press was taken.
  constexpr std::string_view kSigint =
      "dptrain: SIGINT: stopping with a checkpoint at the next step; SIGINT again stops at once\n";
  // mpirun also sends SIGTERM when it ends a job because another rank failed, and then SIGKILL before
  // any step ends: the line must not promise a checkpoint there.
  constexpr std::string_view kSigterm =
      "dptrain: SIGTERM: stopping with a checkpoint at the next step (unless mpirun is ending the job "
      "for another rank's error)\n";
  constexpr std::string_view kSigusr1 = "dptrain: SIGUSR1: stopping with a checkpoint at the next step\n";
  const std::string_view line = signal == SIGINT ? kSigint : signal == SIGTERM ? kSigterm : kSigusr1;
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // Blocking calls (MPI's polls, file writes) resume after the handler: the loop decides when to stop.
  action.sa_flags = SA_RESTART;
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1})
    DPTRAIN_CHECK(::sigaction(signal, &action, nullptr) == 0, "sigaction(", strsignal(signal),
                  ") failed: ", std::strerror(errno));
}

int received_stop_signal() {
  return first_signal.load();
}

void clear_stop_signal() {
  first_signal.store(0);
  interrupts.store(0);
}

StopRequests StopRequests::of_this_process() {
  const int signal = received_stop_signal();
  return {.sigterm = signal == SIGTERM, .sigint = signal == SIGINT, .sigusr1 = signal == SIGUSR1};
}

std::string StopRequests::describe() const {
  std::string out;
  for (const auto& [name, ranks] :
       {std::pair{"SIGTERM", sigterm}, {"SIGINT", sigint}, {"SIGUSR1", sigusr1}}) {
    if (ranks == 0) continue;
    if (!out.empty()) out += " and ";
    out += std::string(name) + " on " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks");
  }
  return out;
}

}  // namespace dptrain::trainer
