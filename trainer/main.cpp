// trainer: command-line entry point. Any failure prints one line naming the rank and stops every rank.
// Exit statuses: 0 done; 1 failed; 75 stopped by SIGTERM, SIGINT or SIGUSR1 after writing a
// checkpoint (resume with --resume auto); 130 a second SIGINT (stopped at once).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <optional>

#include "core/backend.h"
#include "core/error.h"
#include "distributed/world.h"
#include "trainer/config.h"
#include "trainer/run.h"
#include "trainer/stop_signals.h"

using namespace dptrain;

namespace {

// --print-config-reference[=dict]: docs/config.md, or the generated block of tests/fuzz/config.dict.
void add_reference_option(CLI::App& app, std::string& format) {
  app.add_flag("--print-config-reference{markdown}", format,
               "print the config reference (docs/config.md; =dict: the fuzz dictionary's keys) and exit")
      ->check(CLI::IsMember({"markdown", "dict"}));
}

// The reference needs neither a config nor MPI; anything else needs --config. nullopt: go on.
std::optional<int> exit_without_config(CLI::App& app, const std::string& config_path,
                                       const std::string& format) {
  if (format.empty() && !config_path.empty()) return std::nullopt;
  if (format.empty())
    return app.exit(CLI::RequiredError("--config is required (or --print-config-reference)",
                                       static_cast<int>(CLI::ExitCodes::RequiredError)));
  std::cout << (format == "dict" ? trainer::config_fuzz_dictionary() : trainer::config_reference_markdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dptrain: data-parallel trainer. Run under mpirun -np N for N ranks."};
  std::string config_path, reference_format;
  std::vector<std::string> overrides;
  bool print_config = false;
  trainer::RunOptions run_options;
  std::string evaluate_path;
  app.add_option("--config", config_path, "JSON config file (see configs/ and the README)");
  add_reference_option(app, reference_format);
  app.add_option("--set", overrides, "override a config key: --set key.path=JSON (repeatable)")
      ->take_all()
      ->expected(1)
      ->allow_extra_args(false);
  app.add_flag("--print-config", print_config, "print the resolved config (defaults filled in) and exit");
  app.add_option(
      "--resume", run_options.resume,
      "continue from a checkpoint: 'auto' (the newest valid one in checkpoint.dir, else start fresh) "
      "or the path of one");
  app.add_option("--evaluate", evaluate_path,
                 "report test loss and accuracy of a checkpoint's weights and exit")
      ->excludes("--resume");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (const auto status = exit_without_config(app, config_path, reference_format)) return *status;

  distributed::World world(&argc, &argv);
  // Before MPI is finalized and main() returns: a GPU's cached memory is freed while it is counted.
  struct ReleaseCaches {
    ~ReleaseCaches() { release_backend_caches(); }
  } release_caches;
  try {
    // Rank 0 reads, overrides and validates; every rank then parses rank 0's document.
    std::string document;
    if (world.is_root()) {
      document = trainer::read_config(config_path, overrides).dump();
    }
    const trainer::Config config = trainer::parse_config(Json::parse(world.broadcast_from_root(document)));
    if (print_config) {
      if (world.is_root()) std::cout << trainer::to_json(config).dump(2) << std::endl;
      return 0;
    }
    if (!evaluate_path.empty()) {
      trainer::evaluate_checkpoint(config, world, evaluate_path);
    } else {
      run_options.before_first_step = trainer::install_stop_handlers;
      // Every rank stopped after the same step, so every rank leaves MPI together.
      if (!trainer::train(config, world, run_options).stopped_by.empty())
        return trainer::kExitStoppedWithCheckpoint;
    }
  } catch (const std::exception& e) {
    world.exit_with_error("dptrain", e.what());
  }
  return 0;
}
