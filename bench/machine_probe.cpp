// What this core can do, for the benchmarks that compare against it: single-thread memcpy bandwidth
// from L1-sized to DRAM-sized buffers, the FLOP/s of a large Eigen GEMM (the compute limit a training
// step is measured against), and a memory-streaming neighbour (copies of buffers far larger than the
// last-level cache, until stopped) for the contention mode of bench/train_vs_pytorch.sh.
//
//   build/bench/machine_probe memcpy            sizes 4 KiB .. 64 MiB, GB/s each (64 MiB is beyond
//                                               the last-level cache of the machines here, not of all)
//   build/bench/machine_probe gemm [--size 1024]
//   build/bench/machine_probe load [--mib 256] [--seconds 0]   (0: until SIGTERM / SIGINT)
//
// memcpy and gemm end with "RESULT {json}"; load prints the bandwidth it streamed when it stops.
#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes copied per second (each byte counted once, as memcpy benchmarks report it), best of five
// runs of at least 0.1 s each: the best is the machine's figure, the rest is other tenants' noise.
// The clock is read once per MiB copied, so that small copies measure the copy, not the clock.
double memcpy_bandwidth(std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const std::size_t copies_per_reading = std::max<std::size_t>(1, (1u << 20) / bytes);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    std::size_t copies = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      for (std::size_t i = 0; i < copies_per_reading; ++i, ++copies) {
        std::memcpy(dst.data(), src.data(), bytes);
        src[copies % bytes] = static_cast<char>(dst[(copies * 7) % bytes] + 1);  // keeps the copies live
      }
      elapsed = seconds_since(start);
    } while (elapsed < 0.1);
    best = std::max(best, static_cast<double>(copies * bytes) / elapsed);
  }
  return best;
}

int run_memcpy() {
  const std::vector<std::pair<const char*, std::size_t>> sizes = {{"4KiB", 4u << 10},
                                                                  {"64KiB", 64u << 10},
                                                                  {"1MiB", 1u << 20},
                                                                  {"16MiB", 16u << 20},
                                                                  {"64MiB", 64u << 20}};
  std::string json = "{\"memcpy_gb_per_s\":{";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const double gbps = memcpy_bandwidth(sizes[i].second) / 1e9;
    std::printf("memcpy %-6s %6.1f GB/s\n", sizes[i].first, gbps);
    json += (i ? ",\"" : "\"") + std::string(sizes[i].first) + "\":" + std::to_string(gbps);
  }
  std::printf("RESULT %s}}\n", json.c_str());
  return 0;
}

// FLOP/s of C = A B with n x n floats on one thread, best of five runs of at least 0.2 s.
int run_gemm(int n) {
  Eigen::setNbThreads(1);
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n);
  Eigen::MatrixXf c(n, n);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    int products = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      c.noalias() = a * b;
      ++products;
      elapsed = seconds_since(start);
    } while (elapsed < 0.2);
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) * products / elapsed);
  }
  std::printf("Eigen GEMM %dx%d, one thread: %.1f GFLOP/s (checksum %g)\n", n, n, best / 1e9,
              static_cast<double>(c(0, 0)));
  std::printf("RESULT {\"gemm_size\":%d,\"gemm_gflop_per_s\":%f}\n", n, best / 1e9);
  return 0;
}

std::atomic<bool> stop_requested{false};
void request_stop(int) {
  stop_requested = true;
}

int run_load(int mib, double seconds) {
  std::signal(SIGTERM, request_stop);
  std::signal(SIGINT, request_stop);
  const std::size_t bytes = static_cast<std::size_t>(mib) << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::size_t copies = 0;
  const auto start = Clock::now();
  while (!stop_requested && (seconds <= 0 || seconds_since(start) < seconds)) {
    if (copies % 2 == 0) {
      std::memcpy(b.data(), a.data(), bytes);
    } else {
      std::memcpy(a.data(), b.data(), bytes);
    }
    if (++copies == 1) {  // the handlers are in place and the buffers touched: tell whoever waits
      std::printf("load: streaming %d MiB buffers\n", mib);
      std::fflush(stdout);
    }
  }
  const double elapsed = seconds_since(start);
  std::printf("load: %zu copies of %d MiB in %.1f s, %.1f GB/s\n", copies, mib, elapsed,
              static_cast<double>(copies * bytes) / elapsed / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memcpy bandwidth, GEMM FLOP/s and a memory-streaming load on one core"};
  app.require_subcommand(1);
  CLI::App* memcpy_command = app.add_subcommand("memcpy", "single-thread memcpy bandwidth, 4 KiB to 64 MiB");
  int gemm_size = 1024;
  CLI::App* gemm_command = app.add_subcommand("gemm", "FLOP/s of an n x n Eigen GEMM on one thread");
  gemm_command->add_option("--size", gemm_size, "n")->check(CLI::Range(16, 8192));
  int mib = 256;
  double seconds = 0;
  CLI::App* load_command = app.add_subcommand("load", "copy two buffers into each other until stopped");
  load_command->add_option("--mib", mib, "size of each buffer in MiB (far above the last-level cache)")
      ->check(CLI::Range(1, 65536));
  load_command->add_option("--seconds", seconds, "stop after this long (0: at SIGTERM / SIGINT)");
  CLI11_PARSE(app, argc, argv);
  if (*memcpy_command) return run_memcpy();
  if (*gemm_command) return run_gemm(gemm_size);
  return run_load(mib, seconds);
}
