// Timeline: spans of named work per thread, written as Chrome-trace events ("ph": "X") that
// Perfetto and chrome://tracing open. Off unless enable() is called; off, a span costs one relaxed
// atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

namespace dptrain::timeline {

using Clock = std::chrono::steady_clock;

namespace detail {
extern std::atomic<bool> on;
}

inline bool enabled() {
  return detail::on.load(std::memory_order_relaxed);
}

// Starts recording; timestamps count from now (the trainer calls it right after a barrier, so the
// ranks' tracks line up).
void enable();
// Names the calling thread's track (thread id `tid` within this rank's process track).
void set_thread(int tid, const std::string& name);
void record(std::string name, const char* category, Clock::time_point begin, Clock::time_point end);
// This process's events as comma-separated Chrome-trace JSON objects with "pid" = `pid` (the rank),
// track names included; empties the buffer.
std::string take_events_json(int pid);

// Records [construction, destruction) when the timeline is on. `name` + `index` (if >= 0) names it,
// e.g. ("allreduce bucket ", 3); the string is only built when recording.
class Span {
 public:
  Span(const char* name, const char* category, int index = -1)
      : name_(name), category_(category), index_(index), active_(enabled()) {
    if (active_) begin_ = Clock::now();
  }
  ~Span() {
    if (active_)
      record(index_ < 0 ? std::string(name_) : name_ + std::to_string(index_), category_, begin_,
             Clock::now());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  int index_;
  bool active_;
  Clock::time_point begin_;
};

}  // namespace dptrain::timeline
