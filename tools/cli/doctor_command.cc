// `fusedopt doctor`: the optimizer's share of a training step, the ops and memory passes a
// for-loop optimizer issues for those shapes vs fused, the achieved vs ceiling bandwidth, and the
// predicted end-to-end speedup, in plain language (src/doctor/doctor.h). Input: --shapes/--numels
// plus --step-ms (and optionally --optimizer-ms), or a --trace of `fusedopt train`; flags given
// with --trace override its values. --ranks adds the distributed plan
// (src/doctor/distributed_plan.h).

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "src/doctor/doctor.h"
#include "src/tool_util/algorithm.h"
#include "src/tool_util/model_shapes.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {
namespace {

struct Values {
  doctor::DoctorOptions options;
  std::string shapes;
  std::vector<std::size_t> numels;
  std::string trace_path;
  std::string clip_text;
  double optimizer_ms = 0.0;
  int zero = 0;
  std::string json_path;
};

// The options CLI11 parsed, kept so that run() knows which were given (and override the trace).
struct Given {
  CLI::Option* optimizer;
  CLI::Option* shapes;
  CLI::Option* numels;
  CLI::Option* dtype;
  CLI::Option* weight_decay;
  CLI::Option* momentum;
  CLI::Option* nesterov;
  CLI::Option* clip;
  CLI::Option* step_ms;
  CLI::Option* optimizer_ms;
  CLI::Option* threads;
  CLI::Option* zero;
};

nlohmann::json ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--trace: cannot read '" + path + "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--trace: '" + path + "' is not JSON: " + e.what());
  }
}

std::vector<std::size_t> ModelNumels(const std::string& model) {
  std::vector<std::size_t> numels;
  for (const tools::TensorShape& t : tools::GetModelShapes(model).tensors)
    numels.push_back(t.numel);
  return numels;
}

// The options the doctor runs with: the trace's values (if any), then the flags given on top.
doctor::DoctorOptions Resolve(Values& v, const Given& given) {
  doctor::DoctorOptions o = v.options;
  if (!v.trace_path.empty()) {
    o = doctor::DoctorOptionsFromTrace(ReadTrace(v.trace_path));
    o.rounds = v.options.rounds;
    if (given.optimizer->count() > 0) {
      o.optimizer = v.options.optimizer;
    } else if (const std::vector<std::string> names = AlgorithmNames();
               std::find(names.begin(), names.end(), o.optimizer) == names.end()) {
      // A trace of an optimizer the doctor does not time (the Python Trainer writes any class's
      // name): say where the name came from, and how to go on.
      throw std::invalid_argument("--trace: otherData.optimizer is '" + o.optimizer +
                                  "', not one of " + tools::AlgorithmNames() +
                                  ": give --optimizer NAME for the closest one");
    }
    if (given.dtype->count() > 0) o.dtype = v.options.dtype;
    if (given.weight_decay->count() > 0) o.weight_decay = v.options.weight_decay;
    if (given.momentum->count() > 0) o.momentum = v.options.momentum;
    if (given.nesterov->count() > 0) o.nesterov = v.options.nesterov;
    if (given.step_ms->count() > 0) o.step_ms = v.options.step_ms;
    if (given.threads->count() > 0) o.threads = v.options.threads;
  } else if (given.shapes->count() == 0 && given.numels->count() == 0) {
    throw std::invalid_argument("give --shapes MODEL, --numels N,N,... or --trace FILE");
  } else if (given.step_ms->count() == 0) {
    throw std::invalid_argument("--step-ms: required (the measured training step) without --trace");
  }
  // NaN is DoctorOptions' "not given": given, it would silently mean torch's default.
  if (given.weight_decay->count() > 0 && std::isnan(v.options.weight_decay))
    throw std::invalid_argument("--weight-decay: must be a finite number >= 0, got nan");
  if (given.shapes->count() > 0) o.numels = ModelNumels(v.shapes);
  if (given.numels->count() > 0) o.numels = v.numels;
  if (given.clip->count() > 0) o.clip = ParseClip(v.clip_text);
  if (given.optimizer_ms->count() > 0) {
    o.optimizer_ms = v.optimizer_ms;
    o.optimizer_ms_source = "given";
  }
  // The distributed plan's flags: never in a trace.
  o.ranks = v.options.ranks;
  if (given.zero->count() > 0) o.zero = v.zero;
  o.link_gbps = v.options.link_gbps;
  o.link_latency_us = v.options.link_latency_us;
  o.bucket_mb = v.options.bucket_mb;
  return o;
}

}  // namespace

Command AddDoctorCommand(CLI::App& app) {
  // The parsed values outlive this function: the parser writes into them, run() reads them.
  auto values = std::make_shared<Values>();
  doctor::DoctorOptions& options = values->options;
  CLI::App* parser = app.add_subcommand(
      "doctor",
      "Is the optimizer worth fusing here? Its share of the step, the ops and memory passes of a "
      "for-loop optimizer vs fused, GB/s vs the bandwidth ceiling, and the predicted speedup");
  Given given{};
  given.optimizer = parser
                        ->add_option("--optimizer", options.optimizer,
                                     "The optimizer (default: the trace's, else adamw)")
                        // Checked up front, as bench and bench-dist do: an unknown name is refused
                        // with the list before a trace is read or anything is timed.
                        ->check(CLI::IsMember(AlgorithmNames()))
                        ->capture_default_str();
  given.shapes = parser->add_option("--shapes", values->shapes, "Real per-tensor shapes of a model")
                     ->check(CLI::IsMember(ModelNames()));
  given.numels = parser
                     ->add_option("--numels", values->numels,
                                  "Element count of every parameter tensor: N,N,...")
                     ->delimiter(',')
                     ->check(ElementCount());
  given.shapes->excludes(given.numels);
  parser->add_option("--trace", values->trace_path,
                     "A `fusedopt train --trace` timeline (docs/trace-format.md)");
  // The values below are checked by the doctor, which names the option and the value.
  given.dtype = parser->add_option("--dtype", options.dtype, "Params and states: f32, bf16, f16")
                    ->capture_default_str();
  given.weight_decay = parser->add_option("--weight-decay", options.weight_decay,
                                          "Weight decay (default: torch's, AdamW 1e-2, else 0)");
  given.momentum = parser->add_option("--momentum", options.momentum, "Momentum (sgd, rmsprop)")
                       ->capture_default_str();
  given.nesterov = parser->add_flag("--nesterov", options.nesterov, "Nesterov momentum (sgd)");
  given.clip = parser
                   ->add_option("--clip", values->clip_text,
                                "clip_grad_norm_(MAX_NORM) before the step; default off")
                   ->type_name("MAX_NORM");
  given.step_ms = parser->add_option("--step-ms", options.step_ms,
                                     "The measured training step in ms (required without --trace)");
  given.optimizer_ms = parser->add_option(
      "--optimizer-ms", values->optimizer_ms,
      "The standard optimizer's ms within that step (default: timed here on those shapes)");
  given.threads = parser->add_option("--threads", options.threads, "Threads (0: OpenMP default)");
  parser->add_option("--rounds", options.rounds, "Timed rounds (median reported)")
      ->capture_default_str();
  parser->add_option("--json", values->json_path, "Also write the report as JSON to this file");
  // The distributed plan (docs/doctor.md); the doctor checks the values, naming flag and value.
  CLI::Option* ranks = parser
                           ->add_option("--ranks", options.ranks,
                                        "Predict data-parallel runs on P ranks (1..1024): P,P,...")
                           ->delimiter(',')
                           ->type_name("P");
  given.zero = parser
                   ->add_option("--zero", values->zero,
                                "0: data parallel (all-reduce), 1: ZeRO-1 (sharded state); "
                                "default both")
                   ->needs(ranks);
  parser
      ->add_option("--link-gbps", options.link_gbps,
                   "Each rank's link bandwidth in Gbit/s (the plan's beta)")
      ->capture_default_str()
      ->needs(ranks);
  parser
      ->add_option("--link-latency-us", options.link_latency_us,
                   "Latency per ring hop in microseconds (the plan's alpha)")
      ->capture_default_str()
      ->needs(ranks);
  parser
      ->add_option("--bucket-mb", options.bucket_mb,
                   "MiB of f32 gradients per collective (DDP's 25)")
      ->capture_default_str()
      ->needs(ranks);

  return {parser, [values, given] {
            return RunCommand("doctor", [&] {
              const doctor::DoctorOptions resolved = Resolve(*values, given);
              if (!values->json_path.empty()) CheckWritable(values->json_path);  // before timing
              const nlohmann::json report = doctor::Diagnose(resolved, std::cout, std::cerr);
              if (!values->json_path.empty()) {
                WriteTextFile(values->json_path, report.dump(2) + "\n");
                std::cout << "wrote " << values->json_path << "\n";
              }
            });
          }};
}

}  // namespace fusedopt::cli
