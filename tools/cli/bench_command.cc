// `fusedopt bench`: fused vs standard (for-loop) vs same_traffic steps, interleaved; with
// --loss-scale/--clip a training-loop step, plus standard_pipeline.

#include <cstddef>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/runner.h"
#include "src/algos/registry.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {

std::vector<std::string> AlgorithmNames() {
  std::vector<std::string> names;
  algos::All::ForEach([&](auto d) { names.emplace_back(decltype(d)::type::kName); });
  return names;
}

void AddShapesOrNumelOptions(CLI::App& parser, std::string& shapes, std::size_t& numel) {
  CLI::Option* shapes_option =
      parser.add_option("--shapes", shapes, "Real per-tensor shapes of a model")
          ->check(CLI::IsMember({"mobilenet_v1", "resnet50", "bert_base", "gpt2_small"}));
  CLI::Option* numel_option =
      parser.add_option("--numel", numel, "One flat tensor of N elements")->check(ElementCount());
  shapes_option->excludes(numel_option);
}

Command AddBenchCommand(CLI::App& app) {
  // The parsed values outlive this function: the parser writes into them, run() reads them.
  struct Values {
    bench::BenchOptions options;
    std::string json_path;
    std::string clip_text;
  };
  auto values = std::make_shared<Values>();
  bench::BenchOptions& options = values->options;
  CLI::App* parser = app.add_subcommand(
      "bench",
      "Time fused, standard (for-loop) and same_traffic steps, interleaved; with --loss-scale or "
      "--clip, a training-loop step, plus standard_pipeline (GradScaler + clip_grad_norm_ + "
      "for-loop step as separate passes)");
  parser
      ->add_option("--optimizer", options.optimizer,
                   "sgd (momentum 0.9), adam, adamw, rmsprop, adagrad, lion (lr 1e-4, weight "
                   "decay 0.1), lamb (two-phase; standard includes its global grad norm), "
                   "adamax, adadelta, radam, nadam, asgd (t0 -1: ax averages from step 2), rprop, "
                   "lars (two-phase, momentum 0.9), rmsproptf (torch_npu NpuFusedRMSpropTF), "
                   "adamp (two-phase, per channel row), bert_adam (two-phase: the gradient "
                   "norm per (group, dtype), torch_npu NpuFusedBertAdam) or adafactor "
                   "(factored second moments, three passes)")
      ->check(CLI::IsMember(AlgorithmNames()))
      ->capture_default_str();
  AddShapesOrNumelOptions(*parser, options.shapes, options.numel);
  parser
      ->add_option("--dtype", options.dtype,
                   "Params and states, and grads unless --grad-dtype: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  // The values of the options below are checked by RunBench, which names the option and the value.
  parser->add_option(
      "--grad-dtype", options.grad_dtype,
      "Gradients: f32, bf16 or f16 (default: --dtype; params and states keep --dtype)");
  parser
      ->add_option("--loss-scale", options.loss_scale,
                   "none, static (2^16) or dynamic (torch GradScaler policy, from 2^16); not none: "
                   "gradients hold loss * scale, and the step unscales and skips on overflow")
      ->capture_default_str();
  CLI::Option* clip =
      parser
          ->add_option(
              "--clip", values->clip_text,
              "Clip the global gradient norm to MAX_NORM > 0 (clip_grad_norm_); default off")
          ->type_name("MAX_NORM");
  parser->add_option("--threads", options.threads, "Threads (0: OpenMP default)")
      ->check(CLI::NonNegativeNumber);
  parser->add_option("--rounds", options.rounds, "Timed rounds (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  parser->add_option("--warmup", options.warmup, "Untimed rounds first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  parser->add_option("--json", values->json_path, "Also write the report as JSON to this file");

  return {parser, [values, clip] {
            return RunCommand("bench", [&] {
              bench::BenchOptions& run_options = values->options;
              if (run_options.shapes.empty() && run_options.numel == 0)
                run_options.shapes = "mobilenet_v1";
              if (clip->count() > 0) run_options.clip = bench::ParseClip(values->clip_text);
              if (!values->json_path.empty()) CheckWritable(values->json_path);  // before timing
              const nlohmann::json report = bench::RunBench(run_options, std::cout, std::cerr);
              if (!values->json_path.empty()) {
                WriteTextFile(values->json_path, report.dump(2) + "\n");
                std::cout << "wrote " << values->json_path << "\n";
              }
            });
          }};
}

}  // namespace fusedopt::cli
