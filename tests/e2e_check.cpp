// e2e_check: the end-to-end scripts' comparisons of the trainer's output files (weights, metrics,
// timeline), written with the project's own readers so that the tests need no Python.
//
//   e2e_check close A B REL            max over all tensors of |a - b| <= REL * max over all tensors of |a|
//   e2e_check update A B INIT REL      ||a - b||_2 <= REL * ||a - init||_2 over the whole model: B strays
//                                      from A by at most REL of the distance A travelled from INIT
//                                      (per-tensor figures are printed too)
//   e2e_check expect A NAME ATOL V...  tensor NAME (flattened) equals V... within ATOL
//   e2e_check norm A V REL             the L2 norm of all of A's tensors together is V within REL of V
//   e2e_check show A                   every tensor's name, shape and first values
//   e2e_check flip-byte FILE K         flips the lowest bit of the byte K bytes before the end of FILE
//   e2e_check metric FILE KEY          KEY of the last line of a metrics.jsonl
//   e2e_check timeline RUN_DIR STEPS   the Chrome trace and step breakdown of a 2-rank run of STEPS steps
// Exit status 0 when the check holds, 1 when it does not, 2 for a usage or file error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/config_reader.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace {

using dptrain::Json;
using dptrain::NamedTensor;
namespace safetensors = dptrain::safetensors;

std::map<std::string, std::vector<double>> load_tensors(
    const std::string& path, std::map<std::string, dptrain::Shape>* shapes = nullptr) {
  std::map<std::string, std::vector<double>> out;
  for (const NamedTensor& t : safetensors::load(path).tensors) {
    out[t.name].assign(t.tensor.values().begin(), t.tensor.values().end());
    if (shapes) (*shapes)[t.name] = t.tensor.shape();
  }
  return out;
}

int close(const std::string& a_path, const std::string& b_path, double rel) {
  std::map<std::string, dptrain::Shape> a_shapes, b_shapes;
  const auto a = load_tensors(a_path, &a_shapes), b = load_tensors(b_path, &b_shapes);
  if (a_shapes != b_shapes) {
    std::printf("  tensor names or shapes differ between %s and %s\n", a_path.c_str(), b_path.c_str());
    return 1;
  }
  double worst_diff = 0, scale = 0;
  for (const auto& [name, x] : a) {
    const std::vector<double>& y = b.at(name);
    double diff = 0, size = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, std::abs(x[i] - y[i]));
      size = std::max(size, std::abs(x[i]));
    }
    std::printf("  %s: max|diff| %.3e, max|w| %.3e\n", name.c_str(), diff, size);
    worst_diff = std::max(worst_diff, diff);
    scale = std::max(scale, size);
  }
  const double ratio = scale > 0 ? worst_diff / scale : (worst_diff == 0 ? 0.0 : INFINITY);
  const bool ok = ratio <= rel;
  std::printf("  max|diff| %.3e / max|w| %.3e = %.3e (%s, limit %g)\n", worst_diff, scale, ratio,
              ok ? "ok" : "TOO FAR", rel);
  return ok ? 0 : 1;
}

double distance(const std::vector<double>& x, const std::vector<double>& y) {
  double sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += (x[i] - y[i]) * (x[i] - y[i]);
  return std::sqrt(sum);
}

int update(const std::string& a_path, const std::string& b_path, const std::string& init_path, double rel) {
  std::map<std::string, dptrain::Shape> a_shapes, b_shapes, init_shapes;
  const auto a = load_tensors(a_path, &a_shapes), b = load_tensors(b_path, &b_shapes),
             init = load_tensors(init_path, &init_shapes);
  if (a_shapes != b_shapes || a_shapes != init_shapes) {
    std::printf("  tensor names or shapes differ among %s, %s and %s\n", a_path.c_str(), b_path.c_str(),
                init_path.c_str());
    return 1;
  }
  double stray_squared = 0, travelled_squared = 0;
  for (const auto& [name, x] : a) {
    const double travelled = distance(x, init.at(name)), stray = distance(x, b.at(name));
    stray_squared += stray * stray;
    travelled_squared += travelled * travelled;
    std::printf("  %s: ||a - b|| %.3e, ||a - init|| %.3e, ratio %.3e\n", name.c_str(), stray, travelled,
                travelled > 0 ? stray / travelled : 0.0);
  }
  // Over the whole model, not per tensor: a ratio over a few elements (a bias of 10) is decided by
  // single elements and so by luck; over all parameters it is a stable average.
  const double stray = std::sqrt(stray_squared), travelled = std::sqrt(travelled_squared);
  const double ratio = travelled > 0 ? stray / travelled : (stray == 0 ? 0.0 : INFINITY);
  const bool ok = ratio <= rel;
  std::printf("  whole model: ||a - b|| %.3e / ||a - init|| %.3e = %.3e (%s, limit %g)\n", stray, travelled,
              ratio, ok ? "ok" : "TOO FAR", rel);
  return ok ? 0 : 1;
}

int expect(const std::string& path, const std::string& name, double atol, const std::vector<double>& want) {
  const auto tensors = load_tensors(path);
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    std::printf("  %s has no tensor '%s'\n", path.c_str(), name.c_str());
    return 1;
  }
  bool ok = it->second.size() == want.size();
  std::printf("  %s = [", name.c_str());
  for (std::size_t i = 0; i < it->second.size(); ++i) {
    std::printf("%s%.6f", i ? ", " : "", it->second[i]);
    if (ok) ok = std::abs(it->second[i] - want[i]) <= atol;
  }
  std::printf("], expected [");
  for (std::size_t i = 0; i < want.size(); ++i) std::printf("%s%g", i ? ", " : "", want[i]);
  std::printf("] within %g\n", atol);
  return ok ? 0 : 1;
}

int show(const std::string& path) {
  std::map<std::string, dptrain::Shape> shapes;
  for (const auto& [name, values] : load_tensors(path, &shapes)) {
    std::printf("  %s %s", name.c_str(), dptrain::shape_str(shapes[name]).c_str());
    for (std::size_t i = 0; i < std::min<std::size_t>(6, values.size()); ++i) std::printf(" %.6g", values[i]);
    std::printf("\n");
  }
  return 0;
}

int flip_byte(const std::string& path, long from_end) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  DPTRAIN_CHECK(file, path, ": cannot open for reading and writing");
  file.seekg(-from_end, std::ios::end);
  char byte = 0;
  DPTRAIN_CHECK(file.get(byte), path, ": shorter than ", from_end, " bytes");
  file.seekp(-from_end, std::ios::end);
  file.put(static_cast<char>(byte ^ 1));
  DPTRAIN_CHECK(file.good(), path, ": write failed");
  return 0;
}

Json last_json_line(const std::string& path) {
  std::ifstream in(path);
  DPTRAIN_CHECK(in, path, ": cannot open");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  DPTRAIN_CHECK(!last.empty(), path, ": no lines");
  return Json::parse(last);
}

int metric(const std::string& path, const std::string& key) {
  const Json line = last_json_line(path);
  DPTRAIN_CHECK(line.contains(key), path, ": the last line has no key '", key, "'");
  std::printf("%s\n", line[key].dump().c_str());
  return 0;
}

// What the Chrome trace of a 2-rank run of `steps` steps must hold: a process track per rank, each
// step phase once per step on every rank, the overlapped allreduces on the communication thread,
// phases in order, a checkpoint span on rank 0; and a consistent step breakdown in metrics.jsonl.
int timeline(const std::string& run, int64_t steps) {
  std::ifstream in(run + "/timeline.json");
  DPTRAIN_CHECK(in, run, "/timeline.json: cannot open");
  const Json events = Json::parse(in).at("traceEvents");
  std::set<std::string> process_names;
  std::vector<const Json*> spans;
  for (const Json& e : events) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") process_names.insert(e.at("args").at("name"));
    if (e.at("ph") == "X") spans.push_back(&e);
  }
  int failures = 0;
  const auto require = [&](bool ok, const std::string& what) {
    if (!ok) std::printf("  FAILED: %s\n", what.c_str());
    failures += !ok;
  };
  require(process_names == std::set<std::string>{"rank 0", "rank 1"}, "a process track for each of 2 ranks");
  std::size_t on_comm_threads = 0;
  for (int rank : {0, 1}) {
    std::map<std::string, int64_t> count;
    std::vector<std::pair<double, std::string>> main_phases;
    int64_t overlapped = 0;
    bool times_valid = true;
    for (const Json* e : spans) {
      if (e->at("pid") != rank) continue;
      const std::string name = e->at("name");
      ++count[name.substr(0, name.find(" bucket"))];
      const int tid = e->at("tid");
      if (tid == 1 && name.starts_with("allreduce bucket ")) ++overlapped;
      if (tid == 0 && (name == "forward" || name == "backward" || name == "optimizer"))
        main_phases.emplace_back(e->at("ts").get<double>(), name);
      times_valid &= e->at("dur").get<double>() >= 0 && e->at("ts").get<double>() >= 0;
    }
    on_comm_threads += static_cast<std::size_t>(overlapped);
    const std::string who = "rank " + std::to_string(rank) + ": ";
    for (const char* phase : {"data", "forward", "backward", "finish gradient averaging", "optimizer"})
      require(count[phase] == steps, who + "'" + phase + "' spans: " + std::to_string(count[phase]) +
                                         ", expected " + std::to_string(steps));
    require(overlapped >= steps,
            who + std::to_string(overlapped) +
                " allreduces on the communication thread, expected >= " + std::to_string(steps));
    require(times_valid, who + "negative timestamps or durations");
    std::sort(main_phases.begin(), main_phases.end());
    require(main_phases.size() >= 3 && main_phases[0].second == "forward" &&
                main_phases[1].second == "backward" && main_phases[2].second == "optimizer",
            who + "the first step's phases are not forward, backward, optimizer in that order");
  }
  require(std::any_of(spans.begin(), spans.end(),
                      [](const Json* e) { return e->at("name") == "checkpoint" && e->at("pid") == 0; }),
          "a checkpoint span on rank 0");
  std::set<std::pair<int, int>> tracks;
  for (const Json* e : spans) tracks.insert({e->at("pid").get<int>(), e->at("tid").get<int>()});
  std::printf("  timeline: %zu spans, %zu tracks; allreduce spans on the communication threads: %zu\n",
              spans.size(), tracks.size(), on_comm_threads);

  const Json parts = last_json_line(run + "/metrics.jsonl").at("step_ms");
  const double total = parts.at("total"), compute = parts.at("compute");
  const double sum = parts.at("data").get<double>() + compute + parts.at("communication").get<double>() +
                     parts.at("optimizer").get<double>();
  require(total > 0 && compute > 0, "step_ms total and compute are positive");
  require(sum <= total * 1.01, "step_ms parts add up to at most the total");
  std::printf("  metrics step_ms: %s\n", parts.dump().c_str());
  return failures == 0 ? 0 : 1;
}

int norm(const std::string& path, double want, double rel) {
  double squares = 0;
  for (const auto& [name, x] : load_tensors(path))
    for (double v : x) squares += v * v;
  const double got = std::sqrt(squares);
  const bool ok = std::abs(got - want) <= rel * std::abs(want);
  std::printf("  ||%s|| = %.9e, expected %.9e (%s, relative limit %g)\n", path.c_str(), got, want,
              ok ? "ok" : "TOO FAR", rel);
  return ok ? 0 : 1;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: e2e_check close A B REL | update A B INIT REL | expect A NAME ATOL V... | norm A V REL |\n"
      "                 show A | flip-byte FILE K | metric FILE KEY | timeline RUN_DIR STEPS\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage();
  const std::string& mode = args[0];
  try {
    if (mode == "close" && args.size() == 4) return close(args[1], args[2], std::stod(args[3]));
    if (mode == "update" && args.size() == 5) return update(args[1], args[2], args[3], std::stod(args[4]));
    if (mode == "expect" && args.size() >= 5) {
      std::vector<double> want;
      for (std::size_t i = 4; i < args.size(); ++i) want.push_back(std::stod(args[i]));
      return expect(args[1], args[2], std::stod(args[3]), want);
    }
    if (mode == "norm" && args.size() == 4) return norm(args[1], std::stod(args[2]), std::stod(args[3]));
    if (mode == "show" && args.size() == 2) return show(args[1]);
    if (mode == "flip-byte" && args.size() == 3) return flip_byte(args[1], std::stol(args[2]));
    if (mode == "metric" && args.size() == 3) return metric(args[1], args[2]);
    if (mode == "timeline" && args.size() == 3) return timeline(args[1], std::stoll(args[2]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "e2e_check %s: %s\n", mode.c_str(), e.what());
    return 2;
  }
  return usage();
}
