// `fusedopt info`: the SIMD targets and the thread count this machine runs.

#include <iostream>
#include <string>
#include <vector>

#include "fusedopt/runtime.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {

Command AddInfoCommand(CLI::App& app) {
  CLI::App* info = app.add_subcommand("info", "Print the SIMD targets and thread count");
  return {info, [] {
            // FOPT_DISABLE_TARGETS is read on the first call: a bad value is an error here.
            return RunCommand("info", [] {
              const std::string active = TargetDescription(ActiveTargetName());
              std::cout << "active target: " << active << "\navailable targets: ";
              const std::vector<std::string> targets = AvailableTargets();
              for (std::size_t i = 0; i < targets.size(); ++i)
                std::cout << (i > 0 ? ", " : "") << TargetDescription(targets[i]);
              std::cout << "\nthreads: " << DefaultRuntime().num_threads() << "\n";
            });
          }};
}

}  // namespace fusedopt::cli
