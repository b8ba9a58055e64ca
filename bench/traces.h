// Training-like allocation traces for allocator benchmarks (header-only: every bench/*.cpp is its own binary).
// Each generator returns alloc/free TraceEvents (id, size in requested bytes, stream) — a complete replay input
// (see ember/memory/trace.h) — and is deterministic for a given seed. Invariant: every id is allocated once and
// freed at most once, after its allocation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "ember/memory/trace.h"

namespace ember::bench {

using memory::StreamId;
using memory::TraceAction;
using memory::TraceEvent;

// Appends alloc/free events with fresh ids.
class TraceBuilder {
 public:
  uint64_t alloc(int64_t bytes, StreamId stream = 0) {
    TraceEvent e;
    e.action = TraceAction::Alloc;
    e.id = next_id_++;
    e.size = bytes;
    e.stream = stream;
    sizes_[e.id] = bytes;
    events_.push_back(e);
    return e.id;
  }
  void free(uint64_t id) {
    auto it = sizes_.find(id);
    if (it == sizes_.end()) return;
    TraceEvent e;
    e.action = TraceAction::Free;
    e.id = id;
    e.size = it->second;
    sizes_.erase(it);
    events_.push_back(e);
  }
  void free_all(std::vector<uint64_t>& ids) {
    for (uint64_t id : ids) free(id);
    ids.clear();
  }
  std::vector<TraceEvent> take() { return std::move(events_); }

 private:
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, int64_t> sizes_;
  std::vector<TraceEvent> events_;
};

// ---- (a) GPT training step, repeated ---------------------------------------------------------------------------

struct GptShape {
  int64_t batch = 8, seq = 1024, d_model = 768, heads = 12, layers = 12, vocab = 50304;
  int64_t elem = 4;  // fp32 activations
};

// A GPT-2-small-like training loop without fused attention: fp32 parameters allocated once; per step the token
// batch, the forward activations (layer norm outputs and statistics, qkv, B*H*T*T attention scores and
// probabilities, MLP activations, logits, log-softmax), a backward pass that frees saved tensors in reverse order
// and allocates gradient temporaries and parameter gradients (set_to_none), AdamW state allocated at the first
// optimizer step, per-parameter optimizer temporaries, and zero_grad freeing every gradient.
inline std::vector<TraceEvent> gpt_training_trace(int steps = 20, const GptShape& g = {}) {
  TraceBuilder t;
  const int64_t B = g.batch, T = g.seq, C = g.d_model, H = g.heads, V = g.vocab, E = g.elem, BT = B * T;
  const int64_t act = BT * C * E, act4 = 4 * act, scores = B * H * T * T * E, stat = BT * 4;

  // Parameters in module order.
  std::vector<int64_t> params = {V * C, T * C};  // token (tied with the LM head) and position embeddings
  for (int64_t l = 0; l < g.layers; ++l)
    for (int64_t n : {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C}) params.push_back(n);
  params.push_back(C);
  params.push_back(C);  // final layer norm
  for (int64_t n : params) t.alloc(n * 4);
  std::vector<uint64_t> adam;  // m and v, allocated at the first step, kept

  for (int step = 0; step < steps; ++step) {
    const uint64_t idx = t.alloc(BT * 8), targets = t.alloc(BT * 8);
    // ---- forward
    struct Layer {  // tensors saved for backward
      uint64_t x, ln1, ln1_mean, ln1_rstd, qkv, probs, yc, x_mid, ln2, ln2_mean, ln2_rstd, fc, gelu;
    };
    std::vector<Layer> saved;
    uint64_t x = t.alloc(act);  // token + position embedding
    for (int64_t l = 0; l < g.layers; ++l) {
      Layer s{};
      s.x = x;
      s.ln1 = t.alloc(act);
      s.ln1_mean = t.alloc(stat);
      s.ln1_rstd = t.alloc(stat);
      s.qkv = t.alloc(3 * act);
      const uint64_t att = t.alloc(scores);  // q @ k^T, scaled and masked in place
      s.probs = t.alloc(scores);             // softmax (saved)
      t.free(att);
      const uint64_t y = t.alloc(act);  // probs @ v, heads-major
      s.yc = t.alloc(act);              // merged heads, contiguous (saved for the projection)
      t.free(y);
      const uint64_t proj = t.alloc(act);
      s.x_mid = t.alloc(act);  // residual (saved: layer norm 2's input)
      t.free(proj);
      s.ln2 = t.alloc(act);
      s.ln2_mean = t.alloc(stat);
      s.ln2_rstd = t.alloc(stat);
      s.fc = t.alloc(act4);
      s.gelu = t.alloc(act4);
      const uint64_t fc2 = t.alloc(act);
      x = t.alloc(act);  // residual
      t.free(fc2);
      saved.push_back(s);
    }
    const uint64_t lnf = t.alloc(act), lnf_mean = t.alloc(stat), lnf_rstd = t.alloc(stat);
    const uint64_t logits = t.alloc(BT * V * E);
    const uint64_t logsm = t.alloc(BT * V * E);
    t.free(logits);
    const uint64_t loss = t.alloc(4);
    // ---- backward
    std::vector<uint64_t> grads;
    const uint64_t dloss = t.alloc(4);
    const uint64_t dlogits = t.alloc(BT * V * E);
    t.free(logsm);
    t.free(loss);
    t.free(dloss);
    grads.push_back(t.alloc(V * C * 4));  // LM head / token embedding gradient
    const uint64_t dlnf = t.alloc(act);
    t.free(dlogits);
    uint64_t dx = t.alloc(act);
    t.free(dlnf);
    t.free(lnf);
    t.free(lnf_mean);
    t.free(lnf_rstd);
    t.free(x);
    for (int64_t l = g.layers - 1; l >= 0; --l) {
      Layer& s = saved[static_cast<size_t>(l)];
      // MLP
      const uint64_t dgelu = t.alloc(act4);
      grads.push_back(t.alloc(4 * C * C * 4));
      grads.push_back(t.alloc(C * 4));
      t.free(s.gelu);
      const uint64_t dfc = t.alloc(act4);
      t.free(dgelu);
      t.free(s.fc);
      const uint64_t dln2 = t.alloc(act);
      grads.push_back(t.alloc(4 * C * C * 4));
      grads.push_back(t.alloc(4 * C * 4));
      t.free(dfc);
      t.free(s.ln2);
      const uint64_t dmid = t.alloc(act);
      grads.push_back(t.alloc(C * 4));
      grads.push_back(t.alloc(C * 4));
      t.free(dln2);
      t.free(s.ln2_mean);
      t.free(s.ln2_rstd);
      t.free(s.x_mid);
      uint64_t dx2 = t.alloc(act);  // residual: dx + dmid
      t.free(dmid);
      t.free(dx);
      dx = dx2;
      // attention
      const uint64_t dyc = t.alloc(act);
      grads.push_back(t.alloc(C * C * 4));
      grads.push_back(t.alloc(C * 4));
      t.free(s.yc);
      const uint64_t dy = t.alloc(act);
      t.free(dyc);
      const uint64_t dprobs = t.alloc(scores);
      const uint64_t dv = t.alloc(act);
      t.free(dy);
      const uint64_t datt = t.alloc(scores);
      t.free(dprobs);
      t.free(s.probs);
      const uint64_t dq = t.alloc(act), dk = t.alloc(act);
      t.free(datt);
      const uint64_t dqkv = t.alloc(3 * act);
      t.free(dq);
      t.free(dk);
      t.free(dv);
      const uint64_t dln1 = t.alloc(act);
      grads.push_back(t.alloc(3 * C * C * 4));
      grads.push_back(t.alloc(3 * C * 4));
      t.free(dqkv);
      t.free(s.qkv);
      const uint64_t din = t.alloc(act);
      grads.push_back(t.alloc(C * 4));
      grads.push_back(t.alloc(C * 4));
      t.free(dln1);
      t.free(s.ln1);
      t.free(s.ln1_mean);
      t.free(s.ln1_rstd);
      dx2 = t.alloc(act);
      t.free(din);
      t.free(dx);
      dx = dx2;
      t.free(s.x);
    }
    grads.push_back(t.alloc(T * C * 4));  // position embedding
    t.free(dx);
    t.free(idx);
    t.free(targets);
    // ---- optimizer (AdamW): state at the first step, one temporary per parameter
    if (step == 0)
      for (int64_t n : params) {
        adam.push_back(t.alloc(n * 4));
        adam.push_back(t.alloc(n * 4));
      }
    for (int64_t n : params) t.free(t.alloc(n * 4));
    t.free_all(grads);  // zero_grad(set_to_none=True)
  }
  return t.take();
}

// ---- (b) CNN whose batch size changes every step -----------------------------------------------------------------

// A ResNet-18-shaped network on 224x224 images (stem conv 64@112 + max pool, then four stages of four 3x3 convs at
// 64@56, 128@28, 256@14, 512@7; conv -> batch norm -> ReLU each; global pool; fc 1000), fp32, SGD with momentum.
// The batch size is drawn uniformly from [min_batch, max_batch] every step (a data pipeline with variable-length
// buckets, or a batch-size finder), so activation sizes change every step. Each convolution also takes a 32 MiB
// workspace for its duration.
inline std::vector<TraceEvent> cnn_variable_batch_trace(int steps = 30, int64_t min_batch = 32,
                                                        int64_t max_batch = 256, uint64_t seed = 1) {
  TraceBuilder t;
  std::mt19937_64 rng(seed);
  struct Conv {
    int64_t cin, cout, hw;
  };
  std::vector<Conv> convs = {{3, 64, 112}};
  const int64_t stage_c[] = {64, 128, 256, 512}, stage_hw[] = {56, 28, 14, 7};
  int64_t cin = 64;
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 4; ++i) {
      convs.push_back({cin, stage_c[s], stage_hw[s]});
      cin = stage_c[s];
    }
  constexpr int64_t kWorkspace = 32 << 20;
  std::vector<int64_t> params;
  for (const Conv& c : convs) {
    params.push_back(c.cout * c.cin * 9 * 4);
    params.push_back(c.cout * 4);  // bn weight
    params.push_back(c.cout * 4);  // bn bias
  }
  params.push_back(1000 * 512 * 4);
  params.push_back(1000 * 4);
  for (int64_t n : params) t.alloc(n);
  std::vector<uint64_t> momentum;
  // Running BN statistics: persistent buffers.
  for (const Conv& c : convs) {
    t.alloc(c.cout * 4);
    t.alloc(c.cout * 4);
  }

  for (int step = 0; step < steps; ++step) {
    const int64_t B = min_batch + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_batch - min_batch + 1));
    const uint64_t images = t.alloc(B * 3 * 224 * 224 * 4), labels = t.alloc(B * 8);
    struct Saved {
      const Conv* conv;  // nullptr for the max pool
      uint64_t input, out, a, b, c;  // conv: conv output, bn mean, bn rstd; pool: -, argmax, -
      int64_t out_bytes, in_bytes;
    };
    std::vector<Saved> saved;
    uint64_t x = images;
    int64_t x_bytes = B * 3 * 224 * 224 * 4;
    for (size_t i = 0; i < convs.size(); ++i) {
      const Conv& c = convs[i];
      const int64_t out_bytes = B * c.cout * c.hw * c.hw * 4;
      const uint64_t ws = t.alloc(kWorkspace);
      const uint64_t conv = t.alloc(out_bytes);  // saved for batch norm
      t.free(ws);
      const uint64_t mean = t.alloc(c.cout * 4), rstd = t.alloc(c.cout * 4);
      const uint64_t bn = t.alloc(out_bytes);
      const uint64_t relu = t.alloc(out_bytes);  // saved: ReLU's backward and the next layer's input
      t.free(bn);
      saved.push_back({&c, x, relu, conv, mean, rstd, out_bytes, x_bytes});
      x = relu;
      x_bytes = out_bytes;
      if (i == 0) {  // 3x3 max pool, stride 2: 112 -> 56
        const int64_t pooled = B * 64 * 56 * 56 * 4;
        const uint64_t p = t.alloc(pooled), argmax = t.alloc(pooled * 2);
        saved.push_back({nullptr, x, p, 0, argmax, 0, pooled, x_bytes});
        x = p;
        x_bytes = pooled;
      }
    }
    const uint64_t gap = t.alloc(B * 512 * 4), logits = t.alloc(B * 1000 * 4);
    const uint64_t logsm = t.alloc(B * 1000 * 4), loss = t.alloc(4);
    t.free(logits);
    // ---- backward; parameter gradients are allocated when first computed (zero_grad sets them to None)
    std::vector<uint64_t> grads;
    const uint64_t dlogits = t.alloc(B * 1000 * 4);
    t.free(logsm);
    t.free(loss);
    grads.push_back(t.alloc(1000 * 512 * 4));
    grads.push_back(t.alloc(1000 * 4));
    const uint64_t dgap = t.alloc(B * 512 * 4);
    t.free(dlogits);
    t.free(gap);
    uint64_t dx = t.alloc(x_bytes);  // global pool backward
    t.free(dgap);
    for (size_t k = saved.size(); k-- > 0;) {
      Saved& s = saved[k];
      if (s.conv == nullptr) {  // max pool
        const uint64_t din = t.alloc(s.in_bytes);
        t.free(dx);
        t.free(s.b);
        t.free(s.out);
        dx = din;
        continue;
      }
      const uint64_t drelu = t.alloc(s.out_bytes);
      t.free(dx);
      t.free(s.out);
      const uint64_t dbn = t.alloc(s.out_bytes);
      grads.push_back(t.alloc(s.conv->cout * 4));
      grads.push_back(t.alloc(s.conv->cout * 4));
      t.free(drelu);
      t.free(s.a);
      t.free(s.b);
      t.free(s.c);
      const uint64_t ws = t.alloc(kWorkspace);
      grads.push_back(t.alloc(s.conv->cout * s.conv->cin * 9 * 4));
      const uint64_t din = t.alloc(s.in_bytes);
      t.free(ws);
      t.free(dbn);
      dx = din;
    }
    t.free(dx);
    t.free(images);
    t.free(labels);
    // SGD with momentum: buffers at the first step, one temporary per parameter; then zero_grad.
    if (step == 0)
      for (int64_t n : params) momentum.push_back(t.alloc(n));
    for (int64_t n : params) t.free(t.alloc(n));
    t.free_all(grads);
  }
  return t.take();
}

// ---- (c) random churn --------------------------------------------------------------------------------------------

// Random sizes (60% log-uniform 512 B..1 MiB, 30% 1..10 MiB, 10% log-uniform 10..256 MiB) with random lifetimes:
// the live volume follows a target that is redrawn every 1000 events in [0, max_live_bytes].
inline std::vector<TraceEvent> random_churn_trace(int64_t events = 200000, int64_t max_live_bytes = int64_t{8} << 30,
                                                  uint64_t seed = 7) {
  TraceBuilder t;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto log_uniform = [&](double lo, double hi) { return static_cast<int64_t>(std::exp(std::log(lo) + u(rng) * (std::log(hi) - std::log(lo)))); };
  std::vector<std::pair<uint64_t, int64_t>> live;
  int64_t live_bytes = 0, target = 0;
  for (int64_t i = 0; i < events; ++i) {
    if (i % 1000 == 0) target = static_cast<int64_t>(u(rng) * static_cast<double>(max_live_bytes));
    const bool alloc = live.empty() || u(rng) < (live_bytes < target ? 0.7 : 0.3);
    if (alloc) {
      const double r = u(rng);
      int64_t n;
      if (r < 0.6) n = log_uniform(512.0, 1 << 20);
      else if (r < 0.9) n = (1 << 20) + static_cast<int64_t>(u(rng) * (9 << 20));
      else n = log_uniform(10 << 20, 256 << 20);
      live.emplace_back(t.alloc(n), n);
      live_bytes += n;
    } else {
      const size_t k = rng() % live.size();
      t.free(live[k].first);
      live_bytes -= live[k].second;
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (auto& [id, n] : live) t.free(id);
  return t.take();
}

}  // namespace ember::bench
