// The torch side of a fused step: checks that a param, its grad and its state tensors can be
// buffers of one fusedopt::Segment, and maps torch dtypes to the core's. Every failed check is a
// TORCH_CHECK (c10::Error) naming the optimizer, the param (param_groups[g].params[i]) and what is
// wrong with it, raised before the step writes anything.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "fusedopt/dtype.h"

namespace fusedopt::pt::detail {

// Where a param sits in its optimizer: torch's C++ params have no names.
struct ParamName {
  std::size_t group = 0;
  std::size_t index = 0;
};
std::string ToString(const ParamName& name);

// The core's dtype for float32, float16 and bfloat16 tensors (callers check support first).
DType ToDType(const at::Tensor& t);

// p can be updated in place as one flat buffer: CPU, strided, contiguous, f32/f16/bf16.
void CheckParam(std::string_view optimizer, const ParamName& name, const at::Tensor& p);

// Why the fused step cannot take p (with its defined grad) — what CheckParam or CheckedGrad would
// reject, but for a grad whose shape differs from p's (an error on either path) — or "" if it
// can. A sparse grad is a reason only where the reference step takes one (`sparse_ok`).
std::string RouteReason(const at::Tensor& p, bool sparse_ok);

// p's grad as a buffer the step can read: dense, on the CPU, p's shape, f32/f16/bf16. A strided but
// non-contiguous grad (a user-assigned view) is returned as a contiguous copy, since the step only
// reads it; the caller keeps the copy alive until the step is done.
at::Tensor CheckedGrad(std::string_view optimizer, const ParamName& name, const at::Tensor& p);

// A state tensor (torch state key `key`) of p, as the step needs it: same number of elements as p,
// on the CPU, contiguous and in p's dtype. A state of another float dtype or layout (e.g. loaded
// from a checkpoint of an f32 model into a bf16 one) is converted, as torch's load_state_dict casts
// state to the param's dtype.
at::Tensor CheckedState(std::string_view optimizer, const ParamName& name, std::string_view key,
                        const at::Tensor& p, const at::Tensor& state);

// A state tensor of another shape than p's (Adafactor's row_var and col_var): `shape` exactly, on
// the CPU, dense and floating-point; returned contiguous and in p's dtype (converted as above).
at::Tensor CheckedShapedState(std::string_view optimizer, const ParamName& name,
                              std::string_view key, const at::Tensor& p, const at::Tensor& state,
                              at::IntArrayRef shape);

// A scalar state (torch state key `key`, e.g. NAdam's mu_product) of p as the step needs it: one
// element on the CPU, as a 0-d float32 tensor (converted from another float dtype or shape, as
// torch's load_state_dict casts it).
at::Tensor CheckedScalar(std::string_view optimizer, const ParamName& name, std::string_view key,
                         const at::Tensor& scalar);

// No two stepped params share memory: the core updates segments in parallel and requires disjoint
// buffers (a param listed twice, or two overlapping views, would be updated twice in a race).
void CheckDisjoint(std::string_view optimizer, std::span<const at::Tensor> params,
                   std::span<const ParamName> names);

}  // namespace fusedopt::pt::detail
