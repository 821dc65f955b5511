// What python/fusedopt/distributed.py takes from the C++ data-parallel layer, so that one policy
// serves both: _C.ShardLayout (include/fusedopt/distributed.h: where tensors, buckets and shards
// lie for P ranks) and, per algorithm, whether ZeRO-1 can shard it and, for those whose norms run
// over whole tensors (LAMB, LARS), the step whose per-segment sums a Python callable completes
// across ranks (src/core/step_hooks.h: the hook DistributedOptimizer's own ZeRO-1 step uses), and
// _C.ShardSums, how that callable packs and adds them (src/distributed/shard_sums.h).

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedopt/distributed.h"
#include "fusedopt/error.h"
#include "fusedopt/runtime.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/distributed/shard_sums.h"
#include "src/python/segment_table.h"

namespace py = pybind11;

namespace fusedopt {
namespace {

using SpecTuple = std::tuple<std::size_t, std::uint32_t, std::size_t, std::size_t>;  // TensorSpec
using SpecTuple3 = std::tuple<std::size_t, std::size_t, std::size_t>;  // FactoredShard
// What Python's hook gets and gives back: every segment's k sums, in segment order.
using PySumsHook = std::function<std::vector<double>(std::vector<double>, std::size_t)>;

ShardLayout MakeLayout(const std::vector<SpecTuple>& specs, std::size_t num_groups, int ranks,
                       std::size_t bucket_bytes, std::size_t align, std::size_t tensor_align) {
  std::vector<TensorSpec> tensors;
  tensors.reserve(specs.size());
  for (const auto& [numel, group, rows, cols] : specs) {
    tensors.push_back({.numel = numel, .group = group, .rows = rows, .cols = cols});
  }
  // Buckets hold bucket_bytes of f32 gradient, as DistributedOptimizer's constructor counts them.
  return ShardLayout(tensors, num_groups, ranks, (bucket_bytes + sizeof(float) - 1) / sizeof(float),
                     align, tensor_align);
}

// The step over `table` (no pre-pass: the caller clipped and checked), with `hook` called between
// the sums and the coefficients; the counters advance after it.
template <class Hyper>
void StepWithSums(const std::vector<Hyper>& groups, const SegmentTable& table,
                  const std::vector<std::uintptr_t>& grads, const std::vector<int>& grad_dtypes,
                  float grad_scale, int num_threads, const PySumsHook& hook) {
  py::gil_scoped_release release;
  const std::vector<Segment> segments = table.ForCall(grads, grad_dtypes, grad_scale);
  Runtime runtime(num_threads);
  const SegmentSumsHook sums_hook = [&](std::span<double> sums, std::size_t k) {
    std::vector<double> total;
    {
      py::gil_scoped_acquire acquire;
      total = hook(std::vector<double>(sums.begin(), sums.end()), k);
    }
    if (total.size() != sums.size()) {
      throw Error("step_with_sums: the hook returned " + std::to_string(total.size()) +
                  " sums for " + std::to_string(sums.size()));
    }
    std::copy(total.begin(), total.end(), sums.begin());
  };
  FusedStepWithSums(std::span<const Hyper>(groups), std::span<const Segment>(segments), runtime,
                    sums_hook);
  table.StoreSteps(segments);
}

// A step over shards' descriptions (FactoredShard or RowShard) from Python's tuples.
template <class Cut>
std::vector<Cut> CutsOf(const std::vector<SpecTuple3>& shards) {
  std::vector<Cut> cuts;
  cuts.reserve(shards.size());
  for (const auto& [a, b, c] : shards) cuts.push_back({a, b, c});
  return cuts;
}

// What Python's hook over shards gets and gives back: the sharded segments' sums, and where each
// segment's sums start (FactoredStepOverShards' layout).
using PyShardSumsHook =
    std::function<std::vector<double>(std::vector<double>, std::vector<std::size_t>)>;

// A factored algorithm's step over `table`, whose segments are shards as `shards` (whole numel,
// whole rows of a matrix cut between its rows, its columns) says, `hook` adding their sums up over
// the ranks (no pre-pass: the caller clipped and checked); the counters advance after it.
template <class Hyper>
void FactoredStepOverShardsPy(const std::vector<Hyper>& groups, const SegmentTable& table,
                              const std::vector<std::uintptr_t>& grads,
                              const std::vector<int>& grad_dtypes, float grad_scale,
                              int num_threads, const std::vector<SpecTuple3>& shards,
                              const PyShardSumsHook& hook) {
  py::gil_scoped_release release;
  const std::vector<Segment> segments = table.ForCall(grads, grad_dtypes, grad_scale);
  const std::vector<FactoredShard> cuts = CutsOf<FactoredShard>(shards);
  Runtime runtime(num_threads);
  const ShardSumsHook sums_hook = [&](std::span<double> sums,
                                      std::span<const std::size_t> offsets) {
    std::vector<double> total;
    {
      py::gil_scoped_acquire acquire;
      total = hook(std::vector<double>(sums.begin(), sums.end()),
                   std::vector<std::size_t>(offsets.begin(), offsets.end()));
    }
    if (total.size() != sums.size()) {
      throw Error("step_over_shards: the hook returned " + std::to_string(total.size()) +
                  " sums for " + std::to_string(sums.size()));
    }
    std::copy(total.begin(), total.end(), sums.begin());
  };
  FactoredStepOverShards(std::span<const Hyper>(groups), std::span<const Segment>(segments), cuts,
                         runtime, sums_hook);
  table.StoreSteps(segments);
}

// A per-row algorithm's step over `table`, whose segments are shards cut between rows as `shards`
// says (whole numel, whole rows, first row), `hook` giving each sharded segment's whole tensor's
// row sums from this rank's (k per row: the hook's third argument; no pre-pass: the caller clipped
// and checked); the counters advance after it.
using PyRowSumsHook =
    std::function<std::vector<double>(std::vector<double>, std::vector<std::size_t>, std::size_t)>;
template <class Hyper>
void RowStepOverShardsPy(const std::vector<Hyper>& groups, const SegmentTable& table,
                         const std::vector<std::uintptr_t>& grads,
                         const std::vector<int>& grad_dtypes, float grad_scale, int num_threads,
                         const std::vector<SpecTuple3>& shards, const PyRowSumsHook& hook) {
  py::gil_scoped_release release;
  const std::vector<Segment> segments = table.ForCall(grads, grad_dtypes, grad_scale);
  const std::vector<RowShard> cuts = CutsOf<RowShard>(shards);
  Runtime runtime(num_threads);
  const RowShardsHook rows{cuts,
                           [&](std::span<const double> sums, std::span<const std::size_t> offsets) {
                             py::gil_scoped_acquire acquire;
                             return hook(std::vector<double>(sums.begin(), sums.end()),
                                         std::vector<std::size_t>(offsets.begin(), offsets.end()),
                                         algos::DescriptorOf<Hyper>::kReductions);
                           }};
  RowStepOverShards(std::span<const Hyper>(groups), std::span<const Segment>(segments), runtime,
                    rows);
  table.StoreSteps(segments);
}

// zero_one[name]: whether ZeRO-1 can shard the algorithm, and the step whose per-segment sums its
// hook completes over the ranks with how many sums a segment has (None, 0 where ZeRO-1 has none);
// dtensor_sums[name]: the same step for DTensor shards (also BertAdam's, whose sums finish per
// param group), for the algorithms that have one.
template <class A>
void BindSumsSteps(py::module_& m, py::dict& zero_one, py::dict& dtensor_sums) {
  py::dict entry;
  // ZeRO-1 can shard it: element-wise, or with sums a hook completes (not per row, across tensors
  // or factored).
  entry["shards"] = kZeroOneShards<A>;
  entry["step_with_sums"] = py::none();
  entry["reductions"] = 0;  // the sums per segment the hook sees
  if constexpr (kSumsHook<A>) {
    const std::string name = std::string(A::kName) + "_step_with_sums";
    m.def(name.c_str(), &StepWithSums<typename A::Hyper>, py::arg("groups"), py::arg("table"),
          py::arg("grads"), py::arg("grad_dtypes"), py::arg("grad_scale"), py::arg("num_threads"),
          py::arg("hook"));
    py::dict sums;
    sums["step_with_sums"] = m.attr(name.c_str());
    sums["reductions"] = A::kReductions;
    dtensor_sums[A::kName] = sums;
    if constexpr (kSegmentSums<A>) {
      entry["step_with_sums"] = sums["step_with_sums"];
      entry["reductions"] = A::kReductions;
    }
  }
  zero_one[A::kName] = entry;
}

}  // namespace

void BindDistributed(py::module_& m) {
  using Bucket = ShardLayout::Bucket;
  py::class_<ShardLayout>(m, "ShardLayout",
                          "fusedopt::ShardLayout (include/fusedopt/distributed.h): specs are "
                          "(numel, group, rows, cols) per tensor")
      .def(py::init(&MakeLayout), py::arg("specs"), py::arg("num_groups"), py::arg("ranks"),
           py::arg("bucket_bytes"), py::arg("align") = 0, py::arg("tensor_align") = 1)
      .def_readonly("ranks", &ShardLayout::ranks)
      .def_readonly("align", &ShardLayout::align)
      .def_readonly("tensor_align", &ShardLayout::tensor_align)
      .def_readonly("offsets", &ShardLayout::offsets)
      .def_readonly("numel", &ShardLayout::numel)
      .def_readonly("padded", &ShardLayout::padded)
      .def_readonly("shard_total", &ShardLayout::shard_total)
      .def_property_readonly(
          "buckets",
          [](const ShardLayout& l) {
            std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> out;
            for (const Bucket& b : l.buckets) out.emplace_back(b.begin, b.shard, b.local);
            return out;
          },
          "(begin, shard, local) per bucket")
      .def(
          "slices_in",
          [](const ShardLayout& l, std::size_t begin, std::size_t end) {
            std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> out;
            for (const ShardLayout::Slice& s : l.SlicesIn(begin, end)) {
              out.emplace_back(s.tensor, s.first, s.numel);
            }
            return out;
          },
          py::arg("begin"), py::arg("end"), "(tensor, first, numel) of each piece, in flat order")
      .def("hash", &ShardLayout::Hash);
  using distributed::ShardSums;
  // f64 buffers (torch tensors' data_ptr()) by address and length: packed once per step.
  const auto doubles = [](std::uintptr_t data, std::size_t n) {
    return std::span<double>(Ptr<double>(data), n);
  };
  py::class_<ShardSums>(
      m, "ShardSums",
      "fusedopt::distributed::ShardSums (src/distributed/shard_sums.h): the "
      "whole-tensor sums of a ZeRO-1 step; pieces are (tensor, bucket) per segment")
      .def(py::init([](const std::vector<std::pair<std::size_t, std::size_t>>& pieces,
                       std::size_t buckets, std::size_t tensors, std::size_t k) {
             std::vector<distributed::ShardPiece> out;
             out.reserve(pieces.size());
             for (const auto& [tensor, bucket] : pieces) out.push_back({tensor, bucket});
             return ShardSums(std::move(out), buckets, tensors, k);
           }),
           py::arg("pieces"), py::arg("buckets"), py::arg("tensors"), py::arg("k"))
      .def_property_readonly("k", &ShardSums::k)
      .def_property_readonly("per_rank", &ShardSums::per_rank, "f64 values of one rank's pack")
      .def(
          "pack",
          [doubles](const ShardSums& s, const std::vector<double>& sums, std::uintptr_t partial,
                    std::size_t numel) { s.Pack(sums, doubles(partial, numel)); },
          py::arg("sums"), py::arg("partial"), py::arg("numel"),
          "each piece's k sums at its (bucket, tensor) of the f64 buffer `partial` (per_rank "
          "values), zeros elsewhere")
      .def(
          "add",
          [doubles](const ShardSums& s, std::size_t world, std::uintptr_t gathered,
                    std::size_t numel) {
            std::vector<double> sums(s.pieces().size() * s.k());
            s.Add(world, doubles(gathered, numel), sums);
            return sums;
          },
          py::arg("world"), py::arg("gathered"), py::arg("numel"),
          "each piece's tensor totals over every rank's pack (the f64 buffer `gathered`, world · "
          "per_rank values), added in the order of the flat range");
  py::dict zero_one, dtensor_sums;
  algos::All::ForEach([&](auto descriptor) {
    BindSumsSteps<typename decltype(descriptor)::type>(m, zero_one, dtensor_sums);
  });
  m.attr("zero_one") = zero_one;
  m.attr("dtensor_sums") = dtensor_sums;
  // AdamP's and Adafactor's steps over DTensor shards (python/fusedopt/_shards.py).
  m.def("adamp_step_over_shards", &RowStepOverShardsPy<AdampHyper>, py::arg("groups"),
        py::arg("table"), py::arg("grads"), py::arg("grad_dtypes"), py::arg("grad_scale"),
        py::arg("num_threads"), py::arg("shards"), py::arg("hook"));
  m.def("adafactor_step_over_shards", &FactoredStepOverShardsPy<AdafactorHyper>, py::arg("groups"),
        py::arg("table"), py::arg("grads"), py::arg("grad_dtypes"), py::arg("grad_scale"),
        py::arg("num_threads"), py::arg("shards"), py::arg("hook"));
}

}  // namespace fusedopt
