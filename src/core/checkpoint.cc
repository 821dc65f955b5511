// fusedopt/checkpoint.h: SaveCheckpoint / LoadCheckpoint of the core Optimizer. Loading reads and
// checks the whole file into a plan of copies, then applies it: nothing changes before the last
// check has passed.

#include "fusedopt/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/algos/registry.h"
#include "src/core/checkpoint_meta.h"

namespace fusedopt {

using checkpoint_meta::CopyConverting;
using checkpoint_meta::Json;
using checkpoint_meta::Refuse;

namespace {

std::vector<std::int64_t> ShapeOf(const Segment& s) {
  const auto numel = static_cast<std::int64_t>(s.numel);
  const auto rows = static_cast<std::int64_t>(s.rows);
  const auto cols = static_cast<std::int64_t>(s.cols);
  if (cols > 0) {  // Adafactor's matrices: a batch of rows × cols
    const std::int64_t batch = numel / (rows * cols);
    if (batch > 1) return {batch, rows, cols};
    return {rows, cols};
  }
  if (rows > 0) return {rows, numel / rows};  // AdamP's channel rows
  return {numel};
}

// The elements and shape of state slot `slot` of a segment: the param's, or for a factored
// algorithm's reduced slots one value per row ([..., rows, 1]) or per column ([..., 1, cols]).
template <class Descriptor>
std::pair<std::size_t, std::vector<std::int64_t>> StateShape(const Segment& s, int slot) {
  std::vector<std::int64_t> shape = ShapeOf(s);
  if constexpr (algos::Factored<Descriptor>) {
    const algos::Shape kind = Descriptor::kStateShapes[static_cast<std::size_t>(slot)];
    if (kind == algos::Shape::kRows) shape.back() = 1;
    if (kind == algos::Shape::kCols) shape[shape.size() - 2] = 1;
  }
  std::size_t numel = 1;
  for (std::int64_t d : shape) numel *= static_cast<std::size_t>(d);
  return {numel, shape};
}

// Whether segment s keeps state slot `slot` (allocated, named, and for a factored algorithm one of
// the slots its shape uses).
template <class Descriptor>
bool KeepsSlot(const Segment& s, int slot) {
  if (s.state[slot] == nullptr || *Descriptor::kStates[static_cast<std::size_t>(slot)] == '\0') {
    return false;
  }
  if constexpr (algos::Factored<Descriptor>) {
    return (Descriptor::SegmentStates(s) >> slot & 1u) != 0;
  }
  return true;
}

template <class Hyper>
constexpr bool kMomentumBufferOnFirstStep =
    std::is_same_v<Hyper, SgdHyper> || std::is_same_v<Hyper, LarsHyper>;

template <class Hyper>
unsigned AllRequiredStates(const std::vector<Hyper>& groups) {
  unsigned slots = 0;
  for (const Hyper& h : groups) slots |= RequiredStates(h);
  return slots;
}

std::string OptimizerClass(const char* name) {
  return std::string("fusedopt::Optimizer<") + name + ">";
}

}  // namespace

template <class Hyper>
struct OptimizerCheckpoint {
  using Descriptor = algos::DescriptorOf<Hyper>;
  static constexpr int kMasters = DistributedOptimizer<Hyper>::kMasterSlot;

  static Json Layout(std::span<const Segment> segments, std::size_t num_groups) {
    std::vector<std::size_t> group_sizes(num_groups, 0);
    std::vector<std::pair<std::vector<std::int64_t>, std::string>> params;
    for (const Segment& s : segments) {
      ++group_sizes[s.group];
      params.emplace_back(ShapeOf(s), checkpoint_meta::TorchDTypeName(s.param_dtype));
    }
    return checkpoint_meta::Layout(group_sizes, params);
  }

  // The core knows each tensor's element count, and the rows and cols of AdamP's and Adafactor's
  // matrices, not its shape: a saved param matches with those and the dtype (a checkpoint that
  // fusedopt.save_checkpoint wrote, with torch's shapes, then loads too).
  static void CheckLayout(const Optimizer<Hyper>& opt, const std::string& path, const Json& saved) {
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
      if constexpr (std::is_same_v<Hyper, AdampHyper>) {
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

  // What a save reads: an Optimizer's storage, or a DistributedOptimizer's whole model (whose
  // state slots and masters a sharded save writes from each rank's shards).
  struct Source {
    std::span<const Segment> segments;
    std::span<const Hyper> groups;
    std::span<const std::int64_t> steps, buffer_steps;
    AccumulationWindow window;
    std::function<const float*(std::size_t)> accumulator;  // of tensor i, inside a window
    StorageOptions options;
    int world_size = 1;
    std::string optimizer_class = OptimizerClass(Descriptor::kName);
  };

  static Source SourceOf(const Optimizer<Hyper>& opt) {
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

  // What a save writes: the metadata and the tensors in file order. Each tensor of a state slot
  // or of the masters says which (tensor, slot) it is: a sharded save writes those in pieces.
  struct Manifest {
    Json meta;
    std::vector<CheckpointTensor> tensors;
    std::vector<std::optional<std::pair<std::size_t, int>>> sharded;  // one per tensor
    std::deque<float> numbers;  // the 0-d tensors' values (a deque: their addresses stay put)
  };

  static Manifest ManifestOf(const Source& src, const LossScaler* scaler,
                             const CheckpointCounters& counters) {
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
      params.push_back(
          add("param." + std::to_string(i), s.param_dtype, ShapeOf(s), s.param, s.numel)["tensor"]);
      Json entry = Json::object();
      if constexpr (algos::CountsSteps<Descriptor>()) {
        entry["step"] = add_number(prefix + "step", static_cast<float>(src.steps[i]));
      }
      for (int slot = 0; slot < kMaxStates; ++slot) {
        if (!KeepsSlot<Descriptor>(s, slot)) continue;
        if (kMomentumBufferOnFirstStep<Hyper> && src.buffer_steps[i] == 0) continue;  // None
        const std::string key = Descriptor::kStates[static_cast<std::size_t>(slot)];
        auto [numel, shape] = StateShape<Descriptor>(s, slot);
        entry[key] = add(prefix + key, s.state_dtype, std::move(shape), s.state[slot], numel,
                         std::pair(i, slot));
      }
      for (std::size_t k = 0; k < algos::NumScalarStates<Descriptor>(); ++k) {
        if constexpr (algos::HasScalarStates<Descriptor>) {
          const std::string key = Descriptor::kScalarStates[k];
          entry[key] = add_number(prefix + key, *s.scalars[k]);
        }
      }
      if (s.master != nullptr && src.steps[i] > 0) {  // synced at the tensor's first step
        entry["master_param"] = add(prefix + "master_param", DType::kF32, ShapeOf(s), s.master,
                                    s.numel, std::pair(i, kMasters));
      }
      state[std::to_string(i)] = std::move(entry);
    }

    Json sums = Json::object(), window = Json::array();
    if (src.window.pending > 0) {
      for (std::size_t i = 0; i < segments.size(); ++i) {
        window.push_back(i);
        sums[std::to_string(i)] = add("accumulator." + std::to_string(i), DType::kF32,
                                      ShapeOf(segments[i]), src.accumulator(i), segments[i].numel);
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

  static void Save(const Source& src, const std::string& path, const LossScaler* scaler,
                   const CheckpointCounters& counters) {
    const Manifest m = ManifestOf(src, scaler, counters);
    WriteCheckpointFile(path, m.meta.dump(), m.tensors);
  }

  static CheckpointCounters Load(Optimizer<Hyper>& opt, const std::string& path,
                                 LossScaler* scaler) {
    const CheckpointFile file = ReadCheckpoint(path);
    const Json meta = checkpoint_meta::ParseMetadata(file, path);
    const checkpoint_meta::TensorTable table(file, path);
    const std::string algorithm = meta.value("algorithm", Json()).dump();
    if (meta.value("algorithm", Json()) != Descriptor::kName) {
      Refuse(path, "a checkpoint of " + meta.value("optimizer_class", Json()).dump() + " (" +
                       algorithm + "); this optimizer is " + OptimizerClass(Descriptor::kName) +
                       " (\"" + Descriptor::kName + "\")");
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
    unsigned slots = AllRequiredStates(groups);
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
        if (key == "step") {
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
          const auto [numel, shape] = StateShape<Descriptor>(s, slot);
          const auto from = floats(v, what, numel, &dtype);
          slots |= 1u << slot;
          if (kMomentumBufferOnFirstStep<Hyper>) buffer_steps[i] = 1;
          plan.push_back([=, &opt] {
            const Segment& now = opt.storage_.segments()[i];  // the slot may be new
            CopyConverting(from, dtype, now.state[slot], now.state_dtype, numel);
          });
          continue;
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
      if (kMomentumBufferOnFirstStep<Hyper> && buffer_steps[i] > 0) {
        buffer_steps[i] = std::max<std::int64_t>(steps[i], 1);
      }
    }

    const Json counts = meta.value("step_counts", Json());
    if (counts.is_object()) {
      steps = counts.at("steps").get<std::vector<std::int64_t>>();
      buffer_steps = counts.at("buffer_steps").get<std::vector<std::int64_t>>();
      if (steps.size() != n || buffer_steps.size() != n) {
        Refuse(path, "step_counts has counts of " + std::to_string(steps.size()) +
                         " tensors, not " + std::to_string(n));
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
    const CheckpointCounters counters =
        checkpoint_meta::DecodeCounters(meta.value("extra", Json()));

    // Everything checked: apply. States the file does not hold start afresh.
    opt.groups_ = std::move(groups);
    opt.storage_.AllocateStates(slots);
    for (const Segment& s : opt.storage_.segments()) {
      for (int slot = 0; slot < kMaxStates; ++slot) {
        if (s.state[slot] == nullptr) continue;
        const float init = Descriptor::InitialState(opt.groups_[s.group], slot);
        for (std::size_t k = 0; k < s.numel; ++k)
          StoreFromF32(s.state[slot], s.state_dtype, k, init);
      }
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

  // The state slots allocated (collective): every rank allocates its slots together (at
  // construction and in Step), but a rank whose shards hold no element keeps none.
  static unsigned AllocatedSlots(DistributedOptimizer<Hyper>& d) {
    double slots = 0;
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (!d.states_[slot].empty()) slots += static_cast<double>(1u << slot);
    }
    d.comm_->AllReduce(&slots, 1, CommType::kF64, ReduceOp::kMax);
    return static_cast<unsigned>(slots);
  }

  // The one-process Optimizer `one` (built with d's groups, specs and storage options) made the
  // run d equals: its params, every state slot and master gathered from the ranks' shards
  // (collective), its step counts and scalar states.
  static void Consolidate(DistributedOptimizer<Hyper>& d, Optimizer<Hyper>& one) {
    const unsigned allocated = AllocatedSlots(d);
    one.storage_.AllocateStates(allocated);
    const std::size_t param_size = DTypeSize(d.storage_.param_dtype);
    const std::span<const Segment> segments = one.storage_.segments();
    for (std::size_t t = 0; t < segments.size(); ++t) {
      const Segment& s = segments[t];
      std::memcpy(s.param, d.params_.data() + d.layout_.offsets[t] * param_size,
                  s.numel * param_size);
      for (int k = 0; k < kMaxScalars; ++k) *s.scalars[k] = d.scalars_[t * kMaxScalars + k];
    }
    auto fill = [&](int slot, auto&& destination) {
      const std::vector<float> flat = d.GatherState(slot);
      for (std::size_t t = 0; t < segments.size(); ++t) {
        const auto [data, dtype] = destination(segments[t]);
        for (std::size_t i = 0; i < segments[t].numel; ++i) {
          StoreFromF32(data, dtype, i, flat[d.layout_.offsets[t] + i]);
        }
      }
    };
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if ((allocated >> slot & 1u) == 0) continue;
      fill(slot, [&](const Segment& s) { return std::pair(s.state[slot], s.state_dtype); });
    }
    if (d.storage_.master_weights) {
      fill(DistributedOptimizer<Hyper>::kMasterSlot,
           [](const Segment& s) { return std::pair<void*, DType>(s.master, DType::kF32); });
    }
    one.steps_ = d.steps_;
    one.buffer_steps_ = d.buffer_steps_;
  }

  static std::string DistributedClass(const DistributedOptimizer<Hyper>& d) {
    return std::string("fusedopt::DistributedOptimizer<") + Descriptor::kName +
           "> zero=" + std::to_string(d.options_.zero);
  }

  // Whether any rank failed (collective).
  static bool AnyRankFailed(DistributedOptimizer<Hyper>& d, bool failed) {
    double flag = failed ? 1.0 : 0.0;
    d.comm_->AllReduce(&flag, 1, CommType::kF64, ReduceOp::kMax);
    return flag != 0.0;
  }

  static void SaveDistributed(DistributedOptimizer<Hyper>& d, const std::string& path,
                              const LossScaler* scaler, const CheckpointCounters& counters) {
    Optimizer<Hyper> one(d.groups_, d.specs_, d.storage_, *d.runtime_);
    Consolidate(d, one);
    std::exception_ptr error;
    if (d.comm_->rank() == 0) {
      try {
        Source src = SourceOf(one);
        src.world_size = d.comm_->size();
        src.optimizer_class = DistributedClass(d);
        Save(src, path, scaler, counters);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (AnyRankFailed(d, error != nullptr)) {
      if (error) std::rethrow_exception(error);
      throw std::runtime_error("SaveCheckpoint: rank 0 could not write " + path);
    }
  }

  // Every rank writes its file of the shard set at `path` (fusedopt/checkpoint_file.h): rank 0
  // the metadata and the tensors that are not sharded, each rank the pieces of the state slots and
  // masters that its shard of every bucket holds. Nothing is gathered.
  static void SaveSharded(DistributedOptimizer<Hyper>& d, const std::string& path,
                          const LossScaler* scaler, const CheckpointCounters& counters) {
    const unsigned slots = AllocatedSlots(d);
    // The save's id, rank 0's draw (53 bits: exact in the f64 every rank receives).
    double id = 0;
    if (d.comm_->rank() == 0) {
      std::random_device random;
      id = static_cast<double>((std::uint64_t{random()} << 32 | random()) >> 11);
    }
    d.comm_->AllReduce(&id, 1, CommType::kF64, ReduceOp::kMax);
    const int rank = d.comm_->rank(), ranks = d.comm_->size();
    const Json record = {
        {"set", std::to_string(static_cast<std::uint64_t>(id))}, {"rank", rank}, {"ranks", ranks}};
    std::exception_ptr error;
    try {
      // The whole model's segments: params and scalar states as every rank holds them; the state
      // slots and masters are marked present (never read through them: this rank's shards are
      // written below).
      static const std::byte kSharded{};
      void* const marker = const_cast<std::byte*>(&kSharded);
      std::vector<Segment> segments(d.specs_.size());
      const std::size_t param_size = DTypeSize(d.storage_.param_dtype);
      for (std::size_t t = 0; t < segments.size(); ++t) {
        Segment& s = segments[t];
        const TensorSpec& spec = d.specs_[t];
        s.param = d.params_.data() + d.layout_.offsets[t] * param_size;
        s.numel = spec.numel, s.rows = spec.rows, s.cols = spec.cols, s.group = spec.group;
        s.param_dtype = d.storage_.param_dtype, s.state_dtype = d.storage_.state_dtype;
        for (int slot = 0; slot < kMaxStates; ++slot) {
          if ((slots >> slot & 1u) != 0) s.state[slot] = marker;
        }
        if (d.storage_.master_weights) s.master = static_cast<float*>(marker);
        for (int k = 0; k < kMaxScalars; ++k) s.scalars[k] = &d.scalars_[t * kMaxScalars + k];
      }
      Source src{segments, d.groups_, d.steps_, d.buffer_steps_, {}, {}, d.storage_};
      src.world_size = ranks;
      src.optimizer_class = DistributedClass(d);
      const Manifest m = ManifestOf(src, scaler, counters);

      const std::vector<std::pair<std::size_t, std::size_t>> ranges = d.ShardRanges();
      Json listed = Json::array();
      std::vector<CheckpointTensor> mine;
      for (std::size_t k = 0; k < m.tensors.size(); ++k) {
        const CheckpointTensor& t = m.tensors[k];
        listed.push_back({t.name, t.dtype, t.shape});
        if (!m.sharded[k].has_value()) {
          if (rank == 0) mine.push_back(t);
          continue;
        }
        const auto [tensor, slot] = *m.sharded[k];
        const std::size_t size = DTypeSize(slot == kMasters ? DType::kF32 : d.storage_.state_dtype);
        const std::size_t first = d.layout_.offsets[tensor], last = first + t.data.size() / size;
        for (const auto& [begin, end] : ranges) {
          const std::size_t lo = std::max(begin, first), hi = std::min(end, last);
          if (lo >= hi) continue;
          const std::span<const std::byte> local = d.LocalBuffer(slot, "SaveCheckpoint");
          mine.push_back({t.name + "@" + std::to_string(lo - first),
                          t.dtype,
                          {static_cast<std::int64_t>(hi - lo)},
                          local.subspan(d.LocalIndex(lo) * size, (hi - lo) * size)});
        }
      }
      Json meta = rank == 0 ? m.meta
                            : Json{{"fusedopt_checkpoint", checkpoint_meta::kFormat},
                                   {"algorithm", Descriptor::kName},
                                   {"optimizer_class", src.optimizer_class},
                                   {"world_size", ranks}};
      meta["shard"] = record;
      if (rank == 0) meta["shard"]["tensors"] = listed;
      WriteCheckpointFile(CheckpointShardPath(path, rank, ranks), meta.dump(), mine);
    } catch (...) {
      error = std::current_exception();
    }
    if (AnyRankFailed(d, error != nullptr)) {
      // No torn set: the files written are removed (a failed write left none).
      std::error_code ignored;
      std::filesystem::remove(CheckpointShardPath(path, rank, ranks), ignored);
      if (error) std::rethrow_exception(error);
      throw std::runtime_error("SaveShardedCheckpoint: another rank could not write its file of " +
                               path);
    }
    // The set is whole: what else lies at `path` (a file, another world size's set) is older.
    if (rank == 0) RemoveCheckpointsAt(path, ranks);
  }

  static CheckpointCounters LoadDistributed(DistributedOptimizer<Hyper>& d, const std::string& path,
                                            LossScaler* scaler) {
    // Every rank loads the file into the one-process Optimizer of its layout (which checks it
    // all), the ranks agree that all of them could, then each keeps its shards.
    Optimizer<Hyper> one(d.groups_, d.specs_, d.storage_, *d.runtime_);
    std::optional<LossScaler> restored;
    if (scaler != nullptr) restored = *scaler;
    CheckpointCounters counters;
    std::exception_ptr error;
    try {
      counters = LoadCheckpoint(one, path, restored ? &*restored : nullptr);
    } catch (...) {
      error = std::current_exception();
    }
    if (AnyRankFailed(d, error != nullptr)) {
      if (error) std::rethrow_exception(error);
      Refuse(path, "another rank could not load it");
    }
    d.groups_ = one.groups_;
    const std::size_t param_size = DTypeSize(d.storage_.param_dtype);
    const std::span<const Segment> segments = one.storage_.segments();
    auto flat = [&](auto&& source) {
      std::vector<float> out(d.layout_.numel);
      for (std::size_t t = 0; t < segments.size(); ++t) {
        for (std::size_t i = 0; i < segments[t].numel; ++i) {
          out[d.layout_.offsets[t] + i] = source(segments[t], i);
        }
      }
      return out;
    };
    for (std::size_t t = 0; t < segments.size(); ++t) {
      const Segment& s = segments[t];
      std::memcpy(d.params_.data() + d.layout_.offsets[t] * param_size, s.param,
                  s.numel * param_size);
      for (int k = 0; k < kMaxScalars; ++k) d.scalars_[t * kMaxScalars + k] = *s.scalars[k];
    }
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (segments.empty() || segments[0].state[slot] == nullptr) continue;
      d.LoadState(slot, flat([&](const Segment& s, std::size_t i) {
                    return LoadAsF32(s.state[slot], s.state_dtype, i);
                  }));
    }
    if (d.storage_.master_weights) {  // a tensor not stepped yet is seeded at its first step
      d.LoadState(DistributedOptimizer<Hyper>::kMasterSlot,
                  flat([](const Segment& s, std::size_t i) { return s.master[i]; }));
    }
    d.steps_ = one.steps_;
    d.buffer_steps_ = one.buffer_steps_;
    if (scaler != nullptr) *scaler = *restored;
    return counters;
  }

  static int SlotOf(const std::string& key) {
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (key == Descriptor::kStates[static_cast<std::size_t>(slot)] && !key.empty()) return slot;
    }
    return -1;
  }
  static int ScalarOf(const std::string& key) {
    if constexpr (algos::HasScalarStates<Descriptor>) {
      for (std::size_t k = 0; k < Descriptor::kScalarStates.size(); ++k) {
        if (key == Descriptor::kScalarStates[k]) return static_cast<int>(k);
      }
    }
    return -1;
  }
};

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

template <class Hyper>
void SaveCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                    const LossScaler* scaler, const CheckpointCounters& counters) {
  OptimizerCheckpoint<Hyper>::SaveDistributed(optimizer, path, scaler, counters);
}

template <class Hyper>
void SaveShardedCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                           const LossScaler* scaler, const CheckpointCounters& counters) {
  OptimizerCheckpoint<Hyper>::SaveSharded(optimizer, path, scaler, counters);
}

template <class Hyper>
CheckpointCounters LoadCheckpoint(DistributedOptimizer<Hyper>& optimizer, const std::string& path,
                                  LossScaler* scaler) {
  return OptimizerCheckpoint<Hyper>::LoadDistributed(optimizer, path, scaler);
}

#define FOPT_INSTANTIATE(Algo)                                                                   \
  template void SaveCheckpoint(const Optimizer<algos::Algo::Hyper>&, const std::string&,         \
                               const LossScaler*, const CheckpointCounters&);                    \
  template CheckpointCounters LoadCheckpoint(Optimizer<algos::Algo::Hyper>&, const std::string&, \
                                             LossScaler*);                                       \
  template void SaveCheckpoint(DistributedOptimizer<algos::Algo::Hyper>&, const std::string&,    \
                               const LossScaler*, const CheckpointCounters&);                    \
  template void SaveShardedCheckpoint(DistributedOptimizer<algos::Algo::Hyper>&,                 \
                                      const std::string&, const LossScaler*,                     \
                                      const CheckpointCounters&);                                \
  template CheckpointCounters LoadCheckpoint(DistributedOptimizer<algos::Algo::Hyper>&,          \
                                             const std::string&, LossScaler*);
FOPT_FOR_EACH_ALGORITHM(FOPT_INSTANTIATE)
#undef FOPT_INSTANTIATE

}  // namespace fusedopt
