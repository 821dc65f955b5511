#include "src/python/segment_table.h"

#include <pybind11/stl.h>

#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fusedopt/dtype.h"
#include "fusedopt/error.h"

namespace py = pybind11;

namespace fusedopt {
namespace {

// The largest state['step'] accepted: any f32 below it converts to int64 exactly, with room for the
// step being taken (and one more per repeated occurrence of the param).
constexpr float kMaxStepCount = 0x1p62f;

// torch keeps the count in an f32 tensor; the step being taken is one more. The float is checked
// before the cast (NaN, Inf or a value beyond int64 would make it undefined behaviour). key: the
// state key of the count, for the message.
std::int64_t NextStep(std::size_t segment, std::uintptr_t counter, const char* key) {
  const float count = *Ptr<const float>(counter);
  if (!(count >= 0.0f && count < kMaxStepCount)) {
    std::ostringstream out;
    out << "segment " << segment << ": invalid state['" << key << "']: " << count
        << " (must be a finite count in [0, 2^62))";
    throw Error(out.str());
  }
  return static_cast<std::int64_t>(count) + 1;
}

Segment ToSegment(const SegmentRow& row) {
  Segment s;
  s.param = Ptr<void>(row.param);
  for (std::size_t k = 0; k < kMaxStates; ++k) {
    s.state[k] = Ptr<void>(row.states[k]);
    s.absmax[k] = Ptr<float>(row.absmax[k]);
  }
  s.master = Ptr<float>(row.master);
  for (std::size_t k = 0; k < kMaxScalars; ++k) s.scalars[k] = Ptr<float>(row.scalars[k]);
  s.numel = row.numel;
  s.param_dtype = static_cast<DType>(row.param_dtype);
  s.state_dtype = static_cast<DType>(row.state_dtype);
  s.group = row.group;
  s.step = row.step;
  s.stochastic_rounding = row.stochastic_rounding;
  s.rounding_seed = row.rounding_seed;
  s.global_offset = row.global_offset;
  s.rows = row.rows;
  s.cols = row.cols;
  return s;
}

}  // namespace

SegmentTable::SegmentTable(const std::vector<SegmentRow>& rows) {
  segments_.reserve(rows.size());
  counters_.reserve(rows.size());
  std::unordered_set<std::uintptr_t> seen;
  for (const SegmentRow& row : rows) {
    segments_.push_back(ToSegment(row));
    counters_.push_back({row.step_counter, row.rounding_counter});
    for (std::uintptr_t counter : {row.step_counter, row.rounding_counter}) {
      if (counter != 0) shared_counters_ |= !seen.insert(counter).second;
    }
  }
}

std::vector<Segment> SegmentTable::ForCall(std::span<const std::uintptr_t> grads,
                                           std::span<const int> grad_dtypes,
                                           float grad_scale) const {
  if (grads.size() != segments_.size() || grad_dtypes.size() != segments_.size()) {
    throw Error("segment table of " + std::to_string(segments_.size()) + " rows called with " +
                std::to_string(grads.size()) + " gradients and " +
                std::to_string(grad_dtypes.size()) + " gradient dtypes");
  }
  std::vector<Segment> segments = segments_;
  // A counter shared by several rows advances once per occurrence, as torch's for-loop does: the
  // k-th occurrence takes step count + k.
  std::unordered_map<std::uintptr_t, std::int64_t> taken;
  const auto next = [&](std::size_t i, std::uintptr_t counter, const char* key) {
    return NextStep(i, counter, key) + (shared_counters_ ? taken[counter]++ : 0);
  };
  for (std::size_t i = 0; i < segments.size(); ++i) {
    Segment& s = segments[i];
    s.grad = Ptr<const void>(grads[i]);
    s.grad_dtype = static_cast<DType>(grad_dtypes[i]);
    s.grad_scale = grad_scale;
    if (counters_[i].step != 0) s.step = next(i, counters_[i].step, "step");
    if (counters_[i].rounding != 0) {
      s.rounding_step = next(i, counters_[i].rounding, "rounding_step");
    }
  }
  return segments;
}

void SegmentTable::StoreSteps(std::span<const Segment> stepped) const {
  for (std::size_t i = 0; i < counters_.size(); ++i) {
    const Counters& c = counters_[i];
    if (c.step != 0) *Ptr<float>(c.step) = static_cast<float>(stepped[i].step);
    if (c.rounding != 0) *Ptr<float>(c.rounding) = static_cast<float>(stepped[i].rounding_step);
  }
}

void BindSegmentTable(py::module_& m) {
  py::class_<SegmentRow>(
      m, "SegmentRow", "One parameter of a step without its gradient (src/python/segment_table.h)")
      .def(py::init([](std::uintptr_t param, const std::array<std::uintptr_t, kMaxStates>& states,
                       std::uintptr_t master, std::size_t numel, int param_dtype, int state_dtype,
                       std::uint32_t group, std::uintptr_t step_counter, std::int64_t step,
                       bool stochastic_rounding, std::uint64_t rounding_seed,
                       std::uint64_t global_offset,
                       const std::array<std::uintptr_t, kMaxScalars>& scalars, std::size_t rows,
                       std::size_t cols, const std::array<std::uintptr_t, kMaxStates>& absmax,
                       std::uintptr_t rounding_counter) {
             return SegmentRow{param,
                               states,
                               absmax,
                               master,
                               scalars,
                               numel,
                               param_dtype,
                               state_dtype,
                               group,
                               step_counter,
                               step,
                               rounding_counter,
                               stochastic_rounding,
                               rounding_seed,
                               global_offset,
                               rows,
                               cols};
           }),
           py::kw_only(), py::arg("param"), py::arg("states"), py::arg("master"), py::arg("numel"),
           py::arg("param_dtype"), py::arg("state_dtype"), py::arg("group"),
           py::arg("step_counter"), py::arg("step"), py::arg("stochastic_rounding"),
           py::arg("rounding_seed"), py::arg("global_offset"),
           py::arg("scalars") = std::array<std::uintptr_t, kMaxScalars>{}, py::arg("rows") = 0,
           py::arg("cols") = 0, py::arg("absmax") = std::array<std::uintptr_t, kMaxStates>{},
           py::arg("rounding_counter") = 0)
      .def_readonly("param", &SegmentRow::param)
      .def_readonly("numel", &SegmentRow::numel)
      .def_readonly("param_dtype", &SegmentRow::param_dtype);
  py::class_<SegmentTable>(
      m, "SegmentTable", "The rows of a step, kept from step to step (src/python/segment_table.h)")
      .def(py::init<const std::vector<SegmentRow>&>(), py::arg("rows"))
      .def("__len__", &SegmentTable::size);
}

}  // namespace fusedopt
