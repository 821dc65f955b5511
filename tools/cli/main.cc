// The fusedopt command line: `train` (a real libtorch training loop, torch::optim vs fused, with a
// timeline), `doctor` (what fusing can save for a model's shapes and step time), `bench` (the
// optimizer step alone: fused vs standard vs the bandwidth ceiling) and `info`.

#include <vector>

#include "tools/cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"fusedopt: fused deep-learning optimizers"};
  app.require_subcommand(1);
  std::vector<fusedopt::cli::Command> commands;
#ifdef FOPT_CLI_WITH_TRAIN
  commands.push_back(fusedopt::cli::AddTrainCommand(app));
#endif
  commands.push_back(fusedopt::cli::AddDoctorCommand(app));
  commands.push_back(fusedopt::cli::AddBenchCommand(app));
  commands.push_back(fusedopt::cli::AddInfoCommand(app));
  CLI11_PARSE(app, argc, argv);
  for (const fusedopt::cli::Command& command : commands) {
    if (command.parser->parsed()) return command.run();
  }
  return 2;
}
