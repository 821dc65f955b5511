// The segments of a step as python/fusedopt/_base.py describes them: one SegmentRow per parameter
// occurrence (named fields, built when a param or its state is new or has changed) and the
// SegmentTable made of them, which Python keeps from step to step while nothing it was built from
// changes. What changes every step (each gradient's address and dtype, and the grad scale) comes
// with each call, so the common step converts two lists of ints and nothing else.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fusedopt/step.h"

namespace fusedopt {

// Addresses come from torch's data_ptr(); 0 stands for "none".
template <class T>
T* Ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr): Python passes ints
}

// One parameter without its gradient (Segment's fields, as integers).
struct SegmentRow {
  std::uintptr_t param = 0;
  std::array<std::uintptr_t, kMaxStates> states{};  // Segment::state, 0 where unused
  // Segment::absmax: with 8-bit states (state_dtype q8), each used slot's f32 absmax, else 0
  std::array<std::uintptr_t, kMaxStates> absmax{};
  std::uintptr_t master = 0;  // f32 master copy, or 0
  // Segment::scalars: the address of each 0-d f32 state tensor of the algorithm (NAdam's
  // state['mu_product']), 0 where unused; the step reads them and writes them back itself.
  std::array<std::uintptr_t, kMaxScalars> scalars{};
  std::size_t numel = 0;
  int param_dtype = 0;  // DType codes
  int state_dtype = 0;
  std::uint32_t group = 0;
  // torch's state['step']: the address of its f32 count, read at each call (the step taken is one
  // more) and written back after a successful step; 0 for an algorithm without one (SGD), which
  // takes `step` as it is.
  std::uintptr_t step_counter = 0;
  std::int64_t step = 1;
  // With stochastic rounding, for an algorithm without state['step']: the address of the param's
  // state['rounding_step'], an f32 count kept as step_counter is, whose next value keys the noise
  // (Segment::rounding_step); 0 where unused.
  std::uintptr_t rounding_counter = 0;
  bool stochastic_rounding = false;
  std::uint64_t rounding_seed = 0;
  std::uint64_t global_offset = 0;
  std::size_t rows = 0;  // Segment::rows: the param's size(0) for AdamP's per-row sums, else 0
  // Segment::cols: Adafactor's size(-1) of a param of more than one dimension (rows then its
  // size(-2)), else 0
  std::size_t cols = 0;
};

class SegmentTable {
 public:
  explicit SegmentTable(const std::vector<SegmentRow>& rows);

  std::size_t size() const { return segments_.size(); }

  // The segments of one call: the table's, with gradient i at grads[i] (dtype code grad_dtypes[i])
  // read as grad * grad_scale, and each step (and rounding_step) taken from its counter. Throws
  // fusedopt::Error for a list of the wrong length or a counter that is not a count.
  std::vector<Segment> ForCall(std::span<const std::uintptr_t> grads,
                               std::span<const int> grad_dtypes, float grad_scale) const;
  // After a successful step: each counter set to the step it took, in row order, so a counter
  // that several rows share (a param listed twice) ends at its last occurrence.
  void StoreSteps(std::span<const Segment> stepped) const;

 private:
  struct Counters {
    std::uintptr_t step = 0;      // SegmentRow::step_counter
    std::uintptr_t rounding = 0;  // SegmentRow::rounding_counter
  };
  std::vector<Segment> segments_;   // grads unset
  std::vector<Counters> counters_;  // per row
  bool shared_counters_ = false;    // some counter appears in more than one row
};

void BindSegmentTable(pybind11::module_& m);

}  // namespace fusedopt
