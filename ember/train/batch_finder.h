// Batch-size finder: the largest batch whose real training step fits a memory budget — a peak-memory estimator picks
// the starting point, trial steps confirm it (galloping growth, then bisection between the last success and the first
// OOM) — with the training state snapshotted before and restored exactly after every trial.
// Invariant: after find_batch_size returns (or throws), the device allocator's configuration is the caller's and the
// restore callback has run after the last trial; result.batch passed its trial and result.batch + 1 failed (or hit
// max_batch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/core/device.h"
#include "ember/core/generator.h"
#include "ember/nn/module.h"
#include "ember/optim/grad_scaler.h"
#include "ember/optim/mixed_precision.h"
#include "ember/optim/optimizer.h"
#include "ember/train/amp.h"

namespace ember::train {

// Note [Training snapshot]
// Everything a training step changes, copied to host memory outside every ember allocator (so a snapshot takes no
// device memory and does not shrink the budget it helps measure): the model's state_dict (parameters and persistent
// buffers), every .grad, the optimizer's state_dict and its parameters where they are not the model's (fp32 masters),
// the loss scaler's state_dict, and the default generator's (seed, offset). restore() writes it all back — values
// bitwise, optimizer state created since the capture removed, gradients as they were (absent ones cleared) — so the
// next step behaves as if the trial steps never ran. It writes into the tensors that hold the values now wherever
// they still exist, allocating nothing on the device, so every trial starts from the same memory layout.
// AmpTrainer: its optimizer() and masters are restored, and its loss scaler's scale and growth tracker
// (AmpTrainer::scaler_state_dict), in place.
class TrainingSnapshot {
 public:
  // optimizer/scaler may be null.
  explicit TrainingSnapshot(nn::Module& model, optim::Optimizer* optimizer = nullptr,
                            optim::GradScaler* scaler = nullptr);
  TrainingSnapshot(nn::Module& model, optim::MixedPrecisionOptimizer& optimizer);
  TrainingSnapshot(nn::Module& model, AmpTrainer& trainer);

  void capture();        // the constructors capture; call again to move the snapshot forward
  void restore() const;  // Note [Training snapshot]
  int64_t host_bytes() const;  // bytes the snapshot holds on the host

 private:
  struct HostTensor {
    std::string name;
    DType dtype = DType::f32;
    Shape shape;
    std::vector<unsigned char> bytes;
  };
  static HostTensor to_host(const std::string& name, const Tensor& t);
  static Tensor to_tensor(const HostTensor& h);
  static std::vector<HostTensor> to_host(const std::vector<std::pair<std::string, Tensor>>& named);
  static std::vector<std::pair<std::string, Tensor>> to_tensors(const std::vector<HostTensor>& host);
  static bool fits(const Tensor& dst, const HostTensor& h);            // same dtype and shape
  static void write_into(const Tensor& dst, const HostTensor& h);      // in place
  std::vector<Tensor> extra_params() const;  // the optimizer's parameters that are not the model's
  std::vector<Tensor> all_params() const;    // the model's, then extra_params()

  nn::Module& model_;
  optim::Optimizer* optimizer_ = nullptr;
  optim::GradScaler* scaler_ = nullptr;
  optim::MixedPrecisionOptimizer* mixed_ = nullptr;
  AmpTrainer* trainer_ = nullptr;
  std::vector<HostTensor> model_state_, optimizer_state_, extra_values_, scaler_state_, mixed_state_, trainer_scaler_;
  std::vector<optim::GroupOptions> group_options_;
  std::vector<HostTensor> grads_;  // one per all_params() entry; an empty name marks an absent gradient
  PhiloxState generator_;
};

// Note [Batch headroom]
// A trial reproduces a training step's allocations, and the runner's trials also hold the batches a data loader keeps
// ahead (Note [Batches held ahead] in data/dataloader.h), but not the history around the real steps: where the
// loader's per-sample and collated tensors land in the cache while a step runs (timing decides), evaluation batches,
// many steps' worth of cache splits. At the edge of the budget that history alone can turn a fitting step into an OOM
// by fragmentation: the live bytes fit, no free block is large enough and the pages left to map are too few.
// `ember train --model mnist-cnn --batch-size auto --max-memory 256MiB --batch-headroom 0` on generated digits picked
// 428 rows whose two trial steps fit; the third real step then asked for 60.19 MiB with 187.15 MiB live (247.34 MiB
// in all, under 256), 10.85 MiB of the cache free in 13 blocks of at most 2.05 MiB and 58 MiB left to map. On real
// MNIST, before the trials held the loader's batches, 350 rows failed in the second step with the two batches the
// loader held ahead (2.1 MiB) live beside it; held, the pick is 347 rows, which the layout drift still fails. So the
// trials can run under budget x (1 - headroom), and the batch they find leaves that much room for what they do not
// reproduce; `ember train --batch-size auto` leaves 5% by default (--batch-headroom).

struct BatchTrial {
  int64_t batch = 0;
  bool ok = false;                // the step ran; false: it threw OutOfMemoryError
  int64_t peak_allocated = 0;     // the device allocator's peak allocated bytes during the trial (until the OOM)
  int64_t peak_reserved = 0;      // and its peak reserved bytes
  int64_t estimated = -1;         // the estimator's prediction for this batch (-1 without an estimator)
};

struct BatchFinderOptions {
  Device device = Device::cpu();  // whose allocator serves the trial steps
  // Bytes the step may use, counted as the allocator counts reserved memory (weights, optimizer state and cache
  // included). While the finder runs it caps the device allocator's capacity at this value (restored afterwards), so
  // a trial that needs more fails with OutOfMemoryError as on a device of that size. 0: the allocator's allowed
  // memory (the device's memory or a simulated device's capacity, times any memory fraction or capacity setting);
  // memory other processes hold on a real device is found by the trials, which then OOM.
  int64_t budget = 0;
  int64_t min_batch = 1;
  int64_t max_batch = int64_t{1} << 20;
  // Without an estimator: the first trial (0: min_batch), then doubling.
  int64_t start_batch = 0;
  // Optional: the predicted peak bytes of a step at a batch (e.g. the meta-device estimator), compared with the
  // budget. The finder binary-searches it for the largest batch predicted to fit and starts the trials there.
  std::function<int64_t(int64_t batch)> estimate;
  // Called after every trial (ok or not) to put the training state back; typically
  // `[&] { snapshot.restore(); }` with a TrainingSnapshot taken before the call. Required.
  std::function<void()> restore;
  // The batch wanted per optimizer step (0: the found batch); the result says how to reach it by accumulation.
  int64_t effective_batch = 0;
  // The fraction of the budget the trials leave unused (Note [Batch headroom]): they run under a capacity of
  // budget x (1 - headroom), and the estimator's predictions are compared with that. In [0, 0.5].
  double headroom = 0.0;
};

struct BatchFinderResult {
  int64_t batch = 0;            // the largest batch that fit (0: not even min_batch fit)
  int64_t estimated_batch = 0;  // the estimator's pick (0 without an estimator)
  int64_t budget = 0;           // the budget used (bytes; kNoLimit when unknown)
  int64_t trial_budget = 0;     // what the trials could use: budget less the headroom
  std::vector<BatchTrial> trials;  // in the order they ran
  // The requested effective batch E reached with micro-batches of at most `batch` rows: accumulation = ceil(E / batch)
  // micro-batches of micro_batch = ceil(E / accumulation) rows (the last one smaller when they do not divide).
  int64_t effective_batch = 0, accumulation = 0, micro_batch = 0;
  std::string to_string() const;  // a short table of the trials and the result
};

// Finds the largest batch in [min_batch, max_batch] whose trial step fits. `trial(b)` runs real training steps at
// batch b (forward, backward, optimizer step; two, so that the second runs with the optimizer state the first created
// and on the cache it left — Note [Two steps per trial] in runner.cpp) and throws OutOfMemoryError when they do not
// fit; its other exceptions propagate (after restore). Search (Note [Batch search]): the estimator's pick (or
// start_batch) first; from a success, galloping up (+1, +2, +4, ... with an estimate; doubling without) until an OOM;
// from an OOM, galloping down the same way until a success; then bisection between the last success and the first
// OOM. The allocator's cache is emptied before every trial. Assumes fitting is monotone in the batch.
BatchFinderResult find_batch_size(const std::function<void(int64_t batch)>& trial, const BatchFinderOptions& options);

}  // namespace ember::train
