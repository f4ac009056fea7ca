// Alpha-beta model of data-parallel step time: fit, check against the scaling sweep, extrapolate to clusters.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using Json = nlohmann::json;

constexpr double kResnet50Parameters = 25.6e6;
constexpr double kMiB = 1048576.0;

struct Options {
  std::string results_path;
  std::string allreduce_path;
  int cores = 0;
  std::string csv_path;
  double link_gbit = 25.0;
  double link_latency_us = 5.0;
  double resnet_compute_ms = 250.0;
  std::string label;
};

__attribute__((format(printf, 1, 2))) std::string formatted(const char* spec, ...) {
  std::va_list args;
  va_start(args, spec);
  std::va_list args_again;
  va_copy(args_again, args);
  const int length = std::vsnprintf(nullptr, 0, spec, args);
  va_end(args);
  std::string text(static_cast<size_t>(length) + 1, '\0');
  std::vsnprintf(text.data(), text.size(), spec, args_again);
  va_end(args_again);
  text.pop_back();
  return text;
}

// A zero divisor is an error, not inf or nan: the figures would be meaningless.
double divide(double numerator, double denominator) {
  if (denominator == 0) throw std::domain_error("float division by zero");
  return numerator / denominator;
}

// Python's max(a, b) and min(a, b): the first argument wins ties, so the sign of a zero is kept.
double first_max(double a, double b) {
  return b > a ? b : a;
}
double first_min(double a, double b) {
  return b < a ? b : a;
}

// Python's repr() of a float, which is how values read from the JSON are shown and written to the
// CSV: the shortest digits that read back the same, fixed notation for decimal exponents -4..15
// (".0" when integral), otherwise "1e+16" style.
std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  char* end = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific).ptr;
  const std::string scientific(buffer, end);
  const size_t exponent_at = scientific.find('e');
  const int exponent = std::stoi(scientific.substr(exponent_at + 1));
  const std::string sign = std::signbit(value) ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < exponent_at; ++i)
    if (scientific[i] != '.') digits += scientific[i];
  const int integer_digits = exponent + 1;
  if (exponent < -4 || exponent >= 16)
    return sign + digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") +
           formatted("e%+03d", exponent);
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= integer_digits)
    return sign + digits + std::string(integer_digits - digits.size(), '0') + ".0";
  return sign + digits.substr(0, integer_digits) + "." + digits.substr(integer_digits);
}

// A JSON value as Python's str() shows it after json.loads: integers stay integers ("4"), floats
// keep their point ("4.0").
std::string python_str(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return float_repr(value.get<double>());
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  return value.dump();
}

std::string with_thousands_separators(const Json& number) {
  std::string text = python_str(number);
  const size_t begin = text[0] == '-' ? 1 : 0;
  size_t end = begin;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  for (size_t at = end; at > begin + 3; at -= 3) text.insert(at - 3, ",");
  return text;
}

bool truthy(const Json& value) {
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0;
  if (value.is_null()) return false;
  if (value.is_string()) return !value.get<std::string>().empty();
  return !value.empty();
}

double number_or(const Json& row, const char* key, double fallback) {
  return row.contains(key) ? row.at(key).get<double>() : fallback;
}

std::vector<double> buckets_of(const Json& row) {
  return row.contains("bucket_bytes") ? row.at("bucket_bytes").get<std::vector<double>>()
                                      : std::vector<double>{};
}

// The JSON of every "RESULT {...}" line (or bare JSON line) whose "bench" is `bench`.
std::vector<Json> read_results(const std::string& path, const std::string& bench) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read " + path);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  constexpr const char* kWhitespace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
  const std::string prefix = "RESULT ";
  std::vector<Json> rows;
  size_t begin = 0;
  while (begin <= text.size()) {
    // Lone carriage returns end lines too, as in a file Python reads in text mode.
    const size_t end = std::min(text.find_first_of("\r\n", begin), text.size());
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const size_t first = line.find_first_not_of(kWhitespace);
    if (first == std::string::npos) continue;
    line = line.substr(first, line.find_last_not_of(kWhitespace) - first + 1);
    if (line.starts_with(prefix)) line.erase(0, prefix.size());
    if (!line.starts_with("{")) continue;
    Json row = Json::parse(line);
    if (row.is_object() && row.contains("bench") && row.at("bench") == bench) rows.push_back(std::move(row));
  }
  return rows;
}

// a, b minimising sum(((a + b x - y) / y)^2): every size counts, not just the largest.
std::pair<double, double> fit_line(const std::vector<std::pair<double, double>>& points) {
  double s_ww = 0.0, s_wx = 0.0, s_wxx = 0.0, s_wy = 0.0, s_wxy = 0.0;
  for (const auto& [x, y] : points) {
    const double w = divide(1.0, y * y);
    s_ww += w;
    s_wx += w * x;
    s_wxx += w * x * x;
    s_wy += w * y;
    s_wxy += w * x * y;
  }
  const double det = s_ww * s_wxx - s_wx * s_wx;
  const double a = divide(s_wy * s_wxx - s_wx * s_wxy, det);
  const double b = divide(s_ww * s_wxy - s_wx * s_wy, det);
  return {first_max(a, 0.0), first_max(b, 1e-15)};
}

// Ring allreduce of n bytes on N ranks: t(n, N) = 2(N-1) alpha + 2(N-1)/N * n / B. fp16
// compression moves n/2 bytes and pays a conversion cost per fp32 byte.
struct Link {
  double alpha;       // s per message
  double bandwidth;   // bytes/s
  double conversion;  // s per fp32 byte

  double allreduce(double bytes, double ranks, bool fp16 = false) const {
    if (ranks == 1) return 0.0;
    const double moved = fp16 ? bytes / 2 : bytes;
    const double t = 2 * (ranks - 1) * alpha + divide(divide(2 * (ranks - 1), ranks) * moved, bandwidth);
    return t + (fp16 ? conversion * bytes : 0.0);
  }
};

struct FittedLink {
  Link link;
  Json ranks;
  std::vector<Json> measurements;
};

// alpha and B from the relative-error fit to our reducer's fp32 times; the conversion cost from the
// fp16 times' slope beyond half the fp32 one.
FittedLink fit_link(const std::vector<Json>& allreduce_rows) {
  std::vector<Json> rows;
  for (const Json& row : allreduce_rows)
    if (row.at("what") == "synthetic") rows.push_back(row);
  if (rows.empty())
    throw std::runtime_error("no allreduce measurements (bench/allreduce_bench RESULT lines)");
  const double n = rows[0].at("ranks").get<double>();
  std::vector<std::pair<double, double>> fp32_points, fp16_points;
  for (const Json& row : rows)
    fp32_points.emplace_back(row.at("bytes").get<double>(), row.at("ours_s").get<double>());
  const auto [a, b] = fit_line(fp32_points);
  const double alpha = divide(a, 2 * (n - 1));
  const double bandwidth = divide(divide(2 * (n - 1), n), b);
  for (const Json& row : rows)
    fp16_points.emplace_back(row.at("bytes").get<double>(), row.at("fp16_s").get<double>());
  const double b16 = fit_line(fp16_points).second;
  const double conversion = first_max(b16 - b / 2, 0.0);
  return {{alpha, bandwidth, conversion}, rows[0].at("ranks"), rows};
}

// Communication not hidden behind backward. Without overlap every bucket is reduced after backward,
// one after another. With overlap, bucket i is ready once backward has produced its share of the
// gradient bytes; allreduces run one at a time in bucket order, and the last bucket waits for the
// end of backward, as the reducer does.
double exposed_communication(const std::vector<double>& buckets, double ranks, const Link& link,
                             double backward_s, bool overlap, bool fp16) {
  std::vector<double> times;
  for (double bytes : buckets) times.push_back(link.allreduce(bytes, ranks, fp16));
  if (!overlap || buckets.empty()) return std::accumulate(times.begin(), times.end(), 0.0);
  const double total = std::accumulate(buckets.begin(), buckets.end(), 0.0);
  double done_bytes = 0.0, comm_end = 0.0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    done_bytes += buckets[i];
    const double ready = i == buckets.size() - 1 ? backward_s : divide(backward_s * done_bytes, total);
    comm_end = first_max(comm_end, ready) + times[i];
  }
  return first_max(comm_end - backward_s, 0.0);
}

// Buckets of a model whose gradients are a continuous stream (no tensor boundaries).
std::vector<double> buckets_for(double total_bytes, double fusion_mb, double first_mb) {
  if (fusion_mb <= 0) fusion_mb = 1.0;  // one tensor per allreduce: ResNet-50's tensors average 0.6 MB
  std::vector<double> sizes;
  double left = total_bytes;
  const double first = first_mb > 0 ? first_min(first_mb * kMiB, left) : 0;
  if (first != 0) {
    sizes.push_back(first);
    left -= first;
  }
  while (left > 0) {
    sizes.push_back(first_min(fusion_mb * kMiB, left));
    left -= sizes.back();
  }
  return sizes;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

void write_csv(const std::string& path, const std::vector<std::vector<std::string>>& rows) {
  std::ofstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot write " + path);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) file << (i ? "," : "") << csv_field(row[i]);
    file << "\r\n";  // what Python's csv module writes
  }
  if (!file.flush()) throw std::runtime_error("cannot write " + path);
}

// Local terms come from the N-rank run itself: ranks sharing cores, caches and memory bandwidth
// slow compute down by a factor no network model knows, so this tests the communication term.
void print_predictions(const std::vector<Json>& runs, const Json& base, const Link& link,
                       const Options& options) {
  const Json& s1 = base.at("step_ms");
  const double local_ms =
      s1.at("data").get<double>() + s1.at("compute").get<double>() + s1.at("optimizer").get<double>();
  const double step1_s = s1.at("total").get<double>() / 1e3;
  const double backward_fraction = number_or(base, "backward_fraction", 0.65);
  // What a step spends outside data, compute and optimizer is not measured per term; the 1-rank
  // run's share stands for it.
  const double other_s = first_max(step1_s - local_ms / 1e3, 0.0);
  std::printf("\nprediction against measurement:\n");
  std::printf("%5s %8s %6s %7s %10s %10s %7s %8s %8s %10s %10s\n", "ranks", "compr", "fusion", "buckets",
              "measured", "predicted", "error", "eff meas", "eff pred", "comm ms", "comm pred");
  using SortKey = std::tuple<double, std::string, double>;
  std::vector<std::pair<SortKey, const Json*>> sorted;
  for (const Json& r : runs)
    sorted.push_back({{r.at("ranks").get<double>(), r.at("compression").get<std::string>(),
                       r.at("fusion_threshold_mb").get<double>()},
                      &r});
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::vector<std::string>> table{
      {"ranks", "compression", "fusion_mb", "samples_per_sec", "efficiency", "step_ms", "data_ms",
       "compute_ms", "communication_ms", "optimizer_ms", "oversubscribed", "predicted_samples_per_sec",
       "predicted_efficiency", "prediction_error_pct", "cpu_ms"}};
  std::vector<double> errors;
  for (const auto& [key, entry] : sorted) {
    const Json& r = *entry;
    const double n = r.at("ranks").get<double>();
    const Json& sn = r.at("step_ms");
    const std::string compression = r.at("compression").get<std::string>();
    const double backward_s =
        sn.at("compute").get<double>() / 1e3 * number_or(r, "backward_fraction", backward_fraction);
    const std::vector<double> buckets = buckets_of(r);
    const bool overlap = r.contains("overlap") ? truthy(r.at("overlap")) : true;
    // The ring's model knows fp32 on the wire and the 2-byte encodings (the fp16 fit stands for bf16's
    // conversion, the same work); fp64 and PowerSGD's low-rank factors it does not predict.
    const bool half_wire = compression == "fp16" || compression == "bf16";
    const bool modelled = half_wire || compression == "none";
    const double comm = exposed_communication(buckets, n, link, backward_s, overlap, half_wire);
    const double local_s =
        (sn.at("data").get<double>() + sn.at("compute").get<double>() + sn.at("optimizer").get<double>()) /
        1e3;
    const double predicted_step = local_s + other_s + comm;
    const double predicted = divide(n * r.at("batch").get<double>(), predicted_step);
    const double measured = r.at("samples_per_sec").get<double>();
    const double error = divide(predicted, measured) - 1;
    if (n > 1 && modelled) errors.push_back(std::fabs(error));
    const double eff_measured = divide(measured, n * base.at("samples_per_sec").get<double>());
    const double eff_predicted = divide(step1_s, predicted_step);
    const Json& fusion = r.at("fusion_threshold_mb");
    if (modelled)
      std::printf("%5s %8s %6g %7zu %10.0f %10.0f %+6.1f%% %8.3f %8.3f %10.2f %10.2f\n",
                  python_str(r.at("ranks")).c_str(), compression.c_str(), fusion.get<double>(),
                  buckets.size(), measured, predicted, 100 * error, eff_measured, eff_predicted,
                  sn.at("communication").get<double>(), comm * 1e3);
    else
      std::printf("%5s %8s %6g %7zu %10.0f %10s %7s %8.3f %8s %10.2f %10s  (not modelled)\n",
                  python_str(r.at("ranks")).c_str(), compression.c_str(), fusion.get<double>(),
                  buckets.size(), measured, "-", "-", eff_measured, "-", sn.at("communication").get<double>(),
                  "-");
    const bool oversubscribed = options.cores != 0 && n > options.cores;
    table.push_back(
        {python_str(r.at("ranks")), compression, python_str(fusion), formatted("%.1f", measured),
         formatted("%.4f", eff_measured), formatted("%.3f", sn.at("total").get<double>()),
         formatted("%.3f", sn.at("data").get<double>()), formatted("%.3f", sn.at("compute").get<double>()),
         formatted("%.3f", sn.at("communication").get<double>()),
         formatted("%.3f", sn.at("optimizer").get<double>()), oversubscribed ? "1" : "0",
         // A compression the model does not know has no prediction: empty fields.
         modelled ? formatted("%.1f", predicted) : "", modelled ? formatted("%.4f", eff_predicted) : "",
         modelled ? formatted("%.2f", 100 * error) : "",
         // Runs recorded before train_bench measured CPU time have none: an empty field, not a zero.
         r.contains("cpu_ms_per_step") ? formatted("%.3f", r.at("cpu_ms_per_step").get<double>()) : ""});
  }
  if (!errors.empty())
    std::printf(
        "largest prediction error over the multi-rank runs: %.1f%% (mean %.1f%%)\n",
        100 * std::accumulate(errors.begin() + 1, errors.end(), errors[0], first_max),
        100 * std::accumulate(errors.begin(), errors.end(), 0.0) / static_cast<double>(errors.size()));
  if (!options.csv_path.empty()) write_csv(options.csv_path, table);
}

// "resnet50 from configs/resnet50_synthetic.json": the swept model by architecture, else by config.
std::string measured_model_name(const Json& base) {
  const std::string config = base.value("config", std::string("the swept config"));
  const std::string model = base.value("model", std::string("layers"));
  return (model == "layers" ? std::string("model") : model) + " of " + config;
}

// A cluster has one rank per host, so the local terms are the 1-rank run's.
void print_extrapolation(const Json& base, double conversion, const Options& options) {
  const Json& s1 = base.at("step_ms");
  const double step1_s = s1.at("total").get<double>() / 1e3;
  const double backward_fraction = number_or(base, "backward_fraction", 0.65);
  const Link net{options.link_latency_us * 1e-6, options.link_gbit * 1e9 / 8, conversion};
  std::vector<double> measured_buckets;
  if (base.contains("bucket_bytes") && truthy(base.at("bucket_bytes")))
    measured_buckets = buckets_of(base);
  else
    measured_buckets = {4 * base.at("parameters").get<double>()};
  const double measured_compute = s1.at("compute").get<double>() / 1e3;
  struct Model {
    std::string name;
    std::vector<double> buckets;
    double compute_s;
    double rest_s;
  };
  const std::vector<Model> models{
      {measured_model_name(base) + " (" + with_thousands_separators(base.at("parameters")) + " parameters, " +
           formatted("%.1f", measured_compute * 1e3) + " ms compute per step measured here, its buckets)",
       measured_buckets, measured_compute, step1_s - measured_compute},
      {formatted("ResNet-50 (25.6 M parameters, %g ms compute per step given: an accelerator's)",
                 options.resnet_compute_ms),
       buckets_for(4 * kResnet50Parameters, 4, 1), options.resnet_compute_ms / 1e3, 0.0},
  };
  std::printf(
      "\nextrapolation: ring allreduce over %g Gbit/s links, %g us latency, "
      "fusion 4 MiB (first bucket 1 MiB), backward %.0f%% of compute\n",
      options.link_gbit, options.link_latency_us, 100 * backward_fraction);
  for (const Model& model : models) {
    std::printf("%s\n", model.name.c_str());
    std::printf("  %5s %10s %14s %11s %16s\n", "ranks", "comm fp32", "eff no overlap", "eff overlap",
                "eff overlap+fp16");
    const double one = model.compute_s + model.rest_s;
    for (int n : {8, 16, 32, 64, 128, 256, 512}) {
      const double backward_s = model.compute_s * backward_fraction;
      const auto efficiency = [&](bool overlap, bool fp16) {
        return divide(one, one + exposed_communication(model.buckets, n, net, backward_s, overlap, fp16));
      };
      const double no_overlap = efficiency(false, false), overlapped = efficiency(true, false),
                   overlapped_fp16 = efficiency(true, true);
      double comm = 0.0;
      for (double bytes : model.buckets) comm += net.allreduce(bytes, n);
      std::printf("  %5d %8.2fms %14.3f %11.3f %16.3f\n", n, comm * 1e3, no_overlap, overlapped,
                  overlapped_fp16);
    }
  }
}

void run(const Options& options) {
  const auto [link, fit_ranks, measurements] = fit_link(read_results(options.allreduce_path, "allreduce"));
  const std::vector<Json> runs = read_results(options.results_path, "train");
  const auto base = std::find_if(runs.begin(), runs.end(), [](const Json& r) { return r.at("ranks") == 1; });
  if (base == runs.end()) throw std::runtime_error("the sweep has no 1-rank run to scale from");
  const Json& s1 = base->at("step_ms");
  const double backward_fraction = number_or(*base, "backward_fraction", 0.65);
  const std::string label = options.label.empty() ? "" : " (" + options.label + ")";
  std::printf(
      "fitted at %s ranks%s: alpha %.2f us, bandwidth %.3f GB/s, fp16 conversion %.1f ps per fp32 byte\n",
      python_str(fit_ranks).c_str(), label.c_str(), link.alpha * 1e6, link.bandwidth / 1e9,
      link.conversion * 1e12);
  double worst = 0.0;
  for (size_t i = 0; i < measurements.size(); ++i) {
    const Json& m = measurements[i];
    const double modelled = link.allreduce(m.at("bytes").get<double>(), fit_ranks.get<double>());
    const double miss = std::fabs(divide(modelled, m.at("ours_s").get<double>()) - 1);
    worst = i == 0 ? miss : first_max(worst, miss);
  }
  std::printf("  the fit reproduces the allreduce measurements (4 KiB - 4 MiB) within %.0f%%\n", 100 * worst);
  std::printf(
      "1 rank: %.0f samples/s, step %.2f ms (data %.2f, compute %.2f of which backward %.0f%%, "
      "optimizer %.2f)\n",
      base->at("samples_per_sec").get<double>(), s1.at("total").get<double>(), s1.at("data").get<double>(),
      s1.at("compute").get<double>(), 100 * backward_fraction, s1.at("optimizer").get<double>());
  print_predictions(runs, *base, link, options);
  print_extrapolation(*base, link.conversion, options);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Alpha-beta model of data-parallel step time: fitted here, checked against the sweep, extrapolated."};
  Options options;
  app.add_option("--results", options.results_path,
                 "train_bench RESULT lines (scripts/scaling.sh writes them)")
      ->required();
  app.add_option("--allreduce", options.allreduce_path, "bench/allreduce_bench output at 2 ranks")
      ->required();
  app.add_option("--cores", options.cores, "cores on the machine the sweep ran on (0: no sharing)")
      ->capture_default_str();
  app.add_option("--csv", options.csv_path, "write the sweep with predictions here");
  app.add_option("--link-gbit", options.link_gbit, "link bandwidth for the extrapolation")
      ->capture_default_str();
  app.add_option("--link-latency-us", options.link_latency_us, "per-message latency for the extrapolation")
      ->capture_default_str();
  app.add_option("--resnet-compute-ms", options.resnet_compute_ms,
                 "forward + backward per step of ResNet-50 on one accelerator")
      ->capture_default_str();
  app.add_option("--label", options.label, "name of the setting measured (e.g. netns 100 Mbit/s)");
  CLI11_PARSE(app, argc, argv);
  try {
    run(options);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "scaling_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
