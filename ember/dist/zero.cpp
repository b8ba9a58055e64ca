// ZeroRedundancyOptimizer: shard layout, the reduce-scatter / local step / all-gather step, and mixed-precision loss
// scaling whose skip decision is agreed by all ranks. Invariant: Note [ZeRO-1 layout] in zero.h.
#include "ember/dist/zero.h"

#include <utility>

#include "ember/autograd/functions.h"
#include "ember/base/error.h"
#include "ember/core/grad_mode.h"
#include "ember/kernels/ops.h"
#include "ember/memory/tags.h"

namespace ember::dist {

namespace {
constexpr const char* kShardTag = "zero.shard/optimizer";
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params,
                                                 const optim::OptimizerFactory& make_optimizer,
                                                 std::shared_ptr<ProcessGroup> group, ZeroOptions options)
    : group_(std::move(group)), options_(options), params_(std::move(params)) {
  EMBER_CHECK(group_ != nullptr, ValueError, "ZeroRedundancyOptimizer: null process group");
  EMBER_CHECK(!params_.empty(), ValueError, "ZeroRedundancyOptimizer: no parameters");
  dtype_ = params_.front().dtype();
  for (const Tensor& p : params_) {
    EMBER_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), ValueError,
                "ZeroRedundancyOptimizer: every parameter must be a leaf that requires grad");
    EMBER_CHECK(p.dtype() == dtype_ && is_floating(p.dtype()), DTypeError, "ZeroRedundancyOptimizer: parameters "
                "must share one floating dtype: ", p.description(), " beside ", dtype_name(dtype_));
    EMBER_CHECK(p.device().type == group_->device().type, DeviceError, "ZeroRedundancyOptimizer: ",
                p.description(), " is not on the ", group_->backend(), " group's device ", group_->device().str());
    numel_ += p.numel();
  }
  mixed_ = is_reduced_float(dtype_);
  if (mixed_) optim::detail::check_scaler_options("ZeroRedundancyOptimizer", options_.scaler);
  const int64_t w = group_->size();
  shard_numel_ = (numel_ + w - 1) / w;
  shard_offset_ = shard_numel_ * group_->rank();
  const Device dev = params_.front().device();
  const DType master = mixed_ ? DType::f32 : dtype_;

  NoGradGuard no_grad;
  {
    memory::TagScope tag(kShardTag);
    shard_ = zeros({shard_numel_}, {master, dev});
  }
  // This rank's elements of the (identical on every rank) parameters.
  int64_t offset = 0;
  for (const Tensor& p : params_) {
    const int64_t lo = std::max(offset, shard_offset_), hi = std::min(offset + p.numel(), shard_offset_ + shard_numel_);
    if (lo < hi)
      shard_.narrow(0, lo - shard_offset_, hi - lo).copy_(p.detach().reshape({-1}).narrow(0, lo - offset, hi - lo));
    offset += p.numel();
  }
  shard_.requires_grad_();
  inner_ = make_optimizer({optim::ParamGroup{{shard_}}});
  EMBER_CHECK(inner_ != nullptr, ValueError, "ZeroRedundancyOptimizer: the optimizer factory returned null");
  if (mixed_) {
    const bool scaling = dtype_ == DType::f16 && options_.scaler.enabled;
    scale_ = full({1}, scaling ? options_.scaler.init_scale : 1.0, {DType::f32, dev});
    growth_tracker_ = zeros({1}, {DType::i32, dev});
    found_inf_ = zeros({1}, {DType::f32, dev});
    inv_scale_ = ones({1}, {DType::f32, dev});
  }
}

Tensor ZeroRedundancyOptimizer::scale_loss(const Tensor& loss) {
  if (!mixed_ || !(dtype_ == DType::f16 && options_.scaler.enabled)) return loss;
  return ember::mul(loss, scale_);
}

void ZeroRedundancyOptimizer::backward(const Tensor& loss) { scale_loss(loss).backward(); }

double ZeroRedundancyOptimizer::loss_scale() const { return mixed_ ? scale_.item_double() : 1.0; }

bool ZeroRedundancyOptimizer::step() {
  NoGradGuard no_grad;
  const Device dev = params_.front().device();
  const int64_t w = group_->size();
  Tensor grad = empty({shard_numel_}, {dtype_, dev});
  {
    Tensor flat = zeros({shard_numel_ * w}, {dtype_, dev});
    int64_t offset = 0;
    for (const Tensor& p : params_) {
      if (Tensor g = p.grad(); g.defined()) flat.narrow(0, offset, p.numel()).view(p.sizes()).copy_(g);
      offset += p.numel();
    }
    group_->reduce_scatter(grad, flat, ReduceOp::Avg)->wait();
  }
  if (mixed_) {
    // Every rank checks its own shard; the sum of the flags tells all of them whether any saw NaN/inf, so they skip
    // (and back the scale off) together.
    found_inf_.zero_();
    inv_scale_ = ops::div(ones({1}, {DType::f32, dev}), scale_);
    Tensor master_grad = empty({shard_numel_}, {DType::f32, dev});
    ops::amp_unscale_({grad}, found_inf_, inv_scale_, {master_grad});
    grad = Tensor();
    group_->all_reduce(found_inf_, ReduceOp::Sum)->wait();
    if (dtype_ == DType::f16 && options_.scaler.enabled)
      ops::amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.scaler.growth_factor,
                             options_.scaler.backoff_factor, options_.scaler.growth_interval);
    if (found_inf_.item_double() > 0) return false;
    shard_.set_grad(master_grad);
  } else {
    shard_.set_grad(grad);
  }
  {
    memory::TagScope tag(kShardTag);  // the wrapped optimizer makes its state at its first step
    inner_->step();
  }
  shard_.set_grad(Tensor());  // the shard's gradient lives for the step only
  Tensor mine = shard_.detach().to(dtype_).contiguous();
  Tensor full_params = empty({shard_numel_ * w}, {dtype_, dev});
  group_->all_gather(full_params, mine)->wait();
  int64_t offset = 0;
  for (const Tensor& p : params_) {
    Tensor dst = p.detach();
    dst.copy_(full_params.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return true;
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) {
    if (set_to_none) {
      p.set_grad(Tensor());
    } else if (Tensor g = p.grad(); g.defined()) {
      NoGradGuard no_grad;
      g.zero_();
    }
  }
  shard_.set_grad(Tensor());
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  int64_t bytes = mixed_ ? shard_.nbytes() : 0;
  for (const auto& [key, t] : inner_->state(shard_).entries()) bytes += t.nbytes();
  return bytes;
}

}  // namespace ember::dist
