// The one-process members of OptimizerCheckpoint (src/checkpoint/optimizer_checkpoint.h) and
// SaveCheckpoint / LoadCheckpoint of the Optimizer (fusedopt/checkpoint.h), for the files that
// instantiate them: checkpoint.cc for every algorithm of the registry, tests/algos/instances.cc
// for the test-only ones. Loading reads and checks the whole file into a plan of copies, then
// applies it: nothing changes before the last check has passed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "fusedopt/quantize.h"
#include "src/checkpoint/optimizer_checkpoint.h"

namespace fusedopt {

template <class Hyper>
Json OptimizerCheckpoint<Hyper>::Layout(std::span<const Segment> segments, std::size_t num_groups) {
  std::vector<std::size_t> group_sizes(num_groups, 0);
  std::vector<std::pair<std::vector<std::int64_t>, std::string>> params;
  for (const Segment& s : segments) {
    ++group_sizes[s.group];
    params.emplace_back(checkpoint_detail::ShapeOf(s),
                        checkpoint_meta::TorchDTypeName(s.param_dtype));
  }
  return checkpoint_meta::Layout(group_sizes, params);
}

template <class Hyper>
void OptimizerCheckpoint<Hyper>::CheckLayout(const Optimizer<Hyper>& opt, const std::string& path,
                                             const Json& saved) {
  const Json here = Layout(opt.storage_.segments(), opt.groups_.size());
  checkpoint_meta::CheckLayoutGroups(path, saved, here);
  for (std::size_t i = 0; i < opt.storage_.num_tensors(); ++i) {
    const Segment& s = opt.storage_.segments()[i];
    const std::vector<std::int64_t> shape = saved[1][i][0].get<std::vector<std::int64_t>>();
    std::int64_t numel = 1;
    for (std::int64_t d : shape) numel *= d;
    // The rows and cols the saved shape gives where the algorithm reads them (as fusedopt::pt
    // and the Python classes derive them from a param's shape).
    std::size_t rows = 0, cols = 0;
    if constexpr (algos::RowReductions<Descriptor>) {
      if (shape.size() > 1) rows = static_cast<std::size_t>(shape[0]);
    } else if constexpr (algos::Factored<Descriptor>) {
      if (shape.size() > 1) {
        rows = static_cast<std::size_t>(shape[shape.size() - 2]);
        cols = static_cast<std::size_t>(shape.back());
      }
    } else {
      rows = s.rows, cols = s.cols;
    }
    if (numel != static_cast<std::int64_t>(s.numel) || rows != s.rows || cols != s.cols ||
        saved[1][i][1] != here[1][i][1]) {
      Refuse(path, "parameter " + std::to_string(i) + " is " +
                       checkpoint_meta::DescribeParam(saved[1][i]) + " in the checkpoint, " +
                       checkpoint_meta::DescribeParam(here[1][i]) + " here");
    }
  }
}

template <class Hyper>
typename OptimizerCheckpoint<Hyper>::Source OptimizerCheckpoint<Hyper>::SourceOf(
    const Optimizer<Hyper>& opt) {
  return {opt.storage_.segments(),
          opt.groups_,
          opt.steps_,
          opt.buffer_steps_,
          opt.window_,
          [&opt](std::size_t i) {
            return const_cast<FlatStorage&>(opt.storage_).accumulator(i).data();
          },
          opt.storage_.options()};
}

template <class Hyper>
typename OptimizerCheckpoint<Hyper>::Manifest OptimizerCheckpoint<Hyper>::ManifestOf(
    const Source& src, const LossScaler* scaler, const CheckpointCounters& counters) {
  Manifest m;
  const std::span<const Segment> segments = src.segments;
  auto add = [&](std::string name, DType dtype, std::vector<std::int64_t> shape, const void* data,
                 std::size_t numel, std::optional<std::pair<std::size_t, int>> sharded = {}) {
    m.tensors.push_back({std::move(name),
                         checkpoint_meta::FileDTypeName(dtype),
                         std::move(shape),
                         {static_cast<const std::byte*>(data), numel * DTypeSize(dtype)}});
    m.sharded.push_back(sharded);
    return Json{{"tensor", m.tensors.back().name}};
  };
  auto add_number = [&](std::string name, float value) {
    m.numbers.push_back(value);
    return add(std::move(name), DType::kF32, {}, &m.numbers.back(), 1);
  };

  Json state = Json::object(), params = Json::array();
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    const std::string prefix = "state." + std::to_string(i) + ".";
    params.push_back(add("param." + std::to_string(i), s.param_dtype, checkpoint_detail::ShapeOf(s),
                         s.param, s.numel)["tensor"]);
    Json entry = Json::object();
    if constexpr (algos::CountsSteps<Descriptor>()) {
      entry["step"] = add_number(prefix + "step", static_cast<float>(src.steps[i]));
    } else if (src.options.stochastic_rounding && src.steps[i] != 0) {
      // The Python classes' count for the noise where torch's state has none (docs/numerics.md).
      entry["rounding_step"] =
          add_number(prefix + "rounding_step", static_cast<float>(src.steps[i]));
    }
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (!checkpoint_detail::KeepsSlot<Descriptor>(s, slot)) continue;
      if (checkpoint_detail::kMomentumBufferOnFirstStep<Hyper> && src.buffer_steps[i] == 0)
        continue;  // None
      const std::string key = Descriptor::kStates[static_cast<std::size_t>(slot)];
      auto [numel, shape] = checkpoint_detail::StateShape<Descriptor>(s, slot);
      entry[key] = add(prefix + key, s.state_dtype, std::move(shape), s.state[slot], numel,
                       std::pair(i, slot));
      if (s.state_dtype == DType::kQ8) {  // the Python classes' key for the codes' absmax
        const std::size_t blocks = NumQuantBlocks(numel);
        const auto n = static_cast<std::int64_t>(blocks);
        entry[key + "_absmax"] = add(prefix + key + "_absmax", DType::kF32, {n}, s.absmax[slot],
                                     blocks, std::pair(i, AbsmaxOf(slot)));
      }
    }
    for (std::size_t k = 0; k < algos::NumScalarStates<Descriptor>(); ++k) {
      if constexpr (algos::HasScalarStates<Descriptor>) {
        const std::string key = Descriptor::kScalarStates[k];
        entry[key] = add_number(prefix + key, *s.scalars[k]);
      }
    }
    if (s.master != nullptr && src.steps[i] > 0) {  // synced at the tensor's first step
      entry["master_param"] =
          add(prefix + "master_param", DType::kF32, checkpoint_detail::ShapeOf(s), s.master,
              s.numel, std::pair(i, kMasters));
    }
    state[std::to_string(i)] = std::move(entry);
  }

  Json sums = Json::object(), window = Json::array();
  if (src.window.pending > 0) {
    for (std::size_t i = 0; i < segments.size(); ++i) {
      window.push_back(i);
      sums[std::to_string(i)] =
          add("accumulator." + std::to_string(i), DType::kF32,
              checkpoint_detail::ShapeOf(segments[i]), src.accumulator(i), segments[i].numel);
    }
  }

  Json groups = Json::array();
  for (std::size_t g = 0; g < src.groups.size(); ++g) {
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].group == g) members.push_back(i);
    }
    groups.push_back(checkpoint_meta::EncodeGroup(src.groups[g], members));
  }
  const Json layout = Layout(segments, src.groups.size());
  const std::vector<std::int64_t> steps(src.steps.begin(), src.steps.end());
  const std::vector<std::int64_t> buffer_steps(src.buffer_steps.begin(), src.buffer_steps.end());
  m.meta = {
      {"fusedopt_checkpoint", checkpoint_meta::kFormat},
      {"algorithm", Descriptor::kName},
      {"optimizer_class", src.optimizer_class},
      {"param_groups", groups},
      {"state", state},
      {"params", params},
      {"layout", layout},
      {"layout_hash", LayoutHash(layout.dump())},
      {"world_size", src.world_size},
      {"accumulation",
       {{"micro_batches", src.window.pending},
        {"found_inf", src.window.found_inf},
        {"steps", src.window.steps},
        {"window", window},
        {"sums", sums},
        {"torch_sums", Json::object()}}},
      {"stochastic_rounding", {src.options.stochastic_rounding, src.options.rounding_seed}},
      // Where torch's state has no step count (SGD, Lion, LARS), the C++ Optimizer's own counts,
      // which key stochastic rounding: a resumed run rounds as the uninterrupted one.
      {"step_counts", algos::CountsSteps<Descriptor>()
                          ? Json()
                          : Json{{"steps", steps}, {"buffer_steps", buffer_steps}}},
      {"scaler", scaler == nullptr ? Json() : checkpoint_meta::EncodeScaler(*scaler)},
      {"scheduler", nullptr},
      {"model", nullptr},
      {"extra", checkpoint_meta::EncodeCounters(counters)},
  };
  // Widest dtype first (as fusedopt.save_checkpoint): every tensor starts aligned to its size.
  std::vector<std::size_t> order(m.tensors.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return (m.tensors[a].dtype == "F32") > (m.tensors[b].dtype == "F32");
  });
  Manifest sorted{std::move(m.meta), {}, {}, std::move(m.numbers)};
  for (std::size_t k : order) {
    sorted.tensors.push_back(std::move(m.tensors[k]));
    sorted.sharded.push_back(m.sharded[k]);
  }
  return sorted;
}

template <class Hyper>
void OptimizerCheckpoint<Hyper>::Save(const Source& src, const std::string& path,
                                      const LossScaler* scaler,
                                      const CheckpointCounters& counters) {
  const Manifest m = ManifestOf(src, scaler, counters);
  WriteCheckpointFile(path, m.meta.dump(), m.tensors);
}

template <class Hyper>
CheckpointCounters OptimizerCheckpoint<Hyper>::Load(Optimizer<Hyper>& opt, const std::string& path,
                                                    LossScaler* scaler) {
  const CheckpointFile file = ReadCheckpoint(path);
  const Json meta = checkpoint_meta::ParseMetadata(file, path);
  const checkpoint_meta::TensorTable table(file, path);
  const std::string algorithm = meta.value("algorithm", Json()).dump();
  if (meta.value("algorithm", Json()) != Descriptor::kName) {
    Refuse(path, "a checkpoint of " + meta.value("optimizer_class", Json()).dump() + " (" +
                     algorithm + "); this optimizer is " +
                     checkpoint_detail::OptimizerClass(Descriptor::kName) + " (\"" +
                     Descriptor::kName + "\")");
  }
  CheckLayout(opt, path, meta.value("layout", Json()));
  if (!meta.value("params", Json()).is_array()) {
    Refuse(path,
           "the checkpoint holds no params (it was written with a model: load it with "
           "the optimizer that owns that model's params)");
  }

  // The hyper-parameters, checked by the step's own rules.
  const Json saved_groups = meta.value("param_groups", Json());
  if (!saved_groups.is_array() || saved_groups.size() != opt.groups_.size()) {
    Refuse(path, "param_groups is not a list of " + std::to_string(opt.groups_.size()));
  }
  std::vector<Hyper> groups;
  for (std::size_t g = 0; g < opt.groups_.size(); ++g) {
    groups.push_back(checkpoint_meta::DecodeGroup(saved_groups[g], opt.groups_[g], path, g));
  }
  try {
    FusedStep(std::span<const Hyper>(groups), {}, *opt.runtime_);
  } catch (const Error& e) {
    Refuse(path, std::string("its hyper-parameters: ") + e.what());
  }

  // Every copy, planned once its source has been checked.
  const std::span<const Segment> segments = opt.storage_.segments();
  const std::size_t n = segments.size();
  std::vector<std::function<void()>> plan;
  unsigned slots = checkpoint_detail::AllRequiredStates(groups);
  std::vector<std::int64_t> steps(n, 0), buffer_steps(n, 0);
  const Json state = meta.value("state", Json::object());
  if (!state.is_object()) Refuse(path, "state is not a dict");
  auto number = [&](const Json& v, const std::string& what) {
    if (v.is_object() && v.contains("tensor") && v["tensor"].is_string()) {
      return table.Scalar(v["tensor"].get<std::string>());
    }
    return checkpoint_meta::DecodeFloat(v, path, what);
  };
  auto floats = [&](const Json& v, const std::string& what, std::size_t numel, DType* dtype) {
    if (!v.is_object() || !v.contains("tensor") || !v["tensor"].is_string()) {
      Refuse(path, what + " is " + v.dump() + ", not a tensor");
    }
    return table.Floats(v["tensor"].get<std::string>(), numel, dtype);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const Segment& s = segments[i];
    DType dtype;
    const auto param = table.Floats("param." + std::to_string(i), s.numel, &dtype);
    if (dtype != s.param_dtype) Refuse(path, "param." + std::to_string(i) + " has another dtype");
    plan.push_back([=] { CopyConverting(param, dtype, s.param, s.param_dtype, s.numel); });
    const std::string where = "state." + std::to_string(i);
    const Json entry = state.value(std::to_string(i), Json::object());
    if (!entry.is_object()) Refuse(path, where + " is not a dict");
    bool has_master = false;
    for (const auto& [key, v] : entry.items()) {
      const std::string what = where + "." + key;
      // A Python file's count for the noise of an algorithm without torch's count (SGD, Lion,
      // LARS) is this optimizer's count of steps (a file of ours has step_counts, read below).
      if (key == "step" || (key == "rounding_step" && !algos::CountsSteps<Descriptor>())) {
        const double step = number(v, what);
        if (!(step >= 0 && step == std::floor(step))) {
          Refuse(path, what + " is " + std::to_string(step) + ", not a step count");
        }
        steps[i] = static_cast<std::int64_t>(step);
        continue;
      }
      if (key == "master_param" && s.master != nullptr) {
        const auto from = floats(v, what, s.numel, &dtype);
        plan.push_back([=] { CopyConverting(from, dtype, s.master, DType::kF32, s.numel); });
        has_master = true;
        continue;
      }
      if (key == "master_param") continue;  // this optimizer keeps no master copy
      const int slot = SlotOf(key);
      if (slot >= 0) {
        const auto [numel, shape] = checkpoint_detail::StateShape<Descriptor>(s, slot);
        slots |= 1u << slot;
        if (checkpoint_detail::kMomentumBufferOnFirstStep<Hyper>) buffer_steps[i] = 1;
        plan.push_back(PlanStateCopy(opt, table, entry, where, key, i, slot, numel));
        continue;
      }
      if (key.ends_with("_absmax") && SlotOf(key.substr(0, key.size() - 7)) >= 0) {
        continue;  // read with its codes
      }
      const int scalar = ScalarOf(key);
      if (scalar < 0) {
        Refuse(path, what + ": " + Descriptor::kName + " keeps no state '" + key + "'");
      }
      const auto value = static_cast<float>(number(v, what));
      plan.push_back([=] { *s.scalars[scalar] = value; });
    }
    // A loaded master is the truth for its param, also where the file counts no steps (SGD's
    // and Lion's Python state): one step counted keeps the next step from re-seeding it.
    if (has_master) steps[i] = std::max<std::int64_t>(steps[i], 1);
    if (s.master != nullptr && !has_master && steps[i] > 0) {
      plan.push_back([&opt, i] { opt.storage_.SyncMaster(i); });
    }
    if (checkpoint_detail::kMomentumBufferOnFirstStep<Hyper> && buffer_steps[i] > 0) {
      buffer_steps[i] = std::max<std::int64_t>(steps[i], 1);
    }
  }

  const Json counts = meta.value("step_counts", Json());
  if (counts.is_object()) {
    steps = counts.at("steps").get<std::vector<std::int64_t>>();
    buffer_steps = counts.at("buffer_steps").get<std::vector<std::int64_t>>();
    if (steps.size() != n || buffer_steps.size() != n) {
      Refuse(path, "step_counts has counts of " + std::to_string(steps.size()) + " tensors, not " +
                       std::to_string(n));
    }
  }

  // The accumulation window: its sums, where this optimizer accumulates as many micro-batches.
  AccumulationWindow window{.steps = opt.window_.steps};
  const Json saved_window = meta.value("accumulation", Json());
  if (saved_window.is_object() && saved_window.value("micro_batches", 0) != 0) {
    window.pending = saved_window.value("micro_batches", std::int64_t{0});
    window.found_inf = saved_window.value("found_inf", false);
    if (window.pending < 0 || window.pending >= window.steps) {
      Refuse(path, "the checkpoint is " + std::to_string(window.pending) +
                       " micro-batches into an accumulation window; this optimizer accumulates " +
                       std::to_string(window.steps));
    }
    const Json sums = saved_window.value("sums", Json::object());
    for (std::size_t i = 0; i < n; ++i) {
      const std::string what = "accumulation sum " + std::to_string(i);
      if (!sums.contains(std::to_string(i))) Refuse(path, "the checkpoint lacks the " + what);
      DType dtype;
      const auto from = floats(sums[std::to_string(i)], what, segments[i].numel, &dtype);
      plan.push_back([=, &opt] {
        CopyConverting(from, dtype, opt.storage_.accumulator(i).data(), DType::kF32,
                       segments[i].numel);
      });
    }
  }
  std::optional<LossScaler> restored;
  if (scaler != nullptr) {
    restored = checkpoint_meta::DecodeScaler(meta.contains("scaler") ? &meta["scaler"] : nullptr,
                                             *scaler, path);
  }
  CheckpointCounters counters = checkpoint_meta::DecodeCounters(meta.value("extra", Json()));

  // Everything checked: apply. States the file does not hold start afresh.
  opt.groups_ = std::move(groups);
  opt.storage_.AllocateStates(slots);
  opt.ResetStates((1u << kMaxStates) - 1);
  for (const Segment& s : opt.storage_.segments()) {
    if constexpr (algos::HasScalarStates<Descriptor>) {
      for (std::size_t k = 0; k < algos::NumScalarStates<Descriptor>(); ++k) {
        *s.scalars[k] = Descriptor::InitialScalar(opt.groups_[s.group], static_cast<int>(k));
      }
    }
  }
  for (const auto& copy : plan) copy();
  opt.steps_ = std::move(steps);
  opt.buffer_steps_ = std::move(buffer_steps);
  opt.window_ = window;
  if (restored.has_value()) *scaler = *restored;
  return counters;
}

template <class Hyper>
std::function<void()> OptimizerCheckpoint<Hyper>::PlanStateCopy(
    Optimizer<Hyper>& opt, const checkpoint_meta::TensorTable& table, const Json& entry,
    const std::string& where, const std::string& key, std::size_t i, int slot, std::size_t numel) {
  const std::string& path = table.path();
  const std::string what = where + "." + key;
  const Json& v = entry[key];
  if (!v.is_object() || !v.contains("tensor") || !v["tensor"].is_string()) {
    Refuse(path, what + " is " + v.dump() + ", not a tensor");
  }
  const std::string name = v["tensor"].get<std::string>();
  const DType here = opt.storage_.segments()[i].state_dtype;  // fixed per tensor, not per slot
  const QuantMap map = SlotMap(algos::UnsignedMapStates<Descriptor>(), slot);
  // The slot may be allocated only when the plan runs: each copy looks its buffers up then.
  if (!table.HoldsCodes(name)) {
    DType dtype;
    const auto from = table.Floats(name, numel, &dtype);
    return [=, &opt] {
      const Segment& now = opt.storage_.segments()[i];
      if (here != DType::kQ8) {
        CopyConverting(from, dtype, now.state[slot], here, numel);
        return;
      }
      std::vector<float> values(numel);
      CopyConverting(from, dtype, values.data(), DType::kF32, numel);
      Quantize(values.data(), numel, map, static_cast<std::uint8_t*>(now.state[slot]),
               now.absmax[slot]);
    };
  }
  // 8-bit codes, with their absmax under the Python classes' key.
  const std::string akey = key + "_absmax";
  const Json& a = entry.contains(akey) ? entry[akey] : Json();
  if (!a.is_object() || !a.contains("tensor") || !a["tensor"].is_string()) {
    Refuse(path, what + " holds 8-bit codes, but " + where + "." + akey + " (their absmax) is " +
                     a.dump() + ", not a tensor");
  }
  const auto codes = table.Codes(name, numel);
  DType dtype;
  const auto absmax = table.Floats(a["tensor"].get<std::string>(), NumQuantBlocks(numel), &dtype);
  return [=, &opt] {
    const Segment& now = opt.storage_.segments()[i];
    if (here == DType::kQ8) {
      std::memcpy(now.state[slot], codes.data(), numel);
      CopyConverting(absmax, dtype, now.absmax[slot], DType::kF32, NumQuantBlocks(numel));
      return;
    }
    std::vector<float> scale(NumQuantBlocks(numel)), values(numel);
    CopyConverting(absmax, dtype, scale.data(), DType::kF32, scale.size());
    Dequantize(reinterpret_cast<const std::uint8_t*>(codes.data()), scale.data(), numel, map,
               values.data());
    CopyConverting(std::as_bytes(std::span<const float>(values)), DType::kF32, now.state[slot],
                   here, numel);
  };
}

template <class Hyper>
int OptimizerCheckpoint<Hyper>::SlotOf(const std::string& key) {
  for (int slot = 0; slot < kMaxStates; ++slot) {
    if (key == Descriptor::kStates[static_cast<std::size_t>(slot)] && !key.empty()) return slot;
  }
  return -1;
}

template <class Hyper>
int OptimizerCheckpoint<Hyper>::ScalarOf(const std::string& key) {
  if constexpr (algos::HasScalarStates<Descriptor>) {
    for (std::size_t k = 0; k < Descriptor::kScalarStates.size(); ++k) {
      if (key == Descriptor::kScalarStates[k]) return static_cast<int>(k);
    }
  }
  return -1;
}

template <class Hyper>
void SaveCheckpoint(const Optimizer<Hyper>& optimizer, const std::string& path,
                    const LossScaler* scaler, const CheckpointCounters& counters) {
  OptimizerCheckpoint<Hyper>::Save(OptimizerCheckpoint<Hyper>::SourceOf(optimizer), path, scaler,
                                   counters);
}

template <class Hyper>
CheckpointCounters LoadCheckpoint(Optimizer<Hyper>& optimizer, const std::string& path,
                                  LossScaler* scaler) {
  try {
    return OptimizerCheckpoint<Hyper>::Load(optimizer, path, scaler);
  } catch (const nlohmann::json::exception& e) {  // a value of the wrong JSON type
    Refuse(path, std::string("malformed metadata: ") + e.what());
  }
}

}  // namespace fusedopt
