// fusedopt/checkpoint.h: SaveCheckpoint / LoadCheckpoint of the core Optimizer. For every
// algorithm of the registry, and every test-only one (tests/algos/registry.h): train, save, load
// into an optimizer built with other params and hyper-parameters, train on == the uninterrupted
// run, bit for bit (f32; bf16 params with f32 masters, bf16 states rounded stochastically, a loss
// scaler and clipping; mid accumulation window). And every refusal leaves the optimizer and the
// scaler bit-identical.

#include "fusedopt/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "fusedopt/quantize.h"
#include "src/algos/registry.h"
#include "tests/hyper_types.h"
#include "tests/test_support.h"
#ifdef FOPT_TEST_ALGORITHMS_DIR
#  include "tests/algos/registry.h"
#endif

namespace fusedopt {
namespace {

namespace fs = std::filesystem;

float Value(unsigned seed, std::size_t i) { return test::HashedValue(seed, i); }

// Two groups; numel 0, and a matrix where the algorithm reads its rows (per-row sums) or factors
// it.
template <class Hyper>
std::vector<TensorSpec> Tensors() {
  using Descriptor = algos::DescriptorOf<Hyper>;
  std::vector<TensorSpec> t = {{.numel = 300}, {.numel = 0}, {.numel = 7, .group = 1}};
  t.push_back({.numel = 240, .group = 1});
  if constexpr (algos::RowReductions<Descriptor>) t[3].rows = 12;
  if constexpr (algos::Factored<Descriptor>) {
    t[3].rows = 12;
    t[3].cols = 10;  // two 12 × 10 matrices
  }
  return t;
}

template <class Hyper>
std::vector<Hyper> Groups(double lr_scale) {
  Hyper h;
  if constexpr (requires { h.momentum; }) h.momentum = 0.9;
  if constexpr (requires { h.weight_decay; }) h.weight_decay = 0.01;
  if constexpr (requires { h.amsgrad; }) h.amsgrad = true;
  h.lr *= lr_scale;
  Hyper h2 = h;
  h2.lr = h.lr * 0.5;
  return {h, h2};
}

struct Variant {
  const char* name;
  StorageOptions storage;
  bool scaler = false;  // a loss scaler and clipping
};

std::vector<Variant> Variants() {
  return {{"f32", {}},
          {"bf16 masters, stochastic rounding, scaler",
           {.param_dtype = DType::kBF16,
            .state_dtype = DType::kBF16,
            .master_weights = true,
            .stochastic_rounding = true,
            .rounding_seed = 5},
           true},
          {"accumulation 3", {.accumulation_steps = 3}, true},
          // The 300-element tensor 8-bit (two blocks, the second partial), the others f32.
          {"8-bit states, scaler", {.state_dtype = DType::kQ8, .min_8bit_size = 256}, true}};
}

template <class Hyper>
void WriteParams(Optimizer<Hyper>& opt, unsigned seed) {
  for (const Segment& s : opt.storage().segments()) {
    for (std::size_t i = 0; i < s.numel; ++i) {
      StoreFromF32(s.param, s.param_dtype, i, Value(seed + 7 * s.group, s.global_offset + i));
    }
  }
}

// Micro-batch k's gradients (times the scale), the same in every run; one of them overflows.
template <class Hyper>
StepResult MicroBatch(Optimizer<Hyper>& opt, LossScaler* scaler, int k) {
  const float scale = scaler != nullptr ? scaler->scale() : 1.0f;
  for (const Segment& s : opt.storage().segments()) {
    for (std::size_t i = 0; i < s.numel; ++i) {
      float g = Value(1000 + static_cast<unsigned>(k), s.global_offset + i) * scale;
      if (scaler != nullptr && k == 2 && i == 3) g = INFINITY;
      StoreFromF32(const_cast<void*>(s.grad), s.grad_dtype, i, g);
    }
  }
  if (scaler == nullptr) return opt.Step();
  return opt.Step({.scaler = scaler, .max_grad_norm = 5.0});
}

// Every byte the optimizer keeps: params, states, masters, scalar states, accumulators, step
// counts (where torch keeps one), and the scaler's scale and tracker.
template <class Hyper>
std::vector<std::byte> Snapshot(Optimizer<Hyper>& opt, const LossScaler* scaler) {
  std::vector<std::byte> out;
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  FlatStorage& st = opt.storage();
  for (std::size_t t = 0; t < st.num_tensors(); ++t) {
    const Segment& s = st.segments()[t];
    put(s.param, s.numel * DTypeSize(s.param_dtype));
    for (int slot = 0; slot < kMaxStates; ++slot) {
      if (s.state[slot] != nullptr) put(s.state[slot], s.numel * DTypeSize(s.state_dtype));
      if (s.absmax[slot] != nullptr) put(s.absmax[slot], NumQuantBlocks(s.numel) * sizeof(float));
    }
    if (s.master != nullptr) put(s.master, s.numel * sizeof(float));
    put(st.scalars(t).data(), sizeof(float) * kMaxScalars);
    if (st.options().accumulation_steps > 1) put(st.accumulator(t).data(), s.numel * 4);
    if constexpr (algos::CountsSteps<algos::DescriptorOf<Hyper>>()) {
      const std::int64_t step = opt.step_count(t);
      put(&step, sizeof step);
    }
  }
  const std::int64_t pending = opt.pending_micro_batches();
  put(&pending, sizeof pending);
  if (scaler != nullptr) {
    const float scale = scaler->scale();
    const std::int64_t tracker = scaler->growth_tracker();
    put(&scale, sizeof scale);
    put(&tracker, sizeof tracker);
  }
  return out;
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("fopt_ckpt_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The Hyper structs of the registry's algorithms and of the test-only ones, each test named after
// its algorithm (CheckpointEveryAlgorithm/<kTorchName>).
#ifdef FOPT_TEST_ALGORITHMS_DIR
using Algorithms = test::HyperTypes<algos::All, test_algos::All>;
#else
using Algorithms = test::HyperTypes<algos::All>;
#endif
struct AlgorithmName {
  template <class Hyper>
  static std::string GetName(int /*index*/) {
    return algos::DescriptorOf<Hyper>::kTorchName;
  }
};

template <class T>
class CheckpointEveryAlgorithm : public ::testing::Test {};
TYPED_TEST_SUITE(CheckpointEveryAlgorithm, Algorithms, AlgorithmName);

TYPED_TEST(CheckpointEveryAlgorithm, ResumesBitForBit) {
  using Hyper = TypeParam;
  TempDir dir;
  constexpr int kBefore = 4, kAfter = 4;  // with accumulation 3: saved inside a window
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    if (v.storage.state_dtype == DType::kQ8 &&
        !algos::QuantizableStates<algos::DescriptorOf<Hyper>>) {
      continue;
    }
    const std::string path = dir.File("a.safetensors");
    LossScaler scaler_a({.init_scale = 1024.0f, .growth_interval = 2});
    Optimizer<Hyper> a(Groups<Hyper>(1.0), Tensors<Hyper>(), v.storage);
    WriteParams(a, 1);
    LossScaler* sa = v.scaler ? &scaler_a : nullptr;
    for (int k = 0; k < kBefore; ++k) MicroBatch(a, sa, k);
    SaveCheckpoint(a, path, sa, {{"updates", 17}});

    // Built with other params, hyper-parameters and scale: the file restores all of them.
    LossScaler scaler_b({.init_scale = 1024.0f, .growth_interval = 2});
    scaler_b.Update(true);
    Optimizer<Hyper> b(Groups<Hyper>(3.0), Tensors<Hyper>(), v.storage);
    WriteParams(b, 2);
    MicroBatch(b, nullptr, 9);
    LossScaler* sb = v.scaler ? &scaler_b : nullptr;
    const CheckpointCounters counters = LoadCheckpoint(b, path, sb);
    EXPECT_EQ(counters, (CheckpointCounters{{"updates", 17}}));
    ASSERT_EQ(Snapshot(a, sa), Snapshot(b, sb));
    for (int k = kBefore; k < kBefore + kAfter; ++k) {
      const StepResult ra = MicroBatch(a, sa, k);
      const StepResult rb = MicroBatch(b, sb, k);
      EXPECT_EQ(ra.stepped, rb.stepped);
    }
    EXPECT_EQ(Snapshot(a, sa), Snapshot(b, sb));
    EXPECT_EQ(a.group(0).lr, b.group(0).lr);
  }
}

// A checkpoint moves between 8-bit and f32 states: f32 states load into an 8-bit optimizer as
// Quantize of them, and 8-bit ones into an f32 optimizer as their dequantized values (the Python
// classes convert so too).
TEST(Checkpoint, ConvertsBetweenEightBitAndF32States) {
  TempDir dir;
  const std::vector<TensorSpec> specs = {{.numel = 600}};
  const StorageOptions q8{.state_dtype = DType::kQ8, .min_8bit_size = 256};
  Optimizer<AdamWHyper> f32(Groups<AdamWHyper>(1.0), specs),
      eight(Groups<AdamWHyper>(1.0), specs, q8);
  for (Optimizer<AdamWHyper>* opt : {&f32, &eight}) {
    WriteParams(*opt, 1);
    for (int k = 0; k < 3; ++k) MicroBatch(*opt, nullptr, k);
  }
  SaveCheckpoint(f32, dir.File("f32.safetensors"));
  SaveCheckpoint(eight, dir.File("q8.safetensors"));

  Optimizer<AdamWHyper> into_q8(Groups<AdamWHyper>(1.0), specs, q8);
  LoadCheckpoint(into_q8, dir.File("f32.safetensors"));
  Optimizer<AdamWHyper> into_f32(Groups<AdamWHyper>(1.0), specs);
  LoadCheckpoint(into_f32, dir.File("q8.safetensors"));
  const QuantMap maps[] = {QuantMap::kSigned, QuantMap::kUnsigned, QuantMap::kUnsigned};
  for (int slot = 0; slot < kMaxStates; ++slot) {  // exp_avg, exp_avg_sq, max_exp_avg_sq
    SCOPED_TRACE("slot " + std::to_string(slot));
    const std::span<float> values = f32.storage().state<float>(0, slot);
    std::vector<std::uint8_t> codes(600);
    std::vector<float> absmax(NumQuantBlocks(600));
    Quantize(values.data(), values.size(), maps[slot], codes.data(), absmax.data());
    EXPECT_TRUE(std::ranges::equal(into_q8.storage().state<std::uint8_t>(0, slot), codes));
    EXPECT_TRUE(std::ranges::equal(into_q8.storage().absmax(0, slot), absmax));

    const std::span<std::uint8_t> saved = eight.storage().state<std::uint8_t>(0, slot);
    std::vector<float> decoded(600);
    Dequantize(saved.data(), eight.storage().absmax(0, slot).data(), 600, maps[slot],
               decoded.data());
    EXPECT_TRUE(std::ranges::equal(into_f32.storage().state<float>(0, slot), decoded));
  }
  EXPECT_TRUE(
      std::ranges::equal(into_f32.storage().params<float>(0), eight.storage().params<float>(0)));
}

// Every refusal: the optimizer and the scaler are bit-identical afterwards.
template <class Hyper, class F>
void ExpectRefused(Optimizer<Hyper>& opt, LossScaler* scaler, F load, const std::string& says) {
  const std::vector<std::byte> before = Snapshot(opt, scaler);
  try {
    load();
    ADD_FAILURE() << "loaded; expected a refusal saying " << says;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  EXPECT_EQ(Snapshot(opt, scaler), before);
}

TEST(Checkpoint, RefusesAnotherAlgorithmLayoutOrMissingPartAndChangesNothing) {
  TempDir dir;
  const std::string path = dir.File("adam.safetensors");
  Optimizer<AdamHyper> saved(Groups<AdamHyper>(1.0), Tensors<AdamHyper>());
  WriteParams(saved, 1);
  MicroBatch(saved, nullptr, 0);
  SaveCheckpoint(saved, path);

  LossScaler scaler;
  Optimizer<AdamWHyper> adamw(Groups<AdamWHyper>(1.0), Tensors<AdamWHyper>());
  WriteParams(adamw, 3);
  MicroBatch(adamw, nullptr, 0);
  ExpectRefused(
      adamw, nullptr, [&] { LoadCheckpoint(adamw, path); }, "\"adam\"");

  std::vector<TensorSpec> other = Tensors<AdamHyper>();
  other[2].numel = 8;
  Optimizer<AdamHyper> resized(Groups<AdamHyper>(1.0), other);
  MicroBatch(resized, nullptr, 0);
  ExpectRefused(
      resized, nullptr, [&] { LoadCheckpoint(resized, path); },
      "parameter 2 is float32 of shape (7,) in the checkpoint, float32 of shape (8,) here");

  Optimizer<AdamHyper> bf16(Groups<AdamHyper>(1.0), Tensors<AdamHyper>(),
                            {.param_dtype = DType::kBF16});
  ExpectRefused(
      bf16, nullptr, [&] { LoadCheckpoint(bf16, path); }, "bfloat16");

  Optimizer<AdamHyper> same(Groups<AdamHyper>(1.0), Tensors<AdamHyper>());
  WriteParams(same, 4);
  MicroBatch(same, nullptr, 1);
  ExpectRefused(
      same, &scaler, [&] { LoadCheckpoint(same, path, &scaler); }, "holds no loss scaler state");

  // A flipped byte (the checksum) and a truncated file.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string flipped = dir.File("flipped.safetensors");
  std::string copy = bytes;
  copy[copy.size() - 5] ^= 0x10;
  std::ofstream(flipped, std::ios::binary) << copy;
  ExpectRefused(
      same, nullptr, [&] { LoadCheckpoint(same, flipped); }, "checksum");
  const std::string truncated = dir.File("truncated.safetensors");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  ExpectRefused(
      same, nullptr, [&] { LoadCheckpoint(same, truncated); }, "truncated.safetensors");

  // A window of 2 micro-batches does not fit an optimizer that updates every 2nd one.
  Optimizer<AdamHyper> window3(Groups<AdamHyper>(1.0), Tensors<AdamHyper>(),
                               {.accumulation_steps = 3});
  MicroBatch(window3, nullptr, 0);
  MicroBatch(window3, nullptr, 1);
  const std::string mid = dir.File("mid.safetensors");
  SaveCheckpoint(window3, mid);
  Optimizer<AdamHyper> window2(Groups<AdamHyper>(1.0), Tensors<AdamHyper>(),
                               {.accumulation_steps = 2});
  ExpectRefused(
      window2, nullptr, [&] { LoadCheckpoint(window2, mid); },
      "2 micro-batches into an accumulation window; this optimizer accumulates 2");
}

// A file whose metadata says something else (rewritten with a valid checksum): a negative
// momentum, a state of the wrong size, a step count that is not one.
void Rewrite(const std::string& from, const std::string& to, const std::string& old_text,
             const std::string& new_text) {
  const CheckpointFile file = ReadCheckpointFile(from);
  std::string meta = file.metadata;
  const std::size_t at = meta.find(old_text);
  ASSERT_NE(at, std::string::npos) << old_text << " not in " << meta;
  meta.replace(at, old_text.size(), new_text);
  std::vector<CheckpointTensor> tensors;
  for (const CheckpointEntry& e : file.tensors) {
    tensors.push_back({e.name, e.dtype, e.shape,
                       std::span<const std::byte>(file.data).subspan(e.offset, e.nbytes)});
  }
  WriteCheckpointFile(to, meta, tensors);
}

TEST(Checkpoint, RefusesMetadataThatDoesNotFitAndChangesNothing) {
  TempDir dir;
  const std::string path = dir.File("sgd.safetensors");
  Optimizer<SgdHyper> opt(Groups<SgdHyper>(1.0), Tensors<SgdHyper>());
  WriteParams(opt, 1);
  MicroBatch(opt, nullptr, 0);
  SaveCheckpoint(opt, path);
  MicroBatch(opt, nullptr, 1);
  const std::string bad = dir.File("bad.safetensors");
  Rewrite(path, bad, R"(["momentum",0.9])", R"(["momentum",-1.0])");
  ExpectRefused(
      opt, nullptr, [&] { LoadCheckpoint(opt, bad); }, "invalid momentum");
  Rewrite(path, bad, R"("momentum_buffer":{"tensor":"state.0.momentum_buffer"})",
          R"("momentum_buffer":{"tensor":"state.2.momentum_buffer"})");
  ExpectRefused(
      opt, nullptr, [&] { LoadCheckpoint(opt, bad); }, "has 7 elements");
  Rewrite(path, bad, R"("momentum_buffer":{"tensor":"state.0.momentum_buffer"})",
          R"("momentum_buffer":{"tensor":"state.0.momentum_buffer"},"step":2.5)");
  ExpectRefused(
      opt, nullptr, [&] { LoadCheckpoint(opt, bad); }, "not a step count");
  Rewrite(path, bad, R"("momentum_buffer":{"tensor")", R"("exp_avg":{"tensor")");
  ExpectRefused(
      opt, nullptr, [&] { LoadCheckpoint(opt, bad); }, "keeps no state 'exp_avg'");
  Rewrite(path, bad, R"("fusedopt_checkpoint":1)", R"("fusedopt_checkpoint":2)");
  ExpectRefused(
      opt, nullptr, [&] { LoadCheckpoint(opt, bad); }, "of format 1 (it says 2)");
}

}  // namespace
}  // namespace fusedopt
