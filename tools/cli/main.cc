// The fusedopt command line: `train` (a real libtorch training loop, torch::optim vs fused, with a
// timeline), `doctor` (what fusing can save for a model's shapes and step time), `bench` (the
// optimizer step alone: fused vs standard vs the bandwidth ceiling; in a build with the benchmark
// runner), `info` and `ckpt`.

#include <iostream>
#include <vector>

#include "tools/cli/command.h"

// NOLINTNEXTLINE(bugprone-exception-escape): commands catch their errors; the rest is a bug
int main(int argc, char** argv) {
  CLI::App app{"fusedopt: fused deep-learning optimizers"};
  app.require_subcommand(1);
  std::vector<fusedopt::cli::Command> commands;
#ifdef FOPT_CLI_WITH_TRAIN
  commands.push_back(fusedopt::cli::AddTrainCommand(app));
#endif
  commands.push_back(fusedopt::cli::AddDoctorCommand(app));
#ifdef FOPT_CLI_WITH_BENCH
  commands.push_back(fusedopt::cli::AddBenchCommand(app));
#endif
#if defined(FOPT_CLI_WITH_BENCH) && defined(FOPT_CLI_WITH_MPI)
  commands.push_back(fusedopt::cli::AddBenchDistCommand(app));
#endif
  commands.push_back(fusedopt::cli::AddInfoCommand(app));
  commands.push_back(fusedopt::cli::AddCkptCommand(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // A usage error reads and exits like a bad value that a command rejects (RunCommand): exit
    // code 2 instead of CLI11's own codes (105, 106, ...).
    const std::vector<CLI::App*> given = app.get_subcommands();
    std::cerr << "fusedopt" << (given.empty() ? "" : " " + given[0]->get_name())
              << ": error: " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  }
  for (const fusedopt::cli::Command& command : commands) {
    if (command.parser->parsed()) return command.run();
  }
  return 2;
}
