// One leg of tests/python/test_checkpoint_interop.py's libtorch test: a libtorch model and a
// fusedopt::pt optimizer start fresh or from a checkpoint with a model (this program's, or
// fusedopt.save_checkpoint's), train on known batches, and save the model and optimizer.
//
//   checkpoint_interop_pt adamw|sgd|lion|nadam[:q8|:sr|:acc|:acc64] STEPS OUT [IN]
//
// ":q8": 8-bit states (training().state_dtype uint8) for the params of at least 10 elements (the
// two weights; the biases keep f32 states). ":sr": the model in bf16 (its states too, by torch's
// rule), stepped with stochastic rounding (training().stochastic_rounding, rounding_seed 7); the
// batches rounded to bf16. ":acc": training().accumulation_steps 5, each batch one micro-batch (a
// leg may end inside a window: the checkpoint keeps it). ":acc64": the same with the model in
// float64, whose params take torch::optim's own step on sums kept in torch.
// Model: Sequential(Linear(6, 5), Tanh, Linear(5, 3)), its params' elements (in the order of
// parameters()) set from Value(1, i) when starting fresh. Step k's batch: x (4 × 6) = Value(2000 +
// k, i), target (4 × 3) = Value(3000 + k, i), loss mse_loss(model(x), target). The file's counter
// "steps" says how many came before. One thread (the Python leg runs the same ops on one).

#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "fusedopt/pt/checkpoint.h"
#include "fusedopt/pt/optim.h"
#include "tests/test_support.h"

namespace {

torch::Tensor Values(unsigned seed, std::int64_t rows, std::int64_t cols) {
  torch::Tensor t = torch::empty({rows, cols});
  float* data = t.data_ptr<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    data[i] = fusedopt::test::HashedValue(seed, static_cast<std::size_t>(i));
  }
  return t;
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::string& name,
                                                       const std::vector<torch::Tensor>& params) {
  namespace pt = fusedopt::pt;
  if (name == "adamw") {
    return std::make_unique<pt::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  }
  if (name == "sgd") {
    return std::make_unique<pt::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  if (name == "lion") return std::make_unique<pt::Lion>(params, pt::LionOptions(1e-3));
  if (name == "nadam") return std::make_unique<pt::NAdam>(params, pt::NAdamOptions(1e-2));
  throw std::invalid_argument("unknown optimizer " + name);
}

// The training() options of every fusedopt::pt class, through the one they all derive from.
fusedopt::pt::TrainingOptions& TrainingOf(torch::optim::Optimizer& opt) {
  return dynamic_cast<fusedopt::pt::FusedStepOptions&>(opt).training();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s adamw|sgd|lion|nadam[:q8|:sr|:acc|:acc64] STEPS OUT [IN]\n",
                 argv[0]);
    return 2;
  }
  try {
    torch::set_num_threads(1);
    torch::nn::Sequential model(torch::nn::Linear(6, 5), torch::nn::Tanh(),
                                torch::nn::Linear(5, 3));
    const std::string name = argv[1];
    const bool q8 = name.ends_with(":q8");
    const bool sr = name.ends_with(":sr");
    const bool f64 = name.ends_with(":acc64");
    const torch::Dtype dtype = sr ? torch::kBFloat16 : f64 ? torch::kDouble : torch::kFloat;
    const std::unique_ptr<torch::optim::Optimizer> opt =
        MakeOptimizer(name.substr(0, name.find(':')), model->parameters());
    if (q8) {
      TrainingOf(*opt).state_dtype = torch::kUInt8;
      TrainingOf(*opt).min_8bit_size = 10;
    }
    if (name.ends_with(":acc") || f64) TrainingOf(*opt).accumulation_steps = 5;
    if (sr) {
      TrainingOf(*opt).stochastic_rounding = true;
      TrainingOf(*opt).rounding_seed = 7;
    }
    std::int64_t done = 0;
    // (Module::to converts in place: the optimizer's params stay the model's)
    if (argc == 5) {
      model->to(dtype);
      done = fusedopt::pt::LoadCheckpoint(*opt, argv[4], {.model = model.get()}).at("steps");
    } else {
      torch::NoGradGuard no_grad;
      std::size_t i = 0;
      for (torch::Tensor& p : model->parameters()) {
        float* data = p.data_ptr<float>();
        for (std::int64_t k = 0; k < p.numel(); ++k) data[k] = fusedopt::test::HashedValue(1, i++);
      }
      model->to(dtype);
    }
    for (int k = 0; k < std::stoi(argv[2]); ++k, ++done) {
      const auto seed = static_cast<unsigned>(done);
      const torch::Tensor loss = torch::mse_loss(
          model->forward(Values(2000 + seed, 4, 6).to(dtype)), Values(3000 + seed, 4, 3).to(dtype));
      loss.backward();
      opt->step();
      opt->zero_grad();
    }
    fusedopt::pt::SaveCheckpoint(*opt, argv[3],
                                 {.model = model.get(), .counters = {{"steps", done}}});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_interop_pt: %s\n", e.what());
    return 1;
  }
}
