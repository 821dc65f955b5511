// What the C++ examples of README.md and docs/*.md may use without declaring it (docs/testing.md):
// the generated tests/docs blocks include this first. Each block runs once, in document order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "fusedopt/distributed.h"
#include "fusedopt/hyper.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/scaler.h"
#include "fusedopt/schedule.h"
#include "fusedopt/step.h"

namespace doc_prelude {
inline std::size_t failures = 0;
inline std::function<void()> before_each;  // a prelude's fresh start for every block
}  // namespace doc_prelude

// The Optimizer layer's examples: one AdamW group, two tensors.
inline std::vector<fusedopt::AdamWHyper> groups = {{.lr = 1e-3}};
inline std::vector<fusedopt::TensorSpec> tensors = {{.numel = 4096}, {.numel = 64}};
inline std::int64_t updates = 0;  // updates taken so far (schedules)

// The raw step's examples: n elements of bf16 params and grads, f32 moments, at step t.
inline std::size_t n = 1000;
inline std::vector<std::uint16_t> param_storage(n, 0x3F80), grad_storage(n, 0x3C00);  // 1.0, 0.0078
inline std::vector<float> m_storage(n), v_storage(n);
inline void* p = param_storage.data();
inline const void* g = grad_storage.data();
inline void* m = m_storage.data();
inline void* v = v_storage.data();
inline std::int64_t t = 1;

// Runs one block; a block that throws is reported and counted.
template <class Block>
void Run(const char* name, Block block) {
  try {
    if (doc_prelude::before_each) doc_prelude::before_each();
    block();
    std::printf("ok      %s\n", name);
  } catch (const std::exception& e) {
    std::printf("FAILED  %s: %s\n", name, e.what());
    ++doc_prelude::failures;
  }
}

inline int Finish() {
  std::printf("%zu failed\n", doc_prelude::failures);
  return doc_prelude::failures == 0 ? 0 : 1;
}
