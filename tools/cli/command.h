// One `fusedopt` subcommand: its CLI11 parser and what to run once the command line is parsed.
// Each lives in its own <name>_command.cc; main.cc only registers them.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

namespace fusedopt::cli {

struct Command {
  CLI::App* parser = nullptr;
  // Runs after a successful parse when this subcommand was given; returns the exit status.
  std::function<int()> run;
};

// Writes a report file, creating its folder; throws std::invalid_argument naming the path.
inline void WriteTextFile(const std::string& path, const std::string& text) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream file(path);
  if (!file) throw std::invalid_argument("cannot write " + path);
  file << text;
}

Command AddBenchCommand(CLI::App& app);
Command AddDoctorCommand(CLI::App& app);
Command AddInfoCommand(CLI::App& app);
// Only in a build with the libtorch adapter (FOPT_CLI_WITH_TRAIN).
Command AddTrainCommand(CLI::App& app);

}  // namespace fusedopt::cli
