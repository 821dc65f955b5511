// The checks of TensorSpecs that FlatStorage and DistributedOptimizer share.
#pragma once

#include <cstddef>
#include <span>

#include "fusedopt/optimizer.h"

namespace fusedopt {

// Every tensor's group indexes the groups; rows divides numel; rows·cols divides it when cols is
// set. Throws fusedopt::Error prefixed by `who`.
void CheckTensorSpecs(const char* who, std::span<const TensorSpec> tensors, std::size_t num_groups);

}  // namespace fusedopt
