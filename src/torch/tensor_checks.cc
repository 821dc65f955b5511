// Checks of the tensors a fused step reads and writes (see tensor_checks.h).

#include "src/torch/tensor_checks.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace fusedopt::pt::detail {
namespace {

bool SupportedDType(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

}  // namespace

std::string ToString(const ParamName& name) {
  return "param_groups[" + std::to_string(name.group) + "].params[" + std::to_string(name.index) +
         "]";
}

DType ToDType(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kByte:
      return DType::kQ8;
    default:
      return DType::kF32;
  }
}

at::ScalarType StateDTypeOf(std::optional<at::ScalarType> option, std::size_t min_8bit_size,
                            const at::Tensor& p) {
  if (!option) return p.scalar_type();
  // bitsandbytes' policy: small tensors (biases, norms) keep full states; they cost little memory.
  if (*option == at::kByte && static_cast<std::size_t>(p.numel()) < min_8bit_size) {
    return p.scalar_type();
  }
  return *option;
}

void CheckStateDType(std::string_view optimizer, std::optional<at::ScalarType> option,
                     bool quantizable) {
  if (!option) return;
  TORCH_CHECK(SupportedDType(*option) || *option == at::kByte, optimizer,
              ": invalid training().state_dtype ", *option,
              "; supported dtypes are float32, float16, bfloat16 and uint8 (8-bit states)");
  TORCH_CHECK(*option != at::kByte || quantizable, optimizer,
              ": training().state_dtype uint8 (8-bit block-wise states) is not for this "
              "algorithm: it sums rows of tensors (AdamP) or keeps factored states (Adafactor)");
}

void CheckParam(std::string_view optimizer, const ParamName& name, const at::Tensor& p) {
  TORCH_CHECK(p.device().is_cpu(), optimizer, ": ", ToString(name), " is on ", p.device(),
              "; fusedopt::pt steps CPU tensors only");
  TORCH_CHECK(p.layout() == at::kStrided, optimizer, ": ", ToString(name), " has layout ",
              p.layout(), "; only dense (strided) params are supported");
  TORCH_CHECK(SupportedDType(p.scalar_type()), optimizer, ": ", ToString(name), " has dtype ",
              p.scalar_type(), "; supported dtypes are float32, float16 and bfloat16");
  // The step walks each param as one flat array, so its elements must be densely packed in order.
  TORCH_CHECK(p.is_contiguous(), optimizer, ": ", ToString(name), " is not contiguous (sizes ",
              p.sizes(), ", strides ", p.strides(),
              "); the fused step updates each param as one flat buffer (make the param "
              "contiguous before creating the optimizer)");
}

std::string RouteReason(const at::Tensor& p, bool sparse_ok) {
  std::ostringstream why;
  const at::Tensor& grad = p.grad();
  if (!p.device().is_cpu()) {
    why << "it is on " << p.device();
  } else if (p.layout() != at::kStrided) {
    why << "it has layout " << p.layout();
  } else if (!SupportedDType(p.scalar_type())) {
    why << "its dtype is " << p.scalar_type();
  } else if (!p.is_contiguous()) {
    why << "it is not contiguous (strides " << p.strides() << ")";
  } else if (grad.is_sparse() && sparse_ok) {
    why << "its gradient is sparse";
  } else if (!grad.is_sparse() && grad.layout() == at::kStrided &&
             (!grad.device().is_cpu() || !SupportedDType(grad.scalar_type()))) {
    why << "its gradient has dtype " << grad.scalar_type() << " on " << grad.device();
  }
  return why.str();
}

at::Tensor CheckedGrad(std::string_view optimizer, const ParamName& name, const at::Tensor& p) {
  const at::Tensor& grad = p.grad();
  TORCH_CHECK(!grad.is_sparse() && grad.layout() == at::kStrided, optimizer, ": ", ToString(name),
              " has a sparse gradient (layout ", grad.layout(),
              "); fusedopt::pt optimizers do not support sparse gradients");
  TORCH_CHECK(grad.device().is_cpu(), optimizer, ": the gradient of ", ToString(name), " is on ",
              grad.device(), "; fusedopt::pt steps CPU tensors only");
  TORCH_CHECK(SupportedDType(grad.scalar_type()), optimizer, ": the gradient of ", ToString(name),
              " has dtype ", grad.scalar_type(),
              "; supported dtypes are float32, float16 and bfloat16");
  TORCH_CHECK(grad.sizes() == p.sizes(), optimizer, ": the gradient of ", ToString(name),
              " has shape ", grad.sizes(), " but the param has shape ", p.sizes());
  return grad.contiguous();
}

StateBuffers CheckedState(std::string_view optimizer, const ParamName& name, std::string_view key,
                          const at::Tensor& p, const at::Tensor& state, const at::Tensor& absmax,
                          QuantMap map, at::ScalarType dtype) {
  TORCH_CHECK(state.device().is_cpu(), optimizer, ": state '", key, "' of ", ToString(name),
              " is on ", state.device(), "; fusedopt::pt steps CPU tensors only");
  const bool codes = state.scalar_type() == at::kByte;
  TORCH_CHECK(state.layout() == at::kStrided && (state.is_floating_point() || codes), optimizer,
              ": state '", key, "' of ", ToString(name),
              " must be a dense floating-point tensor or 8-bit codes (uint8) (got ",
              state.scalar_type(), ", layout ", state.layout(), ")");
  TORCH_CHECK(state.numel() == p.numel(), optimizer, ": state '", key, "' of ", ToString(name),
              " has ", state.numel(), " elements but the param has ", p.numel(),
              " (was the optimizer state loaded from another model?)");
  const auto n = static_cast<std::size_t>(p.numel());
  if (!codes) {
    at::Tensor values = state.to(dtype == at::kByte ? at::kFloat : dtype).contiguous();
    if (dtype != at::kByte) return {values, {}};
    StateBuffers quantized{
        at::empty_like(state, state.options().dtype(at::kByte), at::MemoryFormat::Contiguous),
        at::empty({static_cast<std::int64_t>(NumQuantBlocks(n))},
                  state.options().dtype(at::kFloat))};
    Quantize(values.const_data_ptr<float>(), n, map, quantized.values.data_ptr<std::uint8_t>(),
             quantized.absmax.data_ptr<float>());
    return quantized;
  }
  const std::string absmax_key = std::string(key) + "_absmax";
  TORCH_CHECK(absmax.defined(), optimizer, ": state '", key, "' of ", ToString(name),
              " holds 8-bit codes (uint8) but '", absmax_key, "' (their absmax) is missing");
  TORCH_CHECK(
      absmax.device().is_cpu() && absmax.layout() == at::kStrided && absmax.is_floating_point() &&
          static_cast<std::size_t>(absmax.numel()) == NumQuantBlocks(n),
      optimizer, ": state '", absmax_key, "' of ", ToString(name), " must hold ", NumQuantBlocks(n),
      " floating-point values on the CPU, one per block of ", kQuantBlock, " codes (got ",
      absmax.scalar_type(), " of ", absmax.numel(), " elements on ", absmax.device(), ")");
  StateBuffers held{state.contiguous(), absmax.to(at::kFloat).contiguous()};
  if (held.absmax.dim() != 1) held.absmax = held.absmax.view({-1});
  if (dtype == at::kByte) return held;
  at::Tensor values =
      at::empty_like(state, state.options().dtype(at::kFloat), at::MemoryFormat::Contiguous);
  Dequantize(held.values.const_data_ptr<std::uint8_t>(), held.absmax.const_data_ptr<float>(), n,
             map, values.data_ptr<float>());
  return {values.to(dtype), {}};
}

StateBuffers FreshState(const at::Tensor& p, float value, QuantMap map, at::ScalarType dtype) {
  if (dtype != at::kByte) {
    return {at::full_like(p, value, p.options().dtype(dtype), at::MemoryFormat::Contiguous), {}};
  }
  const auto n = static_cast<std::size_t>(p.numel());
  StateBuffers fresh{
      at::empty_like(p, p.options().dtype(at::kByte), at::MemoryFormat::Contiguous),
      at::empty({static_cast<std::int64_t>(NumQuantBlocks(n))}, p.options().dtype(at::kFloat))};
  QuantizeFill(value, n, map, fresh.values.data_ptr<std::uint8_t>(),
               fresh.absmax.data_ptr<float>());
  return fresh;
}

at::Tensor CheckedShapedState(std::string_view optimizer, const ParamName& name,
                              std::string_view key, const at::Tensor& p, const at::Tensor& state,
                              at::IntArrayRef shape, at::ScalarType dtype) {
  TORCH_CHECK(state.device().is_cpu(), optimizer, ": state '", key, "' of ", ToString(name),
              " is on ", state.device(), "; fusedopt::pt steps CPU tensors only");
  TORCH_CHECK(state.layout() == at::kStrided && state.is_floating_point(), optimizer, ": state '",
              key, "' of ", ToString(name), " must be a dense floating-point tensor (got ",
              state.scalar_type(), ", layout ", state.layout(), ")");
  // The exact shape, not just the element count: a factor of a transposed or reshaped matrix can
  // have as many elements and would broadcast differently in torch's step.
  TORCH_CHECK(state.sizes() == shape, optimizer, ": state '", key, "' of ", ToString(name),
              " has shape ", state.sizes(), " but the param's shape ", p.sizes(), " needs ", shape,
              " (was the optimizer state loaded from another model?)");
  return state.to(dtype).contiguous();
}

at::Tensor CheckedScalar(std::string_view optimizer, const ParamName& name, std::string_view key,
                         const at::Tensor& scalar) {
  TORCH_CHECK(scalar.device().is_cpu() && scalar.layout() == at::kStrided &&
                  scalar.is_floating_point() && scalar.numel() == 1,
              optimizer, ": state '", key, "' of ", ToString(name),
              " must be a one-element floating-point CPU tensor (got ", scalar.scalar_type(),
              " of shape ", scalar.sizes(), " on ", scalar.device(), ")");
  return scalar.to(at::kFloat).reshape({}).contiguous();
}

void CheckDisjoint(std::string_view optimizer, std::span<const at::Tensor> params,
                   std::span<const ParamName> names) {
  // Sort the byte ranges by start address; then only neighbours can overlap.
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto begin = [&](std::size_t i) {
    return reinterpret_cast<std::uintptr_t>(params[i].const_data_ptr());
  };
  const auto end = [&](std::size_t i) { return begin(i) + params[i].nbytes(); };
  std::erase_if(order, [&](std::size_t i) { return params[i].numel() == 0; });
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return begin(a) < begin(b); });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t prev = order[k - 1];
    const std::size_t cur = order[k];
    TORCH_CHECK(begin(cur) >= end(prev), optimizer, ": ", ToString(names[prev]), " and ",
                ToString(names[cur]),
                " share memory (the same tensor given twice, or overlapping views); each param "
                "must appear once");
  }
}

}  // namespace fusedopt::pt::detail
