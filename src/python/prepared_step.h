// The unchanged step in one call into C++ (python/fusedopt/_packing.py, _step_unchanged): a step of
// fusedopt._C prepared with a step's Hypers and segment table (_C.PreparedStep), which
// fusedopt._unchanged runs itself once its check has found nothing changed, with the gradients it
// read on the way. The two are separate modules (only _unchanged is built against torch's C++ API,
// and _C against no torch), so they meet through a PyCapsule holding the plain struct below: no
// C++ class, exception or pybind11 type crosses between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace fusedopt {

// What changes from call to call: the arguments of RunStep (src/python/algorithm_bindings.h) but
// the Hypers and the table, which the prepared step holds.
struct PreparedStepCall {
  const std::uintptr_t* grads = nullptr;  // count gradient addresses, in the table's row order
  const int* grad_dtypes = nullptr;       // and their dtype codes
  std::size_t count = 0;
  float grad_scale = 1.0f;
  int num_threads = 1;
  double max_norm = std::numeric_limits<double>::infinity();  // no clipping
  int norm_type = 2;
  int clip_rule = 0;
  bool check = false;
};

// RunStep's StepReport without a micro-batch's window.
struct PreparedStepOutcome {
  bool stepped = false;
  bool found_inf = false;
  bool has_grad_norm = false;
  double grad_norm = 0.0;
};

struct PreparedStepAbi {
  const void* step = nullptr;  // the _C.PreparedStep
  // Runs it. False where the engine refused the call, which it does before touching any buffer:
  // the caller then takes the ordinary path, which raises the error as a ValueError.
  bool (*run)(const void* step, const PreparedStepCall& call,
              PreparedStepOutcome& outcome) noexcept = nullptr;
};

// The name of the capsule _C.PreparedStep.capsule() returns, holding a PreparedStepAbi*.
inline constexpr const char* kPreparedStepCapsule = "fusedopt._C.PreparedStep";

}  // namespace fusedopt
