// DistributedOptimizer on real ranks (run under mpirun by ctest, label mpi): P ranks with 1/P of a
// batch each against one process on the whole batch (every rank runs that reference itself, with
// the one-process Optimizer), ZeRO-1 against data parallel, global agreement (an Inf on one rank,
// the clipping norm, params identical on every rank), the state each rank keeps, and layouts that
// differ failing fast on every rank.

#include "fusedopt/distributed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/checkpoint.h"
#include "fusedopt/convert.h"
#include "fusedopt/error.h"
#include "fusedopt/mpi_communicator.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/scaler.h"

namespace fusedopt {
namespace {

// Least squares on a linear model w (all tensors' elements in flat order): sample s has features
// x_s[i] and target y_s, and its gradient is (w·x_s − y_s)·x_s. The batch has kBatch samples;
// rank r of P takes samples [r·kBatch/P, (r+1)·kBatch/P).
constexpr int kBatch = 6;
constexpr int kSteps = 20;

// Uneven tensors, a group of 3 elements (which lies in rank 0's first shard only), cut by 1 MiB
// buckets.
const std::vector<TensorSpec> kTensors = {
    {.numel = 600000}, {.numel = 3, .group = 1}, {.numel = 400000}};
constexpr std::size_t kBucketBytes = std::size_t{1} << 20;

float Feature(int sample, std::size_t i) {
  std::uint64_t z = (std::uint64_t(sample) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / double(1 << 23) - 1.0) * 1e-3f;
}

constexpr std::size_t kNumel = 1000003;

// The batch's features, computed once.
const std::vector<float>& Features(int sample) {
  static const std::vector<std::vector<float>> kFeatures = [] {
    std::vector<std::vector<float>> f(kBatch, std::vector<float>(kNumel));
    for (int s = 0; s < kBatch; ++s) {
      for (std::size_t i = 0; i < kNumel; ++i) f[s][i] = Feature(s, i);
    }
    return f;
  }();
  return kFeatures[static_cast<std::size_t>(sample)];
}

// The mean gradient of samples [first, last) at params w, into g (f32, as a framework's backward
// would give it), times `scale`.
void MeanGradient(const std::vector<float>& w, int first, int last, float scale,
                  std::vector<float>& g) {
  std::fill(g.begin(), g.end(), 0.0f);
  for (int s = first; s < last; ++s) {
    const std::vector<float>& x = Features(s);
    double dot = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) dot += double{w[i]} * x[i];
    const auto residual = static_cast<float>(dot - 0.01 * s);
    for (std::size_t i = 0; i < w.size(); ++i) g[i] += residual * x[i];
  }
  const float mean = scale / static_cast<float>(last - first);
  for (float& x : g) x *= mean;
}

// The model's params in flat (group by group) order, and back.
template <class Opt, class Params>
std::vector<float> Flat(Opt& opt, Params params) {
  std::vector<float> w;
  for (const std::size_t t : {0, 2, 1}) {
    const auto p = params(opt, t);
    w.insert(w.end(), p.begin(), p.end());
  }
  return w;
}
template <class Opt, class Grads>
void Scatter(const std::vector<float>& g, Opt& opt, Grads grads) {
  std::size_t at = 0;
  for (const std::size_t t : {0, 2, 1}) {
    const auto dst = grads(opt, t);
    std::copy(g.begin() + static_cast<std::ptrdiff_t>(at),
              g.begin() + static_cast<std::ptrdiff_t>(at + dst.size()), dst.begin());
    at += dst.size();
  }
}

const auto kOptParams = [](auto& o, std::size_t t) {
  return o.storage().template params<float>(t);
};
const auto kOptGrads = [](auto& o, std::size_t t) { return o.storage().template grads<float>(t); };
const auto kDistParams = [](auto& o, std::size_t t) { return o.template params<float>(t); };
const auto kDistGrads = [](auto& o, std::size_t t) { return o.grads(t); };

double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double{a[i]} - double{b[i]}));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return diff / scale;
}

struct Trajectory {
  std::vector<float> params;
  std::vector<double> norms;  // the clipping norm of each step
  std::size_t state_bytes = 0;
  float scale = 0.0f;
};

// Two groups; the second holds the 3-element tensor. Adam's lr keeps the fit from overshooting
// (at 1e-2 every coordinate's ±lr step flips the residuals' signs each step: moments near 0 then
// turn last-bit differences of the gradient into 1e-5 differences of the params).
template <class Hyper>
std::vector<Hyper> Groups() {
  if constexpr (requires { Hyper{}.momentum; }) {  // SGD, LARS
    return {{.lr = 0.5, .momentum = 0.9, .weight_decay = 0.01}, {.lr = 0.2, .momentum = 0.9}};
  } else {
    return {{.lr = 1e-5, .weight_decay = 0.01}, {.lr = 5e-6, .weight_decay = 0.0}};
  }
}
// Norms of the scaled gradients are about 1e-3: clip at half of that, so clipping is active.
constexpr double kMaxNorm = 5e-4;

// One process on the whole batch.
template <class Hyper>
Trajectory Reference() {
  Optimizer<Hyper> opt(Groups<Hyper>(), kTensors);
  LossScaler scaler;
  std::vector<float> w(kNumel), g(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = Feature(999, i) * 100.0f;
  Scatter(w, opt, kOptParams);
  Trajectory run;
  for (int step = 0; step < kSteps; ++step) {
    MeanGradient(Flat(opt, kOptParams), 0, kBatch, scaler.scale(), g);
    Scatter(g, opt, kOptGrads);
    run.norms.push_back(*opt.Step({.scaler = &scaler, .max_grad_norm = kMaxNorm}).grad_norm);
  }
  run.params = Flat(opt, kOptParams);
  run.scale = scaler.scale();
  return run;
}

// P ranks with 1/P of the batch each. Ranks other than 0 start from other params: the first step
// broadcasts rank 0's.
template <class Hyper>
Trajectory Distributed(Communicator& comm, int zero) {
  DistributedOptimizer<Hyper> opt(Groups<Hyper>(), kTensors, {}, comm,
                                  {.zero = zero, .bucket_bytes = kBucketBytes});
  LossScaler scaler;
  std::vector<float> w(kNumel), g(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = Feature(999 + comm.rank(), i) * 100.0f;
  Scatter(w, opt, kDistParams);
  const int first = comm.rank() * kBatch / comm.size();
  const int last = (comm.rank() + 1) * kBatch / comm.size();
  Trajectory run;
  for (int step = 0; step < kSteps; ++step) {
    // Before the first step, rank 0's params are not yet everyone's: the gradient must be taken
    // at them, as the reference does.
    if (step == 0) comm.Broadcast(w.data(), w.size(), CommType::kF32, 0);
    MeanGradient(step == 0 ? w : Flat(opt, kDistParams), first, last, scaler.scale(), g);
    Scatter(g, opt, kDistGrads);
    run.norms.push_back(*opt.Step({.scaler = &scaler, .max_grad_norm = kMaxNorm}).grad_norm);
  }
  run.params = Flat(opt, kDistParams);
  run.state_bytes = opt.state_bytes();
  run.scale = scaler.scale();
  return run;
}

// Whether every rank holds these bytes.
bool SameOnEveryRank(Communicator& comm, const void* data, std::size_t bytes) {
  std::vector<std::byte> all(bytes * static_cast<std::size_t>(comm.size()));
  std::memcpy(all.data() + bytes * static_cast<std::size_t>(comm.rank()), data, bytes);
  comm.AllGather(all.data(), bytes, CommType::kByte);
  for (int r = 1; r < comm.size(); ++r) {
    if (std::memcmp(all.data(), all.data() + bytes * static_cast<std::size_t>(r), bytes) != 0)
      return false;
  }
  return true;
}

template <class Hyper>
void ExpectSameAsOneProcess(Communicator& comm) {
  const Trajectory reference = Reference<Hyper>();
  const Trajectory data_parallel = Distributed<Hyper>(comm, 0);
  const Trajectory zero1 = Distributed<Hyper>(comm, 1);
  for (const Trajectory* run : {&data_parallel, &zero1}) {
    SCOPED_TRACE(run == &zero1 ? "zero 1" : "zero 0");
    EXPECT_LE(MaxRelativeDifference(run->params, reference.params), 1e-6);
    // Clipping was active, on the global norm: the one-process norm, the same bits on every rank.
    ASSERT_EQ(run->norms.size(), reference.norms.size());
    for (std::size_t s = 0; s < run->norms.size(); ++s) {
      EXPECT_GT(reference.norms[s], kMaxNorm);
      EXPECT_NEAR(run->norms[s], reference.norms[s], 1e-6 * reference.norms[s]);
    }
    EXPECT_TRUE(SameOnEveryRank(comm, run->norms.data(), run->norms.size() * sizeof(double)));
    EXPECT_TRUE(SameOnEveryRank(comm, run->params.data(), run->params.size() * sizeof(float)));
    EXPECT_EQ(run->scale, reference.scale);
  }
  EXPECT_LE(MaxRelativeDifference(zero1.params, data_parallel.params), 1e-6);
  // ZeRO-1 keeps a 1/P share of the moments (plus padding to whole chunks).
  const double share =
      static_cast<double>(zero1.state_bytes) / static_cast<double>(data_parallel.state_bytes);
  const double bound = comm.size() == 2 ? 0.55 : comm.size() == 3 ? 0.37 : 1.0;
  EXPECT_LE(share, bound);
  if (comm.rank() == 0) {
    std::printf("[ %d ranks ] zero 1 keeps %.3f of the state bytes of zero 0 per rank\n",
                comm.size(), share);
  }
}

TEST(DistributedMpi, RanksOnSlicesOfTheBatchEqualOneProcessOnTheWholeBatch) {
  mpi::MpiCommunicator comm;
  {
    SCOPED_TRACE("sgd");
    ExpectSameAsOneProcess<SgdHyper>(comm);
  }
  {
    SCOPED_TRACE("adamw");
    ExpectSameAsOneProcess<AdamWHyper>(comm);
  }
  // Their trust ratios read each tensor's norms, summed over the shards of every rank.
  {
    SCOPED_TRACE("lamb");
    ExpectSameAsOneProcess<LambHyper>(comm);
  }
  {
    SCOPED_TRACE("lars");
    ExpectSameAsOneProcess<LarsHyper>(comm);
  }
}

// A sharded run's state gathered into one whole state and loaded at another world size (P → 1
// and 1 → P), bf16 params with f32 masters: the resumed run continues as the run it came from.
TEST(DistributedMpi, ShardedStateMovesBetweenWorldSizes) {
  mpi::MpiCommunicator comm;
  LocalCommunicator one;
  const StorageOptions storage{.param_dtype = DType::kBF16, .master_weights = true};
  using Opt = DistributedOptimizer<AdamWHyper>;
  const auto make = [&](Communicator& c) {
    return std::make_unique<Opt>(Groups<AdamWHyper>(), kTensors, storage, c,
                                 DistributedOptions{.zero = 1, .bucket_bytes = kBucketBytes});
  };
  // Steps `opt` on the batch's slice of its rank (the whole batch on one rank).
  std::vector<float> w(kNumel), g(kNumel);
  const auto step = [&](Opt& opt, Communicator& c) {
    for (const std::size_t t : {0, 2, 1}) {
      const auto p = opt.params<std::uint16_t>(t);
      for (std::size_t i = 0; i < p.size(); ++i) {
        w[opt.layout().offsets[t] + i] = LoadAsF32(p.data(), DType::kBF16, i);
      }
    }
    MeanGradient(w, c.rank() * kBatch / c.size(), (c.rank() + 1) * kBatch / c.size(), 1.0f, g);
    Scatter(g, opt, kDistGrads);
    opt.Step();
  };
  const auto flat_params = [](Opt& opt) {
    std::vector<float> out;
    for (const std::size_t t : {0, 2, 1}) {
      const auto p = opt.params<std::uint16_t>(t);
      for (std::size_t i = 0; i < p.size(); ++i)
        out.push_back(LoadAsF32(p.data(), DType::kBF16, i));
    }
    return out;
  };
  // Everything a checkpoint holds, from `from` into `to` (params: every rank has them all).
  const auto move = [&](Opt& from, Opt& to) {
    for (const int slot : {int{kExpAvg}, int{kExpAvgSq}, Opt::kMasterSlot}) {
      const std::vector<float> whole = from.GatherState(slot);
      to.LoadState(slot, whole);
      EXPECT_EQ(to.GatherState(slot), whole);  // a round trip through `to`'s shards is exact
    }
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      to.set_step_count(t, from.step_count(t));
      const auto src = from.params<std::uint16_t>(t);
      std::copy(src.begin(), src.end(), to.params<std::uint16_t>(t).begin());
    }
  };
  for (const bool to_one : {true, false}) {
    SCOPED_TRACE(to_one ? "P ranks -> 1" : "1 -> P ranks");
    auto sharded = make(comm);
    auto single = make(one);
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      const auto p = sharded->params<std::uint16_t>(t);
      for (std::size_t i = 0; i < p.size(); ++i) {
        StoreFromF32(p.data(), DType::kBF16, i, Feature(999, i) * 100.0f);
      }
      std::copy(p.begin(), p.end(), single->params<std::uint16_t>(t).begin());
    }
    Opt& first = to_one ? *sharded : *single;
    Opt& second = to_one ? *single : *sharded;
    for (int k = 0; k < 3; ++k) step(first, to_one ? static_cast<Communicator&>(comm) : one);
    move(first, second);
    // Both continue, on the same batch: the resumed one must follow the one it came from.
    for (int k = 0; k < 2; ++k) {
      step(*sharded, comm);
      step(*single, one);
    }
    EXPECT_EQ(sharded->step_count(0), 5);
    EXPECT_EQ(single->step_count(0), 5);
    // The f32 masters and moments (the bf16 params move by less than their ulp at this lr).
    for (const int slot : {Opt::kMasterSlot, int{kExpAvg}, int{kExpAvgSq}}) {
      EXPECT_LE(MaxRelativeDifference(sharded->GatherState(slot), single->GatherState(slot)), 1e-6)
          << "slot " << slot;
    }
    EXPECT_EQ(flat_params(*sharded), flat_params(*single));
  }
}

// The checkpoint tests' run: AdamW on bf16 params with f32 masters. The gradient of step k is rank
// 0's alone (the others give zeros, average = false): its reduction is exact at any P.
using Dist = DistributedOptimizer<AdamWHyper>;
const StorageOptions kCheckpointStorage{.param_dtype = DType::kBF16, .master_weights = true};

float CheckpointGrad(int k, std::size_t t, std::size_t i) {
  return Feature(k, t * 1000000 + i) * 100.0f;
}

template <class Opt>
void InitCheckpointParams(Opt& opt) {
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    std::span<std::uint16_t> p;
    if constexpr (requires { opt.storage(); }) {
      p = opt.storage().template params<std::uint16_t>(t);
    } else {
      p = opt.template params<std::uint16_t>(t);
    }
    for (std::size_t i = 0; i < p.size(); ++i) {
      StoreFromF32(p.data(), DType::kBF16, i, Feature(999, t * 1000000 + i));
    }
  }
}

void StepOne(Optimizer<AdamWHyper>& opt, int k) {
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    const auto g = opt.storage().grads<float>(t);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = CheckpointGrad(k, t, i);
  }
  opt.Step();
}

// With 8-bit states: tensors 0 and 2 keep codes and absmax, tensor 1 (3 elements) f32 states.
const StorageOptions kCheckpoint8bit{
    .param_dtype = DType::kBF16, .state_dtype = DType::kQ8, .master_weights = true};

std::unique_ptr<Dist> MakeDist(Communicator& comm, int zero,
                               const StorageOptions& storage = kCheckpointStorage) {
  return std::make_unique<Dist>(
      Groups<AdamWHyper>(), kTensors, storage, comm,
      DistributedOptions{.zero = zero, .bucket_bytes = kBucketBytes, .average = false});
}

void StepDist(Dist& opt, Communicator& comm, int k) {
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    const auto g = opt.grads(t);
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] = comm.rank() == 0 ? CheckpointGrad(k, t, i) : 0.0f;
    }
  }
  opt.Step();
}

// A name in /tmp for every rank: rank 0's.
std::string SharedTempName(Communicator& comm, const char* tag) {
  std::array<char, 128> name{};
  std::snprintf(name.data(), name.size(), "/tmp/fusedopt_mpi_%s_%d", tag,
                static_cast<int>(::getpid()));
  comm.Broadcast(name.data(), name.size(), CommType::kByte, 0);
  return name.data();
}

void Barrier(Communicator& comm) {
  double done = 1.0;
  comm.AllReduce(&done, 1, CommType::kF64, ReduceOp::kSum);
}

// Checkpoint files across world sizes: P ranks of ZeRO-1 save (rank 0 writes the consolidated
// file), one process loads it into an Optimizer and continues; one process saves, P ranks of
// ZeRO-1 load and continue. Each ends bit for bit where one process's uninterrupted run ends.
TEST(DistributedMpi, CheckpointFilesMoveBetweenWorldSizesBitForBit) {
  mpi::MpiCommunicator comm;
  const std::string name = SharedTempName(comm, "ckpt");
  const std::string from_ranks_file = name + "_from_ranks.safetensors";
  const std::string whole_file = name + "_whole.safetensors";
  Optimizer<AdamWHyper> reference(Groups<AdamWHyper>(), kTensors, kCheckpointStorage);
  InitCheckpointParams(reference);
  for (int k = 0; k < 3; ++k) StepOne(reference, k);
  if (comm.rank() == 0) SaveCheckpoint(reference, whole_file);
  for (int k = 3; k < 5; ++k) StepOne(reference, k);

  // P ranks -> one process.
  auto sharded = MakeDist(comm, 1);
  InitCheckpointParams(*sharded);
  for (int k = 0; k < 3; ++k) StepDist(*sharded, comm, k);
  SaveCheckpoint(*sharded, from_ranks_file);
  Optimizer<AdamWHyper> resumed(Groups<AdamWHyper>(), kTensors, kCheckpointStorage);
  LoadCheckpoint(resumed, from_ranks_file);
  for (int k = 3; k < 5; ++k) StepOne(resumed, k);
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    EXPECT_TRUE(std::ranges::equal(resumed.storage().params<std::uint16_t>(t),
                                   reference.storage().params<std::uint16_t>(t)))
        << "P -> 1, tensor " << t;
    for (const int slot : {int{kExpAvg}, int{kExpAvgSq}}) {
      EXPECT_TRUE(std::ranges::equal(resumed.storage().state<float>(t, slot),
                                     reference.storage().state<float>(t, slot)))
          << "P -> 1, tensor " << t << " slot " << slot;
    }
    EXPECT_TRUE(std::ranges::equal(resumed.storage().master(t), reference.storage().master(t)));
  }

  // One process -> P ranks (every rank reads rank 0's file).
  auto loaded = MakeDist(comm, 1);
  LoadCheckpoint(*loaded, whole_file);
  for (int k = 3; k < 5; ++k) StepDist(*loaded, comm, k);
  for (const int slot : {int{kExpAvg}, int{kExpAvgSq}, Dist::kMasterSlot}) {
    const std::vector<float> got = loaded->GatherState(slot);
    std::vector<float> want(got.size());
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      const std::span<const float> from = slot == Dist::kMasterSlot
                                              ? reference.storage().master(t)
                                              : reference.storage().state<float>(t, slot);
      std::copy(from.begin(), from.end(),
                want.begin() + static_cast<std::ptrdiff_t>(loaded->layout().offsets[t]));
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "1 -> P, slot " << slot;
  }
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    EXPECT_TRUE(std::ranges::equal(loaded->params<std::uint16_t>(t),
                                   reference.storage().params<std::uint16_t>(t)))
        << "1 -> P, tensor " << t;
    EXPECT_EQ(loaded->step_count(t), 5);
  }
  Barrier(comm);  // every rank has read the files before rank 0 removes them
  if (comm.rank() == 0) {
    std::remove(from_ranks_file.c_str());
    std::remove(whole_file.c_str());
  }
}

template <class F>
void ExpectCheckpointError(F f, const std::string& says) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying " << says;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void ExpectShardedCheckpointsAreTheWholeFile(const StorageOptions& storage) {
  mpi::MpiCommunicator comm;
  const std::string name = SharedTempName(comm, "shards");
  const std::string whole = name + "_whole.safetensors", set = name + "_set.safetensors";
  const std::string merged = name + "_merged.safetensors", later = name + "_later.safetensors";
  Optimizer<AdamWHyper> reference(Groups<AdamWHyper>(), kTensors, storage);
  InitCheckpointParams(reference);
  for (int k = 0; k < 5; ++k) StepOne(reference, k);
  const auto expect_reference = [&](auto params, const char* what) {
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      EXPECT_TRUE(std::ranges::equal(params(t), reference.storage().params<std::uint16_t>(t)))
          << what << ", tensor " << t;
    }
  };
  const int last = comm.size() - 1;
  for (const int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    auto saved = MakeDist(comm, zero, storage);
    InitCheckpointParams(*saved);
    for (int k = 0; k < 3; ++k) StepDist(*saved, comm, k);
    SaveCheckpoint(*saved, whole, nullptr, {{"updates", 3}});
    SaveCheckpoint(*saved, set);  // an older file at the set's path, which the sharded save removes
    SaveShardedCheckpoint(*saved, set, nullptr, {{"updates", 3}});
    if (comm.rank() == 0) {
      EXPECT_FALSE(std::filesystem::exists(set));
      const std::vector<std::string> files = FindCheckpointShards(set);
      ASSERT_EQ(files.size(), static_cast<std::size_t>(comm.size()));
      EXPECT_EQ(files[1], name + "_set.rank1-of-" + std::to_string(comm.size()) + ".safetensors");
      WriteCheckpointFile(merged, ReadCheckpointShards(files));
      EXPECT_TRUE(FileBytes(merged) == FileBytes(whole)) << "merged shards != consolidated file";
    }

    auto loaded = MakeDist(comm, 1, storage);
    EXPECT_EQ(LoadCheckpoint(*loaded, set).at("updates"), 3);
    for (int k = 3; k < 5; ++k) StepDist(*loaded, comm, k);
    expect_reference([&](std::size_t t) { return loaded->params<std::uint16_t>(t); }, "P -> P");
    Optimizer<AdamWHyper> one(Groups<AdamWHyper>(), kTensors, storage);
    LoadCheckpoint(one, set);
    for (int k = 3; k < 5; ++k) StepOne(one, k);
    expect_reference([&](std::size_t t) { return one.storage().params<std::uint16_t>(t); },
                     "P -> 1");
    // The resumed run's states are the uninterrupted one's (8-bit: codes and absmax).
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      for (const int slot : {int{kExpAvg}, int{kExpAvgSq}}) {
        const Segment& want = reference.storage().segments()[t];
        const Segment& got = one.storage().segments()[t];
        const std::size_t bytes = want.numel * DTypeSize(want.state_dtype);
        EXPECT_EQ(std::memcmp(want.state[slot], got.state[slot], bytes), 0) << t << " " << slot;
        if (want.state_dtype == DType::kQ8) {
          EXPECT_TRUE(std::ranges::equal(reference.storage().absmax(t, slot),
                                         one.storage().absmax(t, slot)));
        }
      }
    }
    if (zero == 0 || storage.state_dtype == DType::kQ8) continue;  // (the refusals: once)

    // A save that fails on one rank (its file's name is taken by a folder) throws on every rank
    // and leaves no file of the set.
    const std::string failed = name + "_failed.safetensors";
    const std::string blocked = CheckpointShardPath(failed, last, comm.size());
    if (comm.rank() == 0) std::filesystem::create_directory(blocked);
    Barrier(comm);
    EXPECT_ANY_THROW(SaveShardedCheckpoint(*saved, failed));
    Barrier(comm);  // every rank has cleaned up
    for (int r = 0; r < comm.size(); ++r) {
      EXPECT_FALSE(std::filesystem::exists(CheckpointShardPath(failed, r, comm.size()))) << r;
    }

    // Refused sets, on copies: a rank missing; ranks of two saves.
    StepDist(*saved, comm, 3);
    SaveShardedCheckpoint(*saved, later);
    if (comm.rank() == 0) {
      const std::string missing = name + "_missing.safetensors",
                        mixed = name + "_mixed.safetensors";
      const int ranks = comm.size();
      for (int r = 0; r < last; ++r) {
        std::filesystem::copy_file(CheckpointShardPath(set, r, ranks),
                                   CheckpointShardPath(missing, r, ranks));
      }
      std::filesystem::copy_file(CheckpointShardPath(set, 0, ranks),
                                 CheckpointShardPath(mixed, 0, ranks));
      for (int r = 1; r < ranks; ++r) {
        std::filesystem::copy_file(CheckpointShardPath(later, r, ranks),
                                   CheckpointShardPath(mixed, r, ranks));
      }
      const std::string absent =
          "rank " + std::to_string(last) + " of " + std::to_string(ranks) + " is missing";
      std::vector<std::string> present;
      present.reserve(static_cast<std::size_t>(last));
      for (int r = 0; r < last; ++r) present.push_back(CheckpointShardPath(set, r, ranks));
      ExpectCheckpointError([&] { ReadCheckpointShards(present); }, absent);
      const std::vector<std::byte> before(
          reinterpret_cast<const std::byte*>(one.storage().flat_params()),
          reinterpret_cast<const std::byte*>(one.storage().flat_params()) + 2 * kNumel);
      for (const auto& [path, why] :
           {std::pair(missing, absent), std::pair(mixed, std::string("different saves"))}) {
        ExpectCheckpointError([&, &path = path] { LoadCheckpoint(one, path); }, why);
        EXPECT_EQ(std::memcmp(before.data(), one.storage().flat_params(), before.size()), 0);
        EXPECT_EQ(one.step_count(0), 5);
      }
      for (const std::string& p : {missing, mixed}) {
        for (int r = 0; r < ranks; ++r) std::remove(CheckpointShardPath(p, r, ranks).c_str());
      }
    }
  }
  Barrier(comm);  // every rank has read the files before rank 0 removes them
  if (comm.rank() == 0) {
    for (const std::string& p : {whole, merged}) std::remove(p.c_str());
    for (const std::string& p : {set, later}) {
      for (int r = 0; r < comm.size(); ++r) {
        std::remove(CheckpointShardPath(p, r, comm.size()).c_str());
      }
    }
  }
}

// Shard sets: every rank writes its own file, nothing gathered. Merged, a set is the file
// SaveCheckpoint writes, byte for byte (zero 0 and 1, float and 8-bit states); loaded, it
// continues bit for bit, into P ranks and into one process; a set with a rank missing or mixed
// from two saves is refused, and the optimizer it was loaded into is as it was.
TEST(DistributedMpi, ShardedCheckpointsAreTheWholeFileInPieces) {
  for (const StorageOptions& storage : {kCheckpointStorage, kCheckpoint8bit}) {
    SCOPED_TRACE(storage.state_dtype == DType::kQ8 ? "8-bit states" : "f32 states");
    ExpectShardedCheckpointsAreTheWholeFile(storage);
  }
}

TEST(DistributedMpi, GroupOnOneShardOnly) {
  mpi::MpiCommunicator comm;
  DistributedOptimizer<AdamWHyper> opt(Groups<AdamWHyper>(), kTensors, {}, comm,
                                       {.zero = 1, .bucket_bytes = kBucketBytes});
  // Group 1 (tensor 1, 3 elements) lies at flat 1000000..1000002, inside one rank's shard: only
  // that rank keeps its state (the others' shards hold no element of the group, and the
  // end-to-end test above steps them all).
  const ShardLayout& layout = opt.layout();
  ASSERT_EQ(layout.offsets[1], 1000000u);
  int owner = -1;
  for (const ShardLayout::Bucket& b : layout.buckets) {
    if (b.begin <= 1000000 && 1000003 <= b.begin + b.shard * layout.ranks) {
      owner = static_cast<int>((1000000 - b.begin) / b.shard);
    }
  }
  const std::vector<DistributedOptimizer<AdamWHyper>::StateSlice> held = opt.state(1, kExpAvg);
  EXPECT_EQ(held.size(), comm.rank() == owner ? 1u : 0u);
  double holders = static_cast<double>(held.size());
  comm.AllReduce(&holders, 1, CommType::kF64, ReduceOp::kSum);
  EXPECT_EQ(holders, 1.0);
}

TEST(DistributedMpi, AnInfOnOneRankMakesEveryRankSkip) {
  mpi::MpiCommunicator comm;
  for (const int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    DistributedOptimizer<AdamWHyper> opt(Groups<AdamWHyper>(), kTensors, {}, comm,
                                         {.zero = zero, .bucket_bytes = kBucketBytes});
    LossScaler scaler;
    std::vector<float> g(kNumel);
    MeanGradient(std::vector<float>(g.size(), 0.5f), comm.rank(), comm.rank() + 1, 1.0f, g);
    Scatter(g, opt, kDistGrads);
    ASSERT_TRUE(opt.Step({.scaler = &scaler}).stepped);
    const std::vector<float> before = Flat(opt, kDistParams);
    const auto moments = [&] {
      std::vector<float> m;
      for (std::size_t t = 0; t < kTensors.size(); ++t) {
        for (const auto& slice : opt.state(t, kExpAvgSq)) {
          m.insert(m.end(), slice.values.begin(), slice.values.end());
        }
      }
      return m;
    };
    const std::vector<float> moments_before = moments();
    Scatter(g, opt, kDistGrads);
    // The last rank only: with zero 1 its Inf lies in a shard another rank owns.
    if (comm.rank() == comm.size() - 1) opt.grads(0)[17] = std::numeric_limits<float>::infinity();
    const float scale = scaler.scale();
    const StepResult r = opt.Step({.scaler = &scaler});
    EXPECT_FALSE(r.stepped);
    EXPECT_TRUE(r.found_inf);
    EXPECT_EQ(scaler.scale(), scale * 0.5f);
    EXPECT_EQ(opt.step_count(0), 1);
    const std::vector<float> after = Flat(opt, kDistParams);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
    const std::vector<float> moments_after = moments();
    ASSERT_EQ(moments_before.size(), moments_after.size());
    EXPECT_EQ(std::memcmp(moments_before.data(), moments_after.data(),
                          moments_before.size() * sizeof(float)),
              0);
  }
}

TEST(DistributedMpi, LayoutsThatDifferFailOnEveryRank) {
  mpi::MpiCommunicator comm;
  std::vector<TensorSpec> tensors = kTensors;
  if (comm.rank() == comm.size() - 1) tensors[2].numel += 1;
  try {
    DistributedOptimizer<AdamWHyper> opt(Groups<AdamWHyper>(), tensors, {}, comm);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.size() - 1) +
                                         "'s layout differs from rank 0's"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fusedopt
