// `fusedopt bench`: fused vs standard (for-loop) vs same_traffic steps, interleaved; with
// --loss-scale/--clip a training-loop step, plus standard_pipeline; with --state-dtype q8, 8-bit
// states and no standard impl.

#include <cstddef>
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/runner.h"
#include "src/algos/registry.h"
#include "src/baselines/standard.h"
#include "src/tool_util/report_util.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {

namespace {

// A field's value for the help text: a number as ostream writes it, a flag as true or false.
template <class T>
std::string HelpValue(T value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else {
    return tools::Num(static_cast<double>(value));
  }
}

// --optimizer's help, from the registry: every descriptor's kName, with the hyper-parameters the
// benchmark sets apart from the Hyper struct's defaults (baselines::BenchHyper) and the passes of
// a step that is not one pass (a two-phase or factored descriptor).
std::string OptimizerHelp() {
  const baselines::BenchHyper bench_hyper;
  std::vector<std::string> entries;
  algos::All::ForEach([&](auto d) {
    using A = typename decltype(d)::type;
    using Hyper = typename A::Hyper;
    std::vector<std::string> notes;
    const Hyper defaults{};
    const Hyper& chosen = bench_hyper.Of<Hyper>();
    algos::ForEachField<A>([&](const auto& field) {
      if (chosen.*field.member != defaults.*field.member)
        notes.push_back(std::string(field.name) + " " + HelpValue(chosen.*field.member));
    });
    if constexpr (algos::Factored<A>) {
      notes.emplace_back("factored, three passes");
    } else if constexpr (algos::TwoPhase<A>) {
      notes.emplace_back("two-phase");
    }
    std::string entry = A::kName;
    for (std::size_t i = 0; i < notes.size(); ++i) entry += (i == 0 ? " (" : ", ") + notes[i];
    entries.push_back(notes.empty() ? entry : entry + ")");
  });
  std::string help =
      "An optimizer of the registry (in parentheses: the hyper-parameters the benchmark sets apart "
      "from the defaults, and the passes of a step that is not one): ";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) help += i + 1 == entries.size() ? " or " : ", ";
    help += entries[i];
  }
  return help;
}

}  // namespace

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
  parser->add_option("--optimizer", options.optimizer, OptimizerHelp())
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
  parser->add_option("--state-dtype", options.state_dtype,
                     "States: --dtype's (the default, as torch keeps them), or q8: 8-bit "
                     "block-wise codes with one f32 absmax per 256 elements (bitsandbytes' format; "
                     "not AdamP, Adafactor). With q8, same_traffic moves the 8-bit step's "
                     "bytes, and standard (and standard_pipeline) are left out: no for-loop step "
                     "keeps 8-bit states");
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
  parser
      ->add_option("--first-step", options.first_step,
                   "The step count of the first (warmup) round, one more each round after it "
                   "(>= 2): late steps, where the bias corrections of Adam's family are exactly "
                   "1 (from step 16,628 at beta2 0.999) and their divisions are left out")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 40))
      ->capture_default_str();
  parser->add_option("--json", values->json_path, "Also write the report as JSON to this file");

  return {parser, [values, clip] {
            return RunCommand("bench", [&] {
              bench::BenchOptions& run_options = values->options;
              if (run_options.shapes.empty() && run_options.numel == 0)
                run_options.shapes = "mobilenet_v1";
              if (clip->count() > 0) run_options.clip = ParseClip(values->clip_text);
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
