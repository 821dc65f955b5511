// fusedopt._C: the fused engine for the Python package. It sees tensors only as integers (data
// pointer, element count, dtype code) that python/fusedopt passes in, so it links neither libtorch
// nor its C++ ABI and one build serves any torch version. The Python side keeps the tensors alive
// for the duration of a call, which lets every compute binding release the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"
#include "fusedopt/grad.h"
#include "fusedopt/hyper.h"
#include "fusedopt/runtime.h"
#include "fusedopt/scaler.h"
#include "fusedopt/step.h"
#include "fusedopt/training_step.h"
#include "src/algos/registry.h"
#include "src/python/segment_table.h"

namespace py = pybind11;

namespace fusedopt {

void BindSchedules(py::module_& m);    // schedule_bindings.cc
void BindCheckpoint(py::module_& m);   // checkpoint_bindings.cc
void BindDistributed(py::module_& m);  // distributed_bindings.cc
void BindRegistry(py::module_& m);     // registry_bindings.cc

namespace {

using GradTuple = std::tuple<std::uintptr_t, std::size_t, int>;  // data, numel, dtype code

std::vector<GradBuffer> ToGradBuffers(const std::vector<GradTuple>& packed) {
  std::vector<GradBuffer> grads;
  grads.reserve(packed.size());
  for (const auto& [data, numel, dtype] : packed) {
    grads.push_back({Ptr<void>(data), numel, static_cast<DType>(dtype)});
  }
  return grads;
}

// What a step call reports back to Python: StepResult's fields, and with a micro-batch the
// accumulation window after it.
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
  py::gil_scoped_release release;
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

// Binds A::Hyper as _C.<Name>Hyper (keyword arguments and attributes: the descriptor's fields,
// defaults: the C++ struct's) and its step as _C.<name>_step(groups, table, grads, grad_dtypes,
// grad_scale, num_threads, max_norm, norm_type, clip_rule, check, wave_ends, micro_batch) ->
// StepReport (see RunStep;
// fusedopt::Error surfaces as ValueError; norm_type 2, 1, or 0 for inf; clip_rule 0 torch, 1
// LAMB). algorithms[name] = {"hyper": class, "step": function, "state_names": torch's keys of the
// state slots, "scalar_names": torch's keys of the scalar states (Segment::scalars),
// "row_reductions": whether its step reads Segment::rows (AdamP), "factored"}; a
// Hyper's initial_scalars() are the values fresh scalar states start from.
template <class A>
void BindAlgorithm(py::module_& m, py::dict& algorithms) {
  using Hyper = typename A::Hyper;
  const std::string step_name = A::kStepName;  // "LionStep" -> "LionHyper"
  const std::string class_name = step_name.substr(0, step_name.size() - 4) + "Hyper";
  py::class_<Hyper> hyper(m, class_name.c_str());
  hyper.def(py::init([](const py::kwargs& fields) {
    Hyper h;
    std::size_t used = 0;
    std::apply(
        [&](const auto&... f) {
          const auto set = [&](const auto& field) {
            if (!fields.contains(field.name)) return;
            using T = std::remove_reference_t<decltype(h.*(field.member))>;
            h.*(field.member) = fields[field.name].template cast<T>();
            ++used;
          };
          (set(f), ...);
        },
        A::kFields);
    if (used != fields.size()) {
      throw py::type_error(std::string(A::kName) + ": unknown hyper-parameter in " +
                           py::str(fields).cast<std::string>());
    }
    return h;
  }));
  std::apply([&](const auto&... f) { (hyper.def_readwrite(f.name, f.member), ...); }, A::kFields);
  hyper.def("required_states", [](const Hyper& h) { return A::RequiredStates(h); });
  hyper.def("initial_scalars", [](const Hyper& h) {
    std::vector<float> values;
    for (std::size_t k = 0; k < algos::NumScalarStates<A>(); ++k) {
      if constexpr (algos::HasScalarStates<A>)
        values.push_back(A::InitialScalar(h, static_cast<int>(k)));
    }
    return values;
  });
  const std::string fn_name = std::string(A::kName) + "_step";
  m.def(fn_name.c_str(), &RunStep<Hyper>, py::arg("groups"), py::arg("table"), py::arg("grads"),
        py::arg("grad_dtypes"), py::arg("grad_scale"), py::arg("num_threads"),
        py::arg("max_norm") = std::numeric_limits<double>::infinity(), py::arg("norm_type") = 2,
        py::arg("clip_rule") = 0, py::arg("check") = false,
        py::arg("wave_ends") = std::vector<std::size_t>{}, py::arg("micro_batch") = py::none());
  py::list state_names;
  for (const char* name : A::kStates) {
    if (*name != '\0') state_names.append(name);
  }
  py::dict entry;
  entry["hyper"] = hyper;
  entry["step"] = m.attr(fn_name.c_str());
  entry["state_names"] = py::tuple(state_names);
  py::list scalar_names;
  if constexpr (algos::HasScalarStates<A>) {
    for (const char* name : A::kScalarStates) scalar_names.append(name);
  }
  entry["scalar_names"] = py::tuple(scalar_names);
  entry["row_reductions"] = algos::RowReductions<A>;
  // Its states are shaped by the param's last two dimensions (Adafactor: row_var, col_var), and its
  // step reads them as rows (size(-2)) and cols (size(-1)).
  entry["factored"] = algos::Factored<A>;
  // Its step over a slice of a tensor updates that slice as the step over the whole tensor does
  // (no per-tensor reduction): ZeRO-1 may cut tensors anywhere (fusedopt.distributed).
  algorithms[A::kName] = entry;
}

}  // namespace
}  // namespace fusedopt

PYBIND11_MODULE(_C, m) {
  using namespace fusedopt;
  m.doc() = "fusedopt's fused CPU engine (internal: use the fusedopt package)";

  // Every algorithm of the registry (src/algos/registry.h): its Hyper struct, its step function
  // and what Python needs to know of its state.
  py::class_<StepReport>(m, "StepReport", "What a step call did (src/python/module.cc)")
      .def_readonly("stepped", &StepReport::stepped)
      .def_readonly("found_inf", &StepReport::found_inf)
      .def_readonly("grad_norm", &StepReport::grad_norm)
      .def_readonly("clip_coef", &StepReport::clip_coef)
      .def_readonly("pending", &StepReport::pending)
      .def_readonly("window_found_inf", &StepReport::window_found_inf);
  py::dict algorithms;
  algos::All::ForEach(
      [&](auto descriptor) { BindAlgorithm<typename decltype(descriptor)::type>(m, algorithms); });
  m.attr("algorithms") = algorithms;
  BindRegistry(m);  // each entry's fields, reference name, step counting; Hyper.initial_state

  m.def(
      "grad_norm",
      [](const std::vector<GradTuple>& grads, int norm_type, float scale, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        const GradStats stats = GradNorm(buffers, static_cast<NormType>(norm_type), scale, runtime);
        return std::make_pair(stats.non_finite, stats.norm);
      },
      "(non_finite, norm) of all gradients times scale, in one read; norm_type 2, 1 or 0 (inf).");
  m.def(
      "clip_coefficient",
      [](double norm, double max_norm, int rule) {
        return rule == 1 ? LambClipCoefficient(norm, max_norm) : ClipCoefficient(norm, max_norm);
      },
      py::arg("norm"), py::arg("max_norm"), py::arg("rule") = 0,
      "The factor max_grad_norm scales the gradients by, in f32: rule 0 torch's min(1, max_norm / "
      "(norm + 1e-6)), rule 1 apex FusedLAMB's max_norm / norm when norm > max_norm.");
  m.def(
      "clip_grad_value",
      [](const std::vector<GradTuple>& grads, double clip_value, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        ClipGradValue(buffers, clip_value, runtime);
      },
      "Clamps every gradient element to [-clip_value, clip_value] in place.");
  py::class_<LossScaler>(m, "LossScaler")
      .def(py::init([](float init_scale, double growth_factor, double backoff_factor,
                       std::int64_t growth_interval, float min_scale, float max_scale,
                       bool dynamic) {
             return LossScaler({init_scale, growth_factor, backoff_factor, growth_interval,
                                min_scale, max_scale, dynamic});
           }),
           py::arg("init_scale") = 65536.0f, py::arg("growth_factor") = 2.0,
           py::arg("backoff_factor") = 0.5, py::arg("growth_interval") = 2000,
           py::arg("min_scale") = 0.0f,
           py::arg("max_scale") = std::numeric_limits<float>::infinity(), py::arg("dynamic") = true)
      .def_property_readonly("scale", &LossScaler::scale)
      .def_property_readonly("inv_scale", &LossScaler::inv_scale)
      .def_property_readonly("growth_tracker", &LossScaler::growth_tracker)
      .def("update", &LossScaler::Update, py::arg("found_inf"))
      .def("restore", &LossScaler::Restore, py::arg("scale"), py::arg("growth_tracker"));

  m.def(
      "has_non_finite",
      [](const std::vector<GradTuple>& grads, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        return HasNonFinite(buffers, runtime);
      },
      "True if any gradient element is +-Inf or NaN (one read, nothing written).");
  m.def(
      "unscale_grads",
      [](const std::vector<GradTuple>& grads, float scale, int threads) {
        const std::vector<GradBuffer> buffers = ToGradBuffers(grads);
        py::gil_scoped_release release;
        Runtime runtime(threads);
        return UnscaleGrads(buffers, scale, runtime);
      },
      "grads *= scale in place; returns whether any element was non-finite before.");

  BindSegmentTable(m);
  BindSchedules(m);
  BindCheckpoint(m);
  BindDistributed(m);

  m.def("active_target", &ActiveTargetName);
  m.def("available_targets", &AvailableTargets);
  m.def("force_target", &ForceTarget);
}
