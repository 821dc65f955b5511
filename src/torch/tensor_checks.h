// The torch side of a fused step: checks that a param, its grad and its state tensors can be
// buffers of one fusedopt::Segment, and maps torch dtypes to the core's. Every failed check is a
// TORCH_CHECK (c10::Error) naming the optimizer, the param (param_groups[g].params[i]) and what is
// wrong with it, raised before the step writes anything.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fusedopt/dtype.h"
#include "fusedopt/quantize.h"

namespace fusedopt::pt::detail {

// Where a param sits in its optimizer: torch's C++ params have no names.
struct ParamName {
  std::size_t group = 0;
  std::size_t index = 0;
};
std::string ToString(const ParamName& name);

// The core's dtype for float32, float16 and bfloat16 tensors, and uint8 states' kQ8 (callers check
// support first).
DType ToDType(at::ScalarType t);
inline DType ToDType(const at::Tensor& t) { return ToDType(t.scalar_type()); }

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

// The dtype p's states are kept in (TrainingOptions::state_dtype, `option`): the option's, kByte
// for 8-bit codes (tensors of at least min_8bit_size elements; p's dtype for the smaller), p's own
// without one. The caller checked the option (CheckStateDType).
at::ScalarType StateDTypeOf(std::optional<at::ScalarType> option, std::size_t min_8bit_size,
                            const at::Tensor& p);

// TrainingOptions::state_dtype is float32, float16, bfloat16, or uint8 where the algorithm's states
// can be 8-bit (`quantizable`), or unset.
void CheckStateDType(std::string_view optimizer, std::optional<at::ScalarType> option,
                     bool quantizable);

// A state of p as the step reads and writes it: `values` in the state's dtype, and for 8-bit codes
// (uint8) their absmax, one f32 per block of kQuantBlock elements.
struct StateBuffers {
  at::Tensor values;
  at::Tensor absmax;
};

// A state tensor (torch state key `key`, `absmax` its absmax if it holds 8-bit codes) of p, as the
// step needs it in `dtype`: as many elements as p, on the CPU, contiguous. Float states of another
// dtype or layout (e.g. loaded from a checkpoint of an f32 model into a bf16 one) are converted, as
// torch's load_state_dict casts them. 8-bit codes need their absmax (NumQuantBlocks(numel)
// values); they are kept for dtype kByte and dequantized (map `map`) for a float dtype, and a float
// state is quantized block by block for kByte.
StateBuffers CheckedState(std::string_view optimizer, const ParamName& name, std::string_view key,
                          const at::Tensor& p, const at::Tensor& state, const at::Tensor& absmax,
                          QuantMap map, at::ScalarType dtype);

// A new state of p filled with `value`, in `dtype` (kByte: codes and absmax, QuantizeFill).
StateBuffers FreshState(const at::Tensor& p, float value, QuantMap map, at::ScalarType dtype);

// A state tensor of another shape than p's (Adafactor's row_var and col_var): `shape` exactly, on
// the CPU, dense and floating-point; returned contiguous and in `dtype` (converted as above).
at::Tensor CheckedShapedState(std::string_view optimizer, const ParamName& name,
                              std::string_view key, const at::Tensor& p, const at::Tensor& state,
                              at::IntArrayRef shape, at::ScalarType dtype);

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
