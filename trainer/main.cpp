// trainer: command-line entry point. Any failure prints one line naming the rank and stops every rank.
// Exit statuses: 0 done; 1 failed (a bad command line too); 75 stopped by SIGTERM, SIGINT or SIGUSR1
// after writing a checkpoint (resume with --resume auto); 130 a second SIGINT (stopped at once).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "core/backend.h"
#include "core/error.h"
#include "distributed/world.h"
#include "trainer/config.h"
#include "trainer/run.h"
#include "trainer/stop_signals.h"
#include "trainer/version.h"

using namespace dptrain;

namespace {

// --print-config-reference[=dict]: docs/config.md, or the generated block of tests/fuzz/config.dict.
// Returns the option: given without a value, it asks for markdown.
CLI::Option* add_reference_option(CLI::App& app, std::string& format) {
  return app
      .add_option("--print-config-reference", format,
                  "print the config reference (docs/config.md; =dict: the fuzz dictionary's keys) and exit")
      ->expected(0, 1)
      ->check(CLI::IsMember({"markdown", "dict"}))
      ->option_text("[=dict]");
}

// Whether the launcher started this process as rank 0, read before MPI starts (the command line is
// parsed first, so that --help and its errors need no MPI): Open MPI's, PMIx's and Slurm's variables;
// a process that none of them started is rank 0.
bool launched_as_rank_zero() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(name)) return std::strcmp(value, "0") == 0;
  return true;
}

// A command-line mistake as the trainer reports every error: one line, from rank 0 only, and
// status 1 on every rank.
int command_line_error(const std::string& what) {
  if (launched_as_rank_zero()) {
    std::string line = what;
    for (char& c : line)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "dptrain: error: %s; see --help\n", line.c_str());
  }
  return 1;
}

// --help (from rank 0 only) or a parse error.
int exit_from_parse(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() != static_cast<int>(CLI::ExitCodes::Success)) return command_line_error(e.what());
  if (launched_as_rank_zero()) std::cout << app.help();
  return 0;
}

// The reference and --version need neither a config nor MPI; anything else needs --config. nullopt:
// go on.
std::optional<int> exit_without_config(const std::string& config_path, const std::string& format,
                                       bool version) {
  if (version) {
    if (launched_as_rank_zero()) std::cout << trainer::version_text() << std::endl;
    return 0;
  }
  if (format.empty() && !config_path.empty()) return std::nullopt;
  if (format.empty()) return command_line_error("--config is required (or --print-config-reference)");
  std::cout << (format == "dict" ? trainer::config_fuzz_dictionary() : trainer::config_reference_markdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dptrain: data-parallel trainer. Run under mpirun -np N for N ranks. Config keys: docs/config.md; "
      "exit status 0 done, 1 failed, 75 stopped with a checkpoint (docs/checkpoints.md)."};
  std::string config_path, reference_format;
  std::vector<std::string> overrides;
  bool print_config = false, version = false;
  trainer::RunOptions run_options;
  std::string evaluate_path;
  app.add_option("--config", config_path, "JSON config file (see configs/ and the README)");
  const CLI::Option* reference = add_reference_option(app, reference_format);
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
                 "report the test loss and accuracy of a checkpoint's weights, or a weights file's such as a "
                 "run's model.safetensors, and exit")
      ->excludes("--resume");
  app.add_flag("--version", version, "print the source's git describe and the build's settings, and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return exit_from_parse(app, e);
  }
  if (reference->count() > 0 && reference_format.empty()) reference_format = "markdown";
  if (const auto status = exit_without_config(config_path, reference_format, version)) return *status;

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
    // A key's error, whether read_config's checks or a layer as the model is built found it, names
    // where the key came from.
    const std::string what = e.what();
    const std::string located =
        what.starts_with("config key") ? trainer::config_source(config_path, overrides) + ": " + what : what;
    world.exit_with_error("dptrain", located.c_str());
  }
  return 0;
}
