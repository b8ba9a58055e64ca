// The training recipes behind TrainRunner (runner.h), one class per model family: where the data comes from, how the
// model is built and optimised, the loss of a micro-batch, a random batch for batch-size trials, evaluation, and the
// architecture entries a checkpoint records. Internal to the train layer (namespace detail).
// Invariant: a recipe draws its model's initial values from the default generator right after manual_seed(seed), so
// the same options build the same model; its batches are on the runner's device.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ember/data/dataloader.h"
#include "ember/nn/module.h"
#include "ember/nn/safetensors.h"
#include "ember/optim/lr_scheduler.h"
#include "ember/optim/mixed_precision.h"
#include "ember/train/amp.h"
#include "ember/train/grad_accum.h"
#include "ember/train/runner.h"

namespace ember::train::detail {

// The tensors a safetensors file holds, name -> shape (read from its header without the data).
using TensorShapes = std::map<std::string, std::vector<int64_t>>;

class RunTask {
 public:
  RunTask(const RunnerOptions& options, uint64_t seed) : o_(options), seed_(seed) {}
  virtual ~RunTask() = default;
  RunTask(const RunTask&) = delete;
  RunTask& operator=(const RunTask&) = delete;

  // Loads or generates the data; `planned_samples` bounds what the run can draw (-1: a whole data set). Returns a
  // description ("real MNIST (60000 train, 10000 test images) from DIR").
  virtual std::string load_data(int64_t planned_samples) = 0;
  // Resuming: takes what the checkpoint recorded about the data (architecture()'s entries) before load_data, e.g. the
  // size of a generated set, so the resumed run sees the same data.
  virtual void adopt_data(const nn::SafetensorsMetadata& meta) {}
  // Checks a resume file's architecture entries against the options and against the file's own tensor shapes
  // (`shapes`: name -> shape, from the header), adopting the entries the options left unset (ValueError on a
  // mismatch). Before build_model.
  virtual void adopt_architecture(const nn::SafetensorsMetadata& meta, const TensorShapes& shapes) {}
  virtual nn::SafetensorsMetadata architecture() const { return {}; }  // what a checkpoint records
  virtual std::shared_ptr<nn::Module> build_model() = 0;  // seeded, on the device

  virtual int64_t default_batch() const = 0;
  virtual int64_t default_steps() const = 0;  // mnist-cnn: 0 (one epoch)
  virtual double default_lr() const = 0;
  virtual bool has_block_chain() const = 0;   // activation checkpointing applies
  virtual double max_grad_norm() const { return 0.0; }
  virtual std::vector<optim::ParamGroup> param_groups(nn::Module& model) const;
  virtual optim::OptimizerFactory optimizer(double lr) const;  // AdamW
  // The schedule over steps [0, total) (null: a constant lr).
  virtual std::unique_ptr<optim::LRScheduler> scheduler(optim::Optimizer& opt, int64_t total) const { return nullptr; }

  // Starts the training stream at `batch` samples per step, positioned after `start` steps. Returns the steps per
  // epoch (0: the task has no epochs).
  virtual int64_t start_data(int64_t batch, int64_t start) = 0;
  virtual Batch next_batch() = 0;  // {inputs, targets} on the device
  // What a training checkpoint saves of the data stream besides the default generator (train/training_checkpoint.h):
  // the training loader (null: none) and the task's own generators by name. After start_data.
  virtual data::DataLoader* train_loader() { return nullptr; }
  virtual std::vector<std::pair<std::string, Generator*>> generators() { return {}; }
  // Forward and loss of one micro-batch (the caller runs it under the trainer's autocast); count: its targets.
  virtual LossResult loss(nn::Module& model, const Batch& batch) const = 0;
  // Random inputs and targets of `rows` rows in the training layout, on `device` (batch-size trials, planning).
  virtual Batch random_batch(int64_t rows, Device device) const = 0;
  // Batches' worth of device memory the training stream holds beside the batch being trained on (Note [Batches held
  // ahead] in data/dataloader.h); the batch-size trials hold as many random batches.
  virtual int64_t held_ahead() const { return 0; }

  // Evaluation after `step` (epoch_done: an epoch just ended). Returns a report line, or "" when nothing was due.
  virtual std::string evaluate(nn::Module& model, const AmpTrainer& trainer, int64_t step, bool epoch_done,
                               bool last, RunResult& result) {
    return "";
  }

 protected:
  const RunnerOptions& o_;
  uint64_t seed_;
};

// "mnist-cnn", "char-gpt", "mlp", "cnn", "gpt" (ValueError otherwise).
std::unique_ptr<RunTask> make_run_task(const RunnerOptions& options, uint64_t seed);
uint64_t default_seed(const std::string& model);
// Whether the model has a block chain for --checkpoint, and whether it runs in epochs (without resolving data).
bool model_has_block_chain(const std::string& model);
bool model_has_epochs(const std::string& model);

}  // namespace ember::train::detail
