// tools/train/run.h: build the impls and train them in turn; report.h summarizes and prints.

#include "tools/train/run.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <utility>

#include "fusedopt/pt/optim.h"
#include "fusedopt/pt/timeline.h"
#include "fusedopt/runtime.h"
#include "src/algos/registry.h"
#include "src/doctor/doctor.h"
#include "src/tool_util/report_util.h"
#include "tools/train/report.h"
#include "tools/train/standard_optimizer.h"

namespace fusedopt::train {
namespace {

using tools::Fixed;

// The algorithms libtorch has a torch::optim class of (the others' torch impl is the reference's
// for-loop in ATen ops, standard_optimizer.h).
constexpr std::string_view kTorchTwins[] = {"adamw", "adam", "sgd", "rmsprop", "adagrad"};

bool HasTorchTwin(std::string_view name) {
  return std::find(std::begin(kTorchTwins), std::end(kTorchTwins), name) != std::end(kTorchTwins);
}

// The algorithms without a torch::optim class: `f(std::type_identity<Descriptor>{})` for the one
// named `name`; false when it is none of them.
template <class F>
bool WithOtherAlgorithm(const std::string& name, F&& f) {
  if (HasTorchTwin(name)) return false;
  bool found = false;
  algos::All::ForEach([&](auto d) {
    if (name == decltype(d)::type::kName) {
      found = true;
      f(d);
    }
  });
  return found;
}

}  // namespace

ResolvedHyper ResolveHyper(const TrainOptions& o) {
  struct Default {
    const char* name;
    double lr, weight_decay;
  };
  static constexpr Default kDefaults[] = {{"adamw", 1e-3, 1e-2},
                                          {"adam", 1e-3, 0.0},
                                          {"sgd", 1e-2, 1e-4},
                                          {"rmsprop", 1e-3, 0.0},
                                          {"adagrad", 1e-2, 0.0}};
  for (const Default& d : kDefaults) {
    if (o.optimizer == d.name) {
      return {o.lr.value_or(d.lr), o.weight_decay.value_or(d.weight_decay),
              o.optimizer == "sgd" ? o.momentum : 0.0, o.nesterov};
    }
  }
  // The others: the reference's defaults (the Hyper struct's).
  ResolvedHyper resolved{};
  const bool found = WithOtherAlgorithm(o.optimizer, [&](auto d) {
    const typename decltype(d)::type::Hyper defaults;
    double weight_decay = 0.0;
    if constexpr (requires { defaults.weight_decay; }) {
      weight_decay = o.weight_decay.value_or(defaults.weight_decay);
    } else if (o.weight_decay.value_or(0.0) != 0.0) {
      throw std::invalid_argument("--optimizer " + o.optimizer + " has no weight decay");
    }
    resolved = {o.lr.value_or(defaults.lr), weight_decay, 0.0, false};
  });
  if (!found) {
    throw std::invalid_argument("invalid --optimizer '" + o.optimizer +
                                "' (adamw, adam, sgd, rmsprop, adagrad, " + OtherOptimizers() +
                                ")");
  }
  return resolved;
}

namespace {

// torch::optim's class (impl "torch") or its fusedopt::pt subclass (impl "fused"), same options.
template <class Torch, class Fused, class Options>
std::unique_ptr<torch::optim::Optimizer> Make(bool fused, const std::vector<torch::Tensor>& params,
                                              const Options& options) {
  if (fused) return std::make_unique<Fused>(params, options);
  return std::make_unique<Torch>(params, options);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::string& name, bool fused,
                                                       const std::vector<torch::Tensor>& params,
                                                       const ResolvedHyper& h) {
  namespace o = torch::optim;
  if (name == "adamw") {
    return Make<o::AdamW, pt::AdamW>(fused, params,
                                     o::AdamWOptions(h.lr).weight_decay(h.weight_decay));
  }
  if (name == "adam") {
    return Make<o::Adam, pt::Adam>(fused, params,
                                   o::AdamOptions(h.lr).weight_decay(h.weight_decay));
  }
  if (name == "sgd") {
    return Make<o::SGD, pt::SGD>(
        fused, params,
        o::SGDOptions(h.lr).momentum(h.momentum).weight_decay(h.weight_decay).nesterov(h.nesterov));
  }
  if (name == "rmsprop") {
    return Make<o::RMSprop, pt::RMSprop>(fused, params,
                                         o::RMSpropOptions(h.lr).weight_decay(h.weight_decay));
  }
  if (name == "adagrad") {
    return Make<o::Adagrad, pt::Adagrad>(fused, params,
                                         o::AdagradOptions(h.lr).weight_decay(h.weight_decay));
  }
  std::unique_ptr<torch::optim::Optimizer> made;
  WithOtherAlgorithm(name, [&](auto d) {
    using Algo = typename decltype(d)::type::Hyper;
    Algo hyper;
    hyper.lr = h.lr;
    if constexpr (requires { hyper.weight_decay; }) hyper.weight_decay = h.weight_decay;
    if (fused) {
      made = std::make_unique<pt::FusedOptimizer<Algo>>(params, pt::HyperOptions<Algo>(hyper));
    } else {
      made = std::make_unique<StandardOptimizer<Algo>>(params, hyper);
    }
  });
  return made;
}

namespace {

// What the run is called in the table: torch::optim's class or its fusedopt::pt subclass; for the
// others, fusedopt::pt's class or the reference's for-loop in ATen ops (standard_optimizer.h).
std::string Label(const std::string& optimizer, bool fused) {
  std::string label = "ATen for-loop (" + optimizer + "'s reference ops)";
  algos::All::ForEach([&](auto d) {
    using A = typename decltype(d)::type;
    if (optimizer != A::kName) return;
    if (HasTorchTwin(optimizer)) {
      label = (fused ? "fusedopt::pt::" : "torch::optim::") + std::string(A::kTorchName);
    } else if (fused) {
      label = pt::FusedOptimizer<typename A::Hyper>::class_name();
    }
  });
  return label;
}

// One implementation: its own model copy, optimizer and trainer, and what its updates took.
struct Run {
  std::string impl, label;
  Model model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<pt::Trainer> trainer;
  std::int64_t next_batch = 0;
  std::vector<pt::UpdateStats> timed;
  std::vector<double> losses;
};

}  // namespace

void ValidateCheckpointOptions(const TrainOptions& o) {
  const auto bad = [](const std::string& option, const std::string& value, const std::string& why) {
    throw std::invalid_argument("invalid " + option + " " + value + " (" + why + ")");
  };
  if (o.checkpoint_every < 0)
    bad("--checkpoint-every", std::to_string(o.checkpoint_every), "must be >= 0");
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) {
    bad("--checkpoint-every", std::to_string(o.checkpoint_every), "needs --checkpoint-dir");
  }
  if (o.resume && o.checkpoint_dir.empty()) bad("--resume", "", "needs --checkpoint-dir");
  if (o.keep_last < 0) bad("--keep-last", std::to_string(o.keep_last), "must be >= 0; 0: keep all");
}

namespace {

void Validate(const TrainOptions& o) {
  const auto bad = [](const std::string& option, const std::string& value, const std::string& why) {
    throw std::invalid_argument("invalid " + option + " " + value + " (" + why + ")");
  };
  if (o.impls.empty()) bad("--impl", "(none)", "give torch and/or fused");
  for (const std::string& impl : o.impls) {
    if (impl != "torch" && impl != "fused") bad("--impl", impl, "torch or fused");
    if (std::count(o.impls.begin(), o.impls.end(), impl) > 1) bad("--impl", impl, "given twice");
  }
  if (o.steps < 1) bad("--steps", std::to_string(o.steps), "must be >= 1");
  if (o.warmup < 0) bad("--warmup", std::to_string(o.warmup), "must be >= 0");
  if (o.threads < 0) bad("--threads", std::to_string(o.threads), "must be >= 0");
  if (o.dtype != "f32" && o.dtype != "bf16") bad("--dtype", o.dtype, "f32 or bf16");
  if (o.model.image_size < 1)
    bad("--image-size", std::to_string(o.model.image_size), "must be >= 1");
  if (o.lr_warmup < 0) bad("--lr-warmup", std::to_string(o.lr_warmup), "must be >= 0");
  // Given hyper-parameters: finite and >= 0 (NaN would otherwise slip through every comparison).
  const auto hyper = [&](const std::string& option, const std::optional<double>& value) {
    if (value && !(std::isfinite(*value) && *value >= 0.0))
      bad(option, tools::Num(*value), "must be a finite number >= 0");
  };
  hyper("--lr", o.lr);
  hyper("--weight-decay", o.weight_decay);
  if ((!o.checkpoint_dir.empty() || o.resume) && o.impls.size() != 1) {
    bad("--checkpoint-dir", o.checkpoint_dir, "takes one --impl, not --compare");
  }
  ValidateCheckpointOptions(o);
  StateDType(o);
}

}  // namespace

DType StateDType(const TrainOptions& o) {
  const std::string& s = o.state_dtype;
  if (s != "f32" && s != "bf16" && s != "q8") {
    throw std::invalid_argument("invalid --state-dtype " + s + " (f32, bf16 or q8)");
  }
  const char* why_not_q8 = nullptr;  // why the optimizer's states cannot be 8-bit, if they cannot
  algos::All::ForEach([&](auto d) {
    using A = typename decltype(d)::type;
    if constexpr (!algos::QuantizableStates<A>) {
      if (o.optimizer == A::kName) why_not_q8 = algos::WhyStatesStayUnquantized<A>();
    }
  });
  if (s == "q8" && why_not_q8 != nullptr) {
    throw std::invalid_argument("invalid --state-dtype q8 for --optimizer " + o.optimizer + ": " +
                                why_not_q8);
  }
  return s == "q8" ? DType::kQ8 : (s == "bf16" ? DType::kBF16 : DType::kF32);
}

void SetStateDType(torch::optim::Optimizer& fused, DType state_dtype) {
  std::optional<c10::ScalarType>& option =
      dynamic_cast<pt::FusedStepOptions&>(fused).training().state_dtype;
  option = state_dtype == DType::kQ8     ? std::optional(c10::kByte)
           : state_dtype == DType::kBF16 ? std::optional(c10::kBFloat16)
                                         : std::nullopt;  // the params' f32
}

std::string OtherOptimizers() {
  std::string names;
  algos::All::ForEach([&](auto d) {
    const std::string name = decltype(d)::type::kName;
    WithOtherAlgorithm(name, [&](auto /*same*/) { names += (names.empty() ? "" : ", ") + name; });
  });
  return names;
}

nlohmann::json RunTraining(const TrainOptions& options, std::ostream& out, std::ostream& progress) {
  Validate(options);
  const ResolvedHyper hyper = ResolveHyper(options);
  if (options.threads > 0) {
    torch::set_num_threads(options.threads);
    DefaultRuntime().set_num_threads(options.threads);
  }
  const int threads = torch::get_num_threads();
  const Batches batches(options.model, options.data);
  pt::Timeline timeline;
  pt::Timeline* const trace = options.trace_path.empty() ? nullptr : &timeline;

  std::vector<Run> runs;
  for (const std::string& impl : options.impls) {
    Run run;
    run.impl = impl;
    const bool fused = impl == "fused";
    run.label = Label(options.optimizer, fused);
    run.model = MakeModel(options.model, /*seed=*/0);  // the same initialization for every impl
    run.optimizer = MakeOptimizer(options.optimizer, fused, run.model.module->parameters(), hyper);
    if (fused && options.state_dtype != "f32") {
      SetStateDType(*run.optimizer, StateDType(options));
      run.label += options.state_dtype == "q8" ? " (8-bit states)" : " (bf16 states)";
    }
    pt::TrainerOptions trainer_options{.accumulation_steps = options.accumulation_steps,
                                       .max_grad_norm = options.max_grad_norm};
    if (options.schedule) {
      trainer_options.schedule = WarmupCosine(hyper.lr, options.lr_warmup,
                                              options.warmup + options.steps, hyper.lr * 0.01);
    }
    if (options.dtype == "bf16") trainer_options.autocast_dtype = c10::kBFloat16;
    trainer_options.timeline = trace;
    trainer_options.timeline_pid = trace != nullptr ? timeline.AddProcess(impl, run.label) : 1;
    trainer_options.checkpoint_dir = options.checkpoint_dir;
    trainer_options.checkpoint_every = options.checkpoint_every;
    trainer_options.keep_last = options.keep_last;
    trainer_options.resume = options.resume;
    run.trainer = std::make_unique<pt::Trainer>(run.model.module, run.model.forward, run.model.loss,
                                                *run.optimizer, trainer_options);
    for (const std::string& skipped : run.trainer->skipped_checkpoints()) {
      progress << "skipping checkpoint " << skipped << "\n";
    }
    if (!run.trainer->resumed_from().empty()) {
      progress << "resuming from " << run.trainer->resumed_from() << " (update "
               << run.trainer->updates() << ")\n";
    }
    run.next_batch =
        run.trainer->micro_batches();  // resumed: the batches an uninterrupted run takes next
    runs.push_back(std::move(run));
  }

  const int total = options.warmup + options.steps;
  const auto start = static_cast<int>(runs[0].trainer->updates());
  if (start >= total) {
    throw std::invalid_argument("invalid --resume (" + runs[0].trainer->resumed_from() +
                                " is at update " + std::to_string(start) +
                                ": nothing left of --warmup + --steps = " + std::to_string(total) +
                                ")");
  }
  Progress bar(progress, options.progress, total);
  for (int i = start; i < total; ++i) {
    // Rotate the order each step: no impl always runs right after the other's memory traffic.
    for (std::size_t k = 0; k < runs.size(); ++k) {
      Run& run = runs[(k + static_cast<std::size_t>(i)) % runs.size()];
      const pt::UpdateStats stats =
          run.trainer->Step([&] { return batches.Get(run.next_batch++); }, i < options.warmup);
      if (!std::isfinite(stats.loss)) {
        throw std::runtime_error(run.impl + " diverged at step " + std::to_string(i) + " (loss " +
                                 std::to_string(stats.loss) + "); lower --lr");
      }
      run.losses.push_back(stats.loss);
      if (i >= options.warmup) run.timed.push_back(stats);
    }
    std::vector<ImplProgress> lines;
    lines.reserve(runs.size());
    for (const Run& run : runs)
      lines.push_back({run.impl, run.timed.empty() ? nullptr : &run.timed.back()});
    bar.Update(i + 1, lines);
  }

  std::vector<std::int64_t> numels;
  for (const torch::Tensor& p : runs[0].model.module->parameters()) numels.push_back(p.numel());
  const std::int64_t samples = batches.samples_per_batch() * options.accumulation_steps;
  nlohmann::json report = {
      {"model", options.model.name},
      {"optimizer", options.optimizer},
      {"data", options.data.data},
      {"batch_size", options.data.batch_size},
      {"image_size", options.model.image_size},
      {"accumulation_steps", options.accumulation_steps},
      {"steps", options.steps},
      {"warmup", options.warmup},
      {"threads", threads},
      {"dtype", options.dtype},
      {"state_dtype", options.state_dtype},
      {"lr", hyper.lr},
      {"weight_decay", hyper.weight_decay},
      {"momentum", hyper.momentum},
      {"nesterov", hyper.nesterov},
      {"max_grad_norm", std::isfinite(options.max_grad_norm) ? nlohmann::json(options.max_grad_norm)
                                                             : nlohmann::json()},
      {"num_tensors", numels.size()},
      {"numel", std::accumulate(numels.begin(), numels.end(), std::int64_t{0})},
      {"target", ActiveTargetName()}};
  for (const Run& run : runs)
    report["impls"][run.impl] = Summarize(run.label, run.timed, run.losses, samples);

  if (report["impls"].contains("torch") && report["impls"].contains("fused")) {
    const nlohmann::json& t = report["impls"]["torch"];
    const nlohmann::json& f = report["impls"]["fused"];
    const double speedup = t["step_ms"].get<double>() / f["step_ms"].get<double>();
    const double bound =
        t["step_ms"].get<double>() / (t["step_ms"].get<double>() - t["optimizer_ms"].get<double>());
    report["speedup"] = speedup;
    report["amdahl_bound"] = bound;
    report["bound_gain_captured"] = (speedup - 1.0) / (bound - 1.0);
    // The step times carry the machine's noise in forward and backward (the same work for both
    // impls, yet their times differ by `model_ms_spread`); the same ratios from the optimizer
    // phases alone, the rest of the step held at torch's, are steadier. Both are reported.
    const double rest = t["step_ms"].get<double>() - t["optimizer_ms"].get<double>();
    const double phase_speedup =
        t["step_ms"].get<double>() / (rest + f["optimizer_ms"].get<double>());
    report["phase_speedup"] = phase_speedup;
    report["phase_gain_captured"] = (phase_speedup - 1.0) / (bound - 1.0);
    // The noise floor: how much the same model work's times differ between the impls.
    const auto model_ms = [](const nlohmann::json& impl) {
      return impl["phases_ms"]["forward"].get<double>() +
             impl["phases_ms"]["backward"].get<double>();
    };
    report["model_ms_spread"] =
        std::abs(model_ms(f) - model_ms(t)) / std::min(model_ms(f), model_ms(t));
    double max_rel = 0.0;
    const std::vector<double>& lt = runs[0].impl == "torch" ? runs[0].losses : runs[1].losses;
    const std::vector<double>& lf = runs[0].impl == "torch" ? runs[1].losses : runs[0].losses;
    for (std::size_t i = 0; i < std::min<std::size_t>(10, lt.size()); ++i) {
      max_rel = std::max(max_rel, std::abs(lf[i] - lt[i]) / std::abs(lt[i]));
    }
    report["max_loss_rel_diff_first10"] = max_rel;
    if (options.predict) {
      // What the doctor predicts from the torch run alone (its step and optimizer time), by
      // timing fusedopt's step on these shapes outside the training loop.
      doctor::DoctorOptions doctor;
      doctor.optimizer = options.optimizer;
      doctor.numels.assign(numels.begin(), numels.end());
      doctor.weight_decay = hyper.weight_decay;
      doctor.momentum = hyper.momentum;
      doctor.nesterov = hyper.nesterov;
      if (std::isfinite(options.max_grad_norm)) doctor.clip = options.max_grad_norm;
      doctor.step_ms = t["step_ms"];
      doctor.optimizer_ms = t["optimizer_ms"].get<double>();
      doctor.threads = threads;
      if (options.progress) progress << "doctor: timing fusedopt's step on these shapes\n";
      std::ostringstream ignored;  // its report and progress: the table below says what matters
      nlohmann::json diagnosis = doctor::Diagnose(doctor, ignored, ignored);
      report["doctor"] = {{"predicted_speedup", diagnosis["predicted_speedup"]},
                          {"predicted_fused_optimizer_ms", diagnosis["measured"]["fused_ms"]},
                          {"verdict", diagnosis["verdict"]}};
      report["doctor_error"] = std::abs(diagnosis["predicted_speedup"].get<double>() - speedup);
    }
  }

  out << "\n"
      << report["model"].get<std::string>() << ", " << options.optimizer << ", batch "
      << options.data.batch_size << " (" << options.data.data << "), " << threads << " threads, "
      << options.dtype << ", " << options.steps << " timed steps after " << options.warmup
      << " warm-up, trimmed means\n";
  PrintTable(report, out);
  if (report.contains("doctor")) {
    out << "doctor's prediction from the torch run: "
        << Fixed(report["doctor"]["predicted_speedup"], 3) << "x (measured "
        << Fixed(report["speedup"], 3) << "x)\n";
  }
  if (report.contains("max_loss_rel_diff_first10")) {
    out << "noise floor: forward + backward (the same work) differ by "
        << Percent(report["model_ms_spread"])
        << " between the impls; first 10 losses differ by at most " << std::setprecision(2)
        << std::scientific << report["max_loss_rel_diff_first10"].get<double>() << std::defaultfloat
        << " (relative)\n";
  }

  if (trace != nullptr) {
    nlohmann::json other = {{"model", options.model.name},
                            {"optimizer", options.optimizer},
                            {"batch_size", options.data.batch_size},
                            {"threads", threads},
                            {"dtype", options.dtype},
                            {"state_dtype", options.state_dtype},
                            {"param_dtype", "f32"},
                            {"param_numels", numels},
                            {"lr", hyper.lr},
                            {"weight_decay", hyper.weight_decay},
                            {"momentum", hyper.momentum},
                            {"nesterov", hyper.nesterov},
                            {"max_grad_norm", report["max_grad_norm"]}};
    // Checked and atomic: a failed write is an error, and leaves no partial trace behind.
    tools::WriteTextFile(options.trace_path, timeline.ToJson(other.dump()));
    report["trace"] = options.trace_path;
  }
  return report;
}

}  // namespace fusedopt::train
