// Activation checkpointing beyond the math: random draws replayed even when another thread drew in between, BatchNorm's
// running statistics updated once, a backward run inside a region's forward, failures during recomputation leaving
// the thread's modes as they were, and the autocast cast cache not growing during backward.
#include <cstring>
#include <thread>

#include "ember/autograd/checkpoint.h"
#include "ember/nn/checkpoint_wrapper.h"
#include "ember/nn/layers.h"
#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

using autograd::checkpoint;

Tensor f32_leaf(const Shape& shape) {
  Tensor t = rand_input(shape).to(DType::f32);
  t.requires_grad_();
  return t;
}

std::vector<float> floats(const Tensor& t) { return t.detach().to_vector<float>(); }

TEST(CheckpointSideEffects, DrawsAreReplayedWhateverOtherThreadsDrew) {
  // The region's first run sees another thread draw from the default generator before its dropout; the
  // recomputation does not. Replaying the logged draws gives the forward's mask anyway (resetting the generator to
  // its state at region entry would not: the other thread's draw moved it).
  const Tensor x0 = rand_input({256}).to(DType::f32);
  auto run = [&](bool checkpointed) {
    manual_seed(11);
    Tensor x = x0.clone();
    x.requires_grad_();
    bool first = true;
    auto fn = [&first](const Tensor& t) {
      if (first) {
        std::thread([] { (void)rand({1000}); }).join();
        first = false;
      }
      return dropout(t, 0.5);
    };
    Tensor y = checkpointed ? checkpoint(fn, x) : fn(x);
    sum(y).backward();
    return std::make_pair(floats(x.grad()), default_generator().state().offset);
  };
  const auto plain = run(false), ckpt = run(true);
  EXPECT_EQ(plain.first, ckpt.first) << "the recomputed dropout mask differs from the forward's";
  EXPECT_EQ(plain.second, ckpt.second) << "the recomputation must not move the generator";
}

TEST(CheckpointSideEffects, BatchNormCountsTheBatchOnce) {
  manual_seed(3);
  auto bare = std::make_shared<nn::BatchNorm2d>(4);
  auto inner = std::make_shared<nn::BatchNorm2d>(4);
  nn::CheckpointWrapper wrapped(inner);
  const Tensor x0 = rand_input({2, 4, 3, 3}).to(DType::f32);
  for (nn::Module* m : {static_cast<nn::Module*>(bare.get()), static_cast<nn::Module*>(&wrapped)}) {
    Tensor x = x0.clone();
    x.requires_grad_();
    sum(m->forward(x)).backward();
  }
  EXPECT_EQ(inner->num_batches_tracked.item_double(), 1.0);
  EXPECT_EQ(floats(inner->running_mean), floats(bare->running_mean));
  EXPECT_EQ(floats(inner->running_var), floats(bare->running_var));
  EXPECT_FALSE(autograd::is_recomputing());
}

TEST(CheckpointSideEffects, ARegionMayRunABackwardInsideItsForward) {
  // fn(h) = exp(2h) + d/dh sum(exp(2h)) (the inner gradient has no history): its inner backward unpacks tensors the
  // region saved while its first run is still going (Note [Unpack in forward]).
  auto fn = [](const Tensor& h) {
    const Tensor e = exp(mul(h, 2.0));
    const Tensor g = autograd::grad({sum(e)}, {h}, {}, /*retain_graph=*/true)[0];
    return add(e, g);
  };
  const Tensor h0 = rand_input({5}).to(DType::f32);
  std::vector<std::vector<float>> results;
  for (bool ckpt : {false, true}) {
    Tensor h = h0.clone();
    h.requires_grad_();
    Tensor y = ckpt ? checkpoint(fn, h) : fn(h);
    sum(y).backward();
    results.push_back(floats(y));
    results.push_back(floats(h.grad()));
  }
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(results[1], results[3]);
}

TEST(CheckpointSideEffects, AFailingRecomputationLeavesTheThreadAsItWas) {
  Tensor x = f32_leaf({4});
  int calls = 0;
  Tensor y;
  {
    AutocastGuard autocast(DeviceType::CPU, DType::bf16, /*enabled=*/false);
    y = checkpoint(
        [&calls](const Tensor& t) {
          if (++calls == 2) EMBER_THROW(ValueError, "planted failure");
          return dropout(exp(t), 0.5);
        },
        x);
  }
  const uint64_t offset = default_generator().state().offset;
  const std::string msg = error_message<CheckpointError>([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("planted failure"), std::string::npos) << msg;
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_FALSE(autocast::is_enabled(DeviceType::CPU));
  EXPECT_FALSE(autograd::is_recomputing());
  EXPECT_EQ(default_generator().state().offset, offset);
  EXPECT_EQ(autograd::current_saved_tensor_hooks(), nullptr);
}

TEST(CheckpointSideEffects, BackwardInsideAnAutocastRegionLeavesItsCastCacheAlone) {
  Tensor w = f32_leaf({8, 8});
  const Tensor x = rand_input({4, 8}).to(DType::f32);
  AutocastGuard autocast(DeviceType::CPU, DType::bf16);
  Tensor y = checkpoint([&w](const Tensor& t) { return matmul(t, w); }, x);
  const int64_t cached = autocast::cache_size();
  EXPECT_EQ(cached, 1) << "w's cast";
  sum(y).backward();
  EXPECT_EQ(autocast::cache_size(), cached) << "the recomputation's casts live in a cache of their own";
  EXPECT_TRUE(w.grad().defined());
}

}  // namespace
}  // namespace ember::testing
