// `fusedopt info`: the SIMD targets and the thread count this machine runs.

#include <iostream>
#include <string>

#include "fusedopt/runtime.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {

Command AddInfoCommand(CLI::App& app) {
  CLI::App* info = app.add_subcommand("info", "Print the SIMD targets and thread count");
  return {info, [] {
            std::cout << "active target: " << ActiveTargetName() << "\navailable targets:";
            for (const std::string& t : AvailableTargets()) std::cout << " " << t;
            std::cout << "\nthreads: " << DefaultRuntime().num_threads() << "\n";
            return 0;
          }};
}

}  // namespace fusedopt::cli
