// fusedopt/pt/checkpoint.h: a libtorch optimizer, model and scaler in the checkpoint format of
// python/fusedopt/checkpoint.py (the metadata encoding is src/checkpoint/checkpoint_meta.h). Each
// optimizer class is read through its Traits (src/torch/optim_traits.h): its options as the core's
// hyper struct, its param state as the descriptor's slots, step count and scalar states.

#include "fusedopt/pt/checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/checkpoint/checkpoint_meta.h"
#include "src/torch/optim_traits.h"

namespace fusedopt::pt {
namespace {

using checkpoint_meta::Json;
using checkpoint_meta::Refuse;

// The file's dtype names and torch's (as Python's str(dtype) spells them, without "torch.").
struct DTypeNames {
  c10::ScalarType type;
  const char* file;
  const char* torch;
};
constexpr DTypeNames kDTypes[] = {
    {c10::kFloat, "F32", "float32"},      {c10::kHalf, "F16", "float16"},
    {c10::kBFloat16, "BF16", "bfloat16"}, {c10::kDouble, "F64", "float64"},
    {c10::kLong, "I64", "int64"},         {c10::kInt, "I32", "int32"},
    {c10::kByte, "U8", "uint8"},          {c10::kBool, "BOOL", "bool"}};

const DTypeNames& NamesOf(c10::ScalarType t, const std::string& what) {
  for (const DTypeNames& d : kDTypes) {
    if (d.type == t) return d;
  }
  throw std::invalid_argument("fusedopt::pt::SaveCheckpoint: " + what + " has dtype " +
                              c10::toString(t) + ", which a checkpoint does not hold");
}

// The tensors to write, kept alive (contiguous CPU copies where needed) until the file is written.
class Writer {
 public:
  Json Add(const std::string& name, const torch::Tensor& t) {
    const torch::Tensor c = t.detach().cpu().contiguous();
    kept_.push_back(c);
    tensors_.push_back({name,
                        NamesOf(c.scalar_type(), name).file,
                        c.sizes().vec(),
                        {static_cast<const std::byte*>(c.data_ptr()), c.nbytes()}});
    return {{"tensor", name}};
  }
  // Widest first, as fusedopt.save_checkpoint orders them: each starts aligned to its size.
  std::vector<CheckpointTensor> Ordered() {
    std::vector<std::pair<std::size_t, std::size_t>> order;  // (-itemsize, index)
    for (std::size_t i = 0; i < kept_.size(); ++i) order.emplace_back(kept_[i].element_size(), i);
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<CheckpointTensor> out;
    out.reserve(order.size());
    for (const auto& [size, i] : order) out.push_back(tensors_[i]);
    return out;
  }

 private:
  std::vector<torch::Tensor> kept_;
  std::vector<CheckpointTensor> tensors_;
};

// A read file's tensors as torch tensors (copies: the file's data need not be aligned).
class Reader {
 public:
  Reader(const CheckpointFile& file, std::string path) : file_(file), path_(std::move(path)) {
    for (std::size_t i = 0; i < file.tensors.size(); ++i) index_[file.tensors[i].name] = i;
  }
  torch::Tensor Get(const Json& ref, const std::string& what) const {
    if (!ref.is_object() || !ref.contains("tensor") || !ref["tensor"].is_string()) {
      Refuse(path_, what + " is " + ref.dump() + ", not a tensor");
    }
    return Get(ref["tensor"].get<std::string>());
  }
  torch::Tensor Get(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) Refuse(path_, "the checkpoint has no tensor " + name);
    const CheckpointEntry& e = file_.tensors[it->second];
    const DTypeNames* dtype = nullptr;
    for (const DTypeNames& d : kDTypes) {
      if (e.dtype == d.file) dtype = &d;
    }
    if (dtype == nullptr) Refuse(path_, name + " has dtype " + e.dtype);
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(dtype->type));
    if (e.nbytes != 0) std::memcpy(t.data_ptr(), file_.data.data() + e.offset, e.nbytes);
    return t;
  }

 private:
  const CheckpointFile& file_;
  std::string path_;
  std::map<std::string, std::size_t> index_;
};

std::vector<torch::Tensor> Params(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) params.push_back(p);
  }
  return params;
}

Json LayoutOf(const torch::optim::Optimizer& optimizer) {
  std::vector<std::size_t> group_sizes;
  std::vector<std::pair<std::vector<std::int64_t>, std::string>> params;
  for (const auto& group : optimizer.param_groups()) {
    group_sizes.push_back(group.params().size());
    for (const torch::Tensor& p : group.params()) {
      params.emplace_back(p.sizes().vec(), NamesOf(p.scalar_type(), "a param").torch);
    }
  }
  return checkpoint_meta::Layout(group_sizes, params);
}

// The model's state_dict, as Python names it: parameters and buffers by dotted path.
std::vector<std::pair<std::string, torch::Tensor>> ModelState(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

std::string Shape(const torch::Tensor& t) {
  std::string s = "(";
  for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

// What Save and Load need of an optimizer's class: its names, and its options and param state
// to and from the file (ClassCheckpoint<Traits>::Ops). Save and Load themselves are compiled once,
// not once per class.
struct ClassOps {
  std::string algorithm, class_name;
  std::function<Json(const torch::optim::OptimizerOptions&, const std::vector<std::size_t>&)> group;
  std::function<std::unique_ptr<torch::optim::OptimizerOptions>(
      const Json&, const torch::optim::OptimizerOptions&, const std::string&, std::size_t)>
      decode_group;
  std::function<Json(torch::optim::OptimizerParamState&, std::size_t, Writer&)> save_state;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(
      const Json&, const torch::Tensor&, const Reader&, const std::string&, const std::string&)>
      load_state;
};

// Save and load for one optimizer class.
template <class Traits>
struct ClassCheckpoint {
  using Options = typename Traits::Options;
  using State = typename Traits::State;
  using Hyper = typename Traits::Hyper;
  using D = algos::DescriptorOf<Hyper>;
  // apex's global clipping threshold (LAMB) lives in the options, not the hyper.
  static constexpr bool kClipsGlobally = detail::ClipsGlobally<Hyper>;

  static Json Group(const Options& o, const std::vector<std::size_t>& members) {
    Json group = checkpoint_meta::EncodeGroup(Traits::ToHyper(o), members);
    if constexpr (kClipsGlobally) {
      group["dict"].push_back(
          Json::array({"max_grad_norm", checkpoint_meta::EncodeFloat(o.max_grad_norm())}));
    }
    return group;
  }

  static std::unique_ptr<Options> DecodeOptions(const Json& saved, const Options& current,
                                                const std::string& path, std::size_t g) {
    const Hyper h = checkpoint_meta::DecodeGroup(saved, Traits::ToHyper(current), path, g);
    auto options = std::make_unique<Options>(current);
    Traits::FromHyper(h, *options);
    const Json held = checkpoint_meta::EncodeGroup(Traits::ToHyper(*options), {});
    if (held != checkpoint_meta::EncodeGroup(h, {})) {
      Refuse(path, "param_groups[" + std::to_string(g) + "] is " +
                       checkpoint_meta::EncodeGroup(h, {}).dump() + "; " + Traits::kName +
                       " holds only " + held.dump());
    }
    try {
      D::Validate({Traits::kName, g}, h);
    } catch (const Error& e) {
      Refuse(path, std::string("its hyper-parameters: ") + e.what());
    }
    if constexpr (kClipsGlobally) {
      if (const Json* v = checkpoint_meta::DictGet(saved, "max_grad_norm")) {
        const double max_norm = checkpoint_meta::DecodeFloat(*v, path, "max_grad_norm");
        if (!(max_norm >= 0.0)) Refuse(path, "max_grad_norm " + v->dump() + " is not >= 0");
        options->max_grad_norm(max_norm);
      }
    }
    return options;
  }

  // rounding: the optimizer steps with stochastic rounding (its count is saved then).
  static Json SaveState(State& s, const std::string& prefix, Writer& w, bool rounding) {
    Json entry = Json::object();
    const auto slots = Traits::Slots(s);
    for (int slot = 0; slot < kMaxStates; ++slot) {
      const char* key = D::kStates[static_cast<std::size_t>(slot)];
      if (slots[slot] != nullptr && slots[slot]->defined() && *key != '\0') {
        entry[key] = w.Add(prefix + key, *slots[slot]);
        if (slots[slot]->scalar_type() == torch::kByte) {  // 8-bit codes: their absmax beside
          const auto* absmax = dynamic_cast<const StateAbsmax*>(&s);
          const std::string akey = std::string(key) + "_absmax";
          if (absmax == nullptr || !absmax->absmax[slot].defined()) {
            throw std::invalid_argument("fusedopt::pt::SaveCheckpoint: state " + prefix + key +
                                        " holds 8-bit codes without their absmax (" + akey + ")");
          }
          entry[akey] = w.Add(prefix + akey, absmax->absmax[slot]);
        }
      }
    }
    if constexpr (algos::CountsSteps<D>()) {
      entry["step"] =
          w.Add(prefix + "step", torch::tensor(static_cast<float>(Traits::NextStep(s) - 1)));
    }
    if constexpr (requires { Traits::RoundingStep(s); }) {
      // The count stochastic rounding keys its noise by, while it does (as the Python classes).
      const std::int64_t count = Traits::RoundingStep(s);
      if (rounding && count != 0) {
        entry["rounding_step"] =
            w.Add(prefix + "rounding_step", torch::tensor(static_cast<float>(count)));
      }
    }
    if constexpr (algos::HasScalarStates<D>) {
      const auto scalars = Traits::Scalars(s);
      for (std::size_t k = 0; k < D::kScalarStates.size(); ++k) {
        if (scalars[k]->defined())
          entry[D::kScalarStates[k]] = w.Add(prefix + D::kScalarStates[k], *scalars[k]);
      }
    }
    return entry;
  }

  static std::unique_ptr<State> LoadState(const Json& entry, const torch::Tensor& param,
                                          const Reader& reader, const std::string& path,
                                          const std::string& where) {
    if (!entry.is_object()) Refuse(path, where + " is not a dict");
    auto state = std::make_unique<typename Traits::StateWithAbsmax>();
    const auto slots = Traits::Slots(*state);
    for (const auto& [key, v] : entry.items()) {
      const std::string what = where + "." + key;
      if (key.ends_with("_absmax") && entry.contains(key.substr(0, key.size() - 7))) {
        continue;  // read with its codes
      }
      const auto count = [&, &v = v] {
        const torch::Tensor t =
            v.is_number() ? torch::tensor(v.template get<double>()) : reader.Get(v, what);
        const double step = t.numel() == 1 ? t.to(torch::kDouble).item<double>() : -1.0;
        if (!(step >= 0 && step == static_cast<double>(static_cast<std::int64_t>(step)))) {
          Refuse(path, what + " is not a step count");
        }
        return static_cast<std::int64_t>(step);
      };
      if (key == "step") {
        Traits::SetStep(*state, count());
        continue;
      }
      if constexpr (requires { Traits::SetRoundingStep(*state, 0); }) {
        if (key == "rounding_step") {
          Traits::SetRoundingStep(*state, count());
          continue;
        }
      }
      if (key == "master_param") continue;  // see the header
      bool known = false;
      for (int slot = 0; slot < kMaxStates && !known; ++slot) {
        if (key != D::kStates[static_cast<std::size_t>(slot)] || slots[slot] == nullptr) continue;
        torch::Tensor t = reader.Get(v, what);
        if (!algos::Factored<D> && !t.sizes().equals(param.sizes())) {
          Refuse(path, what + " has shape " + Shape(t) + "; its param has " + Shape(param));
        }
        known = true;
        if (t.scalar_type() != torch::kByte) {
          *slots[slot] = t.to(param.scalar_type());
          continue;
        }
        // 8-bit codes, kept as they are, with their absmax under the Python classes' key.
        const std::string akey = key + "_absmax";
        if (!entry.contains(akey))
          Refuse(path, what + " holds 8-bit codes, but " + akey + " is missing");
        const torch::Tensor absmax = reader.Get(entry[akey], where + "." + akey);
        if (!absmax.is_floating_point() ||
            static_cast<std::size_t>(absmax.numel()) != NumQuantBlocks(t.numel())) {
          Refuse(path, where + "." + akey + " holds " + std::to_string(absmax.numel()) +
                           " values; " + std::to_string(NumQuantBlocks(t.numel())) +
                           " floats (one per block of " + std::to_string(kQuantBlock) +
                           " codes) scale " + what);
        }
        *slots[slot] = t;
        state->absmax[slot] = absmax.to(torch::kFloat).view({-1});
      }
      if constexpr (algos::HasScalarStates<D>) {
        const auto scalars = Traits::Scalars(*state);
        for (std::size_t k = 0; k < D::kScalarStates.size() && !known; ++k) {
          if (key != D::kScalarStates[k]) continue;
          *scalars[k] = reader.Get(v, what).to(torch::kFloat).reshape({});
          known = true;
        }
      }
      if (!known) Refuse(path, what + ": " + D::kName + " keeps no state '" + key + "'");
    }
    return state;
  }

  static std::string ClassName(const torch::optim::Optimizer& optimizer) {
    if (dynamic_cast<const FusedStepOptions*>(&optimizer) != nullptr) return Traits::kName;
    std::string name = Traits::kName;  // a torch::optim twin: the same class name there
    return "torch::optim::" + name.substr(name.rfind(':') + 1);
  }

  static ClassOps Ops(const torch::optim::Optimizer& optimizer) {
    const auto* fused = dynamic_cast<const FusedStepOptions*>(&optimizer);
    const bool rounding = fused != nullptr && fused->training().stochastic_rounding;
    return {
        .algorithm = D::kName,
        .class_name = ClassName(optimizer),
        .group =
            [](const torch::optim::OptimizerOptions& o, const std::vector<std::size_t>& members) {
              return Group(static_cast<const Options&>(o), members);
            },
        .decode_group = [](const Json& saved, const torch::optim::OptimizerOptions& current,
                           const std::string& path,
                           std::size_t g) -> std::unique_ptr<torch::optim::OptimizerOptions> {
          return DecodeOptions(saved, static_cast<const Options&>(current), path, g);
        },
        .save_state =
            [rounding](torch::optim::OptimizerParamState& s, std::size_t i, Writer& w) {
              auto* state = dynamic_cast<State*>(&s);
              if (state == nullptr) {
                throw std::invalid_argument("fusedopt::pt::SaveCheckpoint: the state of param " +
                                            std::to_string(i) + " is not a " + Traits::kName +
                                            " state");
              }
              return SaveState(*state, "state." + std::to_string(i) + ".", w, rounding);
            },
        .load_state = [](const Json& entry, const torch::Tensor& param, const Reader& reader,
                         const std::string& path, const std::string& where)
            -> std::unique_ptr<torch::optim::OptimizerParamState> {
          return LoadState(entry, param, reader, path, where);
        },
    };
  }
};

// The ClassOps of the optimizer's class (a torch::optim twin's too: a plain torch::optim::Adam
// saves as fusedopt::pt::Adam does); none for a class without Traits. The generic
// FusedOptimizer<Hyper> of an algorithm with a class of its own (FusedOptimizer<AdamWHyper>) is
// not one.
std::optional<ClassOps> OpsOf(const torch::optim::Optimizer& optimizer) {
  std::optional<ClassOps> ops;
  algos::All::ForEach([&](auto descriptor) {
    using Traits = detail::TraitsOf<typename decltype(descriptor)::type::Hyper>;
    if (!ops && dynamic_cast<const typename Traits::Class*>(&optimizer) != nullptr) {
      ops = ClassCheckpoint<Traits>::Ops(optimizer);
    }
  });
  return ops;
}

// A fused optimizer's accumulation window (TrainingOptions::accumulation_steps), in the Python
// classes' form: how far it is, the params with a gradient in it (their index in all groups' params
// laid end to end), their f32 sums and the sums of the params that take torch's own step (dense,
// in their dtype). null for a torch::optim class.
Json SaveWindow(const torch::optim::Optimizer& optimizer, Writer& w) {
  const auto* fused = dynamic_cast<const FusedStepOptions*>(&optimizer);
  if (fused == nullptr) return nullptr;
  const detail::Accumulation& acc = fused->accumulation();
  Json window = Json::array(), sums = Json::object(), torch_sums = Json::object();
  const std::vector<torch::Tensor> params =
      acc.window.pending > 0 ? Params(optimizer) : std::vector<torch::Tensor>();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string key = std::to_string(i);
    const auto it = acc.sums.find(params[i].unsafeGetTensorImpl());
    if (it != acc.sums.end() && it->second.in_window) {
      window.push_back(i);
      sums[key] = w.Add("accumulator." + key, it->second.sum);
    }
    const auto routed = acc.routed.find(params[i].unsafeGetTensorImpl());
    if (routed != acc.routed.end()) {
      const torch::Tensor& sum = routed->second.sum;
      torch_sums[key] = w.Add("torch_sum." + key, sum.is_sparse() ? sum.to_dense() : sum);
    }
  }
  return {{"micro_batches", acc.window.pending},
          {"found_inf", acc.window.found_inf},
          {"steps", acc.window.steps},
          {"window", window},
          {"sums", sums},
          {"torch_sums", torch_sums}};
}

// The window a checkpoint holds, checked against the optimizer (applied by the caller once every
// part is checked): a fused optimizer's whole window, or an empty one where the file has none.
std::optional<detail::Accumulation> LoadWindow(const Json& meta, torch::optim::Optimizer& optimizer,
                                               const std::vector<torch::Tensor>& params,
                                               const Reader& reader, const std::string& path) {
  const Json saved = meta.value("accumulation", Json());
  const std::int64_t micro_batches =
      saved.is_object() ? saved.value("micro_batches", std::int64_t{0}) : 0;
  auto* fused = dynamic_cast<FusedStepOptions*>(&optimizer);
  if (fused == nullptr) {
    if (micro_batches != 0) {
      Refuse(path, "the checkpoint is inside an accumulation window of a fused optimizer");
    }
    return std::nullopt;
  }
  detail::Accumulation acc;
  acc.window.steps = fused->training().accumulation_steps;
  if (micro_batches == 0) return acc;
  if (micro_batches < 0 || micro_batches >= acc.window.steps) {
    Refuse(path,
           "the checkpoint is " + std::to_string(micro_batches) +
               " micro-batches into an accumulation window; training().accumulation_steps is " +
               std::to_string(acc.window.steps));
  }
  acc.window.pending = micro_batches;
  acc.window.found_inf = saved.value("found_inf", false);
  const Json sums = saved.value("sums", Json::object());
  for (const Json& index : saved.value("window", Json::array())) {
    const std::size_t i = index.get<std::size_t>();
    const std::string key = std::to_string(i);
    if (i >= params.size() || !sums.contains(key)) {
      Refuse(path, "the accumulation window names param " + key + ", which has no sum here");
    }
    const torch::Tensor sum = reader.Get(sums[key], "accumulation sum " + key);
    if (sum.scalar_type() != torch::kFloat || sum.numel() != params[i].numel()) {
      Refuse(path, "accumulation sum " + key + " is not float32 of param " + key + "'s size");
    }
    acc.sums[params[i].unsafeGetTensorImpl()] = {
        .param = params[i], .sum = sum.view(params[i].sizes()).clone(), .in_window = true};
  }
  const Json torch_sums = saved.value("torch_sums", Json::object());
  for (const auto& [key, entry] : torch_sums.items()) {
    const bool index =
        !key.empty() && key.size() < 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const std::size_t i = index ? std::stoul(key) : params.size();
    if (i >= params.size()) Refuse(path, "the accumulation window names param " + key);
    const torch::Tensor sum = reader.Get(entry, "accumulation sum " + key);
    if (sum.numel() != params[i].numel()) {
      Refuse(path, "accumulation sum " + key + " does not have param " + key + "'s size");
    }
    acc.routed[params[i].unsafeGetTensorImpl()] = {
        .param = params[i], .sum = sum.view(params[i].sizes()).clone(), .in_window = true};
  }
  return acc;
}

void Save(const ClassOps& ops, const torch::optim::Optimizer& optimizer, const std::string& path,
          const CheckpointParts& parts) {
  Writer w;
  Json groups = Json::array(), state = Json::object();
  std::size_t i = 0;
  for (const auto& group : optimizer.param_groups()) {
    std::vector<std::size_t> members;
    for (const torch::Tensor& p : group.params()) {
      members.push_back(i);
      const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        state[std::to_string(i)] = ops.save_state(*it->second, i, w);
      }
      ++i;
    }
    groups.push_back(ops.group(group.options(), members));
  }
  Json model = nullptr, params = nullptr;
  if (parts.model != nullptr) {
    model = Json::array();
    for (const auto& [name, t] : ModelState(*parts.model))
      model.push_back(w.Add("model." + name, t)["tensor"]);
  } else {  // the params travel in the file, as fusedopt.save_checkpoint writes them without a
            // model
    params = Json::array();
    i = 0;
    for (const torch::Tensor& p : Params(optimizer))
      params.push_back(w.Add("param." + std::to_string(i++), p)["tensor"]);
  }
  const Json layout = LayoutOf(optimizer);
  Json m = Json::object();  // the keys in fusedopt.save_checkpoint's order
  m["fusedopt_checkpoint"] = checkpoint_meta::kFormat;
  m["algorithm"] = ops.algorithm;
  m["optimizer_class"] = ops.class_name;
  m["param_groups"] = groups;
  m["state"] = state;
  m["layout"] = layout;
  m["layout_hash"] = LayoutHash(layout.dump());
  m["world_size"] = 1;
  m["accumulation"] = SaveWindow(optimizer, w);
  m["stochastic_rounding"] = Json::array({false, 0});
  m["scaler"] = parts.scaler == nullptr ? Json() : checkpoint_meta::EncodeScaler(*parts.scaler);
  m["scheduler"] = nullptr;
  m["model"] = model;
  m["params"] = params;
  m["extra"] = checkpoint_meta::EncodeCounters(parts.counters);
  WriteCheckpointFile(path, m.dump(), w.Ordered());
}

CheckpointCounters Load(const ClassOps& ops, torch::optim::Optimizer& optimizer,
                        const std::string& path, const CheckpointParts& parts) {
  const CheckpointFile file = ReadCheckpoint(path);
  const Json meta = checkpoint_meta::ParseMetadata(file, path);
  const Reader reader(file, path);
  if (meta.value("algorithm", Json()) != ops.algorithm) {
    Refuse(path, "a checkpoint of " + meta.value("optimizer_class", Json()).dump() + " (" +
                     meta.value("algorithm", Json()).dump() + "); this optimizer is " +
                     ops.class_name + " (\"" + ops.algorithm + "\")");
  }
  const Json saved_layout = meta.value("layout", Json());
  const Json here = LayoutOf(optimizer);
  checkpoint_meta::CheckLayoutGroups(path, saved_layout, here);
  for (std::size_t i = 0; i < here[1].size(); ++i) {
    if (saved_layout[1][i] != here[1][i]) {
      Refuse(path, "parameter " + std::to_string(i) + " is " +
                       checkpoint_meta::DescribeParam(saved_layout[1][i]) + " in the checkpoint, " +
                       checkpoint_meta::DescribeParam(here[1][i]) + " here");
    }
  }

  auto& groups = optimizer.param_groups();
  const Json saved_groups = meta.value("param_groups", Json());
  if (!saved_groups.is_array() || saved_groups.size() != groups.size()) {
    Refuse(path, "param_groups is not a list of " + std::to_string(groups.size()));
  }
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    options.push_back(ops.decode_group(saved_groups[g], groups[g].options(), path, g));
  }
  const std::vector<torch::Tensor> params = Params(optimizer);
  const Json saved_state = meta.value("state", Json::object());
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> states(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string key = std::to_string(i);
    if (saved_state.contains(key)) {
      states[i] = ops.load_state(saved_state[key], params[i], reader, path, "state." + key);
    }
  }

  // The model: the same names, shapes and dtypes.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (destination, source)
  if (parts.model != nullptr) {
    const Json names = meta.value("model", Json());
    if (!names.is_array()) Refuse(path, "the checkpoint holds no model state");
    std::map<std::string, std::string> saved;  // model key -> tensor name
    for (const Json& n : names) {
      const std::string name = n.get<std::string>();
      saved[name.substr(name.find('.') + 1)] = name;
    }
    const auto mine = ModelState(*parts.model);
    for (const auto& [name, t] : mine) {
      if (!saved.contains(name)) Refuse(path, "the checkpoint's model has no entry '" + name + "'");
      torch::Tensor from = reader.Get(saved[name]);
      if (!from.sizes().equals(t.sizes()) || from.scalar_type() != t.scalar_type()) {
        Refuse(path, "model entry '" + name + "' is " + NamesOf(from.scalar_type(), name).torch +
                         " " + Shape(from) + " in the checkpoint, " +
                         NamesOf(t.scalar_type(), name).torch + " " + Shape(t) + " here");
      }
      copies.emplace_back(t, from);
    }
    if (saved.size() != mine.size()) {
      Refuse(path, "the checkpoint's model has " + std::to_string(saved.size()) +
                       " entries; this one has " + std::to_string(mine.size()));
    }
  } else if (meta.value("params", Json()).is_array()) {
    const Json& names = meta["params"];
    if (names.size() != params.size()) Refuse(path, "the checkpoint's params do not fit");
    for (std::size_t i = 0; i < params.size(); ++i) {
      copies.emplace_back(params[i],
                          reader.Get(names[i].get<std::string>()).view(params[i].sizes()));
    }
  }
  std::optional<LossScaler> scaler;
  if (parts.scaler != nullptr) {
    scaler = checkpoint_meta::DecodeScaler(meta.contains("scaler") ? &meta["scaler"] : nullptr,
                                           *parts.scaler, path);
  }
  CheckpointCounters counters = checkpoint_meta::DecodeCounters(meta.value("extra", Json()));
  std::optional<detail::Accumulation> window = LoadWindow(meta, optimizer, params, reader, path);

  // Everything checked: apply.
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(options[g]));
  for (std::size_t i = 0; i < params.size(); ++i) {
    void* key = params[i].unsafeGetTensorImpl();
    optimizer.state().erase(key);
    if (states[i]) optimizer.state()[key] = std::move(states[i]);
  }
  {
    const at::NoGradGuard no_grad;
    for (auto& [to, from] : copies) to.copy_(from);
  }
  if (scaler.has_value()) *parts.scaler = *scaler;
  if (window.has_value()) dynamic_cast<FusedStepOptions&>(optimizer).accumulation() = *window;
  return counters;
}

// The ClassOps of an optimizer these functions take, or std::invalid_argument.
ClassOps CheckedOps(const torch::optim::Optimizer& optimizer, const char* fn) {
  std::optional<ClassOps> ops = OpsOf(optimizer);
  if (!ops) {
    throw std::invalid_argument(std::string("fusedopt::pt::") + fn +
                                ": the optimizer is neither a fusedopt::pt class nor torch::optim "
                                "SGD, Adam, AdamW, RMSprop or Adagrad");
  }
  return std::move(*ops);
}

}  // namespace

void SaveCheckpoint(const torch::optim::Optimizer& optimizer, const std::string& path,
                    const CheckpointParts& parts) {
  Save(CheckedOps(optimizer, "SaveCheckpoint"), optimizer, path, parts);
}

CheckpointCounters LoadCheckpoint(torch::optim::Optimizer& optimizer, const std::string& path,
                                  const CheckpointParts& parts) {
  const ClassOps ops = CheckedOps(optimizer, "LoadCheckpoint");
  try {
    return Load(ops, optimizer, path, parts);
  } catch (const nlohmann::json::exception& e) {  // a value of the wrong JSON type
    Refuse(path, std::string("malformed metadata: ") + e.what());
  }
}

}  // namespace fusedopt::pt
