// The fusedopt command line: `fusedopt bench` (fused vs standard vs the bandwidth ceiling, and with
// --loss-scale/--clip vs standard_pipeline) and `fusedopt info` (SIMD targets and threads this
// machine runs).

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <string>

#include "bench/model_shapes.h"
#include "bench/runner.h"
#include "fusedopt/runtime.h"

int main(int argc, char** argv) {
  CLI::App app{"fusedopt: fused deep-learning optimizers"};
  app.require_subcommand(1);

  fusedopt::bench::BenchOptions options;
  std::string json_path;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Time fused, standard (for-loop) and same_traffic steps, interleaved; with --loss-scale or "
      "--clip, a training-loop step, plus standard_pipeline (GradScaler + clip_grad_norm_ + "
      "for-loop step as separate passes)");
  bench
      ->add_option("--optimizer", options.optimizer,
                   "sgd (momentum 0.9), adam, adamw, rmsprop or adagrad")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "rmsprop", "adagrad"}))
      ->capture_default_str();
  auto* shapes =
      bench->add_option("--shapes", options.shapes, "Real per-tensor shapes of a model")
          ->check(CLI::IsMember({"mobilenet_v1", "resnet50", "bert_base", "gpt2_small"}));
  auto* numel = bench->add_option("--numel", options.numel, "One flat tensor of N elements");
  shapes->excludes(numel);
  bench
      ->add_option("--dtype", options.dtype,
                   "Params and states, and grads unless --grad-dtype: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  // The values of the options below are checked by RunBench, which names the option and the value.
  bench->add_option(
      "--grad-dtype", options.grad_dtype,
      "Gradients: f32, bf16 or f16 (default: --dtype; params and states keep --dtype)");
  bench
      ->add_option("--loss-scale", options.loss_scale,
                   "none, static (2^16) or dynamic (torch GradScaler policy, from 2^16); not none: "
                   "gradients hold loss * scale, and the step unscales and skips on overflow")
      ->capture_default_str();
  std::string clip_text;
  CLI::Option* clip =
      bench
          ->add_option(
              "--clip", clip_text,
              "Clip the global gradient norm to MAX_NORM > 0 (clip_grad_norm_); default off")
          ->type_name("MAX_NORM");
  bench->add_option("--threads", options.threads, "Threads (0: OpenMP default)")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--rounds", options.rounds, "Timed rounds (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench->add_option("--warmup", options.warmup, "Untimed rounds first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench->add_option("--json", json_path, "Also write the report as JSON to this file");

  app.add_subcommand("info", "Print the SIMD targets and thread count");
  CLI11_PARSE(app, argc, argv);

  if (app.got_subcommand("info")) {
    std::cout << "active target: " << fusedopt::ActiveTargetName() << "\navailable targets:";
    for (const std::string& t : fusedopt::AvailableTargets()) std::cout << " " << t;
    std::cout << "\nthreads: " << fusedopt::DefaultRuntime().num_threads() << "\n";
    return 0;
  }
  try {
    if (options.shapes.empty() && options.numel == 0) options.shapes = "mobilenet_v1";
    if (clip->count() > 0) options.clip = fusedopt::bench::ParseClip(clip_text);
    const nlohmann::json report = fusedopt::bench::RunBench(options, std::cout, std::cerr);
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      if (!out) throw std::invalid_argument("cannot write " + json_path);
      out << report.dump(2) << "\n";
      std::cout << "wrote " << json_path << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "fusedopt bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
