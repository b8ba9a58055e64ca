// DistributedDataParallel on the standard mlp config (784-1024-1024-10, a 64-row batch split across ranks): weights
// broadcast from rank 0, 5 AdamW steps give bitwise-equal weights on every rank and the weights of one process
// training on the whole batch; buckets launched during backward and waited at its end; no_sync accumulation and
// PyTorch's forward-time no_sync rule; zeros for unused parameters; a throw during backward; the shape-mismatch error.
// The 5-step comparison also runs over NCCL with CUDA tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ember/base/error.h"
#include "ember/autograd/hooks.h"
#include "ember/dist/ddp.h"
#include "ember/nn/layers.h"
#include "ember/nn/functional.h"
#include "ember/optim/adam.h"
#include "ember/train/bench_train.h"
#include "tests/dist/dist_test_util.h"
#include "tests/harness/op_harness.h"

namespace ember {
namespace {

constexpr int64_t kBatch = 64;

// ||a - b|| / ||b|| over all the parameters together (relative to the weights' scale). Note: an elementwise bound
// does not hold for Adam: the two sums of the gradient (one batch, or two halves averaged) differ by rounding, and
// Adam's update m / (sqrt(v) + eps) turns a rounding difference in a near-zero gradient into an lr-sized one.
double max_relative_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].to_vector<double>(), y = b[i].to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) {
      diff += (x[k] - y[k]) * (x[k] - y[k]);
      scale += y[k] * y[k];
    }
  }
  return std::sqrt(diff / scale);
}

// Every rank's copy of `params` equals rank 0's bit for bit.
void expect_bitwise_equal_across_ranks(dist::ProcessGroup& pg, const std::vector<Tensor>& params) {
  for (const Tensor& p : params) {
    Tensor mine = p.detach().contiguous().clone();
    Tensor root = mine.clone();
    pg.broadcast(root, 0)->wait();
    mine = mine.cpu();  // the bytes are compared on the host (the group's tensors may be CUDA tensors)
    root = root.cpu();
    EXPECT_EQ(std::memcmp(mine.raw_data(), root.raw_data(), static_cast<size_t>(mine.nbytes())), 0)
        << "rank " << pg.rank() << " differs from rank 0 in " << p.description();
  }
}

// Rows [r*B/n, (r+1)*B/n) of the batch.
Tensor rows_of(const Tensor& t, int r, int n) { return t.narrow(0, r * (t.size(0) / n), t.size(0) / n); }

// Over MPI with CPU tensors and over NCCL with CUDA tensors (instances named cuda/..., label gpu).
class DdpBackends : public ::testing::TestWithParam<testing::DistBackend> {};

TEST_P(DdpBackends, MlpFiveAdamWStepsMatchOneProcessOnTheWholeBatch) {
  EMBER_DIST_GROUP_OF(pg, dev, GetParam());
  const int n = pg.size(), r = pg.rank();
  ASSERT_EQ(kBatch % n, 0);
  // The reference (every rank makes it): rank 0's initial weights (seed 1) and the whole batch.
  train::StandardTask ref = train::make_standard_task("mlp", dev, 1, kBatch);
  // The DDP model starts from other weights on the other ranks (seed 1 + r): the broadcast must fix that.
  train::StandardTask task = train::make_standard_task("mlp", dev, 1 + r, kBatch);
  dist::DistributedDataParallel ddp(task.model, pg_ptr, {.bucket_cap_bytes = 1 << 20});
  ASSERT_GT(ddp.bucket_assignment().size(), 2u);  // 1 MiB buckets: several, launched in order
  EXPECT_EQ(ddp.bucket_assignment().front().front(),
            static_cast<int64_t>(task.model->parameters().size()) - 1);  // reverse parameter order
  expect_bitwise_equal_across_ranks(pg, task.model->parameters());
  EXPECT_EQ(max_relative_difference(task.model->parameters(), ref.model->parameters()), 0.0);

  optim::AdamW opt(task.model->parameters());
  optim::AdamW ref_opt(ref.model->parameters());
  const Tensor x = rows_of(ref.inputs, r, n), y = rows_of(ref.targets, r, n);
  for (int step = 0; step < 5; ++step) {
    Tensor loss = nn::functional::cross_entropy(ddp.forward(x), y);
    loss.backward();
    EXPECT_FALSE(ddp.in_iteration());  // every parameter got a gradient: the last hook finished the reduction
    ddp.finish();
    opt.step();
    opt.zero_grad();

    ref.loss().backward();
    ref_opt.step();
    ref_opt.zero_grad();
  }
  expect_bitwise_equal_across_ranks(pg, task.model->parameters());
  const double rel = max_relative_difference(task.model->parameters(), ref.model->parameters());
  std::printf("[rank %d/%d] DDP vs one process on the whole batch after 5 AdamW steps: ||dw|| / ||w|| = %.3g\n",
              r, n, rel);
  EXPECT_LT(rel, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Dist, DdpBackends, ::testing::Values(testing::DistBackend::Mpi),
                         [](const auto& info) { return std::string(testing::backend_name(info.param)); });
INSTANTIATE_TEST_SUITE_P(cuda, DdpBackends, ::testing::Values(testing::DistBackend::Nccl),
                         [](const auto& info) { return std::string(testing::backend_name(info.param)); });

TEST(Ddp, NoSyncAccumulatesLocallyAndTheNextSyncedBackwardReducesTheSum) {
  EMBER_DIST_GROUP(pg);
  const int n = pg.size(), r = pg.rank();
  train::StandardTask ref = train::make_standard_task("mlp", Device::cpu(), 3, kBatch);
  train::StandardTask task = train::make_standard_task("mlp", Device::cpu(), 3, kBatch);
  dist::DistributedDataParallel ddp(task.model, pg_ptr);
  // Rank r's two micro-batches: rows of its half.
  const Tensor x = rows_of(ref.inputs, r, n), y = rows_of(ref.targets, r, n);
  const int64_t half = x.size(0) / 2;
  {
    auto guard = ddp.no_sync();
    nn::functional::cross_entropy(ddp.forward(x.narrow(0, 0, half)), y.narrow(0, 0, half)).backward();
    ddp.finish();  // a no-op inside no_sync
  }
  // Local only so far: rank r's own first micro-batch gradient, unreduced.
  nn::functional::cross_entropy(ddp.forward(x.narrow(0, half, half)), y.narrow(0, half, half)).backward();
  ddp.finish();
  // Reference: sum over every rank's two micro-batch losses, divided by the world size, in one process.
  Tensor total;
  for (int q = 0; q < n; ++q) {
    const Tensor xq = rows_of(ref.inputs, q, n), yq = rows_of(ref.targets, q, n);
    for (int m = 0; m < 2; ++m) {
      Tensor l = nn::functional::cross_entropy(ref.model->forward(xq.narrow(0, m * half, half)),
                                               yq.narrow(0, m * half, half));
      total = total.defined() ? ember::add(total, l) : l;
    }
  }
  ember::div(total, static_cast<double>(n)).backward();
  const auto params = task.model->parameters(), ref_params = ref.model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(testing::allclose(params[i].grad(), ref_params[i].grad(), {1e-4, 1e-6})) << i;
  expect_bitwise_equal_across_ranks(pg, {params[0].grad()});
}

// Two Linear layers of which forward uses only the first.
struct FirstOfTwo : nn::Module {
  FirstOfTwo() {
    first = register_module("first", std::make_shared<nn::Linear>(4, 3));
    second = register_module("second", std::make_shared<nn::Linear>(4, 2));
  }
  Tensor forward(const Tensor& x) override { return first->forward(x); }
  std::shared_ptr<nn::Linear> first, second;
};

TEST(Ddp, UnusedParameterGetsTheReducedZerosAfterFinish) {
  EMBER_DIST_GROUP(pg);
  const int n = pg.size(), r = pg.rank();
  auto model = std::make_shared<FirstOfTwo>();
  dist::DistributedDataParallel ddp(model, pg_ptr);
  // Only the first layer takes part; its input differs by rank, so its gradient is the mean over ranks.
  Tensor x = full({2, 4}, 1.0 + r);
  ember::sum(ddp.forward(x)).backward();
  EXPECT_TRUE(ddp.in_iteration());  // the second layer's hooks never fired
  EXPECT_THROW(ddp.forward(x), ValueError);
  ddp.finish();
  EXPECT_FALSE(ddp.in_iteration());
  // d sum(W x + b) / dW = sum over rows of x: 2 (1 + r) per element; averaged over ranks: 2 (1 + (n-1)/2) = n + 1.
  EXPECT_TRUE(testing::allclose(model->parameters()[0].grad(), full({3, 4}, static_cast<double>(n + 1)), {0, 1e-6}));
  EXPECT_TRUE(testing::allclose(model->parameters()[2].grad(), zeros({2, 4}), {0, 0}));
}

// Overlap: every bucket is launched from a hook while backward is still producing gradients (the first bucket before
// the first layer's gradients exist) and none is waited before the last one was launched. The bucket layout (reverse
// parameter order) is the same on every rank.
TEST(Ddp, BucketsLaunchDuringBackwardAndAreWaitedAtItsEnd) {
  EMBER_DIST_GROUP(pg);
  train::StandardTask task = train::make_standard_task("mlp", Device::cpu(), 1, kBatch);
  auto rec = std::make_shared<testing::RecordingGroup>(pg_ptr);
  dist::DistributedDataParallel ddp(task.model, rec, {.bucket_cap_bytes = 1 << 20});
  const auto params = task.model->parameters();
  const auto layout = ddp.bucket_assignment();
  const int64_t nb = static_cast<int64_t>(layout.size());
  ASSERT_GE(nb, 3);
  std::vector<int64_t> flat;
  for (const auto& b : layout) {
    flat.push_back(-1);
    for (int64_t i : b) flat.push_back(i);
  }
  ASSERT_EQ(flat[1], static_cast<int64_t>(params.size()) - 1);
  Tensor mine = from_vector(flat, {static_cast<int64_t>(flat.size())}), root = mine.clone();
  pg.broadcast(root, 0)->wait();
  EXPECT_EQ(mine.to_vector<int64_t>(), root.to_vector<int64_t>()) << "bucket layout differs from rank 0's";

  std::vector<int64_t> grads_at_launch;
  rec->on_launch = [&] {
    int64_t have = 0;
    for (const Tensor& p : params) have += p.grad().defined();
    grads_at_launch.push_back(have);
  };
  rec->clear();
  const Tensor x = rows_of(task.inputs, pg.rank(), pg.size()), y = rows_of(task.targets, pg.rank(), pg.size());
  nn::functional::cross_entropy(ddp.forward(x), y).backward();
  ddp.finish();
  const auto ev = rec->events();
  ASSERT_EQ(static_cast<int64_t>(ev.size()), 2 * nb);
  for (int64_t k = 0; k < nb; ++k) {
    EXPECT_EQ(ev[k].rfind("launch all_reduce", 0), 0u) << ev[k];
    EXPECT_EQ(ev[nb + k], "wait " + std::to_string(k));
  }
  ASSERT_EQ(static_cast<int64_t>(grads_at_launch.size()), nb);
  // The first bucket (the last layer's bias) went out while most gradients did not exist yet.
  EXPECT_LT(grads_at_launch.front(), static_cast<int64_t>(params.size()));
}

// PyTorch's rule: the forward decides. A forward inside no_sync() whose backward runs outside it does not reduce; a
// forward outside whose backward runs inside the guard does.
TEST(Ddp, NoSyncIsDecidedAtForwardTimeAsInPyTorch) {
  EMBER_DIST_GROUP(pg);
  auto model = std::make_shared<FirstOfTwo>();
  auto rec = std::make_shared<testing::RecordingGroup>(pg_ptr);
  dist::DistributedDataParallel ddp(model, rec);
  const Tensor x = full({2, 4}, 1.0 + pg.rank());
  auto count = [&](const std::string& prefix) {
    int64_t c = 0;
    for (const auto& e : rec->events()) c += e.rfind(prefix, 0) == 0;
    return c;
  };
  rec->clear();
  Tensor out;
  {
    auto guard = ddp.no_sync();
    out = ddp.forward(x);
  }
  ember::sum(out).backward();
  ddp.finish();
  EXPECT_EQ(count("launch"), 0) << "a forward inside no_sync() must not reduce";
  EXPECT_FALSE(ddp.in_iteration());

  out = ddp.forward(x);
  {
    auto guard = ddp.no_sync();
    ember::sum(out).backward();
  }
  ddp.finish();
  EXPECT_EQ(count("launch"), ddp.num_buckets());
  EXPECT_EQ(count("wait"), ddp.num_buckets());
  // The reduced gradient is the accumulated sum of both backwards, averaged over ranks: 2 * (n + 1) (see above).
  EXPECT_TRUE(testing::allclose(model->first->weight.grad(), full({3, 4}, 2.0 * (pg.size() + 1)), {0, 1e-6}));
  // A second finish() and one without a forward are no-ops.
  ddp.finish();
  EXPECT_EQ(count("launch"), ddp.num_buckets());
}

// Note [DDP exceptions]: a hook that throws in the middle of a synced backward leaves buckets launched; finish()
// (and the destructor) complete the iteration, so every launched request is waited and every bucket is launched once
// (the collectives still match the other ranks'), and the next iteration runs normally.
TEST(Ddp, AThrowDuringBackwardLeavesNoRequestPending) {
  EMBER_DIST_GROUP(pg);
  train::StandardTask task = train::make_standard_task("mlp", Device::cpu(), 2, kBatch);
  auto rec = std::make_shared<testing::RecordingGroup>(pg_ptr);
  const auto params = task.model->parameters();
  const Tensor x = rows_of(task.inputs, pg.rank(), pg.size()), y = rows_of(task.targets, pg.rank(), pg.size());
  for (bool by_destructor : {false, true}) {
    int64_t nb = 0;
    {
      dist::DistributedDataParallel ddp(task.model, rec, {.bucket_cap_bytes = 1 << 20});
      nb = ddp.num_buckets();
      bool armed = true;
      // The second layer's weight: its gradient hook throws before accumulation, after the third layer's buckets.
      auto hook = autograd::register_hook(params[2], [&](const Tensor&) -> Tensor {
        if (armed) throw std::runtime_error("hook failed");
        return Tensor();
      });
      rec->clear();
      task.model->zero_grad();
      EXPECT_THROW(nn::functional::cross_entropy(ddp.forward(x), y).backward(), std::runtime_error);
      EXPECT_TRUE(ddp.in_iteration());
      int64_t launched = 0;
      for (const auto& e : rec->events()) launched += e.rfind("launch", 0) == 0;
      EXPECT_GT(launched, 0);  // the later layers' buckets went out before the throw
      if (!by_destructor) {
        ddp.finish();
        EXPECT_FALSE(ddp.in_iteration());
        armed = false;
        task.model->zero_grad();
        nn::functional::cross_entropy(ddp.forward(x), y).backward();
        ddp.finish();
        EXPECT_FALSE(ddp.in_iteration());
      }
      hook.remove();
    }  // by_destructor: the destructor completes the open iteration
    int64_t launches = 0, waits = 0;
    for (const auto& e : rec->events()) {
      launches += e.rfind("launch", 0) == 0;
      waits += e.rfind("wait", 0) == 0;
      EXPECT_EQ(e.rfind("drop", 0), std::string::npos) << e;
    }
    EXPECT_EQ(launches, (by_destructor ? 1 : 2) * nb) << "by destructor: " << by_destructor;
    EXPECT_EQ(waits, launches);
  }
}

TEST(Ddp, DifferentParameterShapeOnOneRankIsAValueErrorOnEveryRank) {
  EMBER_DIST_GROUP(pg);
  if (pg.size() < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t out = pg.rank() == 1 ? 5 : 3;
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::Linear>(8, out));
  try {
    dist::DistributedDataParallel ddp(model, pg_ptr);
    ADD_FAILURE() << "no error on rank " << pg.rank();
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'1.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[3, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[5, 8]"), std::string::npos) << msg;
  }
  pg.barrier()->wait();  // every rank got here: nobody hangs in a collective
}

}  // namespace
}  // namespace ember
