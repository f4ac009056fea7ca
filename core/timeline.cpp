// Timeline event buffer and its Chrome-trace form.
#include "core/timeline.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

namespace dptrain::timeline {
namespace detail {
std::atomic<bool> on{false};
}

namespace {

struct Event {
  std::string name;
  const char* category;
  int tid;
  Clock::time_point begin, end;
};

std::mutex mutex;  // the main and the communication thread both record
std::vector<Event> events;
std::map<int, std::string> thread_names = {{0, "main"}};
Clock::time_point origin;
thread_local int current_tid = 0;

}  // namespace

void enable() {
  std::lock_guard lock(mutex);
  origin = Clock::now();
  events.reserve(1 << 16);
  detail::on.store(true, std::memory_order_relaxed);
}

void set_thread(int tid, const std::string& name) {
  current_tid = tid;
  std::lock_guard lock(mutex);
  thread_names[tid] = name;
}

void record(std::string name, const char* category, Clock::time_point begin, Clock::time_point end) {
  std::lock_guard lock(mutex);
  events.push_back({std::move(name), category, current_tid, begin, end});
}

std::string take_events_json(int pid) {
  std::lock_guard lock(mutex);
  using nlohmann::json;
  const auto micros = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  std::string out = json{{"name", "process_name"},
                         {"ph", "M"},
                         {"pid", pid},
                         {"args", {{"name", "rank " + std::to_string(pid)}}}}
                        .dump();
  out +=
      "," +
      json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}}.dump();
  for (const auto& [tid, name] : thread_names)
    out += "," +
           json{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}}
               .dump();
  char line[160];
  for (const Event& e : events) {
    out += ',' + json{{"name", e.name}, {"cat", e.category}}.dump();
    out.pop_back();  // continue the object with the numeric fields, printed without JSON overhead
    std::snprintf(line, sizeof line, R"(,"ph":"X","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f})", pid, e.tid,
                  micros(e.begin - origin), micros(e.end - e.begin));
    out += line;
  }
  events.clear();
  return out;
}

}  // namespace dptrain::timeline
