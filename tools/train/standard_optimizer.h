// The reference's for-loop step of any algorithm of the engine, in libtorch: the descriptor's
// StandardStep (src/algos/<algo>.h: torch.optim's _single_tensor_<algo>, lion-pytorch or
// tools/lamb_reference.py, one tensor op per line) run as ATen ops on each param in turn, one
// dispatch and one pass over memory per op, as torch.optim's for-loop runs them. `fusedopt train`
// times it as the `torch` impl of the algorithms that libtorch has no torch::optim class for.
//
// Its state is fusedopt::pt's generic param state (HyperParamState: torch's keys, tensors in the
// param's dtype, the step count); it keeps no scalar states, since StandardStep rebuilds them from
// the step count (NAdam's mu_product), as the doctor and the `standard` baseline do.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "fusedopt/pt/optim.h"
#include "src/algos/registry.h"

namespace fusedopt::train {

// StandardStep's tensor handle for one param: ATen ops under torch's names (descriptor.h lists the
// vocabulary). Scalars reach ATen as doubles, which rounds them once for an f32 tensor, as a Python
// float does.
// NOLINTBEGIN(readability-identifier-naming)
template <class State>
class AtenOps {
 public:
  AtenOps(const at::Tensor& param, State& state) : param_(param), state_(state) {}

  std::int64_t step() const { return state_.step(); }
  at::Tensor param() const { return param_; }
  at::Tensor grad() const { return param_.grad(); }
  at::Tensor state(int slot) const { return state_.tensors[slot]; }
  // A factored step's (descriptor.h): the state was made in its shape (StandardOptimizer::step).
  at::Tensor state(int slot, algos::Shape /*shape*/) const { return state_.tensors[slot]; }
  bool matrices() const { return param_.dim() > 1; }
  std::size_t size(int dim) const { return static_cast<std::size_t>(param_.size(dim)); }

  at::Tensor mul_(const at::Tensor& x, double s) const { return x.mul_(s); }
  at::Tensor mul_(const at::Tensor& x, const at::Tensor& b) const { return x.mul_(b); }
  at::Tensor div_(const at::Tensor& x, const at::Tensor& b) const { return x.div_(b); }
  at::Tensor div_(const at::Tensor& x, double s) const { return x.div_(s); }
  at::Tensor square_(const at::Tensor& x) const { return x.square_(); }
  at::Tensor rsqrt_(const at::Tensor& x) const { return x.rsqrt_(); }
  at::Tensor add_(const at::Tensor& x, double s) const { return x.add_(s); }
  at::Tensor add_(const at::Tensor& x, const at::Tensor& b, double alpha) const {
    return x.add_(b, alpha);
  }
  at::Tensor lerp_(const at::Tensor& x, const at::Tensor& b, double w) const {
    return x.lerp_(b, w);
  }
  at::Tensor addcmul_(const at::Tensor& x, const at::Tensor& b, const at::Tensor& c,
                      double value) const {
    return x.addcmul_(b, c, value);
  }
  at::Tensor addcdiv_(const at::Tensor& x, const at::Tensor& b, const at::Tensor& c,
                      double value) const {
    return x.addcdiv_(b, c, value);
  }
  at::Tensor sqrt_(const at::Tensor& x) const { return x.sqrt_(); }
  at::Tensor sgn_(const at::Tensor& x) const { return x.sgn_(); }
  at::Tensor copy_(const at::Tensor& x, const at::Tensor& a) const { return x.copy_(a); }
  at::Tensor clamp_(const at::Tensor& x, double lo, double hi) const { return x.clamp_(lo, hi); }
  // x[c.gt(threshold)] = value (kLt: c.lt, kEq: c.eq), as torch's masked assignment.
  at::Tensor masked_fill_(const at::Tensor& x, const at::Tensor& c, algos::Compare compare,
                          double threshold, double value) const {
    const at::Tensor mask = compare == algos::Compare::kGt   ? c.gt(threshold)
                            : compare == algos::Compare::kLt ? c.lt(threshold)
                                                             : c.eq(threshold);
    return x.masked_fill_(mask, value);
  }
  at::Tensor maximum(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) const {
    at::Tensor result = out;
    return at::maximum_out(result, a, b);
  }

  at::Tensor neg(const at::Tensor& a) const { return a.neg(); }
  at::Tensor abs(const at::Tensor& a) const { return a.abs(); }
  at::Tensor sign(const at::Tensor& a) const { return a.sign(); }
  at::Tensor reciprocal(const at::Tensor& a) const { return a.reciprocal(); }
  at::Tensor clone(const at::Tensor& a) const { return a.clone(); }
  at::Tensor mul(const at::Tensor& a, double s) const { return a.mul(s); }
  at::Tensor mul(const at::Tensor& a, const at::Tensor& b) const { return a.mul(b); }
  at::Tensor div(const at::Tensor& a, double s) const { return a.div(s); }
  at::Tensor div(const at::Tensor& a, const at::Tensor& b) const { return a.div(b); }
  at::Tensor add(const at::Tensor& a, double s) const { return a.add(s); }
  at::Tensor add(const at::Tensor& a, const at::Tensor& b, double alpha) const {
    return a.add(b, alpha);
  }
  at::Tensor sqrt(const at::Tensor& a) const { return a.sqrt(); }
  at::Tensor addcmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                     double value) const {
    return a.addcmul(b, c, value);
  }

  double norm(const at::Tensor& a) const { return at::linalg_vector_norm(a).item<double>(); }
  // torch.norm(a, dim=dim, keepdim=True), a.mean(dim=dim, keepdim=True), a @ b
  at::Tensor norm(const at::Tensor& a, int dim) const { return at::norm(a, 2, {dim}, true); }
  at::Tensor mean(const at::Tensor& a, int dim) const { return a.mean({dim}, true); }
  at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) const { return at::matmul(a, b); }

  // The row ops (descriptor.h) over a tensor's view(rows, -1), as clovaai's AdamP runs them: rows
  // is the param's size(0) when it has more than one dimension, else 0 (never projected).
  std::size_t rows() const {
    return param_.dim() > 1 ? static_cast<std::size_t>(param_.size(0)) : 0;
  }
  std::size_t numel() const { return static_cast<std::size_t>(param_.numel()); }
  std::vector<double> row_norms(const at::Tensor& a, std::size_t rows) const {
    return Doubles(at::linalg_vector_norm(Rows(a, rows), 2, {1}));
  }
  std::vector<double> row_sums(const at::Tensor& a, std::size_t rows) const {
    return Doubles(Rows(a, rows).sum(1));
  }
  at::Tensor div_rows(const at::Tensor& a, const std::vector<double>& values) const {
    return Rows(a, values.size()).div(Column(values)).view(a.sizes());
  }
  at::Tensor mul_rows(const at::Tensor& a, const std::vector<double>& values) const {
    return Rows(a, values.size()).mul(Column(values)).view(a.sizes());
  }

 private:
  static at::Tensor Rows(const at::Tensor& a, std::size_t rows) {
    return a.reshape({static_cast<std::int64_t>(rows), -1});
  }
  // values as an f32 column (rows × 1), which broadcasts over each row
  static at::Tensor Column(const std::vector<double>& values) {
    const std::vector<float> f(values.begin(), values.end());
    return at::tensor(f).unsqueeze(1);
  }
  static std::vector<double> Doubles(const at::Tensor& t) {
    const at::Tensor d = t.to(at::kDouble).contiguous();
    return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
  }

  at::Tensor param_;
  State& state_;
};
// NOLINTEND(readability-identifier-naming)

template <class Hyper>
class StandardOptimizer : public torch::optim::Optimizer {
 public:
  using Descriptor = algos::DescriptorOf<Hyper>;
  using Options = pt::HyperOptions<Hyper>;
  using State = pt::HyperParamState<Hyper>;

  StandardOptimizer(std::vector<torch::Tensor> params, const Hyper& hyper)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<Options>(hyper)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    at::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const Hyper& hyper = static_cast<const Options&>(group.options()).hyper();
      // The params that have a grad, each with its state, its step count advanced first.
      std::vector<std::pair<at::Tensor, State*>> stepped;
      for (const at::Tensor& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state()[p.unsafeGetTensorImpl()];
        if (slot == nullptr) {
          auto fresh = std::make_unique<State>();
          for (int k = 0; k < kMaxStates; ++k) {
            if ((SlotsOf(p, hyper) >> k & 1u) != 0) {
              fresh->tensors[k] = at::full(StateSizes(p, k), Descriptor::InitialState(hyper, k),
                                           p.options().memory_format(at::MemoryFormat::Contiguous));
            }
          }
          slot = std::move(fresh);
        }
        auto& s = static_cast<State&>(*slot);
        s.step(s.step() + 1);
        stepped.emplace_back(p, &s);
      }
      Params visitor{stepped};
      Descriptor::StandardStep(hyper, algos::StandardOptions{}, visitor);
    }
    return loss;
  }

 private:
  // The state slots of param p: a factored algorithm's depend on its shape (SegmentStates: row_var
  // and col_var for more than one dimension, else variance), as torch's _init_group makes them.
  static unsigned SlotsOf(const at::Tensor& p, const Hyper& hyper) {
    if constexpr (algos::Factored<Descriptor>) {
      Segment s{};
      s.rows = p.dim() > 1 ? static_cast<std::size_t>(p.size(-2)) : 0;
      s.cols = p.dim() > 1 ? static_cast<std::size_t>(p.size(-1)) : 0;
      return Descriptor::SegmentStates(s) & Descriptor::RequiredStates(hyper);
    } else {
      return Descriptor::RequiredStates(hyper);
    }
  }
  // Slot k's sizes: the param's, with the dims its kStateShapes reduces set to 1.
  static std::vector<std::int64_t> StateSizes(const at::Tensor& p, int k) {
    std::vector<std::int64_t> sizes(p.sizes().begin(), p.sizes().end());
    if constexpr (algos::Factored<Descriptor>) {
      const auto bits = static_cast<unsigned>(Descriptor::kStateShapes[k]);
      if (p.dim() > 1 && (bits & 1u) != 0) sizes[sizes.size() - 1] = 1;
      if (p.dim() > 1 && (bits & 2u) != 0) sizes[sizes.size() - 2] = 1;
    }
    return sizes;
  }

  // StandardStep's `step`: the group's params in order.
  struct Params {
    std::vector<std::pair<at::Tensor, State*>>& stepped;
    template <class F>
    void ForEachTensor(F&& f) const {
      for (auto& [p, s] : stepped) {
        AtenOps<State> t(p, *s);
        f(t);
      }
    }
  };
};

}  // namespace fusedopt::train
