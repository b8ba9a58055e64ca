// The checkpoint planner (checkpoint_plan.h): policies, the none / sqrt / budget plans, profiling a chain of blocks
// and running a chain under a plan. Invariant: every plan returned tiles [0, n) in order with no two adjacent kept
// segments, and its predicted_peak_bytes is Note [Checkpoint memory model] evaluated exactly on the profile.
#include "ember/autograd/checkpoint_plan.h"

#include <algorithm>
#include <any>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <sstream>
#include <unordered_map>

#include "ember/autograd/saved_hooks.h"
#include "ember/base/error.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
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
  for (const CheckpointSegment& s : segments)
    os << " [" << s.begin << ", " << s.end << ")" << (s.recompute ? " recompute" : " keep") << ";";
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
    EMBER_CHECK(b.input_bytes >= 0 && b.activation_bytes >= 0 && b.cost >= 0.0 && std::isfinite(b.cost), ValueError,
                "plan_checkpoints: block ", i, " has a negative size or cost (input_bytes ", b.input_bytes,
                ", activation_bytes ", b.activation_bytes, ", cost ", b.cost, ")");
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

// Fills the plan's numbers from its segments and the profile: the memory model of the Note, evaluated exactly.
void evaluate(CheckpointPlan& plan, const std::vector<BlockProfile>& profile) {
  int64_t kept = 0, inputs = 0, largest = 0, all = 0;
  double extra = 0.0, forward = 0.0;
  for (const BlockProfile& b : profile) {
    all += b.activation_bytes;
    forward += b.cost;
  }
  for (const CheckpointSegment& s : plan.segments) {
    int64_t a = 0;
    for (int64_t i = s.begin; i < s.end; ++i) a += profile[i].activation_bytes;
    if (s.recompute) {
      inputs += profile[s.begin].input_bytes;
      largest = std::max(largest, a);
      for (int64_t i = s.begin; i < s.end; ++i) extra += profile[i].cost;
    } else {
      kept += a;
    }
  }
  plan.predicted_peak_bytes = kept + inputs + largest;
  plan.no_checkpoint_bytes = all;
  plan.extra_cost = extra;
  plan.forward_cost = forward;
}

// The plan with the smallest predicted peak (ties: the least extra cost), found exactly — no rounding — for every
// candidate bound M on a recomputed segment's activation bytes: with M fixed, held(j) = the least
// sum_K A + sum_R in over plans of blocks [0, j) is a one-dimensional DP (keep block j-1, or end a recomputed segment
// [i, j) with A(i..j) <= M, where the i allowed form a window that only moves right, so a monotone queue gives the
// best start in O(1)). O(n) per candidate, O(n^3) in all.
std::vector<CheckpointSegment> min_peak_segments(const std::vector<BlockProfile>& p, const std::vector<int64_t>& pre_a,
                                                 const std::vector<double>& pre_c,
                                                 const std::vector<int64_t>& candidates) {
  const int64_t n = static_cast<int64_t>(p.size());
  using Key = std::pair<int64_t, double>;  // (held bytes, extra cost), compared lexicographically
  std::vector<CheckpointSegment> best;
  Key best_key{std::numeric_limits<int64_t>::max(), 0.0};
  std::vector<Key> held(n + 1);
  std::vector<int64_t> from(n + 1);  // -1: block j-1 kept; else the recomputed segment [from, j)
  for (const int64_t m : candidates) {
    held[0] = {0, 0.0};
    std::deque<int64_t> window;  // starts i, increasing, with held[i] + in_i increasing
    int64_t lo = 0;
    for (int64_t j = 1; j <= n; ++j) {
      // Start i = j - 1 enters the window; starts whose segment to j exceeds m leave it.
      const int64_t i_new = j - 1;
      const Key k_new{held[i_new].first + p[i_new].input_bytes, held[i_new].second - pre_c[i_new]};
      while (!window.empty()) {
        const int64_t b = window.back();
        const Key kb{held[b].first + p[b].input_bytes, held[b].second - pre_c[b]};
        if (kb < k_new) break;
        window.pop_back();
      }
      window.push_back(i_new);
      while (lo < j && pre_a[j] - pre_a[lo] > m) ++lo;
      while (!window.empty() && window.front() < lo) window.pop_front();
      held[j] = {held[j - 1].first + p[j - 1].activation_bytes, held[j - 1].second};
      from[j] = -1;
      if (!window.empty()) {
        const int64_t i = window.front();
        const Key k{held[i].first + p[i].input_bytes, held[i].second + pre_c[j] - pre_c[i]};
        if (k < held[j]) {
          held[j] = k;
          from[j] = i;
        }
      }
    }
    std::vector<CheckpointSegment> segs;
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
    int64_t largest = 0;
    for (const CheckpointSegment& s : segs)
      if (s.recompute) largest = std::max(largest, pre_a[s.end] - pre_a[s.begin]);
    const Key key{held[n].first + largest, held[n].second};
    if (key < best_key) {
      best_key = key;
      best = merge_kept(segs);
    }
  }
  return best;
}

// Note [Budget DP]
// For a candidate M (the activation bytes of the largest recomputed segment), the cheapest plan with
// sum_K A + sum_R in <= B - M is a DP over (blocks done j, memory units used m): memory is counted in units of
// U = ceil(B / 256) bytes, each kept run's bytes and each recomputed segment's input bytes rounded UP to whole units,
// and the capacity is floor((B - M) / U) units — so a plan the DP accepts really satisfies the model's inequality
// (rounding only makes it cautious, by at most one unit per segment). A state's value is the least extra cost;
// transitions end a kept run [i, j) or a recomputed segment [i, j) with A(i..j) <= M at j. O(n^2 * 256) per M.
// Keeping everything is decided exactly first (it costs nothing, so it wins whenever it fits). Pruning, so that
// n <= 128 plans in tens of milliseconds: among candidates with the same capacity in units only the largest M is
// tried (it allows every segment the smaller ones allow, with the same capacity); a candidate is skipped when even
// the exact least-memory plan for it (min_peak_segments' DP) does not fit; the inner loops over units are plain
// element-wise minima (no parent pointers: the plan is recovered by matching values); and segments are at most
// kMaxRun blocks long (a longer kept run is split, costing at most a unit of rounding per split; a longer recomputed
// one is not considered) — which only matters beyond n = kMaxRun.
constexpr int64_t kMaxRun = 128;

std::vector<CheckpointSegment> budget_dp(const std::vector<BlockProfile>& p, const std::vector<int64_t>& pre_a,
                                         const std::vector<double>& pre_c, int64_t m_bound, int64_t cap, int64_t unit,
                                         double* cost_out) {
  const int64_t n = static_cast<int64_t>(p.size());
  const int64_t w = cap + 1;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Two layers: 0 = the last segment was recomputed (or nothing yet), 1 = the last segment was kept. No parent
  // pointers are stored (so the inner loops are plain element-wise minima the compiler vectorises); the plan is
  // recovered afterwards by finding, for each state, a predecessor that yields its value exactly.
  std::vector<double> dp(2 * (n + 1) * w, kInf);
  auto row = [&](int layer, int64_t j) { return dp.data() + (static_cast<int64_t>(layer) * (n + 1) + j) * w; };
  auto units = [unit](int64_t bytes) { return (bytes + unit - 1) / unit; };
  auto kept_from = [](int64_t i, int64_t j) { return j - i == kMaxRun ? 2 : 1; };  // layers a kept run may follow
  // A kept run follows a recomputed segment (or the start); after another kept run only when a run longer than
  // kMaxRun must be split (else one merged run rounds less).
  auto recompute_ok = [&](int64_t i, int64_t j) { return pre_a[j] - pre_a[i] <= m_bound; };
  row(0, 0)[0] = 0.0;
  for (int64_t j = 1; j <= n; ++j) {
    double* kept_dst = row(1, j);
    double* rec_dst = row(0, j);
    for (int64_t i = j - 1; i >= std::max<int64_t>(0, j - kMaxRun); --i) {
      const int64_t ku = units(pre_a[j] - pre_a[i]);
      if (ku <= cap)
        for (int layer = 0; layer < kept_from(i, j); ++layer) {
          const double* src = row(layer, i);
          for (int64_t m = ku; m <= cap; ++m) kept_dst[m] = std::min(kept_dst[m], src[m - ku]);
        }
      if (!recompute_ok(i, j)) continue;  // (and no i further left is: A only grows)
      const int64_t ru = units(p[i].input_bytes);
      if (ru > cap) continue;
      const double c = pre_c[j] - pre_c[i];
      for (int layer = 0; layer < 2; ++layer) {
        const double* src = row(layer, i);
        for (int64_t m = ru; m <= cap; ++m) rec_dst[m] = std::min(rec_dst[m], src[m - ru] + c);
      }
    }
  }
  // The least cost at the end; ties go to the fewer units held (a smaller predicted peak).
  int layer = -1;
  int64_t m = -1;
  double best = kInf;
  for (int64_t mm = 0; mm <= cap; ++mm)
    for (int l = 0; l < 2; ++l)
      if (row(l, n)[mm] < best) {
        best = row(l, n)[mm];
        layer = l;
        m = mm;
      }
  std::vector<CheckpointSegment> segs;
  if (layer < 0) return segs;
  for (int64_t j = n; j > 0;) {
    const double v = row(layer, j)[m];
    bool found = false;
    for (int64_t i = j - 1; i >= std::max<int64_t>(0, j - kMaxRun) && !found; --i) {
      if (layer == 1) {
        const int64_t ku = units(pre_a[j] - pre_a[i]);
        for (int l = 0; l < kept_from(i, j) && !found && ku <= m; ++l)
          if (row(l, i)[m - ku] == v) {
            segs.push_back({i, j, false});
            j = i, m -= ku, layer = l, found = true;
          }
      } else if (recompute_ok(i, j)) {
        const int64_t ru = units(p[i].input_bytes);
        const double c = pre_c[j] - pre_c[i];
        for (int l = 0; l < 2 && !found && ru <= m; ++l)
          if (row(l, i)[m - ru] + c == v) {
            segs.push_back({i, j, true});
            j = i, m -= ru, layer = l, found = true;
          }
      }
    }
    EMBER_CHECK(found, ValueError, "plan_checkpoints: internal error recovering the budget plan");
  }
  std::reverse(segs.begin(), segs.end());
  *cost_out = best;
  return merge_kept(segs);
}

// a < b beyond rounding noise in the summed costs.
bool cost_less(double a, double b) {
  if (!std::isfinite(b)) return a < b;
  return a < b - 1e-12 * std::max(1.0, std::abs(b));
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
      const int64_t budget = policy.budget_bytes;
      std::vector<int64_t> pre_a(n + 1, 0);
      std::vector<double> pre_c(n + 1, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        pre_a[i + 1] = pre_a[i] + profile[i].activation_bytes;
        pre_c[i + 1] = pre_c[i] + profile[i].cost;
      }
      // Candidate M: 0 (nothing recomputed) and the activation bytes of every possible segment.
      std::vector<int64_t> candidates{0};
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = i + 1; j <= n && j - i <= kMaxRun; ++j) candidates.push_back(pre_a[j] - pre_a[i]);
      std::sort(candidates.begin(), candidates.end());
      candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());

      if (pre_a[n] <= budget) {  // everything kept fits: nothing to recompute (decided exactly, not in units)
        plan.segments = {{0, n, false}};
        break;
      }
      const int64_t unit = std::max<int64_t>(1, (budget + 255) / 256);
      // Note [Budget DP]: per capacity in units, only the largest M.
      std::vector<std::pair<int64_t, int64_t>> tried;  // (capacity units, M)
      for (const int64_t m : candidates) {
        if (m > budget) break;
        const int64_t cap = (budget - m) / unit;
        if (!tried.empty() && tried.back().first == cap)
          tried.back().second = m;
        else
          tried.push_back({cap, m});
      }
      double best_cost = std::numeric_limits<double>::infinity();
      for (const auto& [cap, m] : tried) {
        // Skip M when even its least-memory plan does not fit (exact, cheap).
        const std::vector<CheckpointSegment> least = min_peak_segments(profile, pre_a, pre_c, {m});
        CheckpointPlan probe;
        probe.segments = least;
        evaluate(probe, profile);
        if (probe.predicted_peak_bytes > budget) continue;
        double cost = 0.0;
        std::vector<CheckpointSegment> segs = budget_dp(profile, pre_a, pre_c, m, cap, unit, &cost);
        if (segs.empty()) continue;
        CheckpointPlan candidate;
        candidate.segments = segs;
        evaluate(candidate, profile);
        if (cost_less(cost, best_cost) ||
            (!cost_less(best_cost, cost) && candidate.predicted_peak_bytes < plan.predicted_peak_bytes)) {
          best_cost = cost;
          plan.segments = segs;
          plan.predicted_peak_bytes = candidate.predicted_peak_bytes;
        }
      }
      if (plan.segments.empty()) {
        // Nothing fits in units: the plan with the smallest predicted peak, which may still fit exactly (the units
        // are cautious) — fits says which.
        plan.segments = min_peak_segments(profile, pre_a, pre_c, candidates);
      }
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

}  // namespace

// Note [Profiling a chain]
// Each block runs on a detached copy of the previous block's output (requiring grad when that output did), so its
// graph is its own and is dropped as soon as the block is measured: profiling holds one block's activations at a
// time. A pack hook records every storage the block's ops save (weakly) and hands the tensor back unchanged. After
// the block's graph is dropped, a recorded storage that is still alive is held by someone else — a parameter (a
// leaf that requires grad), the block's input, a buffer — and is not activation memory; one that died with the graph
// (or is the block's output, which the next block consumes) is. The default generator's state is restored at the
// end, so profiling a model with dropout leaves the training run's random stream untouched.
std::vector<BlockProfile> profile_chain(const std::vector<TensorFn>& blocks, const Tensor& x) {
  EMBER_CHECK(x.defined(), ValueError, "profile_chain: the input is undefined");
  AutoGradMode grad_on(true);
  GeneratorStateGuard keep_rng;
  const Device device = x.device();
  std::vector<BlockProfile> out(blocks.size());
  Tensor input = detached_like(x);
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
    }  // y and with it the block's graph are gone
    const StorageImpl* out_storage = next.storage().get();
    int64_t activation = 0;
    for (const auto& [ptr, s] : seen)
      if (s.storage.expired() || ptr == out_storage) activation += s.nbytes;
    out[b].input_bytes = input.storage() ? input.storage()->nbytes() : 0;
    out[b].activation_bytes = activation;
    out[b].cost = seconds;
    input = next;
  }
  return out;
}

Tensor run_chain(const std::vector<TensorFn>& blocks, const Tensor& x, const CheckpointPlan& plan) {
  const int64_t n = static_cast<int64_t>(blocks.size());
  EMBER_CHECK(plan.num_blocks() == n, ValueError, "run_chain: the plan covers ", plan.num_blocks(),
              " blocks but the chain has ", n);
  int64_t expect = 0;
  for (const CheckpointSegment& s : plan.segments) {
    EMBER_CHECK(s.begin == expect && s.end > s.begin, ValueError, "run_chain: the plan's segments do not tile [0, ",
                n, ") in order (segment [", s.begin, ", ", s.end, ") after block ", expect, ")");
    expect = s.end;
  }
  Tensor h = x;
  for (const CheckpointSegment& s : plan.segments) {
    if (!s.recompute) {
      for (int64_t i = s.begin; i < s.end; ++i) h = blocks[i](h);
      continue;
    }
    // The region owns copies of its blocks' callables: checkpoint() calls it again during backward.
    auto fns = std::make_shared<std::vector<TensorFn>>(blocks.begin() + s.begin, blocks.begin() + s.end);
    h = checkpoint(TensorFn([fns](const Tensor& in) {
                     Tensor t = in;
                     for (const TensorFn& f : *fns) t = f(t);
                     return t;
                   }),
                   h);
  }
  return h;
}

}  // namespace ember::autograd
