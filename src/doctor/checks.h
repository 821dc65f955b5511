// The doctor's options, checked once before anything is counted or timed: the arguments
// torch.optim itself rejects are rejected here too, naming the field, the option and the value.
#pragma once

#include <cstddef>
#include <string>

#include "fusedopt/dtype.h"
#include "src/baselines/standard.h"
#include "src/doctor/doctor.h"
#include "src/tool_util/algorithm.h"

namespace fusedopt::doctor {

// Throws std::invalid_argument "<field> (<option>): <what>".
[[noreturn]] void Bad(const std::string& field, const std::string& option, const std::string& what);

// Where DoctorOptions::numels come from, for messages.
inline constexpr const char* kNumelsSource =
    "--numels, --shapes or the trace's otherData.param_numels";

// Everything the op counts depend on, checked once (the arguments torch.optim itself rejects are
// rejected here too, naming the field and the value).
struct Model {
  tools::Algorithm algorithm;
  DType dtype;
  double weight_decay;
  std::size_t num_tensors;
  std::size_t numel;
};

// The options CountStandardOps, CountFusedOps and Diagnose share, checked: the algorithm, the
// dtype, the hyper-parameters and the tensors.
Model CheckedModel(const DoctorOptions& o);

// The hyper-parameters the doctor takes, given to every algorithm that has them; torch's defaults
// for the rest.
baselines::BenchHyper MakeHyper(const Model& m, const DoctorOptions& o);

// The states the fused step keeps under these hyper-parameters, as FlatStorage allocates them.
std::size_t FusedStates(const Model& m, const DoctorOptions& o);

// The buffers Measure allocates (param, grad and each state per element) fit in memory: checked
// before allocating, since the sizes come from the command line or a trace.
void CheckBuffersFit(const Model& m, const DoctorOptions& o);

// step_ms, optimizer_ms, threads and rounds.
void CheckStepOptions(const DoctorOptions& o);

}  // namespace fusedopt::doctor
