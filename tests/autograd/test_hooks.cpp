// Gradient hooks (register_hook on leaves and non-leaves, replacement, removal), post-accumulate hooks, retain_grad,
// and saved-tensor hooks (pack/unpack counts, identical gradients, nesting, an offload pack that frees the original
// buffer — measured with the CPU allocator's statistics).
#include <any>
#include <cmath>
#include <cstdio>
#include <memory>

#include "tests/autograd/engine_test_util.h"

namespace ember::testing {
namespace {

using autograd::register_hook;
using autograd::register_post_accumulate_grad_hook;

Tensor leaf(const std::vector<double>& v, Shape shape = {}, DType dt = DType::f64) {
  Tensor t = vals(v, std::move(shape), dt);
  t.requires_grad_();
  return t;
}

// --- tensor hooks -----------------------------------------------------------------------------------------------

TEST(Hooks, LeafHookSeesItsGradient) {
  Tensor x = leaf({1, 2});
  Tensor seen;
  int calls = 0;
  auto h = register_hook(x, [&](const Tensor& g) {
    ++calls;
    seen = g.clone();
    return Tensor();
  });
  (x * vals({3, 4})).backward(vals({1, 10}));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(values_near(seen, {3, 40}));
  EXPECT_TRUE(values_near(x.grad(), {3, 40}));
  // Used twice: the hook runs once, on the summed gradient.
  (x * vals({3, 4}) + x).backward(vals({1, 1}));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(values_near(seen, {4, 5}));
  h.remove();
}

TEST(Hooks, NonLeafHookSeesItsGradient) {
  // h = x*w; z = h*u: the hook on h sees v*u.
  Tensor x = leaf({1, 2});
  Tensor h = x * vals({3, 4});
  Tensor seen;
  register_hook(h, [&](const Tensor& g) {
    seen = g.clone();
    return Tensor();
  });
  Tensor z = h * vals({5, 6});
  z.backward(vals({1, 2}));
  EXPECT_TRUE(values_near(seen, {5, 12}));
  EXPECT_TRUE(values_near(x.grad(), {15, 48}));
  EXPECT_FALSE(h.grad().defined()) << "a hook does not make a non-leaf keep its .grad";
}

TEST(Hooks, ReplacementChangesTheGradientDownstream) {
  Tensor x = leaf({1, 2});
  Tensor h = x * vals({3, 4});
  register_hook(h, [](const Tensor& g) { return g * 2.0; });
  (h * vals({5, 6})).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {2 * 5 * 3, 2 * 6 * 4}));
}

TEST(Hooks, HookAndRetainGradOnTheRootSeeTheSeed) {
  Tensor x = leaf({1, 2});
  Tensor y = x * vals({3, 4});
  Tensor seen;
  register_hook(y, [&](const Tensor& g) {
    seen = g.clone();
    return g * 3.0;
  });
  y.retain_grad();
  y.backward(vals({1, 10}));
  EXPECT_TRUE(values_near(seen, {1, 10}));
  EXPECT_TRUE(values_near(y.grad(), {3, 30}));
  EXPECT_TRUE(values_near(x.grad(), {9, 120}));
}

TEST(Hooks, ReplacementOnALeafChangesTheAccumulatedGradient) {
  Tensor x = leaf({1, 2});
  Tensor seen_second;
  register_hook(x, [](const Tensor& g) { return g * 3.0; });
  register_hook(x, [&](const Tensor& g) {  // hooks chain in registration order
    seen_second = g.clone();
    return g + 1.0;
  });
  (x * vals({3, 4})).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(seen_second, {9, 12}));
  EXPECT_TRUE(values_near(x.grad(), {10, 13}));
}

TEST(Hooks, RemoveStopsTheHook) {
  Tensor x = leaf({1, 2});
  int leaf_calls = 0, nonleaf_calls = 0;
  auto hl = register_hook(x, [&](const Tensor& g) {
    ++leaf_calls;
    return g * 100.0;
  });
  Tensor h = x * 1.0;
  auto hn = register_hook(h, [&](const Tensor& g) {
    ++nonleaf_calls;
    return g * 100.0;
  });
  hl.remove();
  hn.remove();
  hn.remove();  // idempotent
  (h * vals({3, 4})).backward(vals({1, 1}));
  EXPECT_EQ(leaf_calls, 0);
  EXPECT_EQ(nonleaf_calls, 0);
  EXPECT_TRUE(values_near(x.grad(), {3, 4}));
}

TEST(Hooks, RemoveAfterTheTensorIsGoneIsHarmless) {
  autograd::HookHandle handle;
  {
    Tensor x = leaf({1});
    handle = register_hook(x, [](const Tensor&) { return Tensor(); });
  }
  EXPECT_NO_THROW(handle.remove());
}

TEST(Hooks, HookInGradCallSeesTheGradientToo) {
  Tensor x = leaf({1, 2});
  Tensor h = x * vals({3, 4});
  register_hook(h, [](const Tensor& g) { return g * 2.0; });
  const auto g = autograd::grad({h * vals({5, 6})}, {x}, {vals({1, 1})});
  EXPECT_TRUE(values_near(g[0], {30, 48}));
}

TEST(Hooks, RegisterHookOnATensorWithoutGradRaises) {
  EXPECT_THROW(register_hook(vals({1}), [](const Tensor&) { return Tensor(); }), ValueError);
  EXPECT_THROW(register_post_accumulate_grad_hook(vals({1}), [](const Tensor&) {}), ValueError);
  Tensor x = leaf({1});
  EXPECT_THROW(register_post_accumulate_grad_hook(x * 2.0, [](const Tensor&) {}), ValueError);
}

TEST(Hooks, HooksRunWithGradModeOff) {
  // As the formulas do: a hook's own arithmetic builds no graph, even with a tensor that requires grad.
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  Tensor h = x * 1.0;
  h.retain_grad();
  bool leaf_mode = true, nonleaf_mode = true;
  register_hook(h, [&](const Tensor& g) {
    nonleaf_mode = GradMode::is_enabled();
    return g * w;
  });
  register_hook(x, [&](const Tensor& g) {
    leaf_mode = GradMode::is_enabled();
    return Tensor();
  });
  (h * 2.0).backward(vals({1, 1}));
  EXPECT_FALSE(nonleaf_mode);
  EXPECT_FALSE(leaf_mode);
  EXPECT_TRUE(values_near(h.grad(), {6, 8}));
  EXPECT_FALSE(h.grad().requires_grad()) << "a retained .grad must carry no history";
  EXPECT_TRUE(values_near(x.grad(), {6, 8}));
  EXPECT_FALSE(x.grad().requires_grad());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(GradMode::is_enabled()) << "backward restores the caller's grad mode";
}

TEST(Hooks, HookMayRegisterAnotherHookOnTheSameTensor) {
  Tensor x = leaf({1});
  Tensor h = x * 1.0;
  int inner_calls = 0;
  std::vector<autograd::HookHandle> handles;
  register_hook(h, [&](const Tensor&) {
    for (int i = 0; i < 8; ++i)  // enough to grow the hook list while it is being walked
      handles.push_back(register_hook(h, [&](const Tensor&) {
        ++inner_calls;
        return Tensor();
      }));
    return Tensor();
  });
  (h * 2.0).backward(vals({1}), /*retain_graph=*/true);
  EXPECT_TRUE(values_near(x.grad(), {2}));
  const int after_first = inner_calls;
  EXPECT_LE(after_first, 8);
  (h * 2.0).backward(vals({1}));
  EXPECT_GE(inner_calls, after_first + 8) << "hooks registered during the first pass run in the second";
}

TEST(Hooks, DistinctLeavesOfOneAddGetUnaliasedGrads) {
  // add hands the same gradient tensor to both operands; each leaf's .grad must be its own buffer.
  Tensor a = leaf({1, 2});
  Tensor b = leaf({3, 4});
  (a + b).backward(vals({5, 6}));
  EXPECT_TRUE(values_near(a.grad(), {5, 6}));
  EXPECT_TRUE(values_near(b.grad(), {5, 6}));
  EXPECT_NE(a.grad().raw_data(), b.grad().raw_data());
  {
    NoGradGuard no_grad;
    a.grad().fill_(0.0);
  }
  EXPECT_TRUE(values_near(b.grad(), {5, 6}));
}

// --- post-accumulate hooks --------------------------------------------------------------------------------------

TEST(Hooks, PostAccumulateHookSeesTheUpdatedGradOncePerBackward) {
  Tensor x = leaf({1, 2});
  int calls = 0;
  std::vector<std::vector<double>> seen;
  register_post_accumulate_grad_hook(x, [&](const Tensor& l) {
    ++calls;
    EXPECT_TRUE(l.is_same(x) || l.raw_data() == x.raw_data());
    seen.push_back(elems(l.grad()));
  });
  // x reaches the graph through three paths: the hook runs once, after all of them were added.
  Tensor z = x * x + x * vals({3, 4}) + x;
  z.backward(vals({1, 1}));
  ASSERT_EQ(calls, 1);
  EXPECT_EQ(seen[0], (std::vector<double>{2 + 3 + 1, 4 + 4 + 1}));
  (x * vals({10, 20})).backward(vals({1, 1}));
  ASSERT_EQ(calls, 2);
  EXPECT_EQ(seen[1], (std::vector<double>{6 + 10, 9 + 20})) << "the hook sees the accumulated .grad";
}

TEST(Hooks, PostAccumulateHookRunsAfterTensorHooks) {
  Tensor x = leaf({1});
  std::vector<std::string> order;
  register_post_accumulate_grad_hook(x, [&](const Tensor& l) {
    order.push_back("post");
    EXPECT_TRUE(values_near(l.grad(), {20}));
  });
  register_hook(x, [&](const Tensor& g) {
    order.push_back("tensor");
    return g * 10.0;
  });
  (x * 2.0).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"tensor", "post"}));
}

TEST(Hooks, RemovedPostAccumulateHookDoesNotRun) {
  Tensor x = leaf({1});
  int calls = 0;
  auto h = register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++calls; });
  h.remove();
  (x * 2.0).backward();
  EXPECT_EQ(calls, 0);
}

TEST(Hooks, OptimizerStepInAPostAccumulateHook) {
  // The fused "optimizer in backward" pattern: each parameter is updated (and its .grad cleared) as soon as its
  // gradient is complete — in-place writes into a leaf that requires grad are allowed there (grad mode is off).
  Tensor w1 = leaf({1, 2});
  Tensor w2 = leaf({3, 4});
  const Tensor x = vals({5, 6});
  for (Tensor* p : {&w1, &w2})
    register_post_accumulate_grad_hook(*p, [](const Tensor& l) {
      Tensor param = l;
      param.copy_(param - param.grad() * 0.1);
      param.set_grad(Tensor());
    });
  // y = (x * w1) * w2: dw1 = x * w2 = [15, 24], dw2 = x * w1 = [5, 12], both from the values before any update.
  ((x * w1) * w2).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(w1, {1 - 1.5, 2 - 2.4}, 1e-12));
  EXPECT_TRUE(values_near(w2, {3 - 0.5, 4 - 1.2}, 1e-12));
  EXPECT_FALSE(w1.grad().defined());
  EXPECT_FALSE(w2.grad().defined());
}

// --- retain_grad ------------------------------------------------------------------------------------------------

TEST(Hooks, RetainGradKeepsANonLeafsGrad) {
  Tensor x = leaf({1, 2});
  Tensor h = x * vals({3, 4});
  Tensor k = h * 1.0;  // not retained
  h.retain_grad();
  (k * vals({5, 6})).backward(vals({1, 2}), /*retain_graph=*/true);
  EXPECT_TRUE(values_near(h.grad(), {5, 12}));
  EXPECT_FALSE(k.grad().defined());
  EXPECT_TRUE(values_near(x.grad(), {15, 48}));
  const Tensor first = h.grad();
  (k * vals({5, 6})).backward(vals({1, 2}));
  EXPECT_TRUE(values_near(h.grad(), {10, 24})) << "retained grads accumulate like leaves'";
  EXPECT_TRUE(values_near(first, {5, 12}));
  h.retain_grad();  // twice: no second accumulation
  x.retain_grad();  // a leaf: no-op
  EXPECT_THROW(vals({1}).retain_grad(), ValueError);
}

TEST(Hooks, RetainGradSeesTheGradientAfterTheTensorsHooks) {
  // As in PyTorch, a retained .grad is the gradient after every hook of the tensor ran, whatever the order in
  // which retain_grad() and register_hook() were called.
  Tensor x = leaf({1, 2});
  Tensor h = x * vals({3, 4});
  h.retain_grad();
  register_hook(h, [](const Tensor& g) { return g * 2.0; });
  (h * vals({5, 6})).backward(vals({1, 1}));
  EXPECT_TRUE(values_near(h.grad(), {10, 12}));
  EXPECT_TRUE(values_near(x.grad(), {30, 48}));
}

TEST(Hooks, RetainedGradIsNotAliasedWithTheFlowingGradient) {
  Tensor x = leaf({1, 2});
  Tensor h = x * 1.0;
  h.retain_grad();
  Tensor z = h + h;
  z.backward(vals({1, 1}));
  EXPECT_TRUE(values_near(h.grad(), {2, 2}));
  {
    NoGradGuard no_grad;
    h.grad().fill_(100.0);
  }
  EXPECT_TRUE(values_near(x.grad(), {2, 2})) << "writing the retained .grad must not change the leaf's";
}

// --- saved-tensor hooks -----------------------------------------------------------------------------------------

TEST(SavedHooks, PackUnpackGiveIdenticalGradients) {
  // y = exp(x * w): MulBackward saves x and w, ExpBackward saves y: three packs.
  const std::vector<double> xv = {0.5, -1.0, 0.25}, wv = {2.0, 0.5, -3.0};
  Tensor x = leaf(xv);
  Tensor w = leaf(wv);
  int packs = 0, unpacks = 0;
  Tensor y;
  {
    autograd::SavedTensorHooksGuard guard(
        [&](const Tensor& t) -> std::any {
          ++packs;
          EXPECT_FALSE(t.requires_grad()) << "pack receives the detached tensor";
          return std::any(t.clone());
        },
        [&](const std::any& a) -> Tensor {
          ++unpacks;
          return std::any_cast<Tensor>(a);
        });
    y = exp(x * w);
  }
  EXPECT_EQ(packs, 3);
  EXPECT_EQ(unpacks, 0);
  y.backward(vals({1, 2, 3}));
  EXPECT_EQ(unpacks, 3);
  std::vector<double> gx(3), gw(3);
  for (int i = 0; i < 3; ++i) {
    const double e = std::exp(xv[i] * wv[i]) * (i + 1);
    gx[i] = e * wv[i];
    gw[i] = e * xv[i];
  }
  EXPECT_TRUE(values_near(x.grad(), gx, 1e-12));
  EXPECT_TRUE(values_near(w.grad(), gw, 1e-12));
  // The same graph without hooks: the same gradients.
  Tensor x2 = leaf(xv), w2 = leaf(wv);
  exp(x2 * w2).backward(vals({1, 2, 3}));
  EXPECT_EQ(elems(x2.grad()), elems(x.grad()));
  EXPECT_EQ(elems(w2.grad()), elems(w.grad()));
}

TEST(SavedHooks, OnlyWhatIsSavedIsPacked) {
  Tensor x = leaf({1, 2});
  int packs = 0;
  autograd::SavedTensorHooksGuard guard(
      [&](const Tensor& t) -> std::any {
        ++packs;
        return std::any(t);
      },
      [](const std::any& a) { return std::any_cast<Tensor>(a); });
  Tensor a = x + 1.0;          // saves nothing
  Tensor b = a * vals({3, 4});  // the constant operand needs no gradient: only it is saved (for da)
  EXPECT_EQ(packs, 1);
  b.backward(vals({1, 1}));
  EXPECT_TRUE(values_near(x.grad(), {3, 4}));
}

TEST(SavedHooks, GuardsNestInnermostWins) {
  Tensor x = leaf({-2});
  int outer = 0, inner = 0, outer_unpack = 0, inner_unpack = 0;
  Tensor y1, y2, y3;
  {
    autograd::SavedTensorHooksGuard g1(
        [&](const Tensor& t) -> std::any {
          ++outer;
          return std::any(t);
        },
        [&](const std::any& a) {
          ++outer_unpack;
          return std::any_cast<Tensor>(a);
        });
    y1 = exp(x);  // outer
    {
      autograd::SavedTensorHooksGuard g2(
          [&](const Tensor& t) -> std::any {
            ++inner;
            return std::any(t);
          },
          [&](const std::any& a) {
            ++inner_unpack;
            return std::any_cast<Tensor>(a);
          });
      y2 = exp(y1);  // inner
    }
    y3 = exp(y2);  // outer again
  }
  Tensor y4 = exp(y3);  // none
  EXPECT_EQ(outer, 2);
  EXPECT_EQ(inner, 1);
  y4.backward();
  EXPECT_EQ(outer_unpack, 2);
  EXPECT_EQ(inner_unpack, 1);
  // d/dx exp(exp(exp(exp(x)))) = e4 * e3 * e2 * e1 with e1 = exp(x), e(k+1) = exp(ek).
  const double e1 = std::exp(-2.0), e2 = std::exp(e1), e3 = std::exp(e2), e4 = std::exp(e3);
  EXPECT_TRUE(values_near(x.grad(), {e4 * e3 * e2 * e1}, 1e-12));
}

TEST(SavedHooks, VersionCheckStillRunsUnderHooks) {
  Tensor x = leaf({1, 2});
  Tensor w = vals({3, 4});
  Tensor y;
  {
    autograd::SavedTensorHooksGuard guard([](const Tensor& t) -> std::any { return std::any(t.clone()); },
                                          [](const std::any& a) { return std::any_cast<Tensor>(a); });
    y = x * w;
  }
  w.fill_(0.0);
  EXPECT_THROW(y.backward(vals({1, 1})), ValueError);
}

TEST(SavedHooks, OffloadPackFreesTheOriginalBuffer) {
  // e = exp(x) (f32, 1 MiB) is saved by ExpBackward (its output); z = e * c saves c (for de; c needs no grad).
  // Packing as an f64 copy leaves no reference to e's f32 buffer once the caller drops e: the allocator shows
  // the f32 bytes gone and the f64 copies alive.
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  const int64_t n = 1 << 18;  // 1 MiB in f32, 2 MiB in f64
  const int64_t f32_bytes = n * 4, f64_bytes = n * 8;
  Tensor x = full({n}, 0.5, DType::f32);
  x.requires_grad_();
  Tensor c = full({n}, 2.0, DType::f32);

  auto run = [&](bool offload, std::weak_ptr<StorageImpl>& e_storage) {
    int packs = 0;
    std::unique_ptr<autograd::SavedTensorHooksGuard> guard;
    if (offload)
      guard = std::make_unique<autograd::SavedTensorHooksGuard>(
          [&](const Tensor& t) -> std::any {
            ++packs;
            return std::any(t.to(DType::f64));
          },
          [](const std::any& a) { return std::any_cast<Tensor>(a).to(DType::f32); });
    const int64_t before = alloc.stats().allocated_bytes;
    Tensor z;
    {
      Tensor e = exp(x);
      e_storage = e.storage();
      z = e * c;
    }
    guard.reset();
    const int64_t delta = alloc.stats().allocated_bytes - before;
    if (offload) EXPECT_EQ(packs, 2);  // e (ExpBackward) and c (MulBackward)
    z.backward(full({n}, 1.0, DType::f32));
    return delta;
  };

  std::weak_ptr<StorageImpl> plain_e, offload_e;
  const int64_t plain = run(false, plain_e);
  x.set_grad(Tensor());
  const int64_t offloaded = run(true, offload_e);
  std::printf("[saved-hooks offload] after forward: plain +%lld bytes (e and z in f32), offload +%lld bytes "
              "(z in f32, e and c as f64 copies)\n",
              static_cast<long long>(plain), static_cast<long long>(offloaded));
  EXPECT_EQ(plain, 2 * f32_bytes);                 // e (kept by ExpBackward) and z
  EXPECT_EQ(offloaded, f32_bytes + 2 * f64_bytes);  // z, e as f64, c as f64: e's f32 buffer is gone
  EXPECT_TRUE(offload_e.expired()) << "the offloaded original must be freed";
  EXPECT_TRUE(x.grad().defined());
  // d/dx (exp(x) * c) = exp(x) * c = 2 e^0.5, with the f64 round trip exact for f32 values.
  const std::vector<double> g = elems(x.grad());
  const double want = static_cast<double>(static_cast<float>(std::exp(0.5))) * 2.0;
  EXPECT_NEAR(g[0], want, 1e-6);
  EXPECT_NEAR(g[n - 1], want, 1e-6);
}

}  // namespace
}  // namespace ember::testing
