// The doctor's timing: the fused step, the same-traffic ceiling and the for-loop standard step
// (src/baselines) on buffers of the model's shapes, interleaved, as `fusedopt bench` times them.
#pragma once

#include <iosfwd>
#include <optional>

#include "src/doctor/checks.h"
#include "src/doctor/doctor.h"

namespace fusedopt::doctor {

struct Timings {
  double fused_ms = 0.0;
  double same_traffic_ms = 0.0;
  std::optional<double> standard_ms;
  int threads = 0;
};

// Times the fused step, same_traffic and, if asked, the for-loop standard step on buffers of the
// given shapes (grads in the param dtype, as torch), interleaved in rotating order after two
// warm-up rounds, as `fusedopt bench` does. With clip, fused and standard are the training-loop
// steps of src/baselines/pipeline.h (pre-pass + step; norms + clip + step) and same_traffic reads
// the grads once more; for a two-phase step (LAMB) it also reads what the reduction pass reads.
Timings Measure(const Model& m, const DoctorOptions& o, bool time_standard, std::ostream& progress);

}  // namespace fusedopt::doctor
