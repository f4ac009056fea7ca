// DPTRAIN_INJECT_FAULT parsing and firing.
#include "trainer/faults.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace dptrain::trainer {

InjectedFault InjectedFault::from_environment() {
  InjectedFault f;
  const char* spec = std::getenv("DPTRAIN_INJECT_FAULT");
  if (spec == nullptr || *spec == '\0') return f;
  char kind[32] = "throw";
  const int fields = std::sscanf(spec, "%d:%ld:%31s", &f.rank_, &f.step_, kind);
  const std::string k = kind;
  long long slow_ms = 0;
  char trailing = 0;
  const bool slow = k.starts_with("slow:") &&
                    std::sscanf(k.c_str() + 5, "%lld%c", &slow_ms, &trailing) == 1 && slow_ms > 0 &&
                    slow_ms <= 60'000;
  DPTRAIN_CHECK(
      (fields == 2 || fields == 3) && f.rank_ >= 0 && f.step_ >= 0 &&
          (k == "throw" || k == "kill" || k == "kill_in_checkpoint" || k == "hang" || k == "sigusr1" || slow),
      "DPTRAIN_INJECT_FAULT='", spec,
      "': expected RANK:STEP[:throw|kill|kill_in_checkpoint|hang|sigusr1|slow:MS] (MS from 1 to 60000)");
  f.kind_ = k == "kill"                 ? Kind::kKill
            : k == "kill_in_checkpoint" ? Kind::kKillInCheckpoint
            : k == "hang"               ? Kind::kHang
            : k == "sigusr1"            ? Kind::kSigusr1
            : slow                      ? Kind::kSlow
                                        : Kind::kThrow;
  f.slow_ms_ = slow_ms;
  return f;
}

void InjectedFault::before_step(int rank, int64_t steps_done) const {
  if (kind_ == Kind::kSlow && rank == rank_ && steps_done >= step_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
    return;
  }
  if (steps_done != step_ || rank != rank_) return;
  if (kind_ == Kind::kThrow) DPTRAIN_FAIL("fault injected by DPTRAIN_INJECT_FAULT at step ", steps_done);
  if (kind_ == Kind::kKill) std::raise(SIGKILL);
  if (kind_ == Kind::kSigusr1) std::raise(SIGUSR1);
  if (kind_ == Kind::kHang) {
    std::fprintf(stderr, "dptrain: fault injected by DPTRAIN_INJECT_FAULT: rank %d hangs before step %lld\n",
                 rank, static_cast<long long>(steps_done + 1));
    std::fflush(stderr);
    // A stop signal's handler returns here and the wait goes on: only a second SIGINT or a
    // SIGKILL ends the process, as for a rank stuck in a collective.
    for (;;) ::pause();
  }
}

bool InjectedFault::kills_checkpoint(int rank, int64_t step) const {
  return kind_ == Kind::kKillInCheckpoint && step == step_ && rank == rank_;
}

}  // namespace dptrain::trainer
