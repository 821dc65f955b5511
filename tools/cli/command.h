// One `fusedopt` subcommand: its CLI11 parser and what to run once the command line is parsed.
// Each lives in its own <name>_command.cc; main.cc only registers them.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "src/tool_util/report_util.h"

namespace fusedopt::cli {

struct Command {
  CLI::App* parser = nullptr;
  // Runs after a successful parse when this subcommand was given; returns the exit status.
  std::function<int()> run;
};

using tools::CheckWritable;
using tools::WriteTextFile;

// Runs a command's body and returns the exit status: 0; 2 for a bad argument
// (std::invalid_argument, fusedopt::Error included), like CLI11's usage errors in main.cc; 1 for
// any other failure (a report that cannot be written, a run that diverged). Each failure prints
// "fusedopt <name>: error: <message>", the message's first line only (libtorch appends a C++
// backtrace to its errors).
inline int RunCommand(const std::string& name, const std::function<void()>& body) {
  const auto print = [&](const std::exception& e) {
    const std::string message = e.what();
    std::cerr << "fusedopt " << name << ": error: " << message.substr(0, message.find('\n'))
              << "\n";
  };
  try {
    body();
    return 0;
  } catch (const std::invalid_argument& e) {
    print(e);
    return 2;
  } catch (const std::exception& e) {
    print(e);
    return 1;
  }
}

// Checks an element count: a decimal whole number in [1, 2^64). CLI11 alone would read "-1" as
// 2^64 - 1 (strtoull wraps it), clamp "2^64" to 2^64 - 1 and read "010" as octal. The text is
// rewritten in plain decimal for CLI11's conversion.
inline CLI::Validator ElementCount() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits) return "'" + text + "' is not a whole number > 0";
        errno = 0;
        const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE) return "'" + text + "' is too large (the most is 2^64 - 1)";
        if (value == 0) return "'" + text + "' is not a whole number > 0";
        text = std::to_string(value);
        return "";
      },
      "N>0");
}

// Every algorithm of the registry (src/algos/registry.h), by its name (options.cc).
std::vector<std::string> AlgorithmNames();

// Adds bench's and bench-dist's --shapes MODEL (real per-tensor shapes) and --numel N (one flat
// tensor), which exclude each other; the command picks its default when neither is given
// (options.cc).
void AddShapesOrNumelOptions(CLI::App& parser, std::string& shapes, std::size_t& numel);

// Parses the value of --clip (bench, doctor): a finite number > 0. Throws std::invalid_argument
// naming --clip and the text otherwise (options.cc).
double ParseClip(std::string_view text);

// The models whose real per-tensor shapes the tools know (src/tool_util/model_shapes.h), for
// --shapes (options.cc).
std::vector<std::string> ModelNames();

// Only in a build with the benchmark runner (FOPT_CLI_WITH_BENCH).
Command AddBenchCommand(CLI::App& app);
Command AddDoctorCommand(CLI::App& app);
Command AddCkptCommand(CLI::App& app);  // ckpt_command.cc
Command AddInfoCommand(CLI::App& app);
// Only in a build with the libtorch adapter (FOPT_CLI_WITH_TRAIN).
Command AddTrainCommand(CLI::App& app);
// Only in a build with the benchmark runner and the MPI communicator (FOPT_CLI_WITH_BENCH and
// FOPT_CLI_WITH_MPI).
Command AddBenchDistCommand(CLI::App& app);

}  // namespace fusedopt::cli
