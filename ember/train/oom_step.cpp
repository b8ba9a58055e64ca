// OOM-resilient training step (oom_step.h).
// Invariant: between micro-batches .grad holds exactly the weighted sum of the completed micro-batches' gradients;
// a failed attempt leaves no tensor behind (its loss, graph and partial gradients live in the try block's scope and
// in the fresh .grad slots, both gone before the cache is emptied).
#include "ember/train/oom_step.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"
#include "ember/core/storage.h"
#include "ember/kernels/ops.h"
#include "ember/memory/cuda_device.h"

namespace ember::train {

namespace {

// Note [Gradients set aside]: takes every .grad out of its slot (no copy). Empty when no parameter has a gradient.
std::vector<Tensor> set_aside(const std::vector<Tensor>& params) {
  std::vector<Tensor> saved;
  bool any = false;
  for (const Tensor& p : params) any = any || p.grad().defined();
  if (!any) return saved;
  saved.reserve(params.size());
  for (const Tensor& p : params) {
    saved.push_back(p.grad());
    p.set_grad(Tensor());
  }
  return saved;
}

// After a completed micro-batch: the saved sums are added into the fresh gradients (in place when the layouts allow,
// which they do for gradients the engine made), or become .grad again where the micro-batch gave none.
void merge_back(const std::vector<Tensor>& params, const std::vector<Tensor>& saved) {
  if (saved.empty()) return;
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& old = saved[i];
    if (!old.defined()) continue;
    Tensor fresh = params[i].grad();
    if (!fresh.defined()) {
      params[i].set_grad(old);
    } else if (fresh.is_contiguous() && fresh.sizes() == old.sizes() && fresh.dtype() == old.dtype() &&
               fresh.device() == old.device()) {
      ops::add_(fresh, old);
    } else {
      params[i].set_grad(ops::add(fresh, old));
    }
  }
}

// After a failed attempt: the partial gradients are dropped and the saved sums put back (nothing saved: cleared).
void put_back(const std::vector<Tensor>& params, const std::vector<Tensor>& saved) {
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(saved.empty() ? Tensor() : saved[i]);
}

void release_cache(Device device) {
  if (device.type == DeviceType::CUDA) memory::cuda::synchronize(device.index);
  allocator_for(device).empty_cache();
}

}  // namespace

OomResilientStep::OomResilientStep(nn::Module& model, AmpTrainer& trainer, OomStepOptions options)
    : model_(model), trainer_(trainer), options_(std::move(options)) {
  EMBER_CHECK(options_.max_grad_norm >= 0.0 && std::isfinite(options_.max_grad_norm), ValueError,
              "OomResilientStep: max_grad_norm must be finite and >= 0 (0: no clipping), got ", options_.max_grad_norm);
  EMBER_CHECK(options_.grow_interval >= 0, ValueError, "OomResilientStep: grow_interval must be >= 0, got ",
              options_.grow_interval);
  set_micro_batch_size(options_.micro_batch_size);
  EMBER_CHECK(!model_.parameters().empty(), ValueError, "OomResilientStep: the model has no parameters");
}

void OomResilientStep::set_micro_batch_size(int64_t rows) {
  EMBER_CHECK(rows >= 0, ValueError, "OomResilientStep: the micro-batch size must be >= 0 (0: whole batches), got ",
              rows);
  micro_ = rows;
}

StepResult OomResilientStep::step(const Batch& batch, const LossFn& loss_fn) {
  EMBER_CHECK(static_cast<bool>(loss_fn), ValueError, "OomResilientStep: the loss function is empty");
  const int64_t rows = batch_rows(batch);
  EMBER_CHECK(rows > 0, ShapeError, "OomResilientStep::step: the batch has no rows");
  const std::vector<Tensor> params = model_.parameters();
  const Device device = params.front().device();
  const int64_t step_index = steps_++;

  StepResult result;
  result.samples = rows;
  trainer_.zero_grad();
  detail::LossWeights weights(rows);
  int64_t size = micro_ > 0 ? std::min(micro_, rows) : rows;
  int64_t start = 0;
  while (start < rows) {
    const int64_t len = std::min(size, rows - start);
    const bool final_micro = start + len == rows;
    std::vector<Tensor> saved = set_aside(params);
    const char* phase = "forward";
    try {
      // Everything this attempt makes lives in this block (and in the fresh .grad slots).
      const Batch micro = slice_batch(batch, start, start + len);
      if (options_.on_micro_batch) options_.on_micro_batch(final_micro);
      LossResult r;
      {
        AutocastGuard region = trainer_.autocast();
        r = loss_fn(micro);
      }
      detail::check_loss_result("OomResilientStep", r);
      if (r.count > 0) {
        phase = "backward";
        detail::backward_weighted(trainer_, r.loss, weights.weight(len, r.count));
      }
      const double value = r.count > 0 ? r.loss.item_double() : 0.0;
      merge_back(params, saved);
      weights.add(value, r.count);
    } catch (const OutOfMemoryError& e) {
      put_back(params, saved);
      saved.clear();
      release_cache(device);
      ++result.ooms;
      ++total_ooms_;
      clean_steps_ = 0;
      if (len == 1) {
        trainer_.zero_grad();
        throw;
      }
      size = (len + 1) / 2;
      micro_ = size;
      if (options_.on_oom) {
        OomEvent ev;
        ev.step = step_index;
        ev.start = start;
        ev.rows = len;
        ev.next_rows = size;
        ev.phase = phase;
        ev.requested = e.requested();
        ev.stats = allocator_for(device).stats();
        ev.message = e.what();
        options_.on_oom(ev);
      }
      continue;
    } catch (...) {
      put_back(params, saved);
      trainer_.zero_grad();
      throw;
    }
    result.micro_batch_size = std::max(result.micro_batch_size, len);
    ++result.micro_batches;
    start += len;
  }
  try {
    detail::finish_step(model_, trainer_, weights, options_.max_grad_norm, result);
  } catch (...) {
    // An OOM (or any error) in the unscale, clipping or optimizer step is not retried; the gradients go now, as they
    // do when a micro-batch gives up, so a caller that catches the error holds no memory of this step.
    trainer_.zero_grad();
    throw;
  }
  if (result.ooms == 0 && micro_ > 0 && options_.grow_interval > 0 && ++clean_steps_ >= options_.grow_interval) {
    clean_steps_ = 0;
    micro_ = micro_ >= (rows + 1) / 2 ? 0 : micro_ * 2;
  }
  return result;
}

}  // namespace ember::train
