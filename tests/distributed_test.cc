// DistributedOptimizer in one process (distributed.h): the layout, the step against the
// one-process Optimizer for every algorithm of the registry, each rank's ZeRO-1 shard step against
// the same slice of the unsharded step (a communicator that plays rank r of P), skips, errors and
// the state each rank keeps. The multi-rank runs under mpirun are tests/mpi.

#include "fusedopt/distributed.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fusedopt/communicator.h"
#include "fusedopt/error.h"
#include "fusedopt/optimizer.h"
#include "fusedopt/quantize.h"
#include "fusedopt/scaler.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/distributed/shard_sums.h"
#include "tests/hyper_types.h"
#include "tests/test_support.h"

namespace fusedopt {
namespace {

// Rank `rank` of `size`, alone: the other ranks contribute zeros to sums and the same bytes as
// this one to gathers. Its shard step then sees exactly the reduced gradients it was given.
class PlayRank final : public Communicator {
 public:
  PlayRank(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

 protected:
  std::unique_ptr<CommRequest> DoAllReduce(void*, std::size_t, CommType, ReduceOp) override {
    return std::make_unique<CompletedRequest>();
  }
  std::unique_ptr<CommRequest> DoReduceScatter(const void* send, void* recv, std::size_t count,
                                               CommType type) override {
    const std::size_t bytes = count * CommTypeSize(type);
    std::memcpy(recv, static_cast<const std::byte*>(send) + rank_ * bytes, bytes);
    return std::make_unique<CompletedRequest>();
  }
  std::unique_ptr<CommRequest> DoAllGather(void* data, std::size_t count, CommType type) override {
    const std::size_t bytes = count * CommTypeSize(type);
    auto* d = static_cast<std::byte*>(data);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) std::memcpy(d + r * bytes, d + rank_ * bytes, bytes);
    }
    if (gather_hash_offset_ != 0 && type == CommType::kU64) {
      *reinterpret_cast<std::uint64_t*>(d + bytes) = gather_hash_offset_;
    }
    return std::make_unique<CompletedRequest>();
  }
  std::unique_ptr<CommRequest> DoBroadcast(void*, std::size_t, CommType, int) override {
    return std::make_unique<CompletedRequest>();
  }

 public:
  // Makes rank 1's layout hash this value (a rank that built another layout).
  std::uint64_t gather_hash_offset_ = 0;

 private:
  int rank_, size_;
};

// Cut by buckets of 40000 gradient elements (one 32768-element chunk per rank and more), in two
// groups; numel 0 and 3 included. Listed group by group: the Optimizer's pre-pass reads tensors
// in list order, the flat layout group by group, and the norm is the same bits when they agree.
std::vector<TensorSpec> Tensors() {
  return {{.numel = 1000},
          {.numel = 40000},
          {.numel = 0},
          {.numel = 3, .group = 1},
          {.numel = 30000, .group = 1}};
}

template <class Hyper>
std::vector<Hyper> Groups() {
  Hyper h;
  if constexpr (requires { h.momentum; }) h.momentum = 0.9;
  if constexpr (requires { h.weight_decay; }) h.weight_decay = 0.01;
  Hyper h2 = h;
  h2.lr = h.lr * 0.5;
  return {h, h2};
}

template <class Hyper>
std::vector<TensorSpec> TensorsFor() {
  std::vector<TensorSpec> t = Tensors();
  if constexpr (std::is_same_v<Hyper, AdampHyper>) t[1].rows = 40;
  if constexpr (std::is_same_v<Hyper, AdafactorHyper>) {
    t[1].rows = 200;
    t[1].cols = 200;
    t[4].rows = 100;
    t[4].cols = 300;
  }
  return t;
}

struct Setup {
  bool bf16 = false;      // bf16 params and states, rounded stochastically
  bool pre_pass = false;  // a loss scaler and clipping
  bool q8 = false;        // bf16 params rounded stochastically, 8-bit states
};

constexpr std::size_t kBucketBytes = 40000 * sizeof(float);

StorageOptions StorageFor(const Setup& s) {
  // Tensors 1 and 4 (40000 and 30000 elements) get 8-bit states, 0 and 3 keep f32 ones.
  if (s.q8) {
    return {.param_dtype = DType::kBF16,
            .state_dtype = DType::kQ8,
            .min_8bit_size = 2000,
            .stochastic_rounding = true,
            .rounding_seed = 11};
  }
  if (!s.bf16) return {};
  return {.param_dtype = DType::kBF16,
          .state_dtype = DType::kBF16,
          .stochastic_rounding = true,
          .rounding_seed = 11};
}

float Param(unsigned seed, std::size_t i) { return test::HashedValue(seed, i); }

// A tensor's params as f32 (bf16 widened exactly).
template <class Span>
std::vector<float> AsF32(Span span, DType dtype) {
  std::vector<float> out(span.size());
  for (std::size_t i = 0; i < span.size(); ++i) out[i] = LoadAsF32(span.data(), dtype, i);
  return out;
}

template <class Hyper>
void WriteParams(Optimizer<Hyper>& opt, DistributedOptimizer<Hyper>& dist, DType dtype) {
  for (std::size_t t = 0; t < opt.storage().num_tensors(); ++t) {
    for (std::size_t i = 0; i < opt.storage().segments()[t].numel; ++i) {
      const float v = Param(static_cast<unsigned>(t), i);
      if (dtype == DType::kF32) {
        opt.storage().template params<float>(t)[i] = v;
        dist.template params<float>(t)[i] = v;
      } else {
        StoreFromF32(opt.storage().template params<std::uint16_t>(t).data(), dtype, i, v);
        StoreFromF32(dist.template params<std::uint16_t>(t).data(), dtype, i, v);
      }
    }
  }
}

template <class Hyper>
std::vector<float> ParamsOf(Optimizer<Hyper>& opt, std::size_t t) {
  const DType d = opt.storage().options().param_dtype;
  if (d == DType::kF32) return AsF32(opt.storage().template params<float>(t), d);
  return AsF32(opt.storage().template params<std::uint16_t>(t), d);
}
template <class Hyper>
std::vector<float> ParamsOf(DistributedOptimizer<Hyper>& opt, std::size_t t, DType d) {
  if (d == DType::kF32) return AsF32(opt.template params<float>(t), d);
  return AsF32(opt.template params<std::uint16_t>(t), d);
}

void FillGrads(std::span<float> g, int step, std::size_t tensor, float scale) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = Param(static_cast<unsigned>(1000 * step) + static_cast<unsigned>(tensor), i) * scale;
  }
}

// A tensor's state slot as f32 (8-bit codes decoded with their absmax).
template <class Hyper>
std::vector<float> StateOf(Optimizer<Hyper>& opt, std::size_t t, int slot) {
  const Segment& s = opt.storage().segments()[t];
  std::vector<float> out(s.numel);
  if (s.state_dtype == DType::kQ8) {
    Dequantize(static_cast<const std::uint8_t*>(s.state[slot]), s.absmax[slot], s.numel,
               SlotMap(algos::UnsignedMapStates<algos::DescriptorOf<Hyper>>(), slot), out.data());
  } else {
    for (std::size_t i = 0; i < s.numel; ++i) out[i] = LoadAsF32(s.state[slot], s.state_dtype, i);
  }
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The sanitizer build (FOPT_TEST_SMALL, -O0) takes fewer steps.
int Steps() { return std::getenv("FOPT_TEST_SMALL") != nullptr ? 2 : 4; }

// Runs `steps` steps of the one-process Optimizer and of the DistributedOptimizer on `comm` with
// the same gradients; checks that every element the rank updates is bit-identical to the
// Optimizer's (all of them for zero = 0 and one rank).
template <class Hyper>
void ExpectSameAsOptimizer(const Setup& setup, Communicator& comm, DistributedOptions options) {
  using A = algos::DescriptorOf<Hyper>;
  const std::vector<TensorSpec> tensors = TensorsFor<Hyper>();
  const StorageOptions storage = StorageFor(setup);
  Optimizer<Hyper> opt(Groups<Hyper>(), tensors, storage);
  options.bucket_bytes = kBucketBytes;
  // The one-process chunks unless told: the same norm bits.
  if (options.shard_align == 0) options.shard_align = kGrainElements;
  DistributedOptimizer<Hyper> dist(Groups<Hyper>(), tensors, storage, comm, options);
  WriteParams(opt, dist, storage.param_dtype);
  LossScaler scaler_a({.init_scale = 1024.0f, .growth_interval = 2});
  LossScaler scaler_b = scaler_a;
  for (int step = 1; step <= Steps(); ++step) {
    const float scale = setup.pre_pass ? scaler_a.scale() : 1.0f;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      FillGrads(opt.storage().template grads<float>(t), step, t, scale);
      FillGrads(dist.grads(t), step, t, scale);
    }
    StepOptions so;
    if (setup.pre_pass) so = {.scaler = &scaler_a, .max_grad_norm = 100.0};
    const StepResult a = opt.Step(so);
    if (setup.pre_pass) so.scaler = &scaler_b;
    const StepResult b = dist.Step(so);
    ASSERT_EQ(a.stepped, b.stepped);
    if (comm.size() == 1 && a.grad_norm) {
      // With 8-bit states tensors start on block edges of the flat range, whose chunks then hold
      // other elements than the Optimizer's: the same norm, rounded in another order.
      if (setup.q8) {
        EXPECT_NEAR(*a.grad_norm, *b.grad_norm, 1e-12 * *a.grad_norm);
      } else {
        EXPECT_EQ(*a.grad_norm, *b.grad_norm);
      }
    }
  }
  EXPECT_EQ(scaler_a.scale(), scaler_b.scale());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    SCOPED_TRACE("tensor " + std::to_string(t));
    EXPECT_EQ(opt.step_count(t), dist.step_count(t));
    const std::vector<float> want = ParamsOf(opt, t);
    const std::vector<float> got = ParamsOf(dist, t, storage.param_dtype);
    for (int slot = 0; slot < kMaxStates; ++slot) {
      const unsigned required = RequiredStates(Groups<Hyper>()[0]);
      if ((required >> slot & 1u) == 0 || A::kStates[slot][0] == 0) continue;
      if constexpr (algos::Factored<A>) continue;  // factored states are not param-shaped
      const std::vector<float> all = StateOf(opt, t, slot);
      for (const auto& slice : dist.state(t, slot)) {
        const std::vector<float> part(
            all.begin() + static_cast<std::ptrdiff_t>(slice.first),
            all.begin() + static_cast<std::ptrdiff_t>(slice.first + slice.values.size()));
        EXPECT_TRUE(BitEqual(part, slice.values)) << "state " << slot << " from " << slice.first;
      }
    }
    if (options.zero == 0 || comm.size() == 1) {
      EXPECT_TRUE(BitEqual(want, got));
      continue;
    }
    // A played rank's own elements only: the others' shards are never gathered into it.
    for (const auto& slice : dist.state(t, 0)) {
      for (std::size_t i = slice.first; i < slice.first + slice.values.size(); ++i) {
        // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): bit-exact on purpose
        ASSERT_EQ(std::memcmp(&want[i], &got[i], sizeof(float)), 0) << "element " << i;
      }
    }
  }
}

template <class T>
class DistributedEveryAlgorithm : public ::testing::Test {};
TYPED_TEST_SUITE(DistributedEveryAlgorithm, test::HyperTypes<algos::All>);

// One process: zero 0 (pipelined and not) and zero 1 equal the Optimizer bit for bit, with f32,
// with bf16 params and states rounded stochastically and (all but AdamP, Adafactor) with 8-bit
// states, with and without scaler and clipping.
TYPED_TEST(DistributedEveryAlgorithm, OneRankEqualsTheOptimizerBitForBit) {
  using Hyper = TypeParam;
  using A = algos::DescriptorOf<Hyper>;
  for (const char* states : {"f32", "bf16", "q8"}) {
    if (states == std::string("q8") && !algos::QuantizableStates<A>) continue;
    for (const bool pre_pass : {false, true}) {
      const Setup setup{.bf16 = states == std::string("bf16"),
                        .pre_pass = pre_pass,
                        .q8 = states == std::string("q8")};
      SCOPED_TRACE(std::string(states) + (pre_pass ? " scaler+clip" : " plain"));
      for (const bool pipeline : {true, false}) {
        LocalCommunicator comm;
        ExpectSameAsOptimizer<Hyper>(setup, comm, {.zero = 0, .pipeline = pipeline});
      }
      if constexpr (!!kZeroOneShards<A>) {
        LocalCommunicator comm;
        ExpectSameAsOptimizer<Hyper>(setup, comm, {.zero = 1});
      }
    }
  }
}

// Rank r of P under ZeRO-1, given the reduced gradients: its shard's update is the same slice of
// the unsharded update, bit for bit (stochastic rounding keyed on global indices included; 8-bit
// states, whose blocks no shard edge cuts, too). AdamP, BertAdam and Adafactor, whose sums are per
// row, across tensors or factored, are refused.
TYPED_TEST(DistributedEveryAlgorithm, ShardStepIsTheSliceOfTheFullStep) {
  using Hyper = TypeParam;
  using A = algos::DescriptorOf<Hyper>;
  if constexpr (!kZeroOneShards<A>) {
    PlayRank comm(0, 2);
    EXPECT_THROW(
        DistributedOptimizer<Hyper>(Groups<Hyper>(), TensorsFor<Hyper>(), {}, comm, {.zero = 1}),
        Error);
  } else if constexpr (kSegmentSums<A>) {
    // LAMB and LARS need the other ranks' sums, which a played rank has not: tests/mpi runs them.
  } else {
    for (const std::size_t align : {kGrainElements, std::size_t{256}}) {
      for (const int ranks : {2, 3}) {
        for (int rank = 0; rank < ranks; ++rank) {
          for (const bool q8 : {false, true}) {
            if (q8 && !algos::QuantizableStates<A>) continue;
            SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                         ", shards of " + std::to_string(align) + (q8 ? ", 8-bit" : ", bf16"));
            PlayRank comm(rank, ranks);
            ExpectSameAsOptimizer<Hyper>({.bf16 = !q8, .q8 = q8}, comm,
                                         {.zero = 1, .average = false, .shard_align = align});
          }
        }
      }
    }
  }
}

TEST(ShardLayout, BucketsAreWholeChunksPerRankAndCoverEveryElementOnce) {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    for (const std::size_t bucket : {std::size_t{1}, std::size_t{40000}, std::size_t{1} << 22}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, bucket " + std::to_string(bucket));
      const std::vector<TensorSpec> tensors = Tensors();
      const ShardLayout layout(tensors, 2, ranks, bucket, kGrainElements);
      EXPECT_EQ(layout.numel, 71003u);
      std::size_t begin = 0, local = 0;
      for (const ShardLayout::Bucket& b : layout.buckets) {
        EXPECT_EQ(b.begin, begin);
        EXPECT_EQ(b.local, local);
        EXPECT_EQ(b.shard % kGrainElements, 0u);
        EXPECT_GT(b.shard, 0u);
        begin += static_cast<std::size_t>(ranks) * b.shard;
        local += b.shard;
      }
      EXPECT_EQ(layout.padded, begin);
      EXPECT_EQ(layout.shard_total, local);
      EXPECT_GE(layout.padded, layout.numel);
      // No more padding than one chunk per rank in the last bucket.
      EXPECT_LT(layout.padded - layout.numel, static_cast<std::size_t>(ranks) * kGrainElements);
      // Every element of every tensor in exactly one slice of one shard, in flat order.
      std::vector<int> seen(layout.numel, 0);
      for (const ShardLayout::Bucket& b : layout.buckets) {
        for (int r = 0; r < ranks; ++r) {
          const std::size_t lo = b.begin + static_cast<std::size_t>(r) * b.shard;
          std::size_t previous = lo;
          for (const ShardLayout::Slice& s : layout.SlicesIn(lo, lo + b.shard)) {
            const std::size_t flat = layout.offsets[s.tensor] + s.first;
            EXPECT_GE(flat, previous);
            previous = flat + s.numel;
            for (std::size_t i = 0; i < s.numel; ++i) ++seen[flat + i];
          }
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
  // Auto alignment: whole chunks while their padding stays under 1/8 of the model, else 256.
  const std::vector<TensorSpec> big = {{.numel = std::size_t{8} * 3 * kGrainElements}};
  EXPECT_EQ(ShardLayout(big, 1, 3, 1 << 20).align, kGrainElements);
  EXPECT_EQ(ShardLayout(big, 1, 4, 1 << 20).align, 256u);
  EXPECT_LT(ShardLayout(big, 1, 1000, 1 << 20).padded - big[0].numel, 1000u * 256);
  // Group by group, as FlatStorage: a group-0 tensor listed last lies before the group-1 ones.
  std::vector<TensorSpec> tensors = Tensors();
  tensors.push_back({.numel = 5});
  const ShardLayout layout(tensors, 2, 1, 1);
  EXPECT_EQ(layout.offsets[5], 41000u);
  EXPECT_EQ(layout.offsets[3], 41005u);
  EXPECT_EQ(layout.offsets[4], 41008u);
}

// 8-bit states (tensor_align = kQuantBlock): every tensor starts on a block edge and every shard
// edge inside a tensor falls on one of its blocks' edges, so no block is split between ranks.
TEST(ShardLayout, TensorAlignPutsShardEdgesOnBlockEdges) {
  const std::vector<TensorSpec> tensors = {
      {.numel = 1000}, {.numel = 70000}, {.numel = 3}, {.numel = 5000, .group = 1}};
  for (int ranks = 1; ranks <= 3; ++ranks) {
    const ShardLayout layout(tensors, 2, ranks, 3000, 0, kQuantBlock);
    EXPECT_EQ(layout.tensor_align, kQuantBlock);
    for (std::size_t offset : layout.offsets) EXPECT_EQ(offset % kQuantBlock, 0u) << offset;
    EXPECT_EQ(layout.offsets[1], 1024u);  // after tensor 0's 1000 elements and a gap of 24
    EXPECT_GE(layout.numel, layout.offsets[3] + 5000);
    for (const ShardLayout::Bucket& b : layout.buckets) {
      for (int r = 0; r < ranks; ++r) {
        const std::size_t lo = b.begin + static_cast<std::size_t>(r) * b.shard;
        for (const ShardLayout::Slice& s : layout.SlicesIn(lo, lo + b.shard)) {
          EXPECT_EQ(s.first % kQuantBlock, 0u) << "tensor " << s.tensor;
          EXPECT_TRUE((s.first + s.numel) % kQuantBlock == 0 ||
                      s.first + s.numel == tensors[s.tensor].numel)
              << "tensor " << s.tensor;
        }
      }
    }
    EXPECT_NE(layout.Hash(), ShardLayout(tensors, 2, ranks, 3000).Hash());
  }
  EXPECT_THROW(ShardLayout(tensors, 2, 2, 3000, 0, 0), Error);
  EXPECT_THROW(ShardLayout(tensors, 2, 2, 3000, 64, kQuantBlock), Error);  // 64 % 256 != 0
}

TEST(ShardLayout, ShardSumsAddEachTensorInTheOrderOfTheFlatRange) {
  // Tensors of 100 and 60 elements on 2 ranks, shards of 64: bucket 0 is [0, 128) (rank 0:
  // tensor 0's first 64; rank 1: its last 36 and tensor 1's first 28), bucket 1 is [128, 256)
  // (rank 0: tensor 1's last 32; rank 1: padding).
  const std::vector<TensorSpec> tensors = {{.numel = 100}, {.numel = 60}};
  const ShardLayout layout(tensors, 1, 2, 128, 64);
  using distributed::ShardPiece;
  using distributed::ShardSums;
  ASSERT_EQ(layout.buckets.size(), 2u);
  EXPECT_EQ(distributed::ShardPieces(layout, 0),
            (std::vector<ShardPiece>{{.tensor = 0, .bucket = 0}, {.tensor = 1, .bucket = 1}}));
  EXPECT_EQ(distributed::ShardPieces(layout, 1),
            (std::vector<ShardPiece>{{.tensor = 0, .bucket = 0}, {.tensor = 1, .bucket = 0}}));
  // k = 2 sums per piece; each rank's pack is [bucket][tensor][k].
  const ShardSums rank0(distributed::ShardPieces(layout, 0), 2, 2, 2);
  const ShardSums rank1(distributed::ShardPieces(layout, 1), 2, 2, 2);
  ASSERT_EQ(rank0.per_rank(), 8u);
  std::vector<double> gathered(16, -1.0);
  rank0.Pack(std::vector<double>{1, 2, 3, 4}, std::span<double>(gathered).first(8));
  rank1.Pack(std::vector<double>{10, 20, 30, 40}, std::span<double>(gathered).last(8));
  EXPECT_EQ(gathered, (std::vector<double>{1, 2, 0, 0, 0, 0, 3, 4, 10, 20, 30, 40, 0, 0, 0, 0}));
  std::vector<double> sums0(4), sums1(4);
  rank0.Add(2, gathered, sums0);
  rank1.Add(2, gathered, sums1);
  EXPECT_EQ(sums0, (std::vector<double>{11, 22, 33, 44}));
  EXPECT_EQ(sums1, (std::vector<double>{11, 22, 33, 44}));
  // The order is bucket by bucket, then rank by rank: ((1 + 1) + 2^53) + 0 is 2^53 + 2, where
  // rank by rank, ((1 + 2^53) + 1) + 0, would round to 2^53 twice.
  const double big = 9007199254740992.0;  // 2^53
  const ShardSums one({{.tensor = 0, .bucket = 0}, {.tensor = 0, .bucket = 1}}, 2, 1, 1);
  std::vector<double> sums(2);
  one.Add(2, std::vector<double>{1, big, 1, 0}, sums);
  EXPECT_EQ(sums, (std::vector<double>{big + 2, big + 2}));
  // Sizes and pieces out of range are errors.
  EXPECT_THROW(ShardSums({{.tensor = 2, .bucket = 0}}, 2, 2, 1), Error);
  EXPECT_THROW(ShardSums({{.tensor = 0, .bucket = 2}}, 2, 2, 1), Error);
  EXPECT_THROW(rank0.Pack(std::vector<double>{1, 2}, std::span<double>(gathered).first(8)), Error);
  EXPECT_THROW(rank0.Add(3, gathered, sums0), Error);
  EXPECT_THROW(distributed::ShardPieces(layout, 2), Error);
}

TEST(Distributed, ZeroOneHoldsAShareOfTheState) {
  // 1 M elements of Adam with f32 masters of bf16 params, one bucket per 25 MiB.
  const std::vector<TensorSpec> tensors = {{.numel = 600000}, {.numel = 400000}};
  const StorageOptions storage{.param_dtype = DType::kBF16, .master_weights = true};
  LocalCommunicator one;
  const std::size_t full =
      DistributedOptimizer<AdamWHyper>({{}}, tensors, storage, one, {.zero = 0}).state_bytes();
  EXPECT_EQ(full, 1000000u * 12);  // exp_avg, exp_avg_sq, master
  for (const auto& [ranks, bound] : {std::pair{2, 0.55}, std::pair{3, 0.37}}) {
    for (int rank = 0; rank < ranks; ++rank) {
      PlayRank comm(rank, ranks);
      const std::size_t mine =
          DistributedOptimizer<AdamWHyper>({{}}, tensors, storage, comm, {.zero = 1}).state_bytes();
      EXPECT_LE(static_cast<double>(mine), bound * static_cast<double>(full))
          << ranks << " ranks, rank " << rank;
    }
  }
}

TEST(Distributed, EightBitStatesTakeAByteAndAnAbsmaxPerBlock) {
  const std::vector<TensorSpec> tensors = {{.numel = 600000}, {.numel = 3000}, {.numel = 400000}};
  const StorageOptions storage{.state_dtype = DType::kQ8};  // the 3000 keep f32 states
  const std::size_t per_slot =
      1000000 + 4 * (NumQuantBlocks(600000) + NumQuantBlocks(400000)) + std::size_t{4} * 3000;
  LocalCommunicator one;
  EXPECT_EQ(
      DistributedOptimizer<AdamWHyper>({{}}, tensors, storage, one, {.zero = 0}).state_bytes(),
      2 * per_slot);
  std::size_t sum = 0;
  for (int rank = 0; rank < 2; ++rank) {
    PlayRank comm(rank, 2);
    sum +=
        DistributedOptimizer<AdamWHyper>({{}}, tensors, storage, comm, {.zero = 1}).state_bytes();
  }
  // The ranks' shares add up to the whole, but for the alignment of the f32 pieces.
  EXPECT_GE(sum, 2 * per_slot);
  EXPECT_LE(sum, 2 * per_slot + std::size_t{2} * 2 * 3);
}

TEST(Distributed, AnInfSkipsTheStepBitExactly) {
  for (const int zero : {0, 1}) {
    LocalCommunicator comm;
    DistributedOptimizer<AdamWHyper> opt({{.lr = 0.1}, {}}, Tensors(), {}, comm, {.zero = zero});
    LossScaler scaler;
    for (std::size_t t = 0; t < opt.num_tensors(); ++t) FillGrads(opt.grads(t), 1, t, 1.0f);
    ASSERT_TRUE(opt.Step({.scaler = &scaler}).stepped);
    std::vector<std::vector<float>> before;
    for (std::size_t t = 0; t < opt.num_tensors(); ++t) {
      before.push_back(ParamsOf(opt, t, DType::kF32));
      for (const auto& s : opt.state(t, kExpAvg)) before.push_back(s.values);
      FillGrads(opt.grads(t), 2, t, 1.0f);
    }
    opt.grads(1)[123] = std::numeric_limits<float>::infinity();
    const float scale = scaler.scale();
    const StepResult r = opt.Step({.scaler = &scaler});
    EXPECT_FALSE(r.stepped);
    EXPECT_TRUE(r.found_inf);
    EXPECT_EQ(scaler.scale(), scale * 0.5f);
    std::size_t k = 0;
    for (std::size_t t = 0; t < opt.num_tensors(); ++t) {
      EXPECT_TRUE(BitEqual(before[k++], ParamsOf(opt, t, DType::kF32)));
      for (const auto& s : opt.state(t, kExpAvg)) EXPECT_TRUE(BitEqual(before[k++], s.values));
      EXPECT_EQ(opt.step_count(t), 1);
    }
  }
}

TEST(Distributed, InvalidOptionsAreRefusedNamingThem) {
  LocalCommunicator comm;
  const auto message = [&](auto make) {
    try {
      make();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::vector<TensorSpec> t = Tensors();
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}, {}}, t, {}, comm, {.zero = 2});
            }).find("invalid zero: 2"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}, {}}, t, {}, comm, {.bucket_bytes = 0});
            }).find("invalid bucket size: 0"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}, {}}, t, {.grad_dtype = DType::kBF16}, comm);
            }).find("invalid grad_dtype: bf16"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}, {}}, t, {.accumulation_steps = 2}, comm);
            }).find("invalid accumulation_steps: 2"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdampHyper>({{}, {}}, t, {}, comm, {.zero = 1});
            }).find("adamp reduces over whole tensors"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}}, t, {}, comm);
            }).find("tensor 3: group 1 out of range"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdampHyper>({{}, {}}, t, {.state_dtype = DType::kQ8}, comm);
            }).find("8-bit states (state_dtype q8) are not for adamp: its sums are per row"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}, {}}, t, {.state_dtype = DType::kQ8}, comm,
                                               {.shard_align = 64});
            }).find("invalid shard_align: 64 (8-bit states need a multiple of 256"),
            std::string::npos);
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{.lr = -1.0}, {}}, t, {}, comm);
            }).find("lr"),
            std::string::npos);
  // A rank whose layout differs: every rank sees it in the gathered hashes.
  PlayRank other(0, 2);
  other.gather_hash_offset_ = 42;
  EXPECT_NE(message([&] {
              DistributedOptimizer<AdamWHyper>({{}, {}}, t, {}, other);
            }).find("rank 1's layout differs from rank 0's"),
            std::string::npos);

  // Checkpoint slicing: a whole state of another size, a slot out of range, masters that are off.
  {
    DistributedOptimizer<AdamWHyper> o({{}, {}}, t, {}, comm);
    EXPECT_NE(message([&] {
                o.LoadState(kExpAvg, std::vector<float>(5));
              }).find("LoadState: 5 values for a model of 71003 elements"),
              std::string::npos);
    EXPECT_NE(message([&] { o.GatherState(7); }).find("GatherState: invalid state slot 7"),
              std::string::npos);
    EXPECT_NE(message([&] {
                o.GatherState(DistributedOptimizer<AdamWHyper>::kMasterSlot);
              }).find("no f32 masters"),
              std::string::npos);
    EXPECT_NE(message([&] { o.set_step_count(0, -1); }).find("invalid step -1"), std::string::npos);
  }

  // A step refused for its options changes nothing.
  DistributedOptimizer<AdamWHyper> opt({{}, {}}, t, {}, comm);
  for (std::size_t i = 0; i < opt.num_tensors(); ++i) FillGrads(opt.grads(i), 1, i, 1.0f);
  const std::vector<float> before = ParamsOf(opt, 1, DType::kF32);
  EXPECT_NE(message([&] { opt.Step({.max_grad_norm = -1.0}); }).find("invalid max_grad_norm"),
            std::string::npos);
  opt.group(0).lr = -1.0;
  EXPECT_THROW(opt.Step(), Error);
  EXPECT_TRUE(BitEqual(before, ParamsOf(opt, 1, DType::kF32)));
  EXPECT_EQ(opt.step_count(1), 0);
}

}  // namespace
}  // namespace fusedopt
