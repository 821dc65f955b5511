// `fusedopt bench-dist`, under mpirun: the data-parallel step three ways on a model's shapes,
// interleaved round by round: (a) all-reduce every bucket, then one update (allreduce_then_step),
// (b) each bucket updated as soon as its sums land (pipelined), (c) ZeRO-1 (reduce-scatter, shard
// update, all-gather). A step's time is the slowest rank's; the bytes sent are the ring volumes
// the communicator counts; the exposed communication is the time a step spent blocked in waits.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "fusedopt/distributed.h"
#include "fusedopt/mpi_communicator.h"
#include "fusedopt/runtime.h"
#include "src/algos/registry.h"
#include "src/core/step_hooks.h"
#include "src/tool_util/model_shapes.h"
#include "tools/cli/command.h"

namespace fusedopt::cli {
namespace {

struct DistBenchOptions {
  std::string optimizer = "adamw";
  std::string shapes;
  std::size_t numel = 0;
  double bucket_mb = 25.0;
  int rounds = 20;
  int warmup = 3;
  int threads = 0;  // 0: ThreadsPerRank's choice
  std::string state_dtype = "f32";
};

struct Impl {
  Impl(const char* n, DistributedOptions o) : name(n), options(o) {}
  const char* name;
  DistributedOptions options;
  std::vector<double> ms, exposed_ms;
  std::uint64_t bytes_sent = 0;
  std::size_t state_bytes = 0;
};

// The tensors of the model (or one flat tensor), with the row and column sizes the algorithms
// that reduce per row or factor need.
template <class A>
std::vector<TensorSpec> Specs(const DistBenchOptions& o) {
  if (o.numel > 0) return {{.numel = o.numel}};
  std::vector<TensorSpec> specs;
  for (const tools::TensorShape& t : tools::GetModelShapes(o.shapes).tensors) {
    TensorSpec s{.numel = t.numel};
    const std::size_t n = t.dims.size();
    if (n > 1 && algos::Factored<A>) {
      s.rows = t.dims[n - 2];
      s.cols = t.dims[n - 1];
    } else if (n > 1 && algos::RowReductions<A>) {
      s.rows = t.dims[0];
    }
    specs.push_back(s);
  }
  return specs;
}

double MaxOverRanks(Communicator& comm, double value) {
  comm.AllReduce(&value, 1, CommType::kF64, ReduceOp::kMax);
  return value;
}

template <class A>
nlohmann::json Run(const DistBenchOptions& o, Communicator& comm, const ThreadChoice& threads,
                   std::ostream& out, std::ostream& progress) {
  using Hyper = typename A::Hyper;
  const std::vector<TensorSpec> specs = Specs<A>(o);
  std::size_t numel = 0;
  for (const TensorSpec& s : specs) numel += s.numel;
  const auto bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20));
  std::vector<Impl> impls = {
      {"allreduce_then_step", {.zero = 0, .bucket_bytes = bucket_bytes, .pipeline = false}},
      {"pipelined", {.zero = 0, .bucket_bytes = bucket_bytes}}};
  if constexpr (kZeroOneShards<A>) {
    impls.emplace_back("zero1", DistributedOptions{.zero = 1, .bucket_bytes = bucket_bytes});
  }
  const StorageOptions storage{.state_dtype = o.state_dtype == "q8" ? DType::kQ8 : DType::kF32};
  std::vector<std::unique_ptr<DistributedOptimizer<Hyper>>> opts;
  for (Impl& impl : impls) {
    opts.push_back(std::make_unique<DistributedOptimizer<Hyper>>(std::vector<Hyper>{Hyper{}}, specs,
                                                                 storage, comm, impl.options));
    for (std::size_t t = 0; t < specs.size(); ++t) {
      tools::Fill(opts.back()->template params<float>(t).data(), DType::kF32, specs[t].numel, 1.0f,
                  static_cast<std::uint32_t>(t));
    }
    impl.state_bytes = opts.back()->state_bytes();
  }
  const bool leader = comm.rank() == 0;
  // Each round runs the impls in the next of all their orders: every impl runs equally often
  // right after each other one (a step measured 40 % slower right after ZeRO-1's collectives than
  // after the others' when the order only rotated).
  std::vector<std::size_t> order(impls.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (int round = -o.warmup; round < o.rounds; ++round) {
    std::next_permutation(order.begin(), order.end());
    for (const std::size_t i : order) {
      // Fresh gradients (the reduction overwrote the last ones with their sums), then every rank
      // starts the timed step together.
      for (std::size_t t = 0; t < specs.size(); ++t) {
        tools::Fill(opts[i]->grads(t).data(), DType::kF32, specs[t].numel, 1e-3f,
                    static_cast<std::uint32_t>(1000 * static_cast<std::size_t>(comm.rank()) + t));
      }
      MaxOverRanks(comm, 0.0);
      comm.reset_bytes_sent();
      const auto begin = std::chrono::steady_clock::now();
      opts[i]->Step();
      const auto end = std::chrono::steady_clock::now();
      const std::uint64_t bytes = comm.bytes_sent();
      const double ms =
          MaxOverRanks(comm, std::chrono::duration<double, std::milli>(end - begin).count());
      const double exposed = MaxOverRanks(comm, opts[i]->last_exposed_comm_ms());
      if (round < 0) continue;
      impls[i].ms.push_back(ms);
      impls[i].exposed_ms.push_back(exposed);
      impls[i].bytes_sent = bytes;
    }
    if (leader && round >= 0 && ((round + 1) % 5 == 0 || round + 1 == o.rounds)) {
      progress << "bench-dist: round " << round + 1 << "/" << o.rounds << "\n";
    }
  }

  nlohmann::json report = {{"ranks", comm.size()},
                           {"threads_per_rank", threads.threads},
                           {"optimizer", o.optimizer},
                           {"state_dtype", o.state_dtype},
                           {"shapes", o.numel > 0 ? "numel" : o.shapes},
                           {"numel", numel},
                           {"tensors", specs.size()},
                           {"bucket_mb", o.bucket_mb},
                           {"rounds", o.rounds},
                           {"impls", nlohmann::json::object()}};
  const double baseline = tools::Median(impls[0].ms);
  std::ostringstream table;
  table << "fusedopt bench-dist: " << o.optimizer << " (" << o.state_dtype << " states), "
        << tools::FormatCount(numel) << " params in " << specs.size() << " tensors, " << comm.size()
        << " ranks, buckets of " << tools::Num(o.bucket_mb) << " MiB; median of " << o.rounds
        << " rounds (the slowest rank's step)\n"
        << "threads per rank: " << threads.threads << " (" << threads.reason << ")\n\n"
        << "| impl | step ms | vs allreduce_then_step | exposed comm ms | bytes sent/rank | state "
           "bytes/rank |\n|---|---|---|---|---|---|\n";
  for (const Impl& impl : impls) {
    const double median = tools::Median(impl.ms);
    const double exposed = tools::Median(impl.exposed_ms);
    report["impls"][impl.name] = {{"median_ms", median},
                                  {"bytes_sent_per_rank", impl.bytes_sent},
                                  {"state_bytes_per_rank", impl.state_bytes},
                                  {"exposed_comm_ms", exposed}};
    table << "| " << impl.name << " | " << tools::Fixed(median, 2) << " | "
          << tools::Fixed(median / baseline, 2) << " | " << tools::Fixed(exposed, 2) << " | "
          << tools::FormatCount(impl.bytes_sent) << " | " << tools::FormatCount(impl.state_bytes)
          << " |\n";
  }
  if (leader) out << table.str();
  return report;
}

}  // namespace

Command AddBenchDistCommand(CLI::App& app) {
  struct Values {
    DistBenchOptions options;
    std::string json_path;
  };
  auto values = std::make_shared<Values>();
  DistBenchOptions& options = values->options;
  CLI::App* parser = app.add_subcommand(
      "bench-dist",
      "Under mpirun: the data-parallel step as all-reduce then step, pipelined buckets and "
      "ZeRO-1, interleaved; time, bytes sent, state bytes and exposed communication per rank");
  parser->add_option("--optimizer", options.optimizer, "An algorithm of the registry")
      ->check(CLI::IsMember(AlgorithmNames()))
      ->capture_default_str();
  AddShapesOrNumelOptions(*parser, options.shapes, options.numel);
  parser->add_option("--bucket-mb", options.bucket_mb, "Gradient MiB per bucket (DDP: 25)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  parser->add_option("--rounds", options.rounds, "Timed rounds (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  parser->add_option("--warmup", options.warmup, "Untimed rounds first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  parser
      ->add_option("--threads", options.threads,
                   "Threads per rank (0: OMP_NUM_THREADS if set, else the host's CPUs shared "
                   "among its ranks)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  parser
      ->add_option("--state-dtype", options.state_dtype,
                   "f32, or q8: 8-bit block-wise states (not AdamP, Adafactor)")
      ->check(CLI::IsMember({"f32", "q8"}))
      ->capture_default_str();
  parser->add_option("--json", values->json_path, "Also write the report as JSON (rank 0)");

  return {parser, [values] {
            return RunCommand("bench-dist", [&] {
              DistBenchOptions& o = values->options;
              if (o.shapes.empty() && o.numel == 0) o.shapes = "mobilenet_v1";
              if (!values->json_path.empty()) CheckWritable(values->json_path);  // before timing
              int argc = 0;
              char** argv = nullptr;
              const mpi::MpiSession session(&argc, &argv);
              nlohmann::json report;
              {
                mpi::MpiCommunicator comm;
                // The ranks on this host share its CPUs: a thread per CPU in every rank
                // oversubscribes them, and OpenMP's idle threads spin for milliseconds after each
                // of the pipelined step's parallel regions (docs/distributed.md).
                const ThreadChoice threads = ThreadsPerRank(o.threads, comm.local_size());
                DefaultRuntime().set_num_threads(threads.threads);
                const std::vector<std::string> names = AlgorithmNames();
                const auto index = static_cast<std::size_t>(
                    std::find(names.begin(), names.end(), o.optimizer) - names.begin());
                report = algos::All::Visit(index, [&](auto d) {
                  return Run<typename decltype(d)::type>(o, comm, threads, std::cout, std::cerr);
                });
                if (comm.rank() == 0 && !values->json_path.empty()) {
                  WriteTextFile(values->json_path, report.dump(2) + "\n");
                  std::cout << "wrote " << values->json_path << "\n";
                }
              }
            });
          }};
}

}  // namespace fusedopt::cli
