// Host-side coefficients of each update rule: computed in double from the group's hyper-parameters
// and the tensor's step, then rounded to f32 once, where torch.optim rounds its Python-float
// scalars.
#pragma once

#include <cstdint>

#include "fusedopt/hyper.h"
#include "src/math/scalars.h"

namespace fusedopt {

SgdScalars MakeSgdScalars(const SgdHyper& h, std::int64_t step);
AdamScalars MakeAdamScalars(const AdamHyper& h, std::int64_t step);
RmspropScalars MakeRmspropScalars(const RmspropHyper& h);
AdagradScalars MakeAdagradScalars(const AdagradHyper& h, std::int64_t step);

}  // namespace fusedopt
