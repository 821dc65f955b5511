// One leg of tests/python/test_checkpoint_interop.py: a core Optimizer run that starts fresh or
// from a checkpoint (any writer's: this program's or fusedopt.save_checkpoint's), takes
// micro-batches of known gradients and saves a checkpoint.
//
//   checkpoint_interop ALGO f32|bf16|q8|sr MICRO_BATCHES OUT [IN]
//
// Tensors: 300 elements and a 12 × 10 matrix in group 0, 7 elements in group 1 (half the lr);
// params, with momentum 0.9 and weight_decay 0.01 where the algorithm has them. bf16: bf16 params
// and grads, f32 master copies and states (the Python classes' policy with master_weights). q8:
// f32 params, 8-bit states for the tensors of at least 100 elements (the Python classes'
// state_dtype=torch.uint8 with min_8bit_size=100). sr: bf16 params, grads and states without a
// master copy, stored with stochastic rounding (seed 7; the Python classes' stochastic_rounding).
// Micro-batch k's gradient element i of a tensor at flat offset o is Value(1000 + k, o + i) (the
// test computes the same values); the file's counter "micro_batches" says how many came before.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "src/algos/registry.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

float Value(unsigned seed, std::size_t i) { return test::HashedValue(seed, i); }

template <class Hyper>
int Run(const std::string& precision, int micro_batches, const std::string& out, const char* in) {
  Hyper h;
  if constexpr (requires { h.momentum; }) h.momentum = 0.9;
  if constexpr (requires { h.weight_decay; }) h.weight_decay = 0.01;
  Hyper h1 = h;
  h1.lr = h.lr * 0.5;
  TensorSpec matrix{.numel = 120};
  if constexpr (std::is_same_v<Hyper, AdampHyper>) matrix.rows = 12;
  if constexpr (std::is_same_v<Hyper, AdafactorHyper>) matrix.rows = 12, matrix.cols = 10;
  StorageOptions storage;
  if (precision == "bf16") {
    storage = {.param_dtype = DType::kBF16, .grad_dtype = DType::kBF16, .master_weights = true};
  } else if (precision == "q8") {
    storage = {.state_dtype = DType::kQ8, .min_8bit_size = 100};
  } else if (precision == "sr") {
    storage = {.param_dtype = DType::kBF16,
               .grad_dtype = DType::kBF16,
               .state_dtype = DType::kBF16,
               .stochastic_rounding = true,
               .rounding_seed = 7};
  }
  Optimizer<Hyper> opt({h, h1}, {{.numel = 300}, matrix, {.numel = 7, .group = 1}}, storage);
  std::int64_t done = 0;
  if (in != nullptr) {
    done = LoadCheckpoint(opt, in).at("micro_batches");
  } else {
    for (const Segment& s : opt.storage().segments()) {
      for (std::size_t i = 0; i < s.numel; ++i) {
        StoreFromF32(s.param, s.param_dtype, i, Value(1, s.global_offset + i));
      }
    }
  }
  for (int k = 0; k < micro_batches; ++k, ++done) {
    for (const Segment& s : opt.storage().segments()) {
      for (std::size_t i = 0; i < s.numel; ++i) {
        StoreFromF32(const_cast<void*>(s.grad), s.grad_dtype, i,
                     Value(1000 + static_cast<unsigned>(done), s.global_offset + i));
      }
    }
    opt.Step();
  }
  SaveCheckpoint(opt, out, nullptr, {{"micro_batches", done}});
  return 0;
}

}  // namespace
}  // namespace fusedopt

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s ALGO f32|bf16|q8|sr MICRO_BATCHES OUT [IN]\n", argv[0]);
    return 2;
  }
  const std::string algo = argv[1];
  try {
    int rc = 2;
    bool found = false;
    fusedopt::algos::All::ForEach([&](auto d) {
      using D = typename decltype(d)::type;
      if (algo != D::kName) return;
      found = true;
      rc = fusedopt::Run<typename D::Hyper>(argv[2], std::stoi(argv[3]), argv[4],
                                            argc == 6 ? argv[5] : nullptr);
    });
    if (!found) std::fprintf(stderr, "unknown algorithm %s\n", algo.c_str());
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_interop: %s\n", e.what());
    return 1;
  }
}
