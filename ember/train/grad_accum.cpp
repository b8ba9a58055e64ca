// Gradient accumulation (grad_accum.h).
// Invariant: every micro-batch loss is back-propagated with weight count_i / R, and the gradients are multiplied by
// R / C once, before clipping and the single trainer step (Note [Micro-batch weights]).
#include "ember/train/grad_accum.h"

#include <cmath>

#include "ember/autograd/functions.h"
#include "ember/base/error.h"
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"

namespace ember::train {

int64_t batch_rows(const Batch& batch) {
  EMBER_CHECK(!batch.empty(), ShapeError, "batch: the batch holds no tensor");
  int64_t rows = -1;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Tensor& t = batch[i];
    EMBER_CHECK(t.defined(), ShapeError, "batch: tensor ", i, " is undefined");
    EMBER_CHECK(t.dim() >= 1, ShapeError, "batch: tensor ", i, " (", t.description(),
                ") has no dimension to split along");
    if (rows < 0) rows = t.size(0);
    EMBER_CHECK(t.size(0) == rows, ShapeError, "batch: tensor ", i, " (", t.description(), ") has ", t.size(0),
                " rows, tensor 0 has ", rows);
  }
  return rows;
}

Batch slice_batch(const Batch& batch, int64_t start, int64_t end) {
  const int64_t rows = batch_rows(batch);
  EMBER_CHECK(0 <= start && start < end && end <= rows, IndexError, "slice_batch: rows [", start, ", ", end,
              ") of a batch of ", rows);
  Batch out;
  out.reserve(batch.size());
  for (const Tensor& t : batch) out.push_back(t.narrow(0, start, end - start));
  return out;
}

std::vector<Batch> split_batch(const Batch& batch, int64_t micro_batch_size) {
  const int64_t rows = batch_rows(batch);
  EMBER_CHECK(micro_batch_size > 0, ValueError, "split_batch: micro_batch_size must be > 0, got ", micro_batch_size);
  std::vector<Batch> out;
  for (int64_t start = 0; start < rows; start += micro_batch_size)
    out.push_back(slice_batch(batch, start, std::min(rows, start + micro_batch_size)));
  return out;
}

GradAccumulator::GradAccumulator(nn::Module& model, AmpTrainer& trainer, AccumulationOptions options)
    : model_(model), trainer_(trainer), options_(std::move(options)) {
  EMBER_CHECK(options_.micro_batches >= 1, ValueError, "GradAccumulator: micro_batches must be >= 1, got ",
              options_.micro_batches);
  EMBER_CHECK(options_.max_grad_norm >= 0.0 && std::isfinite(options_.max_grad_norm), ValueError,
              "GradAccumulator: max_grad_norm must be finite and >= 0 (0: no clipping), got ", options_.max_grad_norm);
}

StepResult GradAccumulator::step(const Batch& batch, const LossFn& loss_fn) {
  const int64_t rows = batch_rows(batch);
  EMBER_CHECK(rows > 0, ShapeError, "GradAccumulator::step: the batch has no rows");
  const int64_t size = (rows + options_.micro_batches - 1) / options_.micro_batches;
  return step_micro_batches(split_batch(batch, size), loss_fn);
}

StepResult GradAccumulator::step_micro_batches(const std::vector<Batch>& micro_batches, const LossFn& loss_fn) {
  EMBER_CHECK(!micro_batches.empty(), ValueError, "GradAccumulator: no micro-batch to run");
  EMBER_CHECK(static_cast<bool>(loss_fn), ValueError, "GradAccumulator: the loss function is empty");
  StepResult result;
  for (const Batch& b : micro_batches) {
    const int64_t rows = batch_rows(b);
    EMBER_CHECK(rows > 0, ShapeError, "GradAccumulator: a micro-batch has no rows");
    result.samples += rows;
    result.micro_batch_size = std::max(result.micro_batch_size, rows);
  }
  trainer_.zero_grad();
  detail::LossWeights weights(result.samples);
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const Batch& micro = micro_batches[i];
    if (options_.on_micro_batch) options_.on_micro_batch(i + 1 == micro_batches.size());
    LossResult r;
    {
      AutocastGuard region = trainer_.autocast();
      r = loss_fn(micro);
    }
    detail::check_loss_result("GradAccumulator", r);
    if (r.count > 0) {
      detail::backward_weighted(trainer_, r.loss, weights.weight(batch_rows(micro), r.count));
      weights.add(r.loss.item_double(), r.count);
    }
    ++result.micro_batches;
  }
  detail::finish_step(model_, trainer_, weights, options_.max_grad_norm, result);
  return result;
}

namespace detail {

double LossWeights::weight(int64_t rows, int64_t count) {
  if (reference_ == 0.0)
    reference_ = static_cast<double>(count) * static_cast<double>(rows_) / static_cast<double>(rows);
  return static_cast<double>(count) / reference_;
}

void LossWeights::add(double loss, int64_t count) {
  weighted_loss_ += loss * static_cast<double>(count);
  count_ += count;
}

double LossWeights::loss() const {
  return count_ > 0 ? weighted_loss_ / static_cast<double>(count_) : std::numeric_limits<double>::quiet_NaN();
}

double LossWeights::correction() const { return count_ > 0 ? reference_ / static_cast<double>(count_) : 1.0; }

void check_loss_result(const char* who, const LossResult& r) {
  EMBER_CHECK(r.loss.defined(), ValueError, who, ": the loss function returned an undefined loss");
  EMBER_CHECK(r.loss.numel() == 1 && is_floating(r.loss.dtype()), ValueError, who,
              ": the loss must be one floating element, got ", r.loss.description());
  EMBER_CHECK(r.count >= 0, ValueError, who, ": the loss function's count must be >= 0, got ", r.count);
}

void backward_weighted(AmpTrainer& trainer, const Tensor& loss, double weight) {
  if (weight == 1.0) trainer.backward(loss);
  else trainer.backward(mul(loss, weight));
}

void scale_grads(const std::vector<Tensor>& params, double factor) {
  if (factor == 1.0) return;
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.copy_(ops::mul(g, factor));
  }
}

void finish_step(nn::Module& model, AmpTrainer& trainer, const LossWeights& weights, double max_grad_norm,
                 StepResult& result) {
  result.loss = weights.loss();
  result.count = weights.count();
  if (weights.count() == 0) {  // nothing counted: no gradient, nothing to step
    trainer.zero_grad();
    result.stepped = false;
    return;
  }
  scale_grads(model.parameters(), weights.correction());
  if (max_grad_norm > 0.0) result.grad_norm = trainer.clip_grad_norm_(max_grad_norm);
  result.stepped = trainer.step();
  trainer.zero_grad();
}

}  // namespace detail

}  // namespace ember::train
