// Activation checkpointing (autograd::checkpoint, checkpoint_sequential): gradients bit-identical to the same
// computation without checkpointing (an MLP chain, a GPT block with dropout, nested regions, autocast), the memory a
// checkpointed forward leaves behind, the generator state, determinism errors, retain_graph and no-grad mode.
// The reference is the un-checkpointed run: its backward reads the tensors the forward saved, while the checkpointed
// run's backward reads only recomputed ones, so equal bits mean the recomputation reproduced them exactly.
#include <cstring>
#include <memory>

#include "ember/autograd/checkpoint.h"
#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

using autograd::checkpoint;
using autograd::checkpoint_sequential;
using autograd::TensorFn;

// a and b hold the same f32 bits (same shape): compared with memcmp.
::testing::AssertionResult bit_identical(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.description() << " vs " << b.description();
  const std::vector<float> va = a.detach().to(Device::cpu()).to_vector<float>();
  const std::vector<float> vb = b.detach().to(Device::cpu()).to_vector<float>();
  if (std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0) return ::testing::AssertionSuccess();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i];
  return ::testing::AssertionFailure();
}

Tensor leaf(const Shape& shape, double scale = 1.0, Device device = Device::cpu()) {
  Tensor t = rand_input(shape, -scale, scale).to(DType::f32).to(device);
  t.requires_grad_();
  return t;
}

// Runs loss(x) = sum(forward(x) * v), backward, and returns the gradients of `leaves` (cleared before).
std::vector<Tensor> grads_of(const std::function<Tensor()>& forward, const Tensor& v,
                             const std::vector<Tensor>& leaves) {
  for (const Tensor& t : leaves) t.set_grad(Tensor());
  Tensor y = forward();
  sum(y * v).backward();
  std::vector<Tensor> g;
  for (const Tensor& t : leaves) g.push_back(t.grad());
  return g;
}

void expect_all_bit_identical(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bit_identical(got[i], want[i])) << "gradient " << i;
}

// An MLP chain: block i is relu(linear(h, W_i, b_i)).
struct Mlp {
  std::vector<Tensor> w, b;
  Mlp(int64_t blocks, int64_t width, Device device = Device::cpu()) {
    for (int64_t i = 0; i < blocks; ++i) {
      w.push_back(leaf({width, width}, 0.3, device));
      b.push_back(leaf({width}, 0.1, device));
    }
  }
  TensorFn block(size_t i) const {
    return [w = w[i], b = b[i]](const Tensor& h) { return relu(linear(h, w, b)); };
  }
  std::vector<TensorFn> blocks() const {
    std::vector<TensorFn> out;
    for (size_t i = 0; i < w.size(); ++i) out.push_back(block(i));
    return out;
  }
  std::vector<Tensor> leaves(const Tensor& x) const {
    std::vector<Tensor> l{x};
    l.insert(l.end(), w.begin(), w.end());
    l.insert(l.end(), b.begin(), b.end());
    return l;
  }
};

// The device tests run on the CPU here; their cuda instances check the same bits on a GPU (and skip without one).
class CheckpointDevice : public DeviceTest {};

TEST_P(CheckpointDevice, MlpChainGradientsBitIdentical) {
  const Mlp mlp(4, 24, device());
  const Tensor x = leaf({16, 24}, 1.0, device());
  const Tensor v = rand_input({16, 24}).to(DType::f32).to(device());
  const auto fns = mlp.blocks();
  const auto reference = grads_of(
      [&] { return autograd::apply_chain(fns, x); },
      v, mlp.leaves(x));

  // Every block its own region.
  autograd::reset_checkpoint_stats();
  const auto per_block = grads_of(
      [&] {
        Tensor h = x;
        for (const auto& f : fns) h = checkpoint(f, h);
        return h;
      },
      v, mlp.leaves(x));
  expect_all_bit_identical(per_block, reference);
  const auto stats = autograd::checkpoint_stats();
  EXPECT_EQ(stats.regions, 4);
  EXPECT_EQ(stats.recomputations, 4);
  EXPECT_EQ(stats.saved_discarded, 4 * 3);  // linear: input and weight; relu: its output

  // The whole chain as one region with several inputs and outputs.
  autograd::reset_checkpoint_stats();
  const auto whole = grads_of(
      [&] {
        auto out = checkpoint(
            [&fns](const std::vector<Tensor>& in) {
              Tensor h = in[0] * in[1];
              for (const auto& f : fns) h = f(h);
              return std::vector<Tensor>{h, in[1]};
            },
            {x, ones({1}, {DType::f32, device()})});
        return out[0] * out[1];
      },
      v, mlp.leaves(x));
  expect_all_bit_identical(whole, reference);
  EXPECT_EQ(autograd::checkpoint_stats().recomputations, 1);
}

TEST_P(CheckpointDevice, GptBlockWithDropoutBitIdenticalAndGeneratorRestored) {
  nn::GPTConfig c;
  c.block_size = 8;
  c.n_embd = 32;
  c.n_head = 4;
  c.dropout = 0.2;
  c.bias = true;
  manual_seed(7);
  auto block = std::make_shared<nn::Block>(c);
  block->to(device());
  block->train();
  const Tensor x = leaf({2, 8, 32}, 1.0, device());
  const Tensor v = rand_input({2, 8, 32}).to(DType::f32).to(device());
  std::vector<Tensor> leaves{x};
  for (const Tensor& p : block->parameters()) leaves.push_back(p);

  manual_seed(1234);
  Tensor y_ref;
  const auto reference = grads_of([&] { return y_ref = block->forward(x); }, v, leaves);
  const PhiloxState after_ref = default_generator().state();

  manual_seed(1234);
  autograd::reset_checkpoint_stats();
  Tensor y_ckpt;
  const auto got = grads_of(
      [&] { return y_ckpt = checkpoint([block](const Tensor& h) { return block->forward(h); }, x); }, v, leaves);
  const PhiloxState after_ckpt = default_generator().state();

  EXPECT_TRUE(bit_identical(y_ckpt, y_ref));
  expect_all_bit_identical(got, reference);
  EXPECT_EQ(autograd::checkpoint_stats().recomputations, 1);
  // The recomputation drew its masks from the captured state and put the generator back.
  EXPECT_EQ(after_ckpt.seed, after_ref.seed);
  EXPECT_EQ(after_ckpt.offset, after_ref.offset);
  EXPECT_GT(after_ref.offset, 0u);
}

EMBER_INSTANTIATE_DEVICE_TESTS(CheckpointDevice);

TEST(Checkpoint, GeneratorStateAfterBackwardMatchesUncheckpointed) {
  const Tensor x = leaf({64, 64});
  const TensorFn fn = [](const Tensor& h) { return dropout(relu(h), 0.5) * 2.0; };
  manual_seed(99);
  sum(fn(x)).backward();
  const PhiloxState ref = default_generator().state();
  const Tensor ref_grad = x.grad();
  x.set_grad(Tensor());
  manual_seed(99);
  Tensor y = checkpoint(fn, x);
  const PhiloxState after_forward = default_generator().state();
  // Draw in between: the recomputation must still use the captured state, and put this one back.
  Tensor noise = uniform({16}, 0.0, 1.0, DType::f32);
  const PhiloxState before_backward = default_generator().state();
  sum(y).backward();
  EXPECT_EQ(after_forward.offset, ref.offset);
  EXPECT_EQ(default_generator().state().offset, before_backward.offset);
  EXPECT_EQ(default_generator().state().seed, before_backward.seed);
  EXPECT_TRUE(bit_identical(x.grad(), ref_grad));
}

TEST(Checkpoint, SequentialSegmentCounts) {
  const Mlp mlp(6, 16);
  const Tensor x = leaf({8, 16});
  const Tensor v = rand_input({8, 16}).to(DType::f32);
  const auto fns = mlp.blocks();
  const auto reference = grads_of(
      [&] { return autograd::apply_chain(fns, x); },
      v, mlp.leaves(x));
  for (int64_t segments : {1, 2, 3, 4, 5, 6}) {
    SCOPED_TRACE(segments);
    autograd::reset_checkpoint_stats();
    // A temporary vector of functions: the regions keep their own copies for the recomputation.
    const auto got = grads_of([&] { return checkpoint_sequential(mlp.blocks(), segments, x); }, v, mlp.leaves(x));
    expect_all_bit_identical(got, reference);
    EXPECT_EQ(autograd::checkpoint_stats().regions, segments - 1);
    EXPECT_EQ(autograd::checkpoint_stats().recomputations, segments - 1);
    // PyTorch's split: segments - 1 runs of n / segments, the last (not checkpointed) takes the rest.
    EXPECT_EQ(autograd::checkpoint_stats().saved_discarded, (segments - 1) * (6 / segments) * 3);
  }
  EXPECT_TRUE(contains(error_message<ValueError>([&] { checkpoint_sequential(fns, 0, x); }), "segments"));
  EXPECT_TRUE(contains(error_message<ValueError>([&] { checkpoint_sequential(fns, 7, x); }), "[1, 6]"));
}

TEST(Checkpoint, NestedRegions) {
  const Mlp mlp(4, 16);
  const Tensor x = leaf({8, 16});
  const Tensor v = rand_input({8, 16}).to(DType::f32);
  const auto fns = mlp.blocks();
  const auto reference = grads_of(
      [&] { return autograd::apply_chain(fns, x); },
      v, mlp.leaves(x));
  autograd::reset_checkpoint_stats();
  const auto got = grads_of(
      [&] {
        return checkpoint(
            [&fns](const Tensor& h0) {
              Tensor h = fns[0](h0);
              h = checkpoint([&fns](const Tensor& in) { return fns[2](fns[1](in)); }, h);
              return fns[3](h);
            },
            x);
      },
      v, mlp.leaves(x));
  expect_all_bit_identical(got, reference);
  const auto stats = autograd::checkpoint_stats();
  EXPECT_EQ(stats.regions, 2);  // the inner region's re-run inside the outer recomputation is not counted
  // The outer region once; the inner one once (its input comes from the outer recomputation, not a second one).
  EXPECT_EQ(stats.recomputations, 2);
}

TEST(Checkpoint, InsideAutocast) {
  const Mlp mlp(3, 32);
  const Tensor x = leaf({8, 32});
  const Tensor v = rand_input({8, 32}).to(DType::f32);
  const auto fns = mlp.blocks();
  const auto reference = grads_of(
      [&] {
        AutocastGuard autocast(DeviceType::CPU, DType::bf16);
        return autograd::apply_chain(fns, x);
      },
      v, mlp.leaves(x));
  EXPECT_EQ(mlp.w[0].grad().dtype(), DType::f32);
  autograd::reset_checkpoint_stats();
  const auto got = grads_of(
      [&] {
        AutocastGuard autocast(DeviceType::CPU, DType::bf16);
        Tensor h = x;
        for (const auto& f : fns) h = checkpoint(f, h);
        return h;
      },
      v, mlp.leaves(x));
  expect_all_bit_identical(got, reference);
  EXPECT_EQ(autograd::checkpoint_stats().recomputations, 3);
  // The recomputation ran under its own autocast scope: nothing is left enabled or cached after backward.
  EXPECT_FALSE(autocast::is_enabled(DeviceType::CPU));
  EXPECT_EQ(autocast::cache_size(), 0);
}

// Bytes one [batch, width] f32 activation takes in the CPU allocator (rounded as the allocator rounds).
int64_t allocation_bytes(int64_t batch, int64_t width) {
  memory::Allocator& alloc = allocator_for(Device::cpu());
  const int64_t before = alloc.stats().allocated_bytes;
  Tensor t = empty({batch, width}, DType::f32);
  return alloc.stats().allocated_bytes - before;
}

struct ChainMemory {
  int64_t after_forward = 0;  // bytes the forward left allocated beyond the input and the parameters
  std::vector<Tensor> grads;
};

ChainMemory run_chain(const std::vector<TensorFn>& fns, int64_t segments, const Tensor& x, const Tensor& v,
                      const std::vector<Tensor>& leaves) {
  memory::Allocator& alloc = allocator_for(Device::cpu());
  for (const Tensor& t : leaves) t.set_grad(Tensor());
  ChainMemory m;
  const int64_t start = alloc.stats().allocated_bytes;
  {
    Tensor y = segments == 0 ? autograd::apply_chain(fns, x)
                             : checkpoint_sequential(fns, segments, x);
    m.after_forward = alloc.stats().allocated_bytes - start;
    sum(y * v).backward();
  }
  for (const Tensor& t : leaves) m.grads.push_back(t.grad());
  return m;
}

TEST(Checkpoint, SequentialForwardKeepsOnlySegmentInputs) {
  // 8 blocks Linear(256, 256) + ReLU, batch 256: one activation is 256 KiB.
  constexpr int64_t kBatch = 256, kWidth = 256, kBlocks = 8;
  const Mlp mlp(kBlocks, kWidth);
  const Tensor x = leaf({kBatch, kWidth});
  const Tensor v = rand_input({kBatch, kWidth}).to(DType::f32);
  const auto fns = mlp.blocks();
  const auto leaves = mlp.leaves(x);
  const int64_t act = allocation_bytes(kBatch, kWidth);

  const ChainMemory plain = run_chain(fns, 0, x, v, leaves);
  // Without checkpointing every block keeps relu's output (linear saves its input, which is the previous relu's
  // output; the pre-activation dies).
  EXPECT_EQ(plain.after_forward, kBlocks * act);
  std::printf("[checkpoint-memory] activation %lld B; no checkpointing: %lld B after forward\n",
              static_cast<long long>(act), static_cast<long long>(plain.after_forward));
  for (int64_t segments : {2, 4, 8}) {
    SCOPED_TRACE(segments);
    const ChainMemory ck = run_chain(fns, segments, x, v, leaves);
    const int64_t size = kBlocks / segments;
    const int64_t last_blocks = kBlocks - (segments - 1) * size;
    // Checkpointed segments keep only their inputs (segment 0's input is x, allocated before); the last segment
    // keeps one activation per block (its last one is the output).
    const int64_t bound = (segments - 1) * act + last_blocks * act;
    std::printf("[checkpoint-memory] %lld segments: %lld B after forward (bound %lld B)\n",
                static_cast<long long>(segments), static_cast<long long>(ck.after_forward),
                static_cast<long long>(bound));
    EXPECT_LE(ck.after_forward, bound + bound / 10);
    if (segments < kBlocks) EXPECT_LT(ck.after_forward, plain.after_forward);
    expect_all_bit_identical(ck.grads, plain.grads);
  }
}

TEST(Checkpoint, SequentialForwardMuchLowerForWideBlocks) {
  // Blocks with an inner activation four times wider (Linear 256 -> 1024, ReLU, Linear 1024 -> 256, ReLU): a
  // checkpointed block keeps 1 activation of its 5.
  constexpr int64_t kBatch = 256, kWidth = 256, kBlocks = 8;
  std::vector<Tensor> params;
  std::vector<TensorFn> fns;
  for (int64_t i = 0; i < kBlocks; ++i) {
    Tensor w1 = leaf({4 * kWidth, kWidth}, 0.06), w2 = leaf({kWidth, 4 * kWidth}, 0.03);
    params.push_back(w1);
    params.push_back(w2);
    fns.push_back([w1, w2](const Tensor& h) { return relu(linear(relu(linear(h, w1)), w2)); });
  }
  const Tensor x = leaf({kBatch, kWidth});
  const Tensor v = rand_input({kBatch, kWidth}).to(DType::f32);
  std::vector<Tensor> leaves{x};
  leaves.insert(leaves.end(), params.begin(), params.end());
  const int64_t act = allocation_bytes(kBatch, kWidth);
  const ChainMemory plain = run_chain(fns, 0, x, v, leaves);
  EXPECT_EQ(plain.after_forward, kBlocks * 5 * act);
  const ChainMemory ck = run_chain(fns, kBlocks, x, v, leaves);
  const int64_t bound = (kBlocks - 1) * act + 5 * act;
  std::printf("[checkpoint-memory] wide blocks: %lld B without, %lld B with 8 segments (bound %lld B)\n",
              static_cast<long long>(plain.after_forward), static_cast<long long>(ck.after_forward),
              static_cast<long long>(bound));
  EXPECT_LE(ck.after_forward, bound + bound / 10);
  EXPECT_LT(ck.after_forward * 3, plain.after_forward);
  expect_all_bit_identical(ck.grads, plain.grads);
}

TEST(Checkpoint, RecomputationSavingOtherShapesRaises) {
  const Tensor x = leaf({4, 8});
  int calls = 0;
  // The slice length changes between the first run and the recomputation.
  const TensorFn fn = [&calls](const Tensor& h) {
    const int64_t n = 8 - calls++;
    return sum(relu(h.slice(1, 0, n)));
  };
  Tensor y = checkpoint(fn, x);
  const std::string msg = error_message<CheckpointError>([&] { y.backward(); });
  EXPECT_TRUE(contains(msg, "#0")) << msg;
  EXPECT_TRUE(contains(msg, "f32[4, 7]")) << msg;
  EXPECT_TRUE(contains(msg, "f32[4, 8]")) << msg;
  EXPECT_TRUE(contains(msg, "nondeterministic")) << msg;
}

TEST(Checkpoint, RecomputationSavingMoreOrFewerTensorsRaises) {
  const Tensor x = leaf({4, 8});
  for (int extra_first : {0, 1}) {
    SCOPED_TRACE(extra_first);
    int calls = 0;
    // One more op (relu saves its output) in the first run or in the recomputation.
    const TensorFn fn = [&calls, extra_first](const Tensor& h) {
      const bool extra = (calls++ == 0) == (extra_first == 1);
      Tensor r = relu(h);
      return sum(extra ? relu(r) : r);
    };
    Tensor y = checkpoint(fn, x);
    const std::string msg = error_message<CheckpointError>([&] { y.backward(); });
    EXPECT_TRUE(contains(msg, extra_first ? "saved 1 tensors for backward, but its first run saved 2"
                                          : "saved more tensors for backward than its first run (1)"))
        << msg;
  }
}

TEST(Checkpoint, InputModifiedInPlaceRaisesOnBackward) {
  const Tensor w = leaf({8, 8});
  Tensor x = rand_input({4, 8}).to(DType::f32);
  Tensor y = checkpoint([w](const Tensor& h) { return sum(relu(matmul(h, w))); }, x);
  x.fill_(1.0);
  const std::string msg = error_message<ValueError>([&] { y.backward(); });
  EXPECT_TRUE(contains(msg, "modified by an in-place operation")) << msg;
}

TEST(Checkpoint, RetainGraphRecomputesAgain) {
  const Mlp mlp(3, 16);
  const Tensor x = leaf({8, 16});
  const Tensor v = rand_input({8, 16}).to(DType::f32);
  const auto fns = mlp.blocks();
  const auto leaves = mlp.leaves(x);
  const auto reference = grads_of(
      [&] { return autograd::apply_chain(fns, x); },
      v, leaves);
  for (const Tensor& t : leaves) t.set_grad(Tensor());
  autograd::reset_checkpoint_stats();
  Tensor loss = sum(checkpoint_sequential(fns, 3, x) * v);
  loss.backward(Tensor(), /*retain_graph=*/true);
  std::vector<Tensor> first;
  for (const Tensor& t : leaves) first.push_back(t.grad());
  expect_all_bit_identical(first, reference);
  EXPECT_EQ(autograd::checkpoint_stats().recomputations, 2);
  for (const Tensor& t : leaves) t.set_grad(Tensor());
  loss.backward();
  std::vector<Tensor> second;
  for (const Tensor& t : leaves) second.push_back(t.grad());
  expect_all_bit_identical(second, reference);
  EXPECT_EQ(autograd::checkpoint_stats().recomputations, 4);
}

TEST(Checkpoint, NoGradModeJustRunsFn) {
  const Tensor x = leaf({4, 4});
  int calls = 0;
  const TensorFn fn = [&calls](const Tensor& h) {
    ++calls;
    return relu(h) * 3.0;
  };
  autograd::reset_checkpoint_stats();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = checkpoint(fn, x);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_EQ(autograd::checkpoint_stats().regions, 0);
  // relu(x) * 3 by hand.
  const auto xs = elems(x), ys = elems(y);
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_EQ(ys[i], static_cast<double>(static_cast<float>(xs[i] > 0 ? xs[i] * 3 : 0)));

  // Grad mode on but nothing requires grad: no history, nothing discarded.
  const Tensor plain = rand_input({4, 4}).to(DType::f32);
  Tensor z = checkpoint(fn, plain);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(z.requires_grad());
  EXPECT_EQ(autograd::checkpoint_stats().regions, 0);
  EXPECT_EQ(autograd::checkpoint_stats().saved_discarded, 0);
}

}  // namespace
}  // namespace ember::testing
