// `fusedopt train`: the CLI over tools/train/run.h, writing the report files (JSON, Markdown, PNG
// chart through tools/train_chart.py in the project's .venv) and the trace.

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "tools/cli/command.h"
#include "tools/train/run.h"

namespace fusedopt::cli {
namespace {

std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The chart is drawn by matplotlib (tools/train_chart.py) in the project's .venv, or in
// $FOPT_PYTHON; returns false (and says why) when that Python is not there, and throws
// std::runtime_error naming the chart when it is there but fails (e.g. cannot write the PNG).
bool DrawChart(const std::string& json_path, const std::string& png_path) {
  const char* env = std::getenv("FOPT_PYTHON");
  const std::string python = env != nullptr ? env : FOPT_SOURCE_DIR "/.venv/bin/python";
  const std::string script = FOPT_SOURCE_DIR "/tools/train_chart.py";
  if (!std::filesystem::exists(python) || !std::filesystem::exists(script)) {
    std::cerr << "chart skipped: " << python << " or " << script << " not found\n";
    return false;
  }
  const std::string command =
      Quoted(python) + " " + Quoted(script) + " " + Quoted(json_path) + " " + Quoted(png_path);
  if (std::system(command.c_str()) != 0)
    throw std::runtime_error("cannot draw the chart '" + png_path + "': " + command + " failed");
  return true;
}

}  // namespace

Command AddTrainCommand(CLI::App& app) {
  struct Values {
    train::TrainOptions options;
    bool compare = false;
    std::string impl = "fused";
    std::string out_dir = "train-results";
    std::string json_path, markdown_path, chart_path;
    double lr = 0.0, weight_decay = 0.0;  // given: TrainOptions' optional values
    bool quiet = false;
    bool dist = false;
    train::DistTrainOptions dist_options;
  };
  auto values = std::make_shared<Values>();
  train::TrainOptions& o = values->options;
  CLI::App* parser = app.add_subcommand(
      "train",
      "Train a model with libtorch and a torch::optim or fusedopt optimizer; --compare runs both "
      "in turn and prints a comparison table (throughput, optimizer time and share, speedup, "
      "Amdahl "
      "bound)");
  parser->add_option("--model", o.model.name, "mobilenet_v1, resnet18 or transformer_small")
      ->capture_default_str();
  parser
      ->add_option("--optimizer", o.optimizer,
                   "adamw (lr 1e-3, wd 1e-2), sgd (lr 0.01, momentum 0.9, wd 1e-4), adam, "
                   "rmsprop, adagrad (torch::optim's), or " +
                       train::OtherOptimizers() +
                       " (the reference's defaults; impl torch runs the reference's for-loop "
                       "step in ATen ops)")
      ->capture_default_str();
  parser->add_option("--impl", values->impl, "torch (torch::optim) or fused (fusedopt::pt)")
      ->capture_default_str();
  parser->add_flag("--compare", values->compare,
                   "Run torch and fused in turn on copies of one model and the same batches");
  CLI::Option* lr =
      parser->add_option("--lr", values->lr, "Learning rate (default: per optimizer, above)");
  CLI::Option* weight_decay = parser->add_option("--weight-decay", values->weight_decay,
                                                 "Weight decay (default: per optimizer)");
  parser->add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  parser->add_flag("--nesterov", o.nesterov, "SGD with Nesterov momentum");
  parser->add_option("--batch-size", o.data.batch_size, "Samples per micro-batch")
      ->capture_default_str();
  parser->add_option("--image-size", o.model.image_size, "Image models: input height and width")
      ->capture_default_str();
  // The spelling of scripts/bench-train; --classes and --data are the older names, still accepted.
  parser
      ->add_option("--num-classes,--classes", o.model.num_classes,
                   "Image models: classes (synthetic data)")
      ->capture_default_str();
  parser
      ->add_option("--dataset,--data", o.data.data,
                   "synthetic or digits (scikit-learn's, image models)")
      ->capture_default_str();
  o.data.digits_csv = FOPT_DIGITS_CSV;
  parser->add_option("--digits-csv", o.data.digits_csv, "The digits data as CSV (scripts/build)")
      ->capture_default_str();
  parser->add_option("--steps", o.steps, "Timed optimizer updates per impl")->capture_default_str();
  parser->add_option("--warmup", o.warmup, "Untimed updates first")->capture_default_str();
  parser->add_option(
      "--threads", o.threads,
      "Threads for libtorch and fusedopt (0: OMP_NUM_THREADS, else one per core; with --dist, "
      "OMP_NUM_THREADS if set, else the host's CPUs shared among its ranks)");
  parser->add_option("--dtype", o.dtype, "f32, or bf16 (CPU autocast for forward)")
      ->capture_default_str();
  parser
      ->add_option("--state-dtype", o.state_dtype,
                   "The fused optimizer's states: f32, bf16, or q8 (8-bit block-wise, "
                   "docs/8bit-states.md); torch's stay f32")
      ->capture_default_str();
  parser->add_option("--accumulation-steps", o.accumulation_steps, "Micro-batches per update")
      ->capture_default_str();
  parser->add_option("--clip", o.max_grad_norm, "Clip the global gradient norm to MAX_NORM")
      ->type_name("MAX_NORM");
  parser->add_option("--lr-warmup", o.lr_warmup,
                     "Warmup + cosine schedule: linear warmup over this many updates, then cosine "
                     "decay to lr/100 at the last step (0: constant lr)");
  parser
      ->add_option("--out", values->out_dir,
                   "With --compare: the folder for <model>_<optimizer>.json/.md/.png")
      ->capture_default_str();
  parser->add_option("--json", values->json_path, "Write the report as JSON here");
  parser->add_option("--markdown", values->markdown_path, "Write the table as Markdown here");
  parser->add_option("--chart", values->chart_path, "Draw the per-phase step breakdown (PNG)");
  parser->add_option("--trace", o.trace_path, "Write a Chrome trace-event timeline (JSON) here");
  parser->add_flag("--quiet", values->quiet, "No progress bar");
  parser->add_option("--checkpoint-dir", o.checkpoint_dir,
                     "One --impl: write step-NNNNNNNN.safetensors checkpoints here (--dist: each a "
                     "shard set, every rank its file; docs/checkpoints.md)");
  parser->add_option("--checkpoint-every", o.checkpoint_every, "A checkpoint every N updates")
      ->type_name("N");
  parser->add_option("--keep-last", o.keep_last, "Keep the newest K checkpoints (0: all)")
      ->type_name("K");
  parser->add_flag("--resume", o.resume,
                   "Continue from the newest checkpoint in --checkpoint-dir that verifies");
#ifdef FOPT_CLI_WITH_MPI
  parser->add_flag("--dist", values->dist,
                   "Under mpirun: data-parallel training, each rank on 1/P of every batch, the "
                   "fused optimizer folded into the gradient reduction (rank 0 reports)");
  parser
      ->add_option("--zero", values->dist_options.zero,
                   "With --dist: 0 (data parallel) or 1 "
                   "(ZeRO-1: optimizer state sharded)")
      ->capture_default_str();
  parser
      ->add_option("--bucket-mb", values->dist_options.bucket_mb,
                   "With --dist: gradient MiB per bucket (DDP: 25)")
      ->capture_default_str();
  parser->add_flag("--reference", values->dist_options.reference,
                   "With --dist: rank 0 also trains one process on the whole batches "
                   "(fusedopt::pt) and reports how far the losses are from it");
#endif

  return {
      parser, [values, lr, weight_decay] {
        return RunCommand("train", [&] {
          Values& v = *values;
          train::TrainOptions& options = v.options;
          if (lr->count() > 0) options.lr = v.lr;
          if (weight_decay->count() > 0) options.weight_decay = v.weight_decay;
          options.impls = v.compare ? std::vector<std::string>{"torch", "fused"}
                                    : std::vector<std::string>{v.impl};
          options.schedule = options.lr_warmup > 0;
          options.progress = !v.quiet;
          const std::string stem = v.out_dir + "/" + options.model.name + "_" + options.optimizer;
          if (v.compare) {
            if (v.json_path.empty()) v.json_path = stem + ".json";
            if (v.markdown_path.empty()) v.markdown_path = stem + ".md";
            if (v.chart_path.empty()) v.chart_path = stem + ".png";
          }
          if (v.dist && (v.compare || !v.markdown_path.empty() || !v.chart_path.empty())) {
            throw std::invalid_argument(
                "--dist reports as text, --json and --trace (not --compare, --markdown or "
                "--chart)");
          }
          std::string json_path = v.json_path;
          if (json_path.empty() && !v.chart_path.empty()) json_path = v.chart_path + ".json";
          // Fail before training, not after it; creates nothing, so a failed run leaves no
          // file.
          for (const std::string* path :
               {&json_path, &v.markdown_path, &v.chart_path, &options.trace_path}) {
            if (!path->empty()) CheckWritable(*path);
          }
#ifdef FOPT_CLI_WITH_MPI
          const nlohmann::json report =
              v.dist ? train::RunDistributedTraining(options, v.dist_options, std::cout, std::cerr)
                     : train::RunTraining(options, std::cout, std::cerr);
#else
          const nlohmann::json report = train::RunTraining(options, std::cout, std::cerr);
#endif
          if (report.is_null()) return;  // --dist: ranks other than 0 report nothing
          if (!json_path.empty()) {
            WriteTextFile(json_path, report.dump(2) + "\n");
            std::cout << "report: " << json_path << "\n";
          }
          if (!v.markdown_path.empty()) {
            WriteTextFile(v.markdown_path, train::MarkdownTable(report));
            std::cout << "table:  " << v.markdown_path << "\n";
          }
          if (!v.chart_path.empty() && DrawChart(json_path, v.chart_path)) {
            std::cout << "chart:  " << v.chart_path << "\n";
          }
          if (!options.trace_path.empty()) {
            std::cout << "trace:  " << options.trace_path
                      << " (open in https://ui.perfetto.dev or chrome://tracing)\n";
          }
        });
      }};
}

}  // namespace fusedopt::cli
