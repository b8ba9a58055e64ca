// `ember train`: trains one of the runner's models (ember/train/runner.h) from the command line — flags in, progress
// lines and a memory report out, or one JSON object as the last stdout line with --json (docs/cli.md).
// Invariant: this file only maps flags to RunnerOptions and prints; all training and every check of a value lives in
// the library, except which flags were given (check_given_flags).
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "ember/base/error.h"
#include "ember/core/device.h"
#include "ember/memory/allocator.h"
#include "ember/train/runner.h"
#include "tools/commands.h"

namespace ember::tools {

namespace {

struct TrainArgs {
  train::RunnerOptions o;
  std::string device = "cpu";
  std::string batch = "";
  std::string max_memory = "";
  uint64_t seed = 0;
  bool json = false, quiet = false;
};

// "auto" or a positive integer.
void parse_batch(const std::string& text, train::RunnerOptions& o) {
  if (text.empty()) return;
  if (text == "auto") {
    o.auto_batch = true;
    return;
  }
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  EMBER_CHECK(used == text.size() && v >= 1, ValueError, "--batch-size must be a positive integer or auto, got '",
              text, "'");
  o.batch_size = v;
}

// Flags whose library default is a value the flag itself cannot mean (0: "the model's default", "about 20 lines",
// "no cap"; the loader and evaluation settings of the other models): given on the command line, each is checked
// here, since RunnerOptions cannot tell a default from a given value.
void check_given_flags(const CLI::App& cmd, const TrainArgs& a) {
  const train::RunnerOptions& o = a.o;
  auto given = [&](const char* flag) { return cmd.count(flag) > 0; };
  const std::pair<const char*, int64_t> positive[] = {
      {"--steps", o.steps},         {"--epochs", o.epochs}, {"--log-interval", o.log_interval},
      {"--n-layer", o.n_layer},     {"--n-head", o.n_head}, {"--n-embd", o.n_embd},
      {"--block-size", o.block_size}};
  for (const auto& [flag, value] : positive)
    EMBER_CHECK(!given(flag) || value >= 1, ValueError, flag, " must be >= 1, got ", value);
  EMBER_CHECK(!given("--lr") || o.lr > 0.0, ValueError, "--lr must be a positive number, got ", o.lr);
  EMBER_CHECK(!given("--max-memory") || o.max_memory > 0, ValueError, "--max-memory must be above 0 bytes, got '",
              a.max_memory, "'");
  const bool mnist = o.model == "mnist-cnn", gpt = o.model == "char-gpt";
  for (const char* flag : {"--workers", "--max-test"})
    EMBER_CHECK(!given(flag) || mnist, ValueError, flag, " applies to mnist-cnn, not ", o.model);
  for (const char* flag : {"--eval-interval", "--eval-iters"})
    EMBER_CHECK(!given(flag) || gpt, ValueError, flag, " applies to char-gpt, not ", o.model);
  for (const char* flag : {"--data", "--synthetic"})
    EMBER_CHECK(!given(flag) || mnist || gpt, ValueError, flag, " applies to mnist-cnn and char-gpt; ", o.model,
                " trains on one random batch");
  for (const char* flag : {"--max-batch", "--batch-headroom"})
    EMBER_CHECK(!given(flag) || o.auto_batch, ValueError, flag, " applies to --batch-size auto");
}

void run_train(TrainArgs& a, bool seed_given) {
  train::RunnerOptions& o = a.o;
  o.device = Device(a.device);
  if (seed_given) o.seed = a.seed;
  // Human-readable lines go to stdout, or to stderr with --json so that stdout's last line is the JSON object.
  std::FILE* human = a.json ? stderr : stdout;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto printer = std::make_shared<train::ProgressPrinter>(human, isatty(fileno(human)) != 0);
  o.on_message = [printer](const std::string& text) { printer->note(text); };
  if (!a.quiet) o.on_progress = [printer](const train::Progress& p) { printer->print(p); };

  train::TrainRunner runner(o);  // checks every option before anything is allocated
  train::RunResult r;
  try {
    r = runner.run();
  } catch (...) {
    printer->finish();  // the error message starts a line of its own
    throw;
  }
  printer->finish();
  if (r.rank != 0) return;  // --ddp: rank 0 reports for the job
  std::string done = (r.world_size > 1 ? "done (" + std::to_string(r.world_size) + " ranks): step " : "done: step ") +
                     std::to_string(r.steps);
  char buf[160];
  std::snprintf(buf, sizeof buf, " in %.1f s (%.1f samples/s)", r.seconds, r.samples_per_s);
  done += buf;
  if (r.steps > r.start_step) {
    std::snprintf(buf, sizeof buf, ", final loss %.4f", r.final_loss);
    done += buf;
  }
  if (r.test_accuracy) {
    std::snprintf(buf, sizeof buf, ", test accuracy %.2f%%", 100.0 * *r.test_accuracy);
    done += buf;
  }
  if (r.val_loss) {
    std::snprintf(buf, sizeof buf, ", val loss %.4f", *r.val_loss);
    done += buf;
  }
  if (r.steps_skipped > 0) done += ", " + std::to_string(r.steps_skipped) + " steps skipped (NaN/inf gradients)";
  if (r.ooms_recovered > 0)
    done += ", " + std::to_string(r.ooms_recovered) + " out-of-memory error(s) recovered (micro-batches of " +
            std::to_string(r.micro_batch) + " rows)";
  printer->note(done);
  printer->note(runner.memory_report());
  if (a.json) std::printf("%s\n", r.to_json().c_str());
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  train::RunnerOptions& o = a->o;
  CLI::App* cmd = app.add_subcommand(
      "train", "train a model (mnist-cnn, char-gpt, or the standard mlp/cnn/gpt tasks) with progress and a memory "
               "report (docs/cli.md)");
  cmd->add_option("--model", o.model, "mnist-cnn | char-gpt | mlp | cnn | gpt")->capture_default_str();
  cmd->add_option("--data", o.data,
                  "mnist-cnn: MNIST IDX directory; char-gpt: a text file (default: ../shared/data/..., else "
                  "generated)");
  cmd->add_flag("--synthetic", o.synthetic, "train on generated data even when real data is there");
  cmd->add_option("--device", a->device, "cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_option("--batch-size", a->batch, "samples per optimizer step, or auto (the largest that fits the memory)");
  cmd->add_option("--max-batch", o.max_batch, "auto: the largest batch tried")->capture_default_str();
  cmd->add_option("--batch-headroom", o.batch_headroom,
                  "auto: the fraction of the memory limit the trials leave unused, for what they do not reproduce "
                  "(data loading, evaluation)")
      ->capture_default_str();
  cmd->add_option("--grad-accum", o.grad_accum, "micro-batches per step (must divide the batch)")
      ->capture_default_str();
  cmd->add_flag("--oom-resilient", o.oom_resilient,
                "a micro-batch that runs out of memory is dropped and its rows run again in halves, instead of the "
                "run failing");
  cmd->add_option("--amp", o.amp, "none | fp16 | bf16 | autocast-fp16 | autocast-bf16")
      ->capture_default_str()
      ->check(amp_mode_validator());
  cmd->add_option("--checkpoint", o.checkpoint, "activation checkpointing: none | sqrt | budget:SIZE")
      ->capture_default_str()
      ->check(checkpoint_policy_validator());
  cmd->add_option("--max-memory", a->max_memory,
                  "memory cap, e.g. 512MiB: cpu becomes a simulated device of that size; cuda: the allocator's "
                  "capacity");
  cmd->add_option("--epochs", o.epochs, "epochs (mnist-cnn; default 1)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // scripts/run passes one, a user's may follow
  cmd->add_option("--steps", o.steps, "the step to stop at (default: char-gpt 2000, mlp/cnn/gpt 20)");
  cmd->add_option("--lr", o.lr, "learning rate (default: mnist-cnn 3e-3, others 1e-3)");
  cmd->add_option("--seed", a->seed, "seed (default: mnist-cnn 1, char-gpt 1337, others 0)");
  cmd->add_option("--workers", o.workers, "mnist-cnn data-loader threads")->capture_default_str();
  cmd->add_option("--max-test", o.max_test, "mnist-cnn: evaluate on the first N test images");
  cmd->add_option("--n-layer", o.n_layer, "char-gpt: transformer blocks (default 4)");
  cmd->add_option("--n-head", o.n_head, "char-gpt: attention heads (default 4)");
  cmd->add_option("--n-embd", o.n_embd, "char-gpt: width (default 128)");
  cmd->add_option("--block-size", o.block_size, "char-gpt: context length (default 64)");
  cmd->add_option("--eval-interval", o.eval_interval, "char-gpt: evaluate every N steps")->capture_default_str();
  cmd->add_option("--eval-iters", o.eval_iters, "char-gpt: batches per evaluation")->capture_default_str();
  cmd->add_option("--save", o.save_path,
                  "write a training checkpoint at the end, atomically (weights, optimizer, schedule, RNG and loader "
                  "state; safetensors)");
  cmd->add_option("--resume", o.resume_path, "continue bit-exactly from a checkpoint written by --save");
  cmd->add_option("--trace", o.trace_path, "write the allocator's trace (Chrome JSON; .jsonl: JSON Lines)");
  cmd->add_option("--html", o.html_path, "write the memory timeline page");
  cmd->add_option("--trace-steps", o.trace_steps, "steps traced (from program start)")->capture_default_str();
  cmd->add_option("--log-interval", o.log_interval, "steps between progress lines (default: about 20 per run)");
  cmd->add_flag("--ddp", o.ddp,
                "data parallelism under `mpirun -np N`: each rank trains on its rows of every batch (DDP over MPI); "
                "rank 0 prints and writes files");
  cmd->add_flag("--json", a->json, "print one JSON object as the last stdout line (progress goes to stderr)");
  cmd->add_flag("--quiet", a->quiet, "no progress lines");
  cmd->callback([a, cmd] {
    try {
      parse_batch(a->batch, a->o);
      if (!a->max_memory.empty()) a->o.max_memory = memory::parse_bytes(a->max_memory, "--max-memory");
      check_given_flags(*cmd, *a);
      run_train(*a, cmd->count("--seed") > 0);
    } catch (const Error&) {
      throw;
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {  // a standard-library failure becomes an ember error: one line, exit 1
      throw Error(e.what());
    }
  });
}

}  // namespace ember::tools
