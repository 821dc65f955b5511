// Host-side coefficients of each update rule: computed in double from the group's hyper-parameters
// and the tensor's step, then rounded to f32 once, where torch.optim rounds its Python-float
// scalars.
#pragma once

#include "fusedopt/hyper.h"
#include "fusedopt/step.h"
#include "src/math/scalars.h"

namespace fusedopt {

// Each takes the segment for its step count and grad_scale.
SgdScalars MakeSgdScalars(const SgdHyper& h, const Segment& s);
AdamScalars MakeAdamScalars(const AdamHyper& h, const Segment& s);
RmspropScalars MakeRmspropScalars(const RmspropHyper& h, const Segment& s);
AdagradScalars MakeAdagradScalars(const AdagradHyper& h, const Segment& s);

}  // namespace fusedopt
