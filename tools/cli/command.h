// One `fusedopt` subcommand: its CLI11 parser and what to run once the command line is parsed.
// Each lives in its own <name>_command.cc; main.cc only registers them.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace fusedopt::cli {

struct Command {
  CLI::App* parser = nullptr;
  // Runs after a successful parse when this subcommand was given; returns the exit status.
  std::function<int()> run;
};

Command AddBenchCommand(CLI::App& app);
Command AddDoctorCommand(CLI::App& app);
Command AddInfoCommand(CLI::App& app);
// Only in a build with the libtorch adapter (FOPT_CLI_WITH_TRAIN).
Command AddTrainCommand(CLI::App& app);

}  // namespace fusedopt::cli
