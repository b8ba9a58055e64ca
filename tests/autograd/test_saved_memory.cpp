// Saved tensors are freed during backward: 16-layer networks whose activations dwarf their weights, measured with
// the CPU allocator's statistics — the peak during backward, the bytes alive when the last gradient is accumulated,
// and the contrast with retain_graph=true (the activations stay alive).
// Layers: h = relu(h * w_l) with w_l of shape [1, width] (mul saves its input activation for dw), and
// h = relu(h @ W_l) (matmul saves its input activation for dW); relu saves its output. Either way every activation
// is held by the graph until the backward pass has gone past it.
#include <cmath>
#include <cstdio>

#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

constexpr int64_t kLayers = 16;

enum class Layer { Mul, Matmul };

struct Config {
  Layer layer;
  int64_t batch, width;
  const char* name;
};

struct Measured {
  int64_t start = 0;            // allocated bytes before anything was made
  int64_t fixed = 0;            // bytes of the input, the weights and (after backward) their grads
  int64_t activations = 0;      // bytes the forward pass added beyond the input and weights
  int64_t before_backward = 0;  // allocated when backward starts (graph, output, seed)
  int64_t peak_backward = 0;    // peak allocated during backward
  int64_t in_last_hook = 0;     // allocated inside the post-accumulate hook of the first layer's weight
  int hook_calls = 0;
  bool recorded = true;         // false when the layer op records no graph (its formula is missing)
};

// Builds the network, runs backward with `retain_graph`, and measures.
Measured run_mlp(const Config& cfg, bool retain_graph) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  Measured m;
  m.start = alloc.stats().allocated_bytes;
  {
    const Tensor x = uniform({cfg.batch, cfg.width}, -1.0, 1.0, DType::f32);
    std::vector<Tensor> weights;
    for (int64_t l = 0; l < kLayers; ++l) {
      // He-like scale for matmul keeps the activations O(1) through 16 relu layers.
      const double a = std::sqrt(6.0 / static_cast<double>(cfg.width));
      Tensor w = cfg.layer == Layer::Mul ? uniform({1, cfg.width}, 0.9, 1.1, DType::f32)
                                         : uniform({cfg.width, cfg.width}, -a, a, DType::f32);
      w.requires_grad_();
      weights.push_back(w);
    }
    const int64_t after_params = alloc.stats().allocated_bytes;
    Tensor y;
    {
      Tensor h = x;
      for (int64_t l = 0; l < kLayers; ++l)
        h = relu(cfg.layer == Layer::Mul ? h * weights[l] : matmul(h, weights[l]));
      y = h;
    }
    if (!y.requires_grad()) {
      m.recorded = false;
      return m;
    }
    m.activations = alloc.stats().allocated_bytes - after_params;
    const Tensor v = ones({cfg.batch, cfg.width}, DType::f32);

    auto handle = autograd::register_post_accumulate_grad_hook(weights[0], [&](const Tensor&) {
      ++m.hook_calls;
      m.in_last_hook = alloc.stats().allocated_bytes;
    });
    alloc.reset_peak_stats();
    m.before_backward = alloc.stats().allocated_bytes;
    y.backward(v, retain_graph);
    m.peak_backward = alloc.stats().peak_allocated_bytes;
    handle.remove();

    // The input, the weights and their gradients (all alive in the hook: the first layer's is the last made).
    m.fixed = x.nbytes();
    for (const Tensor& w : weights) {
      EXPECT_TRUE(w.grad().defined());
      m.fixed += w.nbytes() + w.grad().nbytes();
    }
    EXPECT_FALSE(autograd::has_non_finite(weights[0].grad()));
  }
  return m;
}

void check_saved_memory(const Config& cfg, int64_t max_live_activations_in_hook) {
  SCOPED_TRACE(cfg.name);
  const int64_t act = cfg.batch * cfg.width * 4;  // one activation's bytes
  const int64_t sum_acts = kLayers * act;
  const Measured m = run_mlp(cfg, /*retain_graph=*/false);
  if (!m.recorded) GTEST_SKIP() << cfg.name << ": the layer op records no graph yet";
  const Measured r = run_mlp(cfg, /*retain_graph=*/true);

  // The forward pass leaves exactly one activation per layer alive (relu's output; the pre-activation dies).
  EXPECT_EQ(m.activations, sum_acts);
  EXPECT_EQ(r.activations, sum_acts);
  EXPECT_EQ(m.hook_calls, 1);
  EXPECT_EQ(r.hook_calls, 1);

  const int64_t peak_over = m.peak_backward - m.before_backward;
  const int64_t hook_over = m.in_last_hook - m.start - m.fixed;
  const int64_t hook_over_retained = r.in_last_hook - r.start - r.fixed;
  const double a = static_cast<double>(act);
  std::printf("[saved-memory %s] %lld layers, batch %lld x width %lld f32: activation %lld B (sum %lld B), "
              "input+weights+grads %lld B\n",
              cfg.name, static_cast<long long>(kLayers), static_cast<long long>(cfg.batch),
              static_cast<long long>(cfg.width), static_cast<long long>(act), static_cast<long long>(sum_acts),
              static_cast<long long>(m.fixed));
  std::printf("[saved-memory %s] alive before backward: %lld B above start; peak during backward: %lld B above "
              "that (%.2f activations)\n",
              cfg.name, static_cast<long long>(m.before_backward - m.start), static_cast<long long>(peak_over),
              static_cast<double>(peak_over) / a);
  std::printf("[saved-memory %s] in the last gradient's hook: %lld B above input+weights+grads (%.2f activations); "
              "with retain_graph=true: %lld B (%.2f activations)\n",
              cfg.name, static_cast<long long>(hook_over), static_cast<double>(hook_over) / a,
              static_cast<long long>(hook_over_retained), static_cast<double>(hook_over_retained) / a);

  // (a) The acceptance check: backward never needs the activations' bytes again on top of what is alive.
  EXPECT_LT(peak_over, sum_acts);
  EXPECT_LT(m.peak_backward, m.before_backward + sum_acts);
  // (b) When the first layer's weight gradient (the last one) is accumulated, the saved activations of layers
  // 1..15 are gone: the output y (held by the caller), the seed v and small temporaries remain.
  EXPECT_LE(hook_over, max_live_activations_in_hook * act);
  // (c) Retaining the graph keeps all activations alive at the same point.
  EXPECT_GE(hook_over_retained, hook_over + (kLayers - 1) * act);
}

TEST(SavedMemory, MulLayersFreeSavedTensorsDuringBackward) {
  // Weights [1, 256]: 1 KiB against 256 KiB activations.
  check_saved_memory({Layer::Mul, 256, 256, "mul"}, 3);
}

TEST(SavedMemory, MatmulLayersFreeSavedTensorsDuringBackward) {
  // Weights [128, 128]: 64 KiB against 512 KiB activations.
  check_saved_memory({Layer::Matmul, 1024, 128, "matmul"}, 3);
}

}  // namespace
}  // namespace ember::testing
