// tools/train/run.h, RunDistributedTraining: `fusedopt train --dist` under mpirun. Every rank
// holds the model; its params live in the DistributedOptimizer's flat buffer (the module's
// tensors are views of it), so the reduced, fused step updates the model in place. After each
// backward, the rank's gradients are copied into the optimizer's buckets (as DDP copies them).
// Checkpoints are shard sets (fusedopt/checkpoint.h, SaveShardedCheckpoint), named as the
// one-process run names its files. They hold the params and the optimizer, not the models'
// BatchNorm running statistics, which each rank keeps from its own slices and which no training
// step reads: a resumed run's params and losses are the uninterrupted run's, bit for bit.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "fusedopt/distributed.h"
#include "fusedopt/mpi_communicator.h"
#include "fusedopt/pt/timeline.h"
#include "fusedopt/runtime.h"
#include "src/algos/registry.h"
#include "src/checkpoint/checkpoint_dir.h"
#include "src/tool_util/report_util.h"
#include "tools/train/run.h"

namespace fusedopt::train {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double MaxOverRanks(Communicator& comm, double value) {
  comm.AllReduce(&value, 1, CommType::kF64, ReduceOp::kMax);
  return value;
}

// Runs f on rank 0; if it throws, every rank throws (rank 0 f's error).
template <class F>
void OnRankZero(Communicator& comm, const F& f) {
  std::exception_ptr error;
  if (comm.rank() == 0) {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (MaxOverRanks(comm, error ? 1.0 : 0.0) != 0.0) {
    if (error) std::rethrow_exception(error);
    throw std::runtime_error("rank 0 failed (its message says why)");
  }
}

// --resume: the update of the newest checkpoint in dir that verifies (rank 0 looks, every rank
// loads it), or 0 without one.
template <class Hyper>
int Resume(const TrainOptions& o, DistributedOptimizer<Hyper>& opt, Communicator& comm,
           std::ostream& progress) {
  double update = 0;
  OnRankZero(comm, [&] {
    std::vector<std::string> skipped;
    const std::optional<std::string> latest =
        checkpoint_dir::LatestCheckpoint(o.checkpoint_dir, &skipped);
    for (const std::string& s : skipped) progress << "skipping checkpoint " << s << "\n";
    for (const auto& [step, path] : checkpoint_dir::ListCheckpoints(o.checkpoint_dir)) {
      if (path == latest) update = static_cast<double>(step);
    }
  });
  update = MaxOverRanks(comm, update);
  if (update == 0) return 0;
  const std::string path =
      checkpoint_dir::CheckpointName(o.checkpoint_dir, static_cast<std::int64_t>(update));
  const CheckpointCounters counters = LoadCheckpoint(opt, path);
  if (!counters.contains("updates")) {
    throw std::invalid_argument("invalid --resume: " + path + " has no 'updates' counter");
  }
  if (comm.rank() == 0) {
    progress << "resuming from " << path << " (update " << counters.at("updates") << ")\n";
  }
  return static_cast<int>(counters.at("updates"));
}

void Check(bool ok, const std::string& flag, const std::string& value, const std::string& why) {
  if (!ok) throw std::invalid_argument("invalid " + flag + " " + value + " with --dist: " + why);
}

// The registry's Hyper of the named optimizer, with the run's lr, weight decay and (SGD)
// momentum.
template <class Hyper>
Hyper MakeHyper(const ResolvedHyper& r) {
  Hyper h;
  h.lr = r.lr;
  if constexpr (requires { h.weight_decay; }) h.weight_decay = r.weight_decay;
  if constexpr (std::is_same_v<Hyper, SgdHyper>) {
    h.momentum = r.momentum;
    h.nesterov = r.nesterov;
  }
  return h;
}

// Each rank's timeline events, gathered into rank 0's as processes "rank r".
void GatherTimeline(Communicator& comm, const pt::Timeline& mine, pt::Timeline& all) {
  nlohmann::json events = nlohmann::json::array();
  for (const pt::Timeline::Event& e : mine.events()) {
    events.push_back(
        {e.name, e.step, e.ts_us, e.dur_us, e.warmup.value_or(false), e.warmup.has_value()});
  }
  const std::string text = events.dump();
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(comm.size()));
  sizes[static_cast<std::size_t>(comm.rank())] = text.size();
  comm.AllGather(sizes.data(), 1, CommType::kU64);
  const std::size_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> buffer(longest * sizes.size());
  std::memcpy(buffer.data() + longest * static_cast<std::size_t>(comm.rank()), text.data(),
              text.size());
  comm.AllGather(buffer.data(), longest, CommType::kByte);
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    const int pid = all.AddProcess("rank " + std::to_string(r), "fusedopt::DistributedOptimizer");
    const nlohmann::json rank_events =
        nlohmann::json::parse(std::string(buffer.data() + r * longest, sizes[r]));
    for (const nlohmann::json& e : rank_events) {
      pt::Timeline::Event event{.pid = pid,
                                .name = e[0],
                                .step = e[1],
                                .ts_us = e[2],
                                .dur_us = e[3],
                                .warmup = std::nullopt};
      if (e[5].get<bool>()) event.warmup = e[4].get<bool>();
      all.Record(event);
    }
  }
}

struct StepTimes {
  double step_ms, forward_ms, backward_ms, grads_ms, optimizer_ms, exposed_comm_ms;
};

template <class Hyper>
nlohmann::json Train(const TrainOptions& o, const DistTrainOptions& d, Communicator& comm,
                     const ThreadChoice& threads, const ResolvedHyper& resolved, std::ostream& out,
                     std::ostream& progress) {
  const bool leader = comm.rank() == 0;
  const auto ranks = static_cast<std::int64_t>(comm.size());
  Model model = MakeModel(o.model, /*seed=*/0);
  const Batches batches(o.model, o.data);
  std::vector<torch::Tensor> params = model.module->parameters();
  std::vector<TensorSpec> specs;
  specs.reserve(params.size());
  for (const torch::Tensor& p : params)
    specs.push_back({.numel = static_cast<std::size_t>(p.numel())});
  DistributedOptimizer<Hyper> opt(
      {MakeHyper<Hyper>(resolved)}, specs, {.state_dtype = StateDType(o)}, comm,
      {.zero = d.zero, .bucket_bytes = static_cast<std::size_t>(d.bucket_mb * (1 << 20))});
  {
    // The module's params become views of the optimizer's buffer.
    torch::NoGradGuard no_grad;
    for (std::size_t t = 0; t < params.size(); ++t) {
      std::span<float> flat = opt.template params<float>(t);
      const torch::Tensor values = params[t].detach().contiguous();
      std::memcpy(flat.data(), values.data_ptr<float>(), flat.size_bytes());
      params[t].set_data(torch::from_blob(flat.data(), params[t].sizes(), torch::kFloat32));
    }
  }
  // The one-process reference (rank 0): the same model and batches with fusedopt::pt's class.
  Model reference;
  std::unique_ptr<torch::optim::Optimizer> reference_opt;
  if (d.reference && leader) {
    reference = MakeModel(o.model, /*seed=*/0);
    reference_opt = MakeOptimizer(o.optimizer, true, reference.module->parameters(), resolved);
    SetStateDType(*reference_opt, StateDType(o));
  }

  const int total = o.warmup + o.steps;
  int start = 0;
  if (!o.checkpoint_dir.empty()) {
    OnRankZero(comm, [&] {
      checkpoint_dir::PrepareCheckpointDir(o.checkpoint_dir,
                                           "--checkpoint-dir '" + o.checkpoint_dir + "'");
    });
    if (o.resume) start = Resume(o, opt, comm, progress);
    if (start >= total) {
      throw std::invalid_argument(
          "invalid --resume (the checkpoint is at update " + std::to_string(start) +
          ": nothing left of --warmup + --steps = " + std::to_string(total) + ")");
    }
  }

  pt::Timeline timeline;
  const std::int64_t slice = batches.samples_per_batch() / ranks;
  std::vector<StepTimes> timed;
  std::vector<double> losses, reference_losses;
  std::uint64_t bytes_sent = 0;
  for (int i = start; i < total; ++i) {
    const pt::Batch& batch = batches.Get(i);
    const bool warmup = i < o.warmup;
    MaxOverRanks(comm, 0.0);  // every rank starts the step together
    const Clock::time_point begin = Clock::now();
    const torch::Tensor input = batch.input.narrow(0, comm.rank() * slice, slice);
    const torch::Tensor target = batch.target.narrow(0, comm.rank() * slice, slice);
    const torch::Tensor loss = model.loss(model.forward(input), target);
    const Clock::time_point forward_end = Clock::now();
    loss.backward();
    const Clock::time_point backward_end = Clock::now();
    for (std::size_t t = 0; t < params.size(); ++t) {
      const torch::Tensor g = params[t].grad().contiguous();
      std::memcpy(opt.grads(t).data(), g.data_ptr<float>(), opt.grads(t).size_bytes());
      params[t].mutable_grad().reset();
    }
    const Clock::time_point grads_end = Clock::now();
    comm.reset_bytes_sent();
    opt.Step({.max_grad_norm = o.max_grad_norm});
    const Clock::time_point end = Clock::now();
    bytes_sent = comm.bytes_sent();
    const auto span = [&](const char* name, Clock::time_point a, Clock::time_point b) {
      timeline.Record({.pid = 1,
                       .name = name,
                       .step = i,
                       .ts_us = timeline.MicrosecondsSinceStart(a),
                       .dur_us = Ms(a, b) * 1000.0,
                       .warmup = std::string_view(name) == "step" ? std::optional<bool>(warmup)
                                                                  : std::nullopt});
    };
    span("step", begin, end);
    span("forward", begin, forward_end);
    span("backward", forward_end, backward_end);
    span("grads_to_buckets", backward_end, grads_end);
    span("optimizer", grads_end, end);
    for (const auto& c : opt.last_comm_spans()) span(c.kind, c.begin, c.end);

    double mean_loss = loss.item<double>() / static_cast<double>(ranks);
    comm.AllReduce(&mean_loss, 1, CommType::kF64, ReduceOp::kSum);
    if (!std::isfinite(mean_loss)) {
      throw std::runtime_error("diverged at step " + std::to_string(i) + " (loss " +
                               std::to_string(mean_loss) + "); lower --lr");
    }
    losses.push_back(mean_loss);
    StepTimes s{.step_ms = MaxOverRanks(comm, Ms(begin, end)),
                .forward_ms = MaxOverRanks(comm, Ms(begin, forward_end)),
                .backward_ms = MaxOverRanks(comm, Ms(forward_end, backward_end)),
                .grads_ms = MaxOverRanks(comm, Ms(backward_end, grads_end)),
                .optimizer_ms = MaxOverRanks(comm, Ms(grads_end, end)),
                .exposed_comm_ms = MaxOverRanks(comm, opt.last_exposed_comm_ms())};
    if (!warmup) timed.push_back(s);
    if (o.checkpoint_every > 0 && (i + 1) % o.checkpoint_every == 0) {
      SaveShardedCheckpoint(opt, checkpoint_dir::CheckpointName(o.checkpoint_dir, i + 1), nullptr,
                            {{"updates", i + 1}});
      OnRankZero(comm, [&] { checkpoint_dir::DropOldCheckpoints(o.checkpoint_dir, o.keep_last); });
    }
    if (reference_opt) {
      const torch::Tensor l = reference.loss(reference.forward(batch.input), batch.target);
      l.backward();
      if (std::isfinite(o.max_grad_norm)) {
        torch::nn::utils::clip_grad_norm_(reference.module->parameters(), o.max_grad_norm);
      }
      reference_opt->step();
      reference_opt->zero_grad();
      reference_losses.push_back(l.item<double>());
    }
    if (leader && o.progress && ((i + 1) % std::max(1, total / 10) == 0 || i + 1 == total)) {
      progress << "[" << i + 1 << "/" << total << "] " << comm.size() << " ranks, " << std::fixed
               << std::setprecision(1) << s.step_ms << " ms/step, loss " << std::setprecision(4)
               << mean_loss << "\n";
    }
  }

  const auto median = [&](double StepTimes::*field) {
    std::vector<double> v;
    v.reserve(timed.size());
    for (const StepTimes& s : timed) v.push_back(s.*field);
    return tools::Median(v);
  };
  const double step_ms = median(&StepTimes::step_ms);
  std::size_t numel = 0;
  for (const TensorSpec& s : specs) numel += s.numel;
  nlohmann::json report = {
      {"model", o.model.name},
      {"optimizer", o.optimizer},
      {"ranks", comm.size()},
      {"threads_per_rank", threads.threads},
      {"zero", d.zero},
      {"state_dtype", o.state_dtype},
      {"bucket_mb", d.bucket_mb},
      {"global_batch", batches.samples_per_batch()},
      {"batch_per_rank", slice},
      {"params", numel},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"samples_per_s", static_cast<double>(batches.samples_per_batch()) / (step_ms / 1000.0)},
      {"step_ms", step_ms},
      {"phases_ms",
       {{"forward", median(&StepTimes::forward_ms)},
        {"backward", median(&StepTimes::backward_ms)},
        {"grads_to_buckets", median(&StepTimes::grads_ms)},
        {"optimizer", median(&StepTimes::optimizer_ms)}}},
      {"exposed_comm_ms", median(&StepTimes::exposed_comm_ms)},
      {"bytes_sent_per_rank", bytes_sent},
      {"state_bytes_per_rank", opt.state_bytes()},
      {"losses", losses}};
  if (!reference_losses.empty()) {
    double worst = 0.0;
    for (std::size_t k = 0; k < losses.size(); ++k) {
      worst = std::max(worst, std::abs(losses[k] - reference_losses[k]) /
                                  std::max(std::abs(reference_losses[k]), 1e-12));
    }
    report["reference_losses"] = reference_losses;
    report["max_loss_rel_diff_vs_one_process"] = worst;
  }
  pt::Timeline all;
  if (!o.trace_path.empty()) GatherTimeline(comm, timeline, all);
  if (!leader) return nullptr;

  out << "fusedopt train --dist: " << o.model.name << ", " << o.optimizer << " ("
      << tools::FormatCount(numel) << " params), " << comm.size() << " ranks × " << slice
      << " samples, zero " << d.zero << ", buckets of " << tools::Num(d.bucket_mb)
      << " MiB; medians of " << o.steps << " steps (the slowest rank's)\n\n"
      << "| metric | value |\n|---|--:|\n"
      << "| threads per rank | " << threads.threads << " (" << threads.reason << ") |\n"
      << "| samples/s | " << tools::Fixed(report["samples_per_s"], 1) << " |\n"
      << "| step ms | " << tools::Fixed(step_ms, 2) << " |\n"
      << "| forward ms | " << tools::Fixed(report["phases_ms"]["forward"], 2) << " |\n"
      << "| backward ms | " << tools::Fixed(report["phases_ms"]["backward"], 2) << " |\n"
      << "| grads to buckets ms | " << tools::Fixed(report["phases_ms"]["grads_to_buckets"], 2)
      << " |\n"
      << "| optimizer ms (reduction + update) | "
      << tools::Fixed(report["phases_ms"]["optimizer"], 2) << " |\n"
      << "| exposed communication ms | " << tools::Fixed(report["exposed_comm_ms"], 2) << " |\n"
      << "| bytes sent per rank and step | " << tools::FormatCount(bytes_sent) << " |\n"
      << "| optimizer state bytes per rank | " << tools::FormatCount(opt.state_bytes()) << " |\n"
      << "| final loss | " << tools::Fixed(losses.back(), 4) << " |\n";
  if (report.contains("max_loss_rel_diff_vs_one_process")) {
    out << "| losses vs one process, max relative difference | "
        << tools::Num(report["max_loss_rel_diff_vs_one_process"]) << " |\n";
  }
  if (!o.trace_path.empty()) {
    tools::WriteTextFile(o.trace_path, all.ToJson(nlohmann::json{{"ranks", comm.size()}}.dump()));
    report["trace"] = o.trace_path;
  }
  return report;
}

}  // namespace

nlohmann::json RunDistributedTraining(const TrainOptions& o, const DistTrainOptions& d,
                                      std::ostream& out, std::ostream& progress) {
  Check(o.impls == std::vector<std::string>{"fused"}, "--impl", o.impls.front(),
        "the distributed run is fusedopt's (fused)");
  Check(o.dtype == "f32", "--dtype", o.dtype, "f32 only");
  Check(o.accumulation_steps == 1, "--accumulation-steps", std::to_string(o.accumulation_steps),
        "1 only");
  Check(!o.schedule, "--lr-warmup", std::to_string(o.lr_warmup), "no schedule yet");
  Check(d.zero == 0 || d.zero == 1, "--zero", std::to_string(d.zero), "0 or 1");
  StateDType(o);  // throws for a bad --state-dtype
  Check(d.bucket_mb > 0.0, "--bucket-mb", tools::Num(d.bucket_mb), "must be > 0");
  Check(o.steps >= 1, "--steps", std::to_string(o.steps), "must be >= 1");
  ValidateCheckpointOptions(o);
  Check(!(d.reference && o.resume), "--reference", "",
        "compares from the initialization, not --resume");
  const ResolvedHyper resolved = ResolveHyper(o);
  int argc = 0;
  char** argv = nullptr;
  const mpi::MpiSession session(&argc, &argv);
  mpi::MpiCommunicator comm;
  // The ranks on this host share its CPUs (libtorch's threads and the engine's alike): a thread
  // per CPU in every rank would oversubscribe them.
  const ThreadChoice threads = ThreadsPerRank(o.threads, comm.local_size());
  torch::set_num_threads(threads.threads);
  DefaultRuntime().set_num_threads(threads.threads);
  Check(o.data.batch_size % comm.size() == 0, "--batch-size", std::to_string(o.data.batch_size),
        "must divide by the " + std::to_string(comm.size()) + " ranks");
  nlohmann::json report;
  algos::All::ForEach([&](auto descriptor) {
    using A = typename decltype(descriptor)::type;
    if (o.optimizer == A::kName) {
      report = Train<typename A::Hyper>(o, d, comm, threads, resolved, out, progress);
    }
  });
  return report;
}

}  // namespace fusedopt::train
