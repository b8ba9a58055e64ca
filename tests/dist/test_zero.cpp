// ZeRO-1 (ZeroRedundancyOptimizer): the same weights as unsharded AdamW on the same averaged gradients, fp32 and
// mixed precision (f16 weights, fp32 masters sharded), and optimizer-state bytes per rank ≈ 1/world size of the
// unsharded optimizer's, measured from the state tensors and from the caching allocator's per-tag bytes; over MPI
// with CPU tensors and over NCCL with CUDA tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ember/dist/ddp.h"
#include "ember/dist/zero.h"
#include "ember/core/storage.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/tags.h"
#include "ember/nn/functional.h"
#include "ember/optim/adam.h"
#include "ember/optim/mixed_precision.h"
#include "ember/train/bench_train.h"
#include "tests/dist/dist_test_util.h"
#include "tests/harness/op_harness.h"

namespace ember {
namespace {

constexpr int64_t kBatch = 32;

Tensor rows_of(const Tensor& t, int r, int n) { return t.narrow(0, r * (t.size(0) / n), t.size(0) / n); }

// Bytes the allocator of `device` holds under the tag `name`.
int64_t tag_bytes(const std::string& name, Device device) {
  const memory::TagId id = memory::intern_tag(name);
  auto& allocator = dynamic_cast<memory::CachingAllocator&>(allocator_for(device));
  for (const auto& s : allocator.tag_stats())
    if (s.tag == id) return s.current;
  return 0;
}

// Both tests run over MPI with CPU tensors and over NCCL with CUDA tensors (instances named cuda/..., label gpu).
class ZeroBackends : public ::testing::TestWithParam<testing::DistBackend> {};

std::unique_ptr<optim::Optimizer> make_adamw(std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::AdamW>(std::move(groups));
}

TEST_P(ZeroBackends, Fp32AdamWMatchesUnshardedAdamWAndShardsItsState) {
  EMBER_DIST_GROUP_OF(pg, dev, GetParam());
  const int n = pg.size(), r = pg.rank();
  // The same initial weights on every rank (seed 5); the reference is DDP + unsharded AdamW (the same averaged
  // gradients, state for every parameter on every rank).
  train::StandardTask ref = train::make_standard_task("mlp", dev, 5, kBatch);
  train::StandardTask task = train::make_standard_task("mlp", dev, 5, kBatch);
  dist::DistributedDataParallel ddp(ref.model, pg_ptr);
  optim::AdamW ref_opt(ref.model->parameters());
  dist::ZeroRedundancyOptimizer zero(task.model->parameters(), make_adamw, pg_ptr);
  const Tensor x = rows_of(task.inputs, r, n), y = rows_of(task.targets, r, n);
  const int64_t before_ref = tag_bytes("unsharded.adamw/optimizer", dev);
  for (int step = 0; step < 5; ++step) {
    nn::functional::cross_entropy(task.model->forward(x), y).backward();
    EXPECT_TRUE(zero.step());
    zero.zero_grad();

    nn::functional::cross_entropy(ddp.forward(x), y).backward();
    ddp.finish();
    {
      memory::TagScope tag("unsharded.adamw/optimizer");
      ref_opt.step();
    }
    ref_opt.zero_grad();
  }
  const auto params = task.model->parameters(), ref_params = ref.model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(testing::allclose(params[i], ref_params[i], {1e-6, 1e-7})) << i;

  int64_t ref_state = 0;
  for (const Tensor& p : ref_params)
    for (const auto& [key, t] : ref_opt.state(p).entries()) ref_state += t.nbytes();
  const double ratio = static_cast<double>(zero.state_bytes()) / static_cast<double>(ref_state);
  const int64_t ref_tagged = tag_bytes("unsharded.adamw/optimizer", dev) - before_ref;
  const int64_t zero_tagged = tag_bytes("zero.shard/optimizer", dev);
  std::printf("[rank %d/%d] optimizer state: unsharded %lld B (allocator %lld B), ZeRO-1 %lld B (allocator, shard "
              "included: %lld B), ratio %.4f\n", r, n, static_cast<long long>(ref_state),
              static_cast<long long>(ref_tagged), static_cast<long long>(zero.state_bytes()),
              static_cast<long long>(zero_tagged), ratio);
  EXPECT_NEAR(ratio, 1.0 / n, 0.01 / n);
  // Through the allocator: the shard's m and v (and the shard itself, which the tag also holds) against m and v of
  // every parameter.
  EXPECT_NEAR(static_cast<double>(zero_tagged - zero.shard().nbytes()) / static_cast<double>(ref_tagged), 1.0 / n,
              0.01 / n);
}

// f16 weights, fp32 masters: ZeRO-1 against MixedPrecisionOptimizer(AdamW) on DDP-averaged f16 gradients. Mixed-
// precision Adam holds 16 bytes per parameter unsharded; ZeRO-1 leaves 4 + 12/N.
TEST_P(ZeroBackends, MixedPrecisionMatchesTheUnshardedMixedPrecisionOptimizer) {
  EMBER_DIST_GROUP_OF(pg, dev, GetParam());
  const int n = pg.size(), r = pg.rank();
  train::StandardTask ref = train::make_standard_task("mlp", dev, 7, kBatch);
  train::StandardTask task = train::make_standard_task("mlp", dev, 7, kBatch);
  ref.model->to(DType::f16);
  task.model->to(DType::f16);
  dist::DistributedDataParallel ddp(ref.model, pg_ptr);
  // A first scale that does not overflow these f16 gradients, so the steps are taken (skips are compared too).
  const optim::GradScalerOptions scaler{.init_scale = 256.0};
  optim::MixedPrecisionOptimizer ref_opt(ref.model->parameters(), make_adamw, {DType::f16, scaler});
  dist::ZeroRedundancyOptimizer zero(task.model->parameters(), make_adamw, pg_ptr, {scaler});
  ASSERT_TRUE(zero.mixed_precision());
  const Tensor x = rows_of(task.inputs, r, n).to(DType::f16), y = rows_of(task.targets, r, n);
  for (int step = 0; step < 4; ++step) {
    zero.backward(nn::functional::cross_entropy(task.model->forward(x), y));
    const bool stepped = zero.step();
    zero.zero_grad();

    ref_opt.backward(nn::functional::cross_entropy(ddp.forward(x), y));
    ddp.finish();
    EXPECT_EQ(stepped, ref_opt.step()) << step;
    EXPECT_TRUE(stepped) << step;
    ref_opt.zero_grad();
  }
  EXPECT_EQ(zero.loss_scale(), ref_opt.loss_scale());
  // The masters of this rank's shard against the unsharded masters at the same flat positions.
  const auto ref_masters = ref_opt.master_parameters();
  std::vector<float> flat;
  for (const Tensor& m : ref_masters)
    for (float v : m.to_vector<float>()) flat.push_back(v);
  const auto shard = zero.shard().to_vector<float>();
  double worst = 0;
  for (size_t k = 0; k < shard.size(); ++k) {
    const size_t at = static_cast<size_t>(zero.shard_offset()) + k;
    if (at >= flat.size()) break;
    worst = std::max(worst, std::abs(static_cast<double>(shard[k]) - flat[at]));
  }
  EXPECT_LT(worst, 1e-6);
  const auto params = task.model->parameters(), ref_params = ref.model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(testing::allclose(params[i], ref_params[i], {1e-3, 1e-6})) << i;

  // Bytes per parameter: unsharded = weights + grads (2 + 2) + masters + m + v (12); sharded: 4 + 12 / n.
  const auto use = ref_opt.memory_use();
  const double p = static_cast<double>(zero.numel());
  const double unsharded_state = static_cast<double>(use.master_weights + use.optimizer_state) / p;
  const double sharded_state = static_cast<double>(zero.state_bytes()) / p;
  // Per rank, bytes per parameter (the f16 weight and gradient are whole on every rank: 2 + 2).
  const double weights_grads = 2.0 * 2.0;
  std::printf("[rank %d/%d] mixed-precision Adam, bytes per parameter on this rank:\n"
              "  %-22s %10s %10s\n  %-22s %10.3f %10.3f\n  %-22s %10.3f %10.3f\n  %-22s %10.3f %10.3f  (4 + 12/%d = "
              "%.3f)\n", r, n, "", "unsharded", "ZeRO-1", "f16 weight + gradient", weights_grads, weights_grads,
              "fp32 master + m + v", unsharded_state, sharded_state, "total", weights_grads + unsharded_state,
              weights_grads + sharded_state, n, 4.0 + 12.0 / n);
  EXPECT_NEAR(weights_grads + sharded_state, 4.0 + 12.0 / n, 0.01);
  EXPECT_NEAR(static_cast<double>(use.weights) / p, 2.0, 0.01);  // f16 weights (the gradients were freed)
  EXPECT_NEAR(unsharded_state, 12.0, 0.01);
  EXPECT_NEAR(sharded_state, 12.0 / n, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Dist, ZeroBackends, ::testing::Values(testing::DistBackend::Mpi),
                         [](const auto& info) { return std::string(testing::backend_name(info.param)); });
INSTANTIATE_TEST_SUITE_P(cuda, ZeroBackends, ::testing::Values(testing::DistBackend::Nccl),
                         [](const auto& info) { return std::string(testing::backend_name(info.param)); });

TEST(Zero, TypedErrors) {
  EMBER_DIST_GROUP(pg);
  EXPECT_THROW(dist::ZeroRedundancyOptimizer({}, make_adamw, pg_ptr), ValueError);
  Tensor a = zeros({3});
  a.requires_grad_();
  Tensor b = zeros({3}, DType::f64);
  b.requires_grad_();
  EXPECT_THROW(dist::ZeroRedundancyOptimizer({a, b}, make_adamw, pg_ptr), DTypeError);
}

}  // namespace
}  // namespace ember
