// Fits y = 3x − 1 with fusedopt's AdamW, fp32 params in one flat arena (docs/cpp-api.md's example).

#include <cstdio>
#include <span>

#include "fusedopt/optimizer.h"

int main() {  // NOLINT(bugprone-exception-escape): an error ends the example with its message
  // Two tensors (a weight and a bias) in one parameter group.
  fusedopt::AdamW opt({fusedopt::AdamWHyper{.lr = 0.05, .weight_decay = 0.0}},
                      {{.numel = 1}, {.numel = 1}});
  std::span<float> w = opt.storage().params<float>(0);
  std::span<float> b = opt.storage().params<float>(1);
  for (int step = 0; step < 500; ++step) {
    opt.ZeroGrad();
    // Mean squared error over x in {-1, -0.5, 0, 0.5, 1}: write dL/dw and dL/db into the grad
    // arena.
    std::span<float> dw = opt.storage().grads<float>(0);
    std::span<float> db = opt.storage().grads<float>(1);
    for (float x : {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f}) {
      const float err = w[0] * x + b[0] - (3.0f * x - 1.0f);
      dw[0] += 2.0f * err * x / 5.0f;
      db[0] += 2.0f * err / 5.0f;
    }
    opt.Step();  // one fused pass over every tensor
  }
  std::printf("w = %.4f (want 3), b = %.4f (want -1)\n", w[0], b[0]);
  return (w[0] > 2.99f && w[0] < 3.01f && b[0] > -1.01f && b[0] < -0.99f) ? 0 : 1;
}
