// The Python bindings of a list of algorithm descriptors (src/algos/descriptor.h): each one's Hyper
// class, its step function and the entry python/fusedopt builds its class from. fusedopt._C binds
// the registry (algos::All) with it; a module of other descriptors (the test-only algorithms,
// tests/algos/python_module.cc) binds them the same way, and python/fusedopt/_generic.py's
// generic_class takes its entries as it takes _C's. Such a module imports fusedopt._C first: the
// step functions take _C's SegmentTable and return _C's StepReport (one set of pybind11 types).

#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/grad.h"
#include "fusedopt/runtime.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/descriptor.h"
#include "src/core/step_traits.h"
#include "src/python/prepared_step.h"
#include "src/python/segment_table.h"

namespace fusedopt {

using GradTuple = std::tuple<std::uintptr_t, std::size_t, int>;  // data, numel, dtype code

inline std::vector<GradBuffer> ToGradBuffers(const std::vector<GradTuple>& packed) {
  std::vector<GradBuffer> grads;
  grads.reserve(packed.size());
  for (const auto& [data, numel, dtype] : packed) {
    grads.push_back({Ptr<void>(data), numel, static_cast<DType>(dtype)});
  }
  return grads;
}

// What a step call reports back to Python: StepResult's fields, and with a micro-batch the
// accumulation window after it. Bound once, by _C (module.cc).
struct StepReport {
  bool stepped = false;
  bool found_inf = false;
  std::optional<double> grad_norm;
  float clip_coef = 1.0f;
  std::int64_t pending = 0;
  bool window_found_inf = false;
};

// A micro-batch from Python (fusedopt/training_step.h: AccumulationWindow and MicroBatch): the
// window before it as (steps, pending, found_inf), this micro-batch's gradients, their sums, a
// fresh flag per gradient, and grad_scale.
using MicroBatchTuple = std::tuple<std::int64_t, std::int64_t, bool, std::vector<GradTuple>,
                                   std::vector<std::uintptr_t>, std::vector<std::uint8_t>, float>;

// Runs one fused training step (fusedopt/training_step.h) over the segments of `table`, gradient i
// at grads[i] with dtype code grad_dtypes[i], every one read as grad * grad_scale; then advances
// the step counters (only once the step has succeeded, so a rejected or skipped call changes
// nothing). With `check` or a finite max_norm, the pre-pass runs first: one read of the gradients
// for overflow and norm, the clip factor folded into each segment's grad_scale; an overflow skips
// the update. With a micro-batch, it is added into its sums first, and only the window's last one
// steps; then the table's gradients must be the sums.
//
// `wave_ends` splits the segments into waves updated one after the other (empty: one wave). Python
// puts a param listed twice, or params that overlap in memory, into different waves, so that the
// engine's parallel pass never updates one element from two segments at once and the later
// occurrence sees the earlier one's update, like torch's for-loop.
template <class Hyper>
StepReport RunStep(const std::vector<Hyper>& groups, const SegmentTable& table,
                   const std::vector<std::uintptr_t>& grads, const std::vector<int>& grad_dtypes,
                   float grad_scale, int num_threads, double max_norm, int norm_type, int clip_rule,
                   bool check, const std::vector<std::size_t>& wave_ends,
                   const std::optional<MicroBatchTuple>& micro_batch) {
  AccumulationWindow window;
  std::vector<GradBuffer> batch_grads;
  std::vector<float*> sums;
  MicroBatch batch;
  if (micro_batch) {
    const auto& [steps, pending, found_inf, packed, sum_ptrs, fresh, scale] = *micro_batch;
    window = {.steps = steps, .pending = pending, .found_inf = found_inf};
    batch_grads = ToGradBuffers(packed);
    for (std::uintptr_t a : sum_ptrs) sums.push_back(Ptr<float>(a));
    batch = {
        .window = &window, .grads = batch_grads, .sums = sums, .fresh = fresh, .grad_scale = scale};
  }
  pybind11::gil_scoped_release release;
  std::vector<Segment> segments = table.ForCall(grads, grad_dtypes, grad_scale);
  Runtime runtime(num_threads);
  const StepResult step = TrainingStep(std::span<const Hyper>(groups), std::span<Segment>(segments),
                                       {.check_overflow = check,
                                        .max_grad_norm = max_norm,
                                        .norm_type = static_cast<NormType>(norm_type),
                                        .clip_rule = static_cast<ClipRule>(clip_rule),
                                        .wave_ends = wave_ends,
                                        .micro_batch = micro_batch ? &batch : nullptr},
                                       runtime);
  if (step.stepped) table.StoreSteps(segments);
  return {step.stepped,   step.found_inf, step.grad_norm,
          step.clip_coef, window.pending, window.found_inf};
}

// A step with its Hypers and table fixed, which fusedopt._unchanged runs with each call's
// gradients (src/python/prepared_step.h): what <name>_prepare returns, bound once by _C as
// PreparedStep. It keeps the table alive and stays where it was made (the capsule points at it).
class PreparedStep {
 public:
  template <class Hyper>
  PreparedStep(std::vector<Hyper> groups, pybind11::object table)
      : table_(std::move(table)),
        run_([groups = std::move(groups),
              &rows = table_.cast<const SegmentTable&>()](const PreparedStepCall& call) {
          return RunStep<Hyper>(groups, rows, {call.grads, call.grads + call.count},
                                {call.grad_dtypes, call.grad_dtypes + call.count}, call.grad_scale,
                                call.num_threads, call.max_norm, call.norm_type, call.clip_rule,
                                call.check, {}, std::nullopt);
        }),
        abi_{.step = this, .run = &Run} {}
  PreparedStep(const PreparedStep&) = delete;
  PreparedStep& operator=(const PreparedStep&) = delete;

  const PreparedStepAbi* abi() const { return &abi_; }
  StepReport operator()(const PreparedStepCall& call) const { return run_(call); }

 private:
  static bool Run(const void* self, const PreparedStepCall& call,
                  PreparedStepOutcome& outcome) noexcept {
    try {
      const StepReport report = (*static_cast<const PreparedStep*>(self))(call);
      outcome = {.stepped = report.stepped,
                 .found_inf = report.found_inf,
                 .has_grad_norm = report.grad_norm.has_value(),
                 .grad_norm = report.grad_norm.value_or(0.0)};
      return true;
    } catch (...) {  // fusedopt::Error, before any buffer was touched: the ordinary path raises it
      return false;
    }
  }

  pybind11::object table_;  // the _C.SegmentTable run_ reads
  std::function<StepReport(const PreparedStepCall&)> run_;
  PreparedStepAbi abi_;
};

namespace python_bindings {

inline pybind11::str Str(std::string_view s) { return {s.data(), s.size()}; }

// One Field as a dict: {"name", "key", "index" (-1: the whole value), "kind" ("bool", "number" or
// "choice": an int held by name), "optional", "nullable", "choices" (the names, by code)}: the
// hyper-parameter fields with torch's param_group keys (the one group-key mapping, Field in
// src/algos/descriptor.h), so the Python classes build their Hyper without a table of their own.
template <class Hyper, class T>
pybind11::dict FieldEntry(const algos::Field<Hyper, T>& field) {
  pybind11::list choices;
  for (std::string_view choice : field.choices) choices.append(Str(choice));
  pybind11::dict entry;
  entry["name"] = field.name;
  entry["key"] = Str(field.GroupKey());
  entry["index"] = field.index;
  entry["kind"] = std::is_same_v<T, bool> ? "bool" : (field.choices.empty() ? "number" : "choice");
  entry["optional"] = field.optional;
  entry["nullable"] = field.nullable;
  entry["choices"] = pybind11::tuple(choices);
  return entry;
}

// The param-group keys where the descriptor's BenchHyper() departs from the Hyper's defaults, with
// BenchHyper's values (a tuple-valued key whole, as torch's constructor takes it); {} without one:
// the settings `fusedopt bench` times, for bench/torch_bench.py.
template <class A>
pybind11::dict BenchChanges() {
  pybind11::dict changes;
  if constexpr (requires { A::BenchHyper(); }) {
    const typename A::Hyper bench = A::BenchHyper();
    const typename A::Hyper defaults{};
    algos::ForEachField<A>([&](const auto& field) {
      if (bench.*field.member == defaults.*field.member) return;
      const std::string_view key = field.GroupKey();
      pybind11::object value = pybind11::cast(bench.*field.member);
      if (!field.choices.empty()) value = Str(field.choices[bench.*field.member]);
      if (!field.InTuple()) {
        changes[Str(key)] = value;
        return;
      }
      // A changed part of a tuple: the whole tuple, its other parts from BenchHyper too.
      pybind11::list parts;
      algos::ForEachField<A>([&](const auto& part) {
        if (part.GroupKey() == key) parts.append(pybind11::cast(bench.*part.member));
      });
      changes[Str(key)] = pybind11::tuple(parts);
    });
  }
  return changes;
}

// Binds A::Hyper as <module>.<Name>Hyper (keyword arguments and attributes: the descriptor's
// fields, defaults: the C++ struct's) and its step as <module>.<name>_step(groups, table, grads,
// grad_dtypes, grad_scale, num_threads, max_norm, norm_type, clip_rule, check, wave_ends,
// micro_batch) -> StepReport (see RunStep; fusedopt::Error surfaces as ValueError; norm_type 2, 1,
// or 0 for inf; clip_rule 0 torch, 1 LAMB) and <module>.<name>_prepare(groups, table) ->
// PreparedStep, and returns its entry: {"hyper": class, "step": function, "prepare": function,
// "state_names": torch's keys of the state slots, "scalar_names": torch's keys of the
// scalar states (Segment::scalars), "row_reductions": whether its step reads Segment::rows (AdamP),
// "factored", "fields" (FieldEntry), "torch_name": the reference's class name, "counts_steps":
// whether torch's state counts steps, "bench_changes", "element_wise": whether each element's
// update reads nothing else (algos::ElementWise), "quantizable": whether its states may be 8-bit
// (else "why_unquantized" says why), "unsigned_map_states": bit i, slot i's codes use the unsigned
// map, "sums_across_tensors": whether a tensor's update reads sums over other tensors}. A Hyper's
// initial_scalars() are the values fresh scalar states start from, initial_state(slot) the value a
// fresh state slot starts from.
template <class A>
pybind11::dict BindAlgorithm(pybind11::module_& m) {
  namespace py = pybind11;
  using Hyper = typename A::Hyper;
  const std::string step_name = A::kStepName;  // "LionStep" -> "LionHyper"
  const std::string class_name = step_name.substr(0, step_name.size() - 4) + "Hyper";
  py::class_<Hyper> hyper(m, class_name.c_str());
  hyper.def(py::init([](const py::kwargs& fields) {
    Hyper h;
    std::size_t used = 0;
    algos::ForEachField<A>([&](const auto& field) {
      if (!fields.contains(field.name)) return;
      using T = std::remove_reference_t<decltype(h.*(field.member))>;
      h.*(field.member) = fields[field.name].template cast<T>();
      ++used;
    });
    if (used != fields.size()) {
      throw py::type_error(std::string(A::kName) + ": unknown hyper-parameter in " +
                           py::str(fields).cast<std::string>());
    }
    return h;
  }));
  algos::ForEachField<A>([&](const auto& f) { hyper.def_readwrite(f.name, f.member); });
  hyper.def("required_states", [](const Hyper& h) { return A::RequiredStates(h); });
  hyper.def("initial_scalars", [](const Hyper& h) {
    std::vector<float> values;
    for (std::size_t k = 0; k < algos::NumScalarStates<A>(); ++k) {
      if constexpr (algos::HasScalarStates<A>)
        values.push_back(A::InitialScalar(h, static_cast<int>(k)));
    }
    return values;
  });
  hyper.def(
      "initial_state", [](const Hyper& h, int slot) { return A::InitialState(h, slot); },
      py::arg("slot"));
  const std::string fn_name = std::string(A::kName) + "_step";
  m.def(fn_name.c_str(), &RunStep<Hyper>, py::arg("groups"), py::arg("table"), py::arg("grads"),
        py::arg("grad_dtypes"), py::arg("grad_scale"), py::arg("num_threads"),
        py::arg("max_norm") = std::numeric_limits<double>::infinity(), py::arg("norm_type") = 2,
        py::arg("clip_rule") = 0, py::arg("check") = false,
        py::arg("wave_ends") = std::vector<std::size_t>{}, py::arg("micro_batch") = py::none());
  const std::string prepare_name = std::string(A::kName) + "_prepare";
  m.def(
      prepare_name.c_str(),
      [](std::vector<Hyper> groups, py::object table) {
        return std::make_unique<PreparedStep>(std::move(groups), std::move(table));
      },
      py::arg("groups"), py::arg("table"));
  py::list state_names;
  for (const char* name : A::kStates) {
    if (*name != '\0') state_names.append(name);
  }
  py::list scalar_names;
  if constexpr (algos::HasScalarStates<A>) {
    for (const char* name : A::kScalarStates) scalar_names.append(name);
  }
  py::list fields;
  algos::ForEachField<A>([&](const auto& field) { fields.append(FieldEntry(field)); });
  py::dict entry;
  entry["hyper"] = hyper;
  entry["step"] = m.attr(fn_name.c_str());
  entry["prepare"] = m.attr(prepare_name.c_str());
  entry["state_names"] = py::tuple(state_names);
  entry["scalar_names"] = py::tuple(scalar_names);
  entry["row_reductions"] = algos::RowReductions<A>;
  // Its states are shaped by the param's last two dimensions (Adafactor: row_var, col_var), and its
  // step reads them as rows (size(-2)) and cols (size(-1)).
  entry["factored"] = algos::Factored<A>;
  entry["fields"] = py::tuple(fields);
  entry["torch_name"] = A::kTorchName;
  entry["counts_steps"] = algos::CountsSteps<A>();
  entry["bench_changes"] = BenchChanges<A>();
  entry["element_wise"] = algos::ElementWise<A>;
  // Whether its states may be 8-bit (state dtype q8), and which slots use the unsigned map.
  entry["quantizable"] = algos::QuantizableStates<A>;
  if constexpr (!algos::QuantizableStates<A>) {
    entry["why_unquantized"] = algos::WhyStatesStayUnquantized<A>();
  }
  entry["unsigned_map_states"] = algos::UnsignedMapStates<A>();
  // Whether one tensor's update reads sums over other tensors (BertAdam's per-group gradient norm):
  // such a step cannot run one tensor at a time (step_in_backward).
  entry["sums_across_tensors"] = algos::FinishesAll<A>;
  return entry;
}

}  // namespace python_bindings

// Binds every descriptor of `List` (a DescriptorList: algos::All, test_algos::All) into `m` and
// returns {kName: entry} (python_bindings::BindAlgorithm), which the module publishes as its
// `algorithms`.
template <class List>
pybind11::dict BindAlgorithms(pybind11::module_& m) {
  pybind11::dict algorithms;
  List::ForEach([&](auto descriptor) {
    using A = typename decltype(descriptor)::type;
    algorithms[A::kName] = python_bindings::BindAlgorithm<A>(m);
  });
  return algorithms;
}

}  // namespace fusedopt
