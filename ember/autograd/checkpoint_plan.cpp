// The checkpoint planner (checkpoint_plan.h): policies, the none / sqrt / budget plans, profiling a chain of blocks
// and running a chain under a plan. Invariant: every plan returned tiles [0, n) in order with no two adjacent kept
// segments, and its predicted_peak_bytes is Note [Checkpoint memory model] evaluated exactly on the profile.
#include "ember/autograd/checkpoint_plan.h"

#include <algorithm>
#include <any>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ember/autograd/accumulate_grad.h"
#include "ember/autograd/engine.h"
#include "ember/autograd/saved_hooks.h"
#include "ember/base/error.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/core/meta_scope.h"
#include "ember/core/storage.h"
#include "ember/memory/allocator.h"
#include "ember/memory/cuda_device.h"

namespace ember::autograd {

// ---- policy ------------------------------------------------------------------------------------------------------

CheckpointPolicy CheckpointPolicy::parse(const std::string& text) {
  CheckpointPolicy p;
  if (text == "none") return p;
  if (text == "sqrt") {
    p.kind = Kind::sqrt;
    return p;
  }
  const std::string prefix = "budget:";
  EMBER_CHECK(text.rfind(prefix, 0) == 0, ConfigError, "checkpoint policy: cannot read \"", text,
              "\"; expected none, sqrt or budget:SIZE (e.g. budget:64MiB)");
  p.kind = Kind::budget;
  p.budget_bytes = memory::parse_bytes(text.substr(prefix.size()), "checkpoint budget");
  return p;
}

std::string CheckpointPolicy::str() const {
  switch (kind) {
    case Kind::none: return "none";
    case Kind::sqrt: return "sqrt";
    case Kind::budget: break;
  }
  // The largest binary unit that divides the budget exactly, so parse(str()) gives the same byte count back.
  const char* units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int u = 0; u < 4; ++u) {
    const int64_t mult = int64_t{1} << (10 * (4 - u));
    if (budget_bytes > 0 && budget_bytes % mult == 0) return "budget:" + std::to_string(budget_bytes / mult) + units[u];
  }
  return "budget:" + std::to_string(budget_bytes);
}

// ---- plans -------------------------------------------------------------------------------------------------------

bool CheckpointPlan::recomputes(int64_t block) const {
  for (const CheckpointSegment& s : segments)
    if (block >= s.begin && block < s.end) return s.recompute;
  EMBER_THROW(IndexError, "CheckpointPlan::recomputes: block ", block, " is outside the plan's ", num_blocks(),
              " blocks");
}

void CheckpointPlan::check_covers(int64_t n, const char* who) const {
  EMBER_CHECK(num_blocks() == n, ValueError, who, ": the plan covers ", num_blocks(), " blocks but the chain has ", n);
  int64_t expect = 0;
  for (const CheckpointSegment& s : segments) {
    EMBER_CHECK(s.begin == expect && s.end > s.begin, ValueError, who, ": the plan's segments do not tile [0, ", n,
                ") in order (segment [", s.begin, ", ", s.end, ") after block ", expect, ")");
    expect = s.end;
  }
}

std::string CheckpointPlan::to_string() const {
  std::ostringstream os;
  int64_t recomputed_blocks = 0, recomputed_segments = 0;
  for (const CheckpointSegment& s : segments)
    if (s.recompute) {
      recomputed_blocks += s.end - s.begin;
      ++recomputed_segments;
    }
  os << "checkpoint plan (" << policy.str() << "): " << num_blocks() << " blocks, " << recomputed_blocks
     << " recomputed in " << recomputed_segments << " segment" << (recomputed_segments == 1 ? "" : "s") << "\n";
  os << "  segments:";
  for (size_t i = 0; i < segments.size(); ++i)
    os << (i ? "; [" : " [") << segments[i].begin << ", " << segments[i].end << ")"
       << (segments[i].recompute ? " recompute" : " keep");
  os << "\n";
  os << "  predicted activation peak " << memory::format_bytes(predicted_peak_bytes) << " (no checkpointing: "
     << memory::format_bytes(no_checkpoint_bytes) << ")";
  if (policy.kind == CheckpointPolicy::Kind::budget)
    os << "; budget " << memory::format_bytes(policy.budget_bytes) << (fits ? ": fits" : ": does NOT fit (closest plan)");
  os << "\n";
  char buf[160];
  const double pct = forward_cost > 0 ? 100.0 * extra_cost / forward_cost : 0.0;
  std::snprintf(buf, sizeof buf, "  extra compute %.3f ms per step (%.1f%% of a %.3f ms forward)", extra_cost * 1e3,
                pct, forward_cost * 1e3);
  os << buf;
  return os.str();
}

namespace {

void check_profile(const std::vector<BlockProfile>& profile) {
  EMBER_CHECK(!profile.empty(), ValueError, "plan_checkpoints: the profile has no blocks");
  for (size_t i = 0; i < profile.size(); ++i) {
    const BlockProfile& b = profile[i];
    EMBER_CHECK(b.input_bytes >= 0 && b.activation_bytes >= 0 && b.backward_bytes >= 0 && b.cost >= 0.0 &&
                    std::isfinite(b.cost),
                ValueError, "plan_checkpoints: block ", i, " has a negative size or cost (input_bytes ", b.input_bytes,
                ", activation_bytes ", b.activation_bytes, ", backward_bytes ", b.backward_bytes, ", cost ", b.cost,
                ")");
    EMBER_CHECK(b.input_saved_bytes >= 0 && b.input_saved_bytes <= b.input_bytes &&
                    b.input_saved_bytes <= b.activation_bytes,
                ValueError, "plan_checkpoints: block ", i, "'s input_saved_bytes ", b.input_saved_bytes,
                " is not within [0, min(input_bytes ", b.input_bytes, ", activation_bytes ", b.activation_bytes,
                ")]");
  }
}

// Merges adjacent kept segments (Note [Checkpoint memory model] is unchanged by it: kept bytes just add up).
std::vector<CheckpointSegment> merge_kept(const std::vector<CheckpointSegment>& in) {
  std::vector<CheckpointSegment> out;
  for (const CheckpointSegment& s : in) {
    if (!out.empty() && !s.recompute && !out.back().recompute && out.back().end == s.begin)
      out.back().end = s.end;
    else
      out.push_back(s);
  }
  return out;
}

// Fills the plan's numbers from its segments and the profile: Note [Checkpoint memory model], evaluated exactly.
void evaluate(CheckpointPlan& plan, const std::vector<BlockProfile>& profile) {
  int64_t held = 0, peak = 0;  // held: P of the next segment
  double extra = 0.0, forward = 0.0;
  for (const BlockProfile& b : profile) forward += b.cost;
  plan.recomputed_bytes = plan.activation_bytes = 0;
  for (const CheckpointSegment& s : plan.segments) {
    const int64_t in = s.recompute ? profile[s.begin].input_bytes : 0;
    const int64_t saved = s.recompute ? profile[s.begin].input_saved_bytes : 0;  // held once, as in(s)
    int64_t a = 0;
    for (int64_t k = s.begin; k < s.end; ++k) {
      a += profile[k].activation_bytes;
      plan.activation_bytes += profile[k].activation_bytes;
      if (s.recompute) plan.recomputed_bytes += profile[k].activation_bytes;
      peak = std::max(peak, held + in - saved + a + profile[k].backward_bytes);
      if (s.recompute) extra += profile[k].cost;
    }
    held += s.recompute ? in : a;
  }
  plan.predicted_peak_bytes = std::max(peak, held);
  CheckpointPlan keep_all;
  keep_all.segments = {{0, static_cast<int64_t>(profile.size()), false}};
  plan.no_checkpoint_bytes = plan.segments.size() == 1 && !plan.segments[0].recompute
                                 ? plan.predicted_peak_bytes
                                 : (evaluate(keep_all, profile), keep_all.predicted_peak_bytes);
  plan.extra_cost = extra;
  plan.forward_cost = forward;
}

// a < b beyond rounding noise in the summed costs.
bool cost_less(double a, double b) {
  if (!std::isfinite(b)) return a < b;
  return a < b - 1e-12 * std::max(1.0, std::abs(b));
}

struct Prefix {
  std::vector<int64_t> a;  // a[j] = activation bytes of blocks [0, j)
  std::vector<double> c;   // c[j] = cost of blocks [0, j)
  int64_t keep_all = 0;    // the predicted peak with every block kept: max_k A(0..k) + T_k
};

// Note [Budget DP]
// The cheapest plan with predicted peak <= B (when keeping everything does not fit) is a DP over states (j, u):
// j blocks planned, u = the held prefix P(j) in units of U = ceil(B / 256) bytes, where every segment's
// contribution to P (A of a kept run, in of a recomputed segment) is rounded UP to whole units — so u * U >= the
// true P. A state's value is the least extra cost reaching it. With M(i, j) = max over k in [i, j) of
// A(i..k) + T_k (the most a run holds during its backward, built as i decreases: M(i, j) = a_i + max(T_i,
// M(i+1, j))), from (i, u):
//   keep [i, j):       u' = u + units(A(i..j)),               allowed when u' <= cap = floor(B / U) and
//                                                              u*U + M(i, j) <= B;
//   recompute [i, j):  u' = u + units(in_i), cost + C(i..j),  allowed when u' <= cap and
//                                                              u*U + in_i - saved_i + M(i, j) <= B.
// (saved_i: block i's input_saved_bytes, Note [Hand-off tensors].) The checks bound the model's terms from above
// (each block's term is at most u*U + [in_i - saved_i] + M(i, j)), so a plan
// the DP accepts fits the model exactly. The answer is the least cost over u at j = n (ties: the smaller u), read
// back through parent pointers, adjacent kept runs merged. Rounding loses at most one unit per segment: any plan
// with predicted peak <= B - n*U is seen, so the result costs no more than the cheapest such plan. O(n^2 * 256)
// transitions (n = 128: a few million, milliseconds); no segment length cap is needed.
std::vector<CheckpointSegment> budget_dp(const std::vector<BlockProfile>& p, const Prefix& pre, int64_t budget) {
  const int64_t n = static_cast<int64_t>(p.size());
  const int64_t unit = std::max<int64_t>(1, (budget + 255) / 256);
  const int64_t cap = budget / unit;
  const int64_t w = cap + 1;
  auto units = [unit](int64_t bytes) { return (bytes + unit - 1) / unit; };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> cost((n + 1) * w, kInf);
  std::vector<int32_t> from((n + 1) * w, -1);  // the start i of the segment ending at the state
  std::vector<char> rec((n + 1) * w, 0);        // whether that segment is recomputed
  cost[0] = 0.0;
  for (int64_t j = 1; j <= n; ++j) {
    double* dst = cost.data() + j * w;
    int64_t m = 0;  // M(i, j)
    for (int64_t i = j - 1; i >= 0; --i) {
      m = p[i].activation_bytes + std::max(p[i].backward_bytes, i == j - 1 ? int64_t{0} : m);
      if (m > budget) break;  // every longer run holds at least as much
      const double* src = cost.data() + i * w;
      const int64_t a = pre.a[j] - pre.a[i];
      const int64_t ku = units(a);
      const int64_t keep_max = std::min(cap - ku, (budget - m) / unit);
      for (int64_t u = 0; u <= keep_max; ++u)
        if (src[u] < dst[u + ku]) {
          dst[u + ku] = src[u];
          from[j * w + u + ku] = static_cast<int32_t>(i);
          rec[j * w + u + ku] = 0;
        }
      const int64_t in = p[i].input_bytes;
      const int64_t room = budget - (in - p[i].input_saved_bytes) - m;  // u * U must not exceed it
      if (room < 0) continue;
      const int64_t ru = units(in);
      const int64_t u_max = std::min(cap - ru, room / unit);
      const double c = pre.c[j] - pre.c[i];
      for (int64_t u = 0; u <= u_max; ++u)
        if (src[u] + c < dst[u + ru]) {
          dst[u + ru] = src[u] + c;
          from[j * w + u + ru] = static_cast<int32_t>(i);
          rec[j * w + u + ru] = 1;
        }
    }
  }
  int64_t u = -1;
  for (int64_t v = 0; v <= cap; ++v)
    if (std::isfinite(cost[n * w + v]) && (u < 0 || cost_less(cost[n * w + v], cost[n * w + u]))) u = v;
  std::vector<CheckpointSegment> segs;
  if (u < 0) return segs;
  for (int64_t j = n; j > 0;) {
    const int64_t i = from[j * w + u];
    const bool r = rec[j * w + u] != 0;
    segs.push_back({i, j, r});
    u -= r ? units(p[i].input_bytes) : units(pre.a[j] - pre.a[i]);
    j = i;
  }
  std::reverse(segs.begin(), segs.end());
  return merge_kept(segs);
}

// The cheapest plan with predicted peak <= budget as far as the DP sees; empty when it finds none. Keeping
// everything is decided exactly first (it costs nothing, so it wins whenever it fits).
std::vector<CheckpointSegment> cheapest_within(const std::vector<BlockProfile>& p, const Prefix& pre,
                                               int64_t budget) {
  const int64_t n = static_cast<int64_t>(p.size());
  if (pre.keep_all <= budget) return {{0, n, false}};
  return budget_dp(p, pre, budget);
}

// Note [Smallest peak]
// When the budget DP finds no plan for B (none fits, or only plans within its rounding of B do), the plan returned
// has the smallest predicted peak M*, found exactly; fits then says whether M* <= B after all. Whether
// some plan has peak <= M is a DP over blocks done j alone: held(j) = the least P(j) over plans of [0, j) whose
// blocks' terms (Note [Checkpoint memory model]) are all <= M. The least held prefix is the best state to go on
// from (every later term grows with P), so, with M(i, j) as in Note [Budget DP],
//     held(j) = min( held(j-1) + a_{j-1}  if held(j-1) + a_{j-1} + T_{j-1} <= M,
//                    min over i with held(i) + in_i - saved_i + M(i, j) <= M of held(i) + in_i )
// and M is feasible iff held(n) is defined; O(n^2). M* is found by binary search over [0, keep-all peak] (keeping
// everything is feasible there). The plan is then the budget DP's at B = M* when it finds one (the cheapest
// such plan up to the rounding of Note [Budget DP]), else the least-held plan of this DP (ties: less cost).
std::vector<CheckpointSegment> least_held_segments(const std::vector<BlockProfile>& p, const Prefix& pre, int64_t m) {
  const int64_t n = static_cast<int64_t>(p.size());
  using Key = std::pair<int64_t, double>;  // (held bytes, extra cost), compared lexicographically
  const Key none{std::numeric_limits<int64_t>::max(), 0.0};
  std::vector<Key> held(n + 1, none);
  std::vector<int64_t> from(n + 1, -1);  // -1: block j-1 kept; else the recomputed segment [from, j)
  held[0] = {0, 0.0};
  for (int64_t j = 1; j <= n; ++j) {
    const BlockProfile& last = p[j - 1];
    if (held[j - 1] != none && held[j - 1].first + last.activation_bytes + last.backward_bytes <= m)
      held[j] = {held[j - 1].first + last.activation_bytes, held[j - 1].second};
    int64_t run = 0;  // M(i, j)
    for (int64_t i = j - 1; i >= 0; --i) {
      run = p[i].activation_bytes + std::max(p[i].backward_bytes, i == j - 1 ? int64_t{0} : run);
      if (held[i] == none || held[i].first + p[i].input_bytes - p[i].input_saved_bytes + run > m) continue;
      const Key k{held[i].first + p[i].input_bytes, held[i].second + pre.c[j] - pre.c[i]};
      if (k < held[j]) {
        held[j] = k;
        from[j] = i;
      }
    }
  }
  std::vector<CheckpointSegment> segs;
  if (held[n] == none) return segs;
  for (int64_t j = n; j > 0;) {
    if (from[j] < 0) {
      segs.push_back({j - 1, j, false});
      --j;
    } else {
      segs.push_back({from[j], j, true});
      j = from[j];
    }
  }
  std::reverse(segs.begin(), segs.end());
  return merge_kept(segs);
}

std::vector<CheckpointSegment> smallest_peak_segments(const std::vector<BlockProfile>& p, const Prefix& pre) {
  int64_t lo = 0, hi = pre.keep_all;  // hi is feasible
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (least_held_segments(p, pre, mid).empty())
      lo = mid + 1;
    else
      hi = mid;
  }
  std::vector<CheckpointSegment> segs = cheapest_within(p, pre, hi);
  return segs.empty() ? least_held_segments(p, pre, hi) : segs;
}

}  // namespace

CheckpointPlan plan_checkpoints(const std::vector<BlockProfile>& profile, const CheckpointPolicy& policy) {
  check_profile(profile);
  EMBER_CHECK(policy.kind != CheckpointPolicy::Kind::budget || policy.budget_bytes >= 0, ValueError,
              "plan_checkpoints: the budget must be non-negative, got ", policy.budget_bytes);
  const int64_t n = static_cast<int64_t>(profile.size());
  CheckpointPlan plan;
  plan.policy = policy;
  switch (policy.kind) {
    case CheckpointPolicy::Kind::none:
      plan.segments = {{0, n, false}};
      break;
    case CheckpointPolicy::Kind::sqrt: {
      int64_t k = 1;
      while (k * k < n) ++k;  // ceil(sqrt(n)), exactly
      for (int64_t b = 0; b < n; b += k) plan.segments.push_back({b, std::min(n, b + k), b + k < n});
      break;
    }
    case CheckpointPolicy::Kind::budget: {
      Prefix pre{std::vector<int64_t>(n + 1, 0), std::vector<double>(n + 1, 0.0), 0};
      for (int64_t i = 0; i < n; ++i) {
        pre.a[i + 1] = pre.a[i] + profile[i].activation_bytes;
        pre.c[i + 1] = pre.c[i] + profile[i].cost;
        pre.keep_all = std::max(pre.keep_all, pre.a[i + 1] + profile[i].backward_bytes);
      }
      plan.segments = cheapest_within(profile, pre, policy.budget_bytes);
      if (plan.segments.empty()) plan.segments = smallest_peak_segments(profile, pre);  // Note [Smallest peak]
      break;
    }
  }
  evaluate(plan, profile);
  plan.fits = policy.kind != CheckpointPolicy::Kind::budget || plan.predicted_peak_bytes <= policy.budget_bytes;
  return plan;
}

// ---- profiling and running a chain -----------------------------------------------------------------------------

namespace {

void sync_if_cuda(Device device) {
  if (device.is_cuda()) memory::cuda::synchronize(device.index);
}

// Puts the default generator's state back when it goes out of scope.
class GeneratorStateGuard {
 public:
  GeneratorStateGuard() : state_(default_generator().state()) {}
  ~GeneratorStateGuard() { default_generator().set_state(state_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  PhiloxState state_;
};

Tensor detached_like(const Tensor& t) {
  Tensor d = t.detach();
  if (t.requires_grad()) d.requires_grad_();
  return d;
}

// The leaves a graph accumulates into (its AccumulateGrad nodes), each once, `skip` excluded.
std::vector<Tensor> graph_leaves(const Tensor& root, const Tensor& skip) {
  std::vector<Tensor> leaves;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  if (const Edge e = gradient_edge(root); e.fn) stack.push_back(e.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (const auto* acc = dynamic_cast<const AccumulateGrad*>(n)) {
      if (!skip.defined() || acc->leaf().unsafe_impl() != skip.unsafe_impl()) leaves.push_back(acc->leaf());
      continue;
    }
    for (const Edge& e : n->next_edges())
      if (e.fn) stack.push_back(e.fn.get());
  }
  return leaves;
}

// Note [Backward transients]
// A block's backward holds, for a moment, more than its activations: the gradient flowing in, the one flowing out,
// each weight's fresh gradient before it is added into .grad, and kernels' temporaries. profile_chain measures it
// per block in the steady state of training — the parameters' .grad already exist (a second micro-batch, or a step
// after zero_grad(set_to_none = false)) — as the device allocator's peak window over a backward seeded with a
// gradient of the block's output, above the bytes held before the seed was made. The leaves' .grad are set to
// zeros for the measurement and their hooks set aside (a DDP hook must not fire for a profile), then everything is
// put back, also when the backward throws — and when a zeros tensor does not fit (each is made before its leaf is
// touched; the leaves stashed before it are put back).
class LeafStash {
 public:
  explicit LeafStash(const std::vector<Tensor>& leaves) {
    saved_.reserve(leaves.size());  // push_back below cannot reallocate, so it cannot throw
    try {
      for (const Tensor& leaf : leaves) {
        Tensor zero;
        {
          NoGradGuard no_grad;
          zero = zeros(leaf.sizes(), {leaf.dtype(), leaf.device()});  // may throw: this leaf is untouched yet
        }
        AutogradMeta& m = get_or_create_meta(leaf);
        saved_.push_back({leaf, std::move(m.grad), std::move(m.leaf_hooks), std::move(m.post_accumulate_hooks)});
        m.leaf_hooks.clear();
        m.post_accumulate_hooks.clear();
        m.grad = std::move(zero);
      }
    } catch (...) {
      put_back();
      throw;
    }
  }
  ~LeafStash() { put_back(); }
  LeafStash(const LeafStash&) = delete;
  LeafStash& operator=(const LeafStash&) = delete;

 private:
  void put_back() {
    for (Saved& s : saved_) {
      AutogradMeta& m = get_or_create_meta(s.leaf);
      m.grad = std::move(s.grad);
      m.leaf_hooks = std::move(s.hooks);
      m.post_accumulate_hooks = std::move(s.post_hooks);
    }
    saved_.clear();
  }
  struct Saved {
    Tensor leaf, grad;
    std::vector<std::shared_ptr<HookEntry>> hooks;
    std::vector<std::shared_ptr<PostHookEntry>> post_hooks;
  };
  std::vector<Saved> saved_;
};

// Note [Backward transients]: the most block b's backward holds above the bytes held before it.
int64_t measure_backward(const Tensor& y, const Tensor& input) {
  // Meta: measured through the dry run's allocator (a MetaAllocationScope); without one there is nothing to read.
  if (!requires_grad(y) || (y.device().is_meta() && current_meta_allocator() == nullptr)) return 0;
  memory::Allocator& alloc = allocator_for(y.device());
  LeafStash stash(graph_leaves(y, input));
  sync_if_cuda(y.device());
  const int64_t before = alloc.stats().allocated_bytes;
  memory::PeakWindow window(alloc);
  {
    Tensor seed = ones(y.sizes(), {y.dtype(), y.device()});
    autograd::backward({y}, {seed});
  }
  sync_if_cuda(y.device());
  return std::max<int64_t>(0, window.peak() - before);
}

}  // namespace

// Note [Profiling a chain]
// Each block runs on a detached copy of the previous block's output (requiring grad when that output did), so its
// graph is its own and is dropped as soon as the block is measured: profiling holds one block's activations at a
// time. A pack hook records every storage the block's ops save (weakly) and hands the tensor back unchanged. After
// the block's graph is dropped, a recorded storage that is still alive is held by someone else — a parameter (a
// leaf that requires grad), the block's input, a buffer — and is not activation memory; one that died with the graph
// (or is the block's output, which the next block consumes) is. The block's input counts when the block saves it
// and the block before did not save it as its output (Note [Hand-off tensors]). The default generator's state is restored at the
// end, so profiling a model with dropout leaves the training run's random stream untouched.
std::vector<BlockProfile> profile_chain(const std::vector<TensorFn>& blocks, const Tensor& x) {
  EMBER_CHECK(x.defined(), ValueError, "profile_chain: the input is undefined");
  AutoGradMode grad_on(true);
  GeneratorStateGuard keep_rng;
  const Device device = x.device();
  std::vector<BlockProfile> out(blocks.size());
  Tensor input = detached_like(x);
  bool producer_counted = true;  // the chain's input is the caller's (a batch), not activation memory
  for (size_t b = 0; b < blocks.size(); ++b) {
    EMBER_CHECK(static_cast<bool>(blocks[b]), ValueError, "profile_chain: block ", b, " is empty");
    struct Seen {
      std::weak_ptr<StorageImpl> storage;
      int64_t nbytes;
    };
    std::unordered_map<const StorageImpl*, Seen> seen;
    Tensor next;
    double seconds = 0.0;
    {
      SavedTensorHooksGuard hooks(
          [&seen](const Tensor& t) -> std::any {
            if (t.defined() && t.storage()) seen.emplace(t.storage().get(), Seen{t.storage(), t.storage()->nbytes()});
            return t;
          },
          [](const std::any& packed) { return std::any_cast<Tensor>(packed); });
      sync_if_cuda(device);
      const auto t0 = std::chrono::steady_clock::now();
      Tensor y = blocks[b](input);
      sync_if_cuda(device);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EMBER_CHECK(y.defined(), ValueError, "profile_chain: block ", b, " returned an undefined tensor");
      next = detached_like(y);
      out[b].backward_bytes = measure_backward(y, input);  // frees the block's graph (unless y needs no grad)
    }  // y and with it the block's graph are gone
    if (input.defined() && requires_grad(input)) input.set_grad(Tensor());
    const StorageImpl* out_storage = next.storage().get();
    const StorageImpl* in_storage = input.storage().get();
    int64_t activation = 0, input_saved = 0;
    for (const auto& [ptr, s] : seen) {
      if (s.storage.expired() || ptr == out_storage) activation += s.nbytes;
      else if (ptr == in_storage && ptr != nullptr && !producer_counted)
        input_saved = s.nbytes;  // Note [Hand-off tensors]
    }
    producer_counted = out_storage != nullptr && seen.count(out_storage) > 0;
    out[b].input_bytes = in_storage ? in_storage->nbytes() : 0;
    out[b].activation_bytes = activation + input_saved;
    out[b].input_saved_bytes = input_saved;
    out[b].cost = seconds;
    input = next;
  }
  return out;
}

Tensor run_chain(const std::vector<TensorFn>& blocks, const Tensor& x, const CheckpointPlan& plan) {
  plan.check_covers(static_cast<int64_t>(blocks.size()), "run_chain");
  Tensor h = x;
  for (const CheckpointSegment& s : plan.segments) {
    if (!s.recompute) {
      for (int64_t i = s.begin; i < s.end; ++i) h = blocks[i](h);
      continue;
    }
    // The region owns copies of its blocks' callables: checkpoint() calls it again during backward.
    auto fns = std::make_shared<std::vector<TensorFn>>(blocks.begin() + s.begin, blocks.begin() + s.end);
    h = checkpoint(TensorFn([fns](const Tensor& in) { return apply_chain(*fns, in); }), h);
  }
  return h;
}

}  // namespace ember::autograd
