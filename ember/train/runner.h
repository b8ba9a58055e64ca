// TrainRunner: a whole training run behind one object (what `ember train` runs, docs/cli.md) — allocator set-up, data,
// model, trainer, schedule, checkpoint plan, batch search, the step loop, evaluation, progress, save/resume, traces
// and the memory report. Invariant: options are validated before anything is allocated, and the allocator is
// configured (capacity, trace) before the first tensor exists (Note [Allocator first] in runner.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ember/core/device.h"
#include "ember/nn/module.h"
#include "ember/train/amp.h"
#include "ember/train/progress.h"

namespace ember::train {

struct RunnerOptions {
  // mnist-cnn: nn::MnistNet on MNIST through a DataLoader, AdamW 3e-3 with warmup + cosine, test accuracy per epoch.
  // char-gpt:  nanoGPT's character GPT on Tiny Shakespeare, AdamW 1e-3 (betas 0.9/0.99, weight decay 0.1 on
  //            matrices), warmup + cosine to lr/10, clipping at 1.0, train/val loss every eval_interval steps.
  // mlp | cnn | gpt: the standard synthetic tasks (make_standard_task: one fixed random batch), AdamW 1e-3.
  std::string model = "mnist-cnn";
  // mnist-cnn: a directory with the IDX files; char-gpt: a text file. Empty: ../shared/data/mnist or
  // ../shared/data/tinyshakespeare/input.txt when it exists, else generated data. A given path must exist.
  std::string data;
  bool synthetic = false;         // generated data even when real data is there
  Device device = Device::cpu();
  int64_t batch_size = 0;         // samples per optimizer step; 0: the model's default (64, 12, 256, 64, 12)
  bool auto_batch = false;        // find_batch_size: the largest micro-batch whose step fits the memory limit
  int64_t max_batch = 4096;       // the search's upper end
  double batch_headroom = 0.05;   // the fraction of the limit the search's trials leave unused (batch_finder.h)
  // Bytes: on the CPU the allocator becomes a simulated device of this capacity (before anything is allocated — its
  // data sets count too); on CUDA the allocator's capacity setting. 0: no cap (the device's memory).
  int64_t max_memory = 0;
  int64_t grad_accum = 1;         // micro-batches per step (GradAccumulator); must divide the batch
  // Steps through train::OomResilientStep: a micro-batch that runs out of memory is dropped and its rows run again in
  // halves (the size that worked is kept for the following steps), instead of the run failing. Not with ddp.
  bool oom_resilient = false;
  std::string amp = "none";       // parse_amp_mode
  std::string checkpoint = "none";  // CheckpointPolicy::parse; models with a block chain only (char-gpt, gpt, mlp)
  int64_t epochs = 0;             // mnist-cnn only; 0: 1 epoch unless steps is set
  int64_t steps = 0;              // the step to end at (total, resumed steps included); 0: the model's default
  double lr = 0.0;                // 0: the model's default
  std::optional<uint64_t> seed;   // unset: 1 (mnist-cnn), 1337 (char-gpt), 0 (standard tasks)
  int64_t workers = 1;            // mnist-cnn loader threads
  int64_t max_test = -1;          // mnist-cnn: evaluate on the first N test images (-1: all)
  // char-gpt's shape (0: nanoGPT's CPU config 4 / 4 / 128 / 64, or the resumed checkpoint's) and evaluation.
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
  int64_t eval_interval = 250, eval_iters = 20;
  std::string save_path;          // a training checkpoint written at the end (train/training_checkpoint.h, atomic)
  // A checkpoint to continue from: its step, weights, optimizer, loss scaler, schedule, generator states and loader
  // position, restored last in setup so the steps continue bit-identically (Note [Exact resume] in runner.cpp).
  std::string resume_path;
  std::string trace_path;         // the allocator's trace as a file (Chrome JSON, or JSON Lines for .jsonl)
  std::string html_path;          // the trace as a timeline page
  int64_t trace_steps = 2;        // steps traced (from program start) before the trace files are written
  int64_t log_interval = 0;       // steps between progress records; 0: about 20 per run
  // Data parallelism (launch with `mpirun -np N`): every rank trains on its rows of each batch (batch_size is the
  // global batch: it must divide into N ranks x grad_accum micro-batches) through dist::DistributedDataParallel over
  // the MPI group (cpu); only rank 0 reports (on_message, on_progress) and writes save/trace/html files.
  bool ddp = false;
  std::function<void(const Progress&)> on_progress;   // optional
  std::function<void(const std::string&)> on_message;  // optional: what the run is doing, one or more lines
};

struct RunResult {
  std::string model, device, amp, checkpoint, data;  // data: "real MNIST", a file path or "generated ..."
  int64_t steps = 0;        // the step the run ended at
  int64_t start_step = 0;   // the step it started from (> 0 when resumed)
  int64_t epochs = 0;       // epochs begun (mnist-cnn)
  int64_t batch_size = 0, grad_accum = 1, micro_batch = 0, parameters = 0;
  double final_loss = 0.0;  // the last step's training loss
  std::optional<double> test_accuracy;  // mnist-cnn
  std::optional<double> val_loss, train_loss;  // char-gpt: the last evaluation
  int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;  // the device allocator, over the step loop
  double samples_per_s = 0.0, seconds = 0.0;  // training steps only
  int64_t steps_skipped = 0;                  // NaN/inf steps of loss-scaled modes
  int64_t ooms_recovered = 0;                 // --oom-resilient: OutOfMemoryErrors the steps recovered from
  int64_t world_size = 1, rank = 0;           // --ddp: losses and samples_per_s are the whole job's
  std::string batch_search;                   // the batch search's table (auto), else empty
  std::string to_json() const;                // one line
};

class TrainRunner {
 public:
  // Checks every option (ValueError / ConfigError naming the flag) and reads a resume file's header; allocates
  // nothing.
  explicit TrainRunner(RunnerOptions options);
  ~TrainRunner();
  TrainRunner(const TrainRunner&) = delete;
  TrainRunner& operator=(const TrainRunner&) = delete;

  // Prepares the allocator, loads the data, builds model and trainer, resumes, searches the batch size. run() calls
  // it when it has not run yet.
  void setup();
  // The step loop to options.steps / epochs, evaluation, the trace files and the checkpoint; returns the report.
  RunResult run();

  nn::Module& model();
  AmpTrainer& trainer();
  int64_t step() const;           // optimizer steps done
  int64_t batch_size() const;     // after setup: the batch per step (the search's result for auto)
  const RunnerOptions& options() const;
  // Writes the training checkpoint now (what --save writes at the end; also from an on_progress callback).
  void save(const std::string& path) const;
  // The device allocator's statistics line, the attribution report by module and phase, and the peaks.
  std::string memory_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The model names TrainRunner takes.
const char* runner_models();  // "mnist-cnn, char-gpt, mlp, cnn, gpt"

}  // namespace ember::train
